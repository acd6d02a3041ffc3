"""On-policy memories: whole episodes (OnPolicyReplay; OnPolicyCrossEntropy keeps the best of them)
or fixed-length batches (OnPolicyBatchReplay)."""
from __future__ import annotations

from typing import NamedTuple

import gymnasium as gym
import numpy as np

from slm_lab.agent.memory.base import Memory, transition_bytes
from slm_lab.lib.errors import ResumeError
from slm_lab.lib.schema import Field, ignored_field
from slm_lab.resources import Need

EPISODE_KEYS = ('states', 'actions', 'rewards', 'next_states', 'terminateds', 'truncateds')


class EpisodeBatch(NamedTuple):
    """Finished episodes, concatenated in finishing order (T steps in all): states and next_states
    (T, *obs_shape) (next_states holds the true next observation, the final one at an episode's
    end), actions (T, *act_shape), rewards (T,), terminateds and truncateds (T,) float (1.0 at the
    step where the episode terminated / was truncated), dones (T,) float: 1.0 at each episode's
    last step (terminated or truncated)."""
    states: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_states: np.ndarray
    terminateds: np.ndarray
    truncateds: np.ndarray
    dones: np.ndarray

    def next_kept(self) -> np.ndarray:
        """(T,) bool: the steps whose next state is not, byte for byte, the following step's state
        (an episode's end, unless the next episode starts with the same bytes; the last step)."""
        return next_kept(self.states[:, None], self.next_states[:, None])[:, 0]


class RolloutBatch(NamedTuple):
    """T vector steps of N sub-envs: states and next_states (T, N, *obs_shape) (next_states is the
    true next observation, the final one where an episode ended), actions (T, N, *act_shape),
    rewards, terminateds, truncateds (T, N) float."""
    states: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_states: np.ndarray
    terminateds: np.ndarray
    truncateds: np.ndarray

    def flat(self, key: str) -> np.ndarray:
        """One field with time and env axes merged: (T*N, ...), row t*N + n."""
        value = getattr(self, key)
        return value.reshape((-1,) + value.shape[2:])

    def next_kept(self) -> np.ndarray:
        """(T, N) bool: the steps whose next state is not, byte for byte, the same sub-env's state
        at the following step (a reset in between, unless its first observation has the same
        bytes; the last step)."""
        return next_kept(self.states, self.next_states)


# keys of the off-policy replays that SLM-Lab's specs also give its on-policy memories (e.g. its
# videopinball REINFORCE and SARSA specs), which SLM-Lab's on-policy memories do not read
ON_POLICY_SCHEMA = {
    'name': Field((str,), doc='memory class'),
    **{key: ignored_field('(SLM-Lab) a replay key on-policy memories do not read; ignored, as in SLM-Lab')
       for key in ('batch_size', 'max_size', 'use_cer')},
}


class OnPolicyReplay(Memory):
    """Collects whole episodes, per sub-env; `sample` returns the finished ones (an EpisodeBatch)
    and forgets them. `num_finished` counts the episodes ready."""

    spec_schema = ON_POLICY_SCHEMA

    def __init__(self, memory_spec, obs_space, action_space, num_envs, seed=0):
        super().__init__(memory_spec, obs_space, action_space, num_envs, seed)
        self.reset()

    def reset(self) -> None:
        self.running = [{k: [] for k in EPISODE_KEYS} for _ in range(self.num_envs)]
        self.finished: list[dict] = []

    @property
    def num_finished(self) -> int:
        return len(self.finished)

    def add(self, obs, action, reward, next_obs, terminated, truncated) -> None:
        done = np.logical_or(terminated, truncated)
        for i, episode in enumerate(self.running):
            for key, value in zip(EPISODE_KEYS, (obs, action, reward, next_obs, terminated, truncated)):
                episode[key].append(value[i])
            if done[i]:
                self.finished.append({k: np.asarray(v) for k, v in episode.items()})
                self.running[i] = {k: [] for k in EPISODE_KEYS}

    def cut_episodes(self) -> None:
        """Each running episode with steps ends there, truncated (its last next state stays the
        bootstrap), and counts as finished."""
        for i, episode in enumerate(self.running):
            if episode['rewards']:
                episode['truncateds'][-1] = True
                self.finished.append({k: np.asarray(v) for k, v in episode.items()})
            self.running[i] = {k: [] for k in EPISODE_KEYS}

    def sample(self) -> EpisodeBatch:
        episodes, self.finished = self.finished, []
        batch = {k: np.concatenate([e[k] for e in episodes]) for k in EPISODE_KEYS}
        for key in ('rewards', 'terminateds', 'truncateds'):
            batch[key] = batch[key].astype(np.float32)
        dones = np.zeros(len(batch['rewards']), dtype=np.float32)
        np.put(dones, np.cumsum([len(e['rewards']) for e in episodes]) - 1, 1.0)
        return EpisodeBatch(**batch, dones=dones)

    def state_dict(self) -> dict:
        return {
            'running': [{k: np.asarray(v) for k, v in e.items()} for e in self.running],
            'finished': self.finished,
            'rng': self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict) -> None:
        if any(k not in e for e in state['finished'] + state['running'] for k in EPISODE_KEYS):
            raise ResumeError('snapshot: its OnPolicyReplay memory was saved by an older lab, without next states; '
                              'resume it with the lab version that wrote it, or start the run again')
        self.running = [{k: list(e[k]) for k in EPISODE_KEYS} for e in state['running']]
        self.finished = [dict(e) for e in state['finished']]
        self.rng.bit_generator.state = state['rng']


class OnPolicyBatchReplay(Memory):
    """A fixed batch of `batch_steps` vector steps (time_horizon), filled in place; full when
    `is_full`. sample() returns a RolloutBatch (T, N, ...) and empties the batch."""

    spec_schema = ON_POLICY_SCHEMA

    @classmethod
    def build_args(cls, spec: dict, algorithm_cls: type) -> dict:
        """batch_steps: the vector steps of one update, as the algorithm counts them."""
        return {'batch_steps': algorithm_cls.batch_steps(spec['agent']['algorithm'])}

    @classmethod
    def storage_needs(cls, spec: dict, obs_space: gym.Space, action_space: gym.Space, units: int) -> list[Need]:
        """batch_steps x num_envs steps, twice (the buffer and the batch it hands out), with their
        tensors and the activations of a pass over them."""
        algo_spec = spec['agent']['algorithm']
        key = 'time_horizon' if algo_spec.get('time_horizon') else 'training_frequency'
        steps = algo_spec.get('time_horizon') or algo_spec.get('training_frequency', 1)
        stored, as_tensors, activations = transition_bytes(obs_space, action_space, units)
        return [Need('on-policy batch', f'agent.algorithm.{key} x env.num_envs',
                     steps * spec['env']['num_envs'] * (2 * stored + as_tensors + activations))]

    def __init__(self, memory_spec, obs_space, action_space, num_envs, seed=0, batch_steps: int = 1):
        super().__init__(memory_spec, obs_space, action_space, num_envs, seed)
        self.batch_steps = batch_steps
        T, N = batch_steps, num_envs
        self.buffers = {
            'states': np.zeros((T, N) + self.obs_shape, dtype=self.obs_dtype),
            'actions': np.zeros((T, N) + self.act_shape, dtype=self.act_dtype),
            'rewards': np.zeros((T, N), dtype=np.float32),
            'next_states': np.zeros((T, N) + self.obs_shape, dtype=self.obs_dtype),
            'terminateds': np.zeros((T, N), dtype=np.float32),
            'truncateds': np.zeros((T, N), dtype=np.float32),
        }
        self.size = 0

    @property
    def is_full(self) -> bool:
        return self.size >= self.batch_steps

    def add(self, obs, action, reward, next_obs, terminated, truncated) -> None:
        b, t = self.buffers, self.size
        b['states'][t] = obs
        b['actions'][t] = action
        b['rewards'][t] = reward
        b['next_states'][t] = next_obs
        b['terminateds'][t] = terminated
        b['truncateds'][t] = truncated
        self.size += 1

    def cut_episodes(self) -> None:
        """The batch's last step of each sub-env is marked truncated: returns and advantages
        bootstrap from its next state instead of running on into the next episode."""
        if self.size:
            self.buffers['truncateds'][self.size - 1] = 1.0

    def sample(self) -> RolloutBatch:
        batch = RolloutBatch(**{k: v[:self.size].copy() for k, v in self.buffers.items()})
        self.size = 0
        return batch

    def state_dict(self) -> dict:
        """The filled part of the batch. next_states[t] of a sub-env is states[t + 1] unless the
        sub-env reset in between (then it is the episode's final observation), so only the next
        states that differ, byte for byte, from the following state are stored (`next_kept`
        marks them; the last step's always are), and states of stacked frames keep one new frame
        a step (pack_stacks): an Atari batch's snapshot holds about a quarter of one copy of its
        states, and loading it gives back the very same bytes."""
        n = self.size
        buffers = {k: v[:n].copy() for k, v in self.buffers.items() if k not in ('states', 'next_states')}
        next_states = self.buffers['next_states'][:n]
        kept = next_kept(self.buffers['states'][:n], next_states)
        return {'size': n, 'buffers': buffers, 'states': pack_stacks(self.buffers['states'][:n]), 'next_kept': kept,
                'next_states': next_states[kept], 'rng': self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.size = n = int(state['size'])
        for k, v in state['buffers'].items():  # a snapshot of an older lab holds next_states here, whole
            self.buffers[k][:n] = v
        if 'next_kept' in state:
            unpack_stacks(state['states'], self.buffers['states'][:n])
            next_states = self.buffers['next_states'][:n]
            next_states[:-1] = self.buffers['states'][1:n]
            next_states[np.asarray(state['next_kept'], dtype=bool)] = state['next_states']
        self.rng.bit_generator.state = state['rng']


def pack_stacks(states: np.ndarray) -> dict:
    """States (T, N, k, ...) of stacked frames (the newest last on axis 2, as the env stacks
    them), packed for a snapshot: a step whose stack is the step before's shifted by one frame
    (`rolled`: no reset in between) keeps its newest frame only (`newest`), the others their
    whole stack (`whole`); compared byte for byte, so unpacking gives the same bytes. States of
    vectors (T, N, d) are kept whole."""
    rolled = np.zeros(states.shape[:2], dtype=bool)
    if states.ndim >= 4 and len(states) > 1:
        rolled[1:] = np.all(_as_bytes(states[1:, :, :-1]) == _as_bytes(states[:-1, :, 1:]), axis=-1)
    return {'rolled': rolled, 'whole': states[~rolled], 'newest': states[rolled][:, -1]}


def unpack_stacks(packed: dict, out: np.ndarray) -> None:
    """Write the states pack_stacks packed into `out` (T, N, ...)."""
    rolled = np.asarray(packed['rolled'], dtype=bool)
    out[~rolled] = packed['whole']
    newest = np.asarray(packed['newest'])
    used = 0
    for t in range(1, len(out)):  # a rolled stack is built from the step before's, so in order
        envs = np.flatnonzero(rolled[t])
        if len(envs):
            out[t, envs, :-1] = out[t - 1, envs, 1:]
            out[t, envs, -1] = newest[used:used + len(envs)]
            used += len(envs)


def next_kept(states: np.ndarray, next_states: np.ndarray) -> np.ndarray:
    """(T, N) bool from states and next_states (T, N, *obs_shape): True where next_states[t, n] is
    not, byte for byte, states[t + 1, n], and at the last step. Where it is False the next state
    need not be stored (a snapshot) nor evaluated (V(s'_t) is V(s_{t+1})): equal bytes are the
    same input, whether or not the sub-env reset in between."""
    kept = np.ones(next_states.shape[:2], dtype=bool)
    if len(next_states) > 1:
        kept[:-1] = np.any(_as_bytes(next_states[:-1]) != _as_bytes(states[1:]), axis=-1)
    return kept


def _as_bytes(x: np.ndarray) -> np.ndarray:
    """(T, N, *shape) -> (T, N, bytes): each step's observation as its raw bytes (floats compare
    bitwise: -0.0 and 0.0 differ, NaN equals itself)."""
    x = np.ascontiguousarray(x)
    return x.reshape(x.shape[0], x.shape[1], -1).view(np.uint8)


def elite_episodes(episode_returns: np.ndarray, cross_entropy: float) -> np.ndarray:
    """Indices of the episodes SLM-Lab's cross-entropy filter keeps: those whose return is at least
    the (100 * cross_entropy)-th percentile of the batch's returns (numpy's linear interpolation).
    So cross_entropy 0.3 keeps about the best 70%; 1.0 keeps them all (SLM-Lab skips the filter)."""
    if cross_entropy >= 1.0:
        return np.arange(len(episode_returns))
    bound = np.percentile(episode_returns, 100.0 * cross_entropy)
    return np.flatnonzero(episode_returns >= bound)


class OnPolicyCrossEntropy(OnPolicyReplay):
    """OnPolicyReplay whose sample() keeps only the episodes that elite_episodes selects from
    those finished (SLM-Lab's cross-entropy method, Kroese et al. 2013); the others are dropped."""

    spec_schema = {
        **ON_POLICY_SCHEMA,
        'cross_entropy': Field((float,), 1.0, min=0, max=1,
                               doc='percentile / 100 of the episode returns an episode needs to be trained on '
                                   '(1.0: all episodes)'),
    }

    def sample(self) -> EpisodeBatch:
        returns = np.array([np.sum(e['rewards']) for e in self.finished])
        self.finished = [self.finished[i] for i in elite_episodes(returns, self.memory_spec['cross_entropy'])]
        return super().sample()
