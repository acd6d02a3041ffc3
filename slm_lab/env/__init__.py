"""Environments: gymnasium envs (always as a gymnasium.vector env) built from the env spec, and
the env ids of SLM-Lab spec files: renamed ids, optional env families, packages that cannot run."""
from __future__ import annotations

import functools
import importlib
import re
import sys
import warnings
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from slm_lab.env.clock import Clock  # noqa: F401  (re-export)
from slm_lab.env.wrappers import FireReset, LifeLossTermination, NormalizeObservation, clip_observation
from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import not_available

logger = lab_logger.get_logger('slm_lab.env')

# Gymnasium ids in SLM-Lab spec files that gymnasium no longer provides: old id -> (the id that
# replaced it, what changed, from the env's own version history). Validation puts the current id
# in the spec (so the saved spec says what ran, and a resume or replay of it needs no renaming)
# and warns with the note each time a spec file naming the old id is read. Ids gymnasium still
# provides (CartPole-v0, MountainCar-v0, Acrobot-v1, and the Atari v0/v4 ids ale-py still
# registers, e.g. PongNoFrameskip-v4) are the envs they always were and run as they are.
_MUJOCO_V5 = ('the same task on the mujoco bindings (v2/v3 need mujoco-py, which does not install on current '
              'Python); v5 fixes model and reward details, so returns are close to, not equal to, v2/v3 ones')
RENAMED_ENV_IDS: dict[str, tuple[str, str]] = {
    'Pendulum-v0': ('Pendulum-v1', 'the same dynamics and reward: v1 only rewrote the equations'),
    'LunarLander-v2': ('LunarLander-v3', 'v3 resets wind at each reset, is deterministic given a seed and widens '
                                         'the observation bounds; dynamics and reward are otherwise the same'),
    'LunarLanderContinuous-v2': ('LunarLanderContinuous-v3', 'the changes of LunarLander-v3'),
    'BipedalWalker-v2': ('BipedalWalker-v3', 'v3 returns the closest lidar hit instead of the furthest'),
    'BipedalWalkerHardcore-v2': ('BipedalWalkerHardcore-v3', 'the change of BipedalWalker-v3'),
    'CarRacing-v0': ('CarRacing-v3', 'later versions changed lap completion, added domain randomisation and end '
                                     'a finished lap as terminated rather than truncated'),
    **{f'{task}-{old}': (f'{task}-v5', _MUJOCO_V5)
       for task in ('Ant', 'HalfCheetah', 'Hopper', 'Humanoid', 'HumanoidStandup', 'InvertedDoublePendulum',
                    'InvertedPendulum', 'Pusher', 'Reacher', 'Swimmer', 'Walker2d')
       for old in ('v2', 'v3')},
}


@dataclass(frozen=True)
class EnvFamily:
    """An optional family of gymnasium envs: the module its envs import and the pinned packages
    that install it (the pins of the family's extra in pyproject.toml and requirements-envs.txt;
    a test keeps the three equal)."""

    title: str
    module: str
    requirements: tuple[str, ...]
    also_needs: tuple[str, ...] = ()  # further modules its envs import (Atari's preprocessing: cv2)

    @property
    def install_command(self) -> str:
        """The pip command that installs this family alone."""
        return 'pip install ' + ' '.join(f'"{r}"' if '[' in r else r for r in self.requirements)


ENV_FAMILIES = {
    'box2d': EnvFamily('Box2D', 'Box2D', ('gymnasium[box2d]==1.4.0', 'box2d==2.3.10')),
    'mujoco': EnvFamily('MuJoCo', 'mujoco', ('gymnasium[mujoco]==1.4.0', 'mujoco==3.14.0')),
    'atari': EnvFamily('Atari', 'ale_py', ('gymnasium[atari]==1.4.0', 'ale-py==0.12.1',
                                           'opencv-python-headless==5.0.0.93'), also_needs=('cv2',)),
}
ALL_FAMILIES_COMMAND = 'pip install -r requirements-envs.txt'

# The games ale-py registers under gym's old Atari ids (Pong-v0, PongNoFrameskip-v4,
# PongDeterministic-v4), which SLM-Lab v4 specs use: without ale-py they are not in the registry,
# so they are recognised by name, to name the package that provides them.
_ATARI_V4_GAMES = frozenset(
    'Adventure AirRaid Alien Amidar Assault Asterix Asteroids Atlantis BankHeist BattleZone BeamRider Berzerk '
    'Bowling Boxing Breakout Carnival Centipede ChopperCommand CrazyClimber Defender DemonAttack DoubleDunk '
    'ElevatorAction Enduro FishingDerby Freeway Frostbite Gopher Gravitar Hero IceHockey Jamesbond JourneyEscape '
    'Kangaroo Krull KungFuMaster MontezumaRevenge MsPacman NameThisGame Phoenix Pitfall Pong Pooyan PrivateEye '
    'Qbert Riverraid RoadRunner Robotank Seaquest Skiing Solaris SpaceInvaders StarGunner Tennis TimePilot '
    'Tutankham UpNDown Venture VideoPinball WizardOfWor YarsRevenge Zaxxon'.split())
_ATARI_V4_RE = re.compile(r'(?P<game>[A-Za-z]+?)(NoFrameskip|Deterministic)?-v[04]')

# Env packages SLM-Lab once used that cannot run here, by the form of their ids: (pattern, what
# the package is and why it cannot run). A `task` group names the MuJoCo task to suggest instead.
_UNAVAILABLE_ENVS = (
    (re.compile(r'Roboschool(?P<task>[A-Za-z0-9]+?)(Flagrun(Harder)?|ForwardWalk|Swingup)?-v\d+'),
     'a Roboschool env (package roboschool), which its authors discontinued and which has no build for the '
     'Python this lab needs (3.11+), so it cannot run here'),
    (re.compile(r'(?P<task>[A-Za-z0-9]+?)BulletEnv-v\d+'),
     'a PyBullet env (package pybullet, module pybullet_envs), which registers with the old gym package, not '
     'with gymnasium, so it cannot run here'),
    # SLM-Lab v4's Unity ids, and the names its older experimental specs gave Unity envs
    (re.compile(r'Unity[A-Za-z0-9]*-v\d+|2dball|3dball|gridworld|tennis', re.IGNORECASE),
     'a Unity ML-Agents env (packages mlagents and gym-unity, with the Unity builds SLM-Lab shipped), which '
     'this lab does not have'),
    # SLM-Lab v5's ids of MuJoCo Playground envs (its env.device key is theirs)
    (re.compile(r'playground/.+'),
     "a MuJoCo Playground env (package mujoco_playground, on JAX, which SLM-Lab v5 wraps as a vector env of its "
     'own), which this lab does not have'),
    (re.compile(r'vizdoom-v\d+', re.IGNORECASE),
     "SLM-Lab v4's own VizDoom env (package vizdoom, with SLM-Lab's scenario files), which this lab does not "
     'have (its observations are images, which need ConvNet, not available yet)'),
)


def current_env_id(name: str) -> tuple[str, str | None]:
    """(the id to run, a one-line note on what changed) for an env id; the note is None unless
    gymnasium renamed the id (RENAMED_ENV_IDS)."""
    if name in RENAMED_ENV_IDS:
        new, what = RENAMED_ENV_IDS[name]
        return new, f"env.name: '{name}' no longer exists in gymnasium; running '{new}' instead ({what})"
    return name, None


def rename_env_id(env_spec: Any) -> Any:
    """The env spec with a renamed gymnasium id replaced by its current one (a copy), logging the
    one-line warning; anything else is returned as it is, for the validator to judge."""
    if isinstance(env_spec, dict) and isinstance(env_spec.get('name'), str):
        name, note = current_env_id(env_spec['name'])
        if note:
            logger.warning(note)
            return {**env_spec, 'name': name}
    return env_spec


def env_family(name: str) -> EnvFamily | None:
    """The optional family of an env id (by its registered entry point; Atari ids, which only
    ale-py registers, also by their form), or None for the envs gymnasium always has."""
    registered = gym.envs.registry.get(name)
    entry_point = registered.entry_point if registered is not None else None
    if isinstance(entry_point, str):
        for key, package in (('box2d', 'gymnasium.envs.box2d'), ('mujoco', 'gymnasium.envs.mujoco'),
                             ('atari', 'ale_py')):
            if entry_point.startswith(package):
                return ENV_FAMILIES[key]
        return None
    match = _ATARI_V4_RE.fullmatch(name)
    if name.startswith('ALE/') or (match is not None and match['game'] in _ATARI_V4_GAMES):
        return ENV_FAMILIES['atari']
    return None


def _unavailable_reason(name: str) -> str | None:
    """Why the id of a package that cannot run here cannot run (with the nearest MuJoCo env when
    there is one), or None for any other id."""
    for pattern, reason in _UNAVAILABLE_ENVS:
        match = pattern.fullmatch(name)
        if match:
            task = match.groupdict().get('task')
            nearest = f'{task}-v5' if task and f'{task}-v5' in gym.envs.registry else None
            instead = (f'; the nearest gymnasium env is {nearest} (MuJoCo: {ENV_FAMILIES["mujoco"].install_command})'
                       if nearest else '')
            return f"'{name}' is {reason}{instead}"
    return None


# gymnasium warns of an older env version with a multi-line coloured DeprecationWarning at every
# make (three per run); the lab says it once, in one line, where the spec is checked
warnings.filterwarnings('ignore', message=r'.*The environment .* is out of date', category=DeprecationWarning)


@functools.lru_cache(maxsize=None)
def warn_if_outdated(name: str) -> None:
    """One warning per process when `name` is an older version of a registered env (it still
    runs as it is: SLM-Lab's specs name e.g. CartPole-v0, whose episodes end at 200 steps)."""
    spec = gym.envs.registry.get(name)
    if spec is None or spec.version is None:
        return
    newest = max((s.version for s in gym.envs.registry.values() if s.namespace == spec.namespace
                  and s.name == spec.name and s.version is not None), default=spec.version)
    if newest > spec.version:
        newer = gym.envs.registration.get_env_id(spec.namespace, spec.name, newest)
        logger.warning(f'env.name: {name} runs as it is; a newer version of it is {newer}')


def ensure_env_registered(name: str, path: str = 'env.name') -> None:
    """Make an env id's optional family available (importing ale_py registers the Atari ids), or
    raise a one-line SpecError: for an id of a package that cannot run here, naming the package;
    for an id of a family whose package is missing, naming the command that installs it. Whether
    the id itself exists is left to the caller's registry check (which suggests close ids)."""
    if not isinstance(name, str):
        return
    reason = _unavailable_reason(name)
    if reason:
        raise SpecError(f'{path}: {reason}')
    family = env_family(name)
    if family is None:
        return
    try:
        for module in (family.module, *family.also_needs):
            importlib.import_module(module)
        if family.module == 'ale_py':  # ALE's banner on stderr at each game load would read as the lab's output
            sys.modules['ale_py'].ALEInterface.setLoggerMode(sys.modules['ale_py'].LoggerMode.Error)
    except ImportError as e:
        raise SpecError(f"{path}: '{name}' is a {family.title} env and its package is not installed "
                        f'({type(e).__name__}: {e}); install it with: {family.install_command} '
                        f'(or every env family: {ALL_FAMILIES_COMMAND})') from None


def _make_kwargs(env_spec: dict, render_mode: str | None = None) -> dict:
    """Keyword arguments for gymnasium.make: env keys that are not the lab's own (arguments of the
    env's constructor, passed as SLM-Lab v5 does), then make_kwargs, then max_t."""
    from slm_lab.spec import ENV_SCHEMA
    kwargs = {k: v for k, v in env_spec.items() if k not in ENV_SCHEMA}
    kwargs.update(env_spec.get('make_kwargs') or {})
    if env_spec.get('max_t'):
        kwargs['max_episode_steps'] = env_spec['max_t']
    if render_mode:
        kwargs['render_mode'] = render_mode
    if atari_frames(env_spec) is not None:  # the lab's wrappers skip frames and make actions sticky
        kwargs.update(frameskip=1, repeat_action_probability=0.0)
        kwargs.pop('max_episode_steps', None)  # counted in agent steps by the lab's wrappers, not in frames
    return kwargs


def atari_frames(env_spec: dict) -> tuple[int, float] | None:
    """(frame skip, sticky-action probability) that the lab's wrappers apply to an Atari game whose
    frame skip is a fixed number (ALE/ ids: 4, and the NoFrameskip ids, skipped 4 as SLM-Lab v4 did),
    with the sticky-action probability of the id or of the spec (`repeat_action_probability`), or
    None for other envs, RAM observations and the ids whose frame skip ALE draws at random.

    ALE's own sticky actions keep the last action it executed outside the state it clones, so a
    resumed game would act differently for its first steps; emulated one frame at a time under
    gymnasium's StickyAction, which keeps that action in plain attributes, a snapshot holds it."""
    if env_family(env_spec['name']) is not ENV_FAMILIES['atari']:
        return None
    registered = gym.envs.registry.get(env_spec['name'])
    given = {**{k: v for k, v in env_spec.items() if k in ('frameskip', 'repeat_action_probability', 'obs_type')},
             **(env_spec.get('make_kwargs') or {})}
    kwargs = {**(registered.kwargs if registered is not None else {}), **given}
    frameskip = kwargs.get('frameskip', 4)
    if kwargs.get('obs_type', 'rgb') == 'ram' or isinstance(frameskip, bool) or not isinstance(frameskip, int):
        return None
    if 'NoFrameskip' in env_spec['name'] and 'frameskip' not in given:
        frameskip = 4  # SLM-Lab v4 skipped 4 frames of these ids itself (its MaxAndSkipEnv)
    return frameskip, float(kwargs.get('repeat_action_probability', 0.25))


def make_env(env_spec: dict, num_envs: int | None = None, gamma: float = 0.99) -> gym.vector.VectorEnv:
    """A gymnasium.vector env for the env spec, resetting finished sub-envs in the same step
    (the final observation is in info['final_obs']), recording episode returns in info['episode'],
    with the normalisation wrappers asked for.

    gamma: the algorithm's discount (agent.algorithm.gamma). normalize_reward divides rewards by
    the running std of the return discounted with it, so the scale matches the returns the
    algorithm estimates (the default is that of agent.algorithm.gamma, for env-only uses).
    """
    ensure_env_registered(env_spec['name'])
    n = num_envs or env_spec['num_envs']
    env = gym.make_vec(env_spec['name'], num_envs=n, vectorization_mode=env_spec.get('vectorization_mode', 'sync'),
                       vector_kwargs={'autoreset_mode': gym.vector.AutoresetMode.SAME_STEP},
                       wrappers=_raw_obs_wrappers(env_spec), **_make_kwargs(env_spec))
    # innermost, so episode returns are the env's own rewards, before any normalisation
    env = gym.wrappers.vector.RecordEpisodeStatistics(env)
    scale = env_spec.get('reward_scale')
    if scale is not None:  # outside RecordEpisodeStatistics: the recorded returns stay the env's own
        scale_fn = np.sign if scale == 'sign' else (lambda rewards: rewards * scale)
        env = gym.wrappers.vector.TransformReward(env, scale_fn)
    if isinstance(env.single_action_space, gym.spaces.Box):
        if rescales_actions(env.single_action_space):  # the agent acts in [-1, 1], as in SLM-Lab v5
            env = gym.wrappers.vector.RescaleAction(env, *unit_bounds(env.single_action_space))
        # the agent keeps (and learns from) the action it sampled; the env gets it clipped
        env = gym.wrappers.vector.ClipAction(env)
    if env_spec.get('normalize_obs'):
        env = NormalizeObservation(env, clip=env_spec.get('clip_obs'))
    if env_spec.get('normalize_reward'):
        env = gym.wrappers.vector.NormalizeReward(env, gamma=gamma)
    clip_reward = env_spec.get('clip_reward')  # 1 for ALE/ games unless the spec says (spec.fill_env_clip_defaults)
    if clip_reward is not None:  # after normalize_reward, as in SLM-Lab v5
        low, high = clip_reward if isinstance(clip_reward, list) else (-clip_reward, clip_reward)
        env = gym.wrappers.vector.ClipReward(env, min_reward=low, max_reward=high)
    return env


def _raw_obs_wrappers(env_spec: dict, whole_games: bool = False) -> list | None:
    """Wrappers of each sub-env, applied before the vector env's own: env.clip_obs without
    normalize_obs (with it, the normalisation clips), then env.frame_op's frame stacking; per
    sub-env, so the final observation of an episode is clipped and stacked too. whole_games: no
    env.life_loss_info (an evaluation or a replay plays whole games)."""
    wrappers = []
    bound = env_spec.get('clip_obs')
    if bound is not None and not env_spec.get('normalize_obs'):
        wrappers.append(lambda env: clip_observation(env, bound))
    if env_family(env_spec['name']) is ENV_FAMILIES['atari']:
        # as SLM-Lab: frame_op_len frames when frame_op is given (v4's Atari specs), else v5's 4
        # for ALE/ ids and one frame for the older ids
        stack = env_spec['frame_op_len'] if env_spec.get('frame_op') else (4 if is_ale_v5(env_spec['name']) else 1)
        size = tuple(env_spec.get('image_downsize') or (84, 84))
        frames = atari_frames(env_spec)  # None: ALE skips frames and sticks actions itself
        frame_skip, sticky = frames or (1, 0.0)
        # a lost life ends the episode in training: life_loss_info (v5), always for the older ids (v4
        # trained them under its EpisodicLifeEnv)
        life_loss = not whole_games and (bool(env_spec.get('life_loss_info')) or (
            not is_ale_v5(env_spec['name']) and env_spec.get('life_loss_info') is not False and frames is not None))
        max_t = env_spec.get('max_t') if frames is not None else None
        wrappers.append(lambda env: atari_preprocessing(env, stack, size, frame_skip, sticky, life_loss, max_t)
                        if len(env.observation_space.shape) > 1
                        else concat_frames(env, stack) if env_spec.get('frame_op') else env)  # RAM: a vector
    elif env_spec.get('frame_op'):
        wrappers.append(lambda env: concat_frames(env, env_spec['frame_op_len']))
    return wrappers or None


def is_ale_v5(name: str) -> bool:
    """An id of ale-py's own namespace (ALE/Pong-v5), which SLM-Lab v5's Atari specs use."""
    return name.startswith('ALE/')


def atari_preprocessing(env: gym.Env, stack: int, size: tuple[int, int] = (84, 84), frame_skip: int = 4,
                        sticky: float = 0.0, life_loss: bool = False, max_t: int | None = None) -> gym.Env:
    """The Atari preprocessing of SLM-Lab (and of the DQN papers), with gymnasium's wrappers: each
    emulator frame's action repeats the previous one with probability `sticky` (StickyAction, as
    ALE's sticky actions do per frame), up to 30 no-op actions at reset, `frame_skip` frames per
    step with the max of the last two (AtariPreprocessing; 1 where ALE skips frames itself),
    greyscale uint8 frames resized to `size` (width, height; SLM-Lab v4's image_downsize, else
    84x84), the last `stack` of them as a (stack, height, width) observation (zeros before an
    episode's first frame). Values stay 0-255 uint8 (in memory and in replay): a net with
    `normalize` scales the batch. FIRE is pressed at each game's start in the games that need it
    (FireReset, as SLM-Lab v4's wrappers and v5's Atari vector env do). life_loss: a lost life ends
    the episode, not the game (LifeLossTermination). max_t: env.max_t in agent steps."""
    if sticky > 0:
        env = gym.wrappers.StickyAction(env, repeat_action_probability=sticky)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=frame_skip, screen_size=size,
                                          terminal_on_life_loss=False, grayscale_obs=True, scale_obs=False)
    env = FireReset(env)
    if max_t:
        env = gym.wrappers.TimeLimit(env, max_episode_steps=max_t)
    env = gym.wrappers.FrameStackObservation(env, stack, padding_type='zero')
    return LifeLossTermination(env) if life_loss else env


def concat_frames(env: gym.Env, n: int) -> gym.Env:
    """SLM-Lab v4's frame_op "concat" for vector observations: each observation is the env's last
    n observations joined end to end, oldest first; at an episode's start its first observation
    fills every slot. gymnasium's FrameStackObservation stacks them (its queue is env state, so a
    snapshot keeps it), FlattenObservation joins them."""
    space = env.observation_space
    if not (isinstance(space, gym.spaces.Box) and len(space.shape) == 1):
        raise not_available('env.frame_op', f'frame stacking of {space.shape} observations (images other than '
                            "Atari's, whose frames the lab stacks)", '; frame_op "concat" joins vector observations '
                            'and Atari frames only, use null')
    env = gym.wrappers.FrameStackObservation(env, n, padding_type='reset')
    return gym.wrappers.FlattenObservation(env)


UNBOUNDED = 1e6  # an action bound this large or larger is taken as no bound


def rescales_actions(space: gym.Space) -> bool:
    """Whether the agent acts in [-1, 1] rather than in the env's own bounds: a float Box action
    space with bounds other than [-1, 1] (Pendulum's [-2, 2], MuJoCo Humanoid's [-0.4, 0.4]), each
    finite (below UNBOUNDED) and with low < high.
    SLM-Lab v5 rescales such spaces so for every algorithm (v4 acted in the env's units); make_env
    and make_single_env add gymnasium's RescaleAction for them."""
    if not isinstance(space, gym.spaces.Box) or not np.issubdtype(space.dtype, np.floating):
        return False
    low, high = np.asarray(space.low, dtype=np.float64), np.asarray(space.high, dtype=np.float64)
    # an infinite bound, or one as large as UNBOUNDED (float32's largest number standing for "no
    # bound"), has nothing to rescale onto; nor has a dimension whose bounds are equal
    if not ((np.abs(low) < UNBOUNDED).all() and (np.abs(high) < UNBOUNDED).all() and (high > low).all()):
        return False
    return not (np.allclose(low, -1.0, atol=1e-6) and np.allclose(high, 1.0, atol=1e-6))


def agent_action_space(env: gym.Env | gym.vector.VectorEnv) -> gym.Space:
    """The action space an agent is built for, with its bounds: the env's own, or [-1, 1] of the
    same shape where the env rescales the agent's actions (rescales_actions). ClipAction (which
    make_env and make_single_env add for Box actions) widens the space it reports to (-inf, inf),
    since it accepts any action; an algorithm that squashes its actions into the bounds (SAC)
    needs the real ones."""
    space = env.unwrapped.single_action_space if isinstance(env, gym.vector.VectorEnv) else env.unwrapped.action_space
    if rescales_actions(space):
        return gym.spaces.Box(*unit_bounds(space), dtype=space.dtype)
    return space


def unit_bounds(space: gym.spaces.Box) -> tuple[np.ndarray, np.ndarray]:
    """-1 and 1 in the space's shape and dtype (a float64 bound would make gymnasium warn that
    it lowers the precision of a float32 space)."""
    return np.full(space.shape, -1, space.dtype), np.full(space.shape, 1, space.dtype)


def make_single_env(env_spec: dict, render_mode: str | None = None) -> gym.Env:
    """One plain gymnasium env (for evaluation and replay)."""
    ensure_env_registered(env_spec['name'])
    env = gym.make(env_spec['name'], **_make_kwargs(env_spec, render_mode))
    for wrap in _raw_obs_wrappers(env_spec, whole_games=True) or ():
        env = wrap(env)
    if isinstance(env.action_space, gym.spaces.Box):
        if rescales_actions(env.action_space):
            env = gym.wrappers.RescaleAction(env, *unit_bounds(env.action_space))
        env = gym.wrappers.ClipAction(env)
    return env


def find_wrapper(env, cls):
    """The first wrapper of type `cls` in a wrapper chain, or None."""
    while env is not None:
        if isinstance(env, cls):
            return env
        env = getattr(env, 'env', None)
    return None


def normalize_obs_fn(env):
    """The env's observation normalisation (without updating its statistics), or None when
    observations are not normalised."""
    wrapper = find_wrapper(env, NormalizeObservation)
    return None if wrapper is None else wrapper.normalize


def obs_norm_state(env) -> dict | None:
    """The observation-normalisation statistics (mean, var, count, epsilon) a policy was trained
    with, or None; saved with model weights so a replay normalises the same way."""
    wrapper = find_wrapper(env, NormalizeObservation)
    if wrapper is None:
        return None
    rms = wrapper.obs_rms
    return {'mean': np.array(rms.mean), 'var': np.array(rms.var), 'count': float(rms.count),
            'epsilon': float(wrapper.epsilon)}
