"""Mixed precision of a net: `net.precision: "bf16"` runs its forward (and so its backward) under
torch's autocast in bfloat16, on the CPU and on CUDA.

Under autocast the matrix products and convolutions take bfloat16 inputs and accumulate in
float32 (on CPUs with AVX512-BF16 or AMX, and on recent GPUs, in the hardware's bf16 units); the
parameters, their gradients, the optimizer's state and every loss stay float32, and the net's
outputs are cast back to float32, so the algorithm around the net (distributions, targets, losses)
is unchanged. bfloat16 keeps float32's range with 8 bits of mantissa: values are rounded to about
3 significant digits inside the net, so a run differs from its float32 twin from the first step,
and learns as well or not (docs/BENCHMARKS.md measures it); resumes are exact (autocast is
deterministic). The precision is a spec key, read when the nets are built: a run and its resume
compute in one precision from the first step to the last. Acting over fewer rows than
net.bf16_min_rows (in a few envs) runs in float32, where bf16's fixed cost per product outweighs
its gain; every training forward is in bf16.
"""
from __future__ import annotations

import functools
import threading
from pathlib import Path

import torch
import torch.nn as nn

from slm_lab.lib import logger as lab_logger

PRECISIONS = ('fp32', 'bf16')


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 products in hardware (AVX512-BF16 or AMX-BF16, read from
    /proc/cpuinfo on Linux); elsewhere torch emulates them, slower than float32."""
    try:
        flags = Path('/proc/cpuinfo').read_text()
    except OSError:
        return False
    return 'avx512_bf16' in flags or 'amx_bf16' in flags


def _to_fp32(out):
    """A net's output with every bfloat16 tensor in it (also in tuples and lists) as float32."""
    if isinstance(out, torch.Tensor):
        return out.float() if out.dtype == torch.bfloat16 else out
    if isinstance(out, (tuple, list)):
        return type(out)(_to_fp32(o) for o in out)
    return out


# the methods that run a net: forward, and the lab's forward on a batch `prepare` made (PPO's
# minibatches call it directly; net_util.HeadedNet)
_RUNS = ('forward', 'forward_prepared')


# acting (choosing actions) over fewer rows than this runs in float32 (net.bf16_min_rows): on this
# project's CPU a bf16 product costs 30-70 us whatever its size, so acting in a few envs is slower
# in bf16 (the Nature CNN at batch 1: 1.37 against 0.82 ms; bf16 pays from 8 rows),
# docs/BENCHMARKS.md. Training forwards stay in bf16 whatever their size: an update's old policy,
# its values and its minibatches are computed in one precision.
BF16_MIN_ROWS = 8
class _Acting(threading.local):
    """Whether this thread's agent is acting (while_acting): per thread, so that an agent acting in
    one thread leaves the forwards another thread's agent trains with in bf16."""
    on = False


_ACTING = _Acting()


def while_acting(fn, *args):
    """fn(*args) with the agent acting: a bf16 net's forwards over fewer than its bf16_min_rows rows
    run in float32 meanwhile (in this thread)."""
    _ACTING.on = True
    try:
        return fn(*args)
    finally:
        _ACTING.on = False


def _in_bf16(method):
    def run(self, *args, **kwargs):
        x = args[0] if args else None
        if _ACTING.on and isinstance(x, torch.Tensor) and x.dim() and x.shape[0] < self.bf16_min_rows:
            return method(self, *args, **kwargs)
        device = next(self.parameters()).device.type
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            out = method(self, *args, **kwargs)
        return _to_fp32(out)
    return run


@functools.lru_cache(maxsize=None)
def _bf16_class(cls: type) -> type:
    """cls with its forward (and forward_prepared) under bf16 autocast, on the device of its
    parameters, and its outputs as float32 (one subclass per net class, as OneDNNLinear swaps a
    layer's class: the same object, parameters and state_dict; a deep copy, a target net, keeps
    it)."""
    methods = {name: _in_bf16(getattr(cls, name)) for name in _RUNS if hasattr(cls, name)}
    return type(f'{cls.__name__}BF16', (cls,), {**methods, '__module__': cls.__module__})


def use_precision(net: nn.Module, precision: str, path: str = 'agent.net.precision',
                  min_rows: int = BF16_MIN_ROWS) -> nn.Module:
    """Make `net` compute its forward in `precision` ('fp32': unchanged; 'bf16': under autocast, see
    the module docstring), acting (while_acting) over fewer than `min_rows` rows (the batch's
    first axis) in float32 (net.bf16_min_rows; 1: every forward in bf16, as runs saved before the
    key). Call
    before the net is copied (target nets keep the class and the setting). Returns it."""
    if precision == 'fp32':
        return net
    net.bf16_min_rows = int(min_rows)
    if not cpu_has_bf16() and not torch.cuda.is_available():
        lab_logger.warn_once('slm_lab.agent', f'{path}: "bf16" on a CPU without bfloat16 instructions (AVX512-BF16 '
                             'or AMX): torch emulates them, which is slower than "fp32"')
    net.__class__ = _bf16_class(type(net))
    return net
