"""meta.distributed: the sessions of a trial train one set of weights together, each session in its
own process (SLM-Lab's A3C-style training; its v4 net_util.init_global_nets gives the meaning).

- "shared" (Hogwild): every session's trained nets ARE the global nets. Their parameters live in
  shared memory and each session's optimizer writes them in place, without locks.
- "synced": each session keeps a local copy of the nets. A step clips the session's own gradients,
  applies them to the global weights with the session's optimizer, and copies the global weights
  back into the local copy.

Optimizer state: an optimizer that can share it (GlobalAdam, GlobalRMSprop, Lookahead: the classes
with `share_memory`) keeps one state for all sessions in shared memory, as SLM-Lab's global
optimizers do. Any other optimizer (Adam, AdamW, RMSprop...) keeps its own state in each session
and steps the global weights with it (A3C's "non-shared statistics"; in SLM-Lab such an optimizer
steps a copy of the weights that the session then throws away, so its nets never learn).

Only the nets some optimizer trains are global; target nets and their updates stay per session, as
in SLM-Lab, and so does SAC's temperature (SLM-Lab's log_alpha is not one of its nets). Every step
of an optimizer that trains global weights goes to them, whichever code calls it: the optimizer's
step hooks do the redirecting. The global nets are built in the trial's process from session 0's spec (same seed, so
the same initial weights as session 0 would have), on the CPU: shared memory is CPU memory.

Snapshots: every session's snapshot holds, besides its own state, the global weights and shared
optimizer state as it read them ('global'), with `updates`, the count of optimizer steps applied
to the global weights by all sessions so far. A resume restores the global state of the session
snapshot with the most updates: the last one written, which (after max_frame or a stop signal)
has every update in it.
"""
from __future__ import annotations

import functools
import multiprocessing as mp
from collections.abc import Iterable
from pathlib import Path

import torch

from slm_lab.lib import logger as lab_logger
from slm_lab.persistence.snapshots import load_latest_snapshot
from slm_lab.persistence.snapshots import Snapshot

logger = lab_logger.get_logger('slm_lab.session')
MODES = ('shared', 'synced')
SESSION_NETS = ('temperature',)  # trained nets that SLM-Lab keeps per session: SAC's log_alpha


def _params(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in opt.param_groups for p in group['params']]


class UpdateCount:
    """Optimizer steps applied to the global weights by all sessions: one lock-free counter per
    session, each written by its own session only, summed when read. (One counter under a lock
    would hang every session at its next step if one died holding the lock.) `slot`: the counter
    this process adds to (its session's)."""

    def __init__(self, n_sessions: int, start: int, context):
        self.counts = context.Array('q', max(1, n_sessions), lock=False)
        self.counts[0] = start
        self.slot = 0

    @property
    def value(self) -> int:
        return int(sum(self.counts))

    def add_one(self) -> None:
        self.counts[self.slot] += 1


class GlobalNets:
    """The global nets (and shared optimizer state) of a distributed trial, as tensors in shared
    memory keyed by net name and state_dict key (optimizers: by the parameter's index in the
    optimizer's groups). Built in the trial's process (`build`), handed to each session's process
    when it starts, and attached there to the session's own algorithm (`attach`)."""

    def __init__(self, mode: str, nets: dict, optimizers: dict, updates, restored_from: dict | None = None):
        self.mode = mode
        self.nets = nets  # {net name: {state_dict key: shared tensor}}
        self.optimizers = optimizers  # {optimizer name: {'state': {index: {key: tensor}}, 'slow_weights': ...}}
        self.updates = updates  # UpdateCount: optimizer steps applied to the global weights
        self.restored_from = restored_from  # {'snapshot', 'updates'} of a resumed run
        self._algorithm = None  # in a session's process, once attached
        self._local: dict[int, tuple] = {}  # synced: id(param) -> (param, local tensor, global tensor)

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ('_algorithm', '_local')}

    def __setstate__(self, state):
        self.__dict__.update(state, _algorithm=None, _local={})

    # --- in the trial's process ---------------------------------------------------------------
    @classmethod
    def build(cls, mode: str, algorithm, global_state: dict | None = None, restored_from: dict | None = None,
              context=None, n_sessions: int = 1) -> 'GlobalNets':
        """Share the trained nets of `algorithm` (and its shareable optimizers' state), after
        loading `global_state` into them when resuming. `algorithm` is the trial's own instance:
        its tensors become the shared ones."""
        if mode not in MODES:
            raise ValueError(f'unknown distributed mode {mode!r}')
        if algorithm.device.type != 'cpu':
            raise ValueError('the global nets of a distributed run live in CPU shared memory')
        if global_state is not None:
            nets = algorithm.nets()
            for name, state in global_state['nets'].items():
                if name in nets:
                    nets[name].load_state_dict(state)
            for name, state in global_state['optimizers'].items():
                if name in algorithm.optimizers:
                    algorithm.optimizers[name].load_state_dict(state)  # new state tensors: shared below
        trained = {id(p) for opt in algorithm.optimizers.values() for p in _params(opt)}
        nets, shared_ids = {}, set()
        for name, net in algorithm.nets().items():
            if name in SESSION_NETS or not any(id(p) in trained for p in net.parameters()):
                continue  # a target net (or the temperature): each session keeps and updates its own
            net.share_memory()
            nets[name] = {k: v.data for k, v in net.state_dict(keep_vars=True).items()}
            shared_ids.update(id(p) for p in net.parameters())
        optimizers = {}
        for name, opt in algorithm.optimizers.items():
            params = _params(opt)
            if not hasattr(opt, 'share_memory') or not all(id(p) in shared_ids for p in params):
                continue  # its state stays per session
            opt.share_memory()
            # only the state share_memory shared (Lookahead shares its slow weights, not the state
            # of the optimizer it wraps, which a resumed run has loaded and each session keeps)
            entry = {'state': {i: {k: v for k, v in opt.state[p].items() if torch.is_tensor(v) and v.is_shared()}
                               for i, p in enumerate(params) if p in opt.state}}
            entry['state'] = {i: state for i, state in entry['state'].items() if state}
            if hasattr(opt, 'slow_weights'):  # Lookahead
                entry['slow_weights'] = [list(slow) for slow in opt.slow_weights]
            optimizers[name] = entry
        done = int((global_state or {}).get('updates', 0))
        updates = UpdateCount(n_sessions, done, context or mp.get_context('spawn'))
        return cls(mode, nets, optimizers, updates, restored_from)

    # --- in a session's process ---------------------------------------------------------------
    def attach(self, algorithm, session: int = 0) -> None:
        """Make `algorithm` (a session's, after any snapshot was loaded into it) train the global
        nets: "shared": its nets' tensors become the shared ones; "synced": its local copy is set
        to the global weights. Its shareable optimizers take the shared state."""
        if algorithm.device.type != 'cpu':
            raise ValueError('the nets of a distributed run must be on the CPU (its global nets are in shared memory)')
        nets = algorithm.nets()
        self._local = {}
        for name, shared in self.nets.items():
            own = nets[name].state_dict(keep_vars=True)
            for key, tensor in shared.items():
                mine = own[key]
                if self.mode == 'shared':
                    mine.data = tensor
                elif isinstance(mine, torch.nn.Parameter):  # synced: buffers stay each session's own
                    with torch.no_grad():
                        mine.copy_(tensor)
                    self._local[id(mine)] = (mine, mine.data, tensor)
        for name, entry in self.optimizers.items():
            opt = algorithm.optimizers[name]
            params = _params(opt)
            for i, state in entry['state'].items():
                opt.state[params[i]].update(state)
            if 'slow_weights' in entry:
                opt.slow_weights = [list(slow) for slow in entry['slow_weights']]
        shared = {id(p) for name in self.nets for p in nets[name].parameters()}
        for opt in algorithm.optimizers.values():
            if not any(id(p) in shared for p in _params(opt)):
                continue  # it trains only the session's own nets
            pairs = [self._local[id(p)] for p in _params(opt) if id(p) in self._local]
            opt.register_step_pre_hook(functools.partial(_before_step, pairs))
            opt.register_step_post_hook(functools.partial(_after_step, pairs, self.updates))
        self.updates.slot = session
        self._algorithm = algorithm
        if self.mode == 'shared' and getattr(algorithm, 'acting_outputs', None) is not None:
            # other sessions move the weights while this one collects a rollout: PPO's log pi_old and
            # V(s) come from one forward over the batch at its update (keep_acting_outputs: no effect)
            algorithm.acting_outputs = None

    def state_dict(self) -> dict:
        """The global state as this session reads it now (other sessions may be writing it)."""
        opts = self._algorithm.optimizers
        return {'mode': self.mode, 'updates': int(self.updates.value),
                'nets': {name: dict(shared) for name, shared in self.nets.items()},
                'optimizers': {name: opts[name].state_dict() for name in self.optimizers}}


def _before_step(pairs: list[tuple], _opt, _args, _kwargs) -> None:
    """synced: the step (on the session's own clipped gradients) writes the global tensors in place."""
    for param, _, tensor in pairs:
        param.data = tensor


def _after_step(pairs: list[tuple], updates, _opt, _args, _kwargs) -> None:
    """synced: back to the local copy, now set to the global weights; both modes: count the step."""
    with torch.no_grad():
        for param, local, tensor in pairs:
            param.data = local
            local.copy_(tensor)
    updates.add_one()


def newest_global_state(ckpt_dirs: list[Path]) -> tuple[dict, dict] | None:
    """newest_global_state_of the newest intact snapshot in each of `ckpt_dirs` (read here)."""
    return newest_global_state_of(s for s in map(load_latest_snapshot, ckpt_dirs) if s is not None)


def newest_global_state_of(snapshots: Iterable[Snapshot]) -> tuple[dict, dict] | None:
    """The global state to resume a distributed trial with, from its sessions' newest intact
    snapshots: that of the snapshot with the most global updates (the last written). A run whose
    snapshots have none (resumed with --force from a run that was not distributed) takes the nets
    and optimizers of its newest snapshot. Returns (state, {'snapshot', 'updates'}) or None."""
    best = None
    for snapshot in snapshots:
        glob = snapshot.global_state
        if glob is not None:
            key = (1, glob['updates'], snapshot.manifest.get('created', 0))
        else:
            glob = {'updates': 0, 'nets': snapshot.nets, 'optimizers': snapshot.optimizers}
            key = (0, 0, snapshot.manifest.get('created', 0))
        if best is None or key > best[0]:
            best = (key, glob, snapshot.path)
    if best is None:
        return None
    _, glob, path = best
    return glob, {'snapshot': str(path), 'updates': int(glob['updates'])}
