"""bench/benchmark.py's scores: final_ma (the last row) and slm_ma, SLM-Lab's session score (the
mean of the last 100 rows' 100-episode moving average), and --score on kept runs."""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / 'bench'))
import benchmark  # noqa: E402


def rows(mas: list[float]) -> list[dict]:
    return [{'frame': 100.0 * (i + 1), 'wall_t': 1.0 * (i + 1), 'total_reward_ma': ma} for i, ma in enumerate(mas)]


def test_slm_ma_is_the_mean_of_the_last_100_rows_without_empty_cells():
    assert benchmark.slm_lab_ma(rows([math.nan, 1.0, 3.0])) == 2.0
    mas = [float(i) for i in range(150)]  # rows 50..149 count
    assert benchmark.slm_lab_ma(rows(mas)) == pytest.approx(sum(range(50, 150)) / 100)
    assert math.isnan(benchmark.slm_lab_ma(rows([math.nan])))
    r = benchmark.summarize('x', 0, rows(mas), 1.0, threshold=100.0)
    assert (r.final_ma, r.frames_to_threshold) == (149.0, 10100)


@pytest.mark.slow
@pytest.mark.subprocess
def test_score_prints_each_session_and_the_trials_mean(lab_run, make_spec):
    _, run = lab_run(make_spec('PPO', max_frame=400, log_frequency=50, max_session=2), 'scored')
    out = subprocess.run([sys.executable, str(REPO_ROOT / 'bench' / 'benchmark.py'), '--score', str(run)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    expected = []
    for s in (0, 1):
        df = pd.read_csv(run / 'info' / f'scored_t0_s{s}_session_df_train.csv')
        slm = df['total_reward_ma'].tail(100).mean()
        expected.append(slm)
        final = df['total_reward_ma'].iloc[-1]
        assert f'scored_t0_s{s}  frame 400  final_ma {final:,.2f}  slm_ma {slm:,.2f}' in out.stdout
    assert f'mean slm_ma of 2 sessions {sum(expected) / 2:,.2f}' in out.stdout


@pytest.mark.subprocess
def test_score_of_a_folder_without_runs_is_one_line_and_exit_2(tmp_path):
    out = subprocess.run([sys.executable, str(REPO_ROOT / 'bench' / 'benchmark.py'), '--score', str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.count('\n') == 1 and 'no info/' in out.stderr
