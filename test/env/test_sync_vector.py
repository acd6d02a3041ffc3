"""env/sync.py: the lab's SyncVectorEnv steps as gymnasium's does (observations, rewards, ends and
the infos of the steps that end an episode), without the sub-envs' per-step infos; a snapshot of
either restores into the other."""
from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest

from slm_lab.env import make_env
from slm_lab.env.schema import check_env
from slm_lab.env.sync import SyncVectorEnv
from slm_lab.persistence.env_state import load_vector_env_state_dict, vector_env_state_dict

SAME_STEP = gym.vector.AutoresetMode.SAME_STEP


def both(name: str, n: int, mode=SAME_STEP, **kwargs):
    fns = [lambda: gym.make(name, **kwargs)] * n
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=mode), SyncVectorEnv(fns, autoreset_mode=mode)


def assert_same_outputs(theirs, ours, steps: int, seed: int = 4) -> int:
    """Steps both with the same random actions; returns how many episodes ended."""
    obs_a, info_a = theirs.reset(seed=seed)
    obs_b, info_b = ours.reset(seed=seed)
    assert np.array_equal(obs_a, obs_b)
    theirs.action_space.seed(seed)
    ended = 0
    for _ in range(steps):
        actions = theirs.action_space.sample()
        a, b = theirs.step(actions), ours.step(actions)
        for x, y in zip(a[:4], b[:4]):
            assert x.dtype == y.dtype and np.array_equal(x, y)
        assert b[0] is not ours._observations  # a copy, as gymnasium's (copy=True)
        ends = [k for k in a[4] if k.startswith(('final', '_final'))]
        assert sorted(ends) == sorted(k for k in b[4] if k.startswith(('final', '_final')))
        if ends:
            ended += int(a[4]['_final_obs'].sum())
            assert np.array_equal(a[4]['_final_obs'], b[4]['_final_obs'])
            for i in np.flatnonzero(a[4]['_final_obs']):
                assert np.array_equal(a[4]['final_obs'][i], b[4]['final_obs'][i])
            for key, value in a[4]['final_info'].items():
                assert np.array_equal(value, b[4]['final_info'][key]), key
    return ended


@pytest.mark.parametrize('name,n,steps', [('Hopper-v5', 2, 1500), ('Pendulum-v1', 3, 600), ('Acrobot-v1', 2, 1200),
                                          ('CartPole-v1', 3, 800)])
def test_it_steps_as_gymnasiums_sync_vector_env(name, n, steps):
    theirs, ours = both(name, n)
    assert ours._lean
    assert assert_same_outputs(theirs, ours, steps) > 0


def test_a_sub_envs_per_step_info_is_left_out_and_its_last_kept():
    theirs, ours = both('Hopper-v5', 1)
    theirs.reset(seed=0)
    ours.reset(seed=0)
    action = np.zeros((1, 3), dtype=np.float32)
    assert 'x_position' in theirs.step(action)[4] and ours.step(action)[4] == {}
    for _ in range(2000):  # Hopper standing still falls over: its final step's info is in final_info
        _, _, terminated, truncated, info = ours.step(action)
        if terminated[0] or truncated[0]:
            assert {'x_position', 'reward_forward'} <= set(info['final_info'])
            break
    else:
        pytest.fail('no episode ended')


def test_other_autoreset_modes_take_gymnasiums_step():
    theirs, ours = both('CartPole-v1', 2, gym.vector.AutoresetMode.NEXT_STEP)
    assert not ours._lean
    theirs.reset(seed=1)
    ours.reset(seed=1)
    for _ in range(200):
        actions = np.array([1, 0])
        a, b = theirs.step(actions), ours.step(actions)
        for x, y in zip(a[:4], b[:4]):
            assert np.array_equal(x, y)
        assert a[4].keys() == b[4].keys()


def recorded(cls):
    """Two Pendulums in a vector env of `cls` under RecordEpisodeStatistics, as make_env builds it."""
    return gym.wrappers.vector.RecordEpisodeStatistics(cls([lambda: gym.make('Pendulum-v1')] * 2,
                                                           autoreset_mode=SAME_STEP))


def test_its_snapshot_and_gymnasiums_restore_into_each_other():
    env_spec = check_env({'name': 'Pendulum-v1', 'max_frame': 1000, 'num_envs': 2})
    assert type(make_env(env_spec).unwrapped) is SyncVectorEnv
    gymnasiums = gym.vector.SyncVectorEnv
    for source_cls, target_cls in ((gymnasiums, SyncVectorEnv), (SyncVectorEnv, gymnasiums)):
        source, target = recorded(source_cls), recorded(target_cls)
        source.reset(seed=3)
        for _ in range(150):
            source.step(np.full((2, 1), 0.5, dtype=np.float32))
        assert load_vector_env_state_dict(target, copy.deepcopy(vector_env_state_dict(source)))
        for _ in range(300):  # past the time limit (200 steps): the episodes and their ends continue
            actions = np.full((2, 1), -0.25, dtype=np.float32)
            a, b = source.step(actions), target.step(actions)
            for x, y in zip(a[:4], b[:4]):
                assert np.array_equal(x, y)
