"""Memory base class: stores transitions from a vector env, one batch of num_envs at a time."""
from __future__ import annotations

import numpy as np
import gymnasium as gym

from slm_lab.lib.schema import Field


def space_shape_dtype(space: gym.Space) -> tuple[tuple, np.dtype]:
    """Shape and dtype to store one element of `space`."""
    if isinstance(space, gym.spaces.Discrete):
        return (), np.dtype(np.int64)
    return tuple(space.shape), np.dtype(np.float32) if space.dtype == np.float64 else space.dtype


class Memory:
    """Base of all memories.

    `add` takes one vector step: obs (N, *obs_shape), action (N, *act_shape), reward (N,),
    next_obs (N, *obs_shape) — the true next observation, i.e. the final one for a finished
    episode — terminated (N,) and truncated (N,) booleans.
    """

    spec_schema: dict = {'name': Field((str,), doc='memory class')}

    def __init__(self, memory_spec: dict, obs_space: gym.Space, action_space: gym.Space,
                 num_envs: int, seed: int | list[int] = 0):
        self.memory_spec = memory_spec
        self.num_envs = num_envs
        self.obs_shape, self.obs_dtype = space_shape_dtype(obs_space)
        self.act_shape, self.act_dtype = space_shape_dtype(action_space)
        self.rng = np.random.default_rng(seed)

    def add(self, obs, action, reward, next_obs, terminated, truncated) -> None:
        raise NotImplementedError

    def cut_episodes(self) -> None:
        """The running episodes were abandoned (a resume whose env restarts its episodes): what is
        stored of them ends, truncated, so nothing joins them to the episodes that follow. Memories
        whose transitions each hold their own next observation (the replays) need nothing."""

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError
