"""TorchArcNet: a net whose body is described in the spec as a torcharc `arc` graph (SLM-Lab v5).

SLM-Lab v5 builds these bodies with the torcharc package (2.x). torcharc 2.x declares
Requires-Python >= 3.12, so pip will not install it on this lab's Python 3.11 (only torcharc
<= 1.2.1, which reads an older format), although its code runs on 3.11. This module reads the
same format itself, covering what SLM-Lab's published specs use:

    arc:
      modules:                      # name -> one module
        body:
          Sequential:               # a list of modules, applied in turn
            - LazyLinear: {out_features: 256}
            - LazyBatchRenorm1d: {momentum: 0.01, eps: 0.001, warmup_steps: 5000}
            - ReLU:                 # null or {}: no arguments
      graph:
        input: x                    # the name of the net's input
        modules:                    # name -> the names it takes, computed in this order
          body: [x]
        output: body                # the name the body returns

A module is `{ClassName: kwargs}` with ClassName a torch.nn class (Lazy* included) or the lab's
BatchRenorm1d / LazyBatchRenorm1d; anything else is refused with the key path that holds it.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from slm_lab.agent.net import net_util
from slm_lab.agent.net.batch_renorm import BatchRenorm1d, LazyBatchRenorm1d
from slm_lab.agent.net.mlp import NET_SCHEMA
from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import Field, accepts, check_torch_kwargs, suggest

# modules an arc may name besides torch.nn's
ARC_MODULES = {'BatchRenorm1d': BatchRenorm1d, 'LazyBatchRenorm1d': LazyBatchRenorm1d}


def _module_class(name, path: str) -> type:
    cls = ARC_MODULES.get(name) if isinstance(name, str) else None
    if cls is None and isinstance(name, str) and not name.startswith('_'):
        candidate = getattr(nn, name, None)
        cls = candidate if isinstance(candidate, type) and issubclass(candidate, nn.Module) else None
    if cls is None:
        valid = sorted(n for n in dir(nn) if isinstance(getattr(nn, n), type) and issubclass(getattr(nn, n), nn.Module)
                       and not n.startswith('_')) + sorted(ARC_MODULES)
        raise SpecError(f"{path}: '{name}' is not a torch.nn module or one of the lab's ({', '.join(ARC_MODULES)})"
                        f'{suggest(name, valid)}')
    return cls


def build_module(spec, path: str) -> nn.Module:
    """One module of an arc: {ClassName: kwargs or null}, or {Sequential: [module, ...]}."""
    if not (isinstance(spec, dict) and len(spec) == 1):
        raise SpecError(f'{path}: expected one module as {{ClassName: {{arguments}}}}, e.g. '
                        '{"LazyLinear": {"out_features": 64}}, got ' + repr(spec)[:80])
    (name, args), = spec.items()
    if name == 'Sequential':
        if not isinstance(args, list) or not args:
            raise SpecError(f'{path}.Sequential: expected a non-empty list of modules')
        return nn.Sequential(*(build_module(item, f'{path}.Sequential[{i}]') for i, item in enumerate(args)))
    cls = _module_class(name, f'{path}')
    args = {} if args is None else args
    if not isinstance(args, dict):
        raise SpecError(f'{path}.{name}: expected the arguments as an object (or null), got {args!r}')
    check_torch_kwargs(cls, args, f'{path}.{name}')
    try:
        return cls(**args)
    except (TypeError, ValueError) as e:
        raise SpecError(f'{path}.{name}: {name} rejects these arguments: {e}') from None


class ArcBody(nn.Module):
    """The modules of an arc, run in the order of its graph: forward(x) puts x under the graph's
    input name, computes each graph module from the values its inputs name, and returns the
    value the output names. Input (B, *) as the first module takes it."""

    def __init__(self, arc: dict, path: str = 'agent.net.arc'):
        super().__init__()
        if not isinstance(arc, dict):
            raise SpecError(f'{path}: expected an object with modules and graph')
        extra = sorted(set(arc) - {'modules', 'graph'})
        if extra:
            raise SpecError(f'{path}.{extra[0]}: not an arc key; an arc has modules and graph')
        modules, graph = arc.get('modules'), arc.get('graph')
        if not isinstance(modules, dict) or not modules:
            raise SpecError(f'{path}.modules: required, an object of name: module')
        if not isinstance(graph, dict):
            raise SpecError(f'{path}.graph: required, an object with input, modules and output')
        self.arc_modules = nn.ModuleDict({name: build_module(spec, f'{path}.modules.{name}')
                                          for name, spec in modules.items()})
        self.input_name = graph.get('input')
        if not isinstance(self.input_name, str):
            raise SpecError(f'{path}.graph.input: expected the name of the one input, e.g. "x", got '
                            f'{self.input_name!r}')
        steps = graph.get('modules')
        if not isinstance(steps, dict) or not steps:
            raise SpecError(f'{path}.graph.modules: required, an object of module name: [input names]')
        known = {self.input_name}
        self.steps: list[tuple[str, list[str]]] = []
        for name, inputs in steps.items():
            where = f'{path}.graph.modules.{name}'
            if name not in self.arc_modules:
                raise SpecError(f"{where}: '{name}' is not in {path}.modules{suggest(name, list(self.arc_modules))}")
            inputs = [inputs] if isinstance(inputs, str) else inputs
            if not isinstance(inputs, list) or not inputs or not all(isinstance(i, str) for i in inputs):
                raise SpecError(f'{where}: expected a list of input names, e.g. [{self.input_name}]')
            for i in inputs:
                if i not in known:
                    raise SpecError(f"{where}: input '{i}' is neither the graph input nor an earlier module; "
                                    f'known: {", ".join(sorted(known))}')
            self.steps.append((name, inputs))
            known.add(name)
        self.output_name = graph.get('output')
        if self.output_name not in known:
            raise SpecError(f'{path}.graph.output: {self.output_name!r} is not a name of the graph; '
                            f'known: {", ".join(sorted(known))}')

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values = {self.input_name: x}
        for name, inputs in self.steps:
            values[name] = self.arc_modules[name](*(values[i] for i in inputs))
        return values[self.output_name]


def read_arc(net_spec: dict, path: str = 'agent.net') -> dict:
    """The arc of a net spec: its `arc`, or the YAML / JSON file its `arc_file` names (read
    relative to the working directory, as SLM-Lab does)."""
    if net_spec.get('arc') is not None:
        return net_spec['arc']
    arc_file = net_spec.get('arc_file')
    if arc_file is None:
        raise SpecError(f'{path}.arc: TorchArcNet needs an arc (or arc_file, a file holding one)')
    file = Path(arc_file)
    if not file.is_file():
        raise SpecError(f'{path}.arc_file: {arc_file} is not a file; give the path of a YAML or JSON arc')
    import yaml  # noqa: PLC0415 (yaml: only an arc given as a file needs it)
    try:
        return yaml.safe_load(file.read_text(encoding='utf-8'))  # YAML reads JSON too
    except yaml.YAMLError as e:
        raise SpecError(f'{path}.arc_file: {arc_file} is not YAML or JSON: {str(e).splitlines()[0]}') from None


@accepts("an arc: `modules` (torch.nn classes and `Sequential` lists) and `graph` (`input`, `modules`, `output`)")
def _check_arc(value, path: str) -> None:
    ArcBody(value, path)  # builds only: Lazy modules allocate nothing until their first input


@accepts("a YAML or JSON file holding an arc")
def _check_arc_file(value, path: str) -> None:
    arc_path = path.rsplit('.', 1)[0]
    ArcBody(read_arc({'arc_file': value}, arc_path), path)


@accepts('only `false`')
def _check_no_batch_norm(value, path: str) -> None:
    _check_in_arc(value, path, 'BatchNorm1d')


@accepts('only `false`')
def _check_no_layer_norm(value, path: str) -> None:
    _check_in_arc(value, path, 'LayerNorm')


def _check_in_arc(value, path: str, module: str) -> None:
    if value:
        raise SpecError(f'{path}: TorchArcNet does not add layers to its arc (SLM-Lab ignores this key there); '
                        f'put {module} modules in agent.net.arc, or use MLPNet')


TORCHARC_SCHEMA = {
    **{k: v for k, v in NET_SCHEMA.items() if k not in ('hid_layers', 'batch_norm', 'layer_norm', 'normalize')},
    'type': Field((str,), doc='network class: TorchArcNet'),
    'arc': Field((dict,), None, nullable=True, check=_check_arc,
                 doc="(SLM-Lab v5) TorchArcNet's body as a torcharc graph: modules (name: {torch.nn class: "
                     'arguments}, Sequential lists) and graph (input, modules: name: [inputs], output); output '
                     'heads are added after it'),
    'arc_file': Field((str,), None, nullable=True, check=_check_arc_file,
                      doc='(SLM-Lab v5) TorchArcNet: a YAML or JSON file holding the arc (when arc is null)'),
    'normalize': Field((bool,), False, doc='(SLM-Lab) TorchArcNet: divide the input by 255 (pixels)'),
    'batch_norm': Field((bool,), False, check=_check_no_batch_norm,
                        doc="(SLM-Lab) TorchArcNet: only false, which SLM-Lab's specs write and its TorchArcNet "
                            'never reads; the arc names its own normalisation layers'),
    'layer_norm': Field((bool,), False, check=_check_no_layer_norm,
                        doc='(SLM-Lab) TorchArcNet: only false; the arc names its own normalisation layers'),
    'hid_layers_activation': Field((str,), 'relu', choices=tuple(net_util.ACTIVATIONS),
                                   doc="TorchArcNet: only the gain of init_fn (the arc names its own activations)"),
}


class TorchArcNet(net_util.HeadedNet):
    """The arc's body, then one linear head per output (as MLPNet's, with out_layer_activation
    and out_gains), as SLM-Lab's TorchArcNet appends its tails.

    Input (B, *obs_shape) flattened to (B, in_dim) when in_dim is a width; an image's shape
    (in_dim a tuple, see build_net) is kept for the arc's convolutions. Divided by 255 when
    normalize. The body's output is flattened to (B, body_dim). Lazy modules are materialised at
    construction by one forward of a (1, *in_dim) input in evaluation mode (which moves no running statistics), so
    the parameters exist before optimizers are made and state_dicts are complete. Then, under
    init_fn, every linear and convolutional layer is initialised as MLPNet's."""

    spec_schema = TORCHARC_SCHEMA

    def __init__(self, net_spec: dict, in_dim: int | tuple[int, ...], out_dims: int | list[int],
                 out_gains: list[float] | None = None):
        super().__init__()
        self.net_spec = net_spec
        self.in_dim = in_dim
        self.image = isinstance(in_dim, tuple)  # kept in its shape, not flattened
        self.in_shape = in_dim if self.image else (in_dim,)
        self.out_dims = [out_dims] if isinstance(out_dims, int) else list(out_dims)
        self.normalize = net_spec.get('normalize', False)
        path = 'agent.net.arc' if net_spec.get('arc') is not None else 'agent.net.arc_file'
        self.body = ArcBody(read_arc(net_spec), path)
        self.body.eval()
        with torch.no_grad():
            out = self.body(torch.ones(1, *self.in_shape))
        self.body.train()
        if not torch.is_tensor(out):
            raise SpecError(f'{path}: the graph output must be one tensor, got {type(out).__name__}')
        body_dim = out.flatten(start_dim=1).shape[-1]
        activation = net_spec.get('hid_layers_activation', 'relu')
        gain = net_util.activation_gain(activation)
        for module in self.body.modules():
            if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
                net_util.init_layer(module, net_spec.get('init_fn'), gain, activation)
        self.add_heads(net_spec, body_dim, self.out_dims, out_gains or [gain] * len(self.out_dims), activation)

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """x divided by 255 when normalize (see HeadedNet)."""
        return x / 255.0 if self.normalize else x

    def forward(self, x: torch.Tensor):
        return self.forward_prepared(self.prepare(x))

    def forward_prepared(self, x: torch.Tensor):
        if not self.image:
            x = x.flatten(start_dim=1)
        return self.apply_heads(self.body(x).flatten(start_dim=1))
