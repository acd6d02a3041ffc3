"""Linear layers whose matrix products run on oneDNN instead of torch's default CPU BLAS.

torch's CPU build computes an fp32 `nn.Linear` with MKL's sgemm, which on AMD processors takes
its AVX2 path; oneDNN (bundled with torch, used by its inductor) takes AVX-512 where the CPU has
it. On this project's AMD EPYC (Zen 5) the products of the off-policy nets (batch 64-256, widths
256-400) ran 2-3x faster on oneDNN, one thread each (docs/BENCHMARKS.md, "Off-policy speed").

The maths is the same, y = x W^T + b, but the products sum in another order, so the results
differ from MKL's in the last bits (about 1e-7 relative): a seeded run gives other numbers. That
is why the kernel is a spec key, `net.linear_kernel`, read when the nets are built: a run (and its
resume, which builds from the saved spec) uses one kernel from its first step to its last. Its
default, "auto", is settled when the spec is validated (resolve_linear_kernel): "onednn" on an AMD
CPU with AVX-512 for a net whose hidden layers are all AUTO_MIN_WIDTH wide or more (an MLP's
hid_layers, a TorchArcNet arc's Linear layers), else "default"; the saved spec holds what was
chosen, so a run resumed on another machine keeps it. The
parameters are nn.Linear's own (`weight`, `bias`), so state_dicts and snapshots are unchanged.

Only 2-D float32 inputs on the CPU, outside autocast, take the oneDNN path; anything else (a GPU,
another dtype, a net in `precision: "bf16"`) falls back to F.linear, as the default kernel does.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from slm_lab.lib import logger as lab_logger

LINEAR_KERNELS = ('auto', 'default', 'onednn')
# "auto" takes oneDNN for nets whose hidden layers are all this wide or more: the off-policy rows'
# 256-400 wide nets gained 1.4-1.6x whole-run on an AMD EPYC (docs/BENCHMARKS.md), while 64-wide
# nets (PPO Hopper) ran slower on it
AUTO_MIN_WIDTH = 128
# layers narrower than this on either side (an input layer of a few observations, a Q head) stay on
# the default kernel: their products are too small for oneDNN to win back its call (measured: a
# 4 -> 256 layer at batch 64 took 13 us on oneDNN, 4 us on MKL)
MIN_WIDTH = 32
# products over fewer rows than this (acting in one or a few envs) stay on the default kernel by
# default (net.onednn_min_rows): a oneDNN call costs more than MKL's there (DQN CartPole, acting at
# batch 1 through 256-wide layers, ran 1.10x slower whole-run with every product on oneDNN)
ONEDNN_MIN_ROWS = 16
# ... and products of fewer multiply-adds than this (rows x in x out) by default (net.onednn_min_macs):
# a small net's forward and backward at a small batch ran slower on oneDNN (an MLP 32-256-128-4 at
# 32 rows 1.54x, at 64 rows 1.21x slower; 4-256-256-2 at 32 rows 1.19x slower), from about 4M per
# product on faster (256-wide layers at 64 rows 0.87x, 256 x 128 at 128 rows 0.95x; docs/BENCHMARKS.md)
ONEDNN_MIN_MACS = 4_000_000


def _onednn_linear_op():
    """torch's oneDNN linear (x (B, I), W (O, I), b (O,) or None -> x W^T + b), or None when this
    torch build lacks it (no oneDNN, or a version that renamed the op)."""
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):
        return None


_LINEAR = _onednn_linear_op()


@functools.lru_cache(maxsize=1)
def onednn_pays() -> bool:
    """Whether "auto" takes oneDNN on this machine: an AMD CPU (Linux's /proc/cpuinfo vendor_id)
    with AVX-512, where MKL's sgemm takes its AVX2 path and oneDNN its AVX-512 one, and a torch
    with the op. Intel CPUs, where MKL takes AVX-512 itself, and other systems keep the default."""
    if _LINEAR is None:
        return False
    try:
        info = Path('/proc/cpuinfo').read_text(encoding='utf-8', errors='replace')
    except OSError:
        return False
    return 'AuthenticAMD' in info and re.search(r'\bavx512f\b', info) is not None


def resolve_linear_kernel(net_spec: dict) -> str:
    """The kernel a net spec's linear_kernel stands for: "auto" resolved (see onednn_pays and
    AUTO_MIN_WIDTH: a net whose hid_layers are all ints of at least that width, or a TorchArcNet
    whose arc's Linear / LazyLinear layers all have out_features of at least that width, on a
    machine where oneDNN pays; validate_spec passes an arc_file's arc as `arc`), anything else as
    it is."""
    kernel = net_spec.get('linear_kernel', 'default')
    if kernel != 'auto':
        return kernel
    widths = net_spec.get('hid_layers')
    if widths is None and isinstance(net_spec.get('arc'), dict):
        widths = arc_linear_widths(net_spec['arc'])
    wide = isinstance(widths, list) and bool(widths) and all(
        isinstance(w, int) and not isinstance(w, bool) and w >= AUTO_MIN_WIDTH for w in widths)
    return 'onednn' if wide and onednn_pays() else 'default'


def arc_linear_widths(arc) -> list | None:
    """The out_features of every Linear and LazyLinear module an arc (TorchArcNet's, as a dict)
    names, read as TorchArcNet builds it (arc.modules: name -> {ClassName: arguments}, a
    Sequential's arguments a list of such modules); None where one is named otherwise (positional
    arguments) or the arc is not of that form (TorchArcNet's validation says how)."""
    widths: list = []

    def module(spec) -> bool:
        if not (isinstance(spec, dict) and len(spec) == 1):
            return False
        (name, args), = spec.items()
        if name == 'Sequential':
            return isinstance(args, list) and all(module(item) for item in args)
        if name in ('Linear', 'LazyLinear'):
            if not (isinstance(args, dict) and 'out_features' in args):
                return False
            widths.append(args['out_features'])
        return True

    modules = arc.get('modules') if isinstance(arc, dict) else None
    if not isinstance(modules, dict) or not all(module(spec) for spec in modules.values()):
        return None
    return widths


def _mm_nt(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (M, K) @ b (N, K)^T on oneDNN; either may be a transposed view (oneDNN reads the strides)."""
    return _LINEAR(a, b, None, 'none', [], '')


class _OneDNNLinearFn(torch.autograd.Function):
    """y = x W^T + b with the three products of its forward and backward on oneDNN:
    y = x W^T, dL/dx = dL/dy W, dL/dW = (dL/dy)^T x, dL/db = sum over the batch of dL/dy."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _LINEAR(x, weight, bias, 'none', [], '')

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        grad_y = grad_y.contiguous()
        grad_x = _mm_nt(grad_y, weight.t()) if ctx.needs_input_grad[0] else None
        grad_w = _mm_nt(grad_y.t(), x.t()) if ctx.needs_input_grad[1] else None
        grad_b = grad_y.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b


class OneDNNLinear(nn.Linear):
    """nn.Linear computed on oneDNN (see the module docstring); the same parameters and state_dict.
    An input of fewer than `min_rows` rows, or whose product has fewer than `min_macs`
    multiply-adds (rows x in x out), takes torch's default kernel (a rule of the input's shape
    alone, so a resumed run computes each product as the straight run did)."""

    min_rows = 1  # set by use_linear_kernel (net.onednn_min_rows)
    min_macs = 0  # and net.onednn_min_macs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.device.type != 'cpu' or x.dtype != torch.float32 or self.weight.dtype != torch.float32 \
                or x.shape[0] < self.min_rows or x.shape[0] * self.in_features * self.out_features < self.min_macs \
                or torch.is_autocast_enabled('cpu'):  # net.precision bf16: autocast's bf16 product
            return F.linear(x, self.weight, self.bias)
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            return _OneDNNLinearFn.apply(x.contiguous(), self.weight, self.bias)
        # no graph to record (acting, target nets): the op alone, without the Python Function's cost
        return _LINEAR(x.contiguous(), self.weight, self.bias, 'none', [], '')


def use_linear_kernel(net: nn.Module, kernel: str, path: str = 'agent.net.linear_kernel',
                      min_rows: int = 1, min_macs: int = 0) -> nn.Module:
    """Make the nn.Linear layers of `net` compute on `kernel` ('default': unchanged; 'onednn':
    each layer at least MIN_WIDTH wide on both sides becomes an OneDNNLinear, the same object,
    computing inputs of `min_rows` rows or more on oneDNN). Call before an optimizer or a target
    copy sees the net. Returns the net.

    The oneDNN op is a private torch name: a torch build without it trains on the default kernel,
    with one warning (the same maths, its results differing in the last bits, so a run started on
    oneDNN and resumed there does not repeat the straight run's numbers exactly)."""
    if kernel in ('default', 'auto'):  # a validated spec holds "auto" resolved (resolve_linear_kernel)
        return net
    if _LINEAR is None:
        lab_logger.warn_once('slm_lab.agent', f"{path}: 'onednn' needs torch's oneDNN linear "
                             f'(torch.ops.mkldnn._linear_pointwise), which this torch {torch.__version__} build '
                             'lacks: the layers compute on the default kernel (the same maths, rounded differently)')
        return net
    for module in net.modules():
        if type(module) is nn.Linear and min(module.in_features, module.out_features) >= MIN_WIDTH:
            module.__class__ = OneDNNLinear  # the same object and Parameters: only forward changes
            module.min_rows, module.min_macs = min_rows, min_macs
    return net
