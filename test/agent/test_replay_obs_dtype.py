"""agent.memory.obs_dtype "float16": a replay stores float observations in half the memory, as
SLM-Lab v5's replay always does; batches stay float32, uint8 frames stay uint8, the storage
estimate counts the smaller rows, and a resumed run keeps what it stores."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import build_spec
from lab_helpers import check_resume_after_max_frame

from slm_lab.agent.memory import PrioritizedReplay, Replay
from slm_lab.spec import validate_spec

OBS = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
ACTIONS = gym.spaces.Discrete(2)


def replay(cls=Replay, **keys):
    spec = {'name': cls.__name__, 'batch_size': 8, 'max_size': 16, 'use_cer': False, **keys}
    if cls is PrioritizedReplay:
        spec.update(alpha=0.6, epsilon=1e-4, beta=0.0)
    return cls(spec, OBS, ACTIONS, 2, seed=0)


@pytest.mark.parametrize('cls', [Replay, PrioritizedReplay])
def test_float16_observations_are_stored_rounded_and_batched_as_float32(cls):
    mem, plain = replay(cls, obs_dtype='float16'), replay(cls)
    rng = np.random.default_rng(0)
    for _ in range(8):
        obs, next_obs = rng.normal(size=(2, 3)).astype(np.float32), rng.normal(size=(2, 3)).astype(np.float32)
        for m in (mem, plain):
            m.add(obs, np.zeros(2, np.int64), np.ones(2, np.float32), next_obs, np.zeros(2, bool), np.zeros(2, bool))
    assert mem.states.dtype == mem.next_states.dtype == np.float16 and plain.states.dtype == np.float32
    assert mem.states.nbytes * 2 == plain.states.nbytes
    np.testing.assert_array_equal(mem.states, plain.states.astype(np.float16))
    batch, plain_batch = mem.sample().to('cpu'), plain.sample().to('cpu')  # the same draws: the same seed
    assert batch.states.dtype == batch.next_states.dtype == torch.float32
    np.testing.assert_array_equal(batch.states.numpy(), plain_batch.states.numpy().astype(np.float16))
    assert not np.array_equal(batch.states.numpy(), plain_batch.states.numpy())  # rounded: another number


def test_uint8_frames_stay_uint8():
    frames = gym.spaces.Box(0, 255, (4, 8, 8), np.uint8)
    spec = {'name': 'Replay', 'batch_size': 8, 'max_size': 16, 'use_cer': False, 'obs_dtype': 'float16'}
    assert Replay(spec, frames, ACTIONS, 1).obs_dtype == np.uint8


def test_the_storage_estimate_counts_half_the_observation_bytes():
    spec = validate_spec(build_spec('DQN', max_frame=100))
    spec['agent']['memory'].update(max_size=100000)
    float32 = {n.what: n.nbytes for n in Replay.storage_needs(spec, OBS, ACTIONS, units=64)}
    spec['agent']['memory']['obs_dtype'] = 'float16'
    float16 = {n.what: n.nbytes for n in Replay.storage_needs(spec, OBS, ACTIONS, units=64)}
    assert float32['replay memory'] - float16['replay memory'] == 100000 * 2 * 3 * 2  # two observations of 3


def test_an_unknown_dtype_is_one_line_naming_the_key():
    spec = build_spec('DQN', max_frame=100)
    spec['agent']['memory']['obs_dtype'] = 'bfloat16'
    with pytest.raises(Exception, match=r'agent\.memory\.obs_dtype'):
        validate_spec(spec)


@pytest.mark.slow
def test_a_float16_replay_resumed_is_the_run_that_never_stopped(tmp_path):
    spec = build_spec('DoubleDQN', max_frame=300, num_envs=2)
    spec['agent']['algorithm']['training_start_step'] = 50
    spec['agent']['memory'] = {'name': 'PrioritizedReplay', 'batch_size': 32, 'max_size': 1000, 'alpha': 0.6,
                               'epsilon': 1e-4, 'obs_dtype': 'float16'}
    spec['meta'].update(snapshot_replay=True, log_frequency=100, eval_frequency=100)
    check_resume_after_max_frame(tmp_path, 'f16', spec)
