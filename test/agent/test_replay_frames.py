"""Replay of stacked Atari frames (memory/frames.py's FrameStore): each frame stored once, every sampled stack
rebuilt bit for bit as the env returned it, and snapshots that reuse unchanged chunks."""
from __future__ import annotations

import os

import gymnasium as gym
import numpy as np
import pytest

from slm_lab.agent.estimate import memory_needs
from slm_lab.lib import arrays
from slm_lab.persistence import snapshot as checkpoint, snapshots as session_snapshots
from slm_lab.agent.memory import frames as frames_module
from slm_lab.agent.memory.prioritized import PrioritizedReplay
from slm_lab.agent.memory.replay import Replay

SPEC = {'bench': 'replay frames'}
OBS8 = (4, 8, 8)


class NaiveReplay:
    """What Replay stored before frames: both stacks of every transition, in the same ring."""

    def __init__(self, max_size: int, obs_shape: tuple):
        self.max_size, self.head = max_size, 0
        self.states = np.zeros((max_size,) + obs_shape, np.uint8)
        self.next_states = np.zeros_like(self.states)

    def add(self, obs, next_obs):
        idx = (self.head + np.arange(len(obs))) % self.max_size
        self.states[idx], self.next_states[idx] = obs, next_obs
        self.head = int((self.head + len(obs)) % self.max_size)


def memory(cls=Replay, max_size=64, num_envs=2, persist=True, obs_shape=(4, 84, 84), seed=0):
    spec = {'name': cls.__name__, 'batch_size': 16, 'max_size': max_size, 'use_cer': False}
    if cls is PrioritizedReplay:
        spec.update(alpha=0.6, epsilon=1e-4, beta=0.0)
    obs_space = gym.spaces.Box(0, 255, obs_shape, np.uint8)
    return cls(spec, obs_space, gym.spaces.Discrete(4), num_envs, seed=seed, persist=persist)


def play_breakout(steps: int, mems: list, naive: NaiveReplay, seed: int = 3):
    """Random play of ALE/Breakout-v5 through the lab's make_env (2 envs, a lost life ends an
    episode, max_t truncates games), stored as the Session stores it: next_obs is the final
    observation where an episode ended."""
    from slm_lab.env import make_env
    env = make_env({'name': 'ALE/Breakout-v5', 'num_envs': 2, 'life_loss_info': True, 'max_t': 40})
    rng = np.random.default_rng(seed)
    ends = {'terminated': 0, 'truncated': 0}
    try:
        obs, _ = env.reset(seed=seed)
        for _ in range(steps):
            action = rng.integers(0, env.single_action_space.n, size=2)
            next_obs, reward, terminated, truncated, info = env.step(action)
            true_next = next_obs.copy()
            if '_final_obs' in info:
                mask = info['_final_obs']
                true_next[mask] = np.stack(info['final_obs'][mask])
            for mem in mems:
                mem.add(obs, action, reward, true_next, terminated, truncated)
            naive.add(obs, true_next)
            ends['terminated'] += int(terminated.sum())
            ends['truncated'] += int((truncated & ~terminated).sum())
            obs = next_obs
    finally:
        env.close()
    return ends


def assert_same_as_naive(mem: Replay, naive: NaiveReplay):
    idx = np.arange(mem.size)
    batch = mem.batch_at(idx)
    np.testing.assert_array_equal(batch.states, naive.states[idx])
    np.testing.assert_array_equal(batch.next_states, naive.next_states[idx])


@pytest.fixture(scope='module')
def played():
    """Replay and PrioritizedReplay of 64 transitions after 300 steps of 2 envs (the ring wraps
    round 9 times), and the naive storage of the same."""
    mems = [memory(Replay), memory(PrioritizedReplay)]
    naive = NaiveReplay(64, (4, 84, 84))
    ends = play_breakout(300, mems, naive)
    return mems, naive, ends


def test_atari_stacks_are_rebuilt_exactly_through_episode_ends_lost_lives_and_wrap_around(played):
    mems, naive, ends = played
    assert ends['terminated'] >= 3 and ends['truncated'] >= 3, ends  # both kinds of episode end were stored
    for mem in mems:
        assert mem.frame_store is not None and not hasattr(mem, 'states')
        assert_same_as_naive(mem, naive)
        # about one frame per transition: 600 transitions added 600 newest frames, plus one per episode
        assert mem.frame_store.frame_count < 600 + 2 * (ends['terminated'] + ends['truncated']) + 8
        assert mem.frame_store.ring == frames_module.frame_ring_size(64, 4, 2)  # no growth was needed


def test_sampling_draws_as_before_and_returns_the_same_batches(played):
    mems, naive, _ = played
    mem = mems[0]
    state = mem.rng.bit_generator.state
    batch = mem.sample()
    mem.rng.bit_generator.state = state
    idx = mem.rng.integers(0, mem.size, size=mem.batch_size)  # the draw Replay always made
    np.testing.assert_array_equal(batch.states, naive.states[idx])
    np.testing.assert_array_equal(batch.next_states, naive.next_states[idx])
    assert batch.states.shape == (16, 4, 84, 84) and batch.states.dtype == np.uint8


def test_vector_observations_keep_their_arrays():
    """float32 vectors, channels-last images and float frames are stored as they are."""
    spec = {'name': 'Replay', 'batch_size': 4, 'max_size': 8, 'use_cer': False}
    for space in (gym.spaces.Box(-1, 1, (8,), np.float32), gym.spaces.Box(0, 255, (84, 84, 3), np.uint8),
                  gym.spaces.Box(0, 1, (4, 84, 84), np.float32)):
        mem = Replay(spec, space, gym.spaces.Discrete(2), 1, persist=True)
        assert mem.frame_store is None and mem.states.shape == (8,) + space.shape
        assert set(mem.state_dict()) >= {'states', 'next_states', 'actions', 'rewards', 'terminateds'}


def random_stacks(rng, n, steps, frame=(84, 84), odd_p=0.1, reset_p=0.25):
    """A stream of n envs whose episodes (random lengths 1..6) start with zero-padded stacks and
    continue frame by frame, with occasional stacks that continue nothing (all fresh frames)."""
    k = 4
    stacks = np.zeros((n, k) + frame, np.uint8)
    stacks[:, -1] = rng.integers(1, 255, (n,) + frame)
    for _ in range(steps):
        nxt = np.concatenate([stacks[:, 1:], rng.integers(0, 255, (n, 1) + frame, dtype=np.uint8)], axis=1)
        odd = rng.random(n) < odd_p
        nxt[odd] = rng.integers(0, 255, (int(odd.sum()), k) + frame, dtype=np.uint8)
        yield stacks.copy(), nxt
        reset = rng.random(n) < reset_p
        stacks = nxt.copy()
        stacks[reset] = 0
        stacks[reset, -1] = rng.integers(1, 255, (int(reset.sum()),) + frame, dtype=np.uint8)


def test_short_episodes_grow_the_ring_and_stay_exact():
    """Episodes of a few steps and stacks continuing nothing need more than a frame per transition:
    the ring grows (with a warning) and every stack is still the env's."""
    rng = np.random.default_rng(0)
    mem, naive = memory(max_size=50, num_envs=3, obs_shape=(4, 6, 5)), NaiveReplay(50, (4, 6, 5))
    for obs, nxt in random_stacks(rng, 3, 200, frame=(6, 5)):
        mem.add(obs, np.zeros(3), np.zeros(3), nxt, np.zeros(3, bool), np.zeros(3, bool))
        naive.add(obs, nxt)
        assert_same_as_naive(mem, naive)
    assert mem.frame_store.ring > frames_module.frame_ring_size(50, 4, 3)


def test_a_wrong_observation_shape_is_one_line():
    mem = memory()
    with pytest.raises(ValueError, match=r'observations of shape \(2, 4, 84\).*stores \(2, 4, 84, 84\)'):
        mem.add(np.zeros((2, 4, 84), np.uint8), np.zeros(2), np.zeros(2), np.zeros((2, 4, 84), np.uint8),
                np.zeros(2, bool), np.zeros(2, bool))


def fill(mem, naive, rng, steps, frame=(8, 8), **stream):
    for obs, nxt in random_stacks(rng, 2, steps, frame, **stream):
        n = len(obs)
        mem.add(obs, rng.integers(0, 4, n), rng.random(n).astype(np.float32), nxt, rng.random(n) < 0.1,
                np.zeros(n, bool))
        naive.add(obs, nxt)


def test_snapshots_are_exact_map_back_without_copies_and_write_only_what_changed(tmp_path, monkeypatch):
    """Frames of 8x8 in chunks of 64 (a page, as the default 4096 frames are whole pages) and
    chunks of 64 transitions:
    a full snapshot, one after a few more transitions (only their chunks are written, the rest
    hard-linked), a resume from it that samples as the straight run does, and a snapshot of the
    resumed replay that rewrites nothing unchanged."""
    monkeypatch.setattr(frames_module, 'FRAME_CHUNK_ROWS', 64)
    monkeypatch.setattr(frames_module, 'TRANSITION_CHUNK_ROWS', 256)
    assert 64 * 8 * 8 % os.sysconf('SC_PAGE_SIZE') == 0
    rng = np.random.default_rng(1)
    mem, naive = memory(PrioritizedReplay, max_size=1000, obs_shape=OBS8), NaiveReplay(1000, OBS8)
    fill(mem, naive, rng, 700)  # wraps round once
    ckpt = tmp_path / 'ckpt'
    first = checkpoint.save_snapshot(ckpt, 100, {'memory': mem.state_dict()}, SPEC)
    fill(mem, naive, rng, 20)  # 40 transitions, about 40 frames: one or two chunks of each
    second = checkpoint.save_snapshot(ckpt, 200, {'memory': mem.state_dict()}, SPEC)
    files = checkpoint.read_manifest(second)['files']
    frame_files = [n for n in files if '.frames.' in n]
    written = [n for n in frame_files if not files[n].get('reused')]
    assert len(frame_files) >= 4 and 1 <= len(written) <= 2, (len(frame_files), written)
    for name in frame_files:  # reused files are the same inode as the previous snapshot's
        if files[name].get('reused'):
            assert os.stat(second / name).st_ino == os.stat(first / name).st_ino
    assert checkpoint.verify_snapshot(second)  # complete on its own, every checksum right

    state, _ = checkpoint.load_snapshot(second)
    resumed = memory(PrioritizedReplay, max_size=1000, seed=5, obs_shape=OBS8)
    resumed.load_state_dict(state['memory'])
    frames = resumed.frame_store.frames
    assert arrays.mapping_of(frames) is not None and not frames.flags.owndata  # mapped, not copied
    assert_same_as_naive(resumed, naive)
    for _ in range(3):  # same draws, same batches
        a, b = mem.sample(), resumed.sample()
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    # pruning the first snapshot leaves the second complete
    session_snapshots.prune_snapshots(ckpt, keep=1)
    assert not first.exists() and checkpoint.verify_snapshot(second)
    # the resumed replay continues (copy-on-write: the snapshot's files do not change) and its next
    # snapshot writes only the chunks it changed
    rng2 = np.random.default_rng(7)
    naive_copy = NaiveReplay(1000, OBS8)
    naive_copy.states, naive_copy.next_states = naive.states.copy(), naive.next_states.copy()
    naive_copy.head = naive.head
    fill(resumed, naive_copy, rng2, 5)
    assert_same_as_naive(resumed, naive_copy)
    assert checkpoint.verify_snapshot(second)
    third = checkpoint.save_snapshot(ckpt, 300, {'memory': resumed.state_dict()}, SPEC)
    files = checkpoint.read_manifest(third)['files']
    written = [n for n in files if n.endswith('.npy') and not files[n].get('reused')]
    assert 1 <= len([n for n in written if '.frames.' in n]) <= 2, written
    again, _ = checkpoint.load_snapshot(third)
    other = memory(PrioritizedReplay, max_size=1000, obs_shape=OBS8)
    other.load_state_dict(again['memory'])
    assert_same_as_naive(other, naive_copy)


def test_a_snapshot_of_a_partly_filled_replay_copies_unaligned_chunks_and_resumes(tmp_path, monkeypatch):
    """Chunks that are not whole pages (10 frames of 8x8) are copied on load, not mapped."""
    monkeypatch.setattr(frames_module, 'FRAME_CHUNK_ROWS', 10)
    monkeypatch.setattr(frames_module, 'TRANSITION_CHUNK_ROWS', 8)
    rng = np.random.default_rng(2)
    mem, naive = memory(max_size=200, obs_shape=OBS8), NaiveReplay(200, OBS8)
    fill(mem, naive, rng, 30)
    path = checkpoint.save_snapshot(tmp_path, 1, {'memory': mem.state_dict()}, SPEC)
    state, _ = checkpoint.load_snapshot(path)
    resumed = memory(max_size=200, obs_shape=OBS8)
    resumed.load_state_dict(state['memory'])
    assert resumed.frame_store.frames.flags.owndata
    assert_same_as_naive(resumed, naive)
    fill(mem, naive, np.random.default_rng(3), 10)
    fill(resumed, NaiveReplay(200, OBS8), np.random.default_rng(3), 10)
    assert_same_as_naive(resumed, naive)


def test_the_memory_estimate_follows_the_frame_storage():
    obs = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    spec = {'agent': {'memory': {'name': 'Replay', 'batch_size': 32, 'max_size': 1_000_000},
                      'algorithm': {'name': 'DQN'}},
            'env': {'num_envs': 1}}
    needs = {n.what: n for n in memory_needs(spec, obs, gym.spaces.Discrete(4), units=0)}
    assert 7.0e9 < needs['replay memory'].nbytes < 7.5e9  # was 2 x 28.2 GB of stacks
    mem = memory(max_size=10_000, num_envs=1)
    allocated = sum(a.nbytes for a in (mem.frame_store.frames, mem.frame_store.frame_idx, mem.frame_store.oldest,
                                       mem.actions, mem.rewards, mem.terminateds))
    assert Replay.storage_bytes(10_000, (4, 84, 84), np.uint8, 8, 1) == allocated


def test_a_replay_resumed_without_its_transitions_refills_exactly():
    """Without meta.snapshot_replay a resumed replay starts empty, its ring still holding old
    frames that nothing refers to: the frames added after them are kept as long as they are used."""
    rng = np.random.default_rng(4)
    mem = memory(max_size=40, num_envs=2, obs_shape=OBS8, persist=False)
    fill(mem, NaiveReplay(40, OBS8), rng, 100, odd_p=0.0, reset_p=0.0)  # a frame per transition
    ring = mem.frame_store.ring
    mem.load_state_dict(mem.state_dict())
    assert mem.size == 0
    mem.frame_store.floor = 0  # a lower bound, the lowest there is: the next add looks for frames in use
    naive = NaiveReplay(40, OBS8)
    for _ in range(5):  # now many frames per transition: the ring must grow
        fill(mem, naive, rng, 30, odd_p=0.5)
        assert_same_as_naive(mem, naive)
    assert mem.frame_store.ring > ring


def test_a_snapshot_of_another_storage_or_size_is_one_line():
    from slm_lab.lib.errors import ResumeError
    frames = memory(max_size=20, obs_shape=OBS8)
    fill(frames, NaiveReplay(20, OBS8), np.random.default_rng(0), 5)
    vector = memory(max_size=20, obs_shape=(8,))
    with pytest.raises(ResumeError, match='stores its replay frame by frame'):
        vector.load_state_dict(frames.state_dict())
    with pytest.raises(ResumeError, match='stores its replay as whole observations'):
        memory(max_size=20, obs_shape=OBS8).load_state_dict(vector.state_dict())
    with pytest.raises(ResumeError, match="holds 20 transitions; this spec's max_size is 30"):
        memory(max_size=30, obs_shape=OBS8).load_state_dict(frames.state_dict())


@pytest.mark.parametrize('opencv', [True, False])
def test_channels_last_stacks_are_the_same_bytes_laid_out_as_a_channels_last_net_takes_them(played, monkeypatch,
                                                                                            opencv):
    # the agent sets channels_last for a conv net with memory_format channels_last; the stacks then
    # come out with NHWC strides (a tensor of them is channels-last, no copy in the net's prepare),
    # by OpenCV's merge or, without OpenCV, numpy's strided writes
    import torch
    if not opencv:
        monkeypatch.setattr(frames_module, '_opencv', lambda: None)
    mems, naive, _ = played
    for mem in mems:
        mem.frame_store.channels_last = True
        try:
            assert_same_as_naive(mem, naive)
            states = mem.batch_at(np.arange(mem.size)).states
            assert states.shape == (mem.size, 4, 84, 84) and states.transpose(0, 2, 3, 1).flags['C_CONTIGUOUS']
            assert torch.as_tensor(states).is_contiguous(memory_format=torch.channels_last)
        finally:
            mem.frame_store.channels_last = False
