"""MLPNet's SLM-Lab keys: batch_norm (placement, a batch of one, resume), init_fn's gains and
out_layer_activation per head, checked against what SLM-Lab's MLPNet builds."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from conftest import build_spec
from slm_lab.agent.net import build_net, net_util
from slm_lab.agent.net.mlp import MLPNet
from slm_lab.lib.errors import SpecError
from slm_lab.spec import validate_spec


def net_spec(**keys) -> dict:
    spec = build_spec('DQN')
    spec['agent']['net'].update(keys)
    return validate_spec(spec)['agent']['net']


def test_batch_norm_follows_each_hidden_linear_before_its_activation():
    net = MLPNet(net_spec(hid_layers=[8, 6], batch_norm=True, layer_norm=True), 4, 2)
    kinds = [type(m).__name__ for m in net.body]
    # SLM-Lab: Linear, BatchNorm1d (layer_norm ignored when batch_norm is set), activation
    assert kinds == ['Linear', 'BatchNorm1d', 'Tanh', 'Linear', 'BatchNorm1d', 'Tanh']
    assert [m.num_features for m in net.body if isinstance(m, nn.BatchNorm1d)] == [8, 6]


def test_batch_norm_normalises_a_batch_and_uses_running_statistics_for_one_sample():
    torch.manual_seed(0)
    net = MLPNet(net_spec(hid_layers=[8], batch_norm=True), 4, 2)
    bn = net.body[1]
    x = torch.randn(16, 4)
    h = net.body[0](x)
    normed = net.body[:2](x)
    assert torch.allclose(normed.mean(0), torch.zeros(8), atol=1e-5)  # batch statistics in training
    assert bn.num_batches_tracked == 1
    stats = (bn.running_mean.clone(), bn.running_var.clone())
    one = net.body[:2](x[:1])  # acting in one env: no batch variance, the running statistics instead
    assert torch.allclose(one, (h[:1] - stats[0]) / torch.sqrt(stats[1] + bn.eps), atol=1e-5)
    assert torch.equal(bn.running_mean, stats[0]) and bn.num_batches_tracked == 1


def test_batch_norm_statistics_are_in_the_state_dict():
    net = MLPNet(net_spec(hid_layers=[8], batch_norm=True), 4, 2)
    net(torch.randn(5, 4))
    keys = set(net.state_dict())
    assert {'body.1.running_mean', 'body.1.running_var', 'body.1.num_batches_tracked'} <= keys


@pytest.mark.parametrize('activation, gain', [('relu', math.sqrt(2)), ('tanh', 5 / 3), ('selu', 0.75),
                                              ('sigmoid', 1.0), ('elu', 1.0)])
def test_orthogonal_init_takes_the_gain_of_the_hidden_activation_on_every_layer(activation, gain):
    """SLM-Lab's init_layers: orthogonal_(w, gain=calculate_gain(hid_layers_activation)) on every
    Linear, heads included; an orthogonal (out, in) matrix with out <= in has W W^T = gain^2 I."""
    torch.manual_seed(0)
    net = MLPNet(net_spec(hid_layers=[16], hid_layers_activation=activation, init_fn='orthogonal_'), 32, 4)
    for w in (net.body[0].weight, net.heads[0].weight):
        assert torch.allclose(w @ w.T, gain ** 2 * torch.eye(w.shape[0]), atol=1e-4)
    assert torch.equal(net.body[0].bias, torch.zeros(16))


def test_given_out_gains_still_set_the_heads():
    net = MLPNet(net_spec(hid_layers=[16], init_fn='orthogonal_'), 32, [3, 1], out_gains=[0.01, 1.0])
    w = net.heads[0].weight
    assert torch.allclose(w @ w.T, 1e-4 * torch.eye(3), atol=1e-7)


def test_out_layer_activation_per_head():
    net = MLPNet(net_spec(hid_layers=[8], out_layer_activation=['tanh', None]), 4, [2, 1])
    torch.manual_seed(0)
    with torch.no_grad():
        net.heads[0].bias.fill_(100.0)
        net.heads[1].bias.fill_(100.0)
        first, second = net(torch.randn(3, 4))
    assert torch.allclose(first, torch.ones(3, 2)) and (second > 50).all()


@pytest.mark.parametrize('value, message', [
    (['tanh', 'relux'], "agent.net.out_layer_activation[1]: 'relux' is not an activation (did you mean 'relu'?)"),
    ('sigmod', "agent.net.out_layer_activation: 'sigmod' is not an activation"),
])
def test_bad_out_layer_activation_is_named(value, message):
    spec = build_spec('DQN')
    spec['agent']['net']['out_layer_activation'] = value
    with pytest.raises(SpecError) as e:
        validate_spec(spec)
    assert message in str(e.value)


def test_one_activation_per_head_must_match_the_heads():
    with pytest.raises(SpecError, match='2 activations for 1 output heads'):
        build_net(net_spec(out_layer_activation=['tanh', 'relu']), 4, 2)


def test_kaiming_takes_relus_nonlinearity():
    assert net_util.activation_gain('relu') == math.sqrt(2) and net_util.activation_gain('gelu') == 1.0
    torch.manual_seed(0)
    layer = nn.Linear(2000, 500)
    net_util.init_layer(layer, 'kaiming_normal_', activation='relu')
    assert layer.weight.std().item() == pytest.approx(math.sqrt(2 / 2000), rel=0.02)


@pytest.mark.slow
def test_a_batch_norm_dqn_trains_through_the_lab_and_resumes_exactly(tmp_path):
    from lab_helpers import check_resume_after_max_frame
    spec = build_spec('DQN', max_frame=300, snapshot_replay=True)
    spec['agent']['net']['batch_norm'] = True
    check_resume_after_max_frame(tmp_path, 'dqn_batch_norm', spec)
