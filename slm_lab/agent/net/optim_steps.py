"""Shorter paths to torch optimizers' steps, the same numbers: `step_optimizer(opt)` is opt.step(),
or, for a plain fused Adam, its kernel called directly with the step counts on one flat buffer, or,
for a plain RMSprop, torch's single-tensor step over flat views of the parameters, square averages
and gradients. Each path is tested bit for bit against opt.step() (test/agent/test_optimizers.py);
anything unusual (several groups, other devices) takes torch's own step. That is the optimizer
class's step function called without opt.step()'s wrappers (the profiler's record, the step
hooks, the grad-mode switch that imports torch's compiler: compiler_import), where there are no
step hooks; opt.step() otherwise."""
from __future__ import annotations

import inspect
import weakref

import torch
from torch.autograd.graph import increment_version
from torch.optim import optimizer as torch_optimizer

from slm_lab.agent.net import compiler_import, kernels


def step_optimizer(opt: torch.optim.Optimizer) -> None:
    """opt.step(), or the same numbers by a shorter path: fused Adam's kernel called directly
    (_step_fused_adam) or RMSprop's step over one flat buffer (_step_flat_rmsprop)."""
    if kernels.FUSED_ADAM_ is not None and _plain_fused_adam(opt):
        if _step_fused_adam(opt):
            return
    elif _plain_rmsprop(opt) and _step_flat_rmsprop(opt):
        return
    if not _step_unwrapped(opt):
        opt.step()


_BODIES: dict[type, object] = {}  # optimizer class -> torch's step function of it, or None


def _torch_step_body(cls: type):
    """The step function torch defines for the optimizer class (the innermost of its wrappers:
    Optimizer.profile_hook_step, then _use_grad_for_differentiable or torch.no_grad), or None when
    the class's step is not torch's (SLM-Lab's Lookahead) or not wrapped as this module expects."""
    if cls not in _BODIES:
        step = cls.step
        body = inspect.unwrap(step)
        torchs = body is not step and getattr(body, '__module__', '').startswith('torch.optim.')
        _BODIES[cls] = body if torchs else None
    return _BODIES[cls]


def _step_unwrapped(opt: torch.optim.Optimizer) -> bool:
    """opt.step() without its wrappers, for an optimizer without step hooks that is not
    differentiable: the class's own step function, called as opt.step() calls it, with gradients
    off (what the grad-mode wrapper sets for an optimizer that is not differentiable), but not
    through that wrapper, which imports torch's compiler only to tell it where a graph breaks
    (compiler_import), nor through the profiler's record_function (a profile of a run has no
    "Optimizer.step#..." span). `_opt_called` is what an LR scheduler's wrapper of opt.step records
    (torch's name), so that the scheduler does not warn that it stepped first. False (nothing done)
    where the compiler is loaded (opt.step() then costs nothing more), where there are step hooks
    (meta.distributed's) or the optimizer is differentiable, or the class's step is not torch's."""
    if compiler_import.compiler_loaded() or opt.defaults.get('differentiable') or not _no_step_hooks(opt):
        return False
    body = _torch_step_body(type(opt))
    if body is None:
        return False
    with torch.no_grad():
        body(opt)
    opt._opt_called = True
    return True


def _no_step_hooks(opt: torch.optim.Optimizer) -> bool:
    return not (opt._optimizer_step_pre_hooks or opt._optimizer_step_post_hooks
                or torch_optimizer._global_optimizer_pre_hooks or torch_optimizer._global_optimizer_post_hooks)


def _step_fused_adam(opt: torch.optim.Optimizer) -> bool:
    """For a plain fused torch Adam (one param group, every parameter's state made by
    an earlier step, CPU float32, no amsgrad, maximize, capturable or step hooks), the step's
    own kernels are called directly: the step counts += 1, then torch._fused_adam_ on the same
    lists Adam.step would build. The same numbers, without the per-call wrappers (profiler
    record, hooks, LR-scheduler counter, grad-mode switch, per-group list building), which took
    longer than the fused kernel on the small nets of the zoo specs. The kernel is a private torch
    name (kernels.FUSED_ADAM_): without it in torch every step is opt.step(), the same numbers.
    False (nothing done) where the step is torch's to take."""
    group = opt.param_groups[0]
    params = [p for p in group['params'] if p.grad is not None]
    states = [opt.state.get(p) for p in params]
    if not params or any(not s or 'exp_avg' not in s for s in states) \
            or any(p.device.type != 'cpu' or p.dtype != torch.float32 or p.grad.is_sparse for p in params):
        return False  # the first step creates the state; anything unusual takes torch's own path
    if len(params) == len(group['params']):  # every parameter steps: its count is one add on a flat buffer
        _flat_steps(opt, states).add_(1)
        steps = [s['step'] for s in states]
    else:
        steps = [s['step'] for s in states]
        kernels.add_(steps, 1)
    beta1, beta2 = group['betas']
    kernels.FUSED_ADAM_(params, [p.grad for p in params], [s['exp_avg'] for s in states],
                       [s['exp_avg_sq'] for s in states], [], steps, amsgrad=False, lr=group['lr'],
                       beta1=float(beta1), beta2=float(beta2), weight_decay=group['weight_decay'], eps=group['eps'],
                       maximize=False, grad_scale=None, found_inf=None)
    return True


_STEP_BUFFERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer -> (flat counts, views)


def _flat_steps(opt: torch.optim.Optimizer, states: list[dict]) -> torch.Tensor:
    """One 1-D tensor holding the parameters' step counts, each state's 'step' a 0-d view of its
    element: adding 1 to it counts a step for every parameter in one op, where torch's foreach add
    over the scalar counts took ~20 us a step (longer than the fused kernel on a small net). The same
    numbers (each count + 1, exact in float32 up to 2^24 steps). Made again, from the counts as they
    are, whenever a state's 'step' is not its view (the first step, a loaded state_dict, which
    copies each count)."""
    steps = [s['step'] for s in states]
    made = _STEP_BUFFERS.get(opt)  # (the buffer, the views this function put in the states)
    if made is not None and len(made[1]) == len(steps) and all(a is b for a, b in zip(made[1], steps)):
        return made[0]
    flat = torch.stack([st.detach().reshape(()) for st in steps])
    views = [flat[i] for i in range(len(steps))]
    for state, view in zip(states, views):
        state['step'] = view
    _STEP_BUFFERS[opt] = (flat, views)
    return flat


def _plain_fused_adam(opt: torch.optim.Optimizer) -> bool:
    """Whether step_optimizer may call the fused Adam kernel itself (see there)."""
    if type(opt) is not torch.optim.Adam or len(opt.param_groups) != 1:
        return False
    group = opt.param_groups[0]
    if not group.get('fused') or group['amsgrad'] or group['maximize'] or group['capturable'] \
            or group['differentiable'] or group.get('decoupled_weight_decay'):
        return False
    if isinstance(group['lr'], torch.Tensor) or getattr(opt, 'grad_scale', None) is not None:
        return False
    return _no_step_hooks(opt)


def _plain_rmsprop(opt: torch.optim.Optimizer) -> bool:
    """Whether step_optimizer may take RMSprop's step itself (see _step_flat_rmsprop): torch's
    RMSprop class itself (GlobalRMSprop's state is shared between processes), one param group,
    no momentum, not centered, and nothing that changes the step (maximize, capturable,
    differentiable, a tensor learning rate, step hooks)."""
    if type(opt) is not torch.optim.RMSprop or len(opt.param_groups) != 1:
        return False
    group = opt.param_groups[0]
    if group['momentum'] != 0 or group['centered'] or group['maximize'] or group['capturable'] \
            or group['differentiable'] or isinstance(group['lr'], torch.Tensor):
        return False
    return _no_step_hooks(opt)


def _step_flat_rmsprop(opt: torch.optim.Optimizer) -> bool:
    """RMSprop's step (torch's single-tensor path, op for op) on one flat buffer of all the
    parameters, one of their square averages and one of their gradients: five tensor ops for
    the whole net instead of five per parameter. Every op is elementwise, so each number is what
    torch computes for it (test/agent/test_optimizers.py checks it bit for bit, and a run's
    records against torch's step). The parameters and their square averages become views of the
    flat buffers at the first step taken here (_flat_buffers); a loaded optimizer state is copied
    back into them. False (nothing done) where the step is torch's to take: the first step
    (torch creates the state), a parameter without a gradient, anything but dense CPU float32
    tensors, parameters in shared memory (meta.distributed's global nets)."""
    group = opt.param_groups[0]
    params = group['params']
    if not params or any(p.grad is None for p in params):
        return False
    states = [opt.state.get(p) for p in params]
    if any(not s or 'square_avg' not in s for s in states) \
            or any(p.device.type != 'cpu' or p.dtype != torch.float32 or p.grad.is_sparse
                   or p.grad.dtype != torch.float32 for p in params):
        return False
    flat = _flat_buffers(opt, params, states)
    if flat is None:
        return False
    pieces = flat.pieces
    for i, p in enumerate(params):
        pieces[2 * i] = p.grad.reshape(-1)
    torch.cat(pieces, out=flat.grad)  # the gradients, with the zero padding between them
    for i in range(len(params)):
        pieces[2 * i] = None  # not kept alive until the next step
    _flat_steps(opt, states).add_(1)  # every parameter has a gradient (checked above): one add counts them all
    alpha, weight_decay = group['alpha'], group['weight_decay']
    grad = flat.grad if weight_decay == 0 else flat.grad.add(flat.param, alpha=weight_decay)
    flat.square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
    avg = flat.square_avg.sqrt().add_(group['eps'])
    flat.param.addcdiv_(grad, avg, value=-group['lr'])
    # the parameters changed through their flat buffer: autograd's in-place checks must see it
    increment_version(params)
    return True


FLAT_ALIGN = 16  # floats: each parameter starts 64 bytes into its buffer, as torch's allocator aligns a tensor


class _FlatBuffers:
    """A net's parameters, square averages and gradients as three flat buffers whose slices the
    parameters and square averages are, in order, each starting at a multiple of FLAT_ALIGN
    floats (the gaps hold zeros and stay zero: a zero gradient moves nothing). The alignment
    matters: the matrix products a parameter takes part in (MKL's, oneDNN's) may sum in another
    order for a tensor that starts elsewhere in a cache line, and then give other numbers."""

    def __init__(self, params: list, states: list):
        offsets, n = [], 0
        for p in params:
            offsets.append(n)
            n += -(-p.numel() // FLAT_ALIGN) * FLAT_ALIGN
        self.param, self.square_avg, self.grad = (torch.zeros(n, dtype=torch.float32) for _ in range(3))
        self.offsets = offsets
        # torch.cat's inputs: each gradient (filled in at each step) and the zeros after it
        self.pieces: list = []
        with torch.no_grad():
            for p, state, at in zip(params, states, offsets):
                size = p.numel()
                p_view = self.param[at:at + size].view_as(p)
                sq_view = self.square_avg[at:at + size].view_as(p)
                p_view.copy_(p)
                sq_view.copy_(state['square_avg'])
                p.data = p_view
                state['square_avg'] = sq_view
                gap = -(-size // FLAT_ALIGN) * FLAT_ALIGN - size
                self.pieces += [None, torch.zeros(gap, dtype=torch.float32)]

    def holds(self, params: list, states: list) -> bool:
        """Whether the parameters and square averages are still its slices, where it put them."""
        p_at, sq_at = self.param.data_ptr(), self.square_avg.data_ptr()
        for p, state, at in zip(params, states, self.offsets):
            if p.data_ptr() != p_at + 4 * at or state['square_avg'].data_ptr() != sq_at + 4 * at:
                return False
        return len(params) == len(self.offsets)


def _flat_buffers(opt: torch.optim.Optimizer, params: list, states: list) -> _FlatBuffers | None:
    """The optimizer's _FlatBuffers, made on the first call and made again when something
    replaced a tensor (a loaded optimizer state holds new square averages): the values are copied
    in, so nothing changes but where they live. None for parameters that must keep their storage
    (in shared memory) or are not contiguous."""
    flat = getattr(opt, '_slm_lab_flat', None)
    if flat is not None and flat.holds(params, states):
        return flat
    if any(p.is_shared() or not p.is_contiguous() for p in params):
        return None
    opt._slm_lab_flat = _FlatBuffers(params, states)
    return opt._slm_lab_flat
