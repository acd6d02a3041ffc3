"""Soft Actor-Critic for discrete actions: with the exact expectation over actions (Christodoulou
2019; SLM-Lab v5's), and SLM-Lab v4's on GumbelSoftmax. sac.py holds the continuous SAC, the
temperature and the keys; the registered SoftActorCritic builds these for Discrete actions.

  discrete (Categorical), critics Q(s, .) (B, n_actions):
    y       = r + gamma * (1 - terminated) * sum_a pi(a|s') (Qbar'(s', a) - alpha * log pi(a|s'))
    J_pi    = mean(sum_a pi(a|s) (alpha * log pi(a|s) - Qbar(s, a)))
    with Qbar = (Q1 + Q2) / 2, SLM-Lab v5's choice for discrete actions (the mean counters the
    underestimation of the minimum there; SD-SAC); H is the exact mean entropy, and
    entropy_penalty_coef adds 0.5 * coef * (H_ema - H)^2 to J_pi (SD-SAC)
  relaxed (GumbelSoftmax, SLM-Lab v4's discrete SAC): the critics take (s, one_hot(a)) and the
    continuous forms of sac.py apply with a' the policy's sampled action and a~ its straight-through
    one-hot sample (rsample), log pi Categorical's; "auto" target entropy -n_actions, as in v4
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from slm_lab.agent.algorithm import policy_util
from slm_lab.agent.algorithm.off_policy import state_action_value
from slm_lab.agent.algorithm.sac import SoftActorCritic, continuous_policy_loss, continuous_soft_value, soft_q_targets
from slm_lab.agent.algorithm.twin_critic import Critique
from slm_lab.agent.net import build_net


# --- maths --------------------------------------------------------------------------------------
def discrete_soft_value(next_logits: torch.Tensor, next_q: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
    """V(s') = sum_a pi(a|s') * (Q(s', a) - alpha * log pi(a|s')), the exact expectation over the
    actions; next_logits and next_q (B, n_actions), pi = softmax(next_logits). Returns (B,)."""
    log_pi = F.log_softmax(next_logits, dim=-1)
    return (log_pi.exp() * (next_q - alpha * log_pi)).sum(dim=-1)


def discrete_policy_loss(logits: torch.Tensor, q: torch.Tensor, alpha: float | torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """J_pi = mean_s sum_a pi(a|s) * (alpha * log pi(a|s) - Q(s, a)), with Q (B, n_actions) held
    fixed and pi = softmax(logits (B, n_actions)). Returns (J_pi, the mean entropy of pi, detached)."""
    log_pi = F.log_softmax(logits, dim=-1)
    pi = log_pi.exp()
    loss = (pi * (alpha * log_pi - q.detach())).sum(dim=-1).mean()
    return loss, -(pi * log_pi).sum(dim=-1).mean().detach()


def discrete_target_entropy(n_actions: int, start_ratio: float, end_ratio: float, anneal_frames: int,
                            frame: int) -> float:
    """SLM-Lab v5's target entropy for n discrete actions: ratio * log(n), the ratio moving
    linearly from start_ratio to end_ratio over anneal_frames frames (constant when 0)."""
    t = min(frame / anneal_frames, 1.0) if anneal_frames > 0 else 0.0
    return (start_ratio + t * (end_ratio - start_ratio)) * math.log(n_actions)


# --- the algorithms -----------------------------------------------------------------------------
class DiscreteSAC(SoftActorCritic, actions='discrete'):
    """SAC on Discrete actions: a policy of logits, critics with a value per action (see the
    module docstring)."""

    head_pdtype = 'Categorical'  # how the policy's logits are sampled (epsilon_greedy / boltzmann acting too)

    def build_policy(self):
        """A net of logits, one per action."""
        policy = build_net(self.net_spec, self.in_shape, self.act_dim).to(self.device)
        self.head = policy_util.PolicyHead(self.head_pdtype, self.act_dim)
        return policy

    def critic_dims(self) -> tuple[int, int]:
        """Q(s, .): a value per action, of the state alone."""
        return self.act_dim, 0

    def auto_target_entropy(self) -> float:
        """entropy_anneal's ratio of ln(n_actions) at this frame."""
        anneal = self.algorithm_spec['entropy_anneal'] or {}
        start, end = anneal.get('start_ratio', 0.6), anneal.get('end_ratio')
        return discrete_target_entropy(self.act_dim, start, start if end is None else end, anneal.get('frames', 0),
                                       self.clock.frame)

    def random_actions(self, n):
        return self.rng.integers(0, self.act_dim, size=n)

    def policy_actions(self, obs):
        actions = policy_util.sample_actions(self.net(self.tensor(obs)), self.head, self.action_policy,
                                             self.explore_var.value(self.clock.frame), self.rng, self.act_dim)
        return actions.cpu().numpy()

    @torch.no_grad()
    def act_greedy(self, obs):
        return self.net(self.tensor(obs)).argmax(dim=-1).cpu().numpy()

    def memory_action(self, action):
        """Discrete actions are stored as they are."""
        return action

    def critic_values(self, states, actions, next_states, rewards, terminateds, alpha) -> Critique:
        """The online critics on the batch (every action's values, and the taken one's) and the
        soft targets from the target critics' mean."""
        with torch.no_grad():
            next_q = (self.target_q1_net(next_states) + self.target_q2_net(next_states)) / 2
            next_values = discrete_soft_value(self.net(next_states), next_q, alpha)
            targets = soft_q_targets(rewards, terminateds, next_values, self.gamma)
        q1_all, q2_all = self.q1_net(states), self.q2_net(states)
        index = actions.long().unsqueeze(-1)
        return Critique(q1_all.gather(-1, index).squeeze(-1), q2_all.gather(-1, index).squeeze(-1), targets,
                        q1_all, q2_all)

    def policy_loss(self, batch, critique):
        """(J_pi on the critics' mean, the exact mean entropy (detached)), with SD-SAC's penalty."""
        loss, entropy = discrete_policy_loss(self.net(batch.states), (critique.q1_all + critique.q2_all) / 2,
                                             self.alpha())
        coef = self.algorithm_spec['entropy_penalty_coef']
        if coef > 0:  # SD-SAC: hold the entropy near its running mean
            if self.entropy_ema is None:
                self.entropy_ema = float(entropy)
            logits = self.net(batch.states)
            live_entropy = -(F.softmax(logits, -1) * F.log_softmax(logits, -1)).sum(-1).mean()
            loss = loss + coef * 0.5 * (self.entropy_ema - live_entropy) ** 2
            self.entropy_ema = 0.99 * self.entropy_ema + 0.01 * float(entropy)
        return loss, entropy


class RelaxedSAC(DiscreteSAC, actions='relaxed'):
    """SLM-Lab v4's discrete SAC (GumbelSoftmax): critics of (s, one_hot(a)), the continuous SAC's
    forms on straight-through one-hot actions (see the module docstring)."""

    head_pdtype = 'GumbelSoftmax'

    def critic_dims(self) -> tuple[int, int]:
        """Q(s, one_hot(a)): one value of the state and the action's one-hot."""
        return 1, self.act_dim

    def auto_target_entropy(self) -> float:
        """-n_actions, as in SLM-Lab v4."""
        return -float(self.act_dim)

    def critic_values(self, states, actions, next_states, rewards, terminateds, alpha) -> Critique:
        """The continuous soft value at a sampled next action, as its one-hot."""
        with torch.no_grad():
            dist = self.head.distribution(self.net(next_states))
            next_actions = dist.sample()
            next_one_hot = F.one_hot(next_actions, self.act_dim).float()
            next_values = continuous_soft_value(state_action_value(self.target_q1_net, next_states, next_one_hot),
                                                state_action_value(self.target_q2_net, next_states, next_one_hot),
                                                dist.log_prob(next_actions), alpha)
            targets = soft_q_targets(rewards, terminateds, next_values, self.gamma)
        one_hot = F.one_hot(actions.long(), self.act_dim).float()
        return Critique(state_action_value(self.q1_net, states, one_hot),
                        state_action_value(self.q2_net, states, one_hot),
                        targets)

    def policy_loss(self, batch, critique):
        """Straight-through one-hot actions carry the critics' gradient to the logits."""
        dist = self.head.distribution(self.net(batch.states))
        actions = dist.rsample()
        log_probs = dist.log_prob(actions)
        q1, q2 = self.policy_q(batch.states, actions)
        return continuous_policy_loss(log_probs, q1, q2, self.alpha()), -log_probs.mean().detach()
