"""`train --run-dir DIR`, the one command a job scheduler runs again after each preemption: it
starts the run, continues it after any stop, and exits 0 at once when the run is finished."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lab_helpers import PPO, RUN_LAB, assert_same_run, cli, lab_env, run_in_process, train_csv, visible, write_spec

from slm_lab import lab
from slm_lab.persistence import snapshot as checkpoint

NAME = 'job'


def job_spec() -> dict:
    spec = json.loads(json.dumps(PPO))
    spec['env']['max_frame'] = 8000
    spec['meta'].update({'log_frequency': 500, 'checkpoint_frequency': 500})
    return spec


def snapshots(run: Path) -> list[str]:
    ckpt = run / 'ckpt' / f'{NAME}_t0_s0'
    return [p.name for p in checkpoint.list_snapshots(ckpt)] if ckpt.is_dir() else []


def start_and_stop(args: list[str], cwd: Path, log: Path, condition, signum: int) -> int:
    """Start the command, send `signum` once condition() holds; its exit code."""
    with open(log, 'w') as stderr:  # a file, not a pipe: a full pipe would stall the run
        proc = subprocess.Popen([sys.executable, RUN_LAB, *args], cwd=cwd, stdout=subprocess.DEVNULL, stderr=stderr,
                                env=lab_env())
        deadline = time.monotonic() + 120
        while not condition():
            if proc.poll() is not None:
                pytest.fail(f'the run ended (exit {proc.returncode}) before the stop point: {log.read_text()}')
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail('the stop point never came')
            time.sleep(0.01)
        proc.send_signal(signum)
        return proc.wait(timeout=60)


@pytest.mark.slow
@pytest.mark.subprocess
def test_one_command_starts_continues_and_completes_the_run(tmp_path, no_png, capsys):
    """run, SIGKILL, run, SIGTERM, run == one straight run; a fourth run exits 0 at once. The runs
    that are stopped in processes of their own (a signal ends a process); the third, which completes
    the run, by the command's own code in this process (run_in_process), as the run that never
    stopped."""
    spec_file = write_spec(tmp_path, NAME, job_spec())
    run = tmp_path / 'jobs' / 'job_1'
    command = [spec_file, NAME, 'train', '--run-dir', str(run)]
    assert start_and_stop(command, tmp_path, tmp_path / 'kill.log', lambda: len(snapshots(run)) >= 2,
                          signal.SIGKILL) == -signal.SIGKILL
    resumed_from = snapshots(run)[0]
    code = start_and_stop(command, tmp_path, tmp_path / 'term.log',
                          lambda: bool(snapshots(run)) and snapshots(run)[0] != resumed_from, signal.SIGTERM)
    assert code == 143, (tmp_path / 'term.log').read_text()
    said = (tmp_path / 'term.log').read_text()
    assert 'stopped: stopped by SIGTERM' in said
    # train@latest does not look in a --run-dir: the line names the command that continues it
    last = said.strip().splitlines()[-1]
    assert last.startswith('stopped: ') and last.endswith(f'continue with the same command (train --run-dir {run})')
    code, err = run_in_process(command, tmp_path, capsys)
    assert code == 0, err
    # both stops were resumes of the one run directory, nothing else was made beside it
    assert [p.name for p in visible(run.parent)] == ['job_1']
    assert len(json.loads((run / f'{NAME}_resumes.json').read_text())) == 2
    t0 = time.monotonic()
    fourth = cli(command, cwd=tmp_path)
    assert fourth.returncode == 0, fourth.stderr
    assert 'already finished at frame 8000' in fourth.stdout
    assert time.monotonic() - t0 < 30
    # the run that never stopped, for the comparison: in this process (the same code as the command)
    lab.run(spec_file, NAME, 'train', run_dir=str(tmp_path / 'straight'))
    assert_same_run(run, tmp_path / 'straight', NAME)


def test_run_dir_refusals_are_one_line(tmp_path):
    spec_file = write_spec(tmp_path, NAME, job_spec())
    other = tmp_path / 'other'
    other.mkdir()
    (other / 'notes.txt').write_text('not a run')
    for args, needle in (
            (['train@latest', '--run-dir', 'x'], '--run-dir names a train run'),
            (['train', '--run-dir', 'x', '--fork', 'y'], '--run-dir and --fork'),
            (['train', '--run-dir', str(other)], f'--run-dir {other}: {other} is not a run of spec {NAME}'),
            (['train', '--run-dir', str(other / 'notes.txt')], 'a file is there, not a directory')):
        out = cli([spec_file, NAME, *args], cwd=tmp_path)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and needle in lines[0], (args, out.stderr)
    assert [p.name for p in other.iterdir()] == ['notes.txt']


# Ctrl-C to a run of 2 sessions, said once on the console: test_resume_safety.py's
# test_ctrl_c_is_named_sigint_in_every_session_log_and_said_once (one run for both checks)


@pytest.mark.slow
@pytest.mark.subprocess
def test_two_jobs_on_one_run_dir_train_it_once(tmp_path):
    """Two copies of the command started together (a job requeued while its first copy still
    runs): one trains the run, the other is refused in one line and writes nothing; a directory
    the job script made empty beforehand is taken."""
    spec = job_spec()
    spec['env']['max_frame'] = 6000  # the first copy still trains when the second one checks the run
    spec_file = write_spec(tmp_path, NAME, spec)
    run = tmp_path / 'jobs' / 'job_2'
    run.mkdir(parents=True)  # as `mkdir -p` in a job script
    command = [sys.executable, RUN_LAB, spec_file, NAME, 'train', '--run-dir', str(run)]
    procs = [subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env=lab_env()) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    (refused,) = [err for code, err in results if code == 2]
    lines = refused.strip().splitlines()
    assert len(lines) == 1 and ('being trained by another process' in lines[0]
                                or 'started a run there at the same time' in lines[0]), refused
    assert [p.name for p in visible(run.parent)] == ['job_2']
    assert train_csv(run, NAME)['frame'].iloc[-1] == 6000
