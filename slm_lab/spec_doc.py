"""Generate the spec reference, docs/spec.md, from the schemas the validator itself uses.

    python -m slm_lab.spec_doc           print the reference (markdown) to stdout
    python -m slm_lab.spec_doc --write   write it to docs/spec.md

The key tables come from the `Field`s in `slm_lab.spec` (env, meta), in each registered
algorithm, memory and net class (`spec_schema`), and in `slm_lab.lib.decay` (schedules), so the
reference lists exactly the keys the validator accepts, with their defaults and limits. The prose
between the tables is written here by hand. test/test_spec_doc.py fails when docs/spec.md differs
from what this module generates, so after changing a schema, run `--write`.
"""
from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path

from slm_lab.lib.schema import MISSING, OMIT, TYPE_NAMES, Field
from slm_lab.spec import AGENT_SCHEMA

DOC_PATH = Path(__file__).resolve().parent.parent / 'docs' / 'spec.md'

# The top-level keys are declared inside slm_lab.spec.validate_spec, where they cannot be imported;
# they are mirrored here, and test_spec_doc.py checks the mirror against validate_spec. The agent's
# keys are slm_lab.spec.AGENT_SCHEMA.
TOP_SCHEMA = {
    'agent': Field((dict,), doc='the agent: algorithm, memory and net'),
    'env': Field((dict,), doc='the environment'),
    'meta': Field((dict,), {}, doc='run settings'),
    'search': Field((dict,), None, nullable=True, doc='hyperparameter search space: what search mode draws'),
    'spec_params': Field((dict,), OMIT, doc="(SLM-Lab v4) the values of the spec's ${...} placeholders its "
                                            'benchmarks ran; here each run fills them with -s; recorded'),
}

# What the custom validators (Field.check) accept, by the validator's function name.
CHECK_NOTES = {
    '_check_env_name': 'an id registered in gymnasium (`ALE/...` ids load `ale_py` when it is installed)',
    '_check_optim_spec': 'a [torch.optim class and its arguments](#optimizers-optim_spec)',
    '_check_loss_spec': 'a [torch.nn loss and its arguments](#losses-loss_spec)',
    '_check_lr_scheduler_spec': '[`LinearToZero` or a torch LR scheduler](#lr-schedulers-lr_scheduler_spec)',
    '_check_schedule': '',  # described by the schema note below
}
# Checks written inline (lambdas) in a schema, by (section title, key).
KEY_NOTES = {
    ('env', 'reward_scale'): 'a number, `"sign"` or null',
    ('env', 'clip_reward'): 'a bound > 0, `[min, max]` with min < max, or null',
    ('env', 'image_downsize'): '`[width, height]`, each >= 1, or null',
}


# ---------------------------------------------------------------------------------------------
# rendering one Field

def json_text(value) -> str:
    """A value as it is written in a JSON spec."""
    return json.dumps(value, ensure_ascii=False)


def type_text(fld: Field) -> str:
    """The JSON type(s) a Field accepts, e.g. 'int or null', 'list of int'."""
    names = []
    for t in fld.types:
        name = TYPE_NAMES.get(t, t.__name__)
        if t is list and fld.item_type is not None:
            name = f'list of {TYPE_NAMES.get(fld.item_type, fld.item_type.__name__)}'
        names.append(name)
    if fld.nullable:
        names.append('null')
    return ' or '.join(names)


def default_text(fld: Field) -> str:
    """The default as JSON, or 'required'."""
    if fld.default is MISSING:
        return '**required**'
    if fld.default is OMIT:
        return 'absent'
    return f'`{json_text(fld.default)}`'


def check_note(fld: Field, section: str, key: str) -> str | None:
    """What a custom check accepts; None when the check is not described here."""
    if (section, key) in KEY_NOTES:
        return KEY_NOTES[(section, key)]
    if fld.check is None:
        return ''
    return CHECK_NOTES.get(getattr(fld.check, '__name__', ''), getattr(fld.check, 'accepts', None))


def valid_text(fld: Field, section: str, key: str) -> str:
    """Choices, numeric range and nested-schema notes of a Field."""
    from slm_lab.lib.decay import SCHEDULE_SCHEMA
    from slm_lab.agent.algorithm.policy_util import PLANNED_PDTYPES
    parts = []
    if fld.choices is not None:
        now = [c for c in fld.choices if c not in PLANNED_PDTYPES]
        later = [c for c in fld.choices if c in PLANNED_PDTYPES]
        parts.append(', '.join(f'`{json_text(c)}`' for c in now))
        if later:
            parts.append('not implemented yet: ' + ', '.join(f'`{json_text(c)}`' for c in later))
    if fld.planned:
        parts.append('not available yet: ' + ', '.join(f'`{json_text(v)}`' for v in fld.planned))
    if fld.aliases:
        parts.append('also accepted as ' + ', '.join(f'`{a}`' for a in fld.aliases))
    if fld.min is not None and fld.max is not None:
        parts.append(f'{fld.min:g} to {fld.max:g}' if not fld.min_exclusive else f'> {fld.min:g}, <= {fld.max:g}')
    elif fld.min is not None:
        parts.append(f'{">" if fld.min_exclusive else ">="} {fld.min:g}')
    elif fld.max is not None:
        parts.append(f'<= {fld.max:g}')
    if fld.schema is SCHEDULE_SCHEMA:
        parts.append('a [schedule](#schedules)')
    elif fld.schema is not None:
        parts.append('an object with keys ' + ', '.join(f'`{k}`' for k in fld.schema))
    note = check_note(fld, section, key)
    if note:
        parts.append(note)
    return '; '.join(parts)


def _cell(text: str) -> str:
    return text.replace('|', '\\|').replace('\n', ' ')


def table(schema: dict, section: str, keys=None) -> str:
    """A markdown table of the keys of a schema (all, or `keys`), in schema order."""
    rows = ['| Key | Type | Default | Valid values | Meaning |', '|---|---|---|---|---|']
    for key, fld in schema.items():
        if keys is not None and key not in keys:
            continue
        doc = fld.doc
        rows.append('| ' + ' | '.join(_cell(c) for c in (
            f'`{key}`', type_text(fld), default_text(fld), valid_text(fld, section, key), doc)) + ' |')
    return '\n'.join(rows)


def _first_paragraph(obj) -> str:
    doc = inspect.getdoc(obj) or ''
    return ' '.join(doc.split('\n\n')[0].split())


def _names(names) -> str:
    return ', '.join(f'`{n}`' for n in names)


# ---------------------------------------------------------------------------------------------
# hand-written sections

INTRO = """\
# Spec reference

<!-- Generated by `python -m slm_lab.spec_doc --write` from the schemas in the code; do not edit by
hand. test/test_spec_doc.py fails when this file is out of date. -->

A spec is a JSON object that describes one experiment completely: which algorithm learns, with
what memory and network, in which environment, for how long, and how the run is recorded. The
lab reads nothing else, and it saves the spec, with every default filled in, next to the
results, so a saved spec describes its run exactly.

Before anything runs, the spec is checked against the tables below. Every key has a type, a
default (or is required) and often a list of valid values or a range. An unknown key, a missing
required key, a wrong type or a value out of range stops the lab with one line that names the
key path and, where it can, the valid choices (`error: env.max_frme: unknown key (did you mean
'max_frame'?); ...`). Absent keys get their defaults. The lab then builds the env and the agent
once, so a spec whose parts do not fit together (say, DQN on an env with continuous actions)
also fails before the run directory is created.

The tables are generated from the schemas the validator uses: a key that is not listed here is
rejected, except inside the free-form objects `env.make_kwargs` and `search` and the torch
arguments of `optim_spec`, `loss_spec` and `lr_scheduler_spec` (checked against torch
itself)."""

LAYOUT = """\
## Spec files and the top level

A spec file is a JSON (or YAML) object that maps spec names to specs; the command line picks one
by name:

```json
{
  "ppo_cartpole": {
    "agent": {
      "name": "PPO",
      "algorithm": {"name": "PPO", "gamma": 0.98},
      "memory": {"name": "OnPolicyBatchReplay"},
      "net": {"type": "MLPNet", "hid_layers": [64, 64]}
    },
    "env": {"name": "CartPole-v1", "num_envs": 8, "max_frame": 100000},
    "meta": {"log_frequency": 5000, "max_session": 1}
  }
}
```

The component classes are chosen by name: `agent.algorithm.name`, `agent.memory.name` and
`agent.net.type` are looked up in the lab's registries, and each class declares the keys it
accepts. A name that matches no class fails with the list of valid names.

Top-level keys of a spec:"""

OVERRIDES = """\
## Overrides (`-s`) and `${KEY}` placeholders

`python run_lab.py SPEC_FILE SPEC_NAME MODE -s KEY=VALUE -s KEY=VALUE ...` changes the spec for
one run without editing the file. The options are applied to the spec as read from the file,
before validation, so the result is checked like any spec.

- VALUE is read as JSON when it parses as JSON, and kept as a string otherwise:
  `-s env.max_frame=20000` gives the number 20000, `-s agent.net.hid_layers=[128,128]` a list,
  `-s meta.random_seed=null` null, and `-s env.name=Acrobot-v1` the string `"Acrobot-v1"`.
- When KEY is the name of a `${KEY}` placeholder that appears in the spec, the placeholder is
  filled. A string that is exactly `"${KEY}"` is replaced by the value with its JSON type (a
  number stays a number); a placeholder inside a longer string is replaced by the value's
  Python text (`-s n=true` turns `"run_${n}"` into `"run_True"`). Every occurrence is filled.
  A placeholder left unfilled is an error that names it.
- Any other KEY is a dotted path into the spec: `-s agent.algorithm.gamma=0.995`. A part that
  is a number indexes a list (`-s agent.net.hid_layers.0=128`; negative indexes count from the
  end). Objects missing along the path, or null, are created, so
  `-s agent.net.lr_scheduler_spec.name=LinearToZero` works on a spec without an LR scheduler;
  a misspelt key in a path is then reported by validation as an unknown key.
- Placeholders are filled first, then the paths are set in the order given (a later `-s` for
  the same path wins).
- The options are recorded in `meta.overrides` of the saved specs.

For example, with `"env": {"name": "${env}", "max_frame": "${frames}"}` in a spec:

    python run_lab.py my_specs.json my_spec train -s env=Acrobot-v1 -s frames=50000"""

AGENT_INTRO = """\
## `agent`

The agent is an algorithm, a memory it learns from, and a network. `memory` and `net` may be
left out (or null) only for an algorithm that needs neither (`Random`)."""

ALGORITHM_INTRO = """\
## `agent.algorithm`

`name` picks the algorithm. Keys every algorithm accepts (an algorithm below may change a
default; its own table then lists the key again):"""

ACTION_NOTES = """\
How actions are drawn. `action_pdtype` names the distribution over actions: `"default"` is
`Categorical` for a Discrete action space and `Normal` for a 1-D Box space; `Argmax` is for
Discrete spaces. `Normal` takes the net's outputs as the means, with a learned standard
deviation per action dimension that does not depend on the state; Box actions are clipped to
the space's bounds before the env gets them. `action_policy` names how an action is chosen:

- `"default"`: sample from the distribution (for `Argmax`: take the largest output);
- `"epsilon_greedy"`: with probability explore_var a uniformly random action, else the largest
  output;
- `"boltzmann"`: sample from softmax(output / explore_var).

explore_var is the value of `explore_var_spec` at the current frame. `epsilon_greedy` and
`boltzmann` are meant for Discrete actions and need an `explore_var_spec`: with a null one
there is no value (NaN), and `epsilon_greedy` then never explores.

Evaluation (`meta.rigorous_eval`) takes greedy actions: the largest output for Discrete
actions, the mean for `Normal` (`Random` stays random)."""

MEMORY_INTRO = """\
## `agent.memory`

`name` picks the memory. Each algorithm accepts only the memories listed with it above."""

MEMORY_NOTES = {
    'OnPolicyBatchReplay': 'The batch length is set by the algorithm, not here: `time_horizon` vector '
                           'steps for PPO, `num_step_returns` for n-step ActorCritic, `training_frequency` '
                           'vector steps for the others.',
    'OnPolicyReplay': 'The algorithm trains once `training_frequency` episodes have finished (n-step '
                      'ActorCritic: `num_step_returns` episodes, as in SLM-Lab).',
    'Replay': 'Each vector step adds `num_envs` transitions; once `max_size` is reached the oldest '
              'are overwritten.',
}

NET_INTRO = """\
## `agent.net`

`type` picks the network class. The algorithm builds the nets it needs from this one spec:"""

NET_NOTES = """\
Keys an algorithm does not read are still validated, and ignored.

`clip_grad_val` clips the global norm of the gradients of each net in an optimizer step (the CSV
column `grad_norm` is the norm before clipping). `init_fn` names a `torch.nn.init` function for
the weights of every linear layer, with the gain torch recommends for `hid_layers_activation`
(the output heads too, unless the algorithm sets their gain, as actor-critics and Reinforce do:
0.01 for the policy, 1 for the value, where SLM-Lab gives them the hidden layers' gain), biases 0; null keeps torch's default initialisation. `gpu`: with `true` or `"auto"` the nets run on CUDA when torch finds a GPU, and
on the CPU otherwise."""

TORCH_SPECS = """\
## Optimizers (`optim_spec`)

`{"name": CLASS, ...arguments}` builds `torch.optim.CLASS(parameters, **arguments)`:
`{"name": "Adam", "lr": 0.001, "eps": 1e-5}`. CLASS is any optimizer class in `torch.optim`
(`Adam`, `AdamW`, `SGD`, `RMSprop`, ...); each argument must be a keyword argument of that
class, and its value must not be an object. The class and argument names are checked when the
spec is validated (a wrong one fails with the valid names); the values are passed to torch as
they are, when the lab builds the agent before it creates the run directory, and torch reports
a value it rejects (say a negative `lr`) with its own error.

## Losses (`loss_spec`)

`{"name": CLASS, ...arguments}` builds `torch.nn.CLASS(**arguments)`, where CLASS is a class
of `torch.nn` whose name ends in `Loss`: `{"name": "MSELoss"}`,
`{"name": "SmoothL1Loss", "beta": 1.0}`. The same rules for arguments apply.

## LR schedulers (`lr_scheduler_spec`)

null (the default) keeps the learning rate constant. Otherwise, after every training update (not
every frame, and not every gradient step), the learning rate is set to the schedule's value at the
frame of that update, counting the step being trained on; the next update trains with it. The CSV
column `lr` shows the learning rate of the first optimizer. As in SLM-Lab, every count a schedule
takes is in frames (env steps summed over all sub-envs), whatever the training frequency, so the
rate is a function of the frame alone and a resumed run continues on the same curve.

- `{"name": "LinearToZero", "frame": N}`: the learning rate is the initial one times
  max(0, 1 - frame / N), where frame is the frame count at the update; without `frame` (or
  with null) N is `env.max_frame`. `frame` is its only argument (SLM-Lab's).
- `{"name": CLASS, ...arguments}`: `torch.optim.lr_scheduler.CLASS(optimizer, **arguments)`,
  with the frame as the scheduler's epoch: the rate is CLASS's closed form at that frame, as
  SLM-Lab v4 computed it (it stepped schedulers with `step(epoch=frame)`). E.g.
  `{"name": "StepLR", "step_size": 1000, "gamma": 0.9}` multiplies the rate by 0.9 every 1000
  frames (initial rate times 0.9 ** (frame // 1000)); `{"name": "MultiStepLR", "milestones":
  [80000], "gamma": 0.1}` divides it by 10 from frame 80000 on. Likewise `ExponentialLR`
  (gamma ** frame), `CosineAnnealingLR` (`T_max` in frames), `CosineAnnealingWarmRestarts`
  (`T_0` in frames), `LinearLR` and `ConstantLR` (`total_iters` in frames), `PolynomialLR`.
  `LambdaLR`, `MultiplicativeLR`, `SequentialLR`, `ChainedScheduler` and `ReduceLROnPlateau`
  need Python objects or a metric, and `CyclicLR` and `OneCycleLR` count their own steps with
  no value per frame: all are rejected in one line."""

SCHEDULES = """\
## Schedules

A schedule makes a coefficient depend on the frame count (env steps summed over all
sub-envs). Schedules are used by `explore_var_spec` (epsilon or temperature),
`entropy_coef_spec` (entropy bonus of Reinforce and PPO) and `clip_eps_spec` (PPO). A schedule
spec is an object with these keys:"""

SCHEDULE_FORMULAS = """\
Schedules compute what SLM-Lab's `VarScheduler` computes (v4.2.4 and v5 agree), so an SLM-Lab
spec gives the same coefficient at the same frame. The coefficient is `start_val` for the first
env step (frame 0); every later step taken with `f` frames already done uses the formula at `f`
(SLM-Lab recomputes it after each env step). With `s` = `start_step`, `e` = `end_step`,
`v0` = `start_val` and `v1` = `end_val`:

- `end_val` null, absent or 0 means `v1 = v0` (SLM-Lab's rule): the schedule is a constant.
  To decay towards 0, give a tiny `end_val` such as `1e-8` (this lab's PPO specs do: with float32
  ratios, a clip range of `1e-8` is the same as 0).
- Every name except `no_decay` gives `v0` for `f < s`.

| `name` | value for `f > 0` |
|---|---|
| `no_decay` | `v1` (so `v0` at frame 0, `v1` after it; the steps are ignored) |
| `linear_decay` | `max(v0 + (f - s) * (v1 - v0) / (e - s), v1)`, with no stop at `e`: a falling schedule stays at `v1` from `e` on; a rising one is `v1` at once and keeps rising past `v1` after `e`. Needs `e > s`. |
| `rate_decay` | `max(v0 * 0.9 ** ((f - s) / ((e - s) / 20)), v1)` for `s <= f < e`, then `v1` |
| `periodic_decay` | `max(v1 * 0.5 * (v0 - v1) * (1 + cos(x) * (1 - x / 60)), v1)` with `x = (f - s) / ((e - s) / 60)` (radians) for `s <= f < e`, then `v1`: SLM-Lab's formula as it is (it multiplies by `v1` where a sinusoid around `v1` would add it, so with `v1 > 0` and `v0 - v1 < 1` it is `v1` after frame 0) |

`decay_rate` and `frequency` are accepted and ignored, as in SLM-Lab, whose scheduler never
passes them (its `rate_decay` always uses 0.9 and 20 periods, `periodic_decay` 60).
`end_step` must not be before `start_step` (except for `no_decay`). `explore_var_spec` and
`entropy_coef_spec` may be null, which means no schedule: the CSV columns `explore_var` and
`entropy_coef` are then empty, and a null `entropy_coef_spec` means no entropy bonus. The value
is a function of the frame only, so a schedule has no state of its own.

Example: epsilon from 1.0 down to 0.05 over the first 10000 frames, then constant:

```json
"explore_var_spec": {"name": "linear_decay", "start_val": 1.0, "end_val": 0.05, "start_step": 0, "end_step": 10000}
```"""

ENV_INTRO = """\
## `env`

Every env is a `gymnasium.vector` env, also when `num_envs` is 1; sub-envs that finish an
episode are reset in the same step. Episode returns in the records are the env's own rewards,
before any reward normalisation.

Box actions: where the env's bounds are finite and not [-1, 1] (`Pendulum-v1`'s [-2, 2], MuJoCo
`Humanoid`'s [-0.4, 0.4]), the agent acts in [-1, 1] and gymnasium's `RescaleAction` maps its
actions onto the bounds, as SLM-Lab v5 does (v4 acted in the env's units); actions beyond the
bounds are clipped for the env while the agent learns from the action it sampled.

Atari games (the Atari extra; `ALE/*-v5` ids as in SLM-Lab v5, the older `*NoFrameskip-v4` and
`-v0`/`-v4` ids as in v4) are preprocessed as SLM-Lab preprocesses them, with gymnasium's wrappers:
up to 30 no-op actions at reset, 4 frames per step with the maximum of the last two, 84x84
greyscale uint8 frames (`image_downsize` sets the size), the last frames stacked into a
(stack, height, width) observation: `frame_op_len` of them when `frame_op` is set, else 4 for
`ALE/` ids and 1 for the older ones. Actions are sticky with the id's probability (0.25 for
`ALE/` ids, 0 for `NoFrameskip` ones) or the spec's `repeat_action_probability`, one emulator frame
at a time, as ALE makes them; the lab applies them (gymnasium's `StickyAction`) so that a snapshot
holds them. FIRE is pressed at each game's start in the games that have it (as SLM-Lab's wrappers
did); `max_t` counts agent steps. `ALE/` ids train on rewards clipped to [-1, 1] (`clip_reward`
defaults to 1 for them, recorded in the saved spec; null turns it off), the older ids on
`reward_scale` as their specs say. A lost life ends the agent's episode while the game goes on
(its frames as they were) with `life_loss_info: true` (SLM-Lab v5), and by default for the older
ids (SLM-Lab v4 trained them so; `life_loss_info: false` turns it off); the records then count
whole games, and evaluation plays whole games. Frames stay uint8 in memory and replay; a net with
`normalize` divides the batch by 255. `"make_kwargs": {"obs_type": "ram"}` gives the 128 bytes of
RAM instead, for an MLP."""

META_INTRO = """\
## `meta`

Run settings. Frequencies are in frames (env steps summed over all sub-envs); a row is also
written when a session reaches `env.max_frame`."""

META_RUNTIME = """\
The lab sets these keys itself when it runs a spec and records them in the saved specs; a spec
file leaves them out."""

SEARCH = """\
## `search`

An object or null: what `search` mode draws for each trial (`python run_lab.py SPEC_FILE
SPEC_NAME search`; README's Search section says what a search writes and how it resumes). Other
modes keep it in the saved spec and do not use it. Each entry is `"<key path>__<space>":
[arguments]`; entries may be nested (`{"agent": {"algorithm": {"gamma__uniform": [0.9,
0.999]}}}`), dotted (`{"agent.algorithm.gamma__uniform": [0.9, 0.999]}`) or both, and SLM-Lab v4's
one-element `"agent": [{...}]` and `"env": [{...}]` lists are read as the object inside. The key
path is any spec key (a list element by index: `agent.net.hid_layers.0`), set in each trial's
spec in place of the spec's own value.

| Space | Arguments | Draws |
|---|---|---|
| `uniform` | `[low, high]` | a float in [low, high] |
| `quniform` | `[low, high, q]` | a multiple of q in [low, high] |
| `loguniform` | `[low, high]` | a float in [low, high], uniform in log space; low > 0 |
| `qloguniform` | `[low, high, q]` | loguniform, rounded to the nearest multiple of q in [low, high] |
| `randint` | `[low, high]` | an int in [low, high): high excluded (numpy's and Ray's rule) |
| `qrandint` | `[low, high, q]` | a multiple of q in [low, high]: high included (Ray's rule) |
| `lograndint` | `[low, high]` | an int in [low, high), uniform in log space; low >= 1 |
| `qlograndint` | `[low, high, q]` | an int in [low, high] uniform in log space, rounded to the nearest multiple of q in [low, high] |
| `randn`, `normal` | `[mean, sd]` | a float from the normal distribution (`normal`: SLM-Lab v4's name) |
| `qrandn` | `[mean, sd, q]` | randn, rounded to a multiple of q |
| `choice` | `[v1, v2, ...]` | one of the values, each equally likely at first; any JSON values |
| `grid_search` | `[v1, v2, ...]` | every value in turn: the search runs `meta.max_trial` trials per grid point (several grid keys: every combination), as SLM-Lab v4 ran it on Ray Tune; SLM-Lab v5 refuses it |

Values are drawn by Optuna's TPE sampler (random for the first 10 trials, then modelled on the
results so far), seeded from `meta.random_seed` and the trial's number, so a search resumed after
a stop draws what it would have drawn. `normal` is drawn through its quantile and `choice` through
the index of the value, so Optuna models those too.

Checked before a search starts, each a one-line error naming the entry (`search.<entry>`): an
unknown space, arguments that do not fit it (`low > high`, an empty list, non-integers for the
int spaces, `low <= 0` on a log scale), and every searched key with both ends of its range and
each of its values set in the spec, which must then validate (so an unknown key path, or a value
out of a key's range, is named with the spec's own message); a value that fails alone is kept when
it validates with one other searched key at one of its own ends or values (an entropy schedule's
`start_step` past the spec's `end_step`, searched beside `end_step`), and a trial that draws a
combination the spec refuses fails alone, with its line in the search's log. Searched keys that SLM-Lab's older
versions had and neither v4 nor v5 reads (`agent.algorithm.clip_eps`, `agent.algorithm.entropy_coef`,
`agent.net.lr_decay_frequency`, `agent.net.lr_anneal_timestep`, in some of its experimental search
specs) are left out of the search with a warning: searching them changed nothing in SLM-Lab either.
An empty block is a search of trials that differ by their seeds only.

The `meta` keys of a search: `max_trial` (trials, per grid point), `search_resources` (`cpu`,
`gpu`: what a trial reserves; a trial's sessions run in parallel processes within it),
`search_scheduler` (`grace_period` in frames, `reduction_factor`: ASHA early stopping on the frame,
by `total_reward_ma`; absent: every trial runs to `env.max_frame`)."""

SEEDS = """\
## Seeds

Every session has one integer seed:

    seed = meta.random_seed + 1000 * trial + session

`session` counts from 0 to `meta.max_session - 1`; `trial` is 0 outside `search` mode, and the
trial's number in a search, so each trial trains with its own seeds. When `meta.random_seed` is null the lab draws one at random (0 <= random_seed <
2**31 - 10**7) and records it in the saved specs, so `-s meta.random_seed=N` repeats the seeds
of a run. From the session seed:

| What | Seeded with |
|---|---|
| Python `random`, NumPy's global generator, `torch.manual_seed` | `seed` (NumPy: `seed mod 2**32`) |
| the training env, at its first reset | `seed`; gymnasium gives sub-env `i` the seed `seed + i` |
| the memory's generator (`Replay` sampling) | `seed + 1` |
| the algorithm's generator (exploration draws; the action space for `Random`) | `seed + 2` |
| the `rigorous_eval` env, at its first reset | `seed + 1000000` |

Each session's saved spec (`{spec_name}_t{t}_s{s}_spec.json`) records the seed that session used
as its `meta.random_seed`, with `meta.max_session` 1 (as SLM-Lab records it), so running that file
as a spec file repeats the session alone: its session 0 uses `random_seed` itself. The run's and
the trial's specs keep the base seed.

A session resumed with `train@` restores every generator from its snapshot instead. Replay
(`enjoy@`) plays episode `i` (from 0) with the env reset to the session spec's
`meta.random_seed + 10000000 + i`."""

RESUME_EDITS = """\
## Editing a spec before resuming (`train@`)

`train@latest` and `train@<run dir>` read the spec file as it is now (with the `-s` options
given) and compare it with the run's saved spec. These keys may change: {allowed}, and any key
of an algorithm schedule (`agent.algorithm.*_spec.start_val`, `end_val`, `start_step`,
`end_step`, `name`, `decay_rate`, `frequency`). The run continues as if it had been started with
the edited spec: each schedule that moves at the resume frame (an edited one, or `LinearToZero`
after `env.max_frame` changed), and each whose `end_step` spanned the old run, gets a warning
and an entry in `schedule_changes` of the resume record ([resume.md](resume.md#extending-a-run-schedules)).
Any other change is refused with the list of changes, unless `--force` is given; a resume that goes ahead
records its changes in the run's `{spec_name}_resumes.json`. `meta.max_session` may grow but
never shrink, even with `--force`. `env.max_frame` may not be below the frame the run has
reached; when every session has already reached it, the lab says the run is finished and exits
with 0 without training. A null `meta.random_seed` keeps the run's seed."""

COMPAT = """\
## SLM-Lab compatibility

SLM-Lab's spec files run unchanged, both its v4 series (v4.2.4) and its v5 series (v5.3):

- JSON may have trailing commas before `}` and `]`, as SLM-Lab v4 files do; a real syntax error
  still names its line and column in the file.
- YAML spec files (`.yaml`, `.yml`, read with pyyaml's safe loader): anchors and `<<:` merges
  work, `1e7` is a number, and top-level keys starting with `_` are templates, not specs (they
  are not listed and cannot be run).
- Integer keys accept integral numbers written as floats: `"max_frame": 1e7` is 10000000, in a
  file and in `-s`; `1.5` is still refused.
- `agent` and `env` may be one-element lists (`"agent": [{...}]`), as in SLM-Lab v4 specs; the
  single element is used, before overrides, so `-s agent.algorithm.gamma=0.99` works on either
  layout. Lists of more than one agent or env are refused.
- A top-level `body` block (SLM-Lab v4's agent-env layout) is checked: `product` `outer`,
  `inner` or `custom` with `num` 1 is the one agent in one env it describes; more is refused as
  a multi-agent layout. A top-level `name` is accepted and dropped.
- A spec saved in a run directory is itself a spec file (its top level is one spec, read under
  its recorded `name`); the run records in its `meta` are dropped, and the new run records its own.
{false_only}
Names SLM-Lab has that this version does not implement yet fail with "not available yet" and
the list of what is available:"""


# ---------------------------------------------------------------------------------------------
# the document

def schedule_schema() -> dict:
    """The Fields of a schedule object (explore_var_spec and the like)."""
    from slm_lab.lib.decay import SCHEDULE_SCHEMA
    return SCHEDULE_SCHEMA


def algorithm_groups() -> list[list[type]]:
    """Registered algorithm classes grouped by module, in registry order."""
    from slm_lab.agent.algorithm import ALGORITHMS
    groups: dict[str, list[type]] = {}
    for cls in ALGORITHMS.values():
        groups.setdefault(cls.__module__, []).append(cls)
    return list(groups.values())


def algorithm_own_keys(cls: type) -> list[str]:
    """Keys of an algorithm's schema that are not the common Field (new or changed)."""
    from slm_lab.agent.algorithm.base import BASE_SCHEMA
    return [k for k, f in cls.spec_schema.items() if BASE_SCHEMA.get(k) is not f]


def _algorithm_section(group: list[type]) -> str:
    from slm_lab.agent.algorithm import policy_util
    from slm_lab.agent.memory import MEMORIES
    out = ['### ' + ', '.join(f'`{cls.__name__}`' for cls in group)]
    module_doc = inspect.getdoc(sys.modules[group[0].__module__]) or ''
    if module_doc:
        out.append('```text\n' + module_doc + '\n```')
    documented: dict[int, str] = {}
    for cls in group:
        lines = [f'`{cls.__name__}`: {_first_paragraph(cls)}', '']
        needs = [f'`agent.{r}`' for r in cls.requires]
        lines.append(f'- Needs: {" and ".join(needs) if needs else "no memory and no net"}.')
        if 'memory' in cls.requires or cls.memory_names is not None:
            memories = cls.memory_names if cls.memory_names is not None else tuple(MEMORIES)
            lines.append(f'- Memories: {_names(memories)}.')
        spaces = 'Discrete or 1-D Box' if cls.continuous_ok else 'Discrete only'
        pdtypes = policy_util.PDTYPES if cls.continuous_ok else ('default',) + policy_util.DISCRETE_PDTYPES
        lines.append(f'- Action spaces: {spaces} (action_pdtype {_names(pdtypes)}).')
        out.append('\n'.join(lines))
        own = algorithm_own_keys(cls)
        if id(cls.spec_schema) in documented:
            out.append(f'Keys: the same as `{documented[id(cls.spec_schema)]}`.')
        elif own:
            out.append(f'Keys of `{cls.__name__}`, besides the common ones:\n\n'
                       + table(cls.spec_schema, cls.__name__, own))
            documented[id(cls.spec_schema)] = cls.__name__
        else:
            out.append('Keys: only the common ones.')
            documented[id(cls.spec_schema)] = cls.__name__
    return '\n\n'.join(out)


def _memory_sections() -> str:
    from slm_lab.agent.algorithm import ALGORITHMS
    from slm_lab.agent.memory import MEMORIES
    out = []
    for name, cls in MEMORIES.items():
        users = [a for a, c in ALGORITHMS.items() if c.memory_names is not None and name in c.memory_names]
        text = [f'### `{name}`', '', _first_paragraph(cls)]
        if name in MEMORY_NOTES:
            text += ['', MEMORY_NOTES[name]]
        text += ['', f'Used by: {_names(users) if users else "no algorithm yet"}.', '', table(cls.spec_schema, name)]
        out.append('\n'.join(text))
    return '\n\n'.join(out)


def _net_use() -> str:
    """What nets each algorithm builds from agent.net: the `nets_doc` of each algorithm class,
    one bullet per group of algorithms that share it."""
    from slm_lab.agent.algorithm import ALGORITHMS
    groups: dict[str, list[str]] = {}
    for name, cls in ALGORITHMS.items():
        if cls.nets_doc:
            groups.setdefault(cls.nets_doc, []).append(name)
    return '\n'.join(f'- {", ".join(f"`{n}`" for n in names)}: {" ".join(doc.split())}'
                     for doc, names in groups.items())


def _net_sections() -> str:
    from slm_lab.agent.net import NETS
    out = []
    for name, cls in NETS.items():
        out.append('\n'.join([f'### `{name}`', '', _first_paragraph(cls), '', table(cls.spec_schema, name)]))
    return '\n\n'.join(out)


def _planned() -> str:
    from slm_lab.agent.algorithm import PLANNED_ALGORITHMS, policy_util
    from slm_lab.agent.memory import PLANNED_MEMORIES
    from slm_lab.agent.net import PLANNED_NETS
    rows = [
        ('`agent.algorithm.name`', PLANNED_ALGORITHMS),
        ('`agent.memory.name`', PLANNED_MEMORIES),
        ('`agent.net.type`', PLANNED_NETS),
        ('`agent.algorithm.action_pdtype`', policy_util.PLANNED_PDTYPES),
    ]
    lines = ['| Key | Not available yet |', '|---|---|']
    lines += [f'| {key} | {_names(names)} |' for key, names in rows]
    return '\n'.join(lines)


SLM_LAB_KEYS = """\
## SLM-Lab keys

Spec files of SLM-Lab v4.2.4 and v5.3 run here as they are. Every key path found in SLM-Lab's
published specs is either accepted, with the meaning it has in SLM-Lab, or refused with one line
saying that what it needs is not available yet in this version (the component it waits for is
named; see the last table). SLM-Lab silently ignores keys its code does not read; the lab
refuses them as unknown keys with a suggestion, except the few SLM-Lab's own specs carry, which
are accepted and ignored as SLM-Lab ignores them (listed below). The same holds for keys SLM-Lab's
code reads that its published specs do not show (`env.clip_obs`, `env.clip_reward`,
`net.layer_norm`, `net.actor_init_std`, `net.critic_init_std`, `net.cuda_id`, PPO's `symlog` and
`normalize_advantages`, SoftActorCritic's keys, and the `meta` keys SLM-Lab writes into the specs
it saves, so that a spec file SLM-Lab saved runs here too).

Env keys that are not in the `env` table are keyword arguments of the env's constructor and go
to `gymnasium.make` (SLM-Lab v5's rule), e.g. `"continuous": true` for `LunarLander-v3` or
`"repeat_action_probability": 0.0` for an `ALE/` game. Each is checked against the arguments of
that env's constructor before anything runs, so a misspelt one is named with the valid
arguments; `make_kwargs` is passed as well, unchecked (gymnasium.make's own arguments such as
`disable_env_checker` go there).

Keys SLM-Lab renamed between versions: both names are accepted, the saved spec holds the first.
Giving both with different values is an error."""

SLM_LAB_ACCEPTED = """\
Every other key of SLM-Lab's specs (`gamma`, `lam`, `time_horizon`, `training_frequency` of DQN
and Reinforce, `hid_layers`, `clip_grad_val`, `gpu`, `update_type`, `polyak_coef`, `log_std_init`,
`LinearToZero`'s `frame`, `use_cer`, `max_t`, `eval_frequency`, `rigorous_eval`, ...) is one of
the lab's own keys in the tables above, with SLM-Lab's meaning and SLM-Lab's default where SLM-Lab
has one (Reinforce `center_return` false, PPO `val_loss_coef` 1 and `minibatch_size` 4, DQN
`training_start_step` the memory's `batch_size`, `polyak_coef` 0). `clip_grad_val` clips each net
on its own, as SLM-Lab clips each net in its own train step.

Where SLM-Lab's two generations, or SLM-Lab and this lab, differ (known, and kept as they are):

- `log_std_init`, as in SLM-Lab: with a number, continuous policies learn one state-independent
  log std starting there; null (the default), the policy net outputs the log scale beside the loc,
  clamped to [-5, 2]. (Before this version the lab kept a learned log std starting at 0 for null.)
- SLM-Lab v5's Reinforce always standardises its returns; v4 only centres them with
  `center_return`. Here `center_return` centres and `normalize_return` divides by the std, both
  off by default, as in v4.
- `meta.rigorous_eval` plays greedy actions (argmax, or a Normal policy's mean) on a separate
  env; SLM-Lab evaluates with its acting policy at the exploration schedules' end values.
- `use_cer` follows v5: the transitions stored since the previous sample (every vector env's)
  replace the tail of the next batch, at most one batch, any left over go into later batches;
  v4 put the single newest transition. The count pending is in the snapshot.
- SARSA: the last step of each batch is held back until its next action is known (SLM-Lab uses
  action 0 there); a truncated step bootstraps from the acting policy's expected Q at its final
  observation (no action was taken there); a terminated one does not bootstrap.
- n-step `ActorCritic` bootstraps on truncation and at the batch end, never on termination, from
  each step's own next state (v4 stops at any done; v5 bootstraps only from the batch's last next
  state). Advantages are standardised over the batch for every variant (v5; v4 only for GAE).
  `A2C` is an agent name in SLM-Lab's specs, not an algorithm: use `ActorCritic`.
- `PrioritizedReplay`: SLM-Lab has no importance weights; the lab's `beta` (default 0) adds them.
  New transitions get the priority of an error of 100000, as in SLM-Lab.
- `OnPolicyCrossEntropy` keeps the episodes whose return is at least the `cross_entropy`
  quantile of the finished ones, which is what SLM-Lab's code does (its docstring says the
  reverse).
- SoftActorCritic: the Categorical variant's soft value uses the mean of the twin critics (v5);
  `GumbelSoftmax` is v4's variant (critics of (s, one_hot(a)), target entropy -n);
  `spectral_norm: true` is not available yet; `entropy_penalty_coef` applies to Categorical only.
- SIL and PPOSIL: returns are computed per finished episode (SLM-Lab computes them over sampled
  minibatches as one trajectory), a truncated episode's bootstrapped from V of its final
  observation; with separate nets the critic trains on the SIL value loss too (SLM-Lab steps
  only the actor); a `PrioritizedReplay` SIL replay updates its priorities (SLM-Lab never does).
  The four SIL algorithm keys default to 1.0, 0.01, 1, 1 (SLM-Lab has no defaults). The SIL
  replay's `use_cer` puts the single newest transition last in each batch (v4's rule; v5's
  Replay rule would fill SIL batches with the latest episode, which arrives whole).
- PPO also trains on whole episodes (`OnPolicyReplay`, every `training_frequency` episodes),
  which SLM-Lab's PPO does not; PPO refuses SIL's keys with a pointer to `PPOSIL`.
- Beta, MultiCategorical and NormalTanh `action_pdtype`s are not available: SLM-Lab builds every
  continuous distribution from loc and scale, which Beta does not take; MultiCategorical needs
  MultiDiscrete actions; NormalTanh appears only in its MuJoCo Playground specs.
- `TorchArcNet` reads SLM-Lab's arc format with the lab's own small reader (torch.nn classes,
  `LazyBatchRenorm1d`, Sequential lists, a graph of one input and one output): torcharc 2.x,
  the package that reads this format, requires Python 3.12, and pip refuses it on this lab's 3.11.
- `env.max_t` becomes the episodes' time limit (v4 applies it to single envs; v5 records it
  without applying it).
- PPO's `time_horizon` and `minibatch_size` are used as given; SLM-Lab rounds both up to a
  multiple of `num_envs`.
- DQN's `polyak` target update runs every `update_frequency` frames, as in v4 (v5 runs it at
  every training step and ignores `update_frequency`).

Keys the lab accepts for SLM-Lab specs beyond its own (the tables above give their types and
defaults; "absent" means the saved spec holds the key only when the spec file gives it):"""

SLM_LAB_PLANNED = """\
Keys and values that wait for a later component. A spec that uses one stops with one line
naming it and "is not available yet"; the component names (algorithms, memories, nets, action
distributions) are in the table above."""


def all_schemas() -> list[tuple[str, str, dict]]:
    """(key path prefix, owner, schema) of every schema the validator uses, nested ones included."""
    from slm_lab.spec import ENV_SCHEMA, META_SCHEMA
    out = [('', 'spec', TOP_SCHEMA), ('env', 'env', ENV_SCHEMA), ('meta', 'meta', META_SCHEMA)]
    for (kind, name), schema in component_schemas():
        prefix = 'agent.net' if kind == 'net' else f'agent.{kind}'
        out.append((prefix, name, schema))
    nested = []
    for prefix, owner, schema in out:
        for key, fld in schema.items():
            if fld.schema is not None and fld.schema is not schedule_schema():
                nested.append((f'{prefix}.{key}' if prefix else key, owner, fld.schema))
    return out + nested


def _slm_lab_fields() -> list[tuple[str, str, str, Field]]:
    """(key path, owners, key, Field) of every key that exists for SLM-Lab specs: its doc names
    SLM-Lab, or it is ignored, or it has an alias or values that are not available yet."""
    rows: dict[tuple, list[str]] = {}
    fields = {}
    for prefix, owner, schema in all_schemas():
        for key, fld in schema.items():
            if 'SLM-Lab' in fld.doc or fld.default is OMIT or fld.aliases or fld.planned:
                path = f'{prefix}.{key}' if prefix else key
                rows.setdefault((path, fld.doc), []).append(owner)
                fields[(path, fld.doc)] = (key, fld)
    return [(path, ', '.join(owners), *fields[(path, doc)]) for (path, doc), owners in rows.items()]


def _slm_lab_sections() -> str:
    from slm_lab.agent.algorithm import PLANNED_KEYS as ALGORITHM_KEYS
    from slm_lab.agent.memory import PLANNED_KEYS as MEMORY_KEYS
    from slm_lab.agent.net import PLANNED_KEYS as NET_KEYS
    from slm_lab.agent.net.net_util import PLANNED_OPTIMIZERS
    from slm_lab.spec import ENV_PLANNED_KEYS
    fields = _slm_lab_fields()
    aliases = ['| Key | Also accepted as | In |', '|---|---|---|']
    aliases += [f'| `{path}` | {_names(fld.aliases)} | {owners} |' for path, owners, _, fld in fields if fld.aliases]
    accepted = ['| Key | In | Meaning here |', '|---|---|---|']
    accepted += [f'| `{path}` | {owners} | {_cell(fld.doc)} |' for path, owners, _, fld in fields
                 if not fld.aliases and not fld.planned]
    planned = ['| Key or value | What it needs |', '|---|---|']
    for prefix, keys in (('agent.algorithm', ALGORITHM_KEYS), ('agent.memory', MEMORY_KEYS),
                         ('agent.net', NET_KEYS), ('env', ENV_PLANNED_KEYS)):
        planned += [f'| `{prefix}.{key}` | {_cell(what)} |' for key, what in keys.items()]
    for path, _, _, fld in fields:
        planned += [f'| `{path}`: `{json_text(value)}` | {_cell(what)} |' for value, what in fld.planned.items()] \
            if fld.planned else []
    planned += [f'| `*optim_spec.name`: `"{name}"` | {_cell(what)} |' for name, what in PLANNED_OPTIMIZERS.items()]
    return '\n\n'.join([SLM_LAB_KEYS, '\n'.join(aliases), SLM_LAB_ACCEPTED, '\n'.join(accepted),
                        SLM_LAB_PLANNED, '\n'.join(planned)])


def _allowed_edits() -> tuple:
    """Spec keys that train@ lets change without --force."""
    from slm_lab.persistence.edits import ALLOWED_EDITS
    return ALLOWED_EDITS


def _false_only_keys() -> str:
    """Keys kept for SLM-Lab specs that accept only false."""
    from slm_lab.spec import META_SCHEMA
    found = [f'`meta.{k}`' for k, f in META_SCHEMA.items() if f.choices == (False,)]
    for name, schema in component_schemas():
        prefix = {'algorithm': 'agent.algorithm', 'memory': 'agent.memory', 'net': 'agent.net'}[name[0]]
        for k, f in schema.items():
            if f.choices == (False,) and f'`{prefix}.{k}`' not in found:
                found.append(f'`{prefix}.{k}`')
    if not found:
        return ''
    return '- These keys exist for SLM-Lab specs and accept only `false`: ' + ', '.join(found) + '.\n'



def component_schemas() -> list[tuple[tuple[str, str], dict]]:
    """((kind, class name), spec_schema) of every registered algorithm, memory and net."""
    from slm_lab.agent.algorithm import ALGORITHMS
    from slm_lab.agent.memory import MEMORIES
    from slm_lab.agent.net import NETS
    out = [(('algorithm', n), c.spec_schema) for n, c in ALGORITHMS.items()]
    out += [(('memory', n), c.spec_schema) for n, c in MEMORIES.items()]
    out += [(('net', n), c.spec_schema) for n, c in NETS.items()]
    return out


def generate() -> str:
    """The whole reference as markdown (deterministic: it depends only on the code)."""
    from slm_lab.agent.algorithm.base import BASE_SCHEMA
    from slm_lab.spec import ENV_SCHEMA, META_SCHEMA, RUNTIME_META

    user_meta = [k for k in META_SCHEMA if k not in RUNTIME_META]
    runtime_meta = [k for k in META_SCHEMA if k in RUNTIME_META]
    parts = [
        INTRO,
        LAYOUT, table(TOP_SCHEMA, 'spec'),
        OVERRIDES,
        AGENT_INTRO, table(AGENT_SCHEMA, 'agent'),
        ALGORITHM_INTRO, table(BASE_SCHEMA, 'algorithm'), ACTION_NOTES,
        *[_algorithm_section(group) for group in algorithm_groups()],
        MEMORY_INTRO, _memory_sections(),
        NET_INTRO, _net_use(), NET_NOTES, _net_sections(),
        TORCH_SPECS,
        SCHEDULES, table(schedule_schema(), 'schedule'), SCHEDULE_FORMULAS,
        ENV_INTRO, table(ENV_SCHEMA, 'env'),
        META_INTRO, table(META_SCHEMA, 'meta', user_meta),
        META_RUNTIME, table(META_SCHEMA, 'meta', runtime_meta),
        SEARCH,
        SEEDS,
        RESUME_EDITS.replace('{allowed}', _names(_allowed_edits())),
        COMPAT.replace('{false_only}', _false_only_keys()), _planned(),
        _slm_lab_sections(),
    ]
    return '\n\n'.join(p for p in parts if p) + '\n'


def main(argv: list[str] | None = None) -> int:
    """Print the reference, or write it to docs/spec.md with --write."""
    parser = argparse.ArgumentParser(prog='python -m slm_lab.spec_doc', description=__doc__.split('\n')[0])
    parser.add_argument('--write', action='store_true', help=f'write {DOC_PATH.relative_to(DOC_PATH.parent.parent)} '
                                                             'instead of printing')
    args = parser.parse_args(argv)
    text = generate()
    if args.write:
        from slm_lab.lib.io import atomic_write_text
        atomic_write_text(DOC_PATH, text)
        print(f'wrote {DOC_PATH}')
    else:
        sys.stdout.write(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
