"""The replay of finished episodes that self-imitation learning (SIL, PPOSIL; see
algorithm/sil.py) learns from: each transition with the parts of its discounted return known when
its episode ends, sampled uniformly (SILReplay) or by priority (PrioritizedSILReplay).

The algorithm keeps it beside the agent's on-policy memory and its state rides the algorithm's
(Algorithm.owned_replay_keys); it is not a memory a spec names in agent.memory.name.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from slm_lab.agent.memory.base import space_shape_dtype
from slm_lab.agent.memory.prioritized import NEW_TRANSITION_ERROR, SumTree, importance_weights, priorities_of
from slm_lab.agent.memory.replay import Replay
from slm_lab.lib.schema import OMIT, Field

# keys SIL and PPOSIL read in agent.memory, beside the on-policy memory's own
SIL_MEMORY_SCHEMA = {
    'sil_replay_name': Field((str,), 'Replay', choices=('Replay', 'PrioritizedReplay'),
                             doc='(SIL, PPOSIL) the replay of past episodes SIL trains from: Replay (uniform '
                                 'sampling) or PrioritizedReplay (in proportion to (A+ + epsilon)^alpha)'),
    'batch_size': Field((int,), 32, min=1, doc='(SIL, PPOSIL) transitions per SIL batch'),
    'max_size': Field((int,), 10000, min=1, doc='(SIL, PPOSIL) capacity of the SIL replay in transitions'),
    'use_cer': Field((bool,), False, doc='(SIL, PPOSIL) combined experience replay: each SIL batch includes the '
                                          'newest transition in the SIL replay'),
    'obs_dtype': Field((str,), None, nullable=True, choices=('float16',),
                       doc='(SIL, PPOSIL) how the SIL replay stores float observations: null, as the env gives them; '
                           '"float16", in half the memory, as SLM-Lab v5\'s replays store them (batches are float32 '
                           'either way; uint8 frames stay uint8)'),
    # with sil_replay_name PrioritizedReplay only; their defaults are PrioritizedReplay's
    'alpha': Field((float,), OMIT, min=0, doc='(SIL, PPOSIL with a PrioritizedReplay SIL replay) priority exponent: '
                                              'p = (A+ + epsilon)^alpha (default 0.6)'),
    'epsilon': Field((float,), OMIT, min=0, doc='(SIL, PPOSIL with a PrioritizedReplay SIL replay) added to A+ so '
                                                'that no transition has priority 0 (default 1e-4)'),
    'beta': Field((float,), OMIT, min=0, max=1,
                  doc='(SIL, PPOSIL with a PrioritizedReplay SIL replay) importance-sampling exponent of the SIL '
                      'loss weights (n P(i))^-beta / max (default 0: unweighted)'),
}
PRIORITY_KEYS = {'alpha': 0.6, 'epsilon': 1e-4, 'beta': 0.0}  # and their defaults


def episode_return_parts(rewards: np.ndarray, gamma: float, truncated: bool) -> tuple[np.ndarray, np.ndarray]:
    """The parts of one finished episode's returns that are known when it ends; rewards (T,).

    reward_sums_t   = sum_{k=t}^{T-1} gamma^(k-t) r_k
    boot_discount_t = gamma^(T-t) if the episode was truncated, else 0 (terminated: no future)
    so that R_t = reward_sums_t + boot_discount_t * V(s_T) (see sil_returns). An episode both
    terminated and truncated at its last step terminated: pass truncated=False.
    Returns (reward_sums (T,), boot_discounts (T,)), float32.
    """
    T = len(rewards)
    reward_sums = np.zeros(T, dtype=np.float32)
    running = 0.0
    for t in range(T - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        reward_sums[t] = running
    boot_discounts = gamma ** np.arange(T, 0, -1, dtype=np.float64) if truncated else np.zeros(T)
    return reward_sums, boot_discounts.astype(np.float32)


class SILBatch(NamedTuple):
    """A sampled batch of the SIL replay: states (B, *obs_shape), actions (B, *act_shape),
    reward_sums and boot_discounts (B,) float (see episode_return_parts), final_states
    (B, *obs_shape): the final observation of each transition's episode (bootstrapped from where
    its boot_discount is not 0); indices (B,) int64: the storage positions drawn (give them back
    to update_priorities), weights (B,) float32: importance weights (all 1.0 unless prioritized
    with beta > 0)."""
    states: np.ndarray
    actions: np.ndarray
    reward_sums: np.ndarray
    boot_discounts: np.ndarray
    final_states: np.ndarray
    indices: np.ndarray
    weights: np.ndarray


class SILReplay:
    """The replay of finished episodes SIL learns from: a circular buffer of max_size transitions
    (state, action, the known parts of its return, its episode's final observation), sampled
    uniformly (with replacement) with the generator it is given.

    `add` takes one vector step, like a Memory: each sub-env's episode is held until it ends, then
    its transitions enter the buffer with their returns.
    State: the buffer and the running episodes when `persist` (resources.replay_in_snapshots), else
    nothing: a resume without them starts empty (so SIL updates pause until batch_size
    transitions of finished episodes are back) and the episodes running at the snapshot enter
    only from the resume on, with the returns of their remaining steps (which are exact: a
    return depends on later rewards only).
    """

    ARRAY_KEYS = ('states', 'actions', 'reward_sums', 'boot_discounts', 'final_states')
    EPISODE_KEYS = ('states', 'actions', 'rewards')

    def __init__(self, memory_spec: dict, obs_space, action_space, num_envs: int, gamma: float,
                 rng: np.random.Generator, persist: bool = False):
        self.batch_size, self.max_size = memory_spec['batch_size'], memory_spec['max_size']
        self.use_cer = memory_spec['use_cer']
        self.gamma, self.rng, self.persist = gamma, rng, persist
        self.num_envs = num_envs
        obs_shape, obs_dtype = space_shape_dtype(obs_space)
        obs_dtype = Replay.stored_obs_dtype(memory_spec, obs_dtype)  # agent.memory.obs_dtype
        act_shape, act_dtype = space_shape_dtype(action_space)
        n = self.max_size
        self.states = np.zeros((n,) + obs_shape, dtype=obs_dtype)
        self.actions = np.zeros((n,) + act_shape, dtype=act_dtype)
        self.reward_sums = np.zeros(n, dtype=np.float32)
        self.boot_discounts = np.zeros(n, dtype=np.float32)
        self.final_states = np.zeros((n,) + obs_shape, dtype=obs_dtype)
        self.head, self.size = 0, 0  # next write position, transitions stored
        self.running = [{k: [] for k in self.EPISODE_KEYS} for _ in range(num_envs)]

    def __len__(self) -> int:
        return self.size

    @staticmethod
    def storage_bytes(max_size: int, obs_bytes: int, act_bytes: int, prioritized: bool) -> int:
        """Bytes the buffer allocates: per transition its state and final state (obs_bytes each, as
        stored), action, reward sum and bootstrap discount (float32); a prioritized one adds its sum
        tree. The episodes still running are not counted."""
        return max_size * (2 * obs_bytes + act_bytes + 2 * 4) + (SumTree.nbytes(max_size) if prioritized else 0)

    def add(self, obs, action, reward, next_obs, terminated, truncated) -> None:
        """One vector step: obs (N, *obs_shape), action (N, ...), reward, terminated, truncated (N,);
        next_obs (N, *obs_shape) the true next observation (the final one where an episode ended)."""
        for i, episode in enumerate(self.running):
            # copies: the caller may reuse its arrays for the next step
            episode['states'].append(np.array(obs[i]))
            episode['actions'].append(np.array(action[i]))
            episode['rewards'].append(float(reward[i]))
            if terminated[i] or truncated[i]:
                self._store_episode(episode, next_obs[i], bool(truncated[i]) and not bool(terminated[i]))
                self.running[i] = {k: [] for k in self.EPISODE_KEYS}

    def _store_episode(self, episode: dict, final_obs: np.ndarray, truncated: bool) -> np.ndarray:
        """Write a finished episode's transitions; returns the storage positions written."""
        reward_sums, boot_discounts = episode_return_parts(np.asarray(episode['rewards']), self.gamma, truncated)
        T = len(reward_sums)
        keep = slice(max(0, T - self.max_size), T)  # an episode longer than the buffer keeps its end
        idx = (self.head + np.arange(keep.stop - keep.start)) % self.max_size
        self.states[idx] = np.asarray(episode['states'])[keep]
        self.actions[idx] = np.asarray(episode['actions'])[keep]
        self.reward_sums[idx] = reward_sums[keep]
        self.boot_discounts[idx] = boot_discounts[keep]
        self.final_states[idx] = final_obs
        self.head = int((self.head + len(idx)) % self.max_size)
        self.size = min(self.size + len(idx), self.max_size)
        return idx

    def sample_indices(self) -> tuple[np.ndarray, np.ndarray]:
        """Storage positions (B,) drawn uniformly, and their importance weights (B,) (ones)."""
        return self.rng.integers(0, self.size, size=self.batch_size), np.ones(self.batch_size, dtype=np.float32)

    def sample(self) -> SILBatch:
        """batch_size transitions (see sample_indices); with use_cer the last is the newest stored."""
        idx, weights = self.sample_indices()
        if self.use_cer:
            idx[-1] = (self.head - 1) % self.max_size
        return SILBatch(*(getattr(self, key)[idx] for key in self.ARRAY_KEYS), indices=idx.astype(np.int64),
                        weights=weights)

    def update_priorities(self, indices: np.ndarray, clipped_advs: np.ndarray) -> None:
        """Uniform sampling keeps no priorities."""

    def state_dict(self) -> dict:
        """Everything when `persist` (the buffer's filled part as array views; the running
        episodes), else only the mark that it was left out."""
        state = {'persisted': self.persist}
        if self.persist:
            state.update(head=self.head, size=self.size,
                         running=[{k: np.asarray(e[k]) for k in self.EPISODE_KEYS} for e in self.running],
                         **{key: getattr(self, key)[:self.size] for key in self.ARRAY_KEYS})
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore; a state saved without its contents leaves the replay empty."""
        if not state['persisted']:
            self.head, self.size = 0, 0
            self.running = [{k: [] for k in self.EPISODE_KEYS} for _ in range(self.num_envs)]
            return
        self.head, self.size = int(state['head']), int(state['size'])
        for key in self.ARRAY_KEYS:
            getattr(self, key)[:self.size] = state[key]
        self.running = [{k: list(e[k]) for k in self.EPISODE_KEYS} for e in state['running']]


class PrioritizedSILReplay(SILReplay):
    """The SIL replay with prioritized sampling, as in the paper: transition i is drawn with
    probability p_i / sum_j p_j, p_i = (A+_i + epsilon)^alpha with A+_i = max(R_i - V(s_i), 0)
    from its last SIL step (a new transition: the priority of an error of 100000, as the lab's
    PrioritizedReplay gives it), and weighs w_i = (n P(i))^-beta / max_batch w in the SIL losses.
    The priorities are state, saved with the buffer when `persist`."""

    def __init__(self, memory_spec: dict, *args, **kwargs):
        super().__init__(memory_spec, *args, **kwargs)
        self.alpha, self.epsilon, self.beta = (memory_spec.get(k, v) for k, v in PRIORITY_KEYS.items())
        self.tree = SumTree(self.max_size)
        self.new_priority = float(priorities_of(np.float64(NEW_TRANSITION_ERROR), self.alpha, self.epsilon))

    def _store_episode(self, episode, final_obs, truncated):
        idx = super()._store_episode(episode, final_obs, truncated)
        self.tree.set(idx, np.full(len(idx), self.new_priority))
        return idx

    def sample_indices(self):
        """Positions drawn in proportion to priority (uniform draws on [0, total)) and their weights."""
        idx = self.tree.find(self.rng.uniform(0.0, self.tree.total, size=self.batch_size))
        probs = self.tree.leaves[idx] / self.tree.total
        return idx, importance_weights(probs, self.size, self.beta).astype(np.float32)

    def update_priorities(self, indices, clipped_advs):
        """Give the transitions at indices (B,) the priorities of their clipped advantages (B,)."""
        self.tree.set(indices, priorities_of(np.asarray(clipped_advs, dtype=np.float64), self.alpha, self.epsilon))

    def state_dict(self):
        state = super().state_dict()
        if self.persist:
            state['priorities'] = self.tree.leaves[:self.size]
        return state

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.tree.rebuild(np.asarray(state['priorities']) if state['persisted'] else np.zeros(0))
