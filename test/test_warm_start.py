"""Warm start from any run whose nets fit (`train --warm-start RUN_DIR` or `RUN_DIR/tN`): a
teacher of another spec name, a search's trial; nets that do not fit are one line."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pandas as pd
import pytest
from lab_helpers import PPO, cli, run_in_process, tree_digest, write_spec

import slm_lab
from slm_lab.lib.errors import ResumeError


def teacher_spec() -> dict:
    spec = copy.deepcopy(PPO)
    spec['agent']['algorithm'].update(training_epoch=4, lam=0.95, gamma=0.99)
    spec['agent']['net']['optim_spec']['lr'] = 3e-3
    spec['env']['max_frame'] = 4000
    spec['meta'].update(log_frequency=2000, eval_frequency=2000, rigorous_eval=4)
    return spec


def student_spec() -> dict:
    """Other settings than the teacher's, the same nets; its first evaluation comes before its
    first update (PPO updates every time_horizon x num_envs = 128 frames)."""
    spec = teacher_spec()
    spec['agent']['algorithm'].update(gamma=0.95, training_epoch=2)
    spec['agent']['net']['optim_spec']['lr'] = 3e-4
    spec['env']['max_frame'] = 256
    spec['meta'].update(log_frequency=64, eval_frequency=64, rigorous_eval=4, random_seed=99)
    return spec


def eval_returns(run: Path, name: str) -> pd.Series:
    return pd.read_csv(run / 'info' / f'{name}_t0_s0_session_df_eval.csv')['total_reward']


@pytest.fixture(scope='module')
def teacher(tmp_path_factory):
    root = tmp_path_factory.mktemp('teacher')
    return slm_lab.run(teacher_spec(), 'ppo_teacher', data_dir=str(root / 'data')).run_dir


@pytest.mark.slow
def test_warm_start_from_a_run_of_another_spec_name_plays_at_its_level(teacher, tmp_path):
    before = tree_digest(teacher)
    best = eval_returns(teacher, 'ppo_teacher').max()
    assert best >= 100, 'the teacher did not learn: the test would not tell a warm start from a fresh one'
    fresh = slm_lab.run(student_spec(), 'ppo_student', data_dir=str(tmp_path / 'fresh')).run_dir
    student = slm_lab.run(student_spec(), 'ppo_student', data_dir=str(tmp_path / 'data'), warm_start=teacher).run_dir
    first = eval_returns(student, 'ppo_student').iloc[0]
    assert first >= 0.6 * best, (first, best)
    assert first > 3 * eval_returns(fresh, 'ppo_student').iloc[0]
    lineage = json.loads((student / 'ppo_student_spec.json').read_text())['meta']['lineage']
    assert lineage['kind'] == 'warm_start' and lineage['parent_spec_name'] == 'ppo_teacher'
    assert lineage['parent_trial'] == 0 and lineage['sessions']['0']['file'] == 'model/ppo_teacher_t0_s0_model_best.pt'
    assert tree_digest(teacher) == before


@pytest.mark.slow
@pytest.mark.subprocess
def test_warm_start_refusals_name_the_nets_and_the_trial(teacher, tmp_path, capsys):
    """The first refusal by run_lab.py in a process of its own, the second by the same code in this
    process (run_in_process), the others from Python."""
    spec_file = write_spec(tmp_path, 'ppo_student', student_spec())
    out = cli([spec_file, 'ppo_student', 'train', '--warm-start', str(teacher), '-s', 'agent.net.hid_layers=[16]'],
              cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "net 'model'" in lines[0], out.stderr
    assert 'do not fit the nets of this spec' in lines[0]
    assert not (tmp_path / 'data').exists() or not list((tmp_path / 'data').iterdir())
    # a train run has trial 0 only; a search needs RUN_DIR/tN
    code, err = run_in_process([spec_file, 'ppo_student', 'train', '--warm-start', f'{teacher}/t2'], tmp_path, capsys)
    assert code == 2 and 'is a train run, with trial 0 only' in err, err
    search = tmp_path / 'a_search'
    (search / 'search').mkdir(parents=True)
    for f in teacher.glob('ppo_teacher*_spec.json'):
        (search / f.name.replace('_t0_', '_t3_')).write_text(f.read_text())
    with pytest.raises(ResumeError, match='is a search; give one of its trials.*its trials: t3'):
        slm_lab.run(student_spec(), 'ppo_student', data_dir=str(tmp_path / 'data'), warm_start=search)
    with pytest.raises(ResumeError, match='has no trial 1; give one of its trials.*its trials: t3'):
        slm_lab.run(student_spec(), 'ppo_student', data_dir=str(tmp_path / 'data'), warm_start=search / 't1')


@pytest.mark.slow
def test_warm_start_from_a_search_trial(teacher, tmp_path):
    """RUN_DIR/tN takes trial N's weights: a search's trial is laid out as trial N of its run."""
    search = tmp_path / 'ppo_search_2026_01_01_000000'
    (search / 'search').mkdir(parents=True)
    (search / 'model').mkdir()
    spec = json.loads((teacher / 'ppo_teacher_spec.json').read_text())
    spec['meta']['spec_name'] = 'ppo_search'
    (search / 'ppo_search_spec.json').write_text(json.dumps(spec))
    (search / 'ppo_search_t3_spec.json').write_text(json.dumps(spec))
    (search / 'model' / 'ppo_search_t3_s0_model_best.pt').write_bytes(
        (teacher / 'model' / 'ppo_teacher_t0_s0_model_best.pt').read_bytes())
    student = slm_lab.run(student_spec(), 'ppo_student', data_dir=str(tmp_path / 'data'),
                          warm_start=f'{search}/t3').run_dir
    lineage = json.loads((student / 'ppo_student_spec.json').read_text())['meta']['lineage']
    assert lineage['parent_spec_name'] == 'ppo_search' and lineage['parent_trial'] == 3
    assert lineage['sessions']['0']['file'] == 'model/ppo_search_t3_s0_model_best.pt'
    assert eval_returns(student, 'ppo_student').iloc[0] >= 0.6 * eval_returns(teacher, 'ppo_teacher').max()
