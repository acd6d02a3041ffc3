"""The twin-critic base (twin_critic.py) that SAC, CrossQ and TD3 share: which class a spec's
name builds for the env's actions, the state_dict names snapshots of earlier runs hold, and the
critics frozen for the policy's loss."""
from __future__ import annotations

import pytest
import torch
from conftest import make_agent

from slm_lab.agent.algorithm.crossq import CrossQ, DiscreteCrossQ
from slm_lab.agent.algorithm.sac import SoftActorCritic
from slm_lab.agent.algorithm.sac_discrete import DiscreteSAC, RelaxedSAC
from slm_lab.agent.algorithm.td3 import TD3
from slm_lab.agent.algorithm.twin_critic import TwinCriticAlgorithm


def spec(name: str, env: str, **algo) -> dict:
    return {'agent': {'name': name, 'algorithm': {'name': name, 'training_iter': 1, 'training_start_step': 64, **algo},
                      'memory': {'name': 'Replay', 'batch_size': 32, 'max_size': 2000},
                      'net': {'type': 'MLPNet', 'hid_layers': [16], 'optim_spec': {'name': 'Adam', 'lr': 0.003},
                              'update_type': 'polyak', 'polyak_coef': 0.1}},
            'env': {'name': env, 'num_envs': 1, 'max_frame': 400},
            'meta': {'log_frequency': 100, 'random_seed': 3}}


@pytest.mark.parametrize('name,env,algo,cls', [
    ('SoftActorCritic', 'Pendulum-v1', {}, SoftActorCritic),
    ('SoftActorCritic', 'CartPole-v1', {}, DiscreteSAC),
    ('SoftActorCritic', 'CartPole-v1', {'action_pdtype': 'GumbelSoftmax'}, RelaxedSAC),
    ('CrossQ', 'Pendulum-v1', {}, CrossQ),
    ('CrossQ', 'CartPole-v1', {}, DiscreteCrossQ),
])
def test_the_name_a_spec_gives_builds_the_member_of_its_family_for_the_envs_actions(name, env, algo, cls):
    agent, _ = make_agent(spec(name, env, **algo))
    assert type(agent.algorithm) is cls and isinstance(agent.algorithm, TwinCriticAlgorithm)


@pytest.mark.parametrize('name,env,nets,optimizers', [
    ('SoftActorCritic', 'Pendulum-v1', ['net', 'q1_net', 'q2_net', 'target_q1_net', 'target_q2_net', 'temperature'],
     ['actor', 'critic', 'alpha']),
    ('SoftActorCritic', 'CartPole-v1', ['net', 'q1_net', 'q2_net', 'target_q1_net', 'target_q2_net', 'temperature'],
     ['actor', 'critic', 'alpha']),
    ('CrossQ', 'CartPole-v1', ['net', 'q1_net', 'q2_net', 'temperature'], ['actor', 'critic', 'alpha']),
    ('TD3', 'Pendulum-v1', ['net', 'q1_net', 'q2_net', 'target_net', 'target_q1_net', 'target_q2_net'],
     ['actor', 'critic']),
])
def test_the_state_dict_keeps_the_names_snapshots_of_earlier_runs_hold(name, env, nets, optimizers):
    state = make_agent(spec(name, env))[0].algorithm.state_dict()
    assert list(state['nets']) == nets and list(state['optimizers']) == optimizers
    assert 'train_step' in state['extra']


def test_the_critics_are_frozen_for_the_policy_loss_and_trainable_after_even_on_an_error():
    alg = make_agent(spec('TD3', 'Pendulum-v1'))[0].algorithm
    assert isinstance(alg, TD3) and len(alg.clip_groups()) == 3  # actor, Q1, Q2 each clipped on its own
    with pytest.raises(RuntimeError), alg.frozen_critics():
        assert not any(p.requires_grad for net in (alg.q1_net, alg.q2_net) for p in net.parameters())
        raise RuntimeError
    assert all(p.requires_grad for net in (alg.q1_net, alg.q2_net) for p in net.parameters())
    assert not any(p.requires_grad for p in alg.target_q1_net.parameters())
    assert torch.equal(next(alg.target_q1_net.parameters()), next(alg.q1_net.parameters()))
