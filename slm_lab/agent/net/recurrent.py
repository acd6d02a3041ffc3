"""RecurrentNet: SLM-Lab's recurrent net (dense layers, then a GRU / LSTM / RNN, then output
heads), with a hidden state carried through each episode, and SeqContext, which carries it.

How recurrence works here, the same for every algorithm that takes a RecurrentNet:

- Acting: each recurrent net keeps a hidden state per sub-env, advanced by one step of its cell
  per observation and set to zero at the start of each episode.
- What the algorithm and its memory see in place of an observation is a *context*, one flat
  float32 vector per sub-env (layout in SeqLayout): the episode's last `seq_len` observations
  (positions before the episode's start are empty), a mask of the positions that hold one, and
  for each recurrent net the hidden state it had before the first of them.
- A RecurrentNet's output for a context is its cell run over those observations from that
  hidden state. So a batch of contexts, from any memory, trains the recurrence through
  `seq_len` steps (truncated backpropagation through time) from stored hidden states, as R2D2's
  "stored state" does; acting on a context gives the action the same net would give with the
  hidden state carried from the start of the episode, when the weights have not changed since.

The contexts and the carried hidden states are training state: SeqContext.state_dict holds them,
so a resumed run goes on with the same hidden states as the run that never stopped.
"""
from __future__ import annotations

import contextvars
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

from slm_lab.agent.net import net_util
from slm_lab.agent.net.mlp import NET_SCHEMA, check_widths
from slm_lab.lib.errors import ResumeError, SpecError
from slm_lab.lib.schema import MAX_HISTORY, MAX_RNN_LAYERS, MAX_RNN_WIDTH, Field, accepts

CELLS = {'GRU': nn.GRU, 'LSTM': nn.LSTM, 'RNN': nn.RNN}


@accepts('false (a net that carries its state forward in time reads only the past)')
def _check_bidirectional(value, path):
    if value:
        raise SpecError(f'{path}: true does not fit a RecurrentNet here: its hidden state is carried forward '
                        'through each episode, so it reads only past observations; set it to false')


RECURRENT_SCHEMA = {
    **{k: v for k, v in NET_SCHEMA.items() if k not in ('hid_layers', 'batch_norm', 'layer_norm')},
    'type': Field((str,), doc='network class: RecurrentNet'),
    'cell_type': Field((str,), 'GRU', choices=tuple(CELLS), doc='the recurrent cell (torch.nn.GRU, LSTM or RNN)'),
    'fc_hid_layers': Field((list,), [], item_type=int, check=check_widths,
                           doc='widths of the dense layers (each followed by hid_layers_activation) that each '
                               'observation passes before the recurrent cell; [] feeds the observation to it'),
    'rnn_hidden_size': Field((int,), 32, min=1, max=MAX_RNN_WIDTH, doc='width of the hidden state'),
    'rnn_num_layers': Field((int,), 1, min=1, max=MAX_RNN_LAYERS, doc='stacked recurrent layers'),
    'bidirectional': Field((bool,), False, check=_check_bidirectional, doc='only false'),
    'seq_len': Field((int,), 4, min=1, max=MAX_HISTORY,
                     doc='training sequence length: how many of the latest observations of the '
                                           'episode a stored context holds, i.e. the steps gradients flow back '
                                           'through (the hidden state itself is carried through the whole '
                                           'episode)'),
}


@dataclass(frozen=True)
class SeqLayout:
    """Where things are in a context vector (width `width`): the window of the last seq_len
    observations (seq_len, obs_dim), oldest first; its mask (seq_len,), 1.0 where a position holds
    an observation of the current episode (the held ones are always the newest); then one hidden
    state of width state_size per slot (one slot per recurrent net that reads observations)."""
    seq_len: int
    obs_dim: int
    state_size: int
    slots: int

    @property
    def width(self) -> int:
        return self.seq_len * (self.obs_dim + 1) + self.slots * self.state_size

    def split(self, ctx: torch.Tensor, slot: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(window (B, L, D), mask (B, L), hidden state of `slot` (B, state_size)) of contexts (B, width)."""
        L, D = self.seq_len, self.obs_dim
        start = L * (D + 1) + slot * self.state_size
        return (ctx[:, :L * D].reshape(-1, L, D), ctx[:, L * D:L * (D + 1)],
                ctx[:, start:start + self.state_size])


def state_size(net_spec: dict) -> int:
    """Width of one net's flat hidden state: layers x hidden size (x2 for an LSTM's cell state)."""
    return net_spec['rnn_num_layers'] * net_spec['rnn_hidden_size'] * (2 if net_spec['cell_type'] == 'LSTM' else 1)


def context_layout(agent_spec: dict, obs_dim: int, slots: int) -> tuple[SeqLayout, 'gym.spaces.Box']:  # noqa: F821
    """The context layout of an agent with a RecurrentNet (`slots`: its algorithm's
    recurrent_slots) on observations of width obs_dim, and the space of its contexts: what its
    algorithm and memory see in place of observations."""
    import gymnasium as gym  # noqa: PLC0415 (gymnasium: only a recurrent net's context needs it)
    net_spec = agent_spec['net']
    layout = SeqLayout(net_spec['seq_len'], obs_dim, state_size(net_spec), slots)
    return layout, gym.spaces.Box(-np.inf, np.inf, (layout.width,), np.float32)


# the layout and next free slot while an Agent builds its algorithm (see building)
_BUILD: contextvars.ContextVar[list | None] = contextvars.ContextVar('recurrent_build', default=None)


@contextmanager
def building(layout: SeqLayout):
    """While an Agent builds its algorithm: each RecurrentNet made takes the next slot of `layout`
    (an actor-critic's actor 0 and critic 1; a deep copy, such as a target net, keeps its
    original's slot and so reads its stored hidden state)."""
    token = _BUILD.set([layout, 0])
    try:
        yield
    finally:
        _BUILD.reset(token)


class RecurrentNet(net_util.HeadedNet):
    """fc_hid_layers dense layers (each followed by hid_layers_activation) applied to each
    observation, a torch GRU / LSTM / RNN (cell_type, rnn_hidden_size, rnn_num_layers), and one
    linear head per output (each followed by its out_layer_activation) on the top layer's hidden
    state. init_fn initialises the dense layers and heads, as MLPNet's; the cell keeps torch's init.
    The hidden state is carried through each episode (zero at its start) while acting; training
    reads stored steps, each the episode's last seq_len observations and the hidden state before
    them, so gradients flow back seq_len steps. For every algorithm but SAC and CrossQ; vector
    observations only. SLM-Lab differs (its learning curves will too): v4 runs the cell from a zero
    state over the last seq_len observations at each step (the first one repeated at an episode's
    start), and v5 runs it over the current observation repeated seq_len times.

    Input: contexts (B, layout.width) (see the module doc); output (B, out_dim) per head, as MLPNet.
    Built outside an Agent (e.g. to count parameters) it takes in_dim as the observation width and
    a layout of its own with one slot.
    """

    spec_schema = RECURRENT_SCHEMA

    def __init__(self, net_spec: dict, in_dim: int, out_dims: int | list[int], out_gains: list[float] | None = None):
        super().__init__()
        build = _BUILD.get()
        if build is None:
            self.layout, self.slot = SeqLayout(net_spec['seq_len'], in_dim, state_size(net_spec), 1), 0
        else:
            self.layout, self.slot = build[0], build[1]
            build[1] += 1
            if self.slot >= self.layout.slots:
                raise RuntimeError(f'RecurrentNet: the algorithm built more recurrent nets than its '
                                   f'{self.layout.slots} context slots (see Algorithm.recurrent_slots)')
        self.net_spec = net_spec
        self.in_dim = self.layout.obs_dim
        self.out_dims = [out_dims] if isinstance(out_dims, int) else list(out_dims)
        self.cell_type = net_spec['cell_type']
        self.num_layers, self.hidden_size = net_spec['rnn_num_layers'], net_spec['rnn_hidden_size']
        activation = net_spec['hid_layers_activation']
        gain = net_util.activation_gain(activation)
        self.fc, dim = net_util.dense_layers(self.in_dim, net_spec['fc_hid_layers'], net_spec['init_fn'], activation)
        self.rnn = CELLS[self.cell_type](dim, self.hidden_size, self.num_layers, batch_first=True)
        self.add_heads(net_spec, self.hidden_size, self.out_dims, out_gains or [gain] * len(self.out_dims), activation)

    # hidden states: torch's (layers, B, H) (a pair for an LSTM) <-> flat (B, state_size)
    def _unflat(self, h: torch.Tensor):
        B = h.shape[0]
        if self.cell_type == 'LSTM':
            hh, cc = h.reshape(B, 2, self.num_layers, self.hidden_size).permute(1, 2, 0, 3).contiguous()
            return hh, cc
        return h.reshape(B, self.num_layers, self.hidden_size).transpose(0, 1).contiguous()

    def _flat(self, h) -> torch.Tensor:
        if self.cell_type == 'LSTM':
            return torch.stack(h).permute(2, 0, 1, 3).flatten(start_dim=1)
        return h.transpose(0, 1).flatten(start_dim=1)

    def _top(self, h) -> torch.Tensor:
        """The top layer's hidden output (B, H)."""
        return (h[0] if self.cell_type == 'LSTM' else h)[-1]

    def forward(self, ctx: torch.Tensor):
        window, mask, h0 = self.layout.split(ctx, self.slot)
        feats = self.fc(window)  # (B, L, F)
        h = self._unflat(h0)
        # the held positions are the newest ones: start at the first position any context holds
        held = mask.any(dim=0).nonzero()
        first = int(held[0]) if len(held) else self.layout.seq_len - 1
        for k in range(first, self.layout.seq_len):
            _, h_next = self.rnn(feats[:, k:k + 1], h)
            keep = mask[:, k].bool().view(1, -1, 1)
            h = (tuple(torch.where(keep, a, b) for a, b in zip(h_next, h)) if self.cell_type == 'LSTM'
                 else torch.where(keep, h_next, h))
        return self.apply_heads(self._top(h))

    @torch.no_grad()
    def advance(self, obs: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """The hidden state (B, state_size) after one more observation (B, obs_dim) from state h."""
        _, h_next = self.rnn(self.fc(obs.reshape(len(obs), 1, -1)), self._unflat(h))
        return self._flat(h_next)


class SeqContext:
    """The contexts of N sub-envs and the hidden states the agent's recurrent nets carry through
    their episodes (see the module doc). Per step: `observe(obs)` takes the step's observations
    and returns their contexts (N, width) for acting; `advance()` moves each net's hidden state
    past them; `peek(next_obs)` gives the contexts the next observations would have, for the
    memory; `end_episodes(done)` empties the sub-envs whose episode ended."""

    def __init__(self, layout: SeqLayout, nets: list[RecurrentNet], num_envs: int, device: torch.device):
        self.layout, self.nets, self.num_envs, self.device = layout, nets, num_envs, device
        L, D, S, N = layout.seq_len, layout.obs_dim, layout.state_size, num_envs
        self.window = np.zeros((N, L, D), dtype=np.float32)
        self.mask = np.zeros((N, L), dtype=np.float32)
        # each slot's hidden state before each window position's observation, and after the newest
        self.before = np.zeros((layout.slots, N, L, S), dtype=np.float32)
        self.hidden = np.zeros((layout.slots, N, S), dtype=np.float32)

    def _shifted(self, obs: np.ndarray):
        """(window, mask, before) once the observations obs (N, D) join."""
        window = np.concatenate([self.window[:, 1:], obs.reshape(self.num_envs, 1, -1)], axis=1)
        mask = np.concatenate([self.mask[:, 1:], np.ones((self.num_envs, 1), np.float32)], axis=1)
        before = np.concatenate([self.before[:, :, 1:], self.hidden[:, :, None]], axis=2)
        return window, mask, before

    def _pack(self, window, mask, before) -> np.ndarray:
        first = np.argmax(mask, axis=1)  # the oldest held position (the newest always is)
        states = before[:, np.arange(self.num_envs), first]  # (slots, N, S)
        return np.concatenate([window.reshape(self.num_envs, -1), mask,
                               states.transpose(1, 0, 2).reshape(self.num_envs, -1)], axis=1)

    def observe(self, obs: np.ndarray) -> np.ndarray:
        self.window, self.mask, self.before = self._shifted(obs)
        return self._pack(self.window, self.mask, self.before)

    def peek(self, next_obs: np.ndarray) -> np.ndarray:
        return self._pack(*self._shifted(next_obs))

    def advance(self) -> None:
        obs = torch.as_tensor(self.window[:, -1], device=self.device)
        for slot, net in enumerate(self.nets):
            h = torch.as_tensor(self.hidden[slot], device=self.device)
            self.hidden[slot] = net.advance(obs, h).cpu().numpy()

    def end_episodes(self, done: np.ndarray) -> None:
        done = np.asarray(done, dtype=bool)
        if done.any():
            self.window[done], self.mask[done] = 0.0, 0.0
            self.before[:, done], self.hidden[:, done] = 0.0, 0.0

    def state_dict(self) -> dict:
        return {'window': self.window.copy(), 'mask': self.mask.copy(), 'before': self.before.copy(),
                'hidden': self.hidden.copy()}

    def load_state_dict(self, state: dict) -> None:
        for key in ('window', 'mask', 'before', 'hidden'):
            value = np.asarray(state[key], dtype=np.float32)
            if value.shape != getattr(self, key).shape:
                raise ResumeError(f'snapshot: its recurrent context {key} has shape {value.shape}, this spec makes '
                                  f'{getattr(self, key).shape}; resume with the spec the run was made with')
            setattr(self, key, value.copy())
