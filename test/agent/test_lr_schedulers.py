"""Torch LR schedulers from lr_scheduler_spec follow the frame, as SLM-Lab v4's did (it stepped
them with `step(epoch=clock.frame)`), so a v4 spec's StepLR step_size and MultiStepLR milestones
are frame counts; a resumed run continues on the same curve."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from lab_helpers import visible
import torch

from slm_lab import lab
from slm_lab.persistence import snapshot as checkpoint
from slm_lab.agent.net import net_util
from slm_lab.lib.errors import SpecError

LR0, GAMMA, STEP_SIZE = 1e-3, 0.5, 100
# DQN training at every vector step (2 envs, training_frequency 2), logging every 100 frames: at
# each logged frame the last update was at that frame, where SLM-Lab v4's clock had already counted
# the step when it set the rate
STEP_DQN = {
    'agent': {'name': 'DQN',
              'algorithm': {'name': 'DQN', 'training_frequency': 2, 'training_start_step': 32,
                            'explore_var_spec': {'name': 'linear_decay', 'start_val': 1.0, 'end_val': 0.1,
                                                 'start_step': 0, 'end_step': 200}},
              'memory': {'name': 'Replay', 'batch_size': 16, 'max_size': 1000},
              'net': {'type': 'MLPNet', 'hid_layers': [16], 'optim_spec': {'name': 'Adam', 'lr': LR0},
                      'lr_scheduler_spec': {'name': 'StepLR', 'step_size': STEP_SIZE, 'gamma': GAMMA}}},
    'env': {'name': 'CartPole-v1', 'num_envs': 2, 'max_frame': 400},
    'meta': {'log_frequency': 100, 'random_seed': 5},
}


def _write(tmp_path: Path, name: str, spec: dict) -> str:
    path = tmp_path / f'{name}.json'
    path.write_text(json.dumps({name: spec}))
    return str(path)


def _train_df(data: Path, name: str) -> pd.DataFrame:
    (run,) = sorted(data.glob(f'{name}_*'))
    return pd.read_csv(run / 'info' / f'{name}_t0_s0_session_df_train.csv').set_index('frame')


@pytest.mark.slow
def test_steplr_step_size_counts_frames_and_a_resume_continues_it(tmp_path, no_png):
    spec_file = _write(tmp_path, 'steplr', STEP_DQN)
    data = tmp_path / 'data'
    lab.run(spec_file, 'steplr', 'train', data_dir=str(data))
    first = _train_df(data, 'steplr')['lr']
    # by hand, as SLM-Lab v4 computes it: lr0 * gamma ** (frame // step_size)
    assert first.loc[[100, 200, 300, 400]].tolist() == pytest.approx([5e-4, 2.5e-4, 1.25e-4, 6.25e-5], rel=1e-6)

    (run,) = sorted(data.glob('steplr_*'))
    snap = checkpoint.list_snapshots(run / 'ckpt' / 'steplr_t0_s0')[0]
    state, _ = checkpoint.load_snapshot(snap)
    assert state['agent']['algorithm']['lr_schedulers']['net']['last_epoch'] == 400  # the frame, saved

    lab.run(spec_file, 'steplr', 'train@latest', ['env.max_frame=800'], data_dir=str(data))
    resumed = _train_df(data, 'steplr')
    frames = [500, 600, 700, 800]
    expected = [LR0 * GAMMA ** (f // STEP_SIZE) for f in frames]
    assert resumed['lr'].loc[frames].tolist() == pytest.approx(expected, rel=1e-6)
    assert resumed['lr'].loc[[100, 200, 300, 400]].tolist() == first.loc[[100, 200, 300, 400]].tolist()
    lab.run(spec_file, 'steplr', 'train', ['env.max_frame=800'], data_dir=str(tmp_path / 'whole'))
    assert resumed['lr'].tolist() == _train_df(tmp_path / 'whole', 'steplr')['lr'].tolist()  # exact


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR0)


@pytest.mark.parametrize('spec,expected', [
    ({'name': 'StepLR', 'step_size': 1000, 'gamma': 0.9}, lambda f: LR0 * 0.9 ** (f // 1000)),
    ({'name': 'MultiStepLR', 'milestones': [80000], 'gamma': 0.1}, lambda f: LR0 * (0.1 if f >= 80000 else 1.0)),
    ({'name': 'ExponentialLR', 'gamma': 0.9999}, lambda f: LR0 * 0.9999 ** f),
    ({'name': 'LinearLR', 'start_factor': 1.0, 'end_factor': 0.1, 'total_iters': 50000},
     lambda f: LR0 * (1.0 - 0.9 * min(f, 50000) / 50000)),
    ({'name': 'CosineAnnealingWarmRestarts', 'T_0': 30000},
     lambda f: LR0 * (1 + torch.cos(torch.tensor(torch.pi * (f % 30000) / 30000)).item()) / 2),
])
def test_rate_is_a_function_of_the_frame_alone(spec, expected):
    """Whatever frames the updates fell on before (a training frequency, a resume), the rate at a
    frame is the schedule's value there."""
    dense, sparse = _optimizer(), _optimizer()
    dense_sched = net_util.make_lr_scheduler(dense, spec, clock=None)
    sparse_sched = net_util.make_lr_scheduler(sparse, spec, clock=None)
    for frame in range(0, 100_001, 250):
        net_util.step_lr_scheduler(dense_sched, frame)
        if frame % 20_000 == 0 or frame == 99_750:
            net_util.step_lr_scheduler(sparse_sched, frame)
            assert dense.param_groups[0]['lr'] == pytest.approx(expected(frame), rel=1e-6, abs=1e-12), frame
    assert sparse.param_groups[0]['lr'] == pytest.approx(dense.param_groups[0]['lr'], rel=1e-9)
    assert sparse_sched.get_last_lr() == [sparse.param_groups[0]['lr']]


@pytest.mark.parametrize('name,kwargs', [('CyclicLR', {'base_lr': 1e-4, 'max_lr': 1e-3}),
                                         ('OneCycleLR', {'max_lr': 1e-3, 'total_steps': 1000})])
def test_schedulers_without_a_rate_per_frame_are_refused_in_one_line(make_spec, spec_file, tmp_path, name, kwargs):
    spec = make_spec('DQN')
    spec['agent']['net']['lr_scheduler_spec'] = {'name': name, **kwargs}
    with pytest.raises(SpecError) as err:
        lab.run(spec_file({'s': spec}), 's', 'train', data_dir=str(tmp_path / 'data'))
    message = str(err.value)
    assert '\n' not in message and f"agent.net.lr_scheduler_spec.name: '{name}'" in message and 'StepLR' in message
    assert not (tmp_path / 'data').exists()


def test_preflight_still_catches_a_zero_step_size(make_spec, spec_file, tmp_path):
    spec = make_spec('DQN')
    spec['agent']['net']['lr_scheduler_spec'] = {'name': 'StepLR', 'step_size': 0}
    with pytest.raises(SpecError, match='agent.net.lr_scheduler_spec: StepLR fails with these arguments'):
        lab.run(spec_file({'s': spec}), 's', 'train', data_dir=str(tmp_path / 'data'))
    assert not (tmp_path / 'data').exists()


def test_a_forced_scheduler_argument_applies_after_resume(tmp_path, no_png):
    """--force -s agent.net.lr_scheduler_spec.step_size=...: the loaded scheduler takes the
    edited argument (its state brings back only where it is, not how it was built)."""
    import json

    from slm_lab import lab
    from slm_lab.persistence import snapshot as checkpoint
    from slm_lab.experiment.session import Session
    from slm_lab.persistence.run_dir import RunDir
    from slm_lab.spec import load_spec
    spec = {'agent': {'name': 'DQN', 'algorithm': {'name': 'DQN', 'training_start_step': 32},
                      'memory': {'name': 'Replay', 'batch_size': 32, 'max_size': 1000},
                      'net': {'type': 'MLPNet', 'hid_layers': [16], 'optim_spec': {'name': 'Adam', 'lr': 1e-3},
                              'lr_scheduler_spec': {'name': 'StepLR', 'step_size': 100, 'gamma': 0.5}}},
            'env': {'name': 'CartPole-v1', 'max_frame': 400}, 'meta': {'log_frequency': 100, 'random_seed': 3}}
    path = tmp_path / 'forced.json'
    path.write_text(json.dumps({'forced': spec}))
    lab.run(str(path), 'forced', 'train', data_dir=str(tmp_path / 'data'))
    (run,) = visible(tmp_path / 'data')
    state, _ = checkpoint.load_snapshot(checkpoint.list_snapshots(run / 'ckpt' / 'forced_t0_s0')[0])
    edited = load_spec(str(path), 'forced', ['env.max_frame=800', 'agent.net.lr_scheduler_spec.step_size=200'])
    session = Session(edited, RunDir(run, 'forced'))
    try:
        session.load_state_dict(state, quiet=True)
        sched = session.agent.algorithm.lr_schedulers['net']
        assert sched.step_size == 200 and sched.last_epoch == state['agent']['algorithm']['lr_schedulers']['net'][
            'last_epoch']
    finally:
        session.close()
