"""Shapes found in SLM-Lab's own spec files (v4.2.4 and v5.3) beyond single keys: each runs with
SLM-Lab's meaning, or stops with the one 'not available yet' line naming what it waits for."""
from __future__ import annotations

import copy

import pytest

from slm_lab.lib.errors import SpecError
from slm_lab.spec import validate_spec

PPO_SHARED = {
    'agent': {'name': 'PPO',
              'algorithm': {'name': 'PPO', 'time_horizon': 32, 'minibatch_size': 32, 'training_epoch': 2},
              'memory': {'name': 'OnPolicyBatchReplay'},
              'net': {'type': 'MLPNet', 'shared': True, 'hid_layers': [32],
                      'actor_optim_spec': {'name': 'Adam', 'lr': 0.002},
                      'critic_optim_spec': {'name': 'Adam', 'lr': 0.01}}},
    'env': {'name': 'CartPole-v1', 'num_envs': 2, 'max_frame': 256},
    'meta': {'log_frequency': 128, 'random_seed': 1},
}


def test_a_shared_net_trains_with_actor_optim_spec_as_slm_lab_does(lab_run):
    """SLM-Lab builds a shared actor-critic net from the actor's net spec, so its optimizer is
    actor_optim_spec (critic_optim_spec goes unused)."""
    _, run = lab_run(copy.deepcopy(PPO_SHARED), 'shared')
    import pandas as pd
    lrs = pd.read_csv(run / 'info' / 'shared_t0_s0_session_df_train.csv')['lr']
    assert lrs.iloc[-1] == pytest.approx(0.002)


def test_an_empty_net_is_no_net_for_an_agent_that_needs_none():
    spec = {'agent': {'name': 'BaseDemo', 'algorithm': {'name': 'Random'}, 'memory': {'name': 'OnPolicyReplay'},
                      'net': {}},
            'env': {'name': 'CartPole-v1', 'max_frame': 100}}
    assert validate_spec(spec)['agent']['net'] is None


@pytest.mark.parametrize('change,needle', [
    (lambda s: s['agent']['algorithm'].update({'action_pdtype': 'NormalTanh'}), 'NormalTanh'),
])
def test_what_waits_for_a_later_version_is_one_not_available_line(change, needle):
    spec = copy.deepcopy(PPO_SHARED)
    change(spec)
    with pytest.raises(SpecError, match='not available yet') as info:
        validate_spec(spec)
    assert needle in str(info.value)
