"""MLPNet: a multi-layer perceptron with one or more output heads."""
from __future__ import annotations

import torch
import torch.nn as nn

from slm_lab.agent.net import net_util
from slm_lab.agent.net.onednn_linear import LINEAR_KERNELS, ONEDNN_MIN_MACS, ONEDNN_MIN_ROWS
from slm_lab.agent.net.precision import BF16_MIN_ROWS, PRECISIONS
from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import MAX_DEVICES, MAX_FRAME, Field, accepts, suggest

@accepts('each width >= 1')
def check_widths(value, path):
    for i, width in enumerate(value):
        if width < 1:
            raise SpecError(f'{path}[{i}]: {width} is out of range; a layer width must be >= 1')


@accepts('an activation name, null, or a list of them (one per output head)')
def _check_out_activation(value, path):
    for i, name in enumerate(value if isinstance(value, list) else [value]):
        where = f'{path}[{i}]' if isinstance(value, list) else path
        if name is not None and name not in net_util.ACTIVATIONS:
            valid = list(net_util.ACTIVATIONS)
            raise SpecError(f"{where}: '{name}' is not an activation{suggest(name, valid)}; valid: "
                            f"{', '.join(valid)} or null")


@accepts('`true`, `false` or `"auto"`')
def _check_gpu(value, path):
    if isinstance(value, str) and value != 'auto':
        raise SpecError(f"{path}: {value!r} is not valid; valid values: true, false, 'auto'")


NET_SCHEMA = {
    'type': Field((str,), doc='network class: MLPNet'),
    'shared': Field((bool,), False, doc='actor-critic: one body with a policy head and a value head'),
    'hid_layers': Field((list,), [64, 64], item_type=int, check=check_widths,
                        doc='hidden layer widths (each >= 1)'),
    'hid_layers_activation': Field((str,), 'relu', choices=tuple(net_util.ACTIVATIONS),
                                   doc='activation after each hidden layer'),
    'out_layer_activation': Field((str, list), None, nullable=True, check=_check_out_activation,
                                  doc='activation on the output layer (null: none), or a list with one per '
                                      'output head, as SLM-Lab allows'),
    'init_fn': Field((str,), None, nullable=True, choices=net_util.INIT_FNS,
                     doc="torch.nn.init function for the weights of every linear layer, biases 0 (null: torch's "
                         "default); orthogonal_ and xavier_ take the gain torch recommends for "
                         "hid_layers_activation, kaiming_ its nonlinearity, as in SLM-Lab"),
    'clip_grad_val': Field((float,), None, nullable=True, min=0, min_exclusive=True,
                           doc='max global gradient norm (null: no clipping)'),
    'loss_spec': net_util.loss_field({'name': 'MSELoss'}, 'value / Q loss: a torch.nn loss and its kwargs'),
    'optim_spec': net_util.optim_field({'name': 'Adam', 'lr': 1e-3},
                                       'optimizer for all parameters: a torch.optim class and its kwargs'),
    'actor_optim_spec': net_util.optim_field(None, 'actor-critic: separate optimizer for the actor'),
    'critic_optim_spec': net_util.optim_field(None, 'actor-critic: separate optimizer for the critic'),
    'use_same_optim': Field((bool,), False, doc='actor-critic: critic uses actor_optim_spec too'),
    'lr_scheduler_spec': net_util.lr_scheduler_field('LR schedule: LinearToZero or a torch.optim.lr_scheduler class'),
    'update_type': Field((str,), 'replace', choices=('replace', 'polyak'), doc='DQN target net update'),
    'update_frequency': Field((float,), 1, min=0, min_exclusive=True, max=MAX_FRAME,
                              doc='DQN, SAC: frames between target net updates (any number, as in SLM-Lab: at or '
                                  'below num_envs, e.g. the 0.9 of its ddqn_lunar_search.json, every vector step)'),
    'polyak_coef': Field((float,), 0.0, min=0, max=1,
                         doc='polyak: weight of the online net in each target update (target keeps 1 - polyak_coef; '
                             "SLM-Lab's default 0 leaves the target as it is)"),
    'gpu': Field((bool, str), False, check=_check_gpu, doc="use CUDA when available (true/'auto')"),
    'linear_kernel': Field((str,), 'auto', choices=LINEAR_KERNELS,
                           doc='CPU kernel of the linear layers\' products: "default" (torch\'s, MKL on the pinned '
                               'build), "onednn" (AVX-512 where MKL takes AVX2, as on AMD CPUs: 2-3x faster products '
                               'measured in docs/BENCHMARKS.md; the same maths rounded differently, so a seeded run '
                               'gives other numbers than under "default"; layers under 32 wide stay on "default"), or '
                               '"auto": "onednn" on an AMD CPU with AVX-512 for a net whose hid_layers (a '
                               'TorchArcNet: its arc\'s Linear layers\' out_features, an arc_file\'s too) are '
                               'all 128 or '
                               'wider, else "default", settled when the spec is validated (a search\'s trials each for '
                               'the layers they draw; the saved spec holds the choice: a resumed run keeps it on any '
                               'machine)'),
    'onednn_min_rows': Field((int,), ONEDNN_MIN_ROWS, min=1,
                             doc='with linear_kernel "onednn": a product over fewer rows than this (acting in one '
                                 'or a few envs) runs on torch\'s default kernel, where a oneDNN call costs more '
                                 '(DQN CartPole: 1.10x slower whole-run with every product on oneDNN; '
                                 'docs/BENCHMARKS.md); 1: every product on oneDNN, as runs saved before this key'),
    'onednn_min_macs': Field((int,), ONEDNN_MIN_MACS, min=0,
                             doc='with linear_kernel "onednn": a product of fewer multiply-adds than this (rows x '
                                 'in x out: a small batch through a narrow layer) runs on torch\'s default kernel, '
                                 'faster there (an MLP 32-256-128-4 trained 1.54x slower on oneDNN at 32 rows; '
                                 'docs/BENCHMARKS.md); 0: every product of onednn_min_rows rows or more on oneDNN, '
                                 'as runs saved before this key'),
    'precision': Field((str,), 'fp32', choices=PRECISIONS,
                       doc='"fp32", or "bf16": the net\'s forward and backward under torch\'s autocast in bfloat16 '
                           '(products in bf16 with float32 sums; weights, gradients, optimizer and losses float32), '
                           'on the CPU (fast with AVX512-BF16 or AMX) and on CUDA; a seeded run gives other numbers '
                           'than in "fp32" (docs/BENCHMARKS.md measures speed and learning)'),
    'bf16_min_rows': Field((int,), BF16_MIN_ROWS, min=1,
                           doc='with precision "bf16": acting (choosing actions) over fewer rows than this, in a '
                               'few envs, runs in float32, where a bf16 product\'s fixed cost outweighs its gain (the '
                               'Nature CNN at batch 1: 1.7x slower in bf16 on an AMX CPU, faster from 8 rows; '
                               'docs/BENCHMARKS.md); training forwards stay in bf16; 1 acts in bf16 too, as runs '
                               'saved before this key'),
    'batch_norm': Field((bool,), False, doc='(SLM-Lab v5) BatchNorm1d after each hidden linear layer, before its '
                                            'activation (instead of layer_norm when both are set, as in SLM-Lab); '
                                            'a batch of one (acting in one env) uses the running statistics'),
    'normalize': Field((bool,), False, doc="ignored, as in SLM-Lab's MLPNet (its ConvNet divides pixel inputs by 255)"),
    'layer_norm': Field((bool,), False, doc='(SLM-Lab v5) LayerNorm after each hidden layer, before its activation '
                                            '(ignored when batch_norm is set, as in SLM-Lab)'),
    'actor_init_std': Field((float,), None, nullable=True, min=0,
                            doc='(SLM-Lab v5) actor-critics (ActorCritic, PPO, SIL, PPOSIL): orthogonal init of the '
                                'policy output layer with this gain, bias 0 (null: the layer is initialised as the '
                                "others, e.g. with the activation's gain under init_fn); other algorithms ignore it. "
                                'SLM-Lab documents it, but its actor-critics drop the key before building their nets'),
    'critic_init_std': Field((float,), None, nullable=True, min=0,
                             doc='(SLM-Lab v5) actor-critics: orthogonal init of the value output layer with this '
                                 'gain, bias 0 (null: initialised as the other layers); other algorithms ignore it. '
                                 'SLM-Lab documents it, but its actor-critics drop the key before building their nets'),
    'cuda_id': Field((int,), None, nullable=True, min=0, max=MAX_DEVICES,
                     doc='(SLM-Lab) the CUDA device index used when gpu puts the nets on a GPU (null: the current '
                         'one)'),
    'log_std_init': Field((float,), None, nullable=True,
                          doc='continuous actions: a learned, state-independent log standard deviation starting '
                              "at this value; null (SLM-Lab's default): the policy net outputs the log scale "
                              'beside the loc, clamped to [-5, 2]'),
}


class BatchNorm1d(nn.BatchNorm1d):
    """torch's BatchNorm1d, except that in training mode a batch of one sample is normalised
    with the running statistics (as in eval mode) and leaves them unchanged: acting in a single
    env passes one observation, whose own batch variance does not exist (torch raises there)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0] == 1:
            return nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                            False, 0.0, self.eps)
        return super().forward(x)


class MLPNet(net_util.HeadedNet):
    """An MLP body (hid_layers, each linear layer followed by BatchNorm1d when batch_norm, else
    LayerNorm when layer_norm, then hid_layers_activation) and one linear head per output, each
    followed by its out_layer_activation.

    Input: (batch, *obs_shape) float tensor with prod(obs_shape) = in_dim, flattened to
    (batch, in_dim) (so a Box observation of any shape works). Output: a tensor (batch, out_dim)
    for one head, or a list of such tensors for several heads (e.g. [policy logits, value]).
    Under init_fn every linear layer is initialised as SLM-Lab's init_layers does (gain of
    hid_layers_activation, biases 0), except that the heads take `out_gains` when given.
    """

    spec_schema = NET_SCHEMA

    def __init__(self, net_spec: dict, in_dim: int, out_dims: int | list[int],
                 out_gains: list[float] | None = None):
        super().__init__()
        self.net_spec = net_spec
        self.in_dim = in_dim
        self.out_dims = [out_dims] if isinstance(out_dims, int) else list(out_dims)
        activation = net_spec['hid_layers_activation']
        hidden_gain = net_util.activation_gain(activation)
        layers, dim = [], in_dim
        for width in net_spec['hid_layers']:
            linear = nn.Linear(dim, width)
            net_util.init_layer(linear, net_spec['init_fn'], hidden_gain, activation)
            layers.append(linear)
            if net_spec.get('batch_norm'):
                layers.append(BatchNorm1d(width))
            elif net_spec.get('layer_norm'):
                layers.append(nn.LayerNorm(width))
            layers.append(net_util.make_activation(activation))
            dim = width
        self.body = nn.Sequential(*layers)
        self.add_heads(net_spec, dim, self.out_dims, out_gains or [hidden_gain] * len(self.out_dims), activation)

    def forward(self, x: torch.Tensor):
        return self.apply_heads(net_util.run_layers(self.body, x.flatten(start_dim=1)))
