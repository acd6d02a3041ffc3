"""SARSA (Rummery & Niranjan 1994) with a Q net, trained on-policy from the steps just taken.

For each step (s, a, r, s', a'), a' the action taken next in the same sub-env:
  y = r + gamma * (1 - terminated) * [(1 - truncated) * Q(s', a') + truncated * E_{a'~pi}[Q(s', a')]]
  loss = loss_fn(Q(s, a), y)        (y without gradient; one gradient step per batch)
After a truncation no action is ever taken at the final observation s' (the env resets and the next
action belongs to the next episode), so the target bootstraps from the value of s' under the
acting policy pi (epsilon-greedy, Boltzmann, greedy or softmax sampling, at the current
explore_var): what Q(s', a') would be on average had the episode gone on. A termination drops
the bootstrap.

Memories: OnPolicyBatchReplay trains every training_frequency vector steps. The batch's last step
has no next action yet, so it is held back (one row of N sub-envs) and trained at the head of the
next batch, once that action is known. (SLM-Lab instead bootstraps the last step of each batch
from action 0.) OnPolicyReplay (or OnPolicyCrossEntropy) trains every training_frequency finished
episodes, whose every step's next action is known or not needed.
"""
from __future__ import annotations

import numpy as np
import torch

from slm_lab.agent.algorithm import policy_util
from slm_lab.agent.algorithm.base import BASE_SCHEMA
from slm_lab.agent.algorithm.on_policy import OnPolicyAlgorithm
from slm_lab.agent.memory import OnPolicyBatchReplay
from slm_lab.agent.memory.onpolicy import RolloutBatch
from slm_lab.agent.net import build_net, net_util
from slm_lab.lib.schema import MAX_FRAME, Field


def sarsa_targets(rewards: torch.Tensor, terminateds: torch.Tensor, truncateds: torch.Tensor,
                  next_q_taken: torch.Tensor, next_q_expected: torch.Tensor, gamma: float) -> torch.Tensor:
    """SARSA targets for B steps, all (B,): rewards, terminateds and truncateds (1.0 / 0.0),
    Q(s', a') of the next action taken, and E_{a'~pi}[Q(s', a')] under the acting policy:

    y = r + gamma * (1 - terminated) * [(1 - truncated) * Q(s', a') + truncated * E_pi Q(s', .)]
    A step both terminated and truncated counts as terminated.
    """
    bootstrap = (1.0 - truncateds) * next_q_taken + truncateds * next_q_expected
    return rewards + gamma * (1.0 - terminateds) * bootstrap


def policy_probs(q: torch.Tensor, pdtype: str, action_policy: str, explore_var: float) -> torch.Tensor:
    """Probabilities (B, n) with which the acting policy picks each action given Q values (B, n):

    epsilon_greedy: epsilon / n + (1 - epsilon) * [a = argmax Q]   (epsilon = explore_var)
    boltzmann:      softmax(Q / tau) for Categorical (tau = explore_var); for Argmax [a = argmax Q]
                    (the acting rule samples the pdtype's distribution of Q / tau, which for Argmax
                    is the largest, as in SLM-Lab)
    random:         1 / n
    default:        [a = argmax Q] for Argmax, softmax(Q) for Categorical (Q as logits)
    """
    n = q.shape[-1]
    greedy = torch.nn.functional.one_hot(q.argmax(dim=-1), n).to(q.dtype)
    if action_policy == 'random':
        return torch.full_like(q, 1.0 / n)
    if action_policy == 'epsilon_greedy':
        return explore_var / n + (1.0 - explore_var) * greedy
    if action_policy == 'boltzmann' and pdtype != 'Argmax':
        return torch.softmax(q / max(explore_var, 1e-8), dim=-1)
    return greedy if pdtype == 'Argmax' else torch.softmax(q, dim=-1)


def next_actions_in_episodes(actions: np.ndarray, dones: np.ndarray) -> np.ndarray:
    """The next action of each step of episodes laid end to end, actions (T,) and dones (T,):
    actions[t + 1] within an episode, 0 at an episode's last step (done), where no next action
    exists (the targets drop or replace that bootstrap)."""
    next_actions = np.zeros_like(actions)
    next_actions[:-1] = actions[1:]
    next_actions[dones.astype(bool)] = 0
    return next_actions


class SARSA(OnPolicyAlgorithm):
    """On-policy Q-learning of the acting policy's own actions (see the module doc)."""

    spec_schema = {
        **BASE_SCHEMA,
        'training_frequency': Field((int,), 1, min=1, max=MAX_FRAME,
                                    doc='OnPolicyBatchReplay: vector steps per update; OnPolicyReplay: episodes '
                                        'per update'),
    }
    memory_names = ('OnPolicyBatchReplay', 'OnPolicyReplay', 'OnPolicyCrossEntropy')
    nets_doc = """one net with a Q-value per action, no target net; the loss is `loss_spec`,
        one optimizer, `optim_spec`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.net = build_net(self.net_spec, self.in_shape, self.act_dim).to(self.device)
        self.head = policy_util.PolicyHead(self.pdtype, self.act_dim)
        self.optimizers = {'net': net_util.make_optimizer(self.net.parameters(), self.net_spec['optim_spec'])}
        sched = net_util.make_lr_scheduler(self.optimizers['net'], self.net_spec['lr_scheduler_spec'], self.clock)
        self.lr_schedulers = {'net': sched} if sched else {}
        self.loss_fn = net_util.make_loss(self.net_spec['loss_spec'])
        self.training_frequency = self.algorithm_spec['training_frequency']
        self.held: RolloutBatch | None = None  # the last vector step of the previous batch (1, N, ...)

    def nets(self):
        return {'net': self.net}

    @torch.no_grad()
    def act(self, obs):
        actions = policy_util.sample_actions(self.net(self.tensor(obs)), self.head, self.action_policy,
                                             self.explore_var.value(self.clock.frame), self.rng, self.act_dim)
        return policy_util.to_env_actions(actions, self.action_space)

    @torch.no_grad()
    def act_greedy(self, obs):
        return self.net(self.tensor(obs)).argmax(dim=-1).cpu().numpy()

    def train_due(self) -> bool:
        """A full batch (OnPolicyBatchReplay), or training_frequency finished episodes."""
        if isinstance(self.memory, OnPolicyBatchReplay):
            return self.memory.is_full
        return super().train_due()

    def train_batch(self, batch):
        """A batch of vector steps trains with the held-back step at its head and its own last
        step held back (None on the very first step); whole episodes train as they are."""
        if isinstance(batch, RolloutBatch):
            if self.held is not None:
                batch = RolloutBatch(*(np.concatenate([h, b]) for h, b in zip(self.held, batch)))
            self.held = RolloutBatch(*(v[-1:] for v in batch))
            if len(batch.rewards) < 2:  # the very first step: nothing has its next action yet
                return None
            steps = RolloutBatch(*(v[:-1] for v in batch))
            next_actions = batch.actions[1:].reshape((-1,) + batch.actions.shape[2:])
            return self.train(steps.flat('states'), steps.flat('actions'), steps.flat('rewards'),
                              steps.flat('next_states'), next_actions, steps.flat('terminateds'),
                              steps.flat('truncateds'))
        return self.train(batch.states, batch.actions, batch.rewards, batch.next_states,
                          next_actions_in_episodes(batch.actions, batch.dones), batch.terminateds, batch.truncateds)

    def train(self, states, actions, rewards, next_states, next_actions, terminateds, truncateds) -> dict:
        """One gradient step on B steps: states and next_states (B, *obs_shape), actions and
        next_actions (B,), rewards, terminateds, truncateds (B,)."""
        with torch.no_grad():
            next_q = self.net(self.tensor(next_states))
            next_q_taken = next_q.gather(-1, torch.as_tensor(next_actions, device=self.device).long()[:, None])
            probs = policy_probs(next_q, self.pdtype, self.action_policy, self.explore_var.value(self.clock.frame))
            targets = sarsa_targets(self.tensor(rewards), self.tensor(terminateds), self.tensor(truncateds),
                                    next_q_taken.squeeze(-1), (probs * next_q).sum(-1), self.gamma)
        q = self.net(self.tensor(states)).gather(-1, torch.as_tensor(actions, device=self.device).long()[:, None])
        loss = self.loss_fn(q.squeeze(-1), targets)
        grad_norm = self.step_optimizers(loss)
        self.step_lr_schedulers()
        return {'loss': float(loss.detach()), 'grad_norm': grad_norm}

    def cut_episodes(self) -> None:
        """The held-back step's episode was abandoned: it ends there, truncated, and its target
        takes the expected value of its next state rather than the next episode's first action."""
        if self.held is not None:
            self.held.truncateds[:] = 1.0

    def extra_state(self) -> dict:
        """The held-back step (arrays (1, N, ...)), or None before the first batch."""
        return {'held': None if self.held is None else dict(self.held._asdict())}

    def load_extra_state(self, state: dict) -> None:
        held = state['held']
        self.held = None if held is None else RolloutBatch(**{k: np.array(v) for k, v in held.items()})
