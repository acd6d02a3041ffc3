"""Action distributions (every action_pdtype SLM-Lab specs reach on Discrete and 1-D Box actions)
and action policies: log-probs and entropies against torch and by hand, greedy actions, sampling
ranges, and the specs that cannot use them."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import distributions as D

from conftest import build_spec
from slm_lab.agent.algorithm import policy_util
from slm_lab.agent.algorithm.policy_util import PolicyHead, draw_one, pd_out_dim, sample_actions
from slm_lab.lib.errors import SpecError
from slm_lab.spec import validate_spec

LOGITS = torch.tensor([[1.0, 2.0, 0.5], [0.0, 0.0, 3.0]])


def test_pd_out_dim_logits_locs_or_locs_and_log_scales():
    assert pd_out_dim('Categorical', 3) == 3 and pd_out_dim('GumbelSoftmax', 3, None) == 3
    assert pd_out_dim('Normal', 2) == 2  # the lab's algorithms: a state-independent log std parameter
    assert pd_out_dim('Gumbel', 2, None) == 4  # SLM-Lab's nets without log_std_init: [loc, log_scale]


def test_categorical_is_torch_categorical():
    pd = PolicyHead('Categorical', 3).distribution(LOGITS)
    ref = D.Categorical(logits=LOGITS)
    a = torch.tensor([1, 2])
    assert torch.allclose(pd.log_prob(a), ref.log_prob(a)) and torch.allclose(pd.entropy(), ref.entropy())


def test_argmax_puts_probability_one_on_the_largest_output():
    pd = PolicyHead('Argmax', 3).distribution(LOGITS)
    assert torch.equal(pd.sample(), torch.tensor([1, 2]))
    assert torch.allclose(pd.log_prob(torch.tensor([1, 2])), torch.zeros(2))
    assert (pd.log_prob(torch.tensor([0, 0])) < -1e7).all()
    assert torch.allclose(pd.entropy(), torch.zeros(2), atol=1e-4)


def test_gumbel_softmax_scores_actions_as_categorical_and_samples_hard_actions():
    pd = PolicyHead('GumbelSoftmax', 3).distribution(LOGITS)
    ref = D.Categorical(logits=LOGITS)
    a = torch.tensor([0, 2])
    assert torch.allclose(pd.log_prob(a), ref.log_prob(a))
    assert torch.allclose(pd.log_prob(torch.nn.functional.one_hot(a, 3).float()), ref.log_prob(a))
    assert torch.allclose(pd.entropy(), ref.entropy())
    torch.manual_seed(0)
    draws = PolicyHead('GumbelSoftmax', 3).distribution(LOGITS[:1].expand(20000, 3)).sample()
    assert draws.dtype == torch.long and draws.shape == (20000,)
    freq = torch.bincount(draws, minlength=3).float() / 20000
    assert torch.allclose(freq, torch.softmax(LOGITS[0], -1), atol=0.015)  # argmax(logits + Gumbel) ~ softmax


def test_gumbel_softmax_rsample_is_one_hot_with_the_relaxed_gradient():
    logits = LOGITS.clone().requires_grad_(True)
    y = PolicyHead('GumbelSoftmax', 3).distribution(logits).rsample()
    assert set(y.detach().flatten().tolist()) <= {0.0, 1.0} and torch.equal(y.detach().sum(-1), torch.ones(2))
    (y * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_normal_with_a_log_std_parameter_by_hand():
    """loc 0, log std 0 (std 1), a = (1, -1): log N = 2 (-1/2 - log(2 pi) / 2) = -1 - log(2 pi);
    entropy = 2 (1/2 + log(2 pi) / 2) = 1 + log(2 pi)."""
    head = PolicyHead('Normal', 2, 0.0)
    pd = head.distribution(torch.zeros(1, 2))
    assert pd.log_prob(torch.tensor([[1.0, -1.0]])).item() == pytest.approx(-1 - math.log(2 * math.pi))
    assert pd.entropy().item() == pytest.approx(1 + math.log(2 * math.pi))
    assert [n for n, _ in head.named_parameters()] == ['log_std']


def test_net_given_log_scale_is_clamped_to_slm_labs_bounds():
    """[loc, log_scale] outputs; log_scale 5 reads as 2 and -9 as -5 (exp(clamp(x, -5, 2)))."""
    head = PolicyHead('Normal', 2, None)
    assert list(head.parameters()) == []
    out = torch.tensor([[0.5, -0.5, 5.0, -9.0]])
    pd = head.distribution(out)
    ref = D.Independent(D.Normal(torch.tensor([[0.5, -0.5]]), torch.tensor([[math.exp(2), math.exp(-5)]])), 1)
    a = torch.tensor([[1.0, -0.5]])
    assert torch.allclose(pd.log_prob(a), ref.log_prob(a))
    assert torch.equal(PolicyHead.greedy(out, 'Normal', act_dim=2), torch.tensor([[0.5, -0.5]]))


@pytest.mark.parametrize('pdtype, cls', [('Gumbel', D.Gumbel), ('LogNormal', D.LogNormal)])
def test_loc_scale_distributions_are_torchs_with_independent_dimensions(pdtype, cls):
    loc, log_scale = torch.tensor([[0.2, -0.3]]), torch.tensor([[-0.5, 0.4]])
    pd = PolicyHead(pdtype, 2, None).distribution(torch.cat([loc, log_scale], -1))
    ref = cls(loc, log_scale.exp())
    a = torch.tensor([[0.7, 1.5]])
    assert torch.allclose(pd.log_prob(a), ref.log_prob(a).sum(-1))
    assert torch.allclose(pd.entropy(), ref.entropy().sum(-1))
    assert pd.sample().shape == (1, 2)


def test_lognormal_samples_are_positive_and_its_greedy_action_is_the_median():
    head = PolicyHead('LogNormal', 1, 0.0)
    torch.manual_seed(0)
    assert (head.distribution(torch.zeros(500, 1)).sample() > 0).all()
    assert torch.allclose(PolicyHead.greedy(torch.tensor([[0.0], [1.0]]), 'LogNormal'),
                          torch.tensor([[1.0], [math.e]]))


def test_multivariate_normal_reads_the_scale_as_slm_lab_builds_its_covariance():
    """SLM-Lab: covariance_matrix = diag(exp(clamp(log_scale, -5, 2)))."""
    loc, log_scale = torch.tensor([[0.1, 0.2]]), torch.tensor([[0.3, -1.0]])
    pd = PolicyHead('MultivariateNormal', 2, None).distribution(torch.cat([loc, log_scale], -1))
    ref = D.MultivariateNormal(loc, covariance_matrix=torch.diag_embed(log_scale.exp()))
    a = torch.tensor([[0.5, -0.4]])
    assert torch.allclose(pd.log_prob(a), ref.log_prob(a)) and torch.allclose(pd.entropy(), ref.entropy())


def test_pd_actions_casts_by_the_pdtype():
    actions = torch.tensor([1.0, 2.0])
    assert policy_util.pd_actions(actions, 'GumbelSoftmax').dtype == torch.long
    assert policy_util.pd_actions(actions, 'Argmax').dtype == torch.long
    assert policy_util.pd_actions(actions, 'LogNormal').dtype == torch.float32


# --- action policies ----------------------------------------------------------------------------
def test_epsilon_greedy_is_greedy_at_zero_and_uniform_at_one():
    head = PolicyHead('Argmax', 3)
    out = LOGITS.repeat(500, 1)
    assert torch.equal(sample_actions(out, head, 'epsilon_greedy', 0.0, np.random.default_rng(0), 3),
                       out.argmax(-1))
    drawn = sample_actions(out, head, 'epsilon_greedy', 1.0, np.random.default_rng(0), 3)
    freq = torch.bincount(drawn, minlength=3).float() / len(drawn)
    assert torch.allclose(freq, torch.full((3,), 1 / 3), atol=0.07)


def test_random_policy_draws_from_the_algorithms_generator():
    head = PolicyHead('Categorical', 4)
    out = torch.zeros(50, 4)
    a = sample_actions(out, head, 'random', 0.0, np.random.default_rng(7), 4)
    b = sample_actions(out, head, 'random', 0.0, np.random.default_rng(7), 4)
    assert torch.equal(a, b) and a.min() >= 0 and a.max() <= 3 and len(set(a.tolist())) == 4


def test_boltzmann_divides_by_the_temperature():
    head = PolicyHead('Categorical', 3)
    torch.manual_seed(0)
    cold = sample_actions(LOGITS.repeat(200, 1), head, 'boltzmann', 1e-3, np.random.default_rng(0), 3)
    assert torch.equal(cold, LOGITS.repeat(200, 1).argmax(-1))
    hot = sample_actions(LOGITS[:1].repeat(6000, 1), head, 'boltzmann', 1e3, np.random.default_rng(0), 3)
    freq = torch.bincount(hot, minlength=3).float() / 6000
    assert torch.allclose(freq, torch.full((3,), 1 / 3), atol=0.03)
    # SLM-Lab samples the pdtype's own distribution: Argmax stays greedy at any temperature
    greedy = sample_actions(LOGITS.repeat(50, 1), PolicyHead('Argmax', 3), 'boltzmann', 1e3,
                            np.random.default_rng(0), 3)
    assert torch.equal(greedy, LOGITS.repeat(50, 1).argmax(-1))


# --- what specs may combine -----------------------------------------------------------------------
def _error(spec: dict) -> str:
    with pytest.raises(SpecError) as e:
        validate_spec(spec)
    return str(e.value)


@pytest.mark.parametrize('pdtype', ['Beta', 'MultiCategorical', 'NormalTanh'])
def test_pdtypes_not_reachable_here_wait_in_one_line(pdtype):
    spec = build_spec('PPO', env='Pendulum-v1')
    spec['agent']['algorithm']['action_pdtype'] = pdtype
    message = _error(spec)
    assert message.startswith('agent.algorithm.action_pdtype:') and 'not available yet' in message
    assert '\n' not in message


@pytest.mark.parametrize('algo, env, key, value, expect', [
    ('PPO', 'CartPole-v1', 'action_pdtype', 'LogNormal', "does not fit the env's Discrete actions"),
    ('PPO', 'Pendulum-v1', 'action_pdtype', 'GumbelSoftmax', 'does not fit the env\'s continuous (Box)'),
    ('PPO', 'CartPole-v1', 'action_policy', 'random', 'needs actions sampled from the policy'),
    ('Reinforce', 'CartPole-v1', 'action_policy', 'epsilon_greedy', 'needs actions sampled from the policy'),
    ('DQN', 'CartPole-v1', 'action_policy', 'boltzmann', None),  # an off-policy learner may explore so
    ('DQN', 'CartPole-v1', 'action_policy', 'random', None),
])
def test_which_algorithms_take_which_pdtype_and_policy(algo, env, key, value, expect):
    from slm_lab.agent.algorithm import ALGORITHMS
    spec = build_spec(algo, env=env)
    spec['agent']['algorithm'][key] = value
    if expect is None:
        validated = validate_spec(spec)
        assert validated['agent']['algorithm'][key] == value
        return
    try:
        validated = validate_spec(spec)
        import gymnasium as gym
        space = gym.make(env).action_space
        ALGORITHMS[algo].check_spec(validated)
        policy_util.check_action_space(space, validated['agent']['algorithm'], algo, True)
    except SpecError as e:
        assert expect in str(e) and '\n' not in str(e)
        return
    pytest.fail(f'{key}={value} was accepted')


@pytest.mark.parametrize('algo, env, pdtype', [
    ('PPO', 'Pendulum-v1', 'Gumbel'),
    ('PPO', 'Pendulum-v1', 'MultivariateNormal'),
    ('Reinforce', 'Pendulum-v1', 'LogNormal'),
    ('Reinforce', 'CartPole-v1', 'GumbelSoftmax'),
])
def test_each_pdtype_trains_through_the_lab(lab_run, algo, env, pdtype):
    spec = build_spec(algo, env=env, max_frame=200)
    spec['agent']['algorithm']['action_pdtype'] = pdtype
    metrics, _ = lab_run(spec, f'{algo.lower()}_{pdtype.lower()}')
    assert metrics is not None


def test_categorical_head_matches_torch_categorical_exactly():
    # PolicyHead's direct Categorical log_prob, entropy and draws give torch's numbers bit for bit
    torch.manual_seed(0)
    head = PolicyHead('Categorical', 3)
    logits = torch.randn(64, 3) * 3
    actions = torch.randint(0, 3, (64,))
    pd = D.Categorical(logits=logits)
    log_prob, entropy = head.log_prob_and_entropy(logits, actions)
    assert torch.equal(log_prob, pd.log_prob(actions)) and torch.equal(entropy, pd.entropy())
    assert torch.equal(head.log_prob(logits, actions), pd.log_prob(actions))
    torch.manual_seed(5)
    expected = pd.sample()
    torch.manual_seed(5)
    assert torch.equal(head.sample(logits), expected)


@pytest.mark.parametrize('shape', [(1, 2), (8, 2), (16, 6), (3, 18)])
def test_draw_one_is_multinomials_draw_and_leaves_the_generator_as_it_does(shape):
    # the exponential form without multinomial's checks: the same indices, the same generator after
    for seed in range(50):
        probs = torch.softmax(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3, dim=-1)
        torch.manual_seed(seed)
        expected, after = torch.multinomial(probs, 1, True).squeeze(1), torch.rand(4)
        torch.manual_seed(seed)
        drawn = draw_one(probs)
        assert torch.equal(drawn, expected) and torch.equal(torch.rand(4), after)


def test_draw_one_refuses_nan_probabilities_as_multinomial_does():
    # a NaN policy is refused at the step that met it (the session reports the divergence there)
    probs = torch.softmax(torch.tensor([[0.0, float('nan')], [1.0, 2.0]]), dim=-1)
    with pytest.raises(RuntimeError, match='probability tensor contains'):
        torch.multinomial(probs, 1, True)
    with pytest.raises(RuntimeError, match='probability tensor contains'):
        draw_one(probs)
    with pytest.raises(RuntimeError, match='probability tensor contains'):
        PolicyHead('Categorical', 2).sample(torch.tensor([[0.0, float('nan')]]))
