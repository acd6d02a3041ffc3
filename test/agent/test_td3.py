"""TD3: its maths on batches small enough to check by hand (the clipped double-Q target, target
policy smoothing, terminated vs truncated), what it stores and how it trains (delayed policy
updates, polyak targets, exploration noise in the bounds), its state and exact resume."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_agent
from lab_helpers import check_resume_after_sigterm, fill_replay, resume_spec

from slm_lab.agent.algorithm.td3 import clipped_double_q_targets, deterministic_policy_loss, smoothed_target_actions
from slm_lab.lib.errors import SpecError
from slm_lab.spec import validate_spec

ROOT = Path(__file__).resolve().parents[2]


def td3_spec(env: str = 'Pendulum-v1', max_frame: int = 400, num_envs: int = 2, **algo) -> dict:
    return {
        'agent': {'name': 'TD3',
                  'algorithm': {'name': 'TD3', 'training_start_step': 64, **algo},
                  'memory': {'name': 'Replay', 'batch_size': 32, 'max_size': 2000},
                  'net': {'type': 'MLPNet', 'hid_layers': [32], 'hid_layers_activation': 'relu',
                          'optim_spec': {'name': 'Adam', 'lr': 0.003}, 'update_type': 'polyak',
                          'polyak_coef': 0.1}},
        'env': {'name': env, 'num_envs': num_envs, 'max_frame': max_frame},
        'meta': {'log_frequency': 100, 'eval_frequency': 200, 'random_seed': 3},
    }


# --- maths, by hand -------------------------------------------------------------------------------
def test_clipped_double_q_target_takes_the_smaller_target_critic_unless_terminated():
    rewards = torch.tensor([1.0, 2.0, 0.5])
    terminateds = torch.tensor([0.0, 1.0, 0.0])
    next_q1 = torch.tensor([10.0, 5.0, -4.0])
    next_q2 = torch.tensor([8.0, 7.0, -3.0])
    # 1 + 0.9 * min(10, 8); 2 (terminated: no bootstrap); 0.5 + 0.9 * min(-4, -3)
    targets = clipped_double_q_targets(rewards, terminateds, next_q1, next_q2, 0.9)
    assert torch.allclose(targets, torch.tensor([8.2, 2.0, -3.1]))


def test_smoothing_noise_is_clipped_to_noise_clip_and_the_action_to_the_bounds():
    target_actions = torch.tensor([[0.9, -0.2, 0.0, -0.8]])
    noise = torch.tensor([[0.3, -0.8, 0.6, -0.1]])
    # noise clipped to [-0.5, 0.5]: 0.3, -0.5, 0.5, -0.1; sums 1.2 -> 1 (bound), -0.7, 0.5, -0.9
    smoothed = smoothed_target_actions(target_actions, noise, noise_clip=0.5)
    assert torch.allclose(smoothed, torch.tensor([[1.0, -0.7, 0.5, -0.9]]))


def test_deterministic_policy_loss_is_minus_the_mean_q():
    assert deterministic_policy_loss(torch.tensor([1.0, 3.0, -1.0])).item() == pytest.approx(-1.0)


# --- the algorithm ----------------------------------------------------------------------------------
def test_truncation_bootstraps_and_termination_does_not():
    """Through the Agent: the memory keeps terminated, not truncated, and the critic targets
    bootstrap from a truncated step's final observation (no smoothing noise here)."""
    agent, clock = make_agent(td3_spec(num_envs=2, policy_noise=0.0))
    alg = agent.algorithm
    obs = np.zeros((2, 3), np.float32)
    next_obs = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, -0.5]], np.float32)
    agent.update(obs, alg.act(obs), np.array([1.0, 1.0]), next_obs, np.array([True, False]), np.array([False, True]))
    assert alg.memory.terminateds[:2].tolist() == [1.0, 0.0]
    rewards, terminateds = torch.tensor([1.0, 1.0]), torch.tensor([1.0, 0.0])
    next_states = torch.as_tensor(next_obs)
    targets = alg.critic_targets(rewards, next_states, terminateds)
    with torch.no_grad():
        a = torch.tanh(alg.target_net(next_states))
        sa = torch.cat([next_states, a], dim=-1)
        next_q = torch.min(alg.target_q1_net(sa), alg.target_q2_net(sa)).squeeze(-1)
    assert targets[0].item() == pytest.approx(1.0)  # terminated: the reward alone
    assert targets[1].item() == pytest.approx(1.0 + 0.99 * next_q[1].item(), rel=1e-6)  # truncated: bootstraps


def test_policy_and_targets_move_only_every_policy_delay_critic_steps():
    agent, clock = make_agent(td3_spec(policy_delay=2))
    alg = agent.algorithm
    fill_replay(agent, clock, 40)
    actor = [p.clone() for p in alg.net.parameters()]
    target = [p.clone() for p in alg.target_q1_net.parameters()]
    critic = [p.clone() for p in alg.q1_net.parameters()]
    alg.train()  # critic step 1: the critics move, the policy and the targets do not
    assert all(torch.equal(a, b) for a, b in zip(actor, alg.net.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(target, alg.target_q1_net.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(critic, alg.q1_net.parameters()))
    alg.train()  # critic step 2: the policy steps, then every target moves by polyak_coef
    assert not all(torch.equal(a, b) for a, b in zip(actor, alg.net.parameters()))
    for before, tp, p in zip(target, alg.target_q1_net.parameters(), alg.q1_net.parameters()):
        assert torch.allclose(tp, before + 0.1 * (p - before), atol=1e-6)
    assert alg.train_step == 2


def test_actions_are_in_the_env_bounds_and_stored_in_unit_range():
    agent, clock = make_agent(td3_spec(training_start_step=1, explore_var_spec={'name': 'no_decay', 'start_val': 5.0}))
    alg = agent.algorithm
    clock.tick()  # past training_start_step: the policy and its noise act
    obs = np.random.default_rng(1).normal(size=(2, 3)).astype(np.float32)
    actions = np.concatenate([alg.act(obs) for _ in range(50)])
    assert actions.min() >= -2.0 and actions.max() <= 2.0  # Pendulum's torque bounds, even with large noise
    assert (np.abs(actions) == 2.0).any()  # a noise of 5 pushes many to the bound
    assert np.allclose(alg.to_unit(np.array([[2.0], [-1.0]])), [[1.0], [-0.5]])
    greedy = alg.act_greedy(obs)
    assert np.array_equal(greedy, alg.act_greedy(obs))  # the greedy policy has no noise


def test_discrete_envs_and_other_action_policies_are_refused():
    with pytest.raises(SpecError, match='continuous'):
        make_agent(td3_spec(env='CartPole-v1'))
    with pytest.raises(SpecError, match='action_policy'):
        validate_spec(td3_spec(action_policy='epsilon_greedy'))
    with pytest.raises(SpecError, match='memory.name'):
        spec = td3_spec()
        spec['agent']['memory']['name'] = 'OnPolicyReplay'
        validate_spec(spec)


def test_state_dict_holds_every_net_optimizer_and_the_critic_step_count():
    agent, clock = make_agent(td3_spec(policy_delay=3))
    alg = agent.algorithm
    fill_replay(agent, clock, 40)
    alg.train()
    state = copy.deepcopy(alg.state_dict())
    assert set(state['nets']) == {'net', 'q1_net', 'q2_net', 'target_net', 'target_q1_net', 'target_q2_net'}
    assert set(state['optimizers']) == {'actor', 'critic'}
    assert state['extra'] == {'train_step': 1}
    other, _ = make_agent(td3_spec(policy_delay=3), seed=5)
    other.algorithm.load_state_dict(state)
    for name, net in other.algorithm.nets().items():
        for key, value in net.state_dict().items():
            assert torch.equal(value, state['nets'][name][key])
    assert other.algorithm.train_step == 1


def test_the_benchmark_spec_has_rl_zoo3s_pendulum_settings():
    spec = validate_spec(json.loads((ROOT / 'spec/benchmark/td3/td3_pendulum.json').read_text())['td3_pendulum'])
    algo, net, memory = spec['agent']['algorithm'], spec['agent']['net'], spec['agent']['memory']
    assert (algo['gamma'], algo['training_start_step'], algo['policy_delay']) == (0.98, 10000, 2)
    assert (algo['policy_noise'], algo['noise_clip'], algo['explore_var_spec']['start_val']) == (0.2, 0.5, 0.1)
    assert (net['hid_layers'], net['optim_spec']['lr'], net['polyak_coef']) == ([400, 300], 0.001, 0.005)
    assert (memory['max_size'], memory['batch_size'], spec['env']['max_frame']) == (200000, 256, 20000)


# --- exact resume -------------------------------------------------------------------------------------
@pytest.mark.subprocess
def test_td3_resumes_exactly_after_sigterm(tmp_path):
    check_resume_after_sigterm(tmp_path, 'td3_pendulum', resume_spec(td3_spec, policy_delay=4))
