"""CrossQ's `agent.algorithm.batch_renorm_variance`: a new run's critics compute the batch
variance in two passes (the mean squared deviation, faster on CPU than torch's one-pass x.var);
the same quantity within float32 rounding; a run saved before the key resumes with torch's x.var,
as it trained, exactly."""
from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from lab_helpers import assert_same_run, drop_saved_key, saved_values, spec_file_in, train_one

from slm_lab.agent import Agent
from slm_lab.agent.net.batch_renorm import BatchRenorm1d, batch_renorm
from slm_lab.env import Clock
from slm_lab.persistence.edits import fill_keys_added_later
from slm_lab.spec import load_raw_spec, validate_spec

ROOT = Path(__file__).resolve().parents[2]
NAME = 'crossq_var'


def small_crossq(**algorithm) -> dict:
    """SLM-Lab v5's crossq_pendulum (a TorchArcNet critic with LazyBatchRenorm1d layers), short."""
    spec = load_raw_spec(str(ROOT / 'spec/benchmark/crossq/crossq_slm_lab_v5.json'), 'crossq_pendulum', [])
    spec['agent']['algorithm'].update({'training_start_step': 64, **algorithm})
    spec['agent']['memory']['batch_size'] = 32
    spec['env'].update({'max_frame': 400, 'num_envs': 2})
    spec['meta'].update({'log_frequency': 100, 'eval_frequency': 200, 'max_session': 1, 'random_seed': 7})
    return spec


@pytest.mark.parametrize('shift', [0.0, 50.0])
def test_two_passes_give_the_batch_variance_of_torchs_one_pass(shift):
    torch.manual_seed(0)
    x = torch.randn(512, 64) * 3 + shift
    running_mean, running_var = torch.zeros(64), torch.ones(64)
    out = {v: batch_renorm(x, running_mean, running_var, 1e-3, 3.0, 5.0, v) for v in ('welford', 'two_pass')}
    exact = x.double().var(dim=0, unbiased=False)
    for x_hat, mean, var in out.values():
        torch.testing.assert_close(var.double(), exact, rtol=1e-5, atol=0)
    torch.testing.assert_close(out['two_pass'][0], out['welford'][0], rtol=1e-5, atol=1e-5)
    assert BatchRenorm1d.variance == 'welford'  # the module's own default: other nets keep torch's x.var


def critic_layers(spec: dict) -> list[BatchRenorm1d]:
    env = gym.make('Pendulum-v1')
    algorithm = Agent(validate_spec(spec), env.observation_space, env.action_space, 1, Clock(400, 1),
                      seed=0).algorithm
    x = torch.randn(4, 3)
    algorithm.q1_net(torch.cat([x, torch.zeros(4, 1)], -1))  # a lazy layer becomes a BatchRenorm1d
    return [m for net in (algorithm.q1_net, algorithm.q2_net) for m in net.modules() if isinstance(m, BatchRenorm1d)]


def test_a_new_crossq_run_computes_two_passes_and_an_old_spec_one():
    layers = critic_layers(small_crossq())
    assert len(layers) == 4 and {m.variance for m in layers} == {'two_pass'}
    assert {type(m) for m in layers} == {BatchRenorm1d}  # materialised, the attribute kept
    old = small_crossq()
    assert {m.variance for m in critic_layers(fill_keys_added_later(old))} == {'welford'}
    mlp = small_crossq(critic_batch_renorm={'warmup_steps': 100}, batch_renorm_variance='welford')
    mlp['agent']['critic_net'] = None
    assert {m.variance for m in critic_layers(mlp)} == {'welford'}


@pytest.mark.slow
def test_a_crossq_run_saved_before_the_key_resumes_with_torchs_variance_exactly(tmp_path):
    old_file = spec_file_in(tmp_path / 'old', NAME, small_crossq(batch_renorm_variance='welford'))
    old = train_one(old_file, NAME, 'train', [], tmp_path / 'old_data')
    drop_saved_key(old, NAME, 'agent.algorithm.batch_renorm_variance')
    straight = train_one(old_file, NAME, 'train', ['env.max_frame=600'], tmp_path / 'straight')
    user_file = spec_file_in(tmp_path / 'user', NAME, small_crossq())  # the file as a user has it: no key
    train_one(user_file, NAME, 'train@latest', ['env.max_frame=600'], tmp_path / 'old_data')
    assert saved_values(old, NAME, 'agent.algorithm.batch_renorm_variance') == ['welford'] * 3
    record = json.loads((old / f'{NAME}_resumes.json').read_text())[-1]
    assert record['spec_diff'] == [{'key': 'env.max_frame', 'old': 400, 'new': 600}] and not record['forced']
    assert_same_run(old, straight, NAME)
    new = train_one(user_file, NAME, 'train', ['env.max_frame=600'], tmp_path / 'new')
    assert saved_values(new, NAME, 'agent.algorithm.batch_renorm_variance') == ['two_pass'] * 3
