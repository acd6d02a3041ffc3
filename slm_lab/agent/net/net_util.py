"""Builders for the torch pieces a net spec names: activations, init, optimizer, loss, LR scheduler;
HeadedNet, the base of the lab's nets; and forwards_per_sample, whether a net's forward over part
of a batch gives the rows a forward over the whole would."""
from __future__ import annotations

import math
import weakref

import torch
import torch.nn as nn

from slm_lab.agent.net import compiler_import, optimizers
from slm_lab.agent.net.batch_renorm import BatchRenorm1d
from slm_lab.lib.decay import linear_to_zero_end, linear_to_zero_factor
from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import MAX_FRAME, Field, check_torch_kwargs, suggest

ACTIVATIONS = {
    'relu': nn.ReLU, 'tanh': nn.Tanh, 'sigmoid': nn.Sigmoid, 'selu': nn.SELU, 'elu': nn.ELU,
    'leakyrelu': nn.LeakyReLU, 'gelu': nn.GELU, 'silu': nn.SiLU, 'softplus': nn.Softplus,
    'identity': nn.Identity, 'linear': nn.Identity,
}
INIT_FNS = ('orthogonal_', 'xavier_uniform_', 'xavier_normal_', 'kaiming_uniform_', 'kaiming_normal_',
            'normal_', 'uniform_')
# our names for schedules torch does not have under that name (SLM-Lab's)
CUSTOM_LR_SCHEDULERS = ('LinearToZero',)


def _torch_class(module, name: str, path: str, kind: str, base: type):
    cls = getattr(module, name, None) if isinstance(name, str) else None
    if not (isinstance(cls, type) and issubclass(cls, base)):
        valid = sorted(n for n in dir(module) if isinstance(getattr(module, n), type)
                       and issubclass(getattr(module, n), base) and not n.startswith('_') and n != base.__name__)
        raise SpecError(f"{path}.name: '{name}' is not a {kind}{suggest(name, valid)}; valid: {', '.join(valid)}")
    return cls


# SLM-Lab optimizers not available here yet (none now: optimizers.py has GlobalAdam, GlobalRMSprop,
# Lookahead); the spec reference lists what this holds
PLANNED_OPTIMIZERS: dict[str, str] = {}


def _check_optim_spec(spec: dict, path: str) -> None:
    if 'name' not in spec:
        raise SpecError(f'{path}.name: required key is missing, e.g. "Adam"')
    name = spec['name']
    kwargs = {k: v for k, v in spec.items() if k != 'name'}
    if name == 'Lookahead':  # its own keys, then the inner optimizer's
        inner = kwargs.pop('optimizer', 'RAdam')
        valid = sorted(n for n in _optimizer_names() if n != 'Lookahead')
        if inner not in valid:
            raise SpecError(f"{path}.optimizer: {inner!r} is not an optimizer Lookahead can wrap"
                            f"{suggest(inner, valid)}; valid: {', '.join(valid)}")
        for key, check in (('alpha', lambda v: 0 <= v <= 1), ('k', lambda v: isinstance(v, int) and v >= 1)):
            value = kwargs.pop(key, None)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not check(value)):
                want = 'a number in [0, 1]' if key == 'alpha' else 'an integer >= 1'
                raise SpecError(f'{path}.{key}: expected {want}, got {value!r}')
        _check_optim_spec({'name': inner, **kwargs}, path)
        return
    if isinstance(name, str) and name in optimizers.OPTIMIZERS:
        cls = optimizers.OPTIMIZERS[name]
    else:
        try:
            cls = _torch_class(torch.optim, name, path, 'torch.optim optimizer', torch.optim.Optimizer)
        except SpecError:
            valid = sorted(set(_optimizer_names()))
            raise SpecError(f"{path}.name: '{name}' is not an optimizer{suggest(name, valid)}; "
                            f'valid: {", ".join(valid)}') from None
    check_torch_kwargs(cls, kwargs, path, skip=('params',))


def _optimizer_names() -> list[str]:
    """Every optimizer a spec can name: torch.optim's classes and SLM-Lab's own."""
    torch_names = [n for n in dir(torch.optim) if isinstance(getattr(torch.optim, n), type)
                   and issubclass(getattr(torch.optim, n), torch.optim.Optimizer) and not n.startswith('_')
                   and n != 'Optimizer']
    return torch_names + list(optimizers.OPTIMIZERS)


def _check_loss_spec(spec: dict, path: str) -> None:
    if 'name' not in spec:
        raise SpecError(f'{path}.name: required key is missing, e.g. "MSELoss"')
    valid = [n for n in dir(nn) if n.endswith('Loss') and not n.startswith('_')]
    if spec['name'] not in valid:
        raise SpecError(f"{path}.name: '{spec['name']}' is not a torch.nn loss{suggest(spec['name'], valid)}; "
                        f'valid: {", ".join(valid)}')
    check_torch_kwargs(getattr(nn, spec['name']), {k: v for k, v in spec.items() if k != 'name'}, path)


def _check_lr_scheduler_spec(spec: dict, path: str) -> None:
    if 'name' not in spec:
        raise SpecError(f'{path}.name: required key is missing, e.g. "LinearToZero" or "StepLR"')
    if spec['name'] in CUSTOM_LR_SCHEDULERS:
        extra = [k for k in spec if k not in ('name', 'frame')]
        if extra:
            raise SpecError(f'{path}.{extra[0]}: LinearToZero takes one argument, frame (the frame at which the '
                            'learning rate reaches 0; default env.max_frame)')
        frame = spec.get('frame')
        if frame is not None and (isinstance(frame, bool) or not isinstance(frame, (int, float))
                                  or not 1 <= frame <= MAX_FRAME):
            raise SpecError(f'{path}.frame: expected a frame count from 1 to {MAX_FRAME:g} or null, got {frame!r}')
        return
    sched = torch.optim.lr_scheduler
    cls = _torch_class(sched, spec['name'], path, 'torch.optim.lr_scheduler class', sched.LRScheduler)
    if cls in (sched.LambdaLR, sched.MultiplicativeLR, sched.SequentialLR, sched.ChainedScheduler,
               sched.ReduceLROnPlateau):
        raise SpecError(f"{path}.name: '{spec['name']}' needs Python objects and cannot be given in a spec; "
                        'use e.g. LinearToZero, StepLR, ExponentialLR, LinearLR, CosineAnnealingLR')
    if not _has_frame_form(cls):  # CyclicLR, OneCycleLR: they would train on a schedule the spec did not ask for
        raise SpecError(f"{path}.name: '{spec['name']}' counts its own steps and has no rate as a function of the "
                        'frame, which the lab\'s LR schedulers follow (as SLM-Lab\'s do); use e.g. StepLR, '
                        'MultiStepLR, ExponentialLR, CosineAnnealingLR, CosineAnnealingWarmRestarts, LinearLR, '
                        'LinearToZero, with their counts in frames')
    check_torch_kwargs(cls, {k: v for k, v in spec.items() if k != 'name'}, path, skip=('optimizer',))


def optim_field(default, doc: str) -> Field:
    return Field((dict,), default, nullable=default is None, check=_check_optim_spec, doc=doc)


def loss_field(default, doc: str) -> Field:
    return Field((dict,), default, check=_check_loss_spec, doc=doc)


def lr_scheduler_field(doc: str) -> Field:
    return Field((dict,), None, nullable=True, check=_check_lr_scheduler_spec, doc=doc)


def make_activation(name: str | None) -> nn.Module:
    """An activation module by its spec name (None: identity)."""
    return ACTIVATIONS[name or 'identity']()


# torch.nn.init.calculate_gain's name for each activation it has a recommended gain for
_GAIN_NAMES = {'relu': 'relu', 'tanh': 'tanh', 'sigmoid': 'sigmoid', 'selu': 'selu', 'leakyrelu': 'leaky_relu',
               'identity': 'linear', 'linear': 'linear'}


def activation_gain(activation: str | None) -> float:
    """The init gain SLM-Lab's init_layers uses for a net: torch.nn.init.calculate_gain of
    hid_layers_activation (relu sqrt(2), tanh 5/3, selu 3/4, sigmoid / linear 1). Activations
    torch has no gain for (elu, gelu, silu, softplus) take 1."""
    name = _GAIN_NAMES.get(activation or 'identity')
    return nn.init.calculate_gain(name) if name else 1.0


def init_layer(layer: nn.Linear, init_fn: str | None, gain: float = math.sqrt(2),
               activation: str | None = 'relu') -> None:
    """Initialise a Linear layer's weight with torch.nn.init.<init_fn> and its bias with zeros,
    as SLM-Lab's init_params: orthogonal_ / xavier_* with `gain`, kaiming_* with the
    nonlinearity of `activation` (leaky_relu unless it is relu), others with their defaults."""
    if init_fn is None:
        return
    fn = getattr(nn.init, init_fn)
    if init_fn in ('orthogonal_', 'xavier_uniform_', 'xavier_normal_'):
        fn(layer.weight, gain=gain)
    elif init_fn.startswith('kaiming'):
        fn(layer.weight, nonlinearity='relu' if activation == 'relu' else 'leaky_relu')
    else:
        fn(layer.weight)
    nn.init.zeros_(layer.bias)


def dense_layers(in_dim: int, widths: list[int], init_fn: str | None, activation: str) -> tuple[nn.Sequential, int]:
    """Linear layers of `widths` from in_dim, each initialised by init_layer with the gain of
    `activation` and followed by it (SLM-Lab's fc_hid_layers); and the width they end with."""
    layers, dim = [], in_dim
    for width in widths:
        linear = nn.Linear(dim, width)
        init_layer(linear, init_fn, activation_gain(activation), activation)
        layers += [linear, make_activation(activation)]
        dim = width
    return nn.Sequential(*layers), dim


def _construct(cls, path: str, *args, **kwargs):
    """cls(*args, **kwargs); a bad argument value from the spec becomes a SpecError at `path`."""
    try:
        return cls(*args, **kwargs)
    except (ValueError, TypeError, IndexError) as e:
        raise SpecError(f'{path}: {cls.__name__} rejects these arguments: {e}') from None


def make_optimizer(params, optim_spec: dict, path: str = 'agent.net.optim_spec') -> torch.optim.Optimizer:
    """The optimizer optim_spec names (a torch.optim class, or SLM-Lab's GlobalAdam, GlobalRMSprop,
    Lookahead: see optimizers.py) over params, with the spec's other keys as its arguments."""
    kwargs = {k: v for k, v in optim_spec.items() if k != 'name'}
    compiler_import.defer()  # its constructor would import torch's compiler (see there)
    return _construct(optimizers.optimizer_class(optim_spec['name']), path, params, **kwargs)


def make_loss(loss_spec: dict) -> nn.Module:
    """torch.nn.<name>(**kwargs) from a loss_spec."""
    return _construct(getattr(nn, loss_spec['name']), 'agent.net.loss_spec',
                      **{k: v for k, v in loss_spec.items() if k != 'name'})


def make_lr_scheduler(optimizer, lr_scheduler_spec: dict | None, clock):
    """A torch LR scheduler from the spec, or None; step it with step_lr_scheduler after each
    training update. LinearToZero scales the LR by (1 - frame / end), end being its `frame` or else
    env.max_frame, with the frame read from the clock, so it needs no state of its own beyond what
    the Clock restores. A torch scheduler's counts (StepLR's step_size, MultiStepLR's milestones,
    T_max, total_iters, ...) are frames, as in SLM-Lab."""
    if lr_scheduler_spec is None:
        return None
    name = lr_scheduler_spec['name']
    if name == 'LinearToZero':
        end = linear_to_zero_end(lr_scheduler_spec, clock.max_frame)
        sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: linear_to_zero_factor(clock.frame, end))
        sched.linear_to_zero_end = end  # saved with the algorithm: a resume may move it (a longer run)
        return sched
    kwargs = {k: v for k, v in lr_scheduler_spec.items() if k != 'name'}
    return _construct(getattr(torch.optim.lr_scheduler, name), 'agent.net.lr_scheduler_spec', optimizer, **kwargs)


def _has_frame_form(cls: type) -> bool:
    """Whether step_lr_scheduler can set this torch scheduler's rate at any frame."""
    return hasattr(cls, '_get_closed_form_lr') or issubclass(cls, torch.optim.lr_scheduler.CosineAnnealingWarmRestarts)


def step_lr_scheduler(sched, frame: int) -> None:
    """Set the learning rates of `sched`'s optimizer to the schedule's value at `frame`.

    SLM-Lab v4 stepped every torch scheduler with the frame as its epoch
    (`lr_scheduler.step(epoch=frame)`, torch 1.3, which set last_epoch and took the closed form),
    so a v4 spec's `"StepLR", "step_size": 1000` decays the rate every 1000 frames, whatever the
    training frequency. The same here: last_epoch becomes the frame and the rate is the
    scheduler's closed form there, so the rate is a function of the frame alone (a resumed run,
    whose scheduler state brings last_epoch back, continues on the same curve).
    CosineAnnealingWarmRestarts has no closed form method but takes the epoch in its own step.
    LinearToZero reads the clock itself and is stepped plainly."""
    lr_scheduler = torch.optim.lr_scheduler
    if hasattr(sched, 'linear_to_zero_end'):
        sched.step()
    elif isinstance(sched, lr_scheduler.CosineAnnealingWarmRestarts):
        sched.step(frame)
    else:
        sched.last_epoch = frame
        for group, lr in zip(sched.optimizer.param_groups, sched._get_closed_form_lr(), strict=True):
            group['lr'] = lr
        sched._last_lr = [group['lr'] for group in sched.optimizer.param_groups]


def get_device(gpu, cuda_id: int | None = None) -> torch.device:
    """cuda (device `cuda_id`, or the current one) when the spec asks for gpu (true or 'auto') and
    one is available, else cpu."""
    if gpu and torch.cuda.is_available():
        if cuda_id is not None and cuda_id >= torch.cuda.device_count():
            raise SpecError(f'agent.net.cuda_id: {cuda_id} is out of range; this machine has '
                            f'{torch.cuda.device_count()} CUDA device(s): use 0 to {torch.cuda.device_count() - 1} '
                            'or null')
        return torch.device('cuda' if cuda_id is None else f'cuda:{cuda_id}')
    return torch.device('cpu')


def grad_norm(params) -> float:
    """Global L2 norm of the gradients of `params`."""
    norms = [p.grad.detach().norm(2) for p in params if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


# modules whose forward in training mode reads the whole batch (its statistics), moves a state of
# theirs (running statistics, a count) or draws random numbers
_BATCH_OR_STATE_MODULES = (nn.modules.batchnorm._BatchNorm, BatchRenorm1d, nn.modules.dropout._DropoutNd, nn.RReLU)


def forwards_per_sample(net: nn.Module) -> bool:
    """Whether a forward of `net`, in the modes its modules are in now, computes each sample's
    output from that sample alone, changes no state of the net and draws no random numbers.
    Then forwarding a state once instead of twice, or within another batch, gives the same
    output up to float rounding (the lab's nets are otherwise row-wise: linear, conv, recurrent
    cells over contexts, layer norm, activations). False while a batch norm or batch renorm
    (batch statistics, running statistics), an instance norm tracking running statistics, a
    dropout or an RReLU is in training mode.

    The modules that could make it False are found once per net (walking a net's modules cost
    ~30 us, a sixth of an A2C CartPole update's own work) and kept while the net lives: a net's
    modules do not change once it trains; their training flags are read at each call."""
    candidates = _PER_SAMPLE_CANDIDATES.get(net)
    if candidates is None:
        candidates = tuple(m for m in net.modules() if isinstance(m, _BATCH_OR_STATE_MODULES) or (
            isinstance(m, nn.modules.instancenorm._InstanceNorm) and m.track_running_stats))
        _PER_SAMPLE_CANDIDATES[net] = candidates
    return not any(module.training for module in candidates)


# net -> its modules that can make a forward depend on its batch (forwards_per_sample)
_PER_SAMPLE_CANDIDATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class HeadedNet(nn.Module):
    """Base of the nets whose body ends in one linear head per output: `add_heads` builds them
    (with the init and out_layer_activation of the net spec), `init_head` re-initialises one
    (SLM-Lab's actor_init_std / critic_init_std), `apply_heads` maps a body output (B, body_dim)
    to a tensor (B, out_dim) for one head or a list of them for several.

    `forward(x)` is `forward_prepared(prepare(x))`: `prepare` turns a batch into what the first
    layer takes (an image net's float conversion and division by 255) and is the identity here.
    A batch forwarded several times (PPO's epochs of minibatches) is prepared once, elementwise,
    so its prepared rows are bitwise those each forward would make; image nets override both."""

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """The batch x (B, *in_shape) as the first layer takes it (here x itself)."""
        return x

    def forward_prepared(self, x: torch.Tensor, *args):
        """forward on a batch that `prepare` made (here forward itself)."""
        return self.forward(x, *args)

    def add_heads(self, net_spec: dict, body_dim: int, out_dims: list[int], gains: list[float],
                  activation: str | None) -> None:
        """One nn.Linear(body_dim, out_dim) per entry of out_dims, initialised under init_fn with its
        gain, each followed by its out_layer_activation (one name for all, or a list of one per head)."""
        self.heads = nn.ModuleList()
        for out_dim, gain in zip(out_dims, gains):
            head = nn.Linear(body_dim, out_dim)
            init_layer(head, net_spec.get('init_fn'), gain, activation)
            self.heads.append(head)
        out_activations = net_spec.get('out_layer_activation')
        if not isinstance(out_activations, list):
            out_activations = [out_activations] * len(out_dims)
        elif len(out_activations) != len(out_dims):
            raise SpecError(f'agent.net.out_layer_activation: {len(out_activations)} activations for '
                            f'{len(out_dims)} output heads; give one per head or a single name')
        self.out_activations = nn.ModuleList(make_activation(a) for a in out_activations)

    def init_head(self, index: int, std: float) -> None:
        """Re-initialise output head `index`: orthogonal weights with gain `std`, bias 0 (SLM-Lab's
        actor_init_std / critic_init_std)."""
        nn.init.orthogonal_(self.heads[index].weight, std)
        nn.init.zeros_(self.heads[index].bias)

    def apply_heads(self, h: torch.Tensor):
        outs = [head.forward(h) if isinstance(act, nn.Identity) else act.forward(head.forward(h))
                for head, act in zip(self.heads, self.out_activations)]
        return outs[0] if len(outs) == 1 else outs


def run_layers(layers: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """x through each layer of a Sequential in turn, calling each layer's forward itself: what
    calling the Sequential computes, without nn.Module's call machinery per layer (its hooks, which
    the lab's nets do not use), about a microsecond and a half a layer, which was a sixth of a small
    MLP's batch-1 act."""
    for layer in layers:
        x = layer.forward(x)
    return x
