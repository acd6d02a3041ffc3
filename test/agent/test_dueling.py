"""DuelingMLPNet: Q = V + A - mean(A) on hand-computed values, built by net.type, trained by DQN."""
from __future__ import annotations

import re

import pytest
import torch

from conftest import build_spec
from slm_lab.agent.net import build_net
from slm_lab.agent.net.dueling import DuelingMLPNet, dueling_q
from slm_lab.lib.errors import SpecError
from slm_lab.spec import validate_spec


def net_spec(**keys) -> dict:
    spec = build_spec('DQN')
    spec['agent']['net'].update(type='DuelingMLPNet', **keys)
    return validate_spec(spec)['agent']['net']


def test_dueling_q_subtracts_the_mean_advantage():
    # state 0: V 1, A 1 2 3 (mean 2): 0 1 2; state 1: V 0, A 0 0 3 (mean 1): -1 -1 2
    q = dueling_q(torch.tensor([[1.0], [0.0]]), torch.tensor([[1.0, 2, 3], [0, 0, 3]]))
    torch.testing.assert_close(q, torch.tensor([[0.0, 1, 2], [-1, -1, 2]]))


def test_build_net_makes_a_dueling_net_whose_mean_q_is_its_value():
    net = build_net(net_spec(hid_layers=[16], layer_norm=True), 4, 3)
    assert isinstance(net, DuelingMLPNet)
    x = torch.randn(5, 4)
    q = net(x)
    assert q.shape == (5, 3)
    value_head = net.heads[0]
    torch.testing.assert_close(q.mean(-1, keepdim=True), value_head(net.body(x)))


def test_dueling_net_refuses_several_output_heads():
    with pytest.raises(SpecError, match='agent.net.type'):
        build_net(net_spec(), 4, [3, 1])


def test_dqn_with_a_dueling_net_trains_through_the_lab(lab_run):
    # dev mode checks that every trainable parameter moved (both heads and the body)
    spec = build_spec('DQN', max_frame=300)
    spec['agent']['net']['type'] = 'DuelingMLPNet'
    _, run = lab_run(spec, 'dueling_dqn', mode='dev')
    assert re.search(r'DEBUG .*dev check passed', (run / 'log' / 'dueling_dqn_t0_s0.log').read_text())
