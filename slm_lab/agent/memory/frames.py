"""A replay's stacked frames stored frame by frame (FrameStore): observations of K stacked uint8
frames (Atari's (4, 84, 84)) are kept as a ring of single frames and, per transition, the ring
slots its two stacks are made of: each frame once, about one frame per transition, so a
1M-transition Atari replay holds ~7.3 GB, not 56 GB. A sampled batch's stacks are rebuilt from
the ring, bit for bit what the env returned. Its snapshots are made of fixed-size chunks
(ChunkedState) that the snapshot writer reuses (hard links) when they have not changed since the
previous snapshot, so frequent snapshots write only what changed. Replay (replay.py) uses it."""
from __future__ import annotations

import functools
import uuid

import numpy as np

from slm_lab.lib import logger as lab_logger
from slm_lab.lib.arrays import identified_array, join_chunks
from slm_lab.lib.errors import ResumeError


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
