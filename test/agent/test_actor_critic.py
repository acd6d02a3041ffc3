"""ActorCritic (A2C): its maths on hand-computed batches, how its losses reach its optimizers,
its spec rules, and exact resume.

Every expected number is worked out in the comments, not by calling the code under test. The
cases mix a terminated and a truncated episode, so `done` where `terminated` belongs (or the
other way round) fails a test.
"""
from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import make_algorithm
from lab_helpers import check_resume_after_max_frame, check_resume_after_sigterm, value_from_first_entry

from slm_lab.agent import Agent
from slm_lab.agent.algorithm.maths import (
    ReturnNormalizer, actor_critic_policy_loss, episode_returns, nstep_returns, standardize)
from slm_lab.env import Clock
from slm_lab.lib.errors import SpecError
from slm_lab.spec import validate_spec


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def a2c_spec(memory: str = 'OnPolicyBatchReplay', net: dict | None = None, env: str = 'CartPole-v1',
             num_envs: int = 1, max_frame: int = 100, log_frequency: int | None = None, **algo) -> dict:
    """A small A2C spec; algorithm keys override the GAE defaults below."""
    algorithm = {'name': 'ActorCritic', 'gamma': 0.99, 'lam': 0.95, 'training_frequency': 8,
                 'entropy_coef_spec': {'name': 'no_decay', 'start_val': 0.01}, **algo}
    return {'agent': {'name': 'a2c', 'algorithm': algorithm, 'memory': {'name': memory},
                      'net': {'type': 'MLPNet', 'hid_layers': [16], 'hid_layers_activation': 'tanh',
                              'shared': False, 'optim_spec': {'name': 'Adam', 'lr': 1e-3}, **(net or {})}},
            'env': {'name': env, 'num_envs': num_envs, 'max_frame': max_frame},
            'meta': {'log_frequency': log_frequency or max(max_frame // 4, num_envs), 'random_seed': 42}}


# --- n-step returns ---------------------------------------------------------------------------
# gamma 0.5; two envs, 4 steps; R_t sums at most n rewards, stops at the episode end and the
# batch end, and bootstraps from V(s') where it stops unless the episode terminated there.
# env 0: rewards 1 2 3 4, V(s') 10 20 30 40, terminated at t=1
# env 1: rewards 1 1 1 1, V(s')  2  4  6  8, truncated at t=0
NSTEP_CASE = {'rewards': [[1, 1], [2, 1], [3, 1], [4, 1]], 'next_values': [[10, 2], [20, 4], [30, 6], [40, 8]],
              'terminateds': [[0, 0], [1, 0], [0, 0], [0, 0]], 'truncateds': [[0, 1], [0, 0], [0, 0], [0, 0]]}
NSTEP_EXPECTED = {
    # n=1: R = r + 0.5 * (1 - terminated) * V(s')
    #   env 0: 1 + 5 = 6, 2 + 0 = 2, 3 + 15 = 18, 4 + 20 = 24;  env 1: 1 + 1 = 2, 3, 4, 5
    1: [[6, 2], [2, 3], [18, 4], [24, 5]],
    # n=2: env 0 t0: 1 + 0.5*2, then the episode terminated: 2; t1: 2; t2: 3 + 0.5*4 + 0.25*40 = 15;
    #        t3 (batch end): 4 + 0.5*40 = 24
    #      env 1 t0 (truncated): 1 + 0.5*2 = 2; t1: 1 + 0.5*1 + 0.25*6 = 3; t2: 1 + 0.5 + 0.25*8 = 3.5; t3: 5
    2: [[2, 2], [2, 3], [15, 3.5], [24, 5]],
    # n=4 (the batch end cuts first): env 0 as n=2; env 1 t1: 1 + 0.5 + 0.25 + 0.125*8 = 2.75
    4: [[2, 2], [2, 2.75], [15, 3.5], [24, 5]],
}


@pytest.mark.parametrize('n', sorted(NSTEP_EXPECTED))
def test_nstep_returns_bootstrap_truncation_and_batch_end_not_termination(n):
    c = {k: t(v) for k, v in NSTEP_CASE.items()}
    dones = torch.maximum(c['terminateds'], c['truncateds'])
    returns = nstep_returns(c['rewards'], c['next_values'], c['terminateds'], dones, gamma=0.5, n=n)
    torch.testing.assert_close(returns, t(NSTEP_EXPECTED[n]))


def test_a2c_nstep_trains_every_n_steps_on_returns_minus_values(monkeypatch):
    # n=4 and training_frequency 1: SLM-Lab trains n-step A2C every n steps, so the batch holds 4;
    # V(s) = 1 everywhere, so the advantages are the n=4 returns minus 1
    algo = make_algorithm(a2c_spec(gamma=0.5, lam=None, num_step_returns=4, training_frequency=1), num_envs=2)
    value_from_first_entry(algo)
    seen = {}
    monkeypatch.setattr(algo, 'train', lambda batch: seen.setdefault('batch', batch))
    for step in range(4):
        obs, next_obs = np.ones((2, 4), np.float32), np.zeros((2, 4), np.float32)
        next_obs[:, 0] = NSTEP_CASE['next_values'][step]
        algo.update(obs, np.zeros(2, np.int64), np.array(NSTEP_CASE['rewards'][step], np.float32), next_obs,
                    np.array(NSTEP_CASE['terminateds'][step], bool), np.array(NSTEP_CASE['truncateds'][step], bool))
        assert ('batch' in seen) == (step == 3)
    rollout = algo.rollout(seen['batch'])
    advs, targets = algo.advantages_and_targets(rollout, torch.ones(4, 2))
    torch.testing.assert_close(targets, t(NSTEP_EXPECTED[4]).reshape(-1))
    torch.testing.assert_close(advs, t(NSTEP_EXPECTED[4]).reshape(-1) - 1)


# --- GAE and plain returns through the algorithm, on whole episodes ---------------------------------
# gamma = lam = 0.5; episode A: 2 steps, terminated; episode B: 1 step, truncated. rewards 1 1 1,
# V(s) 1 2 3, V(s') 2 10 5.
# deltas: 1 + 0.5*2 - 1 = 1;  1 + 0 - 2 = -1 (terminated: no bootstrap);  1 + 0.5*5 - 3 = 0.5
# GAE: A2 = 0.5; A1 = -1 (episode end); A0 = 1 + 0.25*(-1) = 0.75; targets A + V = 1.75, 1, 3.5
# plain returns (no bootstrap, cut at each end): G = 1 + 0.5*1 = 1.5, 1, 1; advantages G - V = 0.5, -1, -2
EPISODES = {'rewards': [1, 1, 1], 'values': [1, 2, 3], 'next_values': [2, 10, 5],
            'terminated': [False, True, False], 'truncated': [False, False, True]}


def episode_rollout(algo):
    value_from_first_entry(algo)
    for step in range(3):
        obs, next_obs = np.zeros((1, 4), np.float32), np.zeros((1, 4), np.float32)
        obs[0, 0], next_obs[0, 0] = EPISODES['values'][step], EPISODES['next_values'][step]
        algo.memory.add(obs, np.zeros(1, np.int64), np.array([EPISODES['rewards'][step]], np.float32), next_obs,
                        np.array([EPISODES['terminated'][step]]), np.array([EPISODES['truncated'][step]]))
    assert algo.train_due()
    return algo.rollout(algo.memory.sample())


def test_a2c_gae_on_episodes_bootstraps_truncation_not_termination():
    algo = make_algorithm(a2c_spec('OnPolicyReplay', gamma=0.5, lam=0.5, training_frequency=2))
    rollout = episode_rollout(algo)
    advs, targets = algo.advantages_and_targets(rollout, t(EPISODES['values'])[:, None])
    torch.testing.assert_close(advs, t([0.75, -1, 0.5]))
    torch.testing.assert_close(targets, t([1.75, 1, 3.5]))


def test_a2c_plain_returns_without_lam_or_num_step_returns():
    algo = make_algorithm(a2c_spec('OnPolicyReplay', gamma=0.5, lam=None, training_frequency=2))
    rollout = episode_rollout(algo)
    advs, targets = algo.advantages_and_targets(rollout, t(EPISODES['values'])[:, None])
    # the truncated last episode bootstraps from V of its final observation: 1 + 0.5 * 5
    torch.testing.assert_close(targets, t([1.5, 1, 3.5]))
    torch.testing.assert_close(advs, t([0.5, -1, 0.5]))


def test_episode_returns_stop_at_termination_bootstrap_truncation_and_cut_at_the_batch_end():
    # gamma 0.5; env 0: r 1, 2 (terminated), then 4 running at the batch end (cut, no bootstrap)
    #   R = [1 + 0.5*2, 2, 4] = [2, 2, 4]
    # env 1: r 1 (truncated, V(s') 8), then 1, 1 running
    #   R = [1 + 0.5*8, 1 + 0.5*1, 1] = [5, 1.5, 1]
    rewards = t([[1, 1], [2, 1], [4, 1]])
    next_values = t([[7, 8], [7, 7], [7, 7]])
    terminateds = t([[0, 0], [1, 0], [0, 0]])
    dones = t([[0, 1], [1, 0], [0, 0]])
    torch.testing.assert_close(episode_returns(rewards, next_values, terminateds, dones, 0.5),
                               t([[2, 5], [2, 1.5], [4, 1]]))


# --- losses -------------------------------------------------------------------------------------

def test_policy_loss_weights_the_policy_term_and_the_entropy_bonus():
    # -2 * mean(-1*1, -2*-1) - 0.1 * mean(0.5, 0.7) = -2 * 0.5 - 0.06 = -1.06
    loss = actor_critic_policy_loss(t([-1, -2]), t([1, -1]), t([0.5, 0.7]), policy_loss_coef=2.0, entropy_coef=0.1)
    torch.testing.assert_close(loss, torch.tensor(-1.06))


def test_standardize_uses_the_sample_std_and_keeps_a_single_value():
    # [1, 3]: mean 2, sample std sqrt(2) -> -1/sqrt(2), 1/sqrt(2)
    torch.testing.assert_close(standardize(t([1, 3])), t([-1, 1]) / math.sqrt(2))
    torch.testing.assert_close(standardize(t([5])), t([5]))


def test_a2c_policy_loss_standardizes_the_advantages_first():
    # uniform policy over 2 actions: log pi = -ln 2, H = ln 2. Advantages 1, 3 standardise to
    # -1/sqrt(2), 1/sqrt(2), whose mean weight is 0: loss = -0.01 * ln 2 (raw ones would add 2 ln 2)
    algo = make_algorithm(a2c_spec())
    pd = torch.distributions.Categorical(logits=torch.zeros(2, 2))
    loss, entropy = algo.policy_loss(pd, torch.tensor([0, 1]), t([1, 3]))
    torch.testing.assert_close(loss, torch.tensor(-0.01 * math.log(2)))
    torch.testing.assert_close(entropy, torch.tensor(math.log(2)))


def test_a2c_policy_loss_takes_raw_advantages_without_normalize_advantage():
    # as SB3's A2C: advantages 1, 3 weigh log pi = -ln 2 as they are: loss = 2 ln 2 - 0.01 ln 2
    algo = make_algorithm(a2c_spec(normalize_advantage=False))
    pd = torch.distributions.Categorical(logits=torch.zeros(2, 2))
    loss, _ = algo.policy_loss(pd, torch.tensor([0, 1]), t([1, 3]))
    torch.testing.assert_close(loss, torch.tensor(2 * math.log(2) - 0.01 * math.log(2)))


def test_return_normalizer_merges_batches_and_scales_by_the_running_std():
    norm = ReturnNormalizer()
    torch.testing.assert_close(norm.scale(t([3.0])), t([3.0]))  # var 1 before any target: unchanged
    norm.update(t([1, 3]))  # mean 2, population var 1
    assert (norm.mean, norm.var, norm.count) == (2.0, 1.0, 2)
    norm.update(t([6]))  # [1, 3, 6]: mean 10/3, population var (49 + 1 + 64) / 9 / 3 = 38/9
    assert norm.mean == pytest.approx(10 / 3) and norm.var == pytest.approx(38 / 9) and norm.count == 3
    std = math.sqrt(38 / 9)
    # divided by the std, clipped at 10: 30 / 2.055 = 14.6 -> 10
    torch.testing.assert_close(norm.scale(t([std, -2 * std, 30])), t([1, -2, 10]))
    restored = ReturnNormalizer()
    restored.load_state_dict(norm.state_dict())
    assert restored.state_dict() == norm.state_dict()


def test_return_normalizer_never_enlarges_small_targets():
    norm = ReturnNormalizer()
    norm.update(t([0.1, 0.2, 0.3]))  # std 0.08 < 1: divided by 1
    torch.testing.assert_close(norm.scale(t([0.5, -0.5])), t([0.5, -0.5]))


def test_normalize_v_targets_scales_both_sides_of_the_value_loss():
    algo = make_algorithm(a2c_spec(normalize_v_targets=True, val_loss_coef=0.5))
    # targets [0, 4]: population var 4, std 2 -> MSE((1, 3) / 2, (0, 4) / 2) = (0.25 + 0.25) / 2 = 0.25
    loss = algo.value_loss(t([1, 3]), t([0, 4]))
    torch.testing.assert_close(loss, torch.tensor(0.5 * 0.25))
    plain = make_algorithm(a2c_spec(val_loss_coef=0.5))
    torch.testing.assert_close(plain.value_loss(t([1, 3]), t([0, 4])), torch.tensor(0.5 * 1.0))


# --- optimizers ----------------------------------------------------------------------------------

def rollout_steps(algo, num_envs: int, steps: int, seed: int = 0):
    """Feed `steps` random vector steps (a few episode ends among them); returns the last metrics."""
    rng = np.random.default_rng(seed)
    metrics = None
    for _ in range(steps):
        obs = rng.normal(size=(num_envs, 4)).astype(np.float32)
        metrics = algo.update(obs, rng.integers(0, 2, num_envs), rng.normal(size=num_envs).astype(np.float32),
                              rng.normal(size=(num_envs, 4)).astype(np.float32), rng.random(num_envs) < 0.1,
                              rng.random(num_envs) < 0.1) or metrics
        algo.clock.tick()
    return metrics


SEPARATE = {'shared': False, 'actor_optim_spec': {'name': 'Adam', 'lr': 0.01},
            'critic_optim_spec': {'name': 'Adam', 'lr': 0.01}}


def test_separate_nets_step_the_actor_on_the_policy_loss_and_the_critic_on_the_value_loss():
    # the value loss's weight cannot move the actor: same actor after an update, different critic
    algos = [make_algorithm(a2c_spec(net=SEPARATE, val_loss_coef=coef), num_envs=2) for coef in (1.0, 0.1)]
    for algo in algos:
        assert set(algo.optimizers) == {'actor', 'critic'}
        assert rollout_steps(algo, 2, 8) is not None
        assert algo.clock.opt_step == 2  # one step each, as SLM-Lab ticks
    (a, b) = [dict(algo.model.named_parameters()) for algo in algos]
    for name in a:
        same = torch.equal(a[name], b[name])
        assert same == name.startswith('actor'), name


def test_a_shared_net_steps_once_on_the_sum():
    algos = [make_algorithm(a2c_spec(net={'shared': True}, val_loss_coef=coef), num_envs=2) for coef in (1.0, 0.1)]
    for algo in algos:
        assert set(algo.optimizers) == {'net'}
        rollout_steps(algo, 2, 8)
        assert algo.clock.opt_step == 1
    a, b = (algo.model.body.state_dict() for algo in algos)
    assert any(not torch.equal(a[k], b[k]) for k in a), 'the value loss weight must reach the shared body'


def test_continuous_actions_train():
    spec = a2c_spec(env='Pendulum-v1', net=SEPARATE)
    spec = validate_spec(spec)
    env = gym.make('Pendulum-v1')
    agent = Agent(spec, env.observation_space, env.action_space, 1, Clock(100, 1), seed=0)
    obs, _ = env.reset(seed=0)
    metrics = None
    for _ in range(16):
        action = agent.act(obs[None])
        next_obs, reward, terminated, truncated, _ = env.step(action[0])
        metrics = agent.update(obs[None], action, np.array([reward], np.float32), next_obs[None],
                               np.array([terminated]), np.array([truncated])) or metrics
        agent.algorithm.clock.tick()
        obs = next_obs
    assert metrics is not None and math.isfinite(metrics['loss'])


# --- spec rules -----------------------------------------------------------------------------------

def test_a2c_is_not_an_algorithm_name():
    # SLM-Lab's code has no class A2C (its cont_test.json cannot run there either)
    spec = a2c_spec()
    spec['agent']['algorithm']['name'] = 'A2C'
    with pytest.raises(SpecError, match=r"agent.algorithm.name: unknown algorithm 'A2C'.*ActorCritic"):
        validate_spec(spec)


@pytest.mark.parametrize('key, value, match', [
    ('action_policy', 'epsilon_greedy', 'agent.algorithm.action_policy'),
    ('action_pdtype', 'Argmax', 'agent.algorithm.action_pdtype'),
    ('num_step_returns', 0, 'agent.algorithm.num_step_returns'),
])
def test_a2c_refuses_what_its_gradient_cannot_use(key, value, match):
    spec = a2c_spec(**{key: value}, explore_var_spec={'name': 'no_decay', 'start_val': 0.1})
    with pytest.raises(SpecError, match=match):
        validate_spec(spec)


def test_a2c_refuses_a_replay_memory():
    spec = a2c_spec('Replay')
    with pytest.raises(SpecError, match='agent.memory.name'):
        validate_spec(spec)


# --- exact resume -----------------------------------------------------------------------------------

# A2C's exact resume: separate nets, 4 envs, 1200 frames, a record every 200
RESUME = {'net': SEPARATE, 'num_envs': 4, 'max_frame': 1200, 'log_frequency': 200}


@pytest.mark.slow
def test_a2c_nstep_with_normalized_v_targets_resumes_exactly_after_max_frame(tmp_path):
    spec = a2c_spec(**RESUME, lam=None, num_step_returns=5, normalize_v_targets=True)
    spec['agent']['net'] = {'type': 'MLPNet', 'hid_layers': [16], 'shared': True,
                            'optim_spec': {'name': 'RMSprop', 'lr': 1e-3}}
    check_resume_after_max_frame(tmp_path, 'a2c_nstep', spec)


@pytest.mark.slow
@pytest.mark.subprocess
def test_a2c_resumes_exactly_after_sigterm(tmp_path):
    spec = a2c_spec(**RESUME, training_frequency=16)
    check_resume_after_sigterm(tmp_path, 'a2c_sigterm', spec)
