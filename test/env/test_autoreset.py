"""env.autoreset: when a vector env starts a finished sub-env's next episode. "same_step" (the
lab's default) in the step that ended it; "next_step" (gymnasium's default, and so SLM-Lab v5's
vector envs) in the step after, which the agent stores as one more transition: from the final
observation to the next episode's first, reward 0, not done."""
from __future__ import annotations

import json

import numpy as np
import pytest
from lab_helpers import check_resume_after_max_frame

from slm_lab.env import make_env
from slm_lab.persistence.run_dir import RunDir
from slm_lab.experiment.session import Session
from slm_lab.experiment.trial import Trial
from slm_lab.lib.errors import SpecError
from slm_lab.spec import validate_spec

DQN = {
    'agent': {'name': 'DQN',
              'algorithm': {'name': 'DQN', 'training_frequency': 16, 'training_start_step': 64,
                            'explore_var_spec': {'name': 'linear_decay', 'start_val': 1.0, 'end_val': 0.1,
                                                 'start_step': 0, 'end_step': 500}},
              'memory': {'name': 'Replay', 'batch_size': 32, 'max_size': 5000},
              'net': {'type': 'MLPNet', 'hid_layers': [32], 'optim_spec': {'name': 'Adam', 'lr': 0.001}}},
    'env': {'name': 'CartPole-v1', 'num_envs': 2, 'max_frame': 600, 'autoreset': 'next_step'},
    'meta': {'log_frequency': 200, 'eval_frequency': 600, 'random_seed': 5},
}


def dqn(**env) -> dict:
    spec = json.loads(json.dumps(DQN))
    spec['env'].update(env)
    return spec


def test_same_step_is_the_default_and_the_saved_spec_says_so():
    spec = dqn()
    del spec['env']['autoreset']
    assert validate_spec(spec)['env']['autoreset'] == 'same_step'


def test_next_step_is_for_gymnasiums_vector_envs():
    with pytest.raises(SpecError, match=r'^env\.autoreset: "next_step" is for gymnasium\'s vector envs.*'
                                        r'set vector_backend to "gymnasium" \(or null\)'):
        validate_spec(dqn(name='PongNoFrameskip-v4', num_envs=4, vector_backend='ale'))
    # an Atari game with several envs, whose vector env would be ALE's, runs in gymnasium's
    assert validate_spec(dqn(name='PongNoFrameskip-v4', num_envs=4))['env']['vector_backend'] == 'gymnasium'


def test_the_step_after_an_episode_ends_starts_the_next_with_reward_0():
    env_spec = validate_spec(dqn())['env']
    env = make_env(env_spec)
    try:
        env.reset(seed=1)
        rng = np.random.default_rng(0)
        ended = 0
        for _ in range(200):
            next_obs, reward, terminated, truncated, info = env.step(rng.integers(0, 2, size=2))
            assert '_final_obs' not in info, 'next_step: the final observation is the step\'s own'
            done = terminated | truncated
            if done.any():
                ended += int(done.sum())
                final = next_obs[done].copy()
                after, reward2, term2, trunc2, _ = env.step(rng.integers(0, 2, size=2))
                assert (reward2[done] == 0).all() and not term2[done].any() and not trunc2[done].any()
                assert not np.array_equal(after[done], final)  # the next episode's first observation
        assert ended >= 2
    finally:
        env.close()


def session_memory(tmp_path, spec: dict):
    spec = validate_spec(spec)
    run_dir = RunDir(tmp_path, 'autoreset')
    run_dir.create()
    session = Session(Trial(spec, run_dir, 'train').session_spec(0), run_dir, 'train', 0, 0)
    try:
        session.run()
    finally:
        session.close()
    return session.agent.memory


@pytest.mark.parametrize('mode', ['next_step', 'same_step'])
def test_the_agent_stores_the_reset_step_as_one_more_transition(tmp_path, mode):
    memory = session_memory(tmp_path, dqn(autoreset=mode))
    n = 2  # sub-env e's transition of step t is row t * n + e
    rows = memory.size
    assert rows == 600
    states, next_states = memory.states[:rows], memory.next_states[:rows]
    rewards, terminateds = memory.rewards[:rows], memory.terminateds[:rows]
    ends = np.flatnonzero(terminateds[:-n])  # CartPole's episodes end by termination in 600 frames
    assert len(ends) >= 3
    for i in ends:
        j = i + n  # the same sub-env's next transition
        if mode == 'next_step':  # from the final observation to the next episode's first, reward 0, not done
            assert np.array_equal(states[j], next_states[i]) and rewards[j] == 0 and terminateds[j] == 0
        else:  # the next episode's first step: reward 1, from an observation of its own
            assert not np.array_equal(states[j], next_states[i]) and rewards[j] == 1
    if mode == 'same_step':
        assert (rewards == 1).all()
    else:  # one per episode end, but for those of the last step
        assert (rewards == 0).sum() == len(ends)


@pytest.mark.slow
def test_a_next_step_run_resumed_is_the_run_that_never_stopped(tmp_path):
    """The vector env's record of which sub-envs reset in the next step is in its snapshot: the
    stop falls right after an episode ended (a step found in a first run, whose frames the
    others repeat), so the resumed run's first step is that sub-env's reset step."""
    spec = dqn()
    spec['meta'].update(snapshot_replay=True, log_frequency=100, eval_frequency=100)
    memory = session_memory(tmp_path / 'probe', spec)
    step = next(i // 2 for i in np.flatnonzero(memory.terminateds[:memory.size]) if i >= 100)
    stop = int(2 * (step + 1))  # the end of the step that ended the episode
    # records at the stop and at twice it, as the run that never stopped writes them (the evaluations
    # play an env of their own: the training's steps stay those of the first run)
    spec['env']['max_frame'] = stop
    spec['meta'].update(log_frequency=stop, eval_frequency=stop)
    check_resume_after_max_frame(tmp_path, 'autoreset', spec)
