"""Algorithm details a user relies on without seeing them: every sample trained on, actions drawn
from the policy that is trained, the reward scale discounted with the algorithm's gamma, return
normalisation, observations of any Box shape, and tensors kept on the net's device."""
from __future__ import annotations

import json
import os
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import make_agent, make_algorithm

from slm_lab.persistence import snapshot as checkpoint
from slm_lab.agent.algorithm import policy_util
from slm_lab.agent.algorithm.reinforce import scale_returns
from slm_lab.agent.net import MLPNet
from slm_lab.lib.errors import SpecError
from slm_lab.spec import validate_spec

NET = {'type': 'MLPNet', 'hid_layers': [8]}


def small_spec(algorithm: dict, memory: dict) -> dict:
    """A spec of `algorithm` and `memory` with a small MLP."""
    return {'agent': {'algorithm': algorithm, 'memory': memory, 'net': NET},
            'env': {'name': 'CartPole-v1', 'max_frame': 1000}}


def test_ppo_trains_on_every_sample_each_epoch(monkeypatch):
    # batch 5 steps x 2 envs = 10 samples, minibatch 4: minibatches of 4, 4 and 2 in each epoch
    agent, _ = make_agent(small_spec({'name': 'PPO', 'time_horizon': 5, 'minibatch_size': 4, 'training_epoch': 3},
                                     {'name': 'OnPolicyBatchReplay'}), obs_dim=4, num_envs=2)
    model = agent.algorithm.model
    sizes, forward = [], model.pd_out_and_value
    monkeypatch.setattr(model, 'pd_out_and_value', lambda x, **kw: (sizes.append(len(x)), forward(x, **kw))[1])
    rng = np.random.default_rng(0)
    for step in range(5):
        agent.update(rng.normal(size=(2, 4)).astype(np.float32), np.array([0, 1]), np.ones(2, np.float32),
                     rng.normal(size=(2, 4)).astype(np.float32), np.zeros(2, bool), np.zeros(2, bool))
    assert sizes == [10] + [4, 4, 2] * 3  # the old policy and V(s) over the batch once, then the epochs
    assert agent.algorithm.clock.opt_step == 9


@pytest.mark.parametrize('algorithm,memory', [('PPO', 'OnPolicyBatchReplay'), ('Reinforce', 'OnPolicyReplay')])
@pytest.mark.parametrize('policy', ['epsilon_greedy', 'boltzmann'])
def test_policy_gradient_refuses_actions_not_drawn_from_its_policy(algorithm, memory, policy):
    spec = {'agent': {'algorithm': {'name': algorithm, 'action_policy': policy,
                                    'explore_var_spec': {'name': 'no_decay', 'start_val': 0.1}},
                      'memory': {'name': memory}, 'net': NET},
            'env': {'name': 'CartPole-v1', 'max_frame': 1000}}
    with pytest.raises(SpecError) as e:
        validate_spec(spec)
    message = str(e.value)
    assert message.startswith('agent.algorithm.action_policy:') and '\n' not in message
    assert f"'{policy}'" in message and 'sampled from the policy' in message and 'use "default"' in message


@pytest.mark.parametrize('algorithm,memory', [('PPO', 'OnPolicyBatchReplay'), ('Reinforce', 'OnPolicyReplay')])
def test_policy_gradient_refuses_argmax_actions(algorithm, memory):
    spec = {'agent': {'algorithm': {'name': algorithm, 'action_pdtype': 'Argmax'}, 'memory': {'name': memory},
                      'net': NET},
            'env': {'name': 'CartPole-v1', 'max_frame': 1000}}
    with pytest.raises(SpecError, match=r"^agent\.algorithm\.action_pdtype: 'Argmax' does not fit"):
        validate_spec(spec)


def test_dqn_keeps_its_exploring_action_policies():
    for policy in ('epsilon_greedy', 'boltzmann'):
        spec = validate_spec({'agent': {'algorithm': {'name': 'DQN', 'action_policy': policy},
                                        'memory': {'name': 'Replay'}, 'net': NET},
                              'env': {'name': 'CartPole-v1', 'max_frame': 1000}})
        assert spec['agent']['algorithm']['action_policy'] == policy


@pytest.mark.parametrize('name,keys,anew', [('VanillaDQN', {}, True), ('DQN', {'double_q': False}, False),
                                            ('DQN', {}, True), ('DoubleDQN', {}, True)])
def test_dqn_targets_are_computed_again_before_each_step_on_a_batch_when_the_online_net_picks(name, keys, anew):
    """training_batch_iter steps on one batch: the y of VanillaDQN, DoubleDQN and DQN with
    double_q (its default) depend on the online net, which each step moves, so y is computed again
    before each step (as SLM-Lab computes the loss anew); the y of DQN without double_q, from the
    target net alone, is the same for all of them."""
    agent, _ = make_agent(small_spec({'name': name, 'training_iter': 1, 'training_batch_iter': 3,
                                      'training_start_step': 1, 'gamma': 0.9, **keys},
                                     {'name': 'Replay', 'batch_size': 16, 'max_size': 100}), obs_dim=4, num_envs=2)
    alg = agent.algorithm
    rng = np.random.default_rng(0)
    for _ in range(10):
        obs = rng.normal(size=(2, 4)).astype(np.float32)
        alg.memory.add(obs, rng.integers(0, 2, 2), np.ones(2), obs + 0.1, np.zeros(2, bool), np.zeros(2, bool))
    seen, compute = [], alg.q_targets
    alg.q_targets = lambda *args: (seen.append(compute(*args)), seen[-1])[1]
    torch.manual_seed(0)
    alg.train()
    assert len(seen) == (3 if anew else 1)
    if name == 'VanillaDQN':  # its y is the online net's max, which the first step moved
        assert not torch.equal(seen[0], seen[1])


def test_scale_returns():
    returns = torch.tensor([2.0, 4.0, 6.0])  # mean 4, sample std 2
    torch.testing.assert_close(scale_returns(returns, center=False, normalize=False), returns)
    torch.testing.assert_close(scale_returns(returns, center=True, normalize=False), torch.tensor([-2.0, 0.0, 2.0]))
    torch.testing.assert_close(scale_returns(returns, center=False, normalize=True), torch.tensor([1.0, 2.0, 3.0]))
    torch.testing.assert_close(scale_returns(returns, center=True, normalize=True), torch.tensor([-1.0, 0.0, 1.0]))
    torch.testing.assert_close(scale_returns(torch.tensor([5.0]), center=False, normalize=True), torch.tensor([5.0]))


def test_reinforce_normalize_return_works_without_center_return():
    # normalised returns do not depend on the returns' scale: two identical agents given returns
    # R and 3R take the same loss
    algorithm = {'name': 'Reinforce', 'center_return': False, 'normalize_return': True}
    states = np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32)
    actions, returns = np.array([0, 1, 1, 0]), np.array([1.0, 2.0, 4.0, 3.0], np.float32)
    losses = [make_algorithm(small_spec(algorithm, {'name': 'OnPolicyReplay'})).train(states, actions,
                                                                                     scale * returns)['loss']
              for scale in (1.0, 3.0)]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_reward_normalisation_discounts_with_the_algorithms_gamma(lab_run, make_spec):
    spec = make_spec('PPO', max_frame=64)
    spec['agent']['algorithm']['gamma'] = 0.9
    spec['env']['normalize_reward'] = True
    _, run_dir = lab_run(spec, 'ppo_gamma')
    state, _ = checkpoint.load_snapshot(checkpoint.list_snapshots(run_dir / 'ckpt' / 'ppo_gamma_t0_s0')[0])
    layers = [layer for layer in state['env']['layers'] if 'return_rms' in layer]
    assert len(layers) == 1 and layers[0]['gamma'] == pytest.approx(0.9)


def test_random_baseline_plays_the_runs_episodes(lab_run, make_spec, tmp_path, monkeypatch):
    # with max_t 5 every CartPole episode is truncated at 5 steps (+1 each): a baseline of 5.0;
    # played here, in a cache directory of its own (the suite's is shared and may hold it already)
    monkeypatch.setenv('SLM_LAB_CACHE_DIR', str(tmp_path / 'lab_cache'))
    spec = make_spec('Random', max_frame=64)
    spec['env']['max_t'] = 5
    _, run_dir = lab_run(spec, 'random_max_t')
    metrics = json.loads((run_dir / 'info' / 'random_max_t_t0_s0_session_metrics.json').read_text())
    assert metrics['random_baseline'] == 5.0
    # kept for later runs in the lab's cache (the suite's: SLM_LAB_CACHE_DIR), keyed by the env's max_t
    cached = [json.loads(p.read_text()) for p in Path(os.environ['SLM_LAB_CACHE_DIR']).glob('random_baseline_*.json')]
    assert {'max_t': 5, 'name': 'CartPole-v1', 'make_kwargs': {}, 'value': 5.0} in [
        {**c['key']['env'], 'value': c['random_baseline']} for c in cached]


# --- observations of any Box shape ------------------------------------------------------------

GRID_ENV = 'SlmLabTestCartPoleGrid-v0'


def _cartpole_grid(**kwargs) -> gym.Env:
    """CartPole with its 4 numbers given as a 2x2 Box: an observation with two dimensions."""
    return gym.wrappers.ReshapeObservation(gym.make('CartPole-v1', **kwargs), (2, 2))


@pytest.fixture(scope='module')
def grid_env():
    gym.register(GRID_ENV, entry_point=_cartpole_grid)
    yield GRID_ENV
    del gym.envs.registry[GRID_ENV]


def test_mlp_flattens_observations_of_any_shape():
    torch.manual_seed(0)
    net = MLPNet({**validate_spec({'agent': {'algorithm': {'name': 'DQN'}, 'memory': {'name': 'Replay'},
                                             'net': NET},
                                   'env': {'name': 'CartPole-v1', 'max_frame': 10}})['agent']['net']}, 6, 3)
    x = torch.randn(5, 2, 3)
    torch.testing.assert_close(net(x), net(x.reshape(5, 6)))
    assert net(x).shape == (5, 3)


@pytest.mark.parametrize('algorithm,memory', [('PPO', None), ('DQN', None), ('Reinforce', 'OnPolicyBatchReplay')])
def test_two_dimensional_observations_train_end_to_end(lab_run, make_spec, grid_env, algorithm, memory):
    spec = make_spec(algorithm, env=grid_env, max_frame=128, num_envs=2)
    spec['env']['normalize_obs'] = True
    if memory:
        spec['agent']['memory'] = {'name': memory}
        spec['agent']['algorithm']['training_frequency'] = 16
    name = f'grid_{algorithm.lower()}'
    _, run_dir = lab_run(spec, name)
    metrics = json.loads((run_dir / 'info' / f'{name}_t0_s0_session_metrics.json').read_text())
    assert metrics['train']['local']['frame'][-1] == 128
    state, _ = checkpoint.load_snapshot(checkpoint.list_snapshots(run_dir / 'ckpt' / f'{name}_t0_s0')[0])
    assert state['clock']['opt_step'] > 0


# --- devices ----------------------------------------------------------------------------------

def test_epsilon_greedy_actions_stay_on_the_nets_device():
    # a 'meta' tensor stands for a GPU one: torch.where refuses to mix it with CPU tensors
    out = torch.zeros(3, 2, device='meta')
    head = policy_util.PolicyHead('Categorical', 2)
    actions = policy_util.sample_actions(out, head, 'epsilon_greedy', 1.0, np.random.default_rng(0), 2)
    assert actions.device == out.device and actions.shape == (3,)
    cpu_actions = policy_util.sample_actions(torch.zeros(3, 2), head, 'epsilon_greedy', 1.0,
                                             np.random.default_rng(0), 2)
    assert cpu_actions.device.type == 'cpu' and set(cpu_actions.tolist()) <= {0, 1}


@pytest.mark.parametrize('memory', ['OnPolicyReplay', 'OnPolicyBatchReplay'])
def test_on_policy_memories_ignore_the_replay_keys_slm_lab_specs_give_them_and_refuse_typos(memory):
    # SLM-Lab's videopinball REINFORCE and SARSA specs give OnPolicyReplay a batch_size, which
    # its on-policy memories do not read: accepted (and kept in the saved spec), unused
    keys = {'batch_size': 64, 'max_size': 10000, 'use_cer': True}
    spec = validate_spec({'agent': {'algorithm': {'name': 'Reinforce'}, 'memory': {'name': memory, **keys},
                                    'net': NET}, 'env': {'name': 'CartPole-v1', 'max_frame': 1000}})
    assert {k: spec['agent']['memory'][k] for k in keys} == keys
    with pytest.raises(SpecError, match=r"^agent\.memory\.batchsize: unknown key.*did you mean 'batch_size'"):
        validate_spec({'agent': {'algorithm': {'name': 'Reinforce'}, 'memory': {'name': memory, 'batchsize': 64},
                                 'net': NET}, 'env': {'name': 'CartPole-v1', 'max_frame': 1000}})
