"""Box actions whose bounds are not [-1, 1]: the agent acts in [-1, 1] and the env rescales, as
SLM-Lab v5 does; the env clips what lies beyond the bounds."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from slm_lab.env import agent_action_space, make_env, make_single_env, rescales_actions


def torques(env: gym.vector.VectorEnv) -> list[float]:
    return [float(sub.unwrapped.last_u) for sub in env.unwrapped.envs]


def test_pendulum_agent_acts_in_unit_range_and_the_env_gets_its_torque_range():
    env = make_env({'name': 'Pendulum-v1', 'num_envs': 3, 'max_frame': 100})
    space = agent_action_space(env)
    assert (space.low.tolist(), space.high.tolist(), space.dtype) == ([-1.0], [1.0], np.float32)
    env.reset(seed=0)
    env.step(np.array([[0.5], [-0.25], [3.0]], np.float32))
    assert torques(env) == [1.0, -0.5, 2.0]  # 3.0 is clipped to the bound 1.0, then rescaled to 2.0


def test_the_single_env_of_evaluation_and_replay_rescales_too():
    env = make_single_env({'name': 'Pendulum-v1', 'max_frame': 100})
    assert agent_action_space(env).high.tolist() == [1.0]
    env.reset(seed=0)
    env.step(np.array([-0.75], np.float32))
    assert float(env.unwrapped.last_u) == -1.5


@pytest.mark.parametrize('space,rescaled', [
    (gym.spaces.Box(-2.0, 2.0, (1,), np.float32), True),
    (gym.spaces.Box(-0.4, 0.4, (17,), np.float32), True),  # MuJoCo Humanoid
    (gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 1.0], np.float32)), True),
    (gym.spaces.Box(-1.0, 1.0, (2,), np.float32), False),  # LunarLanderContinuous, most of MuJoCo
    (gym.spaces.Box(-np.inf, np.inf, (2,), np.float32), False),  # nothing to rescale onto
    (gym.spaces.Discrete(3), False),
])
def test_which_spaces_are_rescaled(space, rescaled):
    assert rescales_actions(space) is rescaled


def test_an_env_already_in_unit_range_is_left_as_it_is():
    env = make_env({'name': 'MountainCarContinuous-v0', 'num_envs': 1, 'max_frame': 100})
    assert agent_action_space(env) == env.unwrapped.single_action_space
    wrappers = []
    while hasattr(env, 'env'):
        wrappers.append(type(env).__name__)
        env = env.env
    assert 'RescaleAction' not in wrappers and 'ClipAction' in wrappers

