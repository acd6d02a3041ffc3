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
    (gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 0.0], np.float32)), False),  # low == high
    (gym.spaces.Box(0, 10, (2,), np.int64), False),  # integer actions
    (gym.spaces.Box(-np.finfo(np.float32).max, np.finfo(np.float32).max, (2,), np.float32), False),  # "unbounded"
    (gym.spaces.Box(-3.0, 3.0, (1,), np.float64), True),
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


def test_env_snapshots_pair_wrapper_layers_by_type():
    """Env layers are restored by type, in order: a layer the snapshot has and the chain lacks
    (a wrapper an edit resumed with --force removed) is dropped, not put on its neighbour; a
    snapshot from before the types were recorded (no RescaleAction layer then) is refused when its
    number of layers differs."""
    from slm_lab.persistence.env_state import load_vector_env_state_dict, vector_env_state_dict
    from slm_lab.lib.errors import ResumeError
    spec = {'name': 'Pendulum-v1', 'num_envs': 2, 'max_frame': 100}
    env = make_env(spec)
    env.reset(seed=0)
    for _ in range(5):
        env.step(np.zeros((2, 1), np.float32))
    state = vector_env_state_dict(env)
    assert state['layer_types'] == ['ClipAction', 'RescaleAction', 'RecordEpisodeStatistics', 'SyncVectorEnv']
    returns = env.env.env.episode_returns.copy()
    assert np.all(returns != 0)
    wider = dict(state, layer_types=['ClipReward'] + state['layer_types'],
                 layers=[{'episode_returns': 'x'}] + state['layers'])
    fresh = make_env(spec)
    assert load_vector_env_state_dict(fresh, wider)  # exact: the same envs, the extra layer dropped
    np.testing.assert_array_equal(fresh.env.env.episode_returns, returns)
    older = dict(state, layers=[layer for layer, name in zip(state['layers'], state['layer_types'])
                                if name != 'RescaleAction'])
    del older['layer_types']  # as written before the types were recorded
    with pytest.raises(ResumeError, match=r"^the snapshot's env has 3 wrapper layers and the one this lab builds "
                                          r'for PendulumEnv has 4 .*start the run again with train'):
        load_vector_env_state_dict(make_env(spec), older)


@pytest.mark.parametrize('env_id,num_envs', [('Pendulum-v1', 3), ('Hopper-v5', 1), ('MountainCarContinuous-v0', 2)])
def test_the_whole_batch_action_wrappers_compute_gymnasiums_numbers(env_id, num_envs):
    """The lab's ClipAction and RescaleAction transform a batch in one expression; gymnasium's, one
    sub-env's action at a time: the same numbers and dtype, NaN and far out-of-bounds values included,
    and the same array handed back where the space is unchanged (a rescale onto the same bounds)."""
    from slm_lab.env.wrappers import ClipAction, RescaleAction
    rng = np.random.default_rng(0)

    def base():
        return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode='sync')
    space = base().single_action_space
    for low, high in [(-1.0, 1.0), (-2.0, 3.0)]:
        low, high = np.full(space.shape, low, space.dtype), np.full(space.shape, high, space.dtype)
        pairs = [(gym.wrappers.vector.ClipAction(base()), ClipAction(base())),
                 (gym.wrappers.vector.RescaleAction(base(), low, high), RescaleAction(base(), low, high)),
                 (gym.wrappers.vector.ClipAction(gym.wrappers.vector.RescaleAction(base(), low, high)),
                  ClipAction(RescaleAction(base(), low, high)))]
        for theirs, ours in pairs:
            assert type(ours).__name__ == type(theirs).__name__  # snapshots name the layers
            assert ours.action_space == theirs.action_space
            for dtype in (np.float32, np.float64):
                for scale in (0.5, 3.0, 1e30):
                    x = (rng.standard_normal((num_envs, *space.shape)) * scale).astype(dtype)
                    x.flat[0] = np.nan
                    xa, xb = x.copy(), x.copy()
                    a, b = theirs.actions(xa), ours.actions(xb)
                    assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
                    assert xa.tobytes() == xb.tobytes() and (a is xa) == (b is xb)
