"""Replay: a circular experience replay buffer of fixed size, sampled uniformly.

With use_cer (combined experience replay, Zhang & Sutton 2017), SLM-Lab v5's rule: the tail of
each sampled batch is replaced by the transitions stored since the previous sample, oldest first,
at most a whole batch; any left over go into the next batches. With one env and training every
frame that is the one newest transition, SLM-Lab v4's rule; with N envs or training every k
frames it is the N*k newest, where v4 put only the very newest.
"""
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
        'use_cer': Field((bool,), False, doc='combined experience replay: the transitions stored since the previous '
                                             "sample replace the tail of each batch (SLM-Lab v5's rule)"),
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
        self.cer_pending = 0  # transitions stored and not yet put in a batch by use_cer (the newest ones)

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
        self.cer_pending = min(self.cer_pending + n, self.size)

    def sample(self) -> ReplayBatch:
        """batch_size transitions drawn uniformly with replacement (see the module doc for use_cer)."""
        return self.batch_at(self.sample_indices())

    def sample_indices(self) -> np.ndarray:
        """Storage positions (B,) of a batch: uniform, then combined experience replay when use_cer."""
        idx = self.rng.integers(0, self.size, size=self.batch_size)
        return self.apply_cer(idx) if self.use_cer else idx

    def apply_cer(self, idx: np.ndarray) -> np.ndarray:
        """Replace the last k entries of idx (B,) by the k oldest transitions not yet put in a
        batch this way, k = min(pending, B), and count them as put (SLM-Lab v5's apply_cer)."""
        k = min(self.cer_pending, len(idx))
        if k:
            oldest = self.head - self.cer_pending  # the pending ones are the newest cer_pending
            idx[len(idx) - k:] = (oldest + np.arange(k)) % self.max_size
            self.cer_pending -= k
        return idx

    def batch_at(self, idx: np.ndarray) -> ReplayBatch:
        """The transitions at storage positions idx (B,)."""
        return ReplayBatch(self.states[idx], self.actions[idx], self.rewards[idx],
                           self.next_states[idx], self.terminateds[idx])

    def state_dict(self) -> dict:
        """The sampling generator always; the stored transitions only when `persist` is set
        (meta.snapshot_replay), as whole arrays so a snapshot can memory-map them back."""
        state = {'persisted': self.persist, 'rng': self.rng.bit_generator.state, 'head': self.head, 'size': self.size,
                 'cer_pending': self.cer_pending}
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
            self.head, self.size, self.cer_pending = 0, 0, 0
            return
        for key in self.ARRAY_KEYS:
            arr = state[key]
            if len(arr) == self.max_size:
                setattr(self, key, arr)
            else:
                getattr(self, key)[:len(arr)] = arr
        self.head, self.size = int(state['head']), int(state['size'])
        # a snapshot from before use_cer followed SLM-Lab v5 counted nothing pending
        self.cer_pending = int(state.get('cer_pending', 0))
