"""TorchArcNet: SLM-Lab v5's torcharc `arc` bodies (modules + graph, Lazy layers, batch renorm),
built, materialised before optimizers exist, refused in one line where the arc is wrong, and
trained through the lab (PPO, SAC, CrossQ critics) with exact resume."""
from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn as nn
from conftest import build_spec
from lab_helpers import check_resume_after_max_frame

from slm_lab.agent.net import NETS, build_net
from slm_lab.agent.net.batch_renorm import BatchRenorm1d
from slm_lab.agent.net.torcharc_net import ArcBody, TorchArcNet
from slm_lab.lib.errors import SpecError
from slm_lab.spec import validate_spec


def arc(*layers, name: str = 'body') -> dict:
    """An arc as SLM-Lab's YAML specs write them: one Sequential body on input x."""
    return {'modules': {name: {'Sequential': list(layers)}},
            'graph': {'input': 'x', 'modules': {name: ['x']}, 'output': name}}


# the bodies SLM-Lab's benchmark_arc and crossq specs use (module lists as their YAML gives them)
MLP_256 = arc({'LazyLinear': {'out_features': 256}}, {'ReLU': None}, {'LazyLinear': {'out_features': 256}},
              {'ReLU': None})
TANH_64 = arc({'LazyLinear': {'out_features': 64}}, {'Tanh': None}, {'LazyLinear': {'out_features': 64}},
              {'Tanh': None})
LAYER_NORM = arc({'LazyLinear': {'out_features': 32}}, {'LayerNorm': {'normalized_shape': 32}}, {'SiLU': None})
CROSSQ_CRITIC = arc({'LazyLinear': {'out_features': 32}},
                    {'LazyBatchRenorm1d': {'momentum': 0.01, 'eps': 0.001, 'warmup_steps': 100}}, {'ReLU': None},
                    {'LazyLinear': {'out_features': 32}},
                    {'LazyBatchRenorm1d': {'momentum': 0.01, 'eps': 0.001, 'warmup_steps': 100}}, {'ReLU': None})


def arc_net(body: dict, **keys) -> dict:
    return {'type': 'TorchArcNet', 'arc': copy.deepcopy(body), 'hid_layers_activation': 'relu',
            'optim_spec': {'name': 'Adam', 'lr': 0.001}, **keys}


def validated_net(body: dict, **keys) -> dict:
    spec = build_spec('PPO')
    spec['agent']['net'] = arc_net(body, **keys)
    return validate_spec(spec)['agent']['net']


@pytest.mark.parametrize('body, widths', [(MLP_256, [256, 256]), (TANH_64, [64, 64]), (LAYER_NORM, [32]),
                                          (CROSSQ_CRITIC, [32, 32])])
def test_slm_labs_arcs_build_materialised_with_heads_after_the_body(body, widths):
    net = build_net(validated_net(body), 5, [3, 1])
    assert isinstance(net, TorchArcNet)
    assert not any(isinstance(p, nn.parameter.UninitializedParameter) for p in net.parameters())
    linears = [m for m in net.body.modules() if isinstance(m, nn.Linear)]
    assert [m.out_features for m in linears] == widths and linears[0].in_features == 5
    assert [h.in_features for h in net.heads] == [widths[-1]] * 2
    logits, value = net(torch.randn(4, 5))
    assert logits.shape == (4, 3) and value.shape == (4, 1)
    torch.optim.Adam(net.parameters())  # lazy parameters would be refused here


def test_materialising_moves_no_running_statistics():
    net = build_net(validated_net(CROSSQ_CRITIC), 5, 1)
    renorms = [m for m in net.modules() if isinstance(m, BatchRenorm1d)]
    assert len(renorms) == 2 and net.training
    for m in renorms:  # the (1, in_dim) materialising forward ran in evaluation mode
        assert torch.equal(m.running_mean, torch.zeros_like(m.running_mean)) and int(m.step) == 0


def test_a_state_dict_loads_into_a_fresh_net_and_gives_the_same_outputs():
    torch.manual_seed(0)
    a = build_net(validated_net(CROSSQ_CRITIC), 5, 2)
    a(torch.randn(8, 5))  # a training forward moves the renorm statistics
    b = build_net(validated_net(CROSSQ_CRITIC), 5, 2)
    b.load_state_dict(a.state_dict())
    a.eval(), b.eval()
    x = torch.randn(3, 5)
    assert torch.equal(a(x), b(x))


def test_a_graph_of_several_modules_runs_in_its_order():
    body = {'modules': {'first': {'Linear': {'in_features': 4, 'out_features': 6}},
                        'second': {'Sequential': [{'Tanh': {}}, {'LazyLinear': {'out_features': 2}}]}},
            'graph': {'input': 'obs', 'modules': {'first': ['obs'], 'second': ['first']}, 'output': 'second'}}
    net = ArcBody(body)
    x = torch.randn(3, 4)
    expected = net.arc_modules['second'](net.arc_modules['first'](x))
    assert torch.equal(net(x), expected)


def test_init_fn_applies_to_the_arcs_linear_layers_with_the_activation_gain():
    net = build_net(validated_net(TANH_64, hid_layers_activation='tanh', init_fn='orthogonal_'), 64, 2)
    w = [m for m in net.body.modules() if isinstance(m, nn.Linear)][1].weight
    assert torch.allclose(w @ w.T, (5 / 3) ** 2 * torch.eye(64), atol=1e-4)


def test_arc_file_is_read(tmp_path):
    path = tmp_path / 'body.json'
    path.write_text(json.dumps(TANH_64))
    net_spec = validated_net(None, arc_file=str(path))
    assert [m.out_features for m in build_net(net_spec, 3, 1).body.modules() if isinstance(m, nn.Linear)] == [64, 64]


@pytest.mark.parametrize('body, message', [
    (arc({'LazyLinaer': {'out_features': 8}}),
     "agent.net.arc.modules.body.Sequential[0]: 'LazyLinaer' is not a torch.nn module or one of the lab's "
     "(BatchRenorm1d, LazyBatchRenorm1d) (did you mean 'LazyLinear'?)"),
    (arc({'LazyLinear': {'out_feature': 8}}),
     'agent.net.arc.modules.body.Sequential[0].LazyLinear.out_feature: not an argument of'),
    (arc({'LazyLinear': {'out_features': 8}}, {'ReLU': None, 'Tanh': None}),
     'agent.net.arc.modules.body.Sequential[1]: expected one module'),
    ({'modules': {'body': {'Tanh': None}}, 'graph': {'input': 'x', 'modules': {'body': ['y']}, 'output': 'body'}},
     "agent.net.arc.graph.modules.body: input 'y' is neither the graph input nor an earlier module"),
    ({'modules': {'body': {'Tanh': None}}, 'graph': {'input': 'x', 'modules': {'bdy': ['x']}, 'output': 'body'}},
     "agent.net.arc.graph.modules.bdy: 'bdy' is not in agent.net.arc.modules (did you mean 'body'?)"),
    ({'modules': {'body': {'Tanh': None}}, 'graph': {'input': 'x', 'modules': {'body': ['x']}, 'output': 'out'}},
     "agent.net.arc.graph.output: 'out' is not a name of the graph"),
    ({'modules': {'body': {'Tanh': None}}}, 'agent.net.arc.graph: required'),
])
def test_a_wrong_arc_is_named_at_its_key_path(body, message):
    spec = build_spec('PPO')
    spec['agent']['net'] = arc_net(body)
    with pytest.raises(SpecError) as e:
        validate_spec(spec)
    assert message in str(e.value) and '\n' not in str(e.value)


def test_keys_torcharcnet_cannot_honour_are_refused():
    for key, module in (('batch_norm', 'BatchNorm1d'), ('layer_norm', 'LayerNorm')):
        spec = build_spec('PPO')
        spec['agent']['net'] = arc_net(MLP_256, **{key: True})
        with pytest.raises(SpecError, match=f'agent.net.{key}: TorchArcNet does not add layers.*put {module}'):
            validate_spec(spec)
    assert validated_net(MLP_256, batch_norm=False)['batch_norm'] is False  # what SLM-Lab's a2c arc specs write
    spec = build_spec('PPO')
    spec['agent']['net'] = arc_net(MLP_256, hid_layers=[8])
    with pytest.raises(SpecError, match='agent.net.hid_layers: unknown key'):
        validate_spec(spec)


def test_torcharcnet_is_registered():
    assert NETS['TorchArcNet'] is TorchArcNet


# --- through the lab ------------------------------------------------------------------------------
@pytest.mark.slow
def test_ppo_with_an_arc_trains_and_resumes_exactly(tmp_path):
    spec = build_spec('PPO', max_frame=256)
    spec['agent']['net'] = arc_net(TANH_64, shared=True, init_fn='orthogonal_')
    check_resume_after_max_frame(tmp_path, 'ppo_arc', spec)


def test_sac_with_arcs_trains_through_the_lab(lab_run):
    spec = {'agent': {'name': 'SoftActorCritic',
                      'algorithm': {'name': 'SoftActorCritic', 'action_pdtype': 'Normal', 'training_iter': 1,
                                    'training_start_step': 64},
                      'memory': {'name': 'Replay', 'batch_size': 32, 'max_size': 1000},
                      'net': arc_net(TANH_64, update_type='polyak', polyak_coef=0.005)},
            'env': {'name': 'Pendulum-v1', 'num_envs': 2, 'max_frame': 300},
            'meta': {'log_frequency': 100, 'random_seed': 3}}
    metrics, _ = lab_run(spec, 'sac_arc')
    assert metrics is not None


@pytest.mark.slow
def test_crossq_with_a_batch_renorm_arc_critic_resumes_exactly(tmp_path):
    spec = {'agent': {'name': 'CrossQ',
                      'algorithm': {'name': 'CrossQ', 'training_iter': 1, 'training_start_step': 64},
                      'memory': {'name': 'Replay', 'batch_size': 32, 'max_size': 2000},
                      'net': arc_net(TANH_64),
                      'critic_net': arc_net(CROSSQ_CRITIC)},
            'env': {'name': 'Pendulum-v1', 'num_envs': 2, 'max_frame': 300},
            'meta': {'log_frequency': 100, 'eval_frequency': 100, 'random_seed': 5, 'snapshot_replay': True}}
    check_resume_after_max_frame(tmp_path, 'crossq_arc', spec)
