"""DuelingMLPNet: a Q net with separate state-value and advantage heads (Wang et al. 2016)."""
from __future__ import annotations

import torch

from slm_lab.agent.net import net_util
from slm_lab.agent.net.mlp import NET_SCHEMA, MLPNet
from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import Field

DUELING_SCHEMA = {**NET_SCHEMA, 'type': Field((str,), doc='network class: DuelingMLPNet')}


def dueling_q(values: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """Q(s, a) = V(s) + A(s, a) - mean_a' A(s, a'): values (B, 1), advantages (B, n_actions) ->
    (B, n_actions). Subtracting the mean makes V and A identifiable (V is the mean of Q over actions)."""
    return values + advantages - advantages.mean(dim=-1, keepdim=True)


class DuelingMLPNet(MLPNet):
    """MLPNet's body (hid_layers, layer_norm, hid_layers_activation, init_fn) with two linear heads,
    V (1 output) and A (n_actions outputs), combined by dueling_q. For Q-learning algorithms: one
    output, (B, n_actions). As in SLM-Lab's DuelingMLPNet, out_layer_activation is not applied."""

    spec_schema = DUELING_SCHEMA

    def __init__(self, net_spec: dict, in_dim: int, out_dims: int | list[int],
                 out_gains: list[float] | None = None):
        dims = [out_dims] if isinstance(out_dims, int) else list(out_dims)
        if len(dims) != 1:
            raise SpecError('agent.net.type: DuelingMLPNet is a Q net with one output; this algorithm needs '
                            f'{len(dims)} output heads; use MLPNet')
        gains = [out_gains[0]] * 2 if out_gains else None  # None: the hidden activation's gain
        super().__init__(net_spec, in_dim, [1, dims[0]], out_gains=gains)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = net_util.run_layers(self.body, x.flatten(start_dim=1))
        value_head, advantage_head = self.heads
        return dueling_q(value_head(h), advantage_head(h))
