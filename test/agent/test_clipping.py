"""clip_grad_val clips each net on its own, as SLM-Lab clips each net in its own train step."""
from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from slm_lab.agent import Agent
from slm_lab.env import Clock
from slm_lab.spec import validate_spec


def ppo_agent(shared: bool, **net) -> Agent:
    spec = validate_spec({
        'agent': {'name': 'PPO', 'algorithm': {'name': 'PPO'}, 'memory': {'name': 'OnPolicyBatchReplay'},
                  'net': {'type': 'MLPNet', 'shared': shared, 'hid_layers': [8], 'clip_grad_val': 0.5, **net}},
        'env': {'name': 'CartPole-v1', 'max_frame': 1000}})
    env = gym.make('CartPole-v1')
    return Agent(spec, env.observation_space, env.action_space, 1, Clock(1000, 1), seed=0)


def grad_norm(params) -> float:
    return float(torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None]))


@pytest.mark.parametrize('net', [{}, {'actor_optim_spec': {'name': 'Adam', 'lr': 0.01},
                                     'critic_optim_spec': {'name': 'Adam', 'lr': 0.01}}])
def test_a_large_critic_gradient_does_not_shrink_the_actor_step(net):
    algorithm = ppo_agent(False, **net).algorithm
    model = algorithm.model
    x = torch.randn(4, 4)
    actor_loss = 1e-3 * model.pd_out(x).sum()  # an actor gradient well under clip_grad_val
    expected = torch.autograd.grad(actor_loss, model.actor_parameters(), retain_graph=True, allow_unused=True)
    expected_norm = float(torch.nn.utils.get_total_norm([g for g in expected if g is not None]))
    assert expected_norm < 0.5
    loss = actor_loss + 1e4 * model.value(x).sum()  # and a huge critic gradient
    algorithm.step_optimizers(loss)
    assert grad_norm(model.actor_parameters()) == pytest.approx(expected_norm, rel=1e-5)  # not scaled down
    assert grad_norm(model.critic.parameters()) == pytest.approx(0.5, rel=1e-3)  # clipped on its own


def test_a_shared_net_clips_as_one():
    algorithm = ppo_agent(True).algorithm
    x = torch.randn(4, 4)
    algorithm.step_optimizers(1e4 * algorithm.model.value(x).sum() + algorithm.model.pd_out(x).sum())
    assert grad_norm(algorithm.model.parameters()) == pytest.approx(0.5, rel=1e-3)


def test_reinforce_policy_loss_coef_scales_the_policy_term_only():
    """SLM-Lab's Reinforce: loss = -policy_loss_coef * mean(log_prob * return) - entropy_coef * entropy."""
    import numpy as np
    losses = {}
    for coef in (1.0, 3.0):
        spec = validate_spec({
            'agent': {'name': 'R', 'algorithm': {'name': 'Reinforce', 'policy_loss_coef': coef,
                                                 'entropy_coef_spec': {'name': 'no_decay', 'start_val': 0.5}},
                      'memory': {'name': 'OnPolicyReplay'}, 'net': {'type': 'MLPNet', 'hid_layers': [8]}},
            'env': {'name': 'CartPole-v1', 'max_frame': 1000}})
        env = gym.make('CartPole-v1')
        torch.manual_seed(0)  # the same initial net for both coefficients
        algorithm = Agent(spec, env.observation_space, env.action_space, 1, Clock(1000, 1), seed=0).algorithm
        states, actions, returns = np.ones((3, 4), np.float32), np.array([0, 1, 1]), np.array([1.0, 2.0, 3.0])
        metrics = algorithm.train(states, actions, returns)
        losses[coef] = (metrics['loss'], metrics['entropy'])
    (loss1, entropy), (loss3, _) = losses[1.0], losses[3.0]
    policy_term = loss1 + 0.5 * entropy  # the same net (seed 0): the policy term of coef 1
    assert loss3 == pytest.approx(3.0 * policy_term - 0.5 * entropy, rel=1e-5)


def _a2c_agent(**algorithm) -> Agent:
    spec = validate_spec({
        'agent': {'name': 'A2C', 'algorithm': {'name': 'ActorCritic', **algorithm},
                  'memory': {'name': 'OnPolicyBatchReplay'},
                  'net': {'type': 'MLPNet', 'shared': False, 'hid_layers': [8], 'clip_grad_val': 0.5,
                          'actor_optim_spec': {'name': 'RMSprop', 'lr': 0.01},
                          'critic_optim_spec': {'name': 'Adam', 'lr': 0.003}}},
        'env': {'name': 'CartPole-v1', 'max_frame': 1000}})
    env = gym.make('CartPole-v1')
    return Agent(spec, env.observation_space, env.action_space, 1, Clock(1000, 1), seed=0)


def test_separate_optimizers_step_on_one_backward_as_on_two():
    """ActorCritic.step_losses with an actor and a critic optimizer: one backward of the summed
    losses, then each net clipped and stepped on its own, gives the weights, optimizer states,
    gradient norm and optimizer-step count of a backward and a step per loss, bit for bit."""
    import math
    merged, separate = _a2c_agent().algorithm, _a2c_agent().algorithm
    assert set(merged.optimizers) == {'actor', 'critic'}
    separate.model.load_state_dict(merged.model.state_dict())
    torch.manual_seed(1)
    for _ in range(3):
        x, target = torch.randn(6, 4), 30 * torch.randn(6)  # a large value loss: the critic is clipped
        norms = []
        for algo in (merged, separate):
            out, v = algo.model.pd_out_and_value(x)
            policy_loss = -(out.log_softmax(-1)[:, 0] * target).mean()
            value_loss = torch.nn.functional.mse_loss(v, target)
            if algo is merged:
                norms.append(algo.step_losses(policy_loss, value_loss))
            else:
                parts = [algo.step_optimizers(policy_loss, names=('actor',)),
                         algo.step_optimizers(value_loss, names=('critic',))]
                norms.append(math.sqrt(sum(n * n for n in parts)))
        assert norms[0] == norms[1] and norms[0] > 0.5
    for a, b in zip(merged.model.parameters(), separate.model.parameters()):
        assert torch.equal(a, b)
    for name in ('actor', 'critic'):
        sa, sb = merged.optimizers[name].state_dict()['state'], separate.optimizers[name].state_dict()['state']
        assert all(torch.equal(x, y) for k in sa for x, y in zip(sa[k].values(), sb[k].values()))
    assert merged.clock.opt_step == separate.clock.opt_step == 6
