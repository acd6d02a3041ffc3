"""On-policy memories: whole episodes (OnPolicyReplay) or fixed-length batches (OnPolicyBatchReplay)."""
from __future__ import annotations

import numpy as np

from slm_lab.agent.memory.base import Memory


class OnPolicyReplay(Memory):
    """Collects whole episodes, per sub-env; `sample` returns the finished episodes and forgets them.

    sample() -> dict of arrays concatenated over finished episodes in finishing order:
    states (T, *obs_shape), actions (T, *act_shape), rewards (T,), dones (T,) with 1.0 at each
    episode's last step.
    """

    def __init__(self, memory_spec, obs_space, action_space, num_envs, seed=0):
        super().__init__(memory_spec, obs_space, action_space, num_envs, seed)
        self.reset()

    def reset(self) -> None:
        self.running = [{'states': [], 'actions': [], 'rewards': []} for _ in range(self.num_envs)]
        self.finished: list[dict] = []

    @property
    def num_finished(self) -> int:
        return len(self.finished)

    def add(self, obs, action, reward, next_obs, terminated, truncated) -> None:
        done = np.logical_or(terminated, truncated)
        for i, episode in enumerate(self.running):
            episode['states'].append(obs[i])
            episode['actions'].append(action[i])
            episode['rewards'].append(reward[i])
            if done[i]:
                self.finished.append({k: np.asarray(v) for k, v in episode.items()})
                self.running[i] = {'states': [], 'actions': [], 'rewards': []}

    def sample(self) -> dict:
        episodes, self.finished = self.finished, []
        batch = {k: np.concatenate([e[k] for e in episodes]) for k in ('states', 'actions', 'rewards')}
        dones = np.zeros(len(batch['rewards']), dtype=np.float32)
        np.put(dones, np.cumsum([len(e['rewards']) for e in episodes]) - 1, 1.0)
        batch['dones'] = dones
        return batch

    def state_dict(self) -> dict:
        return {
            'running': [{k: np.asarray(v) for k, v in e.items()} for e in self.running],
            'finished': self.finished,
            'rng': self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict) -> None:
        self.running = [{k: list(v) for k, v in e.items()} for e in state['running']]
        self.finished = [dict(e) for e in state['finished']]
        self.rng.bit_generator.state = state['rng']


class OnPolicyBatchReplay(Memory):
    """A fixed batch of `batch_steps` vector steps (time_horizon), filled in place; full when
    `is_full`. sample() returns arrays shaped (T, N, ...) and empties the batch.

    Keys: states, actions, rewards, next_states, terminateds, truncateds.
    """

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

    def sample(self) -> dict:
        batch = {k: v[:self.size].copy() for k, v in self.buffers.items()}
        self.size = 0
        return batch

    def state_dict(self) -> dict:
        return {'size': self.size, 'buffers': {k: v[:self.size].copy() for k, v in self.buffers.items()},
                'rng': self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.size = int(state['size'])
        for k, v in state['buffers'].items():
            self.buffers[k][:self.size] = v
        self.rng.bit_generator.state = state['rng']
