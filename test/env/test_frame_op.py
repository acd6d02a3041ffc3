"""env.frame_op "concat" (SLM-Lab v4's frame stacking for vector observations): what the agent
sees, where it is refused, and that a run with it resumes exactly (the stack is env state)."""
from __future__ import annotations

from collections import deque
from pathlib import Path

import numpy as np
import pytest

from slm_lab.env import make_env, make_single_env
from slm_lab.lib.errors import SpecError
from slm_lab.spec import validate_spec
from lab_helpers import check_resume_after_max_frame


def concat_spec(n: int = 3, num_envs: int = 2) -> dict:
    return {'name': 'CartPole-v1', 'num_envs': num_envs, 'frame_op': 'concat', 'frame_op_len': n}


def test_concat_joins_the_last_n_observations_of_each_env_across_episode_ends():
    # the same sub-envs without stacking, stepped with the same actions, give the expected stacks:
    # oldest first, the first observation of an episode repeated, the final observation of an
    # episode (info['final_obs']) stacked with the frames before it
    n, num_envs = 3, 2
    stacked, plain = make_env(concat_spec(n, num_envs)), make_env({'name': 'CartPole-v1', 'num_envs': num_envs})
    assert stacked.single_observation_space.shape == (4 * n,)
    obs, _ = stacked.reset(seed=7)
    raw, _ = plain.reset(seed=7)
    queues = [deque([raw[i]] * n, maxlen=n) for i in range(num_envs)]
    rng = np.random.default_rng(0)
    ends = 0
    for _ in range(120):
        for i in range(num_envs):
            np.testing.assert_array_equal(obs[i], np.concatenate(queues[i]))
        actions = rng.integers(0, 2, size=num_envs)
        obs, _, terminated, truncated, info = stacked.step(actions)
        raw, _, raw_terminated, raw_truncated, raw_info = plain.step(actions)
        np.testing.assert_array_equal(terminated, raw_terminated)
        for i in range(num_envs):
            if terminated[i] or truncated[i]:
                ends += 1
                queues[i].append(raw_info['final_obs'][i])
                np.testing.assert_array_equal(info['final_obs'][i], np.concatenate(queues[i]))
                queues[i] = deque([raw[i]] * n, maxlen=n)
            else:
                queues[i].append(raw[i])
    assert ends >= 4  # random CartPole episodes are short: several resets were checked


def test_replay_env_stacks_as_training_did():
    env = make_single_env(concat_spec(4))
    obs, _ = env.reset(seed=1)
    assert obs.shape == (16,)
    np.testing.assert_array_equal(obs[:4], obs[12:])
    nxt, *_ = env.step(0)
    np.testing.assert_array_equal(nxt[:12], obs[4:])


def test_frame_op_without_frame_op_len_names_the_missing_key(make_spec):
    spec = make_spec('DQN')
    spec['env']['frame_op'] = 'concat'
    with pytest.raises(SpecError, match=r'^env\.frame_op_len: env\.frame_op "concat" needs frame_op_len'):
        validate_spec(spec)


def test_stack_waits_for_the_recurrent_net(make_spec):
    spec = make_spec('DQN')
    spec['env'].update(frame_op='stack', frame_op_len=4)
    with pytest.raises(SpecError, match=r"^env\.frame_op: \"stack\" .*RecurrentNet\) is not available yet"):
        validate_spec(spec)


def test_concat_of_atari_frames_stacks_them_and_of_other_images_is_not_available_yet():
    pytest.importorskip('ale_py')
    env = make_env({'name': 'ALE/Pong-v5', 'num_envs': 1, 'frame_op': 'concat', 'frame_op_len': 3})
    try:
        assert env.single_observation_space.shape == (3, 84, 84)
    finally:
        env.close()
    pytest.importorskip('Box2D')
    with pytest.raises(SpecError, match=r'^env\.frame_op: frame stacking of \(96, 96, 3\) observations .* '
                                        r'not available yet.*use null$'):
        make_env({'name': 'CarRacing-v3', 'num_envs': 1, 'frame_op': 'concat', 'frame_op_len': 4})


@pytest.mark.parametrize('algorithm', ['DQN', 'ActorCritic'])
def test_a_run_with_concat_trains_on_the_joined_observations(lab_run, make_spec, algorithm):
    spec = make_spec(algorithm, max_frame=200)
    spec['env'].update(frame_op='concat', frame_op_len=4)
    _, run = lab_run(spec, 'concat')
    import torch
    model = torch.load(Path(run, 'model', 'concat_t0_s0_model_latest.pt'), weights_only=False)
    for weights in model['nets'].values():  # each net reads 4 CartPole observations
        first = next(v for k, v in weights.items() if k.endswith('weight'))
        assert first.shape[1] == 16


@pytest.mark.slow
def test_a_run_with_concat_resumes_mid_episode_exactly(tmp_path, make_spec, no_png):
    # the stacks of the unfinished episodes are in the env snapshot: resumed == uninterrupted
    spec = make_spec('DQN', max_frame=300, num_envs=2, log_frequency=100)
    spec['env'].update(frame_op='concat', frame_op_len=3)
    spec['meta']['snapshot_replay'] = True  # the replay holds stacked observations too
    check_resume_after_max_frame(tmp_path, 'concat_resume', spec)
