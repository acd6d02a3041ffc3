"""SLM-Lab's optimizers that torch.optim lacks: GlobalAdam, GlobalRMSprop and Lookahead.

A spec names them in `optim_spec.name` like any torch.optim class; `optimizer_class(name)`
resolves either. Every one speaks torch's state_dict protocol, so a snapshot resumes it exactly.
"""
from __future__ import annotations

import torch

from slm_lab.agent.net.optim_steps import step_optimizer


class GlobalAdam(torch.optim.Adam):
    """Adam whose per-parameter state (step, exp_avg, exp_avg_sq) exists from construction, so
    that `share_memory()` can put it in shared memory before any process steps (SLM-Lab's
    Hogwild-style meta.distributed). Without sharing it trains exactly as torch.optim.Adam with
    the same arguments: the state is what Adam's first step would have created, zeros and a step
    count of 0. SLM-Lab's arguments: lr, betas, eps, weight_decay."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        super().__init__(params, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        for group in self.param_groups:
            for p in group['params']:
                self.state[p].update(_zero_state(p, ('exp_avg', 'exp_avg_sq')))

    def share_memory(self) -> None:
        """Move every state tensor to shared memory (call before starting worker processes)."""
        _share_state(self)


class GlobalRMSprop(torch.optim.RMSprop):
    """RMSprop (no momentum, not centered, as SLM-Lab's) whose state (step, square_avg) exists
    from construction so `share_memory()` can share it; otherwise exactly torch.optim.RMSprop.
    SLM-Lab's arguments and defaults: lr 0.01, alpha 0.99, eps 1e-8, weight_decay 0."""

    def __init__(self, params, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(params, lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=0, centered=False)
        for group in self.param_groups:
            for p in group['params']:
                self.state[p].update(_zero_state(p, ('square_avg',)))

    def share_memory(self) -> None:
        """Move every state tensor to shared memory (call before starting worker processes)."""
        _share_state(self)


def _zero_state(p: torch.Tensor, buffers: tuple[str, ...]) -> dict:
    """The state torch's Adam / RMSprop create at their first step (non-capturable, non-fused):
    a scalar step count in the default scalar dtype and zero buffers shaped like the parameter."""
    state = {'step': torch.tensor(0.0, dtype=torch.get_default_dtype())}
    state.update({name: torch.zeros_like(p, memory_format=torch.preserve_format) for name in buffers})
    return state


def _share_state(opt: torch.optim.Optimizer) -> None:
    for state in opt.state.values():
        for value in state.values():
            if torch.is_tensor(value):
                value.share_memory_()


class Lookahead(torch.optim.Optimizer):
    """Lookahead (Zhang et al. 2019, "k steps forward, 1 step back") around an inner optimizer.

    The inner optimizer (`optimizer`, a torch.optim or SLM-Lab class name, with the remaining
    keyword arguments, e.g. lr) takes every step on the fast weights theta. Every k-th step of a
    parameter group, the slow weights phi move toward the fast ones and the fast ones restart
    from them:
        phi <- phi + alpha * (theta - phi);  theta <- phi
    As in SLM-Lab, a parameter without a gradient at that step is left alone. SLM-Lab's keys and
    defaults: optimizer 'RAdam', alpha 0.5, k 5.

    The parameter groups and per-parameter state are the inner optimizer's own objects (so LR
    schedulers and clipping see one set of groups); each group also holds alpha and k, which a
    resumed run takes from its spec like any hyperparameter. state_dict() adds the slow weights
    and each group's step count, which are state, not hyperparameters.
    """

    def __init__(self, params, optimizer: str = 'RAdam', alpha: float = 0.5, k: int = 5, **optimizer_kwargs):
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f'alpha must be in [0, 1], got {alpha}')
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f'k must be an integer >= 1, got {k!r}')
        if optimizer == 'Lookahead':
            raise ValueError('the inner optimizer cannot be Lookahead itself')
        params = list(params)
        super().__init__(params, {'alpha': alpha, 'k': k})
        self.optimizer = optimizer_class(optimizer)(params, **optimizer_kwargs)
        for group, inner_group in zip(self.param_groups, self.optimizer.param_groups, strict=True):
            inner_group.update(alpha=group['alpha'], k=group['k'])
        self._link()
        self.step_counters = [0] * len(self.param_groups)  # steps taken by each group
        self.slow_weights = [[p.detach().clone() for p in group['params']] for group in self.param_groups]

    def _link(self) -> None:
        """One set of groups and state, the inner optimizer's (torch's load_state_dict replaces
        both objects, so this runs again after it)."""
        self.param_groups = self.optimizer.param_groups
        self.state = self.optimizer.state

    @torch.no_grad()
    def step(self, closure=None):
        """One inner step (optim_steps.step_optimizer's: the same numbers as its step()); every k-th,
        the slow-weight update above."""
        if closure is None:
            loss = None
            step_optimizer(self.optimizer)
        else:
            loss = self.optimizer.step(closure)
        for i, (group, slow) in enumerate(zip(self.param_groups, self.slow_weights)):
            self.step_counters[i] += 1
            if self.step_counters[i] % group['k'] != 0:
                continue
            for p, q in zip(group['params'], slow):
                if p.grad is None:
                    continue
                q.add_(p - q, alpha=group['alpha'])
                p.copy_(q)
        return loss

    def state_dict(self) -> dict:
        state = self.optimizer.state_dict()  # its groups carry alpha and k
        state['slow_weights'] = [[q.clone() for q in slow] for slow in self.slow_weights]
        state['step_counters'] = list(self.step_counters)
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        inner = {k: v for k, v in state_dict.items() if k not in ('slow_weights', 'step_counters')}
        self.optimizer.load_state_dict(inner)
        self._link()
        self.step_counters = [int(n) for n in state_dict['step_counters']]
        for slow, saved in zip(self.slow_weights, state_dict['slow_weights'], strict=True):
            for q, value in zip(slow, saved, strict=True):
                q.copy_(value)

    def share_memory(self) -> None:
        """Share the inner optimizer's state (where it can) and the slow weights."""
        if hasattr(self.optimizer, 'share_memory'):
            self.optimizer.share_memory()
        for slow in self.slow_weights:
            for q in slow:
                q.share_memory_()


OPTIMIZERS = {cls.__name__: cls for cls in (GlobalAdam, GlobalRMSprop, Lookahead)}


def optimizer_class(name: str) -> type:
    """The optimizer class a spec's name means: SLM-Lab's own first, then torch.optim."""
    if name in OPTIMIZERS:
        return OPTIMIZERS[name]
    return getattr(torch.optim, name)
