"""Twin critics (Fujimoto et al. 2018's clipped double Q): what SAC, CrossQ and TD3 share.

An actor (self.net) and two critics Q1, Q2 of one net spec, each with a frozen target copy Q1',
Q2' unless uses_target_nets is false (CrossQ). The critics train together on

    J_Q = loss_fn(Q1(s, a), y) + loss_fn(Q2(s, a), y)        (mean(w * per-sample loss) under a
                                                              prioritized batch's weights w)

with y the algorithm's own target (`critique`), one optimizer over both; the actor on the
algorithm's `policy_loss` every policy_delay-th critic step, with the critics frozen, after which
the targets move (OffPolicyAlgorithm.update_targets: polyak or replace). Under a prioritized
replay each batch's TD errors |min(Q1, Q2)(s, a) - y| go back to the memory. Each net's gradient
is clipped on its own (clip_groups), as SLM-Lab clips each net in its own train step.

The state_dict keys stay those of the algorithms before this module held them: nets 'q1_net',
'q2_net', 'target_q1_net', 'target_q2_net', optimizers 'actor' and 'critic', extra 'train_step'.
"""
from __future__ import annotations

import contextlib
import copy
from typing import Iterator, NamedTuple

import numpy as np
import torch
import torch.nn as nn

from slm_lab.agent.algorithm.off_policy import OffPolicyAlgorithm
from slm_lab.agent.memory import Batch
from slm_lab.agent.net import build_net, net_util


class Critique(NamedTuple):
    """A batch's critic pass: Q1(s, a), Q2(s, a) and the targets y (B,) (y without gradient);
    for critics with a value per discrete action, Q1(s, .) and Q2(s, .) (B, n_actions) too, which
    the policy loss reuses (else None)."""
    q1: torch.Tensor
    q2: torch.Tensor
    targets: torch.Tensor
    q1_all: torch.Tensor | None = None
    q2_all: torch.Tensor | None = None


class TwinCriticAlgorithm(OffPolicyAlgorithm):
    """The base of actor-critics with twin critics (see the module docstring). A subclass builds
    its actor as self.net, then calls build_critics and build_optimizers, and gives `critique`
    and `policy_loss` (and, to act, `policy_actions` and `act_greedy`)."""

    uses_target_nets: bool = True
    critic_path: str = 'agent.net'  # where the critics' net spec is (critic_net_spec), for messages

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        spec = self.algorithm_spec
        self.critic_spec = self.critic_net_spec(self.agent_spec)
        # the critics' loss is agent.net's loss_spec, as in SLM-Lab (also with a separate critic_net);
        # per sample for a prioritized batch's importance weights
        self.loss_fn = net_util.make_loss(self.net_spec['loss_spec'])
        self.sample_loss_fn = net_util.make_loss({**self.net_spec['loss_spec'], 'reduction': 'none'})
        self.training_iter, self.training_frequency = spec['training_iter'], spec['training_frequency']
        self.training_start_step, self.policy_delay = spec['training_start_step'], spec['policy_delay']
        self.train_step = 0  # critic steps so far: the policy steps on every policy_delay-th

    # --- the critics ----------------------------------------------------------------------------
    def critic_net_spec(self, agent_spec: dict) -> dict:
        """The net spec the critics are built from: agent.net by default."""
        return self.net_spec

    def build_critic(self, in_dim: int | tuple[int, ...], out_dim: int, extra_dim: int = 0) -> nn.Module:
        """One Q net of the critic net spec for states of shape in_dim (and actions of width
        extra_dim joined to them), before any optimizer sees its parameters (a subclass that adds
        layers does it here)."""
        return build_net(self.critic_spec, in_dim, out_dim, extra_dim=extra_dim)

    def build_critics(self, out_dim: int, extra_dim: int = 0) -> None:
        """Q1 then Q2 (out_dim values of the state, and of an action of width extra_dim), on the
        device, and their frozen target copies when uses_target_nets."""
        self.q1_net = self.build_critic(self.in_shape, out_dim, extra_dim).to(self.device)
        self.q2_net = self.build_critic(self.in_shape, out_dim, extra_dim).to(self.device)
        # the critics' parameters, for frozen_critics (a load or a distributed attach changes their
        # values in place, never the Parameter objects)
        self._critic_params = [*self.q1_net.parameters(), *self.q2_net.parameters()]
        self.target_q1_net = self.target_q2_net = None
        if self.uses_target_nets:
            self.target_q1_net = copy.deepcopy(self.q1_net).requires_grad_(False)
            self.target_q2_net = copy.deepcopy(self.q2_net).requires_grad_(False)

    def critic_nets(self) -> dict[str, nn.Module]:
        """Q1 and Q2, and their targets when there are any, by their state_dict names."""
        nets = {'q1_net': self.q1_net, 'q2_net': self.q2_net}
        if self.uses_target_nets:
            nets.update(target_q1_net=self.target_q1_net, target_q2_net=self.target_q2_net)
        return nets

    def build_optimizers(self, **more: torch.optim.Optimizer) -> None:
        """The actor's optimizer (agent.net's optim_spec) and the critics' (one over Q1 and Q2,
        the critic net spec's optim_spec), then `more` by name (SAC's temperature); each with
        the LR scheduler its net spec's lr_scheduler_spec gives (the critics' the critic net spec's)."""
        self.optimizers = {
            'actor': net_util.make_optimizer(self.net.parameters(), self.net_spec['optim_spec']),
            'critic': net_util.make_optimizer(list(self.q1_net.parameters()) + list(self.q2_net.parameters()),
                                              self.critic_spec['optim_spec'], self.critic_path + '.optim_spec'),
            **more,
        }
        for name, opt in self.optimizers.items():
            sched_spec = (self.critic_spec if name == 'critic' else self.net_spec).get('lr_scheduler_spec')
            sched = net_util.make_lr_scheduler(opt, sched_spec, self.clock)
            if sched is not None:
                self.lr_schedulers[name] = sched

    def target_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        if not self.uses_target_nets:
            return []
        return [(self.target_q1_net, self.q1_net), (self.target_q2_net, self.q2_net)]

    def clip_groups(self) -> list[list[torch.Tensor]]:
        """The actor, Q1 and Q2 each clipped on its own."""
        return [list(self.net.parameters()), list(self.q1_net.parameters()), list(self.q2_net.parameters())]

    @contextlib.contextmanager
    def frozen_critics(self) -> Iterator[None]:
        """The critics without gradients meanwhile: the policy's loss does not train them (what
        q1_net.requires_grad_(False) does, without walking the modules on every actor step)."""
        for p in self._critic_params:
            p.requires_grad_(False)
        try:
            yield
        finally:
            for p in self._critic_params:
                p.requires_grad_(True)

    # --- acting ---------------------------------------------------------------------------------
    @torch.no_grad()
    def act(self, obs: np.ndarray) -> np.ndarray:
        """Uniformly random actions before training_start_step frames (they fill the memory
        first), then the policy's (policy_actions)."""
        if self.clock.frame < self.training_start_step:
            return self.random_actions(len(obs))
        return self.policy_actions(obs)

    def random_actions(self, n: int) -> np.ndarray:
        """n actions drawn uniformly: in [-1, 1]^act_dim, scaled to the env's bounds."""
        return self.to_env(self.rng.uniform(-1.0, 1.0, size=(n, self.act_dim)))

    def policy_actions(self, obs: np.ndarray) -> np.ndarray:
        """The policy's training actions for observations (N, *obs_shape), as the env takes them."""
        raise NotImplementedError

    def memory_action(self, action: np.ndarray) -> np.ndarray:
        """Continuous actions are stored in [-1, 1], as the critics take them."""
        return self.to_unit(action)

    # --- training -------------------------------------------------------------------------------
    def critique(self, batch: Batch) -> Critique:
        """The critics on a batch (tensors on the device) and its targets y."""
        raise NotImplementedError

    def critic_loss(self, q: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
        """loss_fn(Q, y), Q and y (B,); with importance weights w (B,), mean(w * per-sample loss)."""
        if weights is None:
            return self.loss_fn(q, targets)
        return (weights * self.sample_loss_fn(q, targets)).mean()

    def policy_loss(self, batch: Batch, critique: Critique) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the actor's loss, the policy's entropy estimate (detached) or None), the critics
        frozen meanwhile."""
        raise NotImplementedError

    def after_policy_step(self, loss: torch.Tensor, entropy: torch.Tensor | None) -> torch.Tensor:
        """After each actor step, before the targets move (SAC steps its temperature here):
        returns the batch's reported loss (`loss`, detached, plus what this step adds)."""
        return loss

    def train(self) -> dict:
        """training_iter batches, each a critic step and, every policy_delay-th, an actor step
        and a target update (see the module docstring)."""
        losses, entropies, norms = [], [], []
        for _ in range(self.training_iter):
            batch = self.memory.sample().to(self.device)
            critique = self.critique(batch)
            loss = (self.critic_loss(critique.q1, critique.targets, batch.weights)
                    + self.critic_loss(critique.q2, critique.targets, batch.weights))
            norms.append(self.step_optimizers(loss, names=('critic',)))
            loss = loss.detach()
            self.train_step += 1
            if self.train_step % self.policy_delay == 0:
                with self.frozen_critics():
                    policy_loss, entropy = self.policy_loss(batch, critique)
                self.step_optimizers(policy_loss, names=('actor',), tick=False)
                loss = self.after_policy_step(loss + policy_loss.detach(), entropy)
                if entropy is not None:
                    entropies.append(float(entropy))
                self.update_targets()
            losses.append(loss)
            if batch.indices is not None:  # a prioritized batch: the sampled transitions' new TD errors
                with torch.no_grad():
                    errors = (torch.min(critique.q1, critique.q2) - critique.targets).abs().cpu().numpy()
                self.memory.update_priorities(batch.indices, errors)
        self.step_lr_schedulers()
        metrics = {'loss': float(torch.stack(losses).mean()), 'grad_norm': sum(norms) / len(norms)}
        if entropies:
            metrics['entropy'] = sum(entropies) / len(entropies)
        return metrics

    # --- state ----------------------------------------------------------------------------------
    def extra_state(self) -> dict:
        return {'train_step': self.train_step}

    def load_extra_state(self, state: dict) -> None:
        self.train_step = int(state['train_step'])
