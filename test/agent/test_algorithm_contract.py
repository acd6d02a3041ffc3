"""The algorithm contract (algorithm/base.py): the hooks the lab reads are declared with defaults,
the on- and off-policy bases own the cadence and the target-net update, and the replays an
algorithm keeps itself are found in its state."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import build_spec, make_agent

from slm_lab.agent.algorithm import ALGORITHMS
from slm_lab.agent.algorithm.base import Algorithm
from slm_lab.agent.algorithm.off_policy import OffPolicyAlgorithm
from slm_lab.agent.algorithm.on_policy import OnPolicyAlgorithm

HOOKS = {'spec_schema': dict, 'requires': tuple, 'continuous_ok': bool, 'samples_from_policy': bool,
         'nets_doc': str, 'memory_schema': dict, 'uses_critic_net': bool, 'planned_memory_names': dict,
         'owned_replay_keys': tuple}


@pytest.mark.parametrize('name', list(ALGORITHMS))
def test_every_hook_the_lab_reads_is_declared_on_every_algorithm(name):
    cls = ALGORITHMS[name]
    for hook, kind in HOOKS.items():
        assert hook in vars(Algorithm), f'Algorithm does not declare {hook}'
        assert isinstance(getattr(cls, hook), kind), f'{name}.{hook} is not a {kind.__name__}'
    assert cls.memory_names is None or isinstance(cls.memory_names, tuple)


def test_each_learning_algorithm_stands_on_one_base():
    on = {'Reinforce', 'SARSA', 'ActorCritic', 'PPO', 'SIL', 'PPOSIL'}
    off = {'VanillaDQN', 'DQN', 'DoubleDQN', 'SoftActorCritic', 'CrossQ', 'TD3'}
    assert {n for n, c in ALGORITHMS.items() if issubclass(c, OnPolicyAlgorithm)} == on
    assert {n for n, c in ALGORITHMS.items() if issubclass(c, OffPolicyAlgorithm)} == off


@pytest.mark.parametrize('snapshot_replay', [False, True])
def test_the_replay_sil_keeps_itself_is_among_the_agents_replays(snapshot_replay):
    agent, _ = make_agent(build_spec('SIL', snapshot_replay=snapshot_replay))
    memory_state, sil_state = agent.replay_states(agent.state_dict())
    assert sil_state['persisted'] is snapshot_replay
    plain, _ = make_agent(build_spec('ActorCritic'))
    assert len(plain.replay_states(plain.state_dict())) == 1  # its memory only


def dqn(update_type: str, coef: float = 0.25):
    spec = build_spec('DQN')
    spec['agent']['net'].update(update_type=update_type, polyak_coef=coef, update_frequency=1)
    agent, _ = make_agent(spec)
    alg = agent.algorithm
    with torch.no_grad():
        for p in alg.net.parameters():
            p.add_(1.0)  # the online net moves away from its target copy
    return alg


def test_replace_copies_the_online_net_into_its_target():
    alg = dqn('replace')
    alg.update_target_nets('replace', 0.0)
    for tp, p in zip(alg.target_net.parameters(), alg.net.parameters()):
        assert torch.equal(tp, p)


@pytest.mark.parametrize('lerp', [True, False])
def test_polyak_moves_the_target_by_the_online_nets_weight_in_either_arithmetic(lerp):
    alg = dqn('polyak')
    alg.polyak_lerp = lerp
    before = [copy.deepcopy(p) for p in alg.target_net.parameters()]
    alg.update_target_nets('polyak', 0.25)
    for b, tp, p in zip(before, alg.target_net.parameters(), alg.net.parameters()):
        # bit for bit the arithmetic each family had before the base held it (SAC: lerp, DQN: mul, add)
        expected = torch.lerp(b, p, 0.25) if lerp else b.mul(0.75).add(p, alpha=0.25)
        assert torch.equal(tp, expected)
        assert torch.allclose(tp, 0.75 * b + 0.25 * p, atol=1e-6)


def test_off_policy_update_stores_then_trains_when_due():
    spec = build_spec('DQN')
    spec['agent']['algorithm'].update(training_start_step=4, training_frequency=2)
    agent, clock = make_agent(spec)
    obs = np.zeros((1, 4), np.float32)
    results = []
    for _ in range(8):
        results.append(agent.update(obs, np.array([0]), np.array([1.0]), obs, np.array([False]), np.array([False])))
        clock.tick()
    # stored 1..8 transitions; trains once 4 are stored and the step crosses an even frame
    assert [r is not None for r in results] == [False, False, False, True, False, True, False, True]
