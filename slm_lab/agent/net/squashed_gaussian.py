"""The tanh-squashed Gaussian policy of continuous Soft Actor-Critic (and CrossQ): a = tanh(u),
u ~ N(mu(s), sigma(s)), and the log density of its actions."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from slm_lab.agent.net import build_net

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0  # SLM-Lab's clamp of a Gaussian policy's log standard deviation


def squashed_log_prob(normal_log_prob: torch.Tensor, raw_actions: torch.Tensor) -> torch.Tensor:
    """log pi(tanh(u)|s) for a = tanh(u): the Gaussian's log density of u, summed over the action
    dimensions (B,), less the log |det da/du| = sum_i log(1 - tanh(u_i)^2), computed stably as
    2 * (log 2 - u - softplus(-2u)). raw_actions u (B, act_dim)."""
    correction = 2.0 * (math.log(2.0) - raw_actions - F.softplus(-2.0 * raw_actions))
    return normal_log_prob - correction.sum(dim=-1)


class GaussianPolicy(nn.Module):
    """The continuous policy: a net of net.type giving the mean (B, act_dim) and, in a second
    head, the log standard deviation (B, act_dim); with net.log_std_init the log standard
    deviation is one state-independent parameter per action dimension instead (SLM-Lab's
    CleanRL-style option). The log standard deviation is clamped to [-5, 2]."""

    def __init__(self, net_spec: dict, in_dim: int | tuple[int, ...], act_dim: int):
        super().__init__()
        log_std_init = net_spec.get('log_std_init')
        self.body = build_net(net_spec, in_dim, act_dim if log_std_init is not None else [act_dim, act_dim])
        self.log_std = (nn.Parameter(torch.full((act_dim,), float(log_std_init))) if log_std_init is not None
                        else None)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.log_std is None:
            loc, log_std = self.body(x)
        else:
            loc = self.body(x)
            log_std = self.log_std.expand_as(loc)
        return loc, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, x: torch.Tensor, reparam: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """a = tanh(u), u ~ N(loc, std): returns (a (B, act_dim), log pi(a|s) (B,)). The draw and the
        density are torch.distributions.Normal's own operations (rsample: loc + eps * std with
        eps from normal_(); sample: torch.normal without gradients; log_prob), written out: the
        same numbers from the same random stream, without a distribution object per call (its
        construction and broadcasting cost more host time than the sampling on small nets)."""
        loc, log_std = self(x)
        loc, scale = torch.broadcast_tensors(loc, log_std.exp())  # as Normal's constructor: the same autograd graph
        if reparam:
            raw = loc + torch.empty_like(loc).normal_() * scale
        else:
            with torch.no_grad():
                raw = torch.normal(loc, scale)
        # tanh first, then Normal.log_prob's operations in its order: the order autograd sums the
        # gradients of raw, loc and scale in, as through the distribution
        actions = torch.tanh(raw)
        var, log_scale = scale ** 2, scale.log()
        normal_log_prob = -((raw - loc) ** 2) / (2 * var) - log_scale - math.log(math.sqrt(2 * math.pi))
        return actions, squashed_log_prob(normal_log_prob.sum(dim=-1), raw)
