"""kernels.py: each private torch op the lab calls and its fallback give the same numbers, so a
torch release without the op trains the same."""
from __future__ import annotations

import pytest
import torch

from slm_lab.agent.net import kernels


def tensors(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for shape in ((64, 17), (64,), (3, 5, 7), ())]


def both(monkeypatch, name: str, run):
    """run() with the op as torch has it, then with it gone (None)."""
    with_op = run()
    monkeypatch.setattr(kernels, name, None)
    return with_op, run()


@pytest.mark.parametrize('name', ['FOREACH_NORM'])
def test_norms_fall_back_to_vector_norm(monkeypatch, name):
    xs = tensors(0)
    a, b = both(monkeypatch, name, lambda: kernels.norms(xs))
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize('name', ['FOREACH_LERP_'])
def test_lerp_falls_back_to_per_tensor_lerp(monkeypatch, name):
    def run():
        targets = tensors(1)
        kernels.lerp_(targets, tensors(2), 0.005)
        return targets
    a, b = both(monkeypatch, name, run)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize('name', ['FOREACH_MUL_', 'FOREACH_ADD_'])
def test_scale_add_falls_back_to_mul_then_add(monkeypatch, name):
    def run():
        targets = tensors(3)
        kernels.scale_add_(targets, tensors(4), 0.99, 0.01)
        return targets
    a, b = both(monkeypatch, name, run)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_add_falls_back_to_per_tensor_add(monkeypatch):
    def run():
        steps = [torch.tensor(float(i)) for i in range(4)]
        kernels.add_(steps, 1)
        return steps
    a, b = both(monkeypatch, 'FOREACH_ADD_', run)
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and float(a[0]) == 1.0


@pytest.mark.parametrize('norm', [3.0, 0.2, float('inf'), float('nan')])
def test_clipping_scales_as_torchs_clip_grads_with_norm_with_and_without_the_op(monkeypatch, norm):
    """base.clip_grads_with_norm_ gives the gradients torch's function gives, bit for bit: a norm
    above the bound (scaled down), below it (times 1.0), inf and NaN (torch's NaN/zero results)."""
    from slm_lab.agent.algorithm.base import clip_grads_with_norm_

    def params() -> list[torch.Tensor]:
        ps = [torch.nn.Parameter(t.clone()) for t in tensors(7)]
        for p, g in zip(ps[:3], tensors(8)):
            p.grad = g
        return ps  # the last one without a gradient

    expected = params()
    torch.nn.utils.clip_grads_with_norm_(expected, 0.5, torch.tensor(norm))

    def run():
        ps = params()
        clip_grads_with_norm_(ps, 0.5, torch.tensor(norm))
        return [p.grad for p in ps[:3]]
    for grads in both(monkeypatch, 'FOREACH_MUL_', run):
        assert all(torch.equal(x.grad, y) or (x.grad.isnan().all() and y.isnan().all())
                   for x, y in zip(expected, grads))


def test_grad_norms_and_polyak_train_the_same_without_the_ops(monkeypatch):
    # the lab's two callers: an algorithm's gradient norms and a polyak target update
    from slm_lab.agent.algorithm.base import _group_grad_norms
    groups = [tensors(5)[:2], tensors(6)[2:]]
    with_ops = _group_grad_norms(groups)
    for name in ('FOREACH_NORM', 'FOREACH_LERP_', 'FOREACH_MUL_', 'FOREACH_ADD_', 'FUSED_ADAM_'):
        monkeypatch.setattr(kernels, name, None)
    assert all(torch.equal(x, y) for x, y in zip(with_ops, _group_grad_norms(groups)))
