"""Replay: a circular experience replay buffer of fixed size, sampled uniformly.

With use_cer (combined experience replay, Zhang & Sutton 2017), SLM-Lab v5's rule: the tail of
each sampled batch is replaced by the transitions stored since the previous sample, oldest first,
at most a whole batch; any left over go into the next batches. With one env and training every
frame that is the one newest transition, SLM-Lab v4's rule; with N envs or training every k
frames it is the N*k newest, where v4 put only the very newest.

Observations of stacked uint8 frames (Atari's (4, 84, 84): `frames.uses_frame_storage`) are
stored frame by frame in a `frames.FrameStore` instead of as two stacks per transition (frames.py).
"""
from __future__ import annotations

import math

import gymnasium as gym
import numpy as np

from slm_lab.agent.memory import frames
from slm_lab.agent.memory.base import Batch, Memory, space_bytes, space_shape_dtype, transition_bytes
from slm_lab.agent.memory.frames import FrameStore, uses_frame_storage
from slm_lab.lib.errors import ResumeError
from slm_lab.lib.schema import Field
from slm_lab.resources import Need, kept_on_disk, replay_in_snapshots


class Replay(Memory):
    """Circular buffer of max_size transitions stored as preallocated arrays (observations of
    stacked uint8 frames in a FrameStore, see the module doc)."""

    spec_schema = {
        'name': Field((str,), doc='memory class'),
        'batch_size': Field((int,), 32, min=1, doc='transitions per sampled batch'),
        'max_size': Field((int,), 10000, min=1, doc='capacity in transitions'),
        'use_cer': Field((bool,), False, doc='combined experience replay: the transitions stored since the previous '
                                             "sample replace the tail of each batch (SLM-Lab v5's rule)"),
        'obs_dtype': Field((str,), None, nullable=True, choices=('float16',),
                           doc='how float observations are stored: null, as the env gives them (float32); "float16", '
                               'in half the memory, rounded to about 3 significant digits, as SLM-Lab v5\'s replay '
                               'always stores them (batches are float32 either way; uint8 Atari frames stay uint8)'),
    }

    ARRAY_KEYS = ('states', 'actions', 'rewards', 'next_states', 'terminateds')
    FRAME_ROW_KEYS = ('actions', 'rewards', 'terminateds')  # stored beside a FrameStore's frames

    @classmethod
    def build_args(cls, spec: dict, algorithm_cls: type) -> dict:
        """persist: whether the run's replays go into its snapshots (resources.replay_in_snapshots)."""
        return {'persist': replay_in_snapshots(spec['meta'])}

    @classmethod
    def storage_needs(cls, spec: dict, obs_space: gym.Space, action_space: gym.Space, units: int) -> list[Need]:
        """max_size transitions (two observations each, or, for stacked uint8 frames, a FrameStore
        of about one frame each), with the bytes its kept snapshots hold when full; and a sampled
        batch as stored, as tensors and through the nets."""
        memory_spec, meta = spec['agent']['memory'], spec.get('meta', {})
        batch, max_size = memory_spec['batch_size'], memory_spec['max_size']
        stored, as_tensors, activations = transition_bytes(obs_space, action_space, units)
        obs_shape, obs_dtype = space_shape_dtype(obs_space)
        stored -= 2 * (space_bytes(obs_space) - cls.stored_obs_bytes(memory_spec, obs_space))
        replay = cls.storage_bytes(max_size, obs_shape, obs_dtype, space_bytes(action_space), spec['env']['num_envs'])
        if replay is None:  # observations stored as they are: two per transition
            replay = max_size * stored
        replay += cls.index_bytes(max_size)
        between = meta.get('checkpoint_frequency') or meta.get('log_frequency', 1000)
        share = cls.snapshot_rewritten_share(max_size, obs_shape, obs_dtype, between)
        return [Need('replay memory', 'agent.memory.max_size', replay, kept_on_disk(replay, share, meta)),
                Need('sampled batch', 'agent.memory.batch_size', batch * (stored + as_tensors + activations))]

    @staticmethod
    def stored_obs_dtype(memory_spec: dict, obs_dtype: np.dtype) -> np.dtype:
        """The dtype observations are stored in: float16 for float observations with obs_dtype
        "float16" (SLM-Lab v5's replay), else the env's (space_shape_dtype)."""
        if memory_spec.get('obs_dtype') == 'float16' and np.issubdtype(obs_dtype, np.floating):
            return np.dtype(np.float16)
        return obs_dtype

    @classmethod
    def stored_obs_bytes(cls, memory_spec: dict, obs_space: gym.Space) -> int:
        """Bytes of one observation as the replay stores it (stored_obs_dtype)."""
        obs_shape, obs_dtype = space_shape_dtype(obs_space)
        return math.prod(obs_shape) * cls.stored_obs_dtype(memory_spec, obs_dtype).itemsize

    @staticmethod
    def index_bytes(max_size: int) -> int:
        """Bytes of what the replay keeps beside its transitions to sample them: none (a subclass
        that samples by priority counts its tree)."""
        return 0

    def __init__(self, memory_spec, obs_space, action_space, num_envs, seed=0, persist: bool = False):
        super().__init__(memory_spec, obs_space, action_space, num_envs, seed)
        self.persist = persist
        self.batch_size = memory_spec['batch_size']
        self.max_size = memory_spec['max_size']
        self.use_cer = memory_spec['use_cer']
        self.obs_dtype = self.stored_obs_dtype(memory_spec, self.obs_dtype)
        n = self.max_size
        if uses_frame_storage(self.obs_shape, self.obs_dtype):
            self.frame_store: FrameStore | None = FrameStore(n, self.obs_shape[1:], self.obs_shape[0], num_envs)
        else:
            self.frame_store = None
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
        if self.frame_store is None:
            self.states[idx] = obs
            self.next_states[idx] = next_obs
        else:
            obs, next_obs = np.asarray(obs), np.asarray(next_obs)
            if obs.shape != (n,) + self.obs_shape or next_obs.shape != obs.shape:
                raise ValueError(f'Replay.add: observations of shape {obs.shape} and {next_obs.shape} for {n} '
                                 f'rewards; this replay stores ({n}, {", ".join(map(str, self.obs_shape))})')
            self.frame_store.add((self.head + np.arange(n)) % self.max_size, obs, next_obs)
        self.actions[idx] = action
        self.rewards[idx] = reward
        self.terminateds[idx] = terminated
        self.head = int((self.head + n) % self.max_size)
        self.size = min(self.size + n, self.max_size)
        self.cer_pending = min(self.cer_pending + n, self.size)

    def sample(self) -> Batch:
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

    def batch_at(self, idx: np.ndarray) -> Batch:
        """The transitions at storage positions idx (B,)."""
        if self.frame_store is None:
            states, next_states = self.states[idx], self.next_states[idx]
        else:
            states, next_states = self.frame_store.stacks(idx)
        return Batch(states, self.actions[idx], self.rewards[idx], next_states, self.terminateds[idx])

    @staticmethod
    def storage_bytes(max_size: int, obs_shape: tuple, obs_dtype, act_bytes: int, num_envs: int) -> int | None:
        """Bytes a Replay of stacked frames allocates (FrameStore, actions, rewards, terminateds),
        or None for observations it stores as they are (two arrays of max_size observations)."""
        if not uses_frame_storage(obs_shape, obs_dtype):
            return None
        return FrameStore.nbytes(max_size, obs_shape[1:], obs_shape[0], num_envs) + max_size * (act_bytes + 8)

    @staticmethod
    def snapshot_rewritten_share(max_size: int, obs_shape: tuple, obs_dtype, frames_between: int) -> float:
        """The share of a full replay's snapshot bytes that a snapshot taken `frames_between`
        frames (transitions) after the one before writes anew: all of it for observations stored
        as they are (each snapshot writes its arrays whole); for stacked frames the chunks the new
        transitions touched, the others hard-linked (about their count, plus a chunk at each end)."""
        if not uses_frame_storage(obs_shape, obs_dtype):
            return 1.0
        return min(1.0, (frames_between + 2 * frames.FRAME_CHUNK_ROWS) / max_size)

    def state_dict(self) -> dict:
        """The sampling generator always; the stored transitions only when `persist` is set
        (the run's replays go into snapshots: resources.replay_in_snapshots): as whole arrays
        (views) so a snapshot can memory-map them back, or, with a FrameStore, as identified
        chunks that snapshots reuse while they are unchanged."""
        state = {'persisted': self.persist, 'rng': self.rng.bit_generator.state, 'head': self.head, 'size': self.size,
                 'cer_pending': self.cer_pending}
        if self.persist:
            if self.frame_store is None:
                for key in self.ARRAY_KEYS:  # views, no copies; only the filled part
                    state[key] = getattr(self, key)[:self.size]
            else:
                state['frame_store'] = self.frame_store.state_dict(
                    self.size, {key: getattr(self, key) for key in self.FRAME_ROW_KEYS})
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore; without persisted transitions the memory starts empty and refills (training
        waits for training_start_step transitions again). Persisted arrays of the full capacity
        are adopted as they are (memory-mapped by the snapshot loader), not copied."""
        self.rng.bit_generator.state = state['rng']
        if not state['persisted']:
            self.head, self.size, self.cer_pending = 0, 0, 0
            if self.frame_store is not None:  # its frames are referred to by nothing now
                self.frame_store.last_next_idx[:] = -1
                self.frame_store.last_next_oldest[:] = frames.NO_FRAME
                self.frame_store.oldest[:] = frames.NO_FRAME
            return
        if (self.frame_store is not None) != ('frame_store' in state):
            stored = 'frame by frame' if 'frame_store' in state else 'as whole observations'
            raise ResumeError(f'the snapshot stores its replay {stored}, which a replay of {self.obs_shape} '
                              f'{self.obs_dtype} observations does not: resume with the env of the run')
        if self.frame_store is not None:
            size = int(state['size'])
            extra = self.frame_store.load_state_dict(state['frame_store'], size,
                                                     {key: getattr(self, key) for key in self.FRAME_ROW_KEYS})
            for key, arr in extra.items():
                setattr(self, key, arr)
        else:
            for key in self.ARRAY_KEYS:
                arr = state[key]
                if len(arr) == self.max_size and arr.dtype == getattr(self, key).dtype:
                    setattr(self, key, arr)
                else:
                    getattr(self, key)[:len(arr)] = arr
        self.head, self.size = int(state['head']), int(state['size'])
        # a snapshot from before use_cer followed SLM-Lab v5 counted nothing pending
        self.cer_pending = int(state.get('cer_pending', 0))
