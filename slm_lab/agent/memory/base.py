"""Memory base class: stores transitions from a vector env, one batch of num_envs at a time, and
describes itself to the lab: the arguments it is built with (`build_args`) and what it takes of
the machine (`storage_needs`), so that nothing outside a memory's module names it."""
from __future__ import annotations

import math
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch

from slm_lab.lib.schema import Field
from slm_lab.resources import ACTIVATION_COPIES, FLOAT_BYTES, Need


def space_shape_dtype(space: gym.Space) -> tuple[tuple, np.dtype]:
    """Shape and dtype to store one element of `space`."""
    if isinstance(space, gym.spaces.Discrete):
        return (), np.dtype(np.int64)
    return tuple(space.shape), np.dtype(np.float32) if space.dtype == np.float64 else space.dtype


def space_bytes(space: gym.Space) -> int:
    """Bytes a memory stores per element of a space (see space_shape_dtype)."""
    shape, dtype = space_shape_dtype(space)
    return math.prod(shape) * dtype.itemsize


def transition_bytes(obs_space: gym.Space, action_space: gym.Space, units: int) -> tuple[int, int, int]:
    """Bytes of one transition (B = 1) for a storage estimate: as stored (two observations, an
    action and four float32 scalars), as the float32 tensors a training pass takes (states, next
    states, four scalars), and the activations of that pass (`units`: the summed widths of the
    layers a sample goes through, see agent.estimate.net_needs)."""
    stored = 2 * space_bytes(obs_space) + space_bytes(action_space) + 4 * FLOAT_BYTES
    as_tensors = (2 * math.prod(obs_space.shape) + 4) * FLOAT_BYTES
    return stored, as_tensors, units * FLOAT_BYTES * ACTIVATION_COPIES


def to_tensor(x: np.ndarray, device: torch.device | str) -> torch.Tensor:
    """An array as the nets take it, float32 on `device`; uint8 frames are moved as bytes and made
    float there (a quarter of the bytes to move)."""
    if isinstance(x, np.ndarray) and x.dtype == np.uint8:
        return torch.as_tensor(x, device=device).float()
    return torch.as_tensor(x, dtype=torch.float32, device=device)


class Batch(NamedTuple):
    """B transitions sampled from a replay: states and next_states (B, *obs_shape), actions
    (B, *act_shape), rewards (B,), terminateds (B,) float (1.0 where the episode truly ended: no
    bootstrap). A prioritized replay adds indices (B,) int64, the storage positions drawn (give
    them back to its update_priorities), and weights (B,) float32, the importance weights of the
    loss; None where the replay has none. Arrays as the memory keeps them; `to(device)` gives
    the tensors the nets take."""
    states: np.ndarray | torch.Tensor
    actions: np.ndarray | torch.Tensor
    rewards: np.ndarray | torch.Tensor
    next_states: np.ndarray | torch.Tensor
    terminateds: np.ndarray | torch.Tensor
    indices: np.ndarray | None = None
    weights: np.ndarray | torch.Tensor | None = None

    def to(self, device: torch.device | str) -> Batch:
        """The batch as tensors on `device`: observations, rewards, terminateds and weights float32
        (see to_tensor), actions as stored (int64 for discrete ones; floating ones float32).
        indices stay an array: they index the memory's storage, on the host."""
        actions = torch.as_tensor(self.actions, device=device)
        if actions.is_floating_point():
            actions = actions.float()
        return Batch(to_tensor(self.states, device), actions, to_tensor(self.rewards, device),
                     to_tensor(self.next_states, device), to_tensor(self.terminateds, device), self.indices,
                     None if self.weights is None else to_tensor(self.weights, device))


class Memory:
    """Base of all memories.

    `add` takes one vector step: obs (N, *obs_shape), action (N, *act_shape), reward (N,),
    next_obs (N, *obs_shape) — the true next observation, i.e. the final one for a finished
    episode — terminated (N,) and truncated (N,) booleans.
    """

    spec_schema: dict = {'name': Field((str,), doc='memory class')}
    # names of memories whose batches this one gives too: an algorithm that takes one of them takes
    # this one (spec validation reads it beside the algorithm's memory_names)
    serves_as: tuple[str, ...] = ()

    @classmethod
    def build_args(cls, spec: dict, algorithm_cls: type) -> dict:
        """Keyword arguments of this memory's constructor beyond (memory_spec, obs_space,
        action_space, num_envs, seed), from a validated spec and the algorithm's class (the
        Agent passes them): none by default."""
        return {}

    @classmethod
    def storage_needs(cls, spec: dict, obs_space: gym.Space, action_space: gym.Space, units: int) -> list[Need]:
        """What this memory takes of the machine for a validated spec (agent.estimate.estimate_session):
        its storage and the batch it hands out, each a resources.Need; obs_space as the memory
        stores observations, `units` as in transition_bytes. None by default (a memory whose size
        is not the spec's to say)."""
        return []

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
