"""A search you can watch: its console lines (a trial's start with its drawn values, its end with
status, frame and total_reward_ma, a summary each log interval; its first trial in the process
the driver started before Ray) and Ctrl-C (SIGINT to the whole foreground process group, as a
terminal sends it) stopping it with the lab's own lines only. The lines of a whole search are
checked on the search that never stopped of test_search.py's
test_a_search_killed_in_its_third_trial_resumes_to_the_search_that_never_stopped (check_search_lines),
which runs one anyway."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lab_helpers import RUN_LAB, lab_env
from test_search import NAME, run_dir, search_spec, write

pytestmark = pytest.mark.ray

pytest.importorskip('ray', reason='search mode needs the search extra')
pytest.importorskip('optuna', reason='search mode needs the search extra')


def test_a_continued_trials_history_prints_no_summaries_and_counts_toward_the_next(caplog):
    """A trial continued by search@/benchmark@ first replays its rows from before the command
    (HISTORY): they update its frame and best value without a summary line each (a resumed
    benchmark printed one per 500 frames of its past at once); its new rows print as before."""
    from slm_lab.experiment.search.study import HISTORY, METRIC, TIME_ATTR
    from slm_lab.experiment.search.watch import SearchWatch
    watch = SearchWatch(total=4, max_frame=10_000, log_frequency=500, label='benchmark')
    config = {'trial': 0, 'values': {}, 'replay': False}
    with caplog.at_level('INFO', logger='slm_lab.search'):
        watch.started(config)
        for frame in range(500, 5001, 500):
            watch.reported(config, {TIME_ATTR: frame, METRIC: frame / 100, HISTORY: True})
        assert [r.message for r in caplog.records if 'trials ended' in r.message] == []
        watch.reported(config, {TIME_ATTR: 5500, METRIC: 55.0})
    summaries = [r.message for r in caplog.records if 'trials ended' in r.message]
    assert summaries == ['benchmark: 0/4 trials ended, 1 running (t0 frame 5500) | best: trial 0 '
                         'total_reward_ma 55.00 at frame 5500']


def test_a_trial_that_finished_as_the_stop_came_ends_completed_not_stopped(caplog):
    """A stop signal that lands as a trial writes its final records: the trial finished (its
    continuation keeps it as 'finished before'), so its end line says completed, not 'stopped with
    a snapshot'; a trial that had not finished says stopped."""
    from slm_lab.experiment.search.study import METRIC, TIME_ATTR
    from slm_lab.experiment.search.watch import SearchWatch
    watch = SearchWatch(total=2, max_frame=4000, log_frequency=500, stopping=lambda: True, label='benchmark',
                        finished=lambda index: index == 0)
    with caplog.at_level('INFO', logger='slm_lab.search'):
        for index, frame in ((0, 3500), (1, 2000)):  # the report at max_frame waits for the trial's end
            config = {'trial': index, 'values': {}, 'replay': False, 'max_frame': 4000}
            watch.running.add(index)
            watch.reported(config, {TIME_ATTR: frame, METRIC: 10.0})
            watch.ended_as(config, error=False)
    assert watch.ended == {0: 'completed', 1: 'stopped with the benchmark, a snapshot saved (continue with '
                                              'benchmark@latest)'}


@pytest.mark.slow
@pytest.mark.subprocess
def test_ctrl_c_stops_a_search_with_the_labs_lines_only(tmp_path):
    spec_file = write(tmp_path, search_spec(max_trial=2, max_frame=8000))
    proc = subprocess.Popen([sys.executable, RUN_LAB, spec_file, NAME, 'search'], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=lab_env(),
                            start_new_session=True)  # its own process group, which Ctrl-C signals whole
    try:
        deadline, rows = time.time() + 300, 0
        while time.time() < deadline and proc.poll() is None and rows < 3:
            csv = list(Path(tmp_path).glob(f'data/{NAME}_*/info/{NAME}_t0_s0_session_df_train.csv'))
            rows = len(csv[0].read_text().splitlines()) - 1 if csv else 0
            time.sleep(0.05)
        assert proc.poll() is None, 'the search should be training its first trial'
        os.killpg(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, output[-3000:]
    assert 'Traceback' not in output and 'ERROR' not in output, output[-3000:]
    assert output.strip().splitlines()[-1] == \
        'stopped: stopped by SIGINT with the running trials saved in snapshots; continue with search@latest'
    assert re.search(r'trial 0 end: stopped with the search, a snapshot saved \(continue with search@latest\) '
                     r'\| frame \d+', output), output[-3000:]
    log = (run_dir(tmp_path) / 'log' / f'{NAME}_t0_s0.log').read_text()
    assert 'SIGINT received' in log and 'SIGTERM' not in log, log[-2000:]  # the user's Ctrl-C, as the console says
    said = next((line for line in log.splitlines() if 'with a snapshot; continue with search@' in line), '')
    assert said.endswith(str(run_dir(tmp_path).name)) and 'train@' not in log, log[-2000:]  # that search, by name


@pytest.mark.parametrize('exported', [None, '0.5'])
def test_tunes_slow_loop_warnings_stay_off_the_console_unless_the_user_asks(monkeypatch, exported):
    """Tune prints "The `on_step_begin` operation took 0.6 s, which may be a performance bottleneck"
    when its loop waits half a second (a loaded machine; seen in the CPU tier's console): the
    search's Ray environment raises the threshold before Tune is imported, and keeps one the user
    exported."""
    from slm_lab.experiment.search import driver
    environ = {k: v for k, v in os.environ.items() if k != 'TUNE_WARN_THRESHOLD_S'}
    if exported is not None:
        environ['TUNE_WARN_THRESHOLD_S'] = exported
    monkeypatch.setattr(os, 'environ', environ)  # the variables it sets stay out of this process
    monkeypatch.setattr(driver, '_OWN_TOKEN', None)
    driver.ray_environment(None)
    assert environ['TUNE_WARN_THRESHOLD_S'] == (exported or '3600')
    if exported is not None:
        return
    # Tune reads it when imported: a process with this environment has the threshold
    code = 'from ray.tune.utils.util import warn_if_slow; print(warn_if_slow.DEFAULT_THRESHOLD)'
    pytest.importorskip('ray')
    out = subprocess.run([sys.executable, '-c', code], env=environ, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and float(out.stdout.strip()) == 3600.0, out.stderr[-2000:]
