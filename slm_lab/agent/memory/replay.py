"""Replay: a circular experience replay buffer of fixed size, sampled uniformly.

With use_cer (combined experience replay, Zhang & Sutton 2017), SLM-Lab v5's rule: the tail of
each sampled batch is replaced by the transitions stored since the previous sample, oldest first,
at most a whole batch; any left over go into the next batches. With one env and training every
frame that is the one newest transition, SLM-Lab v4's rule; with N envs or training every k
frames it is the N*k newest, where v4 put only the very newest.

Observations of stacked uint8 frames (see `uses_frame_storage`: Atari's (4, 84, 84)) are stored
frame by frame in a `FrameStore` instead of as two stacks per transition: each frame once, about
one frame per transition, so a 1M-transition Atari replay holds ~7.3 GB, not 56 GB. A sampled
batch's stacks are rebuilt from the stored frames, bit for bit what the env returned. Its
snapshots are made of fixed-size chunks that the snapshot writer reuses (hard links) when they
have not changed since the previous snapshot, so frequent snapshots write only what changed.
"""
from __future__ import annotations

import functools
import math
import uuid

import gymnasium as gym
import numpy as np

from slm_lab.agent.memory.base import Batch, Memory, space_bytes, space_shape_dtype, transition_bytes
from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import ResumeError
from slm_lab.lib.schema import Field
from slm_lab.lib.arrays import identified_array, join_chunks
from slm_lab.resources import Need, kept_on_disk, replay_in_snapshots


@functools.lru_cache(maxsize=1)
def _opencv():
    """OpenCV (the Atari extra, which stacked frames come from), imported on first use: it merges
    channels fastest; None without it (numpy's strided writes give the same bytes)."""
    try:
        import cv2  # noqa: PLC0415 an optional extra, and slow to import: only for stacked frames
    except ImportError:
        return None
    return cv2

logger = lab_logger.get_logger('slm_lab.agent.memory.replay')

MAX_STACK = 16  # an observation (K, H, W) uint8 with K up to this is taken for K stacked frames
NO_FRAME = np.iinfo(np.int64).max  # "refers to no ring frame" in FrameStore.oldest
# rows per snapshot chunk: 4096 frames (29 MB of 84x84 frames; a whole number of 4 KiB pages for any
# frame size, so that a resumed ring maps its chunk files side by side) and 65536 transitions
FRAME_CHUNK_ROWS = 4096
TRANSITION_CHUNK_ROWS = 65536


def uses_frame_storage(obs_shape: tuple, obs_dtype) -> bool:
    """Whether a replay stores observations of this shape and dtype frame by frame (FrameStore):
    uint8 arrays (K, H, W) with 1 <= K <= MAX_STACK, i.e. K stacked greyscale frames as the lab's
    Atari envs return them. Anything else (vectors, channels-last images) is stored as it is."""
    return len(obs_shape) == 3 and np.dtype(obs_dtype) == np.uint8 and 1 <= obs_shape[0] <= MAX_STACK


def frame_ring_size(max_size: int, stack: int, num_envs: int) -> int:
    """Frames the ring of a FrameStore holds at first: one per transition, the K-1 older frames
    the oldest stacks of each env need, and a margin of 1/32 for the extra frames of episode
    starts (one per episode with zero padding: enough for episodes of 32 steps or more on
    average; the ring grows, with a warning, when they need more)."""
    return max_size + max_size // 32 + 2 * stack * num_envs + 16


class ChunkedState:
    """Which fixed-size chunks (rows [c * rows, (c + 1) * rows)) of an array changed since the
    last snapshot. Each unchanged chunk keeps a content id (a random uuid, drawn when a chunk's
    content is first snapshotted): the snapshot writer reuses a previous snapshot's file of the
    same id instead of writing it again (checkpoint.identified_array). None: changed."""

    def __init__(self, rows_per_chunk: int, n_chunks: int):
        self.rows = rows_per_chunk
        self.ids: list[str | None] = [None] * n_chunks
        self._loaded: list | None = None

    def touch_rows(self, rows: np.ndarray) -> None:
        """These rows changed."""
        for c in np.unique(np.asarray(rows) // self.rows):
            self.ids[int(c)] = None

    def chunks(self, arr: np.ndarray, filled: int, name: str) -> list[dict]:
        """The filled rows [0, filled) of arr as identified chunk views (no copies); `name` tells
        apart the arrays that share these chunks (the per-transition ones)."""
        out = []
        for c, start in enumerate(range(0, filled, self.rows)):
            if self.ids[c] is None:
                self.ids[c] = uuid.uuid4().hex
            out.append(identified_array(arr[start:min(start + self.rows, filled)], f'{self.ids[c]}.{name}'))
        return out

    def load(self, chunks: list, rows: int, dtype, row_shape: tuple) -> np.ndarray:
        """The array of `rows` rows that `chunks` (as chunks() made them) fill from row 0 (the rest
        zero), joined without a copy where they are memory-mapped snapshot files. Their content ids
        are kept when every array loaded into these chunks has the same (see chunks())."""
        arrays = [c['__array__'] for c in chunks]
        if any(a.dtype != dtype or a.shape[1:] != tuple(row_shape) for a in arrays) or sum(map(len, arrays)) > rows:
            raise ResumeError(f'a replay snapshot holds chunks of {arrays[0].dtype} {arrays[0].shape[1:]} '
                              f'where this replay stores {np.dtype(dtype)} {tuple(row_shape)}')
        ids = [str(c['__content_id__']).rsplit('.', 1)[0] for c in chunks]
        if self._loaded is None:
            self._loaded = ids
        else:
            self._loaded = [a if a == b else None for a, b in zip(self._loaded, ids)]
        self.ids = self._loaded + [None] * (len(self.ids) - len(self._loaded))
        return join_chunks(arrays, rows, np.dtype(dtype), tuple(row_shape))

    def start_loading(self) -> None:
        """Before the load() calls of the arrays that share these chunks."""
        self._loaded = None


def stack_channels_last(frames: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """frames[slots] (B, K, H, W) of (H, W) frames, its bytes laid out as (B, H, W, K): the array a
    channels-last conv net takes as it is. Gathering the K frames into the last axis here costs a
    fraction of converting the stacked batch afterwards (torch's NCHW -> NHWC copy of uint8 frames
    with 4 channels took 1 ms for a batch of 32 Atari stacks, a tenth of a DQN Pong step; OpenCV's
    merge of the K channels, 70 us; numpy's strided writes, 300 us). The same bytes either way."""
    B, K = slots.shape
    H, W = frames.shape[1:]
    cv2 = _opencv()
    if cv2 is not None and 0 < K <= 4 and B * H < 32768:  # OpenCV's merge of up to 4 single-channel images
        merged = cv2.merge([frames[slots[:, k]].reshape(B * H, W) for k in range(K)])
        return merged.reshape(B, H, W, K).transpose(0, 3, 1, 2)
    out = np.empty((B, H, W, K), dtype=frames.dtype)
    for k in range(K):
        out[..., k] = frames[slots[:, k]]
    return out.transpose(0, 3, 1, 2)


class FrameStore:
    """The observations of a replay of stacked frames, each frame stored once.

    Frames go into a ring `frames` (1 + R, H, W): slot 0 is an all-zero frame (the padding of
    an episode's first stacks), slots 1..R hold frames in the order they were added (the a-th
    frame ever added at slot 1 + a % R). Transition p refers to its 2K frames by slot in
    `frame_idx[p]` (2K,): states = frames[frame_idx[p, :K]], next_states = frames[frame_idx[p, K:]].

    When a transition is added for env row e, its observation is compared with row e's previous
    next observation: equal (the stack continues: the next step of an episode, or the reset after
    a lost life under LifeLossTermination) it reuses those K slots; else (an episode's start, or
    anything else) its K frames are stored (an all-zero frame as slot 0, a frame equal to the one
    before it in the stack as that slot). The next observation, when it is the observation shifted
    by one frame (always, for FrameStackObservation), adds its newest frame only; else its K frames.
    So a step adds one frame, an episode one more, and whatever an env returns is rebuilt exactly.

    A slot is reused only when no stored transition (nor a row's previous next observation)
    refers to its frame: `oldest[p]` is the oldest frame number transition p refers to, and
    `floor` a lower bound of them all, recomputed when the ring comes round to it. When the ring
    is full of frames in use (episodes much shorter than 32 steps), it grows."""

    def __init__(self, max_size: int, frame_shape: tuple, stack: int, num_envs: int):
        self.max_size, self.frame_shape, self.stack = max_size, tuple(frame_shape), stack
        self.ring = frame_ring_size(max_size, stack, num_envs)
        self.frames = np.zeros((1 + self.ring,) + self.frame_shape, dtype=np.uint8)
        self.frame_idx = np.zeros((max_size, 2 * stack), dtype=np.int32)
        self.oldest = np.full(max_size, NO_FRAME, dtype=np.int64)
        self.last_next_idx = np.full((num_envs, stack), -1, dtype=np.int32)  # -1: no previous step
        self.last_next_oldest = np.full(num_envs, NO_FRAME, dtype=np.int64)
        self.frame_count = 0  # frames ever added to the ring
        self.transition_count = 0  # transitions ever added
        # stacks laid out channels-last (set by the agent for a conv net with memory_format
        # channels_last): see stacks
        self.channels_last = False
        self.floor = 0  # no frame older than this is referred to
        self.frame_chunks = ChunkedState(FRAME_CHUNK_ROWS, self._n_chunks(1 + self.ring, FRAME_CHUNK_ROWS))
        self.row_chunks = ChunkedState(TRANSITION_CHUNK_ROWS, self._n_chunks(max_size, TRANSITION_CHUNK_ROWS))

    @staticmethod
    def _n_chunks(rows: int, per_chunk: int) -> int:
        return -(-rows // per_chunk)

    @staticmethod
    def nbytes(max_size: int, frame_shape: tuple, stack: int, num_envs: int) -> int:
        """Bytes a FrameStore allocates (its ring at first size, frame slots and frame numbers)."""
        frame_bytes = int(np.prod(frame_shape))
        return (1 + frame_ring_size(max_size, stack, num_envs)) * frame_bytes + max_size * (2 * stack * 4 + 8)

    # --- adding -------------------------------------------------------------------------------
    def _abs(self, slots: np.ndarray) -> np.ndarray:
        """Frame numbers of ring slots in use (NO_FRAME for slot 0)."""
        slots = np.asarray(slots, dtype=np.int64)
        last = self.frame_count - 1
        numbers = last - (last - (slots - 1)) % self.ring
        return np.where(slots == 0, NO_FRAME, numbers)

    def _add_frame(self, frame: np.ndarray, before: int) -> int:
        """The slot of `frame`: 0 for an all-zero frame, `before` (the previous slot of its stack)
        for a repeat of that frame, else a new slot."""
        if not frame.any():
            return 0
        if before > 0 and np.array_equal(self.frames[before], frame):
            return before
        slot = 1 + self.frame_count % self.ring  # free: see _make_room
        self.frames[slot] = frame
        self.frame_count += 1
        self.frame_chunks.ids[slot // self.frame_chunks.rows] = None
        return slot

    def _make_room(self, frames: int) -> None:
        """Make sure the next `frames` slots of the ring hold no frame in use (growing the ring
        when they do); called before a transition's frames are added, as growing moves slots."""
        victim = self.frame_count + frames - 1 - self.ring  # the newest frame number they would overwrite
        if victim >= self.floor:
            # frames added from now on are referred to later: the floor never passes frame_count
            self.floor = int(min(self.oldest.min(), self.last_next_oldest.min(), self.frame_count))
            if victim >= self.floor:
                self._grow(frames)

    def _add_stack(self, stack: np.ndarray) -> np.ndarray:
        slots = np.empty(self.stack, dtype=np.int32)
        before = 0
        for j in range(self.stack):
            before = slots[j] = self._add_frame(stack[j], before)
        return slots

    def add(self, positions: np.ndarray, obs: np.ndarray, next_obs: np.ndarray) -> None:
        """Store the stacks of transitions at positions (n,): obs and next_obs (n, K, H, W), row e
        of a call continuing row e of the previous call (the vector env's sub-env e)."""
        n = len(positions)
        if n < len(self.last_next_idx):  # rows left out of this call continue nothing (and pin no frame)
            self.last_next_idx[n:] = -1
            self.last_next_oldest[n:] = NO_FRAME
        if n > len(self.last_next_idx):  # more rows than envs: each row still continues itself
            grow = n - len(self.last_next_idx)
            self.last_next_idx = np.concatenate([self.last_next_idx, np.full((grow, self.stack), -1, np.int32)])
            self.last_next_oldest = np.concatenate([self.last_next_oldest, np.full(grow, NO_FRAME)])
        for e in range(n):
            self._make_room(2 * self.stack)
            prev = self.last_next_idx[e]
            if prev[0] >= 0 and np.array_equal(self.frames[prev], obs[e]):
                obs_slots = prev.copy()
            else:
                obs_slots = self._add_stack(obs[e])
            if np.array_equal(next_obs[e, :-1], obs[e, 1:]):
                next_slots = np.append(obs_slots[1:], self._add_frame(next_obs[e, -1], int(obs_slots[-1])))
            else:
                next_slots = self._add_stack(next_obs[e])
            p = positions[e]
            self.frame_idx[p, :self.stack] = obs_slots
            self.frame_idx[p, self.stack:] = next_slots
            self.oldest[p] = self._abs(self.frame_idx[p]).min()
            self.last_next_idx[e] = next_slots
            self.last_next_oldest[e] = self._abs(next_slots).min()
        self.row_chunks.touch_rows(positions)
        self.transition_count += n

    def _grow(self, frames: int) -> None:
        """Make the ring larger, keeping every frame in use (at the slots of its new size), with
        room for `frames` more."""
        rate = self.frame_count / max(1, self.transition_count)  # frames added per transition so far
        ring = max(self.ring + self.ring // 4, self.frame_count - self.floor + frames,
                   int(rate * self.max_size * 1.1) + 2 * self.stack * len(self.last_next_idx))
        logger.warning(f'replay: the episodes need more frames than one per transition plus 1/32; the frame ring '
                       f'grows from {self.ring} to {ring} frames ({ring * self.frames[0].nbytes / 1e9:.2f} GB)')
        frames = np.zeros((1 + ring,) + self.frame_shape, dtype=np.uint8)
        numbers = np.arange(max(0, self.frame_count - self.ring), self.frame_count, dtype=np.int64)
        frames[1 + numbers % ring] = self.frames[1 + numbers % self.ring]
        for idx in (self.frame_idx, self.last_next_idx):
            valid = idx > 0
            idx[valid] = 1 + self._abs(idx[valid]) % ring
        self.frames, self.ring = frames, ring
        self.frame_chunks = ChunkedState(FRAME_CHUNK_ROWS, self._n_chunks(1 + ring, FRAME_CHUNK_ROWS))
        self.row_chunks.ids = [None] * len(self.row_chunks.ids)

    # --- reading ------------------------------------------------------------------------------
    def stacks(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(states, next_states) of the transitions at positions idx (B,): each (B, K, H, W); with
        `channels_last`, in memory as (B, H, W, K) (the strides of a channels-last tensor)."""
        slots = self.frame_idx[idx]
        if self.channels_last and len(self.frame_shape) == 2:
            return stack_channels_last(self.frames, slots[:, :self.stack]), \
                stack_channels_last(self.frames, slots[:, self.stack:])
        return self.frames[slots[:, :self.stack]], self.frames[slots[:, self.stack:]]

    # --- snapshots ----------------------------------------------------------------------------
    def state_dict(self, size: int, extra: dict[str, np.ndarray]) -> dict:
        """The filled part as identified chunks (views, no copies), with the replay's `extra`
        per-transition arrays (actions, rewards, terminateds) chunked as the frame slots are."""
        filled_frames = 1 + min(self.frame_count, self.ring)
        rows = {'frame_idx': self.frame_idx, 'oldest': self.oldest, **extra}
        return {'max_size': self.max_size, 'ring': self.ring, 'frame_count': self.frame_count,
                'transition_count': self.transition_count, 'floor': self.floor,
                'last_next_idx': self.last_next_idx.copy(), 'last_next_oldest': self.last_next_oldest.copy(),
                'frames': self.frame_chunks.chunks(self.frames, filled_frames, 'frames'),
                'rows': {key: self.row_chunks.chunks(arr, size, key) for key, arr in rows.items()}}

    def load_state_dict(self, state: dict, size: int, extra: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Adopt a state_dict's arrays (memory-mapped chunks joined without copies); returns the
        `extra` arrays as loaded, each of max_size rows."""
        if int(state['max_size']) != self.max_size:
            raise ResumeError(f"the snapshot's replay holds {state['max_size']} transitions; this spec's max_size "
                              f'is {self.max_size}: resume with the max_size of the run')
        self.ring = int(state['ring'])
        self.frame_count, self.transition_count = int(state['frame_count']), int(state['transition_count'])
        self.floor = int(state['floor'])
        self.last_next_idx = np.array(state['last_next_idx'], dtype=np.int32)
        self.last_next_oldest = np.array(state['last_next_oldest'], dtype=np.int64)
        self.frame_chunks = ChunkedState(FRAME_CHUNK_ROWS, self._n_chunks(1 + self.ring, FRAME_CHUNK_ROWS))
        self.frame_chunks.start_loading()
        self.frames = self.frame_chunks.load(state['frames'], 1 + self.ring, np.uint8, self.frame_shape)
        self.row_chunks = ChunkedState(TRANSITION_CHUNK_ROWS, self._n_chunks(self.max_size, TRANSITION_CHUNK_ROWS))
        self.row_chunks.start_loading()
        out = {}
        for key, like in (('frame_idx', self.frame_idx), ('oldest', self.oldest), *extra.items()):
            chunks = state['rows'][key]
            out[key] = (self.row_chunks.load(chunks, self.max_size, like.dtype, like.shape[1:]) if chunks
                        else np.zeros_like(like))
        self.frame_idx, self.oldest = out.pop('frame_idx'), out.pop('oldest')
        self.oldest[size:] = NO_FRAME  # rows not filled yet refer to nothing
        return out


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
        return min(1.0, (frames_between + 2 * FRAME_CHUNK_ROWS) / max_size)

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
                self.frame_store.last_next_oldest[:] = NO_FRAME
                self.frame_store.oldest[:] = NO_FRAME
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
