"""SIL and PPOSIL: the self-imitation maths on hand-computed batches, the SIL replay's episode
returns (terminated vs truncated), the training step, the spec keys, and exact resume."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from conftest import make_agent
from slm_lab.agent.algorithm.sil import PPOSIL as PPOSIL_CLASS, sil_losses, sil_returns
from slm_lab.agent.memory.sil_replay import PrioritizedSILReplay, SILReplay, episode_return_parts
from slm_lab.lib.errors import SpecError
from slm_lab.spec import validate_spec
from lab_helpers import check_resume_after_max_frame, run_dirs, write_spec

NET = {'type': 'MLPNet', 'hid_layers': [32], 'hid_layers_activation': 'tanh',
       'optim_spec': {'name': 'Adam', 'lr': 1e-3}}
SIL_MEMORY = {'sil_replay_name': 'Replay', 'batch_size': 16, 'max_size': 2000, 'use_cer': True}
SIL = {
    'agent': {'name': 'SIL',
              'algorithm': {'name': 'SIL', 'gamma': 0.99, 'lam': 0.95, 'training_frequency': 1,
                            'entropy_coef_spec': {'name': 'no_decay', 'start_val': 0.01},
                            'val_loss_coef': 0.5, 'sil_policy_loss_coef': 1.0, 'sil_val_loss_coef': 0.1,
                            'training_iter': 2, 'training_batch_iter': 2},
              'memory': {'name': 'OnPolicyReplay', **SIL_MEMORY},
              'net': NET},
    'env': {'name': 'CartPole-v1', 'num_envs': 1, 'max_frame': 1000},
    'meta': {'log_frequency': 250, 'eval_frequency': 500, 'random_seed': 3, 'snapshot_replay': True},
}
PPOSIL = {
    'agent': {'name': 'PPOSIL',
              'algorithm': {'name': 'PPOSIL', 'gamma': 0.99, 'lam': 0.95, 'time_horizon': 32, 'minibatch_size': 32,
                            'training_epoch': 2, 'entropy_coef_spec': {'name': 'no_decay', 'start_val': 0.01},
                            'val_loss_coef': 0.5, 'sil_policy_loss_coef': 1.0, 'sil_val_loss_coef': 0.01,
                            'training_iter': 2, 'training_batch_iter': 2},
              'memory': {'name': 'OnPolicyBatchReplay', **SIL_MEMORY},
              'net': {**NET, 'shared': False, 'clip_grad_val': 0.5, 'use_same_optim': False,
                      'actor_optim_spec': {'name': 'Adam', 'lr': 3e-4},
                      'critic_optim_spec': {'name': 'Adam', 'lr': 1e-3}}},
    'env': {'name': 'CartPole-v1', 'num_envs': 4, 'max_frame': 2000},
    'meta': {'log_frequency': 500, 'eval_frequency': 1000, 'random_seed': 5, 'snapshot_replay': True},
}


# --- maths --------------------------------------------------------------------------------------

def test_episode_return_parts_bootstrap_only_a_truncated_episode():
    # rewards 1, 2, 3 and gamma 0.5: R_2 = 3, R_1 = 2 + 0.5 * 3 = 3.5, R_0 = 1 + 0.5 * 3.5 = 2.75
    sums, boots = episode_return_parts(np.array([1.0, 2.0, 3.0]), 0.5, truncated=False)
    np.testing.assert_allclose(sums, [2.75, 3.5, 3.0])
    np.testing.assert_array_equal(boots, [0.0, 0.0, 0.0])
    # truncated: V(s_T) weighs gamma^(T-t): 0.5^3, 0.5^2, 0.5
    sums, boots = episode_return_parts(np.array([1.0, 2.0, 3.0]), 0.5, truncated=True)
    np.testing.assert_allclose(sums, [2.75, 3.5, 3.0])
    np.testing.assert_allclose(boots, [0.125, 0.25, 0.5])


def test_sil_returns_add_the_discounted_final_value():
    returns = sil_returns(torch.tensor([2.75, 3.5, 3.0]), torch.tensor([0.125, 0.25, 0.5]), torch.tensor([4.0] * 3))
    torch.testing.assert_close(returns, torch.tensor([3.25, 4.5, 5.0]))


def test_sil_losses_imitate_only_better_than_expected_actions():
    log_probs = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    values = torch.tensor([1.0, 3.0, 0.0], requires_grad=True)
    returns = torch.tensor([2.0, 2.0, 3.0])
    policy_loss, value_loss = sil_losses(log_probs, values, returns)
    # A+ = max(R - V, 0) = [1, 0, 3]
    # L_pi = -mean(log_prob * A+) = -(-1 + 0 - 1.5) / 3;  L_V = 0.5 * mean(A+^2) = 0.5 * (1 + 0 + 9) / 3
    torch.testing.assert_close(policy_loss, torch.tensor(2.5 / 3))
    torch.testing.assert_close(value_loss, torch.tensor(5.0 / 3))
    (policy_loss + value_loss).backward()
    # the policy term weighs log-probabilities by A+ and sends no gradient into V
    torch.testing.assert_close(log_probs.grad, torch.tensor([-1.0, 0.0, -3.0]) / 3)
    # the value term pulls V up towards R where R > V only: dL_V/dV = -A+ / B
    torch.testing.assert_close(values.grad, torch.tensor([-1.0, 0.0, -3.0]) / 3)


def test_sil_losses_weigh_each_sample_by_its_importance_weight():
    log_probs = torch.tensor([-1.0, -2.0, -0.5])
    values = torch.tensor([1.0, 3.0, 0.0])
    returns = torch.tensor([2.0, 2.0, 3.0])
    policy_loss, value_loss = sil_losses(log_probs, values, returns, torch.tensor([0.5, 1.0, 0.25]))
    # A+ = [1, 0, 3]: L_pi = -(0.5 * -1 + 0 + 0.25 * -1.5) / 3, L_V = (0.5 * 0.5 + 0 + 0.25 * 4.5) / 3
    torch.testing.assert_close(policy_loss, torch.tensor(0.875 / 3))
    torch.testing.assert_close(value_loss, torch.tensor(1.375 / 3))


# --- the SIL replay -----------------------------------------------------------------------------

def make_replay(num_envs: int = 2, gamma: float = 0.5, persist: bool = True, **memory) -> SILReplay:
    spec = {'batch_size': 4, 'max_size': 10, 'use_cer': False, **memory}
    return SILReplay(spec, gym.spaces.Box(-10, 10, (1,)), gym.spaces.Discrete(2), num_envs, gamma,
                     np.random.default_rng(0), persist=persist)


def step(replay: SILReplay, t: int, rewards, terminated, truncated):
    """One vector step of two sub-envs whose observation is [10 * env + t]."""
    obs = np.array([[t], [10 + t]], dtype=np.float32)
    replay.add(obs, np.array([t % 2, 1]), np.array(rewards, dtype=np.float32), obs + 0.5,
               np.array(terminated), np.array(truncated))


def test_replay_stores_episodes_when_they_end_with_their_returns():
    replay = make_replay()
    # env 0 terminates at t=1; env 1 is truncated at t=2; env 0's next episode is still running at t=2
    step(replay, 0, [1.0, 1.0], [False, False], [False, False])
    step(replay, 1, [2.0, 2.0], [True, False], [False, False])
    assert len(replay) == 2  # env 0's episode only
    np.testing.assert_allclose(replay.reward_sums[:2], [2.0, 2.0])  # 1 + 0.5 * 2, then 2
    np.testing.assert_array_equal(replay.boot_discounts[:2], [0.0, 0.0])
    np.testing.assert_array_equal(replay.final_states[:2, 0], [1.5, 1.5])
    step(replay, 2, [4.0, 4.0], [False, False], [False, True])
    assert len(replay) == 5
    np.testing.assert_array_equal(replay.states[2:5, 0], [10, 11, 12])
    np.testing.assert_allclose(replay.reward_sums[2:5], [1 + 0.5 * 2 + 0.25 * 4, 2 + 0.5 * 4, 4.0])
    np.testing.assert_allclose(replay.boot_discounts[2:5], [0.125, 0.25, 0.5])
    np.testing.assert_array_equal(replay.final_states[2:5, 0], [12.5] * 3)
    assert [len(e['rewards']) for e in replay.running] == [1, 0]


def test_obs_dtype_float16_stores_the_sil_replays_observations_in_half_the_memory():
    """agent.memory.obs_dtype "float16": the SIL replay stores states and final states as SLM-Lab
    v5's replays do, rounded to float16; its batches go to the nets as float32 (to_tensor), and the
    storage estimate counts the smaller rows."""
    from slm_lab.agent.memory.base import to_tensor
    half, plain = make_replay(obs_dtype='float16'), make_replay()
    for replay in (half, plain):
        step(replay, 0, [1.0, 1.0], [False, False], [False, False])
        step(replay, 1, [2.0, 2.0], [True, True], [False, False])
    assert half.states.dtype == half.final_states.dtype == np.float16 and plain.states.dtype == np.float32
    assert half.states.nbytes * 2 == plain.states.nbytes
    np.testing.assert_array_equal(half.states, plain.states.astype(np.float16))
    np.testing.assert_array_equal(half.final_states, plain.final_states.astype(np.float16))
    batch = half.sample()
    assert batch.states.dtype == np.float16 and to_tensor(batch.states, 'cpu').dtype == torch.float32
    spec = validate_spec(copy.deepcopy(PPOSIL))
    obs, actions = gym.spaces.Box(-10, 10, (4,)), gym.spaces.Discrete(2)
    full = {n.what: n.nbytes for n in PPOSIL_CLASS.owned_replay_needs(spec, obs, actions)}
    spec['agent']['memory']['obs_dtype'] = 'float16'
    smaller = {n.what: n.nbytes for n in PPOSIL_CLASS.owned_replay_needs(validate_spec(spec), obs, actions)}
    max_size = spec['agent']['memory']['max_size']
    assert full['SIL replay'] - smaller['SIL replay'] == max_size * 2 * 4 * 2  # two observations of 4


def test_an_episode_both_terminated_and_truncated_is_not_bootstrapped():
    replay = make_replay()
    step(replay, 0, [1.0, 1.0], [True, False], [True, False])
    np.testing.assert_array_equal(replay.boot_discounts[:1], [0.0])


def test_replay_wraps_around_and_keeps_the_end_of_an_episode_longer_than_itself():
    replay = make_replay(num_envs=1, max_size=3)
    for t in range(5):
        replay.add(np.array([[t]], dtype=np.float32), np.array([0]), np.array([1.0]), np.array([[t + 1]]),
                   np.array([t == 4]), np.array([False]))
    assert len(replay) == 3
    assert sorted(replay.states[:, 0]) == [2, 3, 4]
    np.testing.assert_allclose(sorted(replay.reward_sums), [1.0, 1.5, 1.75])


def test_cer_puts_the_newest_transition_last_in_every_batch():
    replay = make_replay(use_cer=True, batch_size=3)
    step(replay, 0, [1.0, 1.0], [False, False], [False, False])
    step(replay, 1, [2.0, 2.0], [True, True], [False, False])  # env 1's two steps are stored last
    for _ in range(5):
        assert replay.sample().states[-1, 0] == 11


def test_prioritized_replay_draws_by_clipped_advantage_and_weighs_by_beta():
    spec = {'batch_size': 4, 'max_size': 10, 'use_cer': False, 'alpha': 1.0, 'epsilon': 0.0, 'beta': 0.5}
    replay = PrioritizedSILReplay(spec, gym.spaces.Box(-10, 10, (1,)), gym.spaces.Discrete(2), 2, 0.5,
                                  np.random.default_rng(0), persist=True)
    step(replay, 0, [1.0, 1.0], [True, True], [False, False])
    np.testing.assert_allclose(replay.tree.leaves[:2], [100000.0, 100000.0])  # new: an error of 100000
    replay.update_priorities(np.array([0, 1]), np.array([3.0, 1.0]))
    np.testing.assert_allclose(replay.tree.leaves[:2], [3.0, 1.0])  # (A+ + 0)^1
    batch = replay.sample()
    assert set(batch.indices) <= {0, 1}
    # P = [3/4, 1/4], n = 2: w = (2 P)^-0.5 = [sqrt(2/3), sqrt(2)], over the batch maximum
    expected = {0: np.sqrt(2 / 3), 1: np.sqrt(2)}
    raw = np.array([expected[i] for i in batch.indices])
    np.testing.assert_allclose(batch.weights, raw / raw.max(), rtol=1e-6)
    counts = np.bincount(np.concatenate([replay.sample().indices for _ in range(300)]), minlength=2)
    assert 0.7 < counts[0] / counts.sum() < 0.8  # drawn in proportion 3 : 1
    # the priorities are state: they come back with the buffer
    copy_ = PrioritizedSILReplay(spec, gym.spaces.Box(-10, 10, (1,)), gym.spaces.Discrete(2), 2, 0.5,
                                 np.random.default_rng(0), persist=True)
    copy_.load_state_dict(copy.deepcopy(replay.state_dict()))
    np.testing.assert_array_equal(copy_.tree.nodes, replay.tree.nodes)


def test_replay_state_round_trips_with_persist_and_empties_without():
    replay = make_replay()
    for t in range(3):
        step(replay, t, [t, t], [t == 1, False], [False, False])
    copy_ = make_replay()
    copy_.load_state_dict(copy.deepcopy(replay.state_dict()))
    for key in SILReplay.ARRAY_KEYS:
        np.testing.assert_array_equal(getattr(copy_, key)[:len(replay)], getattr(replay, key)[:len(replay)])
    assert (copy_.head, copy_.size) == (replay.head, replay.size)
    # the running episodes continue: ending them stores the same returns in both
    for r in (replay, copy_):
        step(r, 3, [5.0, 5.0], [True, True], [False, False])
    for key in SILReplay.ARRAY_KEYS:
        np.testing.assert_array_equal(getattr(copy_, key), getattr(replay, key))
    unsaved = make_replay(persist=False)
    for t in range(2):
        step(unsaved, t, [1.0, 1.0], [True, True], [False, False])
    assert unsaved.state_dict() == {'persisted': False}
    unsaved.load_state_dict({'persisted': False})
    assert len(unsaved) == 0 and all(len(e['rewards']) == 0 for e in unsaved.running)


# --- the algorithms ----------------------------------------------------------------------------------

def sil_agent(spec: dict, **memory):
    spec = copy.deepcopy(spec)
    spec['agent']['memory'].update(memory)
    return make_agent(spec)


def fill(algorithm, rewards=(1.0,) * 20, truncated: bool = True) -> None:
    """One finished episode of len(rewards) steps per sub-env in the SIL replay."""
    n = algorithm.num_envs  # the same episode in every sub-env, one step apart in scale
    obs = np.linspace(-0.05, 0.05, 4, dtype=np.float32) * np.arange(1, n + 1, dtype=np.float32)[:, None]
    for t, r in enumerate(rewards):
        last = t == len(rewards) - 1
        algorithm.sil_replay.add(obs * t, np.full(n, t % 2), np.full(n, r), obs * (t + 1),
                                 np.full(n, last and not truncated), np.full(n, last and truncated))


@pytest.mark.parametrize('base', [SIL, PPOSIL])
def test_a_sil_step_trains_on_the_bootstrapped_returns_with_both_coefficients(base, monkeypatch):
    from slm_lab.agent.algorithm import sil
    agent, clock = sil_agent(base)
    algo = agent.algorithm
    fill(algo)
    seen = []

    def spy(log_probs, values, returns, weights=None):
        seen.append((log_probs.detach(), values.detach(), returns))
        return sil_losses(log_probs, values, returns, weights)
    monkeypatch.setattr(sil, 'sil_losses', spy)
    # the first batch's indices, drawn with the algorithm's generator (use_cer: the newest last)
    rng = np.random.default_rng()
    rng.bit_generator.state = algo.rng.bit_generator.state
    replay = algo.sil_replay
    idx = rng.integers(0, len(replay), size=replay.batch_size)
    idx[-1] = replay.head - 1
    with torch.no_grad():
        final_values = algo.model.value(torch.as_tensor(replay.final_states[idx]))
    expected = torch.as_tensor(replay.reward_sums[idx]) + torch.as_tensor(replay.boot_discounts[idx]) * final_values
    before = [p.detach().clone() for p in algo.model.parameters()]
    steps = clock.opt_step
    metrics = algo.train_sil({'loss': 1.0, 'entropy': 0.5, 'grad_norm': 0.1})
    spec = base['agent']['algorithm']
    assert clock.opt_step - steps == spec['training_iter'] * spec['training_batch_iter']
    assert len(seen) == spec['training_iter'] * spec['training_batch_iter']
    torch.testing.assert_close(seen[0][2], expected)
    # the loss reported is the on-policy loss plus the mean SIL loss, weighted by both coefficients
    sil_loss = np.mean([spec['sil_policy_loss_coef'] * float(sil_losses(lp, v, r)[0])
                        + spec['sil_val_loss_coef'] * float(sil_losses(lp, v, r)[1]) for lp, v, r in seen])
    assert metrics['loss'] == pytest.approx(1.0 + sil_loss, rel=1e-5)
    assert metrics['entropy'] == 0.5
    # every net trained: the critic too (SLM-Lab steps only the actor's optimizer with separate nets)
    changed = [not torch.equal(b, p) for b, p in zip(before, algo.model.parameters())]
    assert all(changed)


def run_steps(agent, clock, env_name: str, steps: int, seed: int = 0):
    """Drive an agent as a session does (act, step, update, tick) for `steps` vector steps;
    yields (metrics, optimizer steps taken by that update) per step."""
    env = gym.make_vec(env_name, num_envs=clock.num_envs, vectorization_mode='sync',
                       vector_kwargs={'autoreset_mode': gym.vector.AutoresetMode.SAME_STEP})
    obs, _ = env.reset(seed=seed)
    for _ in range(steps):
        action = agent.act(obs)
        next_obs, reward, terminated, truncated, info = env.step(action)
        final = next_obs.copy()
        if 'final_obs' in info:
            for i in np.flatnonzero(info['_final_obs']):
                final[i] = info['final_obs'][i]
        before = clock.opt_step
        metrics = agent.update(obs, action, reward, final, terminated, truncated)
        yield metrics, clock.opt_step - before
        clock.tick(int(np.sum(terminated | truncated)))
        obs = next_obs
    env.close()


def test_sil_updates_follow_each_on_policy_update_once_the_replay_holds_a_batch():
    agent, clock = sil_agent(SIL, batch_size=60)
    algo = agent.algorithm
    updates = []
    for metrics, opt_steps in run_steps(agent, clock, 'CartPole-v1', 400):
        if metrics is not None:
            updates.append((len(algo.sil_replay), opt_steps))
    sil_steps = SIL['agent']['algorithm']['training_iter'] * SIL['agent']['algorithm']['training_batch_iter']
    # one A2C step per finished episode (a shared net: one optimizer), plus the SIL steps once
    # the finished episodes hold batch_size transitions
    assert updates and {steps for size, steps in updates if size < 60} == {1}
    assert {steps for size, steps in updates if size >= 60} == {1 + sil_steps}
    assert any(size < 60 for size, _ in updates) and any(size >= 60 for size, _ in updates)


def test_sil_trains_continuous_actions():
    spec = copy.deepcopy(PPOSIL)
    spec['env'] = {'name': 'Pendulum-v1', 'num_envs': 2, 'max_frame': 1000}
    spec['agent']['memory']['batch_size'] = 8
    agent, clock = make_agent(spec)
    trained = [steps for metrics, steps in run_steps(agent, clock, 'Pendulum-v1', 250) if metrics is not None]
    assert agent.algorithm.sil_replay.actions.dtype == np.float32 and len(agent.algorithm.sil_replay) == 400
    assert trained[-1] > trained[0]  # SIL steps after PPO's once episodes (200 steps) have ended


# --- spec keys ----------------------------------------------------------------------------------

def test_sil_keys_are_read_from_the_algorithm_and_memory_sections():
    spec = validate_spec(copy.deepcopy(PPOSIL))
    assert spec['agent']['memory'] == {'name': 'OnPolicyBatchReplay', **SIL_MEMORY, 'obs_dtype': None}
    bare = copy.deepcopy(SIL)
    for key in ('sil_policy_loss_coef', 'sil_val_loss_coef', 'training_iter', 'training_batch_iter'):
        del bare['agent']['algorithm'][key]
    bare['agent']['memory'] = {'name': 'OnPolicyReplay'}
    spec = validate_spec(bare)
    algo, memory = spec['agent']['algorithm'], spec['agent']['memory']
    assert (algo['sil_policy_loss_coef'], algo['sil_val_loss_coef'], algo['training_iter'],
            algo['training_batch_iter']) == (1.0, 0.01, 1, 1)
    assert memory == {'name': 'OnPolicyReplay', 'sil_replay_name': 'Replay', 'batch_size': 32, 'max_size': 10000,
                      'use_cer': False, 'obs_dtype': None}


@pytest.mark.parametrize('where, value, message', [
    ('memory.sil_replay_name', 'Replays', "agent.memory.sil_replay_name: \"Replays\" is not valid (did you mean "
                                          "'Replay'?)"),
    ('memory.batch_size', 0, 'agent.memory.batch_size: 0 is out of range'),
    ('algorithm.sil_val_loss_coef', -1, 'agent.algorithm.sil_val_loss_coef: -1 is out of range'),
    ('memory.name', 'Replay', "agent.memory.name: PPOSIL cannot use 'Replay'"),
])
def test_bad_sil_keys_are_refused_by_their_path(where, value, message):
    spec = copy.deepcopy(PPOSIL)
    section, key = where.split('.')
    spec['agent'][section][key] = value
    with pytest.raises(SpecError, match='^' + re.escape(message)):
        validate_spec(spec)


def test_a_prioritized_sil_replay_takes_the_priority_keys_and_updates_priorities_from_a_plus(monkeypatch):
    from slm_lab.agent.algorithm import sil
    spec = copy.deepcopy(SIL)
    spec['agent']['memory'].update(sil_replay_name='PrioritizedReplay', alpha=0.5, beta=0.4)
    validated = validate_spec(copy.deepcopy(spec))['agent']['memory']
    assert (validated['alpha'], validated['beta']) == (0.5, 0.4) and 'epsilon' not in validated
    agent, _ = make_agent(spec)
    algo = agent.algorithm
    assert isinstance(algo.sil_replay, PrioritizedSILReplay) and algo.sil_replay.epsilon == 1e-4
    fill(algo)
    seen = []

    def spy(log_probs, values, returns, weights=None):
        seen.append((values.detach(), returns, weights))
        return sil_losses(log_probs, values, returns, weights)
    monkeypatch.setattr(sil, 'sil_losses', spy)
    updates = []
    update_priorities = algo.sil_replay.update_priorities
    monkeypatch.setattr(algo.sil_replay, 'update_priorities',
                        lambda idx, advs: (updates.append((idx.copy(), advs.copy())), update_priorities(idx, advs)))
    algo.train_sil({'loss': 0.0, 'entropy': 0.0, 'grad_norm': 0.0})
    assert all(w is not None and len(w) == 16 for _, _, w in seen)
    assert len(updates) == SIL['agent']['algorithm']['training_iter']  # once per batch
    # each batch's new priorities come from A+ = max(R - V, 0) of its last step
    per_batch = SIL['agent']['algorithm']['training_batch_iter']
    for (idx, advs), (values, returns, _) in zip(updates, seen[per_batch - 1::per_batch]):
        np.testing.assert_allclose(advs, (returns - values).clamp(min=0.0).numpy())
    idx, advs = updates[-1]
    last = {i: a for i, a in zip(idx, advs)}  # a slot drawn twice keeps its last value
    np.testing.assert_allclose(algo.sil_replay.tree.leaves[list(last)],
                               np.power(np.array(list(last.values()), dtype=np.float64) + 1e-4, 0.5), rtol=1e-6)


def test_priority_keys_need_a_prioritized_sil_replay():
    spec = copy.deepcopy(SIL)
    spec['agent']['memory']['alpha'] = 0.6
    with pytest.raises(SpecError, match=r'^agent\.memory\.alpha: a priority key, for a prioritized SIL replay only'):
        validate_spec(spec)


def test_sil_keys_are_unknown_to_an_algorithm_without_self_imitation():
    spec = copy.deepcopy(SIL)
    spec['agent']['algorithm']['name'] = 'ActorCritic'
    with pytest.raises(SpecError, match="agent.algorithm.sil_policy_loss_coef: unknown key"):
        validate_spec(spec)
    for key in ('sil_policy_loss_coef', 'sil_val_loss_coef', 'training_iter', 'training_batch_iter'):
        del spec['agent']['algorithm'][key]
    with pytest.raises(SpecError, match="agent.memory.sil_replay_name: unknown key"):
        validate_spec(spec)


# --- resume ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_sil_with_a_prioritized_replay_resumes_exactly_after_max_frame(tmp_path):
    spec = copy.deepcopy(SIL)
    spec['agent']['memory'].update(sil_replay_name='PrioritizedReplay', beta=0.4)
    check_resume_after_max_frame(tmp_path, 'silper', spec)



@pytest.mark.slow
def test_sil_with_a_float16_replay_resumes_exactly_after_max_frame(tmp_path):
    spec = copy.deepcopy(SIL)
    spec['agent']['memory'].update(obs_dtype='float16')
    check_resume_after_max_frame(tmp_path, 'silf16', spec)


@pytest.mark.slow
def test_a_resume_without_the_sil_replay_says_it_is_approximate(tmp_path):
    from slm_lab import lab
    spec = copy.deepcopy(SIL)
    spec['meta']['snapshot_replay'] = False
    spec_file = write_spec(tmp_path, 'silnosnap', spec)
    data = str(tmp_path / 'data')
    lab.run(spec_file, 'silnosnap', 'train', data_dir=data)
    lab.run(spec_file, 'silnosnap', 'train@latest', ['env.max_frame=2000'], data_dir=data)
    (run,) = run_dirs(Path(data), 'silnosnap')
    (record,) = json.loads((run / 'info' / 'silnosnap_t0_s0_resumes.json').read_text())
    assert record['exact'] is False
    assert any('replay memory was not in the snapshot' in why for why in record['approximate'])
