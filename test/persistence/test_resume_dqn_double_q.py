"""DQN's `agent.algorithm.double_q` across the lifetime of a run: a new run of a flat spec (SLM-Lab
v5's layout, the lab's own files) records true, one of SLM-Lab v4's layout false; train@, --fork
and --warm-start of a run keep what it ran: the value its saved spec records, or false (the
targets the lab's DQN computed then) for a run saved before the key existed, which train@ does not
take for an edited spec."""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
from conftest import LabWarnings
import lab_helpers
from lab_helpers import DQN, assert_same_run, drop_saved_key, saved_values, train_csv, train_one

import slm_lab

NAME = 'dqn_targets'


def small_dqn(**algorithm) -> dict:
    spec = copy.deepcopy(DQN)
    spec['agent']['algorithm'].update(algorithm)
    spec['env']['max_frame'] = 600
    spec['meta'].update({'log_frequency': 200, 'eval_frequency': 200})
    return spec


def v4_layout(spec: dict) -> dict:
    """The spec as SLM-Lab v4 writes it: agent and env in one-element lists, a body block."""
    return {**spec, 'agent': [spec['agent']], 'env': [spec['env']], 'body': {'product': 'outer', 'num': 1}}


def saved_double_q(run: Path) -> list:
    """double_q in the run's, the trial's and the session's saved specs."""
    return saved_values(run, NAME, 'agent.algorithm.double_q')


def make_old(run: Path) -> None:
    """The run as a lab before double_q saved it: no such key in any of its specs."""
    drop_saved_key(run, NAME, 'agent.algorithm.double_q')


def spec_file_in(directory: Path, spec: dict) -> str:
    return lab_helpers.spec_file_in(directory, NAME, spec)


def run(spec_file: str, mode: str, overrides: list[str], data: Path) -> Path:
    return train_one(spec_file, NAME, mode, overrides, data)


@pytest.fixture(scope='module')
def old_run(tmp_path_factory):
    """A run of 600 frames that trained the target net's own targets, as the lab's DQN did before
    double_q, its saved specs without the key; the spec file a user of that run has (flat, without
    the key); and the straight run of that DQN to 1200 frames: (old run, spec file, straight run)."""
    root = tmp_path_factory.mktemp('old_dqn')
    vanilla_file = spec_file_in(root / 'vanilla', small_dqn(double_q=False))
    old = run(vanilla_file, 'train', [], root / 'old')
    make_old(old)
    straight = run(vanilla_file, 'train', ['env.max_frame=1200'], root / 'straight')
    return old, spec_file_in(root, small_dqn()), straight


@pytest.mark.slow
def test_a_new_run_records_double_q_by_the_layout_of_its_spec(tmp_path):
    flat = run(spec_file_in(tmp_path / 'flat', small_dqn()), 'train', ['env.max_frame=400'], tmp_path / 'a')
    assert saved_double_q(flat) == [True, True, True]
    v4_file = spec_file_in(tmp_path / 'v4', v4_layout(small_dqn()))
    v4 = run(v4_file, 'train', ['env.max_frame=400'], tmp_path / 'b')
    assert saved_double_q(v4) == [False, False, False]
    asked = run(v4_file, 'train', ['env.max_frame=400', 'agent.algorithm.double_q=true'], tmp_path / 'c')
    assert saved_double_q(asked) == [True, True, True]
    # the two generations' targets differ once the online net picks another next action than the
    # target net: so do the runs' losses
    assert train_csv(flat, NAME)['loss'].tolist() != train_csv(v4, NAME)['loss'].tolist()
    assert train_csv(flat, NAME)['loss'].tolist() == train_csv(asked, NAME)['loss'].tolist()


@pytest.mark.slow
def test_a_run_saved_before_double_q_resumes_with_its_targets_exactly(old_run, tmp_path):
    old, spec_file, straight = old_run
    resumed = tmp_path / 'data'
    shutil.copytree(old, resumed / old.name)  # the fixture's run stays as it was for the other tests
    run(spec_file, 'train@latest', ['env.max_frame=1200'], resumed)  # no --force: not an edit
    assert saved_double_q(resumed / old.name) == [False, False, False]
    record = json.loads((resumed / old.name / f'{NAME}_resumes.json').read_text())[-1]
    assert record['spec_diff'] == [{'key': 'env.max_frame', 'old': 600, 'new': 1200}] and not record['forced']
    assert_same_run(resumed / old.name, straight, NAME)


@pytest.mark.slow
@pytest.mark.parametrize('double_q', [True, False])
def test_a_run_resumes_with_the_double_q_it_saved(tmp_path, double_q):
    """The spec file says nothing of double_q at train@: the run's saved value holds."""
    started = spec_file_in(tmp_path / 'start', small_dqn(double_q=double_q))
    first = run(started, 'train', [], tmp_path / 'a')
    run(spec_file_in(tmp_path, small_dqn()), 'train@latest', ['env.max_frame=1200'], tmp_path / 'a')
    assert saved_double_q(first) == [double_q] * 3
    assert_same_run(first, run(started, 'train', ['env.max_frame=1200'], tmp_path / 'b'), NAME)


@pytest.mark.slow
def test_a_fork_of_a_run_saved_before_double_q_continues_with_its_targets(old_run, tmp_path):
    old, spec_file, straight = old_run
    child = slm_lab.run(spec_file, NAME, 'train', ['env.max_frame=1200'], data_dir=str(tmp_path / 'data'),
                        fork=old).run_dir
    assert saved_double_q(child) == [False, False, False]
    assert_same_run(child, straight, NAME)


@pytest.mark.slow
def test_a_warm_start_keeps_the_parents_targets_unless_the_spec_gives_them(old_run, tmp_path):
    old, spec_file, _ = old_run
    with LabWarnings() as warned:
        child = slm_lab.run(spec_file, NAME, 'train', ['env.max_frame=200'], data_dir=str(tmp_path / 'a'),
                            warm_start=old).run_dir
    assert saved_double_q(child) == [False, False, False]
    assert "--warm-start: agent.algorithm.double_q false, the parent's" in warned.text
    asked = slm_lab.run(spec_file, NAME, 'train', ['env.max_frame=200', 'agent.algorithm.double_q=true'],
                        data_dir=str(tmp_path / 'b'), warm_start=old).run_dir
    assert saved_double_q(asked) == [True, True, True]
