"""ConvNet and DuelingConvNet: convolutional nets for image observations (channels first)."""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from slm_lab.agent.net import net_util
from slm_lab.agent.net.dueling import dueling_q
from slm_lab.agent.net.mlp import NET_SCHEMA, check_widths
from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import Field, accepts, not_available

# the convolutional layers of the DQN of Mnih et al. 2015, which SLM-Lab's Atari specs use
NATURE_CONV = [[32, 8, 4, 0, 1], [64, 4, 2, 0, 1], [64, 3, 1, 0, 1]]
# how a conv net lays out its weights and images in memory (agent.net.memory_format)
MEMORY_FORMATS = ('channels_last', 'contiguous')


def _is_size(value) -> bool:
    """An int >= 0, or a pair of them ([h, w])."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= 0
    return isinstance(value, list) and len(value) == 2 and all(_is_size(v) and isinstance(v, int) for v in value)


@accepts('a list of [out_channels, kernel_size, stride, padding, dilation] layers (the last three optional)')
def _check_conv_layers(value, path):
    for i, layer in enumerate(value):
        where = f'{path}[{i}]'
        if not isinstance(layer, list) or not 2 <= len(layer) <= 5:
            raise SpecError(f'{where}: {layer!r} is not a conv layer; give [out_channels, kernel_size, stride, '
                            'padding, dilation] (stride, padding, dilation optional), e.g. [32, 8, 4, 0, 1]')
        channels, *sizes = layer
        if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1:
            raise SpecError(f'{where}[0]: out_channels {channels!r} must be an int >= 1')
        for j, size in enumerate(sizes, start=1):
            name = ('kernel_size', 'stride', 'padding', 'dilation')[j - 1]
            least = 0 if name == 'padding' else 1
            if not _is_size(size) or min(size if isinstance(size, list) else [size]) < least:
                raise SpecError(f'{where}[{j}]: {name} {size!r} must be an int >= {least} or a pair of them')


_IMAGE_KEYS = ('type', 'shared', 'hid_layers_activation', 'out_layer_activation', 'init_fn', 'clip_grad_val',
               'loss_spec', 'optim_spec', 'actor_optim_spec', 'critic_optim_spec', 'use_same_optim',
               'lr_scheduler_spec', 'update_type', 'update_frequency', 'polyak_coef', 'gpu', 'cuda_id',
               'actor_init_std', 'critic_init_std', 'log_std_init', 'precision', 'bf16_min_rows')
CONV_SCHEMA = {
    **{k: NET_SCHEMA[k] for k in _IMAGE_KEYS},
    'type': Field((str,), doc='network class: ConvNet'),
    'conv_hid_layers': Field((list,), NATURE_CONV, check=_check_conv_layers,
                             doc='convolutional layers, each [out_channels, kernel_size, stride, padding, dilation] '
                                 '(torch.nn.Conv2d; the last three optional), each followed by hid_layers_activation'),
    'fc_hid_layers': Field((list,), [512], item_type=int, check=check_widths,
                           doc='widths of the dense layers after the convolutions (each >= 1; [] for none)'),
    'normalize': Field((bool,), False, doc='divide the input by 255 (pixel values to [0, 1]), on the batch'),
    'batch_norm': Field((bool,), True, doc='BatchNorm2d after the activation of every conv layer but the first, '
                                           "as SLM-Lab's ConvNet (its default: true)"),
    'memory_format': Field((str,), 'channels_last', choices=MEMORY_FORMATS,
                           doc='layout of the conv weights and activations in memory: "channels_last" (NHWC, the '
                               "fast path of torch's CPU convolutions: 1.3-1.6x the Nature CNN's forward+backward, "
                               'docs/BENCHMARKS.md) or "contiguous" (NCHW, the layout of runs saved before this key '
                               'existed); the same maths in another summation order, so the numbers differ in '
                               'rounding'),
}
DUELING_CONV_SCHEMA = {**CONV_SCHEMA, 'type': Field((str,), doc='network class: DuelingConvNet'),
                       'batch_norm': Field((bool,), False, doc="as ConvNet's (SLM-Lab's default here: false)")}


def image_shape(in_dim, net_type: str) -> tuple[int, int, int]:
    """The (channels, height, width) of the observations a conv net takes (a (height, width)
    image is one channel), or a one-line SpecError."""
    shape = tuple(in_dim) if isinstance(in_dim, (tuple, list)) else (in_dim,)
    if len(shape) == 2:
        shape = (1, *shape)
    if len(shape) != 3:
        raise SpecError(f'agent.net.type: {net_type} takes image observations (channels, height, width); this '
                        f'env observes shape {shape}; use MLPNet')
    if shape[-1] in (1, 3, 4) and shape[0] > 4:
        raise not_available('agent.net.type', f'{net_type} on channels-last images {shape} (height, width, '
                            "channels: SLM-Lab v4 transposed them; the lab's Atari frames are channels-first)",
                            '; Atari games work as they are')
    return shape


class ConvNet(net_util.HeadedNet):
    """conv_hid_layers (Conv2d, then hid_layers_activation, then BatchNorm2d from the second layer
    on when batch_norm), flattened, fc_hid_layers (Linear + hid_layers_activation), and one linear
    head per output with its out_layer_activation, as SLM-Lab's ConvNet.

    Input: (B, C, H, W), any dtype (uint8 frames stay uint8 until here): cast to float32 and,
    when normalize, divided by 255 (`prepare`; an algorithm that forwards a batch several times
    prepares it once, see HeadedNet). Output: (B, out_dim) for one head, a list for several.
    Under init_fn the conv and dense layers are initialised as MLPNet's, heads with `out_gains`.
    """

    spec_schema = CONV_SCHEMA

    def __init__(self, net_spec: dict, in_dim, out_dims: int | list[int], out_gains: list[float] | None = None,
                 extra_dim: int = 0):
        super().__init__()
        self.net_spec = net_spec
        self.in_shape = image_shape(in_dim, net_spec['type'])
        self.in_dim = math.prod(self.in_shape)
        self.out_dims = [out_dims] if isinstance(out_dims, int) else list(out_dims)
        self.normalize = net_spec['normalize']
        activation = net_spec['hid_layers_activation']
        gain = net_util.activation_gain(activation)
        layers, channels = [], self.in_shape[0]
        for i, (out_channels, *sizes) in enumerate(net_spec['conv_hid_layers']):
            conv = nn.Conv2d(channels, out_channels, *[tuple(s) if isinstance(s, list) else s for s in sizes])
            net_util.init_layer(conv, net_spec['init_fn'], gain, activation)
            layers += [conv, net_util.make_activation(activation)]
            if net_spec['batch_norm'] and i > 0:
                layers.append(nn.BatchNorm2d(out_channels))
            channels = out_channels
        self.conv = nn.Sequential(*layers)
        with torch.no_grad():
            try:
                flat = self.conv.eval()(torch.zeros(1, *self.in_shape)).numel()
            except RuntimeError as e:
                raise SpecError(f'agent.net.conv_hid_layers: these layers do not fit an observation of shape '
                                f'{self.in_shape} ({str(e).splitlines()[0]}); use smaller kernels or strides') from None
        self.conv.train()
        # channels_last: the conv weights in NHWC order here, the images in prepare; the flattened
        # features keep NCHW's order (flatten copies), so the dense layers and checkpoints are the same.
        # A spec without the key was written before it (a validated one holds it): NCHW, as it ran
        # (an old search's trial specs, which its trials read as written)
        self.channels_last = net_spec.get('memory_format', 'contiguous') == 'channels_last'
        if self.channels_last:
            self.conv.to(memory_format=torch.channels_last)
        self.extra_dim = extra_dim
        self.fc, dim = net_util.dense_layers(flat + extra_dim, net_spec['fc_hid_layers'], net_spec['init_fn'],
                                             activation)
        self.add_heads(net_spec, dim, self.out_dims, out_gains or [gain] * len(self.out_dims), activation)

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """Frames (B, C, H, W) or (B, H, W) of any dtype as float32 (B, C, H, W), divided by 255 when
        normalize, laid out as memory_format says (the layout changes before the cast: uint8 frames
        are a quarter of the bytes to move)."""
        if x.dim() == 3:  # (B, H, W): one channel
            x = x.unsqueeze(1)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        if x.dtype == torch.float32:  # not a copy: divide into a new tensor
            return x / 255.0 if self.normalize else x
        x = x.float()  # a new tensor: divided in place (a fresh output costs more than the division)
        return x.div_(255.0) if self.normalize else x

    def features(self, x: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
        """The dense layers' output (B, dim) for a prepared batch x."""
        if x.dim() == 3:  # (B, H, W): one channel (a batch that did not come through prepare)
            x = x.unsqueeze(1)
        h = net_util.run_layers(self.conv, x).flatten(start_dim=1)
        if self.extra_dim:  # a critic's action (B, extra_dim), joined to the image's features
            h = torch.cat([h, extra.float()], dim=-1)
        return net_util.run_layers(self.fc, h)

    def forward(self, x: torch.Tensor, extra: torch.Tensor | None = None):
        return self.forward_prepared(self.prepare(x), extra)

    def forward_prepared(self, x: torch.Tensor, extra: torch.Tensor | None = None):
        return self.apply_heads(self.features(x, extra))


class DuelingConvNet(ConvNet):
    """ConvNet's layers with two linear heads, V (1) and A (n_actions), combined by dueling_q,
    for Q-learning algorithms (one output). out_layer_activation is not applied, as in SLM-Lab."""

    spec_schema = DUELING_CONV_SCHEMA

    def __init__(self, net_spec: dict, in_dim, out_dims: int | list[int], out_gains: list[float] | None = None,
                 extra_dim: int = 0):
        dims = [out_dims] if isinstance(out_dims, int) else list(out_dims)
        if len(dims) != 1:
            raise SpecError('agent.net.type: DuelingConvNet is a Q net with one output; this algorithm needs '
                            f'{len(dims)} output heads; use ConvNet')
        gains = [out_gains[0]] * 2 if out_gains else None  # None: the hidden activation's gain
        super().__init__({**net_spec, 'out_layer_activation': None}, in_dim, [1, dims[0]], out_gains=gains,
                         extra_dim=extra_dim)

    def forward_prepared(self, x: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
        h = self.features(x, extra)
        value_head, advantage_head = self.heads
        return dueling_q(value_head(h), advantage_head(h))
