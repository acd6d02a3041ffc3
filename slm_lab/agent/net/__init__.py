"""Networks, registered by the name a spec gives in agent.net.type, and built by `build_net`.

An algorithm asks for a net with `build_net(net_spec, in_dim, out_dims)`, in_dim being the
observation's shape (or a flat width); it never imports a net class. Every net class takes
`(net_spec, in_dim, out_dims, out_gains=None)` and returns a tensor (B, out_dim) for one output
head or a list of them for several; it has a `spec_schema` for validation. The flat nets (MLPNet,
DuelingMLPNet, TorchArcNet) get in_dim as the width prod(obs_shape) and flatten their input
(B, *obs_shape); the image nets (ConvNet, DuelingConvNet) get the shape, and so does a TorchArcNet
on images (observations of 3 or more dimensions, which its arc's convolutions take as they are). `out_gains` are the
gains of the output layers' orthogonal init under `init_fn` (default: the hidden activation's gain,
as SLM-Lab initialises every layer).
"""
from __future__ import annotations

import torch.nn as nn

import math

from slm_lab.agent.net.conv import ConvNet, DuelingConvNet
from slm_lab.agent.net.dueling import DuelingMLPNet
from slm_lab.agent.net.mlp import MLPNet
from slm_lab.agent.net.onednn_linear import use_linear_kernel
from slm_lab.agent.net.precision import use_precision
from slm_lab.agent.net.recurrent import RecurrentNet
from slm_lab.agent.net.torcharc_net import TorchArcNet
from slm_lab.lib.errors import SpecError

NETS = {'MLPNet': MLPNet, 'DuelingMLPNet': DuelingMLPNet, 'TorchArcNet': TorchArcNet, 'ConvNet': ConvNet,
        'DuelingConvNet': DuelingConvNet, 'RecurrentNet': RecurrentNet}
IMAGE_NETS = (ConvNet, DuelingConvNet)
# SLM-Lab names that come in a later version: validation says so instead of "unknown"
PLANNED_NETS = ('HydraMLPNet',)
# keys SLM-Lab reads only in nets of a later version, and what they are
PLANNED_KEYS = {
    'actor_arc': "separate actor and critic arcs of a TorchArcNet (SLM-Lab's MuJoCo Playground specs)",
    'critic_arc': "separate actor and critic arcs of a TorchArcNet (SLM-Lab's MuJoCo Playground specs)",
}


def build_net(net_spec: dict, in_dim: int | tuple[int, ...], out_dims: int | list[int],
              out_gains: list[float] | None = None, extra_dim: int = 0) -> nn.Module:
    """The net that net_spec['type'] names (a validated net spec), for inputs of shape in_dim (or
    of that flat width), with one output head per entry of out_dims. extra_dim: the width of a
    second input joined to the first (a critic's action): a flat net takes both joined, as
    (B, prod(in_dim) + extra_dim); an image net takes `net(x, extra)` and joins the extra input
    to its convolutions' features, as SLM-Lab v4's QConvNet. Its linear layers compute on
    net_spec's linear_kernel (see onednn_linear.py), its forward in net_spec's precision
    (precision.py)."""
    # a spec without onednn_min_rows / onednn_min_macs was written before the key: every product
    # (of those rows) ran on oneDNN
    net = use_linear_kernel(_build(net_spec, in_dim, out_dims, out_gains, extra_dim),
                            net_spec.get('linear_kernel', 'default'), min_rows=net_spec.get('onednn_min_rows', 1),
                            min_macs=net_spec.get('onednn_min_macs', 0))
    # a spec without bf16_min_rows was written before the key (a validated spec holds it): it acted in bf16
    return use_precision(net, net_spec.get('precision', 'fp32'), min_rows=net_spec.get('bf16_min_rows', 1))


def _build(net_spec: dict, in_dim: int | tuple[int, ...], out_dims: int | list[int],
           out_gains: list[float] | None, extra_dim: int) -> nn.Module:
    cls = NETS[net_spec['type']]
    if issubclass(cls, IMAGE_NETS):
        return cls(net_spec, in_dim, out_dims, out_gains=out_gains, extra_dim=extra_dim)
    if cls is TorchArcNet and isinstance(in_dim, (tuple, list)) and len(in_dim) >= 3:
        # images: the arc's own convolutions take them in their shape (SLM-Lab's Atari arc specs)
        if extra_dim:
            raise SpecError('agent.net.type: a TorchArcNet critic on image observations cannot take the action as a '
                            'second input (a continuous-action SAC/CrossQ on images) in this version; use ConvNet, '
                            'which joins the action to its convolutions\' features')
        return cls(net_spec, tuple(in_dim), out_dims, out_gains=out_gains)
    if isinstance(in_dim, (tuple, list)):
        in_dim = math.prod(in_dim)
    return cls(net_spec, in_dim + extra_dim, out_dims, out_gains=out_gains)
