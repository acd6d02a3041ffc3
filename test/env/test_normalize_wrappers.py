"""The lab's normalisation wrappers compute what gymnasium's do, number for number: the reward
wrapper's lean same-step path and the one-sample running statistics (env/wrappers.py)."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers.utils import RunningMeanStd as GymRunningMeanStd

from slm_lab.env import make_env
from slm_lab.env.wrappers import NormalizeReward, RunningMeanStd


@pytest.mark.parametrize('shape,dtype', [((), np.float64), ((3,), np.float32), ((2, 2), np.float64)])
def test_running_statistics_of_one_sample_at_a_time_equal_gymnasiums(shape, dtype):
    ours, theirs = RunningMeanStd(shape=shape, dtype=dtype), GymRunningMeanStd(shape=shape, dtype=dtype)
    rng = np.random.default_rng(0)
    for n in [1] * 500 + [4, 1, 3]:  # a batch of several rows goes through gymnasium's own update
        x = (rng.standard_normal((n, *shape)) * 5 + 2).astype(np.float32)
        ours.update(x)
        theirs.update(x)
        for a, b in ((ours.mean, theirs.mean), (ours.var, theirs.var)):
            assert np.asarray(a).dtype == np.asarray(b).dtype and np.asarray(a).tobytes() == np.asarray(b).tobytes()
        assert ours.count == theirs.count


@pytest.mark.parametrize('num_envs', [1, 3])
def test_normalized_rewards_equal_gymnasiums_through_episode_ends(num_envs):
    spec = {'name': 'CartPole-v1', 'num_envs': num_envs, 'max_frame': 1000}
    ours = NormalizeReward(make_env(spec), gamma=0.9)
    theirs = gym.wrappers.vector.NormalizeReward(make_env(spec), gamma=0.9)
    ours.reset(seed=1)
    theirs.reset(seed=1)
    rng = np.random.default_rng(0)
    ends = 0
    for _ in range(300):
        actions = rng.integers(0, 2, num_envs)
        _, r1, term1, trunc1, _ = ours.step(actions)
        _, r2, *_ = theirs.step(actions)
        assert np.array_equal(r1, r2) and r1.dtype == r2.dtype
        assert np.array_equal(ours.accumulated_reward, theirs.accumulated_reward)
        ends += int(np.logical_or(term1, trunc1).sum())
    assert ends > 5
    assert ours.return_rms.mean == theirs.return_rms.mean and ours.return_rms.var == theirs.return_rms.var


def test_a_normalised_env_uses_the_lab_wrappers():
    env = make_env({'name': 'Pendulum-v1', 'num_envs': 2, 'max_frame': 100, 'normalize_obs': True,
                    'normalize_reward': True})
    assert type(env).__name__ == 'NormalizeReward' and isinstance(env, NormalizeReward)
    assert isinstance(env.return_rms, RunningMeanStd) and isinstance(env.env.obs_rms, RunningMeanStd)


def test_a_snapshot_of_gymnasiums_reward_wrapper_continues_exactly_in_the_labs():
    """A run saved before the lab had its own NormalizeReward (gymnasium's in the chain) resumes
    into this one: the same layer name and attributes, the same rewards after."""
    from slm_lab.persistence.env_state import load_vector_env_state_dict, vector_env_state_dict
    spec = {'name': 'Pendulum-v1', 'num_envs': 2, 'max_frame': 1000, 'normalize_obs': True}
    before = gym.wrappers.vector.NormalizeReward(make_env(spec), gamma=0.95)
    before.reset(seed=4)
    actions = np.random.default_rng(2).uniform(-1, 1, (60, 2, 1)).astype(np.float32)
    for a in actions[:30]:
        before.step(a)
    after = NormalizeReward(make_env(spec), gamma=0.95)
    after.reset(seed=9)
    assert load_vector_env_state_dict(after, vector_env_state_dict(before))
    for a in actions[30:]:
        o1, r1, *_ = before.step(a)
        o2, r2, *_ = after.step(a)
        assert np.array_equal(o1, o2) and np.array_equal(r1, r2)
