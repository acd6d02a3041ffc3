"""torch's private (underscore) ops the lab calls for speed, each looked up once here, and the
public path each call takes where a torch release drops or renames its op (None below): the same
maths, one torch call per tensor instead of one for the list.

The multi-tensor `_foreach_*` ops run one kernel over a list of tensors (torch.optim and
torch.nn.utils use them inside); `_fused_adam_` is Adam's fused step (optim_steps.step_optimizer).
test/agent/test_kernels.py checks every fallback against the op it replaces.
"""
from __future__ import annotations

import torch

FOREACH_NORM = getattr(torch, '_foreach_norm', None)
FOREACH_LERP_ = getattr(torch, '_foreach_lerp_', None)
FOREACH_MUL_ = getattr(torch, '_foreach_mul_', None)
FOREACH_ADD_ = getattr(torch, '_foreach_add_', None)
FUSED_ADAM_ = getattr(torch, '_fused_adam_', None)


def norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The L2 norm of each tensor."""
    if FOREACH_NORM is not None:
        return list(FOREACH_NORM(tensors, 2.0))
    return [torch.linalg.vector_norm(t, 2.0) for t in tensors]


def lerp_(targets: list[torch.Tensor], sources: list[torch.Tensor], weight: float) -> None:
    """targets[i] += weight * (sources[i] - targets[i]), in place."""
    if FOREACH_LERP_ is not None:
        FOREACH_LERP_(targets, sources, weight)
        return
    for target, source in zip(targets, sources):
        target.lerp_(source, weight)


def scale_add_(targets: list[torch.Tensor], sources: list[torch.Tensor], keep: float, weight: float) -> None:
    """targets[i] = targets[i] * keep + weight * sources[i], in place (two roundings, as the
    multiply and the add are two ops either way)."""
    if FOREACH_MUL_ is not None and FOREACH_ADD_ is not None:
        FOREACH_MUL_(targets, keep)
        FOREACH_ADD_(targets, sources, alpha=weight)
        return
    for target, source in zip(targets, sources):
        target.mul_(keep).add_(source, alpha=weight)


def mul_(tensors: list[torch.Tensor], factor: torch.Tensor | float) -> None:
    """tensors[i] *= factor, in place (`factor` a number or a 0-d tensor on the tensors' device)."""
    if FOREACH_MUL_ is not None:
        FOREACH_MUL_(tensors, factor)
        return
    for t in tensors:
        t.mul_(factor)


def add_(tensors: list[torch.Tensor], value: float) -> None:
    """tensors[i] += value, in place."""
    if FOREACH_ADD_ is not None:
        FOREACH_ADD_(tensors, value)
        return
    for t in tensors:
        t.add_(value)
