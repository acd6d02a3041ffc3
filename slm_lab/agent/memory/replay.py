"""Replay: a circular experience replay buffer of fixed size, sampled uniformly."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from slm_lab.agent.memory.base import Memory
from slm_lab.lib.schema import Field


class ReplayBatch(NamedTuple):
    """A sampled batch. states/next_states (B, *obs_shape), actions (B, *act_shape),
    rewards (B,), terminateds (B,) float (1.0 where the episode truly ended: no bootstrap)."""
    states: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_states: np.ndarray
    terminateds: np.ndarray


class Replay(Memory):
    """Circular buffer of max_size transitions stored as preallocated arrays."""

    spec_schema = {
        'name': Field((str,), doc='memory class'),
        'batch_size': Field((int,), 32, min=1, doc='transitions per sampled batch'),
        'max_size': Field((int,), 10000, min=1, doc='capacity in transitions'),
        'use_cer': Field((bool,), False, doc='combined experience replay: always include the newest transition'),
    }

    ARRAY_KEYS = ('states', 'actions', 'rewards', 'next_states', 'terminateds')

    def __init__(self, memory_spec, obs_space, action_space, num_envs, seed=0, persist: bool = False):
        super().__init__(memory_spec, obs_space, action_space, num_envs, seed)
        self.persist = persist
        self.batch_size = memory_spec['batch_size']
        self.max_size = memory_spec['max_size']
        self.use_cer = memory_spec['use_cer']
        n = self.max_size
        self.states = np.zeros((n,) + self.obs_shape, dtype=self.obs_dtype)
        self.next_states = np.zeros((n,) + self.obs_shape, dtype=self.obs_dtype)
        self.actions = np.zeros((n,) + self.act_shape, dtype=self.act_dtype)
        self.rewards = np.zeros(n, dtype=np.float32)
        self.terminateds = np.zeros(n, dtype=np.float32)
        self.head = 0  # next write position
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, obs, action, reward, next_obs, terminated, truncated) -> None:
        n = len(reward)
        if self.head + n <= self.max_size:  # no wrap-around: a slice is cheaper than fancy indexing
            idx = slice(self.head, self.head + n)
        else:
            idx = (self.head + np.arange(n)) % self.max_size
        self.states[idx] = obs
        self.actions[idx] = action
        self.rewards[idx] = reward
        self.next_states[idx] = next_obs
        self.terminateds[idx] = terminated
        self.head = int((self.head + n) % self.max_size)
        self.size = min(self.size + n, self.max_size)

    def sample(self) -> ReplayBatch:
        idx = self.rng.integers(0, self.size, size=self.batch_size)
        if self.use_cer:
            idx[-1] = (self.head - 1) % self.max_size
        return ReplayBatch(self.states[idx], self.actions[idx], self.rewards[idx],
                           self.next_states[idx], self.terminateds[idx])

    def state_dict(self) -> dict:
        """The sampling generator always; the stored transitions only when `persist` is set
        (meta.snapshot_replay), as whole arrays so a snapshot can memory-map them back."""
        state = {'persisted': self.persist, 'rng': self.rng.bit_generator.state, 'head': self.head, 'size': self.size}
        if self.persist:
            for key in self.ARRAY_KEYS:  # views, no copies; only the filled part
                state[key] = getattr(self, key)[:self.size]
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore; without persisted transitions the memory starts empty and refills (training
        waits for training_start_step transitions again). Persisted arrays of the full capacity
        are adopted as they are (memory-mapped by the snapshot loader), not copied."""
        self.rng.bit_generator.state = state['rng']
        if not state['persisted']:
            self.head, self.size = 0, 0
            return
        for key in self.ARRAY_KEYS:
            arr = state[key]
            if len(arr) == self.max_size:
                setattr(self, key, arr)
            else:
                getattr(self, key)[:len(arr)] = arr
        self.head, self.size = int(state['head']), int(state['size'])
