"""Adam's `fused` default across the lifetime of a run: a new run records `fused: true` in its
saved specs (spec.validate.fill_fused), and a run saved before that default existed (its Adam
spec without the key) resumes, forks and is compared with the per-tensor Adam it started with,
which train@ does not take for an edited spec."""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import lab_helpers
from lab_helpers import PPO, assert_same_run, drop_saved_key, saved_values, train_one

import slm_lab

NAME = 'ppo_fused'


def small_ppo(**optim) -> dict:
    spec = copy.deepcopy(PPO)
    spec['agent']['net']['optim_spec'].update(optim)
    spec['env']['max_frame'] = 1024
    spec['meta'].update({'log_frequency': 256, 'eval_frequency': 512})
    return spec


def saved_fused(run: Path) -> list:
    """optim_spec.fused in the run's, the trial's and the session's saved specs."""
    return saved_values(run, NAME, 'agent.net.optim_spec.fused')


def spec_file_in(directory: Path, spec: dict) -> str:
    return lab_helpers.spec_file_in(directory, NAME, spec)


def run(spec_file: str, mode: str, overrides: list[str], data: Path) -> Path:
    return train_one(spec_file, NAME, mode, overrides, data)


@pytest.fixture(scope='module')
def old_run(tmp_path_factory):
    """A run that stepped Adam per tensor, its saved specs without `fused` (as a lab before the
    default saved them); the spec file its user has (no `fused`); and the straight per-tensor run
    to 2048 frames: (old run, spec file, straight run)."""
    root = tmp_path_factory.mktemp('old_adam')
    per_tensor = spec_file_in(root / 'per_tensor', small_ppo(fused=False))
    old = run(per_tensor, 'train', [], root / 'old')
    drop_saved_key(old, NAME, 'agent.net.optim_spec.fused')
    straight = run(per_tensor, 'train', ['env.max_frame=2048'], root / 'straight')
    return old, spec_file_in(root, small_ppo()), straight


@pytest.mark.slow
def test_a_new_run_records_fused_adam(tmp_path):
    new = run(spec_file_in(tmp_path, small_ppo()), 'train', ['env.max_frame=256'], tmp_path / 'a')
    assert saved_fused(new) == [True, True, True]


@pytest.mark.slow
def test_a_run_saved_before_fused_adam_resumes_with_per_tensor_adam_exactly(old_run, tmp_path):
    old, spec_file, straight = old_run
    resumed = tmp_path / 'data'
    shutil.copytree(old, resumed / old.name)
    run(spec_file, 'train@latest', ['env.max_frame=2048'], resumed)  # no --force: not an edit
    assert saved_fused(resumed / old.name) == [False, False, False]
    record = json.loads((resumed / old.name / f'{NAME}_resumes.json').read_text())[-1]
    assert record['spec_diff'] == [{'key': 'env.max_frame', 'old': 1024, 'new': 2048}] and not record['forced']
    assert_same_run(resumed / old.name, straight, NAME)


@pytest.mark.slow
def test_a_fork_of_a_run_saved_before_fused_adam_continues_per_tensor(old_run, tmp_path):
    old, spec_file, straight = old_run
    child = slm_lab.run(spec_file, NAME, 'train', ['env.max_frame=2048'], data_dir=str(tmp_path / 'data'),
                        fork=old).run_dir
    assert saved_fused(child) == [False, False, False]
    assert_same_run(child, straight, NAME)
