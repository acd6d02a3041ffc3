"""Checking that an edited spec is consistent with the run it continues: the edits a resume
allows, keys a newer lab added, how frame-driven schedules change, and the spec a run continues
under."""
from __future__ import annotations

import math
import re

from slm_lab.env.schema import backend_fits, clip_defaults_left_to_trials
from slm_lab.lib.decay import Schedule, linear_to_zero_end, linear_to_zero_factor
from slm_lab.lib.errors import ResumeError, SpecError
from slm_lab.lib.version import __version__, git_sha
from slm_lab.spec import RUNTIME_META, diff_specs, load_raw_spec, load_spec, settles_kernels, validate_spec
from slm_lab.spec.compat import raw_section
from slm_lab.spec.search_block import searched_paths
from slm_lab.spec.validate import WANDB_KEYS, fill_fused, optims_left_to_trials

# edits that keep the past and the future of a run consistent
ALLOWED_EDITS = ('env.max_frame', 'meta.log_frequency', 'meta.eval_frequency', 'meta.checkpoint_frequency',
                 'meta.keep_checkpoints', 'meta.rigorous_eval', 'meta.snapshot_replay', 'meta.max_session',
                 'meta.torch_num_threads', 'meta.tensorboard', 'meta.wandb', *(f'meta.wandb.{k}' for k in WANDB_KEYS))
IGNORED = tuple(f'meta.{k}' for k in RUNTIME_META) + ('meta.random_seed',)


# Keys a newer lab added whose default changes what a run made before them did: a run's saved spec
# lacks them, and resuming it fills them with the value that keeps its old behaviour (not the
# new default), so a run continues as it was started.
KEYS_ADDED_LATER = {
    ('env', 'clip_obs'): None,  # no clipping before clip_obs existed (its default is 10 with normalize_obs)
    ('env', 'clip_reward'): None,
    ('env', 'vector_backend'): 'gymnasium',  # Atari games ran in gymnasium's vector env before ALE's was an option
    # replays stayed out of snapshots unless told before the lab decided (null); a run saved before
    # that holds false, filled in, or lacks the key when it predates it
    ('meta', 'snapshot_replay'): False,
    ('meta', 'flush_denormal'): False,  # CPU arithmetic kept IEEE denormals before the key
}
# The same for the keys of one algorithm (agent.algorithm), by its name.
ALGORITHM_KEYS_ADDED_LATER = {
    'DQN': {'double_q': False},  # the lab's DQN computed SLM-Lab v4's targets (the target net picks) before it
    # the update forwarded over the batch for log pi_old and V(s) before it
    'PPO': {'keep_acting_outputs': False},
    'PPOSIL': {'keep_acting_outputs': False},
    # the critics' batch renorm computed torch's one-pass variance before it
    'CrossQ': {'batch_renorm_variance': 'welford'},
}


def fill_keys_added_later(spec: dict) -> dict:
    """The run's saved spec with each key of KEYS_ADDED_LATER and ALGORITHM_KEYS_ADDED_LATER it
    lacks set to its old behaviour, its Adam optimizers that do not say how they step set to
    fused false (spec.validate.fill_fused), its conv nets without memory_format to
    "contiguous", its bf16 nets without bf16_min_rows to 1 (every forward in bf16), and its other
    nets without linear_kernel to "default" (torch's kernel, whatever "auto" picks now) and those on
    "onednn" without onednn_min_rows to 1 (every product on oneDNN) and without onednn_min_macs
    to 0. A search's spec lacks by design the clipping keys and optimizers' `fused` that follow a
    key it draws (env.schema.clip_defaults_left_to_trials, spec.validate.optims_left_to_trials):
    they stay out."""
    meta = spec.get('meta') if isinstance(spec.get('meta'), dict) else {}
    # a search's spec leaves out the defaults that follow a key it draws (each trial fills them)
    searched = searched_paths(spec.get('search')) if str(meta.get('mode') or '').startswith('search') else set()
    left = clip_defaults_left_to_trials(searched)
    for (section, key), old_value in KEYS_ADDED_LATER.items():
        if isinstance(spec.get(section), dict) and key not in spec[section] and not (section == 'env' and key in left):
            spec[section][key] = old_value
    agent = spec.get('agent')
    algorithm = agent.get('algorithm') if isinstance(agent, dict) else None
    name = algorithm.get('name') if isinstance(algorithm, dict) else None
    if isinstance(name, str):
        for key, old_value in ALGORITHM_KEYS_ADDED_LATER.get(name, {}).items():
            algorithm.setdefault(key, old_value)
    if isinstance(agent, dict):  # Adam stepped per tensor before fused became its default
        fill_fused(agent, False, leave=optims_left_to_trials(searched))
        for section in ('net', 'critic_net'):  # conv nets were NCHW before memory_format (a validated
            net = agent.get(section)             # conv net's spec holds conv_hid_layers)
            if isinstance(net, dict) and 'conv_hid_layers' in net:
                net.setdefault('memory_format', 'contiguous')
            if isinstance(net, dict) and net.get('precision') == 'bf16':  # acting was in bf16 too before the key
                net.setdefault('bf16_min_rows', 1)
            if isinstance(net, dict) and net.get('type') and 'conv_hid_layers' not in net:  # nets with linear_kernel
                net.setdefault('linear_kernel', 'default')  # MKL before the key ("auto" picks oneDNN on AMD)
                if net['linear_kernel'] == 'onednn':  # every product on oneDNN before onednn_min_rows
                    net.setdefault('onednn_min_rows', 1)
                    net.setdefault('onednn_min_macs', 0)  # and, of those rows, before onednn_min_macs
    return spec


SCHEDULE_EDIT_RE = re.compile(r'^agent\.algorithm\.(\w+_spec)\.(name|start_val|end_val|start_step|end_step|'
                              r'decay_rate|frequency)$')


def _is_schedule_edit(key: str, old_spec: dict, new_spec: dict) -> bool:
    """An edit inside a frame-driven schedule (explore_var_spec, clip_eps_spec, ...): a schedule
    is a function of the frame with no state of its own, so the run continues under the edited
    one as if it had been started with it."""
    m = SCHEDULE_EDIT_RE.match(key)
    if not m:
        return False
    pieces = [spec['agent']['algorithm'].get(m.group(1)) for spec in (old_spec, new_spec)]
    return all(isinstance(p, dict) and 'start_val' in p for p in pieces)


def check_edits(old_spec: dict, new_spec: dict, force: bool, advice: str | None = None) -> list[tuple]:
    """The spec diff (key, old, new). Edits outside ALLOWED_EDITS raise ResumeError listing each
    one, unless force (`advice`: what the error then tells the user to do, instead of reverting
    them or --force); a lower max_session is never allowed. The run's spec is first filled with
    this lab's defaults, so a key a newer lab added (at its default) is not an edit."""
    try:
        old_spec = {**validate_spec({k: v for k, v in old_spec.items() if k != 'name'}), 'name': old_spec.get('name')}
    except SpecError:  # read_run_spec has checked it; diff it as saved
        pass
    diff = [d for d in diff_specs(old_spec, new_spec) if not d[0].startswith(IGNORED) and d[0] != 'name']
    seed_old, seed_new = old_spec['meta'].get('random_seed'), new_spec['meta'].get('random_seed')
    if seed_new != seed_old:
        diff.append(('meta.random_seed', seed_old, seed_new))
    bad = [d for d in diff if d[0] not in ALLOWED_EDITS and not _is_schedule_edit(d[0], old_spec, new_spec)]
    old_sessions, new_sessions = old_spec['meta']['max_session'], new_spec['meta']['max_session']
    if new_sessions < old_sessions:
        raise ResumeError(f'meta.max_session: {old_sessions} -> {new_sessions}: a run cannot lose sessions; '
                          f'use meta.max_session >= {old_sessions}')
    if new_sessions != old_sessions and (old_spec['meta'].get('distributed') or new_spec['meta'].get('distributed')):
        raise ResumeError(f'meta.max_session: {old_sessions} -> {new_sessions}: the sessions of a meta.distributed '
                          'run train one set of weights and split env.max_frame between them, so their number '
                          f'cannot change; use meta.max_session={old_sessions}')
    if bad and not force:
        changes = '; '.join(f'{k}: {o!r} -> {n!r}' for k, o, n in bad)
        raise ResumeError(f'the spec changed in ways that break the run\'s continuity: {changes}; '
                          + (advice or 'revert them, or pass --force to resume anyway (recorded in the run)'))
    return diff


def _schedules(spec: dict) -> dict[str, tuple]:
    """Every frame-driven schedule of a spec: {key path: (kind, spec piece)}."""
    out = {}
    for key, value in spec['agent']['algorithm'].items():
        if key.endswith('_spec') and isinstance(value, dict) and 'start_val' in value:
            out[f'agent.algorithm.{key}'] = ('schedule', value)
    net = spec['agent'].get('net') or {}
    lr_spec = net.get('lr_scheduler_spec')
    if isinstance(lr_spec, dict) and lr_spec.get('name') == 'LinearToZero':
        for optim_key in ('optim_spec', 'actor_optim_spec', 'critic_optim_spec'):
            if isinstance(net.get(optim_key), dict) and 'lr' in net[optim_key]:
                out[f'agent.net.{optim_key}.lr'] = ('linear_to_zero', (net[optim_key]['lr'], lr_spec))
    return out


def _schedule_value(kind: str, piece, frame: int, max_frame: int) -> float:
    if kind == 'linear_to_zero':
        lr, lr_spec = piece
        return float(lr) * linear_to_zero_factor(frame, linear_to_zero_end(lr_spec, max_frame))
    return Schedule(piece).value(frame)


def schedule_changes(old_spec: dict, new_spec: dict, frames: dict[int, int]) -> list[dict]:
    """How resuming under new_spec changes each frame-driven schedule (the lab's rule, SLM-Lab's:
    the run continues as if it had been started with the edited spec). One entry per affected
    schedule: its key, its value before and after at each session's resume frame, and why.

    A schedule is affected when its value at the resume frame changes (LinearToZero follows
    env.max_frame; an edited schedule), or when the run is extended past the end_step of a
    schedule that was set to span the whole old run (end_step == the old env.max_frame: it then
    stays at end_val for the whole extension)."""
    old_max, new_max = old_spec['env']['max_frame'], new_spec['env']['max_frame']
    old_scheds, new_scheds = _schedules(old_spec), _schedules(new_spec)
    changes = []
    for key, (kind, piece) in new_scheds.items():
        old_kind, old_piece = old_scheds.get(key, (kind, piece))
        values = {s: (_schedule_value(old_kind, old_piece, f, old_max), _schedule_value(kind, piece, f, new_max))
                  for s, f in frames.items()}
        moved = {s: v for s, v in values.items() if not _same(*v)}
        if moved:
            if kind == 'linear_to_zero' and old_max != new_max:
                why = (f'LinearToZero decays the learning rate to 0 at env.max_frame, which changed from {old_max} '
                       f'to {new_max}')
            else:
                why = 'the schedule was edited'
            changes.append({'key': key, 'frames': {str(s): frames[s] for s in moved},
                            'before': {str(s): v[0] for s, v in moved.items()},
                            'after': {str(s): v[1] for s, v in moved.items()}, 'why': why})
            continue
        end_step = piece.get('end_step', 0) if kind == 'schedule' else None
        decays = kind == 'schedule' and piece.get('name') != 'no_decay' and \
            piece.get('start_val') != _schedule_value(kind, piece, end_step, new_max)
        if decays and new_max > old_max and end_step == old_max:
            end_val = _schedule_value(kind, piece, end_step, new_max)
            last_val = _schedule_value(kind, piece, new_max, new_max)
            # SLM-Lab's linear_decay keeps rising past end_step when end_val > start_val
            after_end = (f'it stays at end_val {end_val:g} for the whole extension' if _same(end_val, last_val) else
                         f'past it the value goes on from {end_val:g} to {last_val:g}')
            changes.append({'key': key, 'frames': {str(s): f for s, f in frames.items()},
                            'before': {str(s): v[0] for s, v in values.items()},
                            'after': {str(s): v[1] for s, v in values.items()},
                            'why': f'its end_step {end_step} spanned the old run (env.max_frame {old_max}); '
                                   f'{after_end} to env.max_frame {new_max}; '
                                   f'to stretch it, resume with -s {key}.end_step={new_max}'})
    return changes


def _same(a: float, b: float) -> bool:
    # NaN == NaN for unset schedules; float rounding (linear_decay at its end_step is end_val plus
    # ~2e-9 of it) is no change to warn about
    return a == b or (a != a and b != b) or math.isclose(a, b, rel_tol=1e-6, abs_tol=0.0)


def describe_schedule_change(change: dict) -> str:
    """One log line for a schedule change. Where the value at the resume frame is unchanged (a
    schedule that ended at the old env.max_frame, extended), the line says it stays, rather than
    printing a change from a value to itself."""
    frames = sorted(set(change['frames'].values()))
    at = f"frame {frames[0]}" if len(frames) == 1 else f"frames {', '.join(map(str, frames))}"
    if all(f"{change['before'][s]:.4g}" == f"{change['after'][s]:.4g}" for s in change['before']):
        values = sorted({f"{v:.4g}" for v in change['after'].values()})
        return f"{change['key']}: at {at} the value is {', '.join(values)}: {change['why']}"
    pairs = [f"{change['before'][s]:.4g} -> {change['after'][s]:.4g}" + (f' (session {s})' if len(change['before']) > 1
                                                                          else '')
             for s in change['before']]
    return f"{change['key']}: at {at} the value goes {', '.join(pairs)}: {change['why']}"


def continuation_spec(spec_file: str, spec_name: str, overrides: list[str] | None, old_spec: dict,
                      mode: str, fork: bool = False) -> tuple[dict, dict]:
    """The spec a run (or search) continues under: the spec file with the run's own -s overrides
    first (so a bare train@latest continues the run as it was started), then these; keys the file
    leaves out taken from the run's saved spec; its seed and timestamp kept. Returns (spec, the
    saved spec filled with keys added later). A spec of another algorithm than the run's is a
    ResumeError that says so (rather than naming a key of the run's algorithm that the spec's does
    not know): always for a `fork`, which continues the run's training; for train@ when the two
    do not merge (a --force'd change between algorithms of one state, DQN with double_q to DoubleDQN,
    does)."""
    old_spec = fill_keys_added_later(old_spec)
    overrides = list(old_spec['meta'].get('overrides') or []) + list(overrides or [])
    if fork and (change := _algorithm_change(spec_file, spec_name, overrides, old_spec)):
        raise ResumeError(f"--fork: the parent run's algorithm is {change[0]} and the spec's is {change[1]}; a fork "
                          f'continues the parent\'s training, so it needs the same algorithm: fork with a spec of '
                          f"{change[0]}, or, to train {change[1]} from the parent's weights, use --warm-start "
                          'instead of --fork (a fresh run; the nets must fit)')
    raw = load_raw_spec(spec_file, spec_name, overrides)
    # a backend the file leaves to the lab (null or absent) is settled again for the spec as edited,
    # then kept as the run had it where it still fits (_keep_settled_backend)
    base = _unsettled_backend(old_spec) if _given_backend(raw) is None else old_spec
    try:
        spec = load_spec(spec_file, spec_name, overrides, base=base, settle=settles_kernels(mode))
    except SpecError as e:
        change = _algorithm_change(spec_file, spec_name, overrides, old_spec)
        if change is None:
            raise
        new_run = (f'a new search of {change[1]} (search)' if mode.startswith('search') else
                   f"a new run of {change[1]} (train, or train --warm-start RUN_DIR to begin from this run's weights)")
        raise ResumeError(f"the run's algorithm is {change[0]} and the spec's is {change[1]}, which does not fit the "
                          f"run's saved spec ({str(e).split('; ')[0]}); {mode} continues a run with its own "
                          f'algorithm: use a spec of {change[0]}, or start {new_run}') from None
    _keep_settled_kernels(spec, old_spec, raw)
    if _given_backend(raw) is None:
        _keep_settled_backend(spec, old_spec)
    meta = spec['meta']
    if meta['random_seed'] is None:
        meta['random_seed'] = old_spec['meta']['random_seed']
    meta['experiment_ts'] = old_spec['meta']['experiment_ts']
    meta['lab_version'], meta['git_sha'], meta['mode'] = __version__, git_sha(), mode
    if 'lineage' in old_spec['meta']:  # a forked or warm-started run keeps where it came from
        meta['lineage'] = old_spec['meta']['lineage']
    return spec, old_spec


def _given_backend(raw: dict):
    """env.vector_backend as the spec file and overrides give it (None when null or absent)."""
    env = raw_section(raw, 'env')  # either layout
    return env.get('vector_backend') if env is not None else None


def _unsettled_backend(old_spec: dict) -> dict:
    """The run's saved spec with its env.vector_backend null, for the lab to settle again."""
    if not isinstance(old_spec.get('env'), dict) or old_spec['env'].get('vector_backend') is None:
        return old_spec
    return {**old_spec, 'env': {**old_spec['env'], 'vector_backend': None}}


def _keep_settled_backend(spec: dict, old_spec: dict) -> None:
    """env.vector_backend as the run settled it (or ran before the key: KEYS_ADDED_LATER) when the
    spec file leaves it to the lab and it still runs the env as edited: a run keeps the vector env
    its snapshots hold the episodes of (gymnasium's CartPoles stay gymnasium's although "numpy" is
    the default now). Where an edit (--force) leaves it unable to, the lab's new choice stands, and
    check_edits names the change."""
    old = (old_spec.get('env') or {}).get('vector_backend')
    env = spec.get('env')
    if old is not None and isinstance(env, dict) and backend_fits(env, old):
        env['vector_backend'] = old


def _keep_settled_kernels(spec: dict, old_spec: dict, raw: dict) -> None:
    """A net's linear_kernel as the run settled it when the spec file and overrides say "auto" (or
    nothing): "auto" is settled by the machine that validates it, and a run keeps the kernel it
    started with on any machine. A concrete kernel the user names stays theirs (an edit)."""
    agent = raw_section(raw, 'agent')  # either layout
    for section in ('net', 'critic_net'):
        given = agent.get(section) if agent is not None else None
        given = given.get('linear_kernel') if isinstance(given, dict) else None
        new, old = (s.get('agent', {}).get(section) for s in (spec, old_spec))
        if given in (None, 'auto') and isinstance(new, dict) and isinstance(old, dict) \
                and old.get('linear_kernel') not in (None, 'auto'):
            new['linear_kernel'] = old['linear_kernel']


def _algorithm_change(spec_file: str, spec_name: str, overrides: list[str], old_spec: dict) -> tuple[str, str] | None:
    """(the run's algorithm, the spec's) when the spec file with `overrides` names another
    algorithm than the run's saved spec; None when they agree or the file names none."""
    def name(spec) -> str | None:
        agent = spec.get('agent') if isinstance(spec, dict) else None
        algorithm = agent.get('algorithm') if isinstance(agent, dict) else None
        value = algorithm.get('name') if isinstance(algorithm, dict) else None
        return value if isinstance(value, str) else None
    old, new = name(old_spec), name(load_raw_spec(spec_file, spec_name, overrides))
    return (old, new) if old is not None and new is not None and old != new else None
