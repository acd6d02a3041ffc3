"""PrioritizedReplay: the sum tree's prefix-sum search, sampling probabilities, priorities and
importance weights on hand-computed cases; DQN's priority updates and weighted loss; Replay's
use_cer (SLM-Lab v5's rule); exact resume of DoubleDQN on a persisted prioritized replay."""
from __future__ import annotations

import copy
import re

import gymnasium as gym
import numpy as np
import pytest
import torch

from conftest import build_spec, make_agent
from slm_lab.agent.memory import PrioritizedReplay, Replay
from slm_lab.agent.memory.prioritized import SumTree, importance_weights, priorities_of
from lab_helpers import check_resume_after_max_frame, check_resume_after_sigterm

OBS = gym.spaces.Box(-10, 10, (1,), np.float32)


def memory(max_size: int = 4, batch_size: int = 4, num_envs: int = 1, use_cer: bool = False, alpha: float = 1.0,
           epsilon: float = 0.0, beta: float = 0.0, persist: bool = False, seed: int = 0) -> PrioritizedReplay:
    spec = {'name': 'PrioritizedReplay', 'batch_size': batch_size, 'max_size': max_size, 'use_cer': use_cer,
            'alpha': alpha, 'epsilon': epsilon, 'beta': beta}
    return PrioritizedReplay(spec, OBS, gym.spaces.Discrete(2), num_envs, seed=seed, persist=persist)


def add(mem, values):
    """Store one vector step whose observations (and rewards) are `values`, one per env."""
    values = np.asarray(values, np.float32)
    n = len(values)
    mem.add(values[:, None], np.zeros(n, np.int64), values, values[:, None], np.zeros(n, bool), np.zeros(n, bool))


# --- the sum tree ----------------------------------------------------------------------------------

def test_sum_tree_finds_the_slot_of_each_prefix_sum():
    # priorities 1 2 3 4 5 cover [0,1) [1,3) [3,6) [6,10) [10,15); capacity 5 pads to 8 leaves
    tree = SumTree(5)
    tree.set(np.arange(5), np.array([1.0, 2, 3, 4, 5]))
    assert tree.total == 15
    # the sums: node 2 = 1+2+3+4 = 10, node 3 = 5 + 0 = 5, node 4 = 3, node 5 = 7
    np.testing.assert_array_equal(tree.nodes[1:6], [15, 10, 5, 3, 7])
    found = tree.find(np.array([0, 0.99, 1, 2.99, 3, 5.99, 6, 9.99, 10, 14.99, 15.0]))
    np.testing.assert_array_equal(found, [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 4])  # 15 (rounding): the last non-zero


def test_sum_tree_set_keeps_the_last_priority_given_to_a_repeated_slot_and_rebuilds_identically():
    tree = SumTree(5)
    tree.set(np.arange(5), np.array([1.0, 2, 3, 4, 5]))
    tree.set(np.array([1, 3, 1]), np.array([7.0, 0.5, 0.25]))
    np.testing.assert_array_equal(tree.leaves, [1, 0.25, 3, 0.5, 5])
    assert tree.total == 9.75
    rng = np.random.default_rng(0)
    for _ in range(50):  # many small updates, then a rebuild from the leaves alone: the same bits
        tree.set(rng.integers(0, 5, 3), rng.random(3))
    rebuilt = SumTree(5)
    rebuilt.rebuild(tree.leaves.copy())
    np.testing.assert_array_equal(rebuilt.nodes, tree.nodes)


# --- priorities, probabilities, weights -------------------------------------------------------------

def test_sum_tree_set_and_find_are_the_level_by_level_tree_of_unique_parents():
    """set writes a parent shared by several updated slots once per child (the same sum each
    time) and find reads each left sum once: the tree and the slots of the version that kept each
    level's parents unique (np.unique) and read the left sums twice, bit for bit."""
    def reference_set(tree, slots, priorities):
        node = np.asarray(slots, dtype=np.int64)[::-1] + tree.leaves_start
        node, last = np.unique(node, return_index=True)
        tree.nodes[node] = np.broadcast_to(priorities, (len(slots),))[::-1][last]
        node = np.unique(node // 2)
        while node[0] >= 1:
            tree.nodes[node] = tree.nodes[2 * node] + tree.nodes[2 * node + 1]
            node = np.unique(node // 2)

    def reference_find(tree, prefix_sums):
        value = np.array(prefix_sums, dtype=np.float64)
        node = np.ones(len(value), dtype=np.int64)
        while node[0] < tree.leaves_start:
            left = 2 * node
            go_right = (value >= tree.nodes[left]) & (tree.nodes[left + 1] > 0)
            value = np.where(go_right, value - tree.nodes[left], value)
            node = np.where(go_right, left + 1, left)
        return node - tree.leaves_start

    rng = np.random.default_rng(0)
    for capacity in (1, 5, 1000, 50000):
        tree, reference = SumTree(capacity), SumTree(capacity)
        for _ in range(50):
            slots = rng.integers(0, capacity, size=rng.integers(1, 40))
            priorities = rng.random(len(slots)) ** 3 * 10
            tree.set(slots, priorities)
            reference_set(reference, slots, priorities)
            assert np.array_equal(tree.nodes, reference.nodes)
            draws = rng.uniform(0.0, tree.total * 1.0000001, size=32)  # past the total too
            assert np.array_equal(tree.find(draws), reference_find(reference, draws))


def test_priorities_of_errors():
    # (|e| + 1)^0.5 for e = -3, 0, 8: 2, 1, 3
    np.testing.assert_allclose(priorities_of(np.array([-3.0, 0.0, 8.0]), alpha=0.5, epsilon=1.0), [2, 1, 3])


def test_importance_weights():
    # P = 0.1 0.2 0.4, n = 4, beta 1: (4P)^-1 = 2.5 1.25 0.625, / max 2.5 = 1 0.5 0.25
    np.testing.assert_allclose(importance_weights(np.array([0.1, 0.2, 0.4]), 4, beta=1.0), [1, 0.5, 0.25])
    # beta 0.5: sqrt of those before normalising: 1.5811 1.1180 0.7906 / 1.5811 = 1 0.7071 0.5
    np.testing.assert_allclose(importance_weights(np.array([0.1, 0.2, 0.4]), 4, beta=0.5), [1, 0.5 ** 0.5, 0.5])
    np.testing.assert_array_equal(importance_weights(np.array([0.1, 0.2, 0.4]), 4, beta=0.0), [1, 1, 1])


def test_new_transitions_get_slm_labs_priority_then_their_errors():
    mem = memory(alpha=0.5, epsilon=0.0)
    add(mem, [0, 1, 2])  # three envs at once
    np.testing.assert_allclose(mem.tree.leaves[:3], [100000 ** 0.5] * 3)
    mem.update_priorities(np.array([2, 0]), np.array([-4.0, 9.0]))
    np.testing.assert_allclose(mem.tree.leaves[:3], [3, 100000 ** 0.5, 2])


def test_samples_are_drawn_in_proportion_to_priority():
    # errors 1 2 3 4 with alpha 1, epsilon 0: P = 0.1 0.2 0.3 0.4; alpha 0.5 on errors 1 4 9 16: 0.1 0.2 0.3 0.4 too
    for alpha, errors in ((1.0, [1.0, 2, 3, 4]), (0.5, [1.0, 4, 9, 16])):
        mem = memory(batch_size=20000, alpha=alpha, seed=1)
        add(mem, [0, 1, 2, 3])
        mem.update_priorities(np.arange(4), np.array(errors))
        batch = mem.sample()
        freq = np.bincount(batch.indices, minlength=4) / len(batch.indices)
        np.testing.assert_allclose(freq, [0.1, 0.2, 0.3, 0.4], atol=0.01)
        np.testing.assert_array_equal(batch.states[:, 0], batch.indices)  # the transitions at those indices


def test_batch_weights_follow_the_sampled_probabilities():
    mem = memory(batch_size=64, beta=1.0)
    add(mem, [0, 1, 2, 3])
    mem.update_priorities(np.arange(4), np.array([1.0, 2, 3, 4]))
    batch = mem.sample()
    probs = np.array([0.1, 0.2, 0.3, 0.4])[batch.indices]
    expected = (1 / (4 * probs)) / (1 / (4 * probs)).max()
    np.testing.assert_allclose(batch.weights, expected, rtol=1e-6)


# --- DQN on a prioritized replay ------------------------------------------------------------------

def per_spec(beta: float = 0.0, **algo) -> dict:
    spec = build_spec('DoubleDQN')
    spec['agent']['memory'] = {'name': 'PrioritizedReplay', 'batch_size': 8, 'max_size': 100, 'alpha': 0.6,
                               'epsilon': 0.01, 'beta': beta}
    spec['agent']['algorithm'].update(training_start_step=8, training_frequency=1, **algo)
    return spec


def fill(agent, n: int = 16):
    rng = np.random.default_rng(5)
    for _ in range(n):
        obs = rng.normal(size=(1, 4)).astype(np.float32)
        agent.memory.add(obs, rng.integers(0, 2, 1), rng.normal(size=1).astype(np.float32), obs + 0.1,
                         rng.random(1) < 0.2, np.zeros(1, bool))


@pytest.mark.parametrize('beta', [0.0, 0.7])
def test_dqn_updates_priorities_from_its_td_errors_and_weights_its_loss(beta):
    agent, _ = make_agent(per_spec(beta=beta))
    algo, mem = agent.algorithm, agent.memory
    fill(agent)
    mem.update_priorities(np.arange(16), np.arange(16.0))  # unequal priorities: unequal weights
    net_before = copy.deepcopy(algo.net)
    sampled = []
    sample = mem.sample
    mem.sample = lambda: sampled.append(sample()) or sampled[-1]
    metrics = algo.train()
    batch = sampled[0]
    with torch.no_grad():  # the errors of the net before its step, as SLM-Lab computes them
        states = torch.as_tensor(batch.states)
        q = net_before(states).gather(-1, torch.as_tensor(batch.actions)[:, None]).squeeze(-1)
        targets = algo.q_targets(torch.as_tensor(batch.rewards), torch.as_tensor(batch.next_states),
                                 torch.as_tensor(batch.terminateds))
    errors = (targets - q).abs().numpy()
    last = {i: e for i, e in zip(batch.indices, errors)}  # a repeated index keeps its last error
    for i, e in last.items():
        assert mem.tree.leaves[i] == pytest.approx((e + 0.01) ** 0.6, rel=1e-5)
    weighted = (batch.weights * (targets - q).numpy() ** 2).mean()
    assert metrics['loss'] == pytest.approx(float(weighted), rel=1e-5)
    if beta == 0.0:
        np.testing.assert_array_equal(batch.weights, 1.0)
    else:
        assert batch.weights.min() < 1.0


def test_dqn_family_trains_on_prioritized_replay_through_the_lab(lab_run):
    spec = per_spec()
    spec['env']['max_frame'] = 300
    spec['meta']['snapshot_replay'] = True
    _, run = lab_run(spec, 'ddqn_per', mode='dev')  # dev mode checks that the net's parameters moved
    assert re.search(r'DEBUG .*dev check passed', (run / 'log' / 'ddqn_per_t0_s0.log').read_text())


# --- use_cer (SLM-Lab v5) ---------------------------------------------------------------------------

def replay(use_cer=True, batch_size=4, max_size=10, num_envs=3) -> Replay:
    return Replay({'name': 'Replay', 'batch_size': batch_size, 'max_size': max_size, 'use_cer': use_cer},
                  OBS, gym.spaces.Discrete(2), num_envs)


def test_cer_puts_the_transitions_stored_since_the_last_sample_at_the_batch_tail():
    mem = replay()
    add(mem, [0, 1, 2])  # positions 0 1 2
    assert list(mem.sample().states[-3:, 0]) == [0, 1, 2]
    add(mem, [3, 4, 5])
    assert list(mem.sample().states[-3:, 0]) == [3, 4, 5]
    assert mem.cer_pending == 0
    add(mem, [6, 7, 8])
    add(mem, [9, 10, 11])  # wraps: 9 at position 9, 10 and 11 at 0 and 1; six pending, batch of 4
    assert list(mem.sample().states[:, 0]) == [6, 7, 8, 9]  # the four oldest pending fill the batch
    assert list(mem.sample().states[-2:, 0]) == [10, 11]  # the other two in the next one
    assert mem.cer_pending == 0


def test_cer_pending_count_comes_back_with_a_persisted_replay():
    mem = replay()
    mem.persist = True
    add(mem, [0, 1, 2])
    other = replay()
    other.load_state_dict(mem.state_dict())
    assert list(other.sample().states[-3:, 0]) == [0, 1, 2]


# --- state ----------------------------------------------------------------------------------------

def test_persisted_priorities_come_back_and_sampling_continues_identically():
    mem = memory(max_size=6, batch_size=5, persist=True, use_cer=True)
    for step in range(4):
        add(mem, [step])
    mem.update_priorities(np.array([0, 3]), np.array([2.0, 0.5]))
    mem.sample()
    other = memory(max_size=6, batch_size=5, persist=True, use_cer=True, seed=9)
    other.load_state_dict(mem.state_dict())
    np.testing.assert_array_equal(other.tree.nodes, mem.tree.nodes)
    for m in (mem, other):  # the same new transitions to both
        add(m, [4])
        add(m, [5])
    a, b = mem.sample(), other.sample()
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.weights, b.weights)


def test_without_snapshot_replay_the_tree_starts_empty():
    mem = memory(persist=False)
    add(mem, [0, 1])
    other = memory()
    other.load_state_dict(mem.state_dict())
    assert other.tree.total == 0 and len(other) == 0


PER_EXACT = {
    'agent': {'name': 'DoubleDQN',
              'algorithm': {'name': 'DoubleDQN',
                            'explore_var_spec': {'name': 'linear_decay', 'start_val': 1.0,
                                                 'end_val': 0.1, 'start_step': 0, 'end_step': 1500},
                            'training_frequency': 8, 'training_iter': 2, 'training_start_step': 64},
              'memory': {'name': 'PrioritizedReplay', 'batch_size': 32, 'max_size': 5000, 'alpha': 0.6,
                         'epsilon': 0.0001, 'use_cer': True},
              'net': {'type': 'DuelingMLPNet', 'hid_layers': [32], 'optim_spec': {'name': 'Adam', 'lr': 1e-3},
                      'update_type': 'replace', 'update_frequency': 100}},
    'env': {'name': 'CartPole-v1', 'num_envs': 2, 'max_frame': 2000},  # a multiple of eval_frequency
    'meta': {'log_frequency': 500, 'eval_frequency': 1000, 'random_seed': 13, 'snapshot_replay': True},
}


@pytest.mark.slow
def test_ddqn_per_resume_after_max_frame_is_exact(tmp_path):
    check_resume_after_max_frame(tmp_path, 'ddqn_per_exact', PER_EXACT)


@pytest.mark.slow
@pytest.mark.subprocess
def test_ddqn_per_resume_after_sigterm_is_exact(tmp_path):
    check_resume_after_sigterm(tmp_path, 'ddqn_per_term', PER_EXACT)
