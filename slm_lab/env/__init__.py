"""Environments: gymnasium envs (always as a gymnasium.vector env) built from the env spec, with
the wrappers the spec asks for. The env section's schema is env/schema.py; what an env id stands
for (its optional family, the Atari ids) is env/ids.py; Atari's preprocessing settings and ALE's
own vector env are env/atari.py."""
from __future__ import annotations

import gymnasium as gym
import numpy as np

from slm_lab.env.atari import atari_settings, make_ale_vector_env
from slm_lab.env.classic import IDS as CLASSIC_IDS
from slm_lab.env.clock import Clock  # noqa: F401  (re-export)
from slm_lab.env.ids import ENV_FAMILIES, atari_frames, ensure_env_registered, env_family
from slm_lab.env.schema import ENV_SCHEMA
from slm_lab.env.sync import SyncVectorEnv
from slm_lab.env.wrappers import (ClipAction, FireReset, LifeLossTermination, NormalizeObservation, NormalizeReward,
                                  RescaleAction, clip_observation)
from slm_lab.lib.schema import not_available


def _make_kwargs(env_spec: dict, render_mode: str | None = None) -> dict:
    """Keyword arguments for gymnasium.make: env keys that are not the lab's own (arguments of the
    env's constructor, passed as SLM-Lab v5 does), then make_kwargs, then max_t."""
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


def make_env(env_spec: dict, num_envs: int | None = None, gamma: float = 0.99) -> gym.vector.VectorEnv:
    """A gymnasium.vector env for the env spec (ALE's AtariVectorEnv for env.vector_backend "ale",
    see env/atari.py; the lab's CartPoleVector or AcrobotVector for "numpy", env/classic.py;
    otherwise gymnasium's sync vector env with a shorter step, env/sync.py, or its async one),
    resetting finished
    sub-envs in the same step (the final observation is in info['final_obs']; with env.autoreset
    "next_step", in the next step, see autoreset_mode), recording episode returns in
    info['episode'], with the normalisation wrappers asked for. The sub-envs' own per-step infos
    are not gathered (env/sync.py), only those of the steps that end an episode (final_info).

    gamma: the algorithm's discount (agent.algorithm.gamma). normalize_reward divides rewards by
    the running std of the return discounted with it, so the scale matches the returns the
    algorithm estimates (the default is that of agent.algorithm.gamma, for env-only uses).
    """
    ensure_env_registered(env_spec['name'])
    n = num_envs or env_spec['num_envs']
    if env_spec.get('vector_backend') == 'ale':  # an Atari game in ALE's own vector env (env/atari.py)
        env = make_ale_vector_env(env_spec, n)
    elif env_spec.get('vector_backend') == 'numpy':  # CartPole's or Acrobot's sub-envs in one step (env/classic.py)
        vector_env, limit = CLASSIC_IDS[env_spec['name']]
        env = vector_env(n, env_spec.get('max_t') or limit)
    elif env_spec.get('vectorization_mode', 'sync') == 'sync':  # gymnasium's, with a shorter step (env/sync.py)
        env = SyncVectorEnv([_single_env_fn(env_spec)] * n, autoreset_mode=autoreset_mode(env_spec))
    else:
        env = gym.make_vec(env_spec['name'], num_envs=n, vectorization_mode=env_spec['vectorization_mode'],
                           vector_kwargs={'autoreset_mode': autoreset_mode(env_spec)},
                           wrappers=_raw_obs_wrappers(env_spec), **_make_kwargs(env_spec))
    # innermost, so episode returns are the env's own rewards, before any normalisation
    env = gym.wrappers.vector.RecordEpisodeStatistics(env)
    scale = env_spec.get('reward_scale')
    if scale is not None:  # outside RecordEpisodeStatistics: the recorded returns stay the env's own
        scale_fn = np.sign if scale == 'sign' else (lambda rewards: rewards * scale)
        env = gym.wrappers.vector.TransformReward(env, scale_fn)
    if isinstance(env.single_action_space, gym.spaces.Box):
        if rescales_actions(env.single_action_space):  # the agent acts in [-1, 1], as in SLM-Lab v5
            env = RescaleAction(env, *unit_bounds(env.single_action_space))
        # the agent keeps (and learns from) the action it sampled; the env gets it clipped
        env = ClipAction(env)
    if env_spec.get('normalize_obs'):
        env = NormalizeObservation(env, clip=env_spec.get('clip_obs'))
    if env_spec.get('normalize_reward'):
        env = NormalizeReward(env, gamma=gamma)
    # 1 for ALE/ games unless the spec says (env.schema.fill_env_clip_defaults)
    clip_reward = env_spec.get('clip_reward')
    if clip_reward is not None:  # after normalize_reward, as in SLM-Lab v5
        low, high = clip_reward if isinstance(clip_reward, list) else (-clip_reward, clip_reward)
        env = gym.wrappers.vector.ClipReward(env, min_reward=low, max_reward=high)
    return env


def _single_env_fn(env_spec: dict):
    """What makes one sub-env of a vector env: gymnasium.make of the spec's id with its keyword
    arguments, under the per-sub-env wrappers (as gymnasium.make_vec builds each)."""
    kwargs, wrappers = _make_kwargs(env_spec), _raw_obs_wrappers(env_spec) or []

    def make() -> gym.Env:
        env = gym.make(env_spec['name'], **kwargs)
        for wrapper in wrappers:
            env = wrapper(env)
        return env
    return make


def autoreset_mode(env_spec: dict) -> gym.vector.AutoresetMode:
    """gymnasium's autoreset mode for env.autoreset. SAME_STEP (the lab's default): the step that
    ends a sub-env's episode returns the next episode's first observation, the final one in
    info['final_obs']. NEXT_STEP (gymnasium's default, and so SLM-Lab v5's vector envs): that step
    returns the final observation, and the sub-env's next step ignores its action and returns the
    first observation of the next episode with reward 0, neither terminated nor truncated; the
    session hands that step to the agent like any other, as SLM-Lab v5 does. The vector env's
    record of which sub-envs reset next (its _autoreset_envs) is in its snapshot."""
    if env_spec.get('autoreset', 'same_step') == 'next_step':
        return gym.vector.AutoresetMode.NEXT_STEP
    return gym.vector.AutoresetMode.SAME_STEP


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
        atari = atari_settings(env_spec, whole_games)
        wrappers.append(lambda env: atari_preprocessing(env, atari.stack, atari.size, atari.frame_skip, atari.sticky,
                                                        atari.life_loss, atari.max_t)
                        if len(env.observation_space.shape) > 1
                        else concat_frames(env, atari.stack) if env_spec.get('frame_op') else env)  # RAM: a vector
    elif env_spec.get('frame_op'):
        wrappers.append(lambda env: concat_frames(env, env_spec['frame_op_len']))
    return wrappers or None


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
