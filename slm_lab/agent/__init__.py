"""Agent = algorithm + memory + net, built from the agent spec."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from slm_lab.agent.algorithm import ALGORITHMS
from slm_lab.agent.memory import MEMORIES, OnPolicyBatchReplay, Replay
from slm_lab.lib.errors import SpecError


class Agent:
    """The acting and learning part of a session. The algorithm owns the nets and optimizers;
    the memory stores what the algorithm learns from."""

    def __init__(self, spec: dict, obs_space: gym.Space, action_space: gym.Space, num_envs: int, clock,
                 seed: int):
        if not (isinstance(obs_space, gym.spaces.Box) and obs_space.shape):
            raise SpecError(f"env.name: observation space {obs_space} is not supported yet; the lab's nets need "
                            'Box observations (e.g. CartPole-v1, Pendulum-v1)')
        agent_spec = spec['agent']
        self.name = agent_spec['name']
        algo_spec, memory_spec = agent_spec['algorithm'], agent_spec['memory']
        self.memory = None
        if memory_spec is not None:
            memory_cls = MEMORIES[memory_spec['name']]
            kwargs = {}
            if issubclass(memory_cls, OnPolicyBatchReplay):
                kwargs['batch_steps'] = ALGORITHMS[algo_spec['name']].batch_steps(algo_spec)
            if issubclass(memory_cls, Replay):
                kwargs['persist'] = spec['meta'].get('snapshot_replay', False)
            self.memory = memory_cls(memory_spec, obs_space, action_space, num_envs, seed=[seed, 1], **kwargs)
        algo_cls = ALGORITHMS[algo_spec['name']]
        self.algorithm = algo_cls(agent_spec, spec['env'], obs_space, action_space, num_envs, clock,
                                  self.memory, seed=[seed, 2],
                                  persist_replay=spec['meta'].get('snapshot_replay', False))

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Training actions for a batch of observations."""
        return self.algorithm.act(obs)

    def act_greedy(self, obs: np.ndarray) -> np.ndarray:
        """Greedy actions (eval, replay)."""
        return self.algorithm.act_greedy(obs)

    def update(self, obs, action, reward, next_obs, terminated, truncated) -> dict | None:
        """Store a vector step and train when due; training metrics or None."""
        return self.algorithm.update(obs, action, reward, next_obs, terminated, truncated)

    def parameters_snapshot(self) -> list[torch.Tensor]:
        """Copies of every trainable parameter (for dev mode's did-anything-learn check)."""
        return [p.detach().clone() for net in self.algorithm.nets().values() for p in net.parameters()
                if p.requires_grad]

    def model_state_dict(self) -> dict:
        """Weights, optimizers and LR schedulers: what model/ files hold."""
        state = self.algorithm.state_dict()
        return {k: state[k] for k in ('nets', 'optimizers', 'lr_schedulers')}

    def state_dict(self) -> dict:
        return {'algorithm': self.algorithm.state_dict(),
                'memory': self.memory.state_dict() if self.memory is not None else None}

    def load_state_dict(self, state: dict) -> None:
        self.algorithm.load_state_dict(state['algorithm'])
        if self.memory is not None:
            self.memory.load_state_dict(state['memory'])
