"""The algorithms' maths on tensors, apart from any net: actor-critic advantages (GAE), n-step
and episode returns over (T, N) rollouts, the standardisation of advantages, A2C's policy loss,
SLM-Lab v5's running scale of value targets (ReturnNormalizer, a small resumable state), and
symlog. Checked against hand-computed values in test/agent/test_maths.py and test_actor_critic.py."""
from __future__ import annotations

import math

import numpy as np
import torch


def gae(rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor, terminateds: torch.Tensor,
        dones: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """Generalised advantage estimates over a (T, N) rollout; all inputs (T, N), floats.

    delta_t = r_t + gamma * (1 - terminated_t) * V(s'_t) - V(s_t)
    A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1},   A_T = 0
    s'_t is the true next state (the final observation when the episode ended at t). Only a
    termination drops the bootstrap V(s'_t): a truncated episode's last state still has a
    future. Both end the recursion, since A_{t+1} belongs to the next episode (done_t =
    terminated_t or truncated_t). At the batch end the recursion stops too and V(s'_{T-1})
    carries the rest.
    """
    deltas = rewards + gamma * (1.0 - terminateds) * next_values - values
    discounts = gamma * lam * (1.0 - dones)  # each element as the per-step form computes it
    if deltas.device.type == 'cpu' and not deltas.requires_grad:
        # the recursion on the tensors' numpy views: the same float32 operations, each one
        # rounded as torch's, at a third of the cost per step (T steps of a few elements each)
        d, c = deltas.numpy(), discounts.numpy()
        advantages = torch.empty_like(deltas)
        out = advantages.numpy()
        running = np.zeros_like(d[0])
        with np.errstate(all='ignore'):  # silent on inf / nan as torch is (a diverged run says so in one line)
            for t in range(len(d) - 1, -1, -1):
                running = d[t] + c[t] * running
                out[t] = running
        return advantages
    advantages = torch.zeros_like(deltas)
    running = torch.zeros_like(deltas[0])
    for t in range(len(deltas) - 1, -1, -1):
        running = deltas[t] + discounts[t] * running
        advantages[t] = running
    return advantages


def episode_returns(rewards: torch.Tensor, next_values: torch.Tensor, terminateds: torch.Tensor,
                    dones: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted returns to each episode's end over a (T, N) rollout; all inputs (T, N), floats.

    R_t = r_t + gamma * (1 - terminated_t) * [(1 - done_t) * R_{t+1} + done_t * V(s'_t)],   R_T = 0
    A terminated episode's return stops at its last reward; a truncated one's bootstraps from the
    value of its final observation (its state still had a future); an episode still running at
    the batch end is cut there, without a bootstrap (a Monte-Carlo return of what was seen).
    """
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in range(len(rewards) - 1, -1, -1):
        future = (1.0 - dones[t]) * running + dones[t] * next_values[t]
        running = rewards[t] + gamma * (1.0 - terminateds[t]) * future
        returns[t] = running
    return returns


def nstep_returns(rewards: torch.Tensor, next_values: torch.Tensor, terminateds: torch.Tensor,
                  dones: torch.Tensor, gamma: float, n: int) -> torch.Tensor:
    """n-step returns over a (T, N) rollout; all inputs (T, N), floats.

    R_t = sum_{k<h} gamma^k r_{t+k} + gamma^h * (1 - terminated_{t+h-1}) * V(s'_{t+h-1})
    where the horizon h = min(n, T - t, 1 + the steps from t to the first episode end at or after t):
    the sum stops after n rewards, at the batch end, or at the end of the episode, and bootstraps
    from the value of the true next state where it stops, except where the episode terminated
    (a truncated episode's last state still has a future). On a batch of exactly n steps this is
    A3C's return: each step's rewards to the batch end, then V of the last next state.
    """
    T = len(rewards)
    zeros = torch.zeros_like(rewards)

    def ahead(x: torch.Tensor, k: int) -> torch.Tensor:  # x_{t+k} at row t, 0 past the batch end
        return torch.cat([x[k:], zeros[:k]]) if k else x

    returns = torch.zeros_like(rewards)
    open_ = torch.ones_like(rewards)  # 1 while R_t's horizon has not been reached
    last = torch.zeros_like(rewards)
    last[T - 1:] = 1.0  # the batch end stops every sum
    for k in range(min(n, T)):
        returns = returns + open_ * gamma ** k * ahead(rewards, k)
        stops = ahead(torch.maximum(dones, last), k) if k < n - 1 else torch.ones_like(rewards)
        bootstrap = gamma ** (k + 1) * (1.0 - ahead(terminateds, k)) * ahead(next_values, k)
        returns = returns + open_ * stops * bootstrap
        open_ = open_ * (1.0 - stops)
    return returns


def standardize(x: torch.Tensor) -> torch.Tensor:
    """(x - mean(x)) / (std(x) + 1e-8) over a (B,) batch, std with Bessel's correction as in
    SLM-Lab; a single value is kept as it is."""
    return (x - x.mean()) / (x.std() + 1e-8) if len(x) > 1 else x


def actor_critic_policy_loss(log_probs: torch.Tensor, advantages: torch.Tensor, entropy: torch.Tensor,
                             policy_loss_coef: float, entropy_coef: float) -> torch.Tensor:
    """The A2C policy loss, to minimise; log_probs and advantages (B,), entropy (B,):

    loss = -policy_loss_coef * mean_i(log pi(a_i|s_i) * A_i) - entropy_coef * mean_i(H_i)
    (the advantages are used as given: standardise them first if wanted)."""
    return -policy_loss_coef * (log_probs * advantages).mean() - entropy_coef * entropy.mean()


class ReturnNormalizer:
    """SLM-Lab v5's running scale of value targets (normalize_v_targets).

    Keeps the mean and variance of every target seen (Chan et al.'s merge of batch moments):
      mean' = mean + delta * b / (c + b),   M2' = M2 + var_b * b + delta^2 * c * b / (c + b),
      var = M2' / (c + b) once more than one target was seen (1 before),
    with delta = mean_b - mean, c the count so far and b, mean_b, var_b (population) the batch's.
    scale(v) = clamp(v / max(sqrt(var + 1e-8), 1), -10, 10): divided by the running std (never
    enlarged), not centred, and clipped, as SLM-Lab applies it to both predictions and targets.
    """

    def __init__(self, epsilon: float = 1e-8, clip: float = 10.0):
        self.epsilon, self.clip = epsilon, clip
        self.mean, self.var, self.m2, self.count = 0.0, 1.0, 0.0, 0

    def update(self, values: torch.Tensor) -> None:
        """Fold a batch of targets (any shape) into the running moments."""
        batch = values.detach().flatten().double()
        n = len(batch)
        if n == 0:
            return
        batch_mean = float(batch.mean())
        batch_var = float(batch.var(correction=0)) if n > 1 else 0.0
        delta, total = batch_mean - self.mean, self.count + n
        self.mean += delta * n / total
        self.m2 += batch_var * n + delta ** 2 * self.count * n / total
        self.count = total
        if self.count > 1:
            self.var = self.m2 / self.count

    def scale(self, values: torch.Tensor) -> torch.Tensor:
        std = max(math.sqrt(self.var + self.epsilon), 1.0)
        return torch.clamp(values / std, -self.clip, self.clip)

    def state_dict(self) -> dict:
        return {'mean': self.mean, 'var': self.var, 'm2': self.m2, 'count': self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.m2 = float(state['mean']), float(state['var']), float(state['m2'])
        self.count = int(state['count'])


def symlog(x: torch.Tensor) -> torch.Tensor:
    """symlog(x) = sign(x) * ln(1 + |x|): near x for small |x|, logarithmic for large ones
    (DreamerV3), so value targets of very different scales weigh alike in the value loss."""
    return torch.sign(x) * torch.log1p(x.abs())
