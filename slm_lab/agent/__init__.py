"""Agent = algorithm + memory + net, built from the agent spec."""
from __future__ import annotations

import contextlib

import gymnasium as gym
import numpy as np
import torch

from slm_lab.agent.algorithm import ALGORITHMS
from slm_lab.agent.memory import MEMORIES
from slm_lab.agent.net import precision, recurrent
from slm_lab.lib.errors import ResumeError, SpecError
from slm_lab.resources import replay_in_snapshots


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
        algo_cls = ALGORITHMS[algo_spec['name']]
        net_spec = agent_spec.get('net') or {}
        self.seq = self.greedy_seq = None
        layout = None
        if net_spec.get('type') == 'RecurrentNet' and algo_cls.recurrent_slots(agent_spec):
            # the algorithm and its memory see contexts in place of observations (net/recurrent.py)
            if len(obs_space.shape) > 1:
                image = obs_space.dtype == np.uint8 and len(obs_space.shape) in (2, 3)
                raise SpecError(f'agent.net.type: RecurrentNet takes vector observations, and {spec["env"]["name"]} '
                                f'gives {"images" if image else "arrays"} of shape {obs_space.shape}; '
                                f'{"use ConvNet for images" if image else "flatten them in the env or use MLPNet"}')
            layout, obs_space = recurrent.context_layout(agent_spec, int(np.prod(obs_space.shape)),
                                                         algo_cls.recurrent_slots(agent_spec))
        self.memory = None
        if memory_spec is not None:
            memory_cls = MEMORIES[memory_spec['name']]
            self.memory = memory_cls(memory_spec, obs_space, action_space, num_envs, seed=[seed, 1],
                                     **memory_cls.build_args(spec, algo_cls))
        with recurrent.building(layout) if layout else contextlib.nullcontext():
            self.algorithm = algo_cls(agent_spec, spec['env'], obs_space, action_space, num_envs, clock,
                                      self.memory, seed=[seed, 2],
                                      persist_replay=replay_in_snapshots(spec['meta']))
        # a replay of stacked frames hands them over laid out as a channels-last conv net takes them
        frame_store = getattr(self.memory, 'frame_store', None)
        if frame_store is not None:
            frame_store.channels_last = any(getattr(net, 'channels_last', False)
                                            for net in self.algorithm.nets().values())
        # whether some net computes in bf16 and acts on few rows in float32 (net.bf16_min_rows)
        self.acts_apart = any(getattr(m, 'bf16_min_rows', 1) > 1
                              for net in self.algorithm.nets().values() for m in net.modules())
        if layout:
            self.seq_nets = _recurrent_nets(self.algorithm, layout)
            self.seq = recurrent.SeqContext(layout, self.seq_nets, num_envs, self.algorithm.device)
            self._context = None  # the contexts of the step being acted on

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Training actions for a batch of observations."""
        if self.acts_apart:  # a bf16 net acts on few rows in float32 (net.bf16_min_rows)
            return precision.while_acting(self._act, obs)
        return self._act(obs)

    def _act(self, obs: np.ndarray) -> np.ndarray:
        if self.seq is None:
            return self.algorithm.act(obs)
        self._context = self.seq.observe(obs)
        action = self.algorithm.act(self._context)
        self.seq.advance()
        return action

    def start_greedy_episode(self) -> None:
        """A greedy episode (eval, replay) starts: a recurrent agent's greedy hidden state goes back
        to zero (it is apart from the training episodes' ones)."""
        self.greedy_seq = None

    def act_greedy(self, obs: np.ndarray) -> np.ndarray:
        """Greedy actions (eval, replay); a recurrent agent carries its hidden state from the
        last start_greedy_episode()."""
        if self.acts_apart:
            return precision.while_acting(self._act_greedy, obs)
        return self._act_greedy(obs)

    def _act_greedy(self, obs: np.ndarray) -> np.ndarray:
        if self.seq is None:
            return self.algorithm.act_greedy(obs)
        if self.greedy_seq is None or self.greedy_seq.num_envs != len(obs):
            self.greedy_seq = recurrent.SeqContext(self.seq.layout, self.seq_nets, len(obs), self.algorithm.device)
        action = self.algorithm.act_greedy(self.greedy_seq.observe(obs))
        self.greedy_seq.advance()
        return action

    def update(self, obs, action, reward, next_obs, terminated, truncated) -> dict | None:
        """Store a vector step and train when due; training metrics or None."""
        if self.seq is None:
            return self.algorithm.update(obs, action, reward, next_obs, terminated, truncated)
        next_context = self.seq.peek(next_obs)
        metrics = self.algorithm.update(self._context, action, reward, next_context, terminated, truncated)
        self.seq.end_episodes(np.logical_or(terminated, truncated))
        return metrics

    def start_fresh_episodes(self) -> None:
        """The env restarted its episodes where a snapshot could not hold them (a resume): the
        memory and algorithm end what they hold of the old ones, truncated, and recurrent
        contexts start again."""
        if self.memory is not None:
            self.memory.cut_episodes()
        self.algorithm.cut_episodes()
        if self.seq is not None:
            self.seq.end_episodes(np.ones(self.seq.num_envs, dtype=bool))

    def parameters_snapshot(self) -> list[torch.Tensor]:
        """Copies of every trainable parameter (for dev mode's did-anything-learn check)."""
        return [p.detach().clone() for net in self.algorithm.nets().values() for p in net.parameters()
                if p.requires_grad]

    def nonfinite_nets(self) -> list[str]:
        """Names of the nets holding a NaN or infinite weight (training diverged into them)."""
        return [name for name, net in self.algorithm.nets().items()
                if any(not bool(torch.isfinite(p).all()) for p in net.parameters())]

    def model_state_dict(self) -> dict:
        """Weights, optimizers and LR schedulers: what model/ files hold."""
        state = self.algorithm.state_dict()
        return {k: state[k] for k in ('nets', 'optimizers', 'lr_schedulers')}

    def state_dict(self) -> dict:
        state = {'algorithm': self.algorithm.state_dict(),
                 'memory': self.memory.state_dict() if self.memory is not None else None}
        if self.seq is not None:
            state['recurrent'] = self.seq.state_dict()
        return state

    def replay_states(self, state: dict) -> list[dict | None]:
        """The replays in one of this agent's state_dict()s: its memory's, then each the algorithm
        keeps itself (Algorithm.owned_replay_keys); a replay state's 'persisted' false means
        its contents were left out of snapshots (resources.replay_in_snapshots)."""
        return [state.get('memory'), *type(self.algorithm).owned_replay_states(state['algorithm'])]

    def load_state_dict(self, state: dict) -> None:
        self.algorithm.load_state_dict(state['algorithm'])
        if self.memory is not None:
            self.memory.load_state_dict(state['memory'])
        if self.seq is not None:
            if 'recurrent' not in state:
                raise ResumeError('snapshot: it holds no recurrent hidden states, and this spec has a RecurrentNet; '
                                  'resume with the spec the run was made with')
            self.seq.load_state_dict(state['recurrent'])


def _recurrent_nets(algorithm, layout) -> list:
    """The RecurrentNet that owns each context slot: the trained one where a copy (a target net)
    shares its slot."""
    owners = [None] * layout.slots
    for net in algorithm.nets().values():
        for module in net.modules():
            if isinstance(module, recurrent.RecurrentNet):
                trained = any(p.requires_grad for p in module.parameters())
                if owners[module.slot] is None or (trained and not any(
                        p.requires_grad for p in owners[module.slot].parameters())):
                    owners[module.slot] = module
    if any(net is None for net in owners):
        raise RuntimeError(f'{type(algorithm).__name__}: recurrent_slots says {layout.slots} recurrent nets, and it '
                           f'built {sum(net is not None for net in owners)}')
    return owners
