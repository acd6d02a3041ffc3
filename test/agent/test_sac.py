"""SoftActorCritic: its maths on batches small enough to check by hand, what it stores and how it
trains (temperature, policy delay, polyak targets, prioritized replay), and exact resume."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from conftest import make_agent
from lab_helpers import check_resume_after_max_frame, check_resume_after_sigterm, fill_replay, resume_spec

from slm_lab.agent.algorithm.sac import continuous_policy_loss, continuous_soft_value, soft_q_targets, temperature_loss
from slm_lab.agent.algorithm.sac_discrete import discrete_policy_loss, discrete_soft_value, discrete_target_entropy
from slm_lab.agent.net.squashed_gaussian import GaussianPolicy, squashed_log_prob
from slm_lab.lib.errors import SpecError
from slm_lab.spec import validate_spec


def sac_spec(env: str = 'Pendulum-v1', max_frame: int = 400, num_envs: int = 2, **algo) -> dict:
    return {
        'agent': {'name': 'SoftActorCritic',
                  'algorithm': {'name': 'SoftActorCritic', 'training_iter': 1, 'training_start_step': 64, **algo},
                  'memory': {'name': 'Replay', 'batch_size': 32, 'max_size': 2000},
                  'net': {'type': 'MLPNet', 'hid_layers': [32], 'optim_spec': {'name': 'Adam', 'lr': 0.003},
                          'update_type': 'polyak', 'polyak_coef': 0.1}},
        'env': {'name': env, 'num_envs': num_envs, 'max_frame': max_frame},
        'meta': {'log_frequency': 100, 'eval_frequency': 200, 'random_seed': 3},
    }


# --- maths, by hand -------------------------------------------------------------------------------
def test_soft_q_targets_bootstrap_unless_terminated():
    rewards = torch.tensor([1.0, 2.0, 0.5])
    terminateds = torch.tensor([0.0, 1.0, 0.0])
    values = torch.tensor([10.0, 10.0, -4.0])
    # 1 + 0.9 * 10; 2 (terminated: no bootstrap); 0.5 + 0.9 * -4
    assert torch.allclose(soft_q_targets(rewards, terminateds, values, 0.9), torch.tensor([10.0, 2.0, -3.1]))


def test_continuous_soft_value_takes_the_smaller_critic_less_the_entropy_term():
    value = continuous_soft_value(torch.tensor([1.0, 3.0]), torch.tensor([2.0, 0.0]), torch.tensor([-1.0, 0.5]), 0.2)
    assert torch.allclose(value, torch.tensor([1.0 + 0.2, 0.0 - 0.1]))


def test_discrete_soft_value_is_the_exact_expectation_over_actions():
    logits = torch.log(torch.tensor([[0.25, 0.75]]))
    q = torch.tensor([[1.0, 2.0]])
    expected = 0.25 * (1 - 0.5 * math.log(0.25)) + 0.75 * (2 - 0.5 * math.log(0.75))  # 2.031168
    assert discrete_soft_value(logits, q, 0.5).item() == pytest.approx(expected, rel=1e-6)


def test_squashed_log_prob_subtracts_the_log_jacobian_of_tanh():
    raw = torch.tensor([[0.0, 1.0]])
    # log(1 - tanh(0)^2) = 0, log(1 - tanh(1)^2) = log(0.4199743) = -0.8675616
    assert squashed_log_prob(torch.tensor([-1.0]), raw).item() == pytest.approx(-1.0 + 0.8675616, rel=1e-6)
    # stable for large |u|, where 1 - tanh(u)^2 underflows in float32
    big = squashed_log_prob(torch.tensor([0.0]), torch.tensor([[20.0]])).item()
    assert big == pytest.approx(-2 * (math.log(2) - 20 - math.log1p(math.exp(-40))), rel=1e-6)


def test_squashed_log_prob_is_a_density_on_the_squashed_actions():
    """The density of a = tanh(u), u ~ N(0.3, 0.8), integrates to 1 over (-1, 1)."""
    normal = torch.distributions.Normal(torch.tensor(0.3), torch.tensor(0.8))
    a = torch.linspace(-0.99999, 0.99999, 200001, dtype=torch.float64)
    u = torch.atanh(a)
    density = squashed_log_prob(normal.log_prob(u), u.unsqueeze(-1)).exp()
    assert torch.trapezoid(density, a).item() == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize('reparam', [True, False])
def test_the_policy_draws_and_scores_as_torch_normal_does(reparam):
    """GaussianPolicy.sample writes out Normal's draw and log density: the same numbers, the same
    gradients, the same random stream afterwards as through a torch.distributions.Normal."""
    spec = {'type': 'MLPNet', 'hid_layers': [16], 'hid_layers_activation': 'relu'}
    policy = GaussianPolicy(validate_spec(_spec_with_net(spec))['agent']['net'], 3, 2)
    x = torch.randn(5, 3)

    def through_distributions():
        loc, log_std = policy(x)
        normal = torch.distributions.Normal(loc, log_std.exp(), validate_args=False)
        raw = normal.rsample() if reparam else normal.sample()
        return torch.tanh(raw), squashed_log_prob(normal.log_prob(raw).sum(dim=-1), raw)

    results = []
    for sample in (lambda: policy.sample(x, reparam), through_distributions):
        torch.manual_seed(7)
        policy.zero_grad(set_to_none=True)
        actions, log_probs = sample()
        (actions.sum() + log_probs.sum()).backward()
        results.append((actions, log_probs, [p.grad.clone() for p in policy.parameters()], torch.rand(3)))
    (a1, l1, g1, next1), (a2, l2, g2, next2) = results
    assert torch.equal(a1, a2) and torch.equal(l1, l2) and torch.equal(next1, next2)
    assert all(torch.equal(x, y) for x, y in zip(g1, g2))


def _spec_with_net(net: dict) -> dict:
    return {'agent': {'name': 'SoftActorCritic', 'algorithm': {'name': 'SoftActorCritic'},
                      'memory': {'name': 'Replay', 'batch_size': 4, 'max_size': 16}, 'net': net},
            'env': {'name': 'Pendulum-v1', 'max_frame': 100}, 'meta': {}}


def test_policy_losses():
    loss = continuous_policy_loss(torch.tensor([-1.0, 1.0]), torch.tensor([2.0, 0.0]), torch.tensor([1.0, 4.0]), 0.5)
    assert loss.item() == pytest.approx(((-0.5 - 1.0) + (0.5 - 0.0)) / 2)
    loss, entropy = discrete_policy_loss(torch.log(torch.tensor([[0.5, 0.5]])), torch.tensor([[1.0, 3.0]]), 1.0)
    assert loss.item() == pytest.approx(0.5 * (math.log(0.5) - 1) + 0.5 * (math.log(0.5) - 3))
    assert entropy.item() == pytest.approx(math.log(2))


def test_temperature_loss_raises_alpha_while_entropy_is_below_target():
    log_alpha = torch.tensor([math.log(2.0)], requires_grad=True)
    loss = temperature_loss(log_alpha, torch.tensor(0.5), target_entropy=1.0)
    assert loss.item() == pytest.approx(-2.0 * (1.0 - 0.5))
    loss.backward()
    assert log_alpha.grad.item() == pytest.approx(-1.0)  # descent raises log_alpha
    # continuous: with H = -mean log pi it is SAC's -mean(alpha * (log pi + target))
    log_probs = torch.tensor([0.2, -0.6])
    other = -(log_alpha.exp() * (log_probs + 1.0)).mean()
    assert temperature_loss(log_alpha, -log_probs.mean(), 1.0).item() == pytest.approx(other.item())


def test_discrete_target_entropy_anneals_its_ratio_of_log_n():
    assert discrete_target_entropy(4, 0.6, 0.6, 0, 123) == pytest.approx(0.6 * math.log(4))
    assert discrete_target_entropy(4, 0.6, 0.2, 100, 50) == pytest.approx(0.4 * math.log(4))
    assert discrete_target_entropy(4, 0.6, 0.2, 100, 500) == pytest.approx(0.2 * math.log(4))


# --- the algorithm ----------------------------------------------------------------------------------
def test_defaults_follow_slm_lab_v5():
    spec = sac_spec(num_envs=4)
    del spec['agent']['algorithm']['training_iter'], spec['agent']['algorithm']['training_start_step']
    spec['agent']['memory']['batch_size'] = 256
    algo = validate_spec(spec)['agent']['algorithm']
    assert algo['training_iter'] == 4 and algo['training_start_step'] == 1000
    assert (algo['policy_delay'], algo['log_alpha_min'], algo['log_alpha_max']) == (1, -5.0, 2.0)
    agent, _ = make_agent(sac_spec('CartPole-v1'))
    assert agent.algorithm.target_entropy() == pytest.approx(0.6 * math.log(2))
    agent, _ = make_agent(sac_spec())
    assert agent.algorithm.target_entropy() == -1.0


@pytest.mark.parametrize('change,needle', [
    (lambda a: a.update(action_pdtype='Argmax'), 'action_pdtype'),
    (lambda a: a.update(log_alpha_min=3.0), 'log_alpha_min'),
    (lambda a: a.update(target_entropy='high'), 'target_entropy'),
    (lambda a: a.update(spectral_norm=True), 'not available yet'),
])
def test_bad_keys_are_refused_in_one_line(change, needle):
    spec = sac_spec('CartPole-v1')
    change(spec['agent']['algorithm'])
    with pytest.raises(SpecError, match=needle):
        validate_spec(spec)


def test_gumbel_softmax_is_slm_lab_v4s_discrete_sac_with_critics_of_one_hot_actions():
    agent, clock = make_agent(sac_spec('CartPole-v1', action_pdtype='GumbelSoftmax'))
    alg = agent.algorithm
    assert alg.q1_net(torch.zeros(5, 4 + 2)).shape == (5, 1)  # (s, one_hot(a)) -> Q
    assert alg.target_entropy() == -2.0
    fill_replay(agent, clock, 40)
    actions = alg.act(np.zeros((2, 4), np.float32))
    assert actions.shape == (2,) and set(actions.tolist()) <= {0, 1}
    actor = copy.deepcopy(alg.net.state_dict())
    batch = alg.memory.sample()
    s, ns = alg.tensor(batch.states), alg.tensor(batch.next_states)
    terminal = alg.critic_values(s, torch.as_tensor(batch.actions), ns, torch.ones(32), torch.ones(32), 0.5)[2]
    assert torch.equal(terminal, torch.ones(32))  # terminated: the reward alone
    alg.train()  # the policy's gradient reaches its logits through the straight-through one-hot actions
    assert not all(torch.equal(actor[k], v) for k, v in alg.net.state_dict().items())


def test_a_critic_net_is_refused_for_sac():
    spec = sac_spec()
    spec['agent']['critic_net'] = {'type': 'MLPNet'}
    with pytest.raises(SpecError, match='agent.critic_net: SoftActorCritic has no separate critic net'):
        validate_spec(spec)


@pytest.mark.parametrize('env', ['CartPole-v1', 'Pendulum-v1'])
def test_memory_stores_termination_not_truncation(env):
    agent, _ = make_agent(sac_spec(env, num_envs=2))
    alg = agent.algorithm
    obs = np.zeros((2, alg.in_dim), np.float32)
    action = alg.act(obs)
    alg.update(obs, action, np.ones(2), obs, np.array([False, True]), np.array([True, False]))
    assert alg.memory.terminateds[:2].tolist() == [0.0, 1.0]


def test_continuous_actions_are_drawn_in_the_env_bounds_and_stored_in_unit_range():
    agent, clock = make_agent(sac_spec(num_envs=2, training_start_step=10))
    alg = agent.algorithm
    obs = np.random.default_rng(1).normal(size=(2, 3)).astype(np.float32)
    random_actions = alg.act(obs)  # before training_start_step: uniform random
    clock.frame = 20
    policy_actions = alg.act(obs)
    for actions in (random_actions, policy_actions, alg.act_greedy(obs)):
        assert actions.shape == (2, 1) and np.all(np.abs(actions) <= 2.0)
    alg.update(obs, np.array([[2.0], [-1.0]], np.float32), np.zeros(2), obs, np.zeros(2, bool), np.zeros(2, bool))
    assert alg.memory.actions[:2].ravel().tolist() == [1.0, -0.5]


def test_temperature_steps_and_is_clamped():
    """Far below its target entropy, the temperature rises until log_alpha_max holds it."""
    agent, clock = make_agent(sac_spec('CartPole-v1', target_entropy=100.0, log_alpha_max=0.05, alpha_lr=0.1))
    alg = agent.algorithm
    fill_replay(agent, clock, 40)
    for _ in range(3):
        alg.train()
    assert alg.temperature.log_alpha.item() == pytest.approx(0.05)
    assert 'alpha' in alg.optimizers and 'temperature' in alg.nets()


def test_fixed_alpha_has_no_temperature_and_anneals():
    agent, clock = make_agent(sac_spec(fixed_alpha=0.2, alpha_anneal_frames=100))
    alg = agent.algorithm
    assert alg.temperature is None and 'alpha' not in alg.optimizers
    clock.frame = 50
    assert alg.alpha() == pytest.approx(0.1)


def test_policy_delay_steps_the_actor_and_moves_the_targets_every_nth_critic_step():
    agent, clock = make_agent(sac_spec(policy_delay=2))
    alg = agent.algorithm
    fill_replay(agent, clock, 40)
    actor0 = copy.deepcopy(alg.net.state_dict())
    target0 = copy.deepcopy(alg.target_q1_net.state_dict())
    critic0 = copy.deepcopy(alg.q1_net.state_dict())
    alg.train()
    assert all(torch.equal(actor0[k], v) for k, v in alg.net.state_dict().items())
    assert all(torch.equal(target0[k], v) for k, v in alg.target_q1_net.state_dict().items())
    assert not all(torch.equal(critic0[k], v) for k, v in alg.q1_net.state_dict().items())
    before = copy.deepcopy(alg.target_q1_net.state_dict())
    alg.train()
    assert not all(torch.equal(actor0[k], v) for k, v in alg.net.state_dict().items())
    online = alg.q1_net.state_dict()
    for key, value in alg.target_q1_net.state_dict().items():  # target <- 0.1 * online + 0.9 * target
        assert torch.allclose(value, 0.1 * online[key] + 0.9 * before[key], atol=1e-6)


def test_prioritized_replay_weights_the_critic_loss_and_gets_td_errors():
    agent, clock = make_agent(sac_spec('CartPole-v1'))
    alg = agent.algorithm
    fill_replay(agent, clock, 40)
    batch = alg.memory.sample()
    weights = np.zeros(32, np.float32)
    weights[0] = 32.0  # the loss is then the first transition's alone
    got = {}
    alg.memory.sample = lambda: batch._replace(indices=np.arange(32) + 100, weights=weights)
    alg.memory.update_priorities = lambda indices, errors: got.update(indices=indices, errors=errors)
    s, ns = alg.tensor(batch.states), alg.tensor(batch.next_states)
    a = torch.as_tensor(batch.actions).long()
    q1, q2, y, _, _ = alg.critic_values(s, a, ns, alg.tensor(batch.rewards), alg.tensor(batch.terminateds), alg.alpha())
    expected = float(((q1[0] - y[0]) ** 2 + (q2[0] - y[0]) ** 2).detach())
    seen = []
    critic_loss = alg.critic_loss
    alg.critic_loss = lambda q, t, w: seen.append(w) or critic_loss(q, t, w)
    alg.train()
    assert seen and all(torch.equal(w, torch.as_tensor(weights)) for w in seen)
    assert got['indices'].tolist() == list(range(100, 132))
    assert len(got['errors']) == 32 and np.all(got['errors'] >= 0)
    assert got['errors'][0] == pytest.approx(float((torch.min(q1, q2) - y).abs()[0].detach()), rel=1e-5)
    critic = critic_loss(q1, y, torch.as_tensor(weights)) + alg.critic_loss(q2, y, torch.as_tensor(weights))
    assert critic.item() == pytest.approx(expected, rel=1e-5)


def test_state_dict_brings_back_every_net_optimizer_and_counter():
    agent, clock = make_agent(sac_spec(policy_delay=3))
    alg = agent.algorithm
    fill_replay(agent, clock, 40)
    alg.train()
    state = copy.deepcopy(alg.state_dict())
    assert set(state['nets']) == {'net', 'q1_net', 'q2_net', 'target_q1_net', 'target_q2_net', 'temperature'}
    assert set(state['optimizers']) == {'actor', 'critic', 'alpha'}
    assert state['extra']['train_step'] == 1
    other, _ = make_agent(sac_spec(policy_delay=3), seed=5)
    other.algorithm.load_state_dict(state)
    for name, net in other.algorithm.nets().items():
        for key, value in net.state_dict().items():
            assert torch.equal(value, state['nets'][name][key])
    assert other.algorithm.train_step == 1


# --- exact resume -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_sac_on_a_mujoco_env_resumes_exactly_mid_episode(tmp_path):
    """Hopper-v5 (MuJoCo's integration state and derived quantities in the snapshot), SAC's
    replay in the snapshot: stopped at F and resumed to 2F == a straight run of 2F."""
    pytest.importorskip('mujoco', reason='the MuJoCo extra is not installed')
    check_resume_after_max_frame(tmp_path, 'sac_hopper', resume_spec(sac_spec, 'Hopper-v5'))


@pytest.mark.slow
@pytest.mark.parametrize('pdtype', ['Categorical', 'GumbelSoftmax'])
def test_discrete_sac_resumes_exactly_after_max_frame(tmp_path, pdtype):
    check_resume_after_max_frame(tmp_path, 'sac_cartpole', resume_spec(sac_spec, 'CartPole-v1', training_iter=2,
                                                                       action_pdtype=pdtype))


@pytest.mark.slow
def test_sac_on_prioritized_replay_resumes_exactly_after_max_frame(tmp_path):
    spec = resume_spec(sac_spec, 'Pendulum-v1')
    spec['agent']['memory'].update(name='PrioritizedReplay', alpha=0.6, epsilon=1e-4, beta=0.4)
    check_resume_after_max_frame(tmp_path, 'sac_per_pendulum', spec)


def test_sac_gives_prioritized_replay_its_td_errors():
    spec = sac_spec()
    spec['agent']['memory'].update(name='PrioritizedReplay', beta=0.4)
    agent, clock = make_agent(spec)
    fill_replay(agent, clock, 40)
    before = agent.algorithm.memory.tree.leaves.copy()
    agent.algorithm.train()
    after = agent.algorithm.memory.tree.leaves
    assert (after != before).sum() > 0 and len(np.unique(after[:80])) > 2


@pytest.mark.slow
@pytest.mark.subprocess
def test_continuous_sac_resumes_exactly_after_sigterm(tmp_path):
    check_resume_after_sigterm(tmp_path, 'sac_pendulum', resume_spec(sac_spec, 'Pendulum-v1', policy_delay=4))

