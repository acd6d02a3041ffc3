"""The on-policy batch in a snapshot: only the filled part, next states stored only where they
differ from the following state, and loaded back byte for byte."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from slm_lab.agent.memory.onpolicy import OnPolicyBatchReplay
from slm_lab.persistence import snapshot as checkpoint

SPEC = {'test': 'on-policy batch'}


def stacked_frames(steps: int, num_envs: int, reset_p: float, seed: int = 0):
    """(obs, true next obs) of `steps` vector steps of 4-frame stacks of 8x8 uint8 frames, each
    sub-env resetting with probability reset_p (its true next obs is then its episode's last)."""
    rng = np.random.default_rng(seed)
    obs = rng.integers(0, 255, (num_envs, 4, 8, 8), dtype=np.uint8)
    for _ in range(steps):
        new_frame = rng.integers(0, 255, (num_envs, 1, 8, 8), dtype=np.uint8)
        next_obs = np.concatenate([obs[:, 1:], new_frame], axis=1)
        done = rng.random(num_envs) < reset_p
        after = next_obs.copy()
        after[done] = rng.integers(0, 255, (int(done.sum()), 4, 8, 8), dtype=np.uint8)  # the reset's obs
        yield obs, next_obs, done
        obs = after


def batch(num_envs: int, steps: int, obs_space) -> OnPolicyBatchReplay:
    return OnPolicyBatchReplay({'name': 'OnPolicyBatchReplay'}, obs_space, gym.spaces.Discrete(3), num_envs,
                               batch_steps=steps)


@pytest.mark.parametrize('filled', [0, 1, 2, 37])
def test_a_partly_filled_batch_round_trips_through_a_snapshot_exactly(tmp_path, filled):
    space = gym.spaces.Box(0, 255, (4, 8, 8), np.uint8)
    mem = batch(3, 40, space)
    dones = []
    for t, (obs, next_obs, done) in enumerate(stacked_frames(filled, 3, reset_p=0.1)):
        mem.add(obs, np.full(3, t % 3), np.ones(3), next_obs, done, np.zeros(3))
        dones.append(done)
    state = mem.state_dict()
    # stored: the last step's next states, and those before a reset (the episode's final observation);
    # whole stacks for the first step and after a reset, else the newest frame
    resets = int(np.sum(dones[:-1]))
    assert len(state['next_states']) == (3 + resets if filled else 0)
    assert len(state['states']['whole']) == (3 + resets if filled else 0)
    assert len(state['states']['newest']) == 3 * filled - len(state['states']['whole'])
    path = checkpoint.save_snapshot(tmp_path / 'ckpt', filled, {'memory': state}, SPEC)
    loaded, _ = checkpoint.load_snapshot(path)
    resumed = batch(3, 40, space)
    resumed.load_state_dict(loaded['memory'])
    assert resumed.size == filled
    for key, values in mem.buffers.items():
        np.testing.assert_array_equal(resumed.buffers[key][:filled], values[:filled], err_msg=key)


def test_next_states_that_only_look_equal_are_kept_bitwise():
    # -0.0 == 0.0 and NaN != NaN for floats: the comparison is of bytes, so both come back as they were
    space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    mem = batch(1, 4, space)
    rows = [np.array([[0.0, np.nan]], np.float32), np.array([[-0.0, np.nan]], np.float32),
            np.array([[1.0, 2.0]], np.float32)]
    mem.add(rows[0], [0], [0.0], rows[0], [0.0], [0.0])  # next == this step's obs (NaN, bitwise)
    mem.add(rows[0], [0], [0.0], rows[1], [0.0], [0.0])  # -0.0 next to the following state's 0.0
    mem.add(rows[2], [0], [0.0], rows[2], [0.0], [0.0])
    state = mem.state_dict()
    assert state['next_kept'][:, 0].tolist() == [False, True, True]
    resumed = batch(1, 4, space)
    resumed.load_state_dict(state)
    assert resumed.buffers['next_states'][:3].tobytes() == mem.buffers['next_states'][:3].tobytes()


def test_an_older_snapshot_with_whole_next_states_still_loads():
    space = gym.spaces.Box(0, 255, (4, 8, 8), np.uint8)
    mem = batch(2, 10, space)
    for obs, next_obs, done in stacked_frames(5, 2, reset_p=0.3):
        mem.add(obs, np.zeros(2), np.ones(2), next_obs, done, np.zeros(2))
    old = {'size': 5, 'buffers': {k: v[:5].copy() for k, v in mem.buffers.items()},
           'rng': mem.rng.bit_generator.state}
    resumed = batch(2, 10, space)
    resumed.load_state_dict(old)
    np.testing.assert_array_equal(resumed.buffers['next_states'][:5], mem.buffers['next_states'][:5])


def test_an_atari_sized_batch_snapshot_holds_one_new_frame_a_step():
    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    mem = batch(16, 56, space)
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 255, (16, 4, 84, 84), dtype=np.uint8)
    for _ in range(56):  # no resets: each stack is the one before shifted by a new frame
        next_obs = np.concatenate([obs[:, 1:], rng.integers(0, 255, (16, 1, 84, 84), dtype=np.uint8)], axis=1)
        mem.add(obs, np.zeros(16), np.zeros(16), next_obs, np.zeros(16), np.zeros(16))
        obs = next_obs
    state = mem.state_dict()
    assert state['next_states'].shape == (16, 4, 84, 84)  # the last step's only
    assert state['states']['whole'].shape == (16, 4, 84, 84)  # the first step's stacks
    assert state['states']['newest'].shape == (55 * 16, 84, 84)
    resumed = batch(16, 56, space)
    resumed.load_state_dict(state)
    for key, values in mem.buffers.items():
        np.testing.assert_array_equal(resumed.buffers[key][:56], values[:56], err_msg=key)
