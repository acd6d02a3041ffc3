"""PrioritizedReplay: proportional prioritized experience replay (Schaul et al. 2016) on a sum tree.

Each stored transition i has a priority p_i = (|delta_i| + epsilon)^alpha, delta_i its last TD
error; a batch draws i with probability P(i) = p_i / sum_j p_j. As in SLM-Lab, a new transition
gets the priority of a TD error of 100000 (so it is almost surely drawn before its error is
known; Schaul et al. give it the largest priority so far instead), and the priorities of a
sampled batch are replaced by those of its new errors after each training step.

SLM-Lab trains on prioritized samples without importance-sampling correction: it has no `beta`.
The lab's `beta` (default 0: SLM-Lab's unweighted loss) gives each sampled transition the weight
w_i = (n * P(i))^-beta / max_batch w, n the number stored (the batch maximum normalises, as in
Schaul et al.'s algorithm 1).
"""
from __future__ import annotations

import numpy as np

from slm_lab.agent.memory.base import Batch
from slm_lab.agent.memory.replay import Replay
from slm_lab.lib.schema import Field

NEW_TRANSITION_ERROR = 100000.0  # SLM-Lab's TD error for a transition not yet trained on


def priorities_of(errors: np.ndarray, alpha: float, epsilon: float) -> np.ndarray:
    """p = (|error| + epsilon)^alpha, elementwise."""
    return np.power(np.abs(errors) + epsilon, alpha)


def importance_weights(probs: np.ndarray, size: int, beta: float) -> np.ndarray:
    """w_i = (size * P(i))^-beta / max_j w_j over the batch: probs (B,) the sampling probabilities
    of the drawn transitions, size the number stored. beta 0 gives 1.0 everywhere."""
    weights = np.power(size * probs, -beta)
    return weights / weights.max()


class SumTree:
    """Priorities of `capacity` slots in a binary tree whose every node holds the sum of its two
    children, so that drawing a slot with probability proportional to its priority, and changing
    a priority, each cost O(log capacity).

    Stored as one float64 array `nodes` of 2L entries (L = capacity rounded up to a power of two):
    the root at 1, node k's children at 2k and 2k+1, slot i's leaf at L + i (slots past capacity
    stay 0). Every internal node is recomputed as the sum of its children (never adjusted by
    differences), so the tree is a function of its leaves alone: rebuilt from saved leaves it is
    identical, bit for bit.
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.leaves_start = 1 << max(0, int(capacity - 1).bit_length())
        self.nodes = np.zeros(2 * self.leaves_start, dtype=np.float64)

    @staticmethod
    def nbytes(capacity: int) -> int:
        """Bytes the tree of `capacity` slots allocates (its `nodes`)."""
        return 2 * (1 << max(0, int(capacity - 1).bit_length())) * 8

    @property
    def total(self) -> float:
        return float(self.nodes[1])

    @property
    def leaves(self) -> np.ndarray:
        """The slots' priorities (capacity,), a view."""
        return self.nodes[self.leaves_start:self.leaves_start + self.capacity]

    def set(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Set the priorities of slots (k,) (the last write wins for a repeated slot), then
        recompute the sums above them, level by level. A parent shared by several of them is
        written once per child with the same sum (every write reads the level below, which the
        loop finished before): the same tree as with each parent once, without sorting the
        parents at every level (np.unique, most of the time of a batch's update)."""
        node = np.asarray(slots, dtype=np.int64)[::-1] + self.leaves_start
        node, last = np.unique(node, return_index=True)  # reversed: the first seen is the last given
        self.nodes[node] = np.broadcast_to(priorities, (len(slots),))[::-1][last]
        node //= 2  # every leaf is at the same depth: the parents of one level reach the root together
        while node[0] >= 1:
            self.nodes[node] = self.nodes[2 * node] + self.nodes[2 * node + 1]
            node //= 2

    def rebuild(self, leaves: np.ndarray) -> None:
        """Set every slot's priority from leaves (n <= capacity,) (the rest 0) and every sum."""
        self.nodes[:] = 0.0
        self.nodes[self.leaves_start:self.leaves_start + len(leaves)] = leaves
        level = self.leaves_start // 2
        while level >= 1:
            k = np.arange(level, 2 * level)
            self.nodes[k] = self.nodes[2 * k] + self.nodes[2 * k + 1]
            level //= 2

    def find(self, prefix_sums: np.ndarray) -> np.ndarray:
        """The slots (B,) whose cumulative-priority intervals hold prefix_sums (B,): slot i covers
        [p_0 + ... + p_{i-1}, p_0 + ... + p_i). A value at or past the total (float rounding)
        lands on the last slot of non-zero priority to its left."""
        value = np.array(prefix_sums, dtype=np.float64)
        node = np.ones(len(value), dtype=np.int64)
        nodes = self.nodes
        while node[0] < self.leaves_start:
            left = 2 * node
            left_sum = nodes[left]
            go_right = (value >= left_sum) & (nodes[left + 1] > 0)
            value = np.where(go_right, value - left_sum, value)
            node = left + go_right
        return node - self.leaves_start


class PrioritizedReplay(Replay):
    """Replay whose batches are drawn in proportion to priority (see the module doc); sample()
    returns a Batch with indices and weights, and the algorithm hands the batch's new TD errors back to
    update_priorities(batch.indices, errors)."""

    spec_schema = {
        **Replay.spec_schema,
        'alpha': Field((float,), 0.6, min=0,
                       doc='priority exponent: p = (|TD error| + epsilon)^alpha (0: uniform sampling)'),
        'epsilon': Field((float,), 1e-4, min=0, doc='added to |TD error| so that no transition has priority 0'),
        'beta': Field((float,), 0.0, min=0, max=1,
                      doc='(lab) importance-sampling exponent of the loss weights (n P(i))^-beta / max; '
                          "SLM-Lab has no importance weights, as with the default 0"),
    }

    @staticmethod
    def index_bytes(max_size: int) -> int:
        """Its sum tree's bytes."""
        return SumTree.nbytes(max_size)

    def __init__(self, memory_spec, obs_space, action_space, num_envs, seed=0, persist: bool = False):
        super().__init__(memory_spec, obs_space, action_space, num_envs, seed, persist)
        self.alpha, self.epsilon = memory_spec['alpha'], memory_spec['epsilon']
        self.beta = memory_spec['beta']
        self.tree = SumTree(self.max_size)
        self.new_priority = float(priorities_of(np.float64(NEW_TRANSITION_ERROR), self.alpha, self.epsilon))

    def add(self, obs, action, reward, next_obs, terminated, truncated) -> None:
        slots = (self.head + np.arange(len(reward))) % self.max_size
        super().add(obs, action, reward, next_obs, terminated, truncated)
        self.tree.set(slots, np.full(len(slots), self.new_priority))

    def sample_indices(self) -> np.ndarray:
        """Storage positions (B,) drawn with probability p_i / sum_j p_j (independent uniform
        draws on [0, total), as SLM-Lab), then combined experience replay when use_cer."""
        idx = self.tree.find(self.rng.uniform(0.0, self.tree.total, size=self.batch_size))
        return self.apply_cer(idx) if self.use_cer else idx

    def sample(self) -> Batch:
        """batch_size transitions drawn by priority, with their indices and importance weights."""
        idx = self.sample_indices()
        probs = self.tree.leaves[idx] / self.tree.total
        weights = importance_weights(probs, self.size, self.beta).astype(np.float32)
        return self.batch_at(idx)._replace(indices=idx.astype(np.int64), weights=weights)

    def update_priorities(self, indices: np.ndarray, errors: np.ndarray) -> None:
        """Give the transitions at indices (B,) the priorities of their TD errors (B,).
        (Transitions put in the batch by use_cer are updated too: SLM-Lab skips them only because
        its tree cannot find their leaves.)"""
        self.tree.set(indices, priorities_of(np.asarray(errors, dtype=np.float64), self.alpha, self.epsilon))

    def state_dict(self) -> dict:
        """Replay's state; with persisted transitions, their priorities too (the sums above them
        are rebuilt from these on load)."""
        state = super().state_dict()
        if self.persist:
            state['priorities'] = self.tree.leaves[:self.size]
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.tree.rebuild(np.asarray(state['priorities']) if state['persisted'] else np.zeros(0))
