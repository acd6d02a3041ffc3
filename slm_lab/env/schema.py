"""The env section of a spec: its keys (ENV_SCHEMA; keys it does not name are arguments of the
env's constructor), the keys SLM-Lab reads for env families this lab does not have, and the checks
of a registered id, of constructor arguments and of keys that go together (frame_op,
life_loss_info, image_downsize)."""
from __future__ import annotations

import inspect

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

from slm_lab.env import classic
from slm_lab.env.atari import ale_vector_unfit, default_backend
from slm_lab.env.ids import ENV_FAMILIES, atari_frames, ensure_env_registered, env_family, warn_if_outdated
from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import MAX_FRAME, MAX_HISTORY, OMIT, Field, accepts, check_object, ignored_field, suggest


def _check_env_name(name: str, path: str) -> None:
    ensure_env_registered(name)
    if name not in gym.envs.registry:
        raise SpecError(f"{path}: '{name}' is not a registered gymnasium environment"
                        f'{suggest(name, list(gym.envs.registry))}; e.g. CartPole-v1, Pendulum-v1')
    warn_if_outdated(name)


@accepts('a number, `"sign"` or null')
def _check_reward_scale(value, path: str) -> None:
    if isinstance(value, str) and value != 'sign':
        raise SpecError(f'{path}: {value!r} is not valid; give a number, "sign" or null')


@accepts('a bound > 0, `[min, max]` with min < max, or null')
def _check_clip_reward(value, path: str) -> None:
    if isinstance(value, list):
        if len(value) != 2 or not all(_is_number(x) for x in value) or not value[0] < value[1]:
            raise SpecError(f'{path}: {value!r} is not valid; give a bound b > 0 (clips to [-b, b]), '
                            '[min, max] with min < max, or null')
    elif value <= 0:
        raise SpecError(f'{path}: {value!r} is out of range; a bound must be > 0 (or give [min, max])')


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


MAX_IMAGE_SIDE = 4096  # pixels of a resized frame's side (Atari's frames are 210 x 160)


@accepts(f'`[width, height]`, each 1 to {MAX_IMAGE_SIDE}, or null')
def _check_downsize(value, path):
    if len(value) != 2 or min(value) < 1 or max(value) > MAX_IMAGE_SIDE:
        raise SpecError(f'{path}: {value!r} is not a frame size; give [width, height], each 1 to {MAX_IMAGE_SIDE}, '
                        'e.g. [84, 84]')


AUTORESET_MODES = ('same_step', 'next_step')  # env.autoreset: gymnasium's AutoresetMode by name
BACKENDS = ('ale', 'gymnasium', 'numpy')  # env.vector_backend
ENV_SCHEMA = {
    'name': Field((str,), check=_check_env_name, doc='gymnasium environment id, e.g. CartPole-v1'),
    'num_envs': Field((int,), 1, min=1, max=4096,
                      doc='parallel environments in one gymnasium.vector env (at most 4096: every one is stepped '
                          'by one process, or is a process of its own in async mode)'),
    'max_t': Field((int,), None, nullable=True, min=1, max=MAX_FRAME,
                   doc="episode step limit (null: the env's own TimeLimit)"),
    'max_frame': Field((int,), min=1, max=MAX_FRAME, doc='frames (env steps over all envs) in a session'),
    'normalize_obs': Field((bool,), False, doc='running mean/std observation normalisation'),
    'normalize_reward': Field((bool,), False, doc='scale rewards by a running std of the discounted return'),
    'vectorization_mode': Field((str,), 'sync', choices=('sync', 'async'),
                                doc='gymnasium.vector mode: sync (one process) or async (one process per env)'),
    'make_kwargs': Field((dict,), {}, doc='extra keyword arguments for gymnasium.make'),
    'autoreset': Field((str,), 'same_step', choices=AUTORESET_MODES,
                       doc='when a vector env starts the next episode of a sub-env whose episode ended: '
                           '"same_step", in the step that ended it (the agent learns from the episode\'s final '
                           'observation, the next step starts from the new episode\'s first); "next_step", in the '
                           'step after, as gymnasium\'s default and SLM-Lab v5\'s vector envs (num_envs > 1) do: '
                           'that step ignores the action, gives reward 0, and the agent stores it as one more '
                           'transition, from the final observation to the first of the next episode, not done '
                           '(docs/environments.md); gymnasium\'s vector envs only (vector_backend "gymnasium")'),
    'vector_backend': Field((str,), None, nullable=True, choices=BACKENDS,
                            doc='the vector env that steps the sub-envs: "gymnasium", gymnasium\'s (one env per '
                                'sub-env under its wrappers); "ale", ALE\'s own for an Atari game (C++ threads step '
                                'the games; a resumed run starts fresh episodes); "numpy", the lab\'s own for '
                                'CartPole-v0/v1 and Acrobot-v1 (every sub-env in one step, the numbers of '
                                'gymnasium\'s, bit for bit); null: "ale" '
                                'for an Atari game with num_envs > 1 that ALE\'s vector env can run, "numpy" for a '
                                'CartPole or Acrobot it can run, else "gymnasium" (the saved spec says which ran; '
                                'docs/environments.md)'),
    # SLM-Lab keys
    'reward_scale': Field((float, str), None, nullable=True, check=_check_reward_scale,
                          doc='multiply training rewards by this number, or "sign": use their sign (SLM-Lab v4); '
                              "the recorded returns stay the env's own"),
    'normalize_state': Field((bool,), OMIT, planned={
        True: "SLM-Lab v4's running normalisation of observations by one scalar mean and std, "
              'where env.normalize_obs normalises each dimension'}, doc='(SLM-Lab v4) only false; see normalize_obs'),
    'frame_op': Field((str,), OMIT, nullable=True, choices=('concat',), planned={
        'stack': "frame stacking into (frame_op_len, ...) sequences, for SLM-Lab's RecurrentNet"},
        doc='(SLM-Lab v4) "concat": each observation is the last frame_op_len observations of its env joined '
            'end to end (the first of an episode repeated to fill), for vector observations; for Atari frames, '
            'the last frame_op_len 84x84 frames stacked (frame_op_len, 84, 84) (zeros before the first); null: '
            'none (Atari: 4 frames for ALE/ ids, 1 for the older ids)'),
    'frame_op_len': Field((int,), OMIT, nullable=True, min=1, max=MAX_HISTORY,
                          doc='(SLM-Lab v4) how many observations frame_op joins; needed with frame_op'),
    'image_downsize': Field((list,), OMIT, nullable=True, item_type=int, check=_check_downsize,
                            doc='(SLM-Lab v4) Atari: the [width, height] frames are resized to (null: 84 x 84)'),
    'clip_obs': Field((float,), OMIT, nullable=True, min=0, min_exclusive=True,
                      doc='(SLM-Lab v5) clip observations to [-clip_obs, clip_obs], after normalize_obs when that '
                          'is on (absent: 10 with normalize_obs, else null; null: no clipping)'),
    'clip_reward': Field((float, list), OMIT, nullable=True, check=_check_clip_reward,
                         doc='(SLM-Lab v5) clip training rewards to [-clip_reward, clip_reward] or to [min, max], '
                             'after normalize_reward when that is on (absent: 10 with normalize_reward, else null; '
                             "null: no clipping); the recorded returns stay the env's own"),
    'device': ignored_field("(SLM-Lab v5) the device of SLM-Lab's MuJoCo Playground envs; ignored for gymnasium "
                            'envs, as in SLM-Lab'),
    'life_loss_info': Field((bool,), OMIT,
                            doc='(SLM-Lab v5) Atari: a lost life ends the agent\'s episode (terminated) while the game '
                                'goes on, and the records count whole games\' returns; evaluation plays whole games'),
}
# env keys SLM-Lab reads for env families this lab does not have
ENV_PLANNED_KEYS = {'unity': "Unity environments (SLM-Lab v4's env.unity)"}


def check_env(env: dict, path: str = 'env', settle: bool = True, searched: set[str] = frozenset()) -> dict:
    """The env section validated (its keys, its constructor arguments, the keys that go together)
    with every default filled in; SpecError naming the key path of the first problem. `settle`
    (validate_spec's): vector_backend null is settled (check_vector_backend); a search's spec
    leaves it null, to each trial's spec, whose env keys may be searched. `searched`: the paths a
    search's block draws; the clipping defaults that depend on one of them are left out of the
    search's spec, to each trial's (clip_defaults_left_to_trials)."""
    env = check_object(env, ENV_SCHEMA, path, extra_ok=lambda k: k not in ENV_PLANNED_KEYS,
                       planned_keys=ENV_PLANNED_KEYS)
    check_env_kwargs(env, path)
    check_frame_op(env)
    check_vector_backend(env, settle)
    return fill_env_clip_defaults(env, leave=() if settle else clip_defaults_left_to_trials(searched))


def check_vector_backend(env: dict, settle: bool = True) -> None:
    """env.vector_backend "ale" only for a game ALE's vector env can run, "numpy" only for a
    CartPole or Acrobot it can run (numpy_backend_misfit); null (the default) is replaced by the choice the
    lab makes (settled_backend) when `settle`, so the saved spec says which ran."""
    if env.get('vector_backend') == 'ale':
        unfit = ale_vector_unfit(env)
        if unfit is not None:
            raise SpecError(f'env.vector_backend: "ale" cannot run this env: {unfit}; use "gymnasium" or null')
        if env.get('autoreset') == 'next_step':
            raise SpecError('env.autoreset: "next_step" is for gymnasium\'s vector envs, and env.vector_backend "ale" '
                            'runs ALE\'s; set vector_backend to "gymnasium" (or null), or autoreset to "same_step"')
    if env.get('vector_backend') == 'numpy' and (unfit := numpy_backend_misfit(env)) is not None:
        raise SpecError(f'env.vector_backend: "numpy" cannot step this env: {unfit}; use "gymnasium" or null')
    if env.get('vector_backend') is None and settle:
        env['vector_backend'] = settled_backend(env)


def settled_backend(env: dict) -> str:
    """The vector env the lab picks for an env section whose vector_backend is null: "ale" for an
    Atari game ALE's vector env can run in more than one env, "numpy" for a CartPole or Acrobot
    the lab's vector envs can step, else "gymnasium"."""
    if env.get('autoreset') == 'next_step':
        return 'gymnasium'
    return 'numpy' if numpy_backend_misfit(env) is None else default_backend(env)


def backend_fits(env: dict, backend: str) -> bool:
    """Whether `backend` can run this env section."""
    if backend == 'numpy':
        return numpy_backend_misfit(env) is None
    if backend == 'ale':
        return ale_vector_unfit(env) is None and env.get('autoreset') != 'next_step'
    return True


def numpy_backend_misfit(env: dict) -> str | None:
    """Why env.vector_backend "numpy" (env/classic.py) cannot step this env section, or None when
    it can: CartPole-v0/v1 or Acrobot-v1 with the env's default constructor (max_t as the time limit, nothing
    else passed to gymnasium.make), gymnasium's sync mode, same-step autoreset, and no per-sub-env
    wrapper (frame_op, clip_obs without normalize_obs), which would need each sub-env as a
    gymnasium env."""
    if env.get('name') not in classic.IDS:
        return f'it steps {", ".join(classic.IDS)} only, not {env.get("name")!r}'
    extra = [k for k in env if k not in ENV_SCHEMA]
    if extra or env.get('make_kwargs'):
        given = ', '.join(extra or [f'make_kwargs.{k}' for k in env['make_kwargs']])
        return f'it builds the env with its default constructor, and the spec passes {given}'
    if env.get('vectorization_mode', 'sync') != 'sync':
        return 'env.vectorization_mode is "async" (one process per sub-env)'
    if env.get('autoreset', 'same_step') != 'same_step':
        return 'env.autoreset is "next_step"; it resets in the same step'
    if env.get('frame_op'):
        return 'env.frame_op wraps each sub-env'
    if env.get('clip_obs') is not None and not env.get('normalize_obs'):
        return 'env.clip_obs without normalize_obs wraps each sub-env'
    return None


def fill_env_clip_defaults(env: dict, leave=()) -> dict:
    """SLM-Lab v5's defaults of clip_obs and clip_reward, written into the validated env spec so
    the saved spec says what ran: 10 when the matching normalisation is on, else null (an explicit
    null, kept, turns clipping off); rewards of ALE/ games (SLM-Lab v5's Atari ids) clipped to 1.
    `leave`: the keys not filled (a search's spec, whose trials draw what their defaults follow)."""
    if 'clip_obs' not in leave:
        env.setdefault('clip_obs', 10.0 if env['normalize_obs'] else None)
    if 'clip_reward' not in leave:
        ale = isinstance(env.get('name'), str) and env['name'].startswith('ALE/')
        env.setdefault('clip_reward', 1.0 if ale else 10.0 if env['normalize_reward'] else None)
    return env


def clip_defaults_left_to_trials(searched: set[str]) -> set[str]:
    """The clipping keys whose defaults follow a key a search draws (`searched`, its dotted
    paths): a search's spec leaves them out, so that each trial fills them from what it drew, as
    SLM-Lab does for each run (clip_obs 10 for a trial that draws normalize_obs true, none for one
    that draws false). A search's saved spec without them is not one saved before they existed
    (edits.fill_keys_added_later)."""
    left = set()
    if 'env.normalize_obs' in searched:
        left.add('clip_obs')
    if searched & {'env.normalize_reward', 'env.name'}:
        left.add('clip_reward')
    return left


def check_frame_op(env: dict) -> None:
    """frame_op needs frame_op_len (SLM-Lab v4 gives both or neither); life_loss_info is for the
    frames of an Atari game."""
    if env.get('frame_op') and env.get('frame_op_len') is None:
        raise SpecError(f'env.frame_op_len: env.frame_op "{env["frame_op"]}" needs frame_op_len, the number of '
                        'observations to join (SLM-Lab used 4); set it, or set frame_op to null')
    if env.get('life_loss_info') and atari_frames(env) is None:
        if env_family(env['name']) is ENV_FAMILIES['atari'] and \
                {**env, **(env.get('make_kwargs') or {})}.get('obs_type') == 'ram':
            raise SpecError("env.life_loss_info: true is for Atari games' image observations, not obs_type 'ram' "
                            f"({env['name']!r}); remove it, set it to false, or drop obs_type ram")
        raise SpecError(f"env.life_loss_info: true is for Atari games with image observations and a fixed frame "
                        f"skip (ALE/*-v5, *NoFrameskip-v4), not {env['name']!r}; remove it or set it to false")
    if env.get('image_downsize') and env_family(env['name']) is not ENV_FAMILIES['atari']:
        raise SpecError(f"env.image_downsize: resizes Atari frames, and {env['name']!r} is not an Atari game; remove "
                        'it or set it to null')


def env_constructor_args(name: str) -> list[str] | None:
    """The keyword arguments the constructor of gymnasium env `name` takes (its entry point's
    signature, plus the kwargs its registration passes), or None when it takes any (**kwargs) or
    cannot be loaded here (a missing optional package is reported when the env is built)."""
    env_spec = gym.envs.registry.get(name)
    if env_spec is None or env_spec.entry_point is None:
        return None
    try:
        creator = env_spec.entry_point if callable(env_spec.entry_point) else load_env_creator(env_spec.entry_point)
        params = inspect.signature(creator.__init__ if inspect.isclass(creator) else creator).parameters
    except Exception:  # noqa: BLE001 - any import failure of an optional env family: checked at build time
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    names = [k for k, p in params.items() if k != 'self' and p.kind in
             (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    return names + [k for k in env_spec.kwargs if k not in names]


def check_env_kwargs(env: dict, path: str = 'env') -> None:
    """Env keys that are not the lab's own go to gymnasium.make as keyword arguments of the env
    (SLM-Lab v5's rule, e.g. `"continuous": true` for LunarLander-v3); each must be an argument
    of that env's constructor. A misspelt lab key is named with its likely spelling. Training
    renders nothing: a render_mode is refused (enjoy@ --render shows a trained agent)."""
    for where, kwargs in ((path, env), (f'{path}.make_kwargs', env.get('make_kwargs') or {})):
        if isinstance(kwargs, dict) and 'render_mode' in kwargs:
            raise SpecError(f'{where}.render_mode: training renders nothing (drawing every step would slow it); '
                            'watch a trained agent with python run_lab.py enjoy@<run dir>/<spec_name>_t0_s0_spec.json '
                            '--render (or --record)')
    extra = [k for k in env if k not in ENV_SCHEMA]
    if not extra:
        return
    args = env_constructor_args(env['name'])
    if args is None:
        return
    args = [a for a in args if a != 'render_mode']  # refused above: not offered
    for key in extra:
        if key not in args:
            raise SpecError(f"{path}.{key}: not a key of env and not an argument of {env['name']}'s constructor"
                            f'{suggest(key, list(ENV_SCHEMA) + args)}; env keys: {", ".join(ENV_SCHEMA)}; '
                            f"{env['name']} arguments: {', '.join(args) or '(none)'}")
