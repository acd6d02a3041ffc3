"""`slm-lab report`: each run's final score per seed, their mean and 95% bootstrap interval,
printed and written; the trial metrics hold the same interval."""
from __future__ import annotations

import copy
import csv
import json
import shutil

import numpy as np
import pytest
from lab_helpers import PPO

import slm_lab
from slm_lab.cli import main
from slm_lab.experiment.analysis import bootstrap_interval, score_summary


def test_bootstrap_interval_by_hand():
    # two seeds 0 and 1: a resample's mean is 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4, so the
    # 2.5% and 97.5% quantiles of many resamples are 0 and 1
    assert bootstrap_interval([0.0, 1.0]) == (0.0, 1.0)
    assert bootstrap_interval([5.0, 5.0, 5.0, 5.0]) == (5.0, 5.0)
    assert bootstrap_interval([3.0]) is None and bootstrap_interval([]) is None
    low, high = bootstrap_interval([10.0, 20.0, 30.0, 40.0])
    assert 10 <= low < 25 < high <= 40
    assert bootstrap_interval([10.0, 20.0, 30.0, 40.0]) == (low, high)  # the same values, the same interval
    summary = score_summary([1.0, None, 3.0, float('nan')])
    assert summary['n'] == 2 and summary['mean'] == 2.0 and summary['confidence'] == 0.95


@pytest.fixture(scope='module')
def four_seeds(tmp_path_factory):
    spec = copy.deepcopy(PPO)
    spec['env']['max_frame'] = 256
    spec['meta'].update(log_frequency=128, eval_frequency=128, max_session=4)
    data = tmp_path_factory.mktemp('report') / 'data'
    return slm_lab.run(spec, 'report_ppo', data_dir=str(data))


@pytest.mark.slow
def test_report_of_a_run_of_four_seeds(four_seeds, tmp_path, capsys):
    run = four_seeds.run_dir
    scores = []
    for s in range(4):
        with open(run / 'info' / f'report_ppo_t0_s{s}_session_df_eval.csv') as f:
            scores.append(float(list(csv.DictReader(f))[-1]['total_reward_ma']))
    trial = json.loads((run / 'info' / 'report_ppo_t0_trial_metrics.json').read_text())
    interval = trial['interval']['final_return_ma']
    assert interval['n'] == 4 and np.isclose(interval['mean'], np.mean(scores))
    assert np.isclose(trial['scalar']['final_return_ma'], interval['mean'])
    assert (interval['low'], interval['high']) == bootstrap_interval(scores)

    out = tmp_path / 'reports'
    out.mkdir()
    assert main(['report', str(run), '-o', str(out / 'table.md')]) == 0
    printed = capsys.readouterr().out
    assert f'| {run.name} | report_ppo | 256 | finished | 4 |' in printed
    assert f'[{interval["low"]:.2f}, {interval["high"]:.2f}]' in printed
    assert (out / 'table.md').read_text() in printed
    with open(out / 'table.csv') as f:
        (row,) = list(csv.DictReader(f))
    assert [float(x) for x in row['scores'].split()] == pytest.approx(scores)
    assert float(row['ci95_low']) == pytest.approx(interval['low']) and row['spec_name'] == 'report_ppo'
    # a directory given to -o holds the report; the default goes under data/reports/
    assert main(['report', str(run), '-o', str(out)]) == 0
    assert len(list(out.glob('report_*.md'))) == 1 and len(list(out.glob('report_*.csv'))) == 1
    # a stopped run: its scores are not final ones, and the table says how far it trained
    stopped = tmp_path / run.name
    shutil.copytree(run, stopped)
    (stopped / 'info' / 'report_ppo_t0_trial_metrics.json').unlink()  # a stopped trial writes none
    train = stopped / 'info' / 'report_ppo_t0_s1_session_df_train.csv'
    train.write_text(''.join(train.read_text().splitlines(keepends=True)[:-1]))
    last = int(float(list(csv.DictReader(train.open()))[-1]['frame']))
    assert main(['report', str(stopped), '-o', str(out / 'stopped.md')]) == 0
    assert f'| 256 | {last}-256 of 256, unfinished | 4 |' in capsys.readouterr().out
    for s in (2, 3):  # sessions that had not started (they run in waves, one per core): 0 frames
        for kind in ('train', 'eval'):
            (stopped / 'info' / f'report_ppo_t0_s{s}_session_df_{kind}.csv').unlink()
    assert main(['report', str(stopped), '-o', str(out / 'waves.md')]) == 0
    assert '| 0-256 of 256, unfinished | 2 |' in capsys.readouterr().out


@pytest.mark.slow
def test_report_names_lineage_and_refuses_bad_input_in_one_line(four_seeds, tmp_path, capsys):
    spec = copy.deepcopy(PPO)
    spec['env']['max_frame'] = 128
    spec['meta'].update(log_frequency=64, eval_frequency=64)
    child = slm_lab.run(spec, 'student', data_dir=str(tmp_path / 'data'), warm_start=four_seeds.run_dir).run_dir
    assert main(['report', f'{four_seeds.run_dir},{child}', '-o', str(tmp_path / 'r.md')]) == 0
    printed = capsys.readouterr().out
    assert f'warm start from {four_seeds.run_dir.name} (best)' in printed
    for args, needle in ((['report', str(tmp_path / 'nope')], 'no such run directory'),
                         (['report', f'{child}/t3'], 'has no trial 3'),
                         (['report', str(child), '-o', str(tmp_path / 'missing' / 'r.md')], 'does not exist')):
        assert main(args) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
