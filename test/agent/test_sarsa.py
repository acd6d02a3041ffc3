"""SARSA: its targets on hand-computed batches (terminated vs truncated), the step held back until
its next action is known, OnPolicyCrossEntropy's episode filter, and exact resume."""
from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
import torch

from slm_lab.agent import Agent
from slm_lab.agent.algorithm.sarsa import next_actions_in_episodes, policy_probs, sarsa_targets
from slm_lab.agent.memory.onpolicy import OnPolicyCrossEntropy, elite_episodes
from slm_lab.env import Clock
from slm_lab.lib.errors import SpecError
from slm_lab.spec import validate_spec
from conftest import make_agent, make_algorithm
from lab_helpers import check_resume_after_sigterm


def t(values) -> torch.Tensor:
    return torch.tensor(np.asarray(values), dtype=torch.float32)


def sarsa_spec(memory: str = 'OnPolicyBatchReplay', training_frequency: int = 2, num_envs: int = 1,
               action_policy: str = 'epsilon_greedy', epsilon: float = 0.5, hid_layers=(32,), max_frame: int = 1000,
               **memory_keys) -> dict:
    return {
        'agent': {'name': 'SARSA',
                  'algorithm': {'name': 'SARSA', 'action_pdtype': 'Argmax', 'action_policy': action_policy,
                                'explore_var_spec': {'name': 'no_decay', 'start_val': epsilon},
                                'gamma': 0.5, 'training_frequency': training_frequency},
                  'memory': {'name': memory, **memory_keys},
                  'net': {'type': 'MLPNet', 'hid_layers': list(hid_layers), 'hid_layers_activation': 'tanh',
                          'optim_spec': {'name': 'SGD', 'lr': 0.01}}},
        'env': {'name': 'CartPole-v1', 'num_envs': num_envs, 'max_frame': max_frame},
        'meta': {'log_frequency': 250, 'eval_frequency': 500, 'random_seed': 3},
    }


# --- the maths -------------------------------------------------------------------------------------

def test_sarsa_targets_bootstrap_from_the_next_action_and_the_policy_after_truncation():
    # gamma 0.5, r = 1 each; step 0 goes on: 1 + 0.5 * Q(s', a') = 1 + 0.5*2 = 2
    # step 1 terminated: 1 (no bootstrap, whatever Q says)
    # step 2 truncated: no a' was taken at its final observation, so E_pi Q(s', .) = 3: 1 + 0.5*3 = 2.5
    # step 3 terminated and truncated at once: terminated wins, 1
    y = sarsa_targets(t([1, 1, 1, 1]), terminateds=t([0, 1, 0, 1]), truncateds=t([0, 0, 1, 1]),
                      next_q_taken=t([2, 5, 4, 7]), next_q_expected=t([10, 10, 3, 9]), gamma=0.5)
    torch.testing.assert_close(y, t([2, 1, 2.5, 1]))


def test_policy_probs_of_each_action_policy():
    q = t([[1.0, 3.0, 2.0]])
    # epsilon 0.3 over 3 actions: 0.1 each, plus 0.7 on the argmax (action 1)
    torch.testing.assert_close(policy_probs(q, 'Argmax', 'epsilon_greedy', 0.3), t([[0.1, 0.8, 0.1]]))
    # Boltzmann at tau 2: softmax([0.5, 1.5, 1.0]); with Argmax it acts greedily (SLM-Lab's rule)
    e = np.exp([0.5, 1.5, 1.0])
    torch.testing.assert_close(policy_probs(q, 'Categorical', 'boltzmann', 2.0), t([e / e.sum()]))
    torch.testing.assert_close(policy_probs(q, 'Argmax', 'boltzmann', 2.0), t([[0, 1, 0]]))
    torch.testing.assert_close(policy_probs(q, 'Argmax', 'random', float('nan')), t([[1 / 3] * 3]))
    torch.testing.assert_close(policy_probs(q, 'Argmax', 'default', float('nan')), t([[0, 1, 0]]))
    e = np.exp([1.0, 3.0, 2.0])
    torch.testing.assert_close(policy_probs(q, 'Categorical', 'default', float('nan')), t([e / e.sum()]))


def test_next_actions_stop_at_each_episode_end():
    # two episodes, [1, 0, 1] and [1, 0]: the next action within each, 0 at each last step
    next_actions = next_actions_in_episodes(np.array([1, 0, 1, 1, 0]), np.array([0, 0, 1, 0, 1.0]))
    np.testing.assert_array_equal(next_actions, [0, 1, 0, 0, 0])


def test_train_loss_on_a_net_of_known_values():
    # a net with no hidden layer, weights 0 and biases [1, 3]: Q(s, .) = [1, 3] everywhere.
    # epsilon 0.5: E_pi Q = 0.25*1 + 0.75*3 = 2.5; gamma 0.5, rewards 1
    #   step a=0 terminated:              y = 1,                q = 1, error 0
    #   step a=1 truncated:               y = 1 + 0.5*2.5 = 2.25, q = 3, error 0.75
    #   step a=0 going on, next a'=1:     y = 1 + 0.5*3 = 2.5,    q = 1, error 1.5
    # MSE = (0 + 0.5625 + 2.25) / 3 = 0.9375
    algo = make_algorithm(sarsa_spec(hid_layers=()), obs_dim=2)
    with torch.no_grad():
        for p in algo.net.parameters():
            p.zero_()
        algo.net.heads[0].bias.copy_(t([1, 3]))
    states = np.zeros((3, 2), np.float32)
    metrics = algo.train(states, np.array([0, 1, 0]), np.ones(3, np.float32), states, np.array([0, 0, 1]),
                         np.array([1, 0, 0], np.float32), np.array([0, 1, 0], np.float32))
    assert metrics['loss'] == pytest.approx(0.9375)


# --- the held-back step --------------------------------------------------------------------------

def feed(algo, steps: int, num_envs: int, start: int = 0):
    """Give the algorithm `steps` vector steps: actions 10*step + env, observations step, a
    termination in env 0 at step 2 and a truncation in env 1 at step 3."""
    for step in range(start, start + steps):
        obs = np.full((num_envs, 2), step, np.float32)
        terminated = np.array([step == 2, False])[:num_envs]
        truncated = np.array([False, step == 3])[:num_envs]
        algo.update(obs, np.arange(num_envs) + 10 * step, np.ones(num_envs, np.float32), obs + 0.5, terminated,
                    truncated)


def recording(algo) -> list[dict]:
    calls = []
    algo.train = lambda *args: calls.append(dict(zip(
        ('states', 'actions', 'rewards', 'next_states', 'next_actions', 'terminateds', 'truncateds'), args)))
    return calls


def test_the_last_step_of_a_batch_waits_for_its_next_action():
    algo = make_algorithm(sarsa_spec(training_frequency=2, num_envs=2), num_envs=2, obs_dim=2)
    calls = recording(algo)
    feed(algo, 2, num_envs=2)
    # first batch: steps 0 and 1; only step 0 knows its next action (step 1's), step 1 is held
    assert len(calls) == 1
    np.testing.assert_array_equal(calls[0]['actions'], [0, 1])
    np.testing.assert_array_equal(calls[0]['next_actions'], [10, 11])
    feed(algo, 2, num_envs=2, start=2)
    # second batch: held step 1 and step 2 (rows env 0, env 1), step 3 held
    np.testing.assert_array_equal(calls[1]['actions'], [10, 11, 20, 21])
    np.testing.assert_array_equal(calls[1]['next_actions'], [20, 21, 30, 31])
    np.testing.assert_array_equal(calls[1]['states'][:, 0], [1, 1, 2, 2])
    np.testing.assert_array_equal(calls[1]['next_states'][:, 0], [1.5, 1.5, 2.5, 2.5])
    np.testing.assert_array_equal(calls[1]['terminateds'], [0, 0, 1, 0])  # env 0 ended at step 2
    np.testing.assert_array_equal(calls[1]['truncateds'], [0, 0, 0, 0])
    feed(algo, 2, num_envs=2, start=4)
    np.testing.assert_array_equal(calls[2]['actions'], [30, 31, 40, 41])
    np.testing.assert_array_equal(calls[2]['truncateds'], [0, 1, 0, 0])  # env 1 truncated at step 3
    np.testing.assert_array_equal(calls[2]['terminateds'], [0, 0, 0, 0])


def test_the_held_step_is_in_the_state_and_comes_back():
    spec = sarsa_spec(training_frequency=2, num_envs=2)
    first = make_agent(spec, obs_dim=2, num_envs=2)[0]
    calls_a = recording(first.algorithm)
    feed(first.algorithm, 3, num_envs=2)  # step 1 held, step 2 in the memory's partial batch
    second = make_agent(spec, obs_dim=2, num_envs=2)[0]
    second.load_state_dict(first.state_dict())
    calls_b = recording(second.algorithm)
    feed(first.algorithm, 1, num_envs=2, start=3)
    feed(second.algorithm, 1, num_envs=2, start=3)
    assert len(calls_a) == 2 and len(calls_b) == 1
    for key in calls_a[1]:
        np.testing.assert_array_equal(calls_a[1][key], calls_b[0][key])
    np.testing.assert_array_equal(calls_b[0]['actions'], [10, 11, 20, 21])


def test_episodes_memory_trains_every_training_frequency_episodes():
    algo = make_algorithm(sarsa_spec(memory='OnPolicyReplay', training_frequency=1), obs_dim=2)
    calls = recording(algo)
    feed(algo, 3, num_envs=1)  # env 0 terminates at step 2: one episode of 3 steps
    assert len(calls) == 1
    np.testing.assert_array_equal(calls[0]['actions'], [0, 10, 20])
    np.testing.assert_array_equal(calls[0]['next_actions'], [10, 20, 0])
    np.testing.assert_array_equal(calls[0]['terminateds'], [0, 0, 1])


def test_sarsa_refuses_a_replay_memory_and_continuous_actions():
    spec = sarsa_spec(memory='Replay')
    with pytest.raises(SpecError, match='agent.memory.name'):
        validate_spec(spec)
    spec = sarsa_spec()
    spec['env']['name'] = 'Pendulum-v1'
    spec = validate_spec(spec)
    env = gym.make('Pendulum-v1')
    with pytest.raises(SpecError, match='continuous'):
        Agent(spec, env.observation_space, env.action_space, 1, Clock(1000, 1), seed=0)


# --- OnPolicyCrossEntropy -----------------------------------------------------------------------

def test_elite_episodes_keep_returns_at_or_above_the_percentile():
    # returns 1 5 3 2; the 50th percentile (linear) of 1 2 3 5 is 2.5: keep the returns 5 and 3
    np.testing.assert_array_equal(elite_episodes(np.array([1.0, 5.0, 3.0, 2.0]), 0.5), [1, 2])
    # 25th percentile: 1 + 0.75 * (2 - 1) = 1.75, keeps 5 3 2
    np.testing.assert_array_equal(elite_episodes(np.array([1.0, 5.0, 3.0, 2.0]), 0.25), [1, 2, 3])
    np.testing.assert_array_equal(elite_episodes(np.array([1.0, 5.0, 3.0, 2.0]), 1.0), [0, 1, 2, 3])


def test_cross_entropy_memory_samples_only_the_elite_episodes():
    obs_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    memory = OnPolicyCrossEntropy({'name': 'OnPolicyCrossEntropy', 'cross_entropy': 0.5}, obs_space,
                                  gym.spaces.Discrete(2), 2)
    obs = np.zeros((2, 1), np.float32)
    # env 0: one step of reward 1 and ends; env 1: rewards 2, 2 then ends; env 0 again: reward 0.5
    for rewards, term in (([1, 2], [True, False]), ([0.5, 2], [True, True])):
        memory.add(obs, np.zeros(2, np.int64), np.array(rewards, np.float32), obs, np.array(term),
                   np.zeros(2, bool))
    assert memory.num_finished == 3  # returns 1, 4, 0.5; median 1: keeps 1 and 4
    batch = memory.sample()
    np.testing.assert_array_equal(batch.rewards, [1, 2, 2])
    assert memory.num_finished == 0


def test_sarsa_trains_through_the_lab_on_a_cross_entropy_memory(lab_run):
    spec = sarsa_spec(memory='OnPolicyCrossEntropy', training_frequency=2, max_frame=300, cross_entropy=0.5)
    _, run = lab_run(spec, 'sarsa_ce', mode='dev')  # dev mode checks that the net's parameters moved
    assert re.search(r'DEBUG .*dev check passed', (run / 'log' / 'sarsa_ce_t0_s0.log').read_text())


# --- exact resume ---------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.subprocess
def test_sarsa_resume_after_sigterm_is_exact(tmp_path):
    spec = sarsa_spec(training_frequency=8, num_envs=2, action_policy='boltzmann', epsilon=1.0)
    check_resume_after_sigterm(tmp_path, 'sarsa_term', spec)
