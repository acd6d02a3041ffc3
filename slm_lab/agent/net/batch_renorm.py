"""Batch renormalisation (Ioffe 2017), the critic normaliser of CrossQ (Bhatt et al. 2024).

Plain batch norm normalises with the minibatch's statistics while training and with running
statistics in evaluation; in off-policy RL the two differ enough to destabilise the critic.
Batch renorm trains on the minibatch statistics corrected towards the running ones:

    x_hat = (x - mu_B) / sigma_B * r + d
    r = clip(sigma_B / sigma, 1 / r_max, r_max)        (no gradient through r)
    d = clip((mu_B - mu) / sigma, -d_max, d_max)       (no gradient through d)
    y = weight * x_hat + bias

with sigma_B = sqrt(var_B + eps), sigma = sqrt(running_var + eps) and the biased batch variance.
Over warmup_steps training forwards r_max rises linearly from 1 to its limit and d_max from 0
to its limit, so the layer starts as plain batch norm. The running statistics follow the batch:
running <- (1 - momentum) * running + momentum * batch (torch's convention). In evaluation the
layer normalises with the running statistics alone.

Every piece of state (weight, bias, running_mean, running_var and the count of training
forwards `step`) is in the module's state_dict, so a resumed critic continues exactly.
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.nn.modules.lazy import LazyModuleMixin


def renorm_limits(step: int, warmup_steps: int, r_max: float, d_max: float) -> tuple[float, float]:
    """The clipping limits after `step` training forwards: r_max_t = 1 + t * (r_max - 1) and
    d_max_t = t * d_max with t = min(step / warmup_steps, 1) (t = 1 when warmup_steps is 0)."""
    t = min(step / warmup_steps, 1.0) if warmup_steps > 0 else 1.0
    return 1.0 + t * (r_max - 1.0), t * d_max


VARIANCES = ('two_pass', 'welford')


def batch_renorm(x: torch.Tensor, running_mean: torch.Tensor, running_var: torch.Tensor, eps: float,
                 r_max: float, d_max: float,
                 variance: str = 'welford') -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Training-mode normalisation of x (B, C) (see the module docstring), before the affine map.

    variance: how the biased batch variance is computed. "welford": torch's x.var (Welford's
    one-pass algorithm, which torch's CPU kernel runs at ~5 ns an element: 0.66 ms for CrossQ's
    512 x 256 batch, a fifth of a CrossQ update); "two_pass": the mean of the squared deviations
    from the batch mean, whose deviations the normalisation reuses (fewer, vectorised ops: the
    forward and backward of a 512 x 256 layer 1.97 -> 1.27 ms). The same quantity, rounded
    differently (both within ~1e-7 relative of the float64 variance).

    Returns (x_hat (B, C), batch mean (C,), biased batch variance (C,)); the caller moves the
    running statistics with the last two.
    """
    mean = x.mean(dim=0)
    centered = x - mean
    var = centered.square().mean(dim=0) if variance == 'two_pass' else x.var(dim=0, unbiased=False)
    std = (var + eps).sqrt()
    running_std = (running_var + eps).sqrt()
    r = (std.detach() / running_std).clamp(1.0 / r_max, r_max)
    d = ((mean.detach() - running_mean) / running_std).clamp(-d_max, d_max)
    return centered / std * r + d, mean, var


class BatchRenorm1d(nn.Module):
    """Batch renormalisation over the features of (B, C) inputs (see the module docstring).

    momentum: weight of the batch in each running-statistics update (torch's convention).
    r_max, d_max: the clipping limits reached after warmup_steps training forwards.
    `variance` (an attribute, "welford" unless set; see batch_renorm): CrossQ sets it from
    agent.algorithm.batch_renorm_variance on its critics' layers.
    """

    variance = 'welford'

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.01, r_max: float = 3.0,
                 d_max: float = 5.0, warmup_steps: int = 10000):
        super().__init__()
        self.num_features = num_features
        self.eps, self.momentum = eps, momentum
        self.r_max, self.d_max, self.warmup_steps = r_max, d_max, warmup_steps
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer('running_mean', torch.zeros(num_features))
        self.register_buffer('running_var', torch.ones(num_features))
        self.register_buffer('step', torch.tensor(0, dtype=torch.long))  # training forwards so far (warmup)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, C) -> (B, C)."""
        if not self.training:
            x_hat = (x - self.running_mean) / (self.running_var + self.eps).sqrt()
            return self.weight * x_hat + self.bias
        r_max, d_max = renorm_limits(int(self.step), self.warmup_steps, self.r_max, self.d_max)
        x_hat, mean, var = batch_renorm(x, self.running_mean, self.running_var, self.eps, r_max, d_max,
                                        self.variance)
        with torch.no_grad():
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(var, self.momentum)
            self.step += 1
        return self.weight * x_hat + self.bias

    def extra_repr(self) -> str:
        return (f'{self.num_features}, eps={self.eps}, momentum={self.momentum}, r_max={self.r_max}, '
                f'd_max={self.d_max}, warmup_steps={self.warmup_steps}')


class LazyBatchRenorm1d(LazyModuleMixin, BatchRenorm1d):
    """BatchRenorm1d whose num_features is read from its first input (B, C), for architectures
    that name layers without their widths (SLM-Lab v5's TorchArcNet specs: `LazyBatchRenorm1d`
    with momentum, eps, warmup_steps). It becomes a BatchRenorm1d after that first forward."""

    cls_to_become = BatchRenorm1d
    weight: nn.UninitializedParameter
    bias: nn.UninitializedParameter

    def __init__(self, eps: float = 1e-5, momentum: float = 0.01, r_max: float = 3.0, d_max: float = 5.0,
                 warmup_steps: int = 10000):
        super().__init__(0, eps=eps, momentum=momentum, r_max=r_max, d_max=d_max, warmup_steps=warmup_steps)
        self.weight = nn.UninitializedParameter()
        self.bias = nn.UninitializedParameter()
        self.running_mean = nn.UninitializedBuffer()
        self.running_var = nn.UninitializedBuffer()

    def reset_parameters(self) -> None:
        if not self.has_uninitialized_params():
            nn.init.ones_(self.weight)
            nn.init.zeros_(self.bias)
            self.running_mean.zero_()
            self.running_var.fill_(1.0)

    def initialize_parameters(self, x: torch.Tensor) -> None:
        if self.has_uninitialized_params():
            self.num_features = x.shape[1]
            with torch.no_grad():
                self.weight.materialize((self.num_features,))
                self.bias.materialize((self.num_features,))
                self.running_mean.materialize((self.num_features,))
                self.running_var.materialize((self.num_features,))
                self.reset_parameters()
