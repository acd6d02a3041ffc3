"""Validate a spec: the schemas of its top level, its meta and its agent, and validate_spec, which
checks a raw spec against them, the env's schema (slm_lab.env.schema) and the schema each named
algorithm, memory and net declares, and fills every default."""
from __future__ import annotations

import copy
from typing import Any

from slm_lab.env.schema import check_env
from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import (MAX_DEVICES, MAX_FRAME, MAX_KEPT, OMIT, Field, accepts, check_finite, check_object,
                               ignored_field, not_available, suggest)
from slm_lab.spec.compat import flatten_v4_layout, rename_env_id
from slm_lab.spec.search_block import searched_paths

# Sessions are processes and each writes its own files; more seeds than any study uses (papers
# report 3-10) is a typo or a fuzzed value, and 2**63 of them would never finish writing specs.
MAX_SESSIONS = 256
MAX_TRIALS = 1000
# torch takes seeds and thread counts as 64-bit integers (a larger one is a traceback); the seed
# bound leaves ample room below 2**63 for the per-session offsets added to it
MAX_SEED = 10**18
MAX_THREADS = 1024
MAX_EVAL_EPISODES = 10_000  # SLM-Lab's specs use up to 8; each costs whole episodes of greedy play

RUNTIME_META = ('experiment_ts', 'trial', 'session', 'git_sha', 'lab_version', 'spec_file', 'spec_name',
                'overrides', 'mode', 'lineage', 'snapshot_replay_auto')

WANDB_KEYS = ('project', 'entity', 'mode', 'group', 'tags')  # meta.wandb as an object: W&B's settings

# Optimizers that step with torch's fused kernel (`fused: true`) unless the spec says how they
# step: one kernel per step for all parameters instead of a dozen per-tensor operations. Measured
# faster on every row of bench/sb3_side_by_side.py (docs/BENCHMARKS.md, "Fused Adam by default");
# its numbers differ from the per-tensor path's by float rounding only (docs/spec.md, optim_spec).
FUSED_BY_DEFAULT = ('Adam', 'AdamW')
# keys that choose how the optimizer steps: a spec giving any of them is taken as it is
_STEP_KEYS = ('fused', 'foreach', 'capturable', 'differentiable')
OPTIM_KEYS = ('optim_spec', 'actor_optim_spec', 'critic_optim_spec')


def fill_fused(agent: dict, value: bool, leave=frozenset()) -> dict:
    """Set `fused` to `value` in each optimizer spec of the agent's nets (agent.net and
    agent.critic_net: optim_spec, actor_optim_spec, critic_optim_spec) that names an optimizer of
    FUSED_BY_DEFAULT and none of the keys that choose how it steps. validate_spec fills true (the
    default of a new run); a run saved before that default existed is filled with false
    (persistence/edits.py), so it resumes with the optimizer it started with. `leave`: the
    (section, key) optimizers not filled (a search's, whose trials draw the optimizer:
    optims_left_to_trials)."""
    for section in ('net', 'critic_net'):
        net = agent.get(section)
        if not isinstance(net, dict):
            continue
        for key in OPTIM_KEYS:
            optim = net.get(key)
            if isinstance(optim, dict) and optim.get('name') in FUSED_BY_DEFAULT \
                    and not any(k in optim for k in _STEP_KEYS) and (section, key) not in leave:
                optim['fused'] = value
    return agent


def optims_left_to_trials(searched: set[str]) -> set[tuple[str, str]]:
    """The optimizers (section, key) whose name a search draws (`searched`, its dotted paths): a
    search's spec leaves their `fused` out, so that each trial fills it for the optimizer it drew
    (an RMSprop or SGD trial of an Adam spec gets none, an Adam trial true)."""
    return {(section, key) for section in ('net', 'critic_net') for key in OPTIM_KEYS
            if {f'agent.{section}.{key}', f'agent.{section}.{key}.name'} & searched}


@accepts('false, true, or an object of project, entity, mode ("online" / "offline"), group (strings), tags (list)')
def check_wandb(value: Any, path: str) -> None:
    """meta.wandb: false, true, or an object of the W&B settings WANDB_KEYS names."""
    if not isinstance(value, dict):
        return
    for key, item in value.items():
        if key not in WANDB_KEYS:
            raise SpecError(f'{path}.{key}: unknown key{suggest(key, WANDB_KEYS)}; valid keys: {", ".join(WANDB_KEYS)}')
        if item is None:
            continue
        if key == 'mode' and item not in ('online', 'offline'):
            raise SpecError(f'{path}.mode: {item!r} is not valid; valid values: "online", "offline", null')
        if key == 'tags' and not (isinstance(item, list) and all(isinstance(t, str) and t for t in item)):
            raise SpecError(f'{path}.tags: expected a list of non-empty strings, got {item!r}')
        if key != 'tags' and not (isinstance(item, str) and item):
            raise SpecError(f'{path}.{key}: expected a non-empty string or null, got {item!r}')


META_SCHEMA = {
    'distributed': Field((bool, str), False, choices=(False, 'shared', 'synced'),
                         doc='the sessions train one set of weights together, each in its own process (A3C-style, '
                             'SLM-Lab\'s): "shared": the sessions\' nets are the global nets in shared memory, '
                             'updated without locks (Hogwild); "synced": each session trains a local copy, steps the '
                             'global nets with its gradients and pulls them back; env.max_frame is split between the '
                             'sessions; false: independent sessions (see docs/resume.md, Distributed runs)'),
    'log_frequency': Field((int,), 1000, min=1, max=MAX_FRAME, doc='frames between progress lines and CSV rows'),
    'eval_frequency': Field((int,), None, nullable=True, min=1, max=MAX_FRAME,
                            doc='frames between evaluations (default: log_frequency)'),
    'rigorous_eval': Field((int,), 0, min=0, max=MAX_EVAL_EPISODES,
                           doc='episodes of greedy play on a separate env at each eval (0: use training returns)'),
    'max_session': Field((int,), 1, min=1, max=MAX_SESSIONS,
                         doc='sessions (seeds) per trial, run in parallel processes, at most one per CPU core at once'),
    'max_trial': Field((int,), 1, min=1, max=MAX_TRIALS, doc='trials in a search (per grid point of a grid_search)'),
    'random_seed': Field((int,), None, nullable=True, min=0, max=MAX_SEED,
                         doc='base seed; session s of trial t uses random_seed + 1000*t + s (drawn when null)'),
    'checkpoint_frequency': Field((int,), None, nullable=True, min=1, max=MAX_FRAME,
                                  doc='frames between snapshots of the whole session state (default: log_frequency)'),
    'keep_checkpoints': Field((int,), 2, min=1, max=MAX_KEPT,
                              doc='recent snapshots kept per session (plus best weights and the final one)'),
    'snapshot_replay': Field((bool,), None, nullable=True,
                             doc='include the off-policy replay memory (and SIL\'s replay) in snapshots, so that a '
                                 'resume continues exactly; false: leave it out (it refills after a resume); null: '
                                 'the lab decides at the run\'s start and at each resume: in when the full replays '
                                 'take at most 1/4 of the memory available and their kept snapshots at most 1/4 of '
                                 'the free disk (recorded as snapshot_replay_auto; docs/resume.md)'),
    'tensorboard': Field((bool,), True,
                         doc='write TensorBoard event files of every record row under tb/ in the run directory '
                             '(see docs/run-directory.md, TensorBoard)'),
    'wandb': Field((bool, dict), False, check=check_wandb,
                   doc="log the boards' scalars to Weights & Biases too, one W&B run per session (needs pip install "
                       "'.[wandb]'; --track turns it on; see docs/run-directory.md, Weights & Biases)"),
    'torch_num_threads': Field((int,), 1, min=1, max=MAX_THREADS, doc='torch intra-op threads per session'),
    'flush_denormal': Field((bool,), True,
                            doc='numbers too small for a normal float (below 1.2e-38 in float32) count as 0 in the '
                                "session's and its replays' (enjoy@) CPU arithmetic (torch.set_flush_denormal: the "
                                "thread's, all of "
                                "torch's work with torch_num_threads 1): Adam's moments of units that stopped "
                                'learning decay into them, and a CPU step on them takes up to 8x as long (DQN '
                                "CartPole's optimizer step); false: IEEE denormals, as before the key (a run saved "
                                'before it resumes so)'),
    # SLM-Lab keys for hardware and search: recorded; the search mode reads them
    'num_gpus': Field((int,), OMIT, nullable=True, min=0, max=MAX_DEVICES,
                      doc='(SLM-Lab v4) GPUs a search reserves per trial; recorded for search'),
    'search_resources': Field((dict,), OMIT, nullable=True, schema={
        'cpu': Field((float,), 1, min=0, min_exclusive=True, max=MAX_DEVICES, doc='CPUs per trial'),
        'gpu': Field((float,), 0, min=0, max=MAX_DEVICES, doc='GPUs per trial (a fraction shares one GPU)'),
    }, doc='(SLM-Lab v5) resources a search reserves per trial (default 1 CPU); read by search mode'),
    'search_scheduler': Field((dict,), OMIT, nullable=True, schema={
        'grace_period': Field((int,), 1, min=1, max=MAX_FRAME, doc='frames a trial runs before it can be stopped'),
        'reduction_factor': Field((float,), 4, min=1, min_exclusive=True,
                                  doc='the fraction 1/reduction_factor of trials continues at each rung'),
    }, doc="(SLM-Lab v5) early stopping of a search's trials (ASHA on frames); read by search mode"),
    'search': ignored_field('(SLM-Lab v4) the search method name, e.g. "RandomSearch"; '
                            'SLM-Lab v4.2.4 does not read it either'),
    'train_mode': ignored_field('(SLM-Lab v4) not read by SLM-Lab v4.2.4 either; accepted and ignored'),
    # what SLM-Lab writes into the meta of the specs it saves (its spec_util.extend_meta_spec and
    # tick), so that a spec file SLM-Lab saved runs here too: the lab records its own run instead
    **{key: ignored_field(f'(set by SLM-Lab in the specs it saves: {what}) ignored; the lab records its own run')
       for key, what in (('experiment', 'experiment index'), ('resume', 'whether the run was resumed'),
                         ('cuda_offset', 'first GPU index'), ('prepath', 'output path prefix'),
                         ('predir', 'output directory'), ('graph_prepath', 'graph path prefix'),
                         ('info_prepath', 'info path prefix'), ('log_prepath', 'log path prefix'),
                         ('model_prepath', 'model path prefix'))},
    # filled by the lab and recorded in the saved specs
    'experiment_ts': Field((str,), None, nullable=True, doc='(set by the lab) run timestamp'),
    'trial': Field((int,), None, nullable=True, doc='(set by the lab) trial index'),
    'session': Field((int,), None, nullable=True, doc='(set by the lab) session index'),
    'git_sha': Field((str,), None, nullable=True, doc='(set by the lab) git commit of the lab'),
    'lab_version': Field((str,), None, nullable=True, doc='(set by the lab) lab version'),
    'spec_file': Field((str,), None, nullable=True, doc='(set by the lab) spec file the run was made from'),
    'spec_name': Field((str,), None, nullable=True, doc='(set by the lab) spec name'),
    'overrides': Field((list,), None, nullable=True, doc='(set by the lab) -s overrides applied'),
    'mode': Field((str,), None, nullable=True, doc='(set by the lab) lab mode'),
    'snapshot_replay_auto': Field((dict,), None, nullable=True,
                                  doc='(set by the lab) its decision where snapshot_replay is null: on (whether the '
                                      'replays go into snapshots), memory_bytes and memory_limit_bytes, disk_bytes '
                                      'and disk_limit_bytes (docs/resume.md); null where snapshot_replay is given or '
                                      'the spec keeps no replay'),
    'lineage': Field((dict,), OMIT, doc='(set by the lab) the run this one was forked or warm-started from: '
                                        'kind, parent, frame, ckpt, each session\'s snapshot or model file and '
                                        'its checksum (docs/fork.md)'),
}

TOP_SCHEMA = {  # the keys of a spec
    'agent': Field((dict,), doc='the agent: algorithm, memory and net'),
    'env': Field((dict,), doc='the environment'),
    'meta': Field((dict,), {}, doc='run settings'),
    'search': Field((dict,), None, nullable=True, doc='hyperparameter search space: what search mode draws'),
    'spec_params': Field((dict,), OMIT, doc="(SLM-Lab v4) the values of the spec's ${...} placeholders its "
                                            'benchmarks ran; here each run fills them with -s; recorded'),
}

AGENT_SCHEMA = {  # the keys of spec.agent
    'name': Field((str,), None, nullable=True, doc='agent name (free text; default: the algorithm name)'),
    'algorithm': Field((dict,), doc='the algorithm'),
    'memory': Field((dict,), None, nullable=True, doc='the memory'),
    'net': Field((dict,), None, nullable=True, doc='the network'),
    'critic_net': Field((dict,), OMIT, nullable=True,
                        doc="(SLM-Lab v5) CrossQ: the critics' net (any net type), else agent.net's"),
}


def _component_schema(section: str, registry: dict, planned: tuple, spec: Any, path: str):
    """The schema of the component named in spec['name'] (or spec['type'] for nets)."""
    name_key = 'type' if section == 'net' else 'name'
    if not isinstance(spec, dict):
        raise SpecError(f'{path}: expected an object, got {type(spec).__name__} {spec!r}')
    if name_key not in spec:
        raise SpecError(f'{path}.{name_key}: required key is missing; valid {section} {name_key}s: '
                        f'{", ".join(registry)}')
    name = spec[name_key]
    if not isinstance(name, str):  # an object or list here would be unhashable below
        raise SpecError(f'{path}.{name_key}: expected a string, got {type(name).__name__} {name!r}; '
                        f'valid {section} {name_key}s: {", ".join(registry)}')
    if name in registry:
        return registry[name]
    if name in planned:
        raise not_available(f'{path}.{name_key}', f"SLM-Lab's {section} '{name}'",
                            f'; available: {", ".join(registry)}')
    raise SpecError(f"{path}.{name_key}: unknown {section} '{name}'{suggest(name, list(registry) + list(planned))}; "
                    f'valid: {", ".join(registry)}')


def validate_spec(spec: dict, spec_name: str = 'spec', settle: bool = True) -> dict:
    """Validate a raw spec and return it with every default filled in. Raises SpecError naming
    the key path of the first problem and the valid choices. `settle`: a net's linear_kernel "auto"
    becomes the kernel this machine takes for its layers, and env.vector_backend null the vector
    env it picks for the env (env.schema.check_env); False for a search's spec, whose trials each
    settle them for the layers and env keys they draw (agent.net.hid_layers, env.name, ... may be
    searched), and which leaves out the clipping defaults that follow a key its block draws."""
    if not isinstance(spec, dict):
        raise SpecError(f'{spec_name}: a spec must be a JSON object')
    spec = copy.deepcopy(spec)
    spec.pop('name', None)
    # NaN and Infinity (which Python's json reads, as it reads 1e400) pass every range check and
    # would reach torch or numpy; free-form objects such as optim_spec or make_kwargs included
    check_finite(spec)
    flatten_v4_layout(spec)  # SLM-Lab v4's list-wrapped agent and env, and its body block
    spec = check_object(spec, TOP_SCHEMA, 'spec')
    # gymnasium ids renamed since SLM-Lab v4 run their current id
    # the keys a search's block draws: the defaults that follow one of them are left to each trial
    searched = set() if settle else searched_paths(spec.get('search'))
    spec['env'] = check_env(rename_env_id(spec['env']), settle=settle, searched=searched)
    spec['meta'] = check_object(spec['meta'], META_SCHEMA, 'meta')
    # the registries import torch (seconds): reading a spec file, and a mistake in its top level,
    # env or meta (the agent's keys are checked against its classes' schemas), need not wait for it
    from slm_lab.agent import algorithm, memory, net  # noqa: PLC0415 (the registries: see above)
    ALGORITHMS, PLANNED_ALGORITHMS = algorithm.ALGORITHMS, algorithm.PLANNED_ALGORITHMS
    MEMORIES, PLANNED_MEMORIES = memory.MEMORIES, memory.PLANNED_MEMORIES
    NETS, PLANNED_NETS, PLANNED_NET_KEYS = net.NETS, net.PLANNED_NETS, net.PLANNED_KEYS
    agent = spec['agent']
    if isinstance(agent, dict) and isinstance(agent.get('algorithm'), dict):  # a later algorithm's keys wait for it
        _component_schema('algorithm', ALGORITHMS, PLANNED_ALGORITHMS, agent['algorithm'], 'agent.algorithm')
    agent = check_object(agent, AGENT_SCHEMA, 'agent')
    algo_cls = _component_schema('algorithm', ALGORITHMS, PLANNED_ALGORITHMS, agent['algorithm'], 'agent.algorithm')
    agent['algorithm'] = check_object(agent['algorithm'], algo_cls.spec_schema, 'agent.algorithm')
    if agent['name'] is None:
        agent['name'] = agent['algorithm']['name']
    for section, registry, planned, planned_keys in (('memory', MEMORIES, PLANNED_MEMORIES, None),
                                                     ('net', NETS, PLANNED_NETS, PLANNED_NET_KEYS)):
        required = section in algo_cls.requires
        if agent[section] == {} and not required:  # SLM-Lab's "net": {} for an agent without one
            agent[section] = None
        if agent[section] is None:
            if required:
                raise SpecError(f"agent.{section}: {algo_cls.__name__} needs a {section}; "
                                f'valid: {", ".join(registry)}')
            continue
        cls = _component_schema(section, registry, planned, agent[section], f'agent.{section}')
        schema = cls.spec_schema
        if section == 'memory':  # keys an algorithm reads in its memory's section (SIL's replay)
            schema = {**schema, **algo_cls.memory_schema}
        agent[section] = check_object(agent[section], schema, f'agent.{section}', planned_keys=planned_keys)
    if agent.get('critic_net') is not None:
        if not algo_cls.uses_critic_net:
            raise SpecError(f'agent.critic_net: {algo_cls.__name__} has no separate critic net (CrossQ reads it); '
                            'remove agent.critic_net, or describe the critic in agent.net')
        cls = _component_schema('net', NETS, PLANNED_NETS, agent['critic_net'], 'agent.critic_net')
        agent['critic_net'] = check_object(agent['critic_net'], cls.spec_schema, 'agent.critic_net',
                                           planned_keys=PLANNED_NET_KEYS)
    planned_memory = algo_cls.planned_memory_names.get((agent['memory'] or {}).get('name'))
    if planned_memory:
        raise not_available('agent.memory.name', planned_memory, f'; use one of: {", ".join(algo_cls.memory_names)}')
    # a memory fits by its name, or by a name it serves as (Memory.serves_as)
    fits = agent['memory'] is None or algo_cls.memory_names is None or \
        bool({agent['memory']['name'], *MEMORIES[agent['memory']['name']].serves_as} & set(algo_cls.memory_names))
    if not fits:
        raise SpecError(f"agent.memory.name: {algo_cls.__name__} cannot use '{agent['memory']['name']}'; "
                        f'use one of: {", ".join(algo_cls.memory_names)}')
    spec['agent'] = fill_fused(agent, True, leave=optims_left_to_trials(searched))
    for section in ('net', 'critic_net'):  # linear_kernel "auto" settled here: the saved spec holds the kernel
        if settle and isinstance(agent.get(section), dict) and agent[section].get('linear_kernel') == 'auto':
            net_spec = agent[section]
            if net_spec.get('arc') is None and net_spec.get('arc_file'):  # read as the net will (checked above)
                net_spec = {**net_spec, 'arc': net.torcharc_net.read_arc(net_spec, f'agent.{section}')}
            agent[section]['linear_kernel'] = net.onednn_linear.resolve_linear_kernel(net_spec)
    if spec['meta']['distributed'] and any((agent.get(k) or {}).get('precision', 'fp32') != 'fp32'
                                           for k in ('net', 'critic_net')):
        raise SpecError('agent.net.precision: "bf16" is not available with meta.distributed yet (its sessions '
                        'share nets across processes); use "fp32", or meta.distributed false')
    derived = {k: paths for k, paths in algo_cls.derived_defaults.items()
               if agent['algorithm'].get(k) is None and set(paths) & searched}
    algo_cls.check_spec(spec)
    for key in derived:  # filled from a key the search draws: each trial fills its own
        agent['algorithm'][key] = None
    return spec
