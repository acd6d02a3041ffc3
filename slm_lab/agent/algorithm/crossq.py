"""CrossQ (Bhatt et al., ICLR 2024) as SLM-Lab v5 has it: Soft Actor-Critic without target nets,
its critics normalised by batch (re)normalisation that sees the current and the next state-actions
in one forward pass.

Per training batch, each critic runs once, in training mode, on the concatenation of the batch's
(s, a) and (s', a') (a' ~ pi(s'), without gradient; for discrete actions on s and s'):
    [Q(s, a); Q(s', a')] = Q([(s, a); (s', a')])          (2B rows: shared normalisation statistics)
and the soft target uses the second half, detached, in place of the target nets':
    y = r + gamma * (1 - terminated) * (min(Q1, Q2)(s', a') - alpha * log pi(a'|s'))    (continuous)
    y = r + gamma * (1 - terminated) * sum_a pi(a|s') (Qbar(s', a) - alpha * log pi(a|s'))  (discrete)
The policy loss evaluates the critics in evaluation mode (running statistics, which the policy's
batch must not move); the temperature and every key are SoftActorCritic's (see sac.py).

The critics are built from agent.critic_net when the spec gives one (SLM-Lab's YAML specs give a
TorchArcNet whose arc holds LazyBatchRenorm1d layers), else from agent.net. With an MLP critic,
`critic_batch_renorm` puts a BatchRenorm1d after each hidden linear layer (SLM-Lab's own MLP
CrossQ specs leave the critic unnormalised, which is what null keeps).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from slm_lab.agent.algorithm.off_policy import state_action_value
from slm_lab.agent.algorithm.sac import SAC_SCHEMA, SoftActorCritic, continuous_soft_value, soft_q_targets
from slm_lab.agent.algorithm.sac_discrete import DiscreteSAC, discrete_soft_value
from slm_lab.agent.algorithm.twin_critic import Critique
from slm_lab.agent.net.batch_renorm import VARIANCES, BatchRenorm1d
from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import MAX_FRAME, Field


def insert_batch_renorm(net: nn.Module, brn_spec: dict) -> int:
    """Put a BatchRenorm1d(width, **brn_spec) right after every nn.Linear inside the nn.Sequential
    blocks of `net` (an MLP's hidden layers; its output heads are not in a Sequential). Returns
    how many were inserted."""
    count = 0
    for module in list(net.modules()):
        if not isinstance(module, nn.Sequential):
            continue
        layers = []
        for layer in module:
            layers.append(layer)
            if isinstance(layer, nn.Linear):
                layers.append(BatchRenorm1d(layer.out_features, **brn_spec))
                count += 1
        if len(layers) != len(module):
            for i, layer in enumerate(layers):  # rebuild in place, so the parent keeps its reference
                module._modules[str(i)] = layer
    return count


class CrossQ(SoftActorCritic):
    """SAC without target nets; the critics' normalisation sees (s, a) and (s', a') together.
    Continuous actions here; DiscreteCrossQ for Discrete ones (the family's other member)."""

    spec_schema = {
        **SAC_SCHEMA,
        'critic_batch_renorm': Field((dict,), None, nullable=True, schema={
            'momentum': Field((float,), 0.01, min=0, max=1, doc='weight of the batch in the running statistics'),
            'eps': Field((float,), 0.001, min=0, min_exclusive=True, doc='added to the variances'),
            'warmup_steps': Field((int,), 10000, min=0, max=MAX_FRAME,
                                  doc='training forwards over which r_max and d_max reach their limits'),
            'r_max': Field((float,), 3.0, min=1, doc='limit of the scale correction r'),
            'd_max': Field((float,), 5.0, min=0, doc='limit of the shift correction d'),
        }, doc='a BatchRenorm1d after each hidden layer of an MLP critic (null: the critic as its net spec '
               "builds it; a TorchArcNet critic names its own LazyBatchRenorm1d layers)"),
        'batch_renorm_variance': Field((str,), 'two_pass', choices=VARIANCES,
                                       doc="how the critics' batch-renorm layers compute the batch variance: "
                                           '"two_pass", the mean squared deviation from the batch mean (a CrossQ '
                                           'update ~20% faster on CPU); "welford", torch\'s one-pass x.var, as runs '
                                           'saved before the key computed it (they resume with it). The same '
                                           'quantity, rounded differently'),
    }
    uses_target_nets = False
    nets_doc = """SAC's policy and temperature, and twin Q nets without targets, built from
        `agent.critic_net` when the spec gives one (any net type; SLM-Lab's CrossQ specs give a TorchArcNet
        with batch-renorm layers), else from `agent.net` (with `critic_batch_renorm`, a BatchRenorm1d after
        each hidden layer); the critics' optimizer is the critic net spec's `optim_spec`, the loss
        `agent.net.loss_spec`."""
    pdtypes = ('default', 'Categorical', 'Normal')  # SLM-Lab v5's CrossQ: no v4 GumbelSoftmax variant
    uses_critic_net = True  # agent.critic_net: validated by spec/validate.py with the schema of its net type

    def build_critic(self, in_dim: int | tuple[int, ...], out_dim: int, extra_dim: int = 0) -> nn.Module:
        """The critic net spec's Q net, with critic_batch_renorm's layers inserted before the
        optimizers are built (an optimizer such as Lookahead copies its parameters when made)."""
        q_net = super().build_critic(in_dim, out_dim, extra_dim)
        brn = self.algorithm_spec['critic_batch_renorm']
        if brn is not None and insert_batch_renorm(q_net, brn) == 0:
            raise SpecError(f"agent.algorithm.critic_batch_renorm: the critic net ({self.critic_spec['type']}) has "
                            'no hidden linear layers in a sequence to normalise; use an MLPNet critic with '
                            'hid_layers, or null')
        variance = self.algorithm_spec.get('batch_renorm_variance', 'welford')  # absent: saved before the key
        for module in q_net.modules():  # a lazy layer keeps the attribute when it becomes a BatchRenorm1d
            if isinstance(module, BatchRenorm1d):
                module.variance = variance
        return q_net

    def critic_net_spec(self, agent_spec: dict) -> dict:
        """agent.critic_net when given, else agent.net."""
        if agent_spec.get('critic_net') is not None:
            self.critic_path = 'agent.critic_net'
            return agent_spec['critic_net']
        return self.net_spec

    def critic_values(self, states, actions, next_states, rewards, terminateds, alpha) -> Critique:
        """One training-mode forward of each critic on the batch's (s, a) and (s', a') together;
        the targets from its second half, detached (see the module docstring)."""
        self.q1_net.train(), self.q2_net.train()
        n = len(states)
        with torch.no_grad():
            next_actions, next_log_probs = self.net.sample(next_states, reparam=False)
        both_states = torch.cat([states, next_states], dim=0)
        both_actions = torch.cat([actions, next_actions], dim=0)
        q1_both = state_action_value(self.q1_net, both_states, both_actions)
        q2_both = state_action_value(self.q2_net, both_states, both_actions)
        with torch.no_grad():
            next_values = continuous_soft_value(q1_both[n:], q2_both[n:], next_log_probs, alpha)
            targets = soft_q_targets(rewards, terminateds, next_values, self.gamma)
        return Critique(q1_both[:n], q2_both[:n], targets)

    def policy_q(self, states, actions):
        """The critics in evaluation mode: the policy's batch must not move their running statistics."""
        self.q1_net.eval(), self.q2_net.eval()
        q1, q2 = super().policy_q(states, actions)
        self.q1_net.train(), self.q2_net.train()
        return q1, q2


class DiscreteCrossQ(CrossQ, DiscreteSAC, actions='discrete'):
    """CrossQ on Discrete actions: DiscreteSAC's policy and losses, its critics run once on the
    batch's s and s' together."""

    def critic_values(self, states, actions, next_states, rewards, terminateds, alpha) -> Critique:
        """One training-mode forward of each critic on s and s' together; the targets from the
        critics' mean on the second half, detached."""
        self.q1_net.train(), self.q2_net.train()
        n = len(states)
        both = torch.cat([states, next_states], dim=0)
        q1_both, q2_both = self.q1_net(both), self.q2_net(both)
        q1_all, q2_all = q1_both[:n], q2_both[:n]
        with torch.no_grad():
            next_q = (q1_both[n:] + q2_both[n:]) / 2
            next_values = discrete_soft_value(self.net(next_states), next_q, alpha)
        index = actions.long().unsqueeze(-1)
        q1, q2 = q1_all.gather(-1, index).squeeze(-1), q2_all.gather(-1, index).squeeze(-1)
        with torch.no_grad():
            targets = soft_q_targets(rewards, terminateds, next_values, self.gamma)
        return Critique(q1, q2, targets, q1_all, q2_all)
