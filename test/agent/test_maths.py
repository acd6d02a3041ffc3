"""The algorithms' maths on batches small enough to compute by hand: REINFORCE returns, GAE, PPO's
clipped losses, the DQN family's targets, and the episode-end handling they rely on (the final
observation swap and its normalisation).

Every expected number below is worked out in the comments, not by calling the code under test.
Each case mixes a terminated and a truncated episode, so using `done` (terminated or truncated)
where `terminated` belongs, or the other way round, fails a test.
"""
from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import make_agent, make_algorithm
from lab_helpers import value_from_first_entry

from slm_lab.persistence import snapshot as checkpoint
from slm_lab.agent import Agent
from slm_lab.agent.algorithm.dqn import q_targets
from slm_lab.agent.algorithm.maths import gae
from slm_lab.agent.algorithm.ppo import ppo_policy_loss, ppo_value_loss
from slm_lab.agent.algorithm.reinforce import discounted_returns
from slm_lab.agent.memory import OnPolicyReplay, Replay
from slm_lab.agent.memory.onpolicy import RolloutBatch
from slm_lab.env import Clock
from slm_lab.env.wrappers import NormalizeObservation
from slm_lab.lib.errors import SpecError
from slm_lab.spec import validate_spec


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)




# --- REINFORCE --------------------------------------------------------------------------------

def test_discounted_returns_restart_at_each_episode_end():
    # gamma 0.5; env 0 ends an episode at t=1, env 1 at t=3
    # env 0, rewards 1 2 3 4: G3 = 4, G2 = 3 + 0.5*4 = 5, G1 = 2 (episode end), G0 = 1 + 0.5*2 = 2
    # env 1, rewards 1 1 1 1: G3 = 1, G2 = 1.5, G1 = 1.75, G0 = 1.875
    rewards = np.array([[1, 1], [2, 1], [3, 1], [4, 1]], dtype=np.float32)
    dones = np.array([[0, 0], [1, 0], [0, 0], [0, 1]], dtype=np.float32)
    expected = np.array([[2, 1.875], [2, 1.75], [5, 1.5], [4, 1]])
    np.testing.assert_allclose(discounted_returns(rewards, dones, 0.5), expected)
    np.testing.assert_allclose(discounted_returns(rewards[:, 0], dones[:, 0], 0.5), expected[:, 0])


def reinforce_spec(memory: dict, **algo) -> dict:
    return {'agent': {'algorithm': {'name': 'Reinforce', 'gamma': 0.5, 'center_return': False, **algo},
                      'memory': memory, 'net': {'type': 'MLPNet', 'hid_layers': [8]}},
            'env': {'name': 'CartPole-v1', 'max_frame': 100}}


def test_reinforce_batch_returns_stop_at_truncation_and_termination(monkeypatch):
    # two envs, 4 vector steps: env 0 is truncated at t=1, env 1 terminates at t=3 (the numbers
    # of the test above); a Monte-Carlo return never crosses either end
    agent, _ = make_agent(reinforce_spec({'name': 'OnPolicyBatchReplay'}, training_frequency=4), obs_dim=4, num_envs=2)
    seen = {}
    monkeypatch.setattr(agent.algorithm, 'train', lambda states, actions, returns: seen.setdefault('G', returns))
    rewards = [[1, 1], [2, 1], [3, 1], [4, 1]]
    terminated = [[0, 0], [0, 0], [0, 0], [0, 1]]
    truncated = [[0, 0], [1, 0], [0, 0], [0, 0]]
    obs = np.zeros((2, 4), np.float32)
    for r, te, tr in zip(rewards, terminated, truncated):
        agent.update(obs, np.zeros(2, np.int64), np.array(r, np.float32), obs, np.array(te, bool), np.array(tr, bool))
    # flattened time-major: (t0 env0, t0 env1, t1 env0, ...)
    np.testing.assert_allclose(seen['G'], [2, 1.875, 2, 1.75, 5, 1.5, 4, 1])


def test_reinforce_episode_memory_ends_an_episode_at_truncation(monkeypatch):
    agent, _ = make_agent(reinforce_spec({'name': 'OnPolicyReplay'}, training_frequency=1), obs_dim=4, num_envs=1)
    seen = {}
    monkeypatch.setattr(agent.algorithm, 'train', lambda states, actions, returns: seen.setdefault('G', returns))
    obs, action = np.zeros((1, 4), np.float32), np.zeros(1, np.int64)
    agent.update(obs, action, np.array([1.0], np.float32), obs, np.array([False]), np.array([False]))
    assert 'G' not in seen
    agent.update(obs, action, np.array([2.0], np.float32), obs, np.array([False]), np.array([True]))
    # G1 = 2, G0 = 1 + 0.5*2 = 2
    np.testing.assert_allclose(seen['G'], [2, 2])


# --- GAE and PPO ------------------------------------------------------------------------------
# gamma = lam = 0.5 (gamma*lam = 0.25); two envs with rewards 1 1 1, V(s) 1 2 3, V(s') 2 10 5
# env 0 terminates at t=1: delta = 1 + 0.5*2 - 1 = 1, 1 + 0 - 2 = -1, 1 + 0.5*5 - 3 = 0.5
#   A2 = 0.5, A1 = -1 (episode end), A0 = 1 + 0.25*(-1) = 0.75
# env 1 is truncated at t=1, so V(s') = 10 is still bootstrapped: delta = 1, 1 + 5 - 2 = 4, 0.5
#   A2 = 0.5, A1 = 4 (episode end), A0 = 1 + 0.25*4 = 2
GAE_CASE = {
    'rewards': [[1, 1], [1, 1], [1, 1]], 'values': [[1, 1], [2, 2], [3, 3]], 'next_values': [[2, 2], [10, 10], [5, 5]],
    'terminateds': [[0, 0], [1, 0], [0, 0]], 'truncateds': [[0, 0], [0, 1], [0, 0]],
}
GAE_EXPECTED = [[0.75, 2], [-1, 4], [0.5, 0.5]]


def test_gae_bootstraps_truncation_and_stops_at_both_ends():
    c = {k: t(v) for k, v in GAE_CASE.items()}
    dones = torch.maximum(c['terminateds'], c['truncateds'])
    advs = gae(c['rewards'], c['values'], c['next_values'], c['terminateds'], dones, gamma=0.5, lam=0.5)
    torch.testing.assert_close(advs, t(GAE_EXPECTED))



def _gae_per_step(rewards, values, next_values, terminateds, dones, gamma, lam):
    """GAE as the lab computed it before its numpy recursion: torch ops step by step."""
    deltas = rewards + gamma * (1.0 - terminateds) * next_values - values
    advantages, running = torch.zeros_like(deltas), torch.zeros_like(deltas[0])
    for t in range(len(deltas) - 1, -1, -1):
        running = deltas[t] + gamma * lam * (1.0 - dones[t]) * running
        advantages[t] = running
    return advantages


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_gae_recursion_gives_the_per_step_torch_numbers_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(3)
    T, N = 64, 8
    rewards, values, next_values = (torch.randn(T, N, generator=g, dtype=dtype) * 10 for _ in range(3))
    terminateds = (torch.rand(T, N, generator=g) < 0.05).to(dtype)
    dones = torch.maximum(terminateds, (torch.rand(T, N, generator=g) < 0.05).to(dtype))
    args = (rewards, values, next_values, terminateds, dones, 0.99, 0.95)
    assert torch.equal(gae(*args), _gae_per_step(*args))
    # with a graph (the torch loop) the same numbers, and the gradient flows
    grad_values = values.clone().requires_grad_()
    advs = gae(rewards, grad_values, *args[2:])
    assert torch.equal(advs.detach(), _gae_per_step(*args)) and advs.requires_grad

def ppo_spec(**algo) -> dict:
    return {'agent': {'algorithm': {'name': 'PPO', 'gamma': 0.5, 'lam': 0.5, 'time_horizon': 3, 'minibatch_size': 4,
                                    **algo},
                      'memory': {'name': 'OnPolicyBatchReplay'}, 'net': {'type': 'MLPNet', 'hid_layers': [8]}},
            'env': {'name': 'CartPole-v1', 'max_frame': 100}}


def test_ppo_advantages_from_a_batch_use_terminated_and_done_where_each_belongs():
    # the same case through PPO's batch: a value "net" that reads V from the first state entry
    algo = make_algorithm(ppo_spec(), num_envs=2)
    value_from_first_entry(algo)
    states = np.zeros((3, 2, 4), np.float32)
    next_states = np.zeros((3, 2, 4), np.float32)
    states[..., 0], next_states[..., 0] = GAE_CASE['values'], GAE_CASE['next_values']
    batch = RolloutBatch(states=states, actions=np.zeros((3, 2), np.int64), next_states=next_states,
                         rewards=np.array(GAE_CASE['rewards'], np.float32),
                         terminateds=np.array(GAE_CASE['terminateds'], np.float32),
                         truncateds=np.array(GAE_CASE['truncateds'], np.float32))
    advs, returns, old_values = algo.advantages(batch)
    torch.testing.assert_close(advs, t(GAE_EXPECTED).reshape(-1))
    # R = A + V(s)
    torch.testing.assert_close(returns, t([[1.75, 3], [1, 6], [3.5, 3.5]]).reshape(-1))
    torch.testing.assert_close(old_values, t(GAE_CASE['values']).reshape(-1))


def test_ppo_policy_loss_clips_the_ratio():
    # eps 0.2; ratio, advantage -> min(ratio*A, clip(ratio, 0.8, 1.2)*A)
    #   2.0, +1 -> min(2, 1.2) = 1.2          0.5, +1 -> min(0.5, 0.8) = 0.5
    #   1.1, -1 -> min(-1.1, -1.1) = -1.1     0.5, -1 -> min(-0.5, -0.8) = -0.8
    # loss = -(1.2 + 0.5 - 1.1 - 0.8) / 4 = 0.05
    ratios = t([2.0, 0.5, 1.1, 0.5])
    loss = ppo_policy_loss(ratios.log(), torch.zeros(4), t([1, 1, -1, -1]), clip_eps=0.2)
    assert float(loss) == pytest.approx(0.05, abs=1e-6)


def test_ppo_value_loss_is_the_mean_of_per_sample_maxima():
    # eps 0.2, squared error per sample
    # sample 0: V 1, V_old 0.5, R 2: unclipped (1-2)^2 = 1, clipped V 0.7: (0.7-2)^2 = 1.69 -> 1.69
    # sample 1: V 0, V_old 0.5, R 1: unclipped (0-1)^2 = 1, clipped V 0.3: (0.3-1)^2 = 0.49 -> 1
    # mean of the maxima = 1.345 (the max of the two means, max(1, 1.09), would be 1.09)
    squared = torch.nn.MSELoss(reduction='none')
    loss = ppo_value_loss(t([1.0, 0.0]), t([0.5, 0.5]), t([2.0, 1.0]), clip_eps=0.2, sample_loss=squared)
    assert float(loss) == pytest.approx(1.345, abs=1e-6)


def test_ppo_trains_with_the_per_sample_clipped_value_loss(monkeypatch):
    from slm_lab.agent.algorithm import ppo
    calls = []

    def spy(values, old_values, returns, clip_eps, sample_loss):
        calls.append(sample_loss(values, returns).shape)
        return ppo_value_loss(values, old_values, returns, clip_eps, sample_loss)

    monkeypatch.setattr(ppo, 'ppo_value_loss', spy)
    algo = make_algorithm(ppo_spec(clip_vloss=True), num_envs=2)
    rng = np.random.default_rng(0)
    for _ in range(3):
        algo.update(rng.normal(size=(2, 4)).astype(np.float32), np.array([0, 1]), np.ones(2, np.float32),
                    rng.normal(size=(2, 4)).astype(np.float32), np.zeros(2, bool), np.zeros(2, bool))
    # batch 6 in minibatches of 4 and 2, for 4 epochs: each call sees one loss per sample
    assert calls == [torch.Size([4]), torch.Size([2])] * 4


# --- the DQN family ---------------------------------------------------------------------------
# gamma 0.5, rewards 1 1 1, transition 1 terminated (transition 2 may be a truncation: it
# bootstraps like any other). Next-state Q values, online [[1, 5], [2, 0], [3, 4]], target
# [[10, 2], [7, 8], [6, 9]]:
#   VanillaDQN: max online     5 2 4  -> y = 1 + 0.5*5, 1, 1 + 0.5*4 = 3.5, 1, 3
#   DQN:        max target    10 8 9  -> 6, 1, 5.5
#   DoubleDQN:  target at argmax online (1, 0, 1): 2 7 9 -> 2, 1, 5.5
NEXT_Q_ONLINE = [[1, 5], [2, 0], [3, 4]]
NEXT_Q_TARGET = [[10, 2], [7, 8], [6, 9]]
DQN_EXPECTED = {'VanillaDQN': [3.5, 1, 3], 'DQN': [6, 1, 5.5], 'DoubleDQN': [2, 1, 5.5]}


def test_q_targets_select_and_evaluate():
    rewards, terminateds = t([1, 1, 1]), t([0, 1, 0])
    online, target = t(NEXT_Q_ONLINE), t(NEXT_Q_TARGET)
    torch.testing.assert_close(q_targets(rewards, terminateds, online, online, 0.5), t(DQN_EXPECTED['VanillaDQN']))
    torch.testing.assert_close(q_targets(rewards, terminateds, target, target, 0.5), t(DQN_EXPECTED['DQN']))
    torch.testing.assert_close(q_targets(rewards, terminateds, online, target, 0.5), t(DQN_EXPECTED['DoubleDQN']))


def dqn_spec(name: str, **keys) -> dict:
    return {'agent': {'algorithm': {'name': name, 'gamma': 0.5, **keys}, 'memory': {'name': 'Replay', 'max_size': 10},
                      'net': {'type': 'MLPNet', 'hid_layers': [8]}},
            'env': {'name': 'CartPole-v1', 'max_frame': 100}}


def v4_layout(spec: dict) -> dict:
    """The spec as SLM-Lab v4 writes it: agent and env in one-element lists, a body block."""
    return {**spec, 'agent': [spec['agent']], 'env': [spec['env']], 'body': {'product': 'outer', 'num': 1}}


@pytest.mark.parametrize('name,keys,expected', [
    ('VanillaDQN', {}, 'VanillaDQN'),
    ('DQN', {'double_q': False}, 'DQN'),
    ('DQN', {}, 'DoubleDQN'),  # double_q's default: SLM-Lab v5's DQN
    ('DQN', {'double_q': True}, 'DoubleDQN'),
    ('DoubleDQN', {}, 'DoubleDQN'),
])
def test_each_dqn_variant_bootstraps_from_its_nets(name, keys, expected):
    algo = make_algorithm(dqn_spec(name, **keys))
    algo.net = lambda next_states: t(NEXT_Q_ONLINE)
    if algo.target_net is not None:
        algo.target_net = lambda next_states: t(NEXT_Q_TARGET)
    y = algo.q_targets(t([1, 1, 1]), torch.zeros(3, 4), t([0, 1, 0]))
    torch.testing.assert_close(y, t(DQN_EXPECTED[expected]))


# DQN's targets per SLM-Lab generation, from real nets with set weights. Observations of 2 numbers,
# 2 actions; both nets: hidden layer of 2 with weights I and bias 0 (relu passes the positive next
# states below unchanged), output layer with bias 0 and weights I (online: Q(s') = s') or
# diag(3, 1) (target: Q_t(s') = (3 s'_0, s'_1)). gamma 0.5.
#   transition  r   s'      terminated  online argmax  Q_t(s')  v4: max Q_t  v5: Q_t(online argmax)
#   1           1   (1, 2)  no          1              (3, 2)   3 -> y 2.5   2 -> y 2.0
#   2           0   (2, 1)  no          0              (6, 1)   6 -> y 3.0   6 -> y 3.0
#   3          -1   (1, 2)  yes         1              (3, 2)   y -1         y -1
# v4 (the target net picks and values): 2.5, 3, -1; v5 (the online net picks): 2, 3, -1.
V4_TARGETS, V5_TARGETS = [2.5, 3.0, -1.0], [2.0, 3.0, -1.0]


def set_q_net(net: torch.nn.Module, out_weight) -> None:
    hidden, out = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        hidden.weight.copy_(torch.eye(2))
        out.weight.copy_(t(out_weight))
        hidden.bias.zero_()
        out.bias.zero_()


@pytest.mark.parametrize('layout,expected', [(v4_layout, V4_TARGETS), (lambda spec: spec, V5_TARGETS)],
                         ids=['v4', 'v5'])
def test_dqn_targets_by_hand_follow_the_spec_generation(layout, expected):
    """A spec in SLM-Lab v4's layout naming DQN gets v4.2.4's targets (the target net picks and
    values the next action); the same spec flat, as v5 and the lab's own files are written, gets
    v5's (the online net picks: SLM-Lab's DQNBase since v5.0.0)."""
    spec = dqn_spec('DQN')
    spec['agent']['net'].update(hid_layers=[2], hid_layers_activation='relu')
    spec = validate_spec(layout(spec))
    assert spec['agent']['algorithm']['double_q'] is (expected is V5_TARGETS)  # recorded in the saved spec
    algo = make_algorithm(spec, obs_dim=2)
    set_q_net(algo.net, [[1, 0], [0, 1]])
    set_q_net(algo.target_net, [[3, 0], [0, 1]])
    next_states = t([[1, 2], [2, 1], [1, 2]])
    assert algo.net(next_states).argmax(-1).tolist() == [1, 0, 1]
    torch.testing.assert_close(algo.target_net(next_states), t([[3, 2], [6, 1], [3, 2]]))
    y = algo.q_targets(t([1, 0, -1]), next_states, t([0, 0, 1]))
    torch.testing.assert_close(y, t(expected))


def test_a_dqn_spec_saved_before_double_q_computes_the_targets_it_did():
    # a resumed search runs its trials' saved specs as they are: one an older lab wrote has no double_q
    spec = validate_spec(dqn_spec('DQN'))
    del spec['agent']['algorithm']['double_q']
    obs_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    algo = Agent(spec, obs_space, gym.spaces.Discrete(2), 1, Clock(100, 1), seed=0).algorithm
    algo.net = lambda next_states: t(NEXT_Q_ONLINE)
    algo.target_net = lambda next_states: t(NEXT_Q_TARGET)
    y = algo.q_targets(t([1, 1, 1]), torch.zeros(3, 4), t([0, 1, 0]))
    torch.testing.assert_close(y, t(DQN_EXPECTED['DQN']))


def test_a_v4_spec_may_ask_for_double_q_and_double_dqn_refuses_false():
    spec = validate_spec(v4_layout(dqn_spec('DQN', double_q=True)))
    assert spec['agent']['algorithm']['double_q'] is True
    assert validate_spec(v4_layout(dqn_spec('DoubleDQN')))['agent']['algorithm']['double_q'] is True
    with pytest.raises(SpecError, match=r'^agent\.algorithm\.double_q: false does not fit DoubleDQN'):
        validate_spec(dqn_spec('DoubleDQN', double_q=False))


def test_replay_stores_terminated_not_done():
    # a truncated transition keeps its bootstrap: only terminated reaches the stored flag
    obs_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    memory = Replay({'batch_size': 3, 'max_size': 3, 'use_cer': False}, obs_space, gym.spaces.Discrete(2), 3)
    obs = np.zeros((3, 2), np.float32)
    memory.add(obs, np.zeros(3, np.int64), np.ones(3, np.float32), obs, np.array([False, True, False]),
               np.array([True, False, False]))
    np.testing.assert_array_equal(memory.terminateds, [0, 1, 0])


def test_episode_memory_splits_at_truncation_and_termination():
    obs_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    memory = OnPolicyReplay({}, obs_space, gym.spaces.Discrete(2), 2)
    for step, (term, trunc) in enumerate([([False, False], [False, False]), ([True, False], [False, True])]):
        obs = np.full((2, 1), step, np.float32)
        memory.add(obs, np.zeros(2, np.int64), np.array([step, 10 + step], np.float32), obs, np.array(term),
                   np.array(trunc))
    batch = memory.sample()
    np.testing.assert_array_equal(batch.rewards, [0, 1, 10, 11])
    np.testing.assert_array_equal(batch.dones, [0, 1, 0, 1])


# --- episode ends in the session loop ---------------------------------------------------------

CARTPOLE_X_LIMIT, CARTPOLE_THETA_LIMIT = 2.4, 12 * 2 * math.pi / 360


def test_session_stores_the_final_observation_at_each_episode_end(lab_run, make_spec):
    # a real CartPole run, its replay kept in the snapshot. With one env, transition i+1 starts
    # where transition i ended, except at an episode end, where the env has reset: there the
    # stored next state must be the final observation (info['final_obs']), not the reset one
    max_t, max_frame = 30, 400
    spec = make_spec('DQN', max_frame=max_frame, log_frequency=max_frame, snapshot_replay=True)
    spec['env']['max_t'] = max_t
    spec['agent']['memory']['max_size'] = max_frame
    _, run_dir = lab_run(spec, 'final_obs')
    state, _ = checkpoint.load_snapshot(checkpoint.list_snapshots(run_dir / 'ckpt' / 'final_obs_t0_s0')[0])
    replay = state['agent']['memory']
    states, next_states = np.asarray(replay['states']), np.asarray(replay['next_states'])
    terminateds = np.asarray(replay['terminateds'])
    assert len(states) == max_frame
    ends = [i for i in range(max_frame - 1) if not np.array_equal(next_states[i], states[i + 1])]
    # every finished episode shows as a break, except one that ends at the very last step
    assert state['clock']['epi'] > 0 and len(ends) in (state['clock']['epi'] - 1, state['clock']['epi'])
    start, kinds = 0, set()
    for i in ends:
        x, theta = next_states[i][0], next_states[i][2]
        fell = abs(x) > CARTPOLE_X_LIMIT or abs(theta) > CARTPOLE_THETA_LIMIT
        if terminateds[i]:
            assert fell, f'transition {i} terminated but its next state {next_states[i]} is not a final one'
            kinds.add('terminated')
        else:
            assert i - start + 1 == max_t and not fell, f'transition {i} ends an episode of {i - start + 1} steps'
            kinds.add('truncated')
        start = i + 1
    assert kinds == {'terminated', 'truncated'}
    assert not terminateds[[i for i in range(max_frame - 1) if i not in ends]].any()


def pooled_stats(observations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of `observations` pooled with the prior gymnasium's RunningMeanStd
    starts from: a pseudo-observation of weight 1e-4 with mean 0 and variance 1."""
    prior = 1e-4
    count = len(observations) + prior
    mean = observations.sum(axis=0) / count
    m2 = prior * (1.0 + mean ** 2) + ((observations - mean) ** 2).sum(axis=0)
    return mean, m2 / count


def test_final_observation_is_normalised_with_the_statistics_of_its_step():
    # the same seeded CartPole pair with and without normalisation: the wrapper's statistics
    # must be the running mean/var of every observation returned so far (reset and steps, not
    # the final ones), and a final observation is normalised with the same statistics as the
    # observations returned by its step
    def vec():
        return gym.make_vec('CartPole-v1', num_envs=2, vectorization_mode='sync',
                            vector_kwargs={'autoreset_mode': gym.vector.AutoresetMode.SAME_STEP})
    raw, normed = vec(), NormalizeObservation(vec())
    obs, _ = raw.reset(seed=5)
    normed.reset(seed=5)
    seen = [obs]
    finals = 0
    for step in range(200):
        action = np.array([step % 2, (step // 3) % 2])
        obs, _, term, trunc, info = raw.step(action)
        n_obs, _, n_term, n_trunc, n_info = normed.step(action)
        seen.append(obs)
        np.testing.assert_array_equal(term, n_term)
        mean, var = pooled_stats(np.concatenate(seen))
        np.testing.assert_allclose(n_obs, (obs - mean) / np.sqrt(var + 1e-8), atol=1e-4)
        for j in np.flatnonzero(np.logical_or(term, trunc)):
            expected = (info['final_obs'][j] - mean) / np.sqrt(var + 1e-8)
            np.testing.assert_allclose(n_info['final_obs'][j], expected, atol=1e-4)
            finals += 1
    assert finals >= 4
    raw.close()
    normed.close()
