"""Environments: gymnasium envs (always as a gymnasium.vector env) built from the env spec."""
from __future__ import annotations

import gymnasium as gym
import numpy as np

from slm_lab.env.clock import Clock  # noqa: F401  (re-export)
from slm_lab.env.wrappers import NormalizeObservation


def ensure_env_registered(name: str) -> None:
    """Import the package that registers an env namespace (ALE ids live in ale_py)."""
    if name.startswith('ALE/') and name not in gym.envs.registry:
        try:
            import ale_py  # noqa: F401
            gym.register_envs(ale_py)
        except ImportError:
            pass


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
    return kwargs


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
                       **_make_kwargs(env_spec))
    # innermost, so episode returns are the env's own rewards, before any normalisation
    env = gym.wrappers.vector.RecordEpisodeStatistics(env)
    scale = env_spec.get('reward_scale')
    if scale is not None:  # outside RecordEpisodeStatistics: the recorded returns stay the env's own
        scale_fn = np.sign if scale == 'sign' else (lambda rewards: rewards * scale)
        env = gym.wrappers.vector.TransformReward(env, scale_fn)
    if isinstance(env.single_action_space, gym.spaces.Box):
        # the agent keeps (and learns from) the action it sampled; the env gets it clipped
        env = gym.wrappers.vector.ClipAction(env)
    if env_spec.get('normalize_obs'):
        env = NormalizeObservation(env)
    if env_spec.get('normalize_reward'):
        env = gym.wrappers.vector.NormalizeReward(env, gamma=gamma)
    return env


def make_single_env(env_spec: dict, render_mode: str | None = None) -> gym.Env:
    """One plain gymnasium env (for evaluation and replay)."""
    ensure_env_registered(env_spec['name'])
    env = gym.make(env_spec['name'], **_make_kwargs(env_spec, render_mode))
    if isinstance(env.action_space, gym.spaces.Box):
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
