"""The base of off-policy algorithms: store each vector step in a replay, train when due, and
move target nets.

Cadence: every vector step goes into the memory (Replay, PrioritizedReplay); once the memory
holds training_start_step transitions, a training (`train`, the algorithm's own: training_iter
batches, one gradient step or more each) runs every training_frequency frames.

Target nets (the slow copies that give bootstrap targets) follow their online nets in one of two
ways, by net.update_type:
  replace: target <- online (parameters and buffers, e.g. batch-norm statistics)
  polyak:  target <- polyak_coef * online + (1 - polyak_coef) * target   (parameters only;
           SLM-Lab's convention: polyak_coef is the weight of the online net)
When they move is the algorithm's: the DQN family every update_frequency frames, SAC and TD3
after each policy step (replace: when update_frequency frames have passed).

Continuous actions: actors act in [-1, 1]^act_dim (a tanh), which to_env scales to the env's
bounds; the memory and the critics take the unit actions (to_unit maps the env's back).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from slm_lab.agent.algorithm.base import Algorithm
from slm_lab.agent.net import IMAGE_NETS, kernels
from slm_lab.lib.errors import SpecError


def state_action_value(q_net: nn.Module, states: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Q(s, a) (B,) of a critic that takes the state (B, *obs_shape) and the action (B, act_dim)
    together: joined to an image net's features, or concatenated to the flattened state."""
    if isinstance(q_net, IMAGE_NETS):
        return q_net(states, actions).squeeze(-1)
    return q_net(torch.cat([states.flatten(start_dim=1), actions], dim=-1)).squeeze(-1)


class OffPolicyAlgorithm(Algorithm):
    """Store every vector step, then `train` when `train_due`; target nets move by
    `update_target_nets` (see the module docstring). Subclasses set training_start_step and
    training_frequency, give `train` and, with target nets, `target_pairs`."""

    training_start_step: int = 1
    training_frequency: int = 1
    # polyak arithmetic: torch.lerp (target + c * (online - target)) when true; SLM-Lab's DQN
    # formula (1 - c) * target + c * online when false (the same average, rounded differently:
    # each family keeps its arithmetic so seeded runs stay identical across versions)
    polyak_lerp: bool = True

    def update(self, obs, action, reward, next_obs, terminated, truncated) -> dict | None:
        """Store one vector step (actions as memory_action gives them); train when due."""
        self.memory.add(obs, self.memory_action(action), reward, next_obs, terminated, truncated)
        return self.train() if self.train_due() else None

    def memory_action(self, action: np.ndarray) -> np.ndarray:
        """The env's actions (N, ...) as the memory stores them (unchanged by default)."""
        return action

    def train_due(self) -> bool:
        """training_start_step transitions stored, and this step crosses training_frequency frames."""
        return len(self.memory) >= self.training_start_step and self.crossed_next(self.training_frequency)

    def train(self) -> dict:
        """One training from the memory: returns the training metrics."""
        raise NotImplementedError

    # --- target nets ----------------------------------------------------------------------------
    def target_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        """(target net, online net) pairs that update_target_nets moves; none by default."""
        return []

    @torch.no_grad()
    def update_target_nets(self, update_type: str, polyak_coef: float) -> None:
        """Move every target net towards its online net: a copy ('replace') or a polyak average
        with weight polyak_coef on the online net ('polyak'), see the module docstring."""
        pairs = self.target_pairs()
        if not pairs:
            return
        if update_type == 'replace':
            # copy every tensor in place: what load_state_dict(state_dict()) does, without its
            # per-call bookkeeping
            for target, online in pairs:
                for tp, p in zip(target.parameters(), online.parameters()):
                    tp.copy_(p)
                for tb, b in zip(target.buffers(), online.buffers()):
                    tb.copy_(b)
            return
        # the nets' parameters are fixed objects from construction (load_state_dict copies into them):
        # list them once, not at every step
        if getattr(self, '_polyak_params', None) is None:
            self._polyak_params = ([tp for target, _ in pairs for tp in target.parameters()],
                                   [p for _, online in pairs for p in online.parameters()])
        targets, onlines = self._polyak_params
        if self.polyak_lerp:
            kernels.lerp_(targets, onlines, polyak_coef)
        else:
            kernels.scale_add_(targets, onlines, 1.0 - polyak_coef, polyak_coef)

    def update_targets(self) -> None:
        """The actor-critics' cadence (SAC, TD3), called after each policy step: net.update_type
        "polyak" moves the targets by net.polyak_coef every time, "replace" copies the online nets
        once net.update_frequency frames have passed since the last copy."""
        if self.net_spec['update_type'] == 'polyak':
            self.update_target_nets('polyak', self.net_spec['polyak_coef'])
        elif self.crossed_next(self.net_spec['update_frequency']):
            self.update_target_nets('replace', self.net_spec['polyak_coef'])

    # --- continuous actions in [-1, 1] ----------------------------------------------------------
    def init_unit_actions(self) -> None:
        """Take the env's action bounds (finite, else a SpecError) for to_env / to_unit."""
        # the env's own bounds (the Agent gets the space under ClipAction, see env.agent_action_space)
        low, high = (self.action_space.low.astype(np.float64).reshape(-1),
                     self.action_space.high.astype(np.float64).reshape(-1))
        if not (np.isfinite(low).all() and np.isfinite(high).all()):
            raise SpecError(f"env.name: {type(self).__name__} squashes its actions into the bounds of the env's "
                            f'action space, and {self.env_spec["name"]} has infinite bounds ({low}, {high}); '
                            'use an env '
                            'with finite action bounds')
        self.action_center, self.action_half = (high + low) / 2, (high - low) / 2

    def to_env(self, unit_actions: np.ndarray) -> np.ndarray:
        """Squashed actions in [-1, 1] (N, act_dim) to the env's bounds."""
        return (unit_actions * self.action_half + self.action_center).astype(self.action_space.dtype)

    def to_unit(self, env_actions: np.ndarray) -> np.ndarray:
        """The env's actions back to [-1, 1], as the critics take them."""
        return ((np.asarray(env_actions, dtype=np.float64) - self.action_center) / self.action_half).astype(np.float32)
