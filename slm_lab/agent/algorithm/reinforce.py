"""REINFORCE (Williams 1992): Monte-Carlo policy gradient with an entropy bonus.

loss = -mean_t[ log pi(a_t|s_t) * G_t ] - entropy_coef * mean_t[ H(pi(.|s_t)) ]
G_t = sum_k gamma^k r_{t+k} to the end of the episode (centred over the batch when center_return,
divided by its std over the batch when normalize_return).
"""
from __future__ import annotations

import numpy as np
import torch

from slm_lab.agent.algorithm import policy_util
from slm_lab.agent.algorithm.base import BASE_SCHEMA
from slm_lab.agent.algorithm.on_policy import OnPolicyAlgorithm
from slm_lab.agent.memory import OnPolicyBatchReplay
from slm_lab.agent.net import build_net, net_util
from slm_lab.lib.decay import schedule_field
from slm_lab.lib.schema import MAX_FRAME, Field


def discounted_returns(rewards: np.ndarray, dones: np.ndarray, gamma: float) -> np.ndarray:
    """Returns-to-go over a (T,) or (T, N) sequence, restarting after each done (1.0):

    G_t = r_t + gamma * (1 - done_t) * G_{t+1},   G_T = 0
    done_t is 1 where the episode ended at t, terminated or truncated: a Monte-Carlo return has
    no bootstrap, so a truncated episode's return stops at its last reward too.
    """
    returns = np.zeros_like(rewards, dtype=np.float32)
    running = np.zeros_like(rewards[0], dtype=np.float32)
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running * (1.0 - dones[t])
        returns[t] = running
    return returns


def scale_returns(returns: torch.Tensor, center: bool, normalize: bool) -> torch.Tensor:
    """The returns REINFORCE weights log-probabilities with, (B,):

    center:    G - mean(G)                 (a constant baseline)
    normalize: G / (std(G) + 1e-8)         (after centring when both; a single return is kept as is)
    """
    if center:
        returns = returns - returns.mean()
    if normalize and len(returns) > 1:
        returns = returns / (returns.std() + 1e-8)
    return returns


class Reinforce(OnPolicyAlgorithm):
    """Policy gradient from whole episodes (OnPolicyReplay) or fixed batches (OnPolicyBatchReplay,
    returns cut at the batch end)."""

    spec_schema = {
        **BASE_SCHEMA,
        'center_return': Field((bool,), False, doc="subtract the batch mean from the returns (a baseline; SLM-Lab's "
                                                     'default: off)'),
        'normalize_return': Field((bool,), False,
                                  doc='divide the returns by their std over the batch (after centring when '
                                      'center_return)'),
        'entropy_coef_spec': schedule_field('schedule of the entropy bonus coefficient'),
        'policy_loss_coef': Field((float,), 1.0, min=0, doc='weight of the policy-gradient term (not of the entropy '
                                                            "bonus), as in SLM-Lab's Reinforce"),
        'training_frequency': Field((int,), 1, min=1, max=MAX_FRAME,
                                    doc='OnPolicyReplay: episodes per update; OnPolicyBatchReplay: vector steps per '
                                        'update'),
    }
    memory_names = ('OnPolicyReplay', 'OnPolicyBatchReplay', 'OnPolicyCrossEntropy')
    continuous_ok = True
    samples_from_policy = True
    nets_doc = """one net with the policy output (for continuous actions also the log scale, unless
        `log_std_init` gives a learned state-independent one); one optimizer, `optim_spec`. It does not use
        `loss_spec`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        spec = self.algorithm_spec
        # as in SLM-Lab: with log_std_init, a learned state-independent log std; without, the
        # net outputs the log scale too
        log_std_init = self.net_spec.get('log_std_init')
        self.net = build_net(self.net_spec, self.in_shape,
                             policy_util.pd_out_dim(self.pdtype, self.act_dim, log_std_init)).to(self.device)
        self.head = policy_util.PolicyHead(self.pdtype, self.act_dim, log_std_init).to(self.device)
        self.optimizers = {'net': net_util.make_optimizer(
            list(self.net.parameters()) + list(self.head.parameters()), self.net_spec['optim_spec'])}
        sched = net_util.make_lr_scheduler(self.optimizers['net'], self.net_spec['lr_scheduler_spec'], self.clock)
        self.lr_schedulers = {'net': sched} if sched else {}
        self.training_frequency = spec['training_frequency']
        self.center_return, self.normalize_return = spec['center_return'], spec['normalize_return']
        self.policy_loss_coef = spec['policy_loss_coef']

    def nets(self):
        return {'net': self.net, 'head': self.head}

    @torch.no_grad()
    def act(self, obs):
        out = self.net(self.tensor(obs))
        actions = policy_util.sample_actions(out, self.head, self.action_policy,
                                             self.explore_var.value(self.clock.frame), self.rng, self.act_dim)
        return policy_util.to_env_actions(actions, self.action_space)

    @torch.no_grad()
    def act_greedy(self, obs):
        out = self.net(self.tensor(obs))
        return policy_util.to_env_actions(self.head.greedy_action(out), self.action_space)

    def train_batch(self, batch):
        """REINFORCE's returns over the batch (cut at the batch end for an OnPolicyBatchReplay),
        then one gradient step (train)."""
        if isinstance(self.memory, OnPolicyBatchReplay):
            dones = np.maximum(batch.terminateds, batch.truncateds)
            returns = discounted_returns(batch.rewards, dones, self.gamma).reshape(-1)
            return self.train(batch.flat('states'), batch.flat('actions'), returns)
        return self.train(batch.states, batch.actions, discounted_returns(batch.rewards, batch.dones, self.gamma))

    def train(self, states: np.ndarray, actions: np.ndarray, returns: np.ndarray) -> dict:
        """One gradient step on a batch: states (B, obs), actions (B,) or (B, act_dim), returns (B,)."""
        returns = scale_returns(self.tensor(returns), self.center_return, self.normalize_return)
        pd = self.head.distribution(self.net(self.tensor(states)))
        log_probs = pd.log_prob(policy_util.pd_actions(torch.as_tensor(actions, device=self.device), self.pdtype))
        entropy = pd.entropy().mean()
        entropy_coef = self.entropy_coef.value(self.clock.frame)
        entropy_coef = 0.0 if np.isnan(entropy_coef) else entropy_coef
        loss = -self.policy_loss_coef * (log_probs * returns).mean() - entropy_coef * entropy
        grad_norm = self.step_optimizers(loss)
        self.step_lr_schedulers()
        return {'loss': float(loss.detach()), 'entropy': float(entropy.detach()), 'grad_norm': grad_norm}
