"""Resume never silently differs or loses what a run recorded: refusals that change nothing,
warnings (and records) for every way a continuation departs from the run that never stopped,
damaged data found before it is trained on, a diverged loss, and stop signals at the end."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import LabWarnings, tmpfs
from lab_helpers import (DQN, PPO, RUN_LAB, cli, run_dirs, run_in_process, run_in_process_with_output, train_csv,
                         tree_digest, write_spec, visible)

from slm_lab import lab
from slm_lab.persistence import snapshot as checkpoint
from slm_lab.lib.errors import ResumeError, TrainingDiverged
from slm_lab.persistence.model_file import load_model_file, save_model_file


def copy_spec(spec: dict, **env) -> dict:
    out = json.loads(json.dumps(spec))
    out['env'].update(env)
    return out


def flip_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if offset is None else offset] ^= 0xFF
    path.write_bytes(bytes(data))


def one_line_error(done: subprocess.CompletedProcess | str) -> str:
    """The error line of a command's stderr (of a process, or the text run_in_process read);
    warnings about damaged snapshots may come before it."""
    stderr = done if isinstance(done, str) else done.stderr
    lines = stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith('error:')]
    assert len(errors) == 1 and lines[-1] == errors[0] and 'Traceback' not in stderr, stderr
    return errors[0]


@pytest.mark.slow
def test_records_without_an_intact_snapshot_are_refused_and_left_alone(tmp_path, capsys, no_png):
    """The run trained, and refused, in this process (the refusals through run_in_process, the
    command line's code after the interpreter's start)."""
    spec_file = write_spec(tmp_path, 'nosnap', PPO)
    lab.run(spec_file, 'nosnap', 'train', ['env.max_frame=1000'], data_dir=str(tmp_path / 'data'))
    (run,) = run_dirs(tmp_path / 'data', 'nosnap')
    ckpt = run / 'ckpt' / 'nosnap_t0_s0'
    for snap in checkpoint.list_snapshots(ckpt):  # every snapshot damaged
        flip_byte(snap / checkpoint.STATE_FILE)
    before = tree_digest(run)
    code, err = run_in_process([spec_file, 'nosnap', 'train@latest', '-s', 'env.max_frame=2000'], tmp_path, capsys)
    assert code == 2, err
    line = one_line_error(err)
    assert 'session 0' in line and 'damaged' in line and 'start a new run' in line, line
    assert tree_digest(run) == before
    shutil.rmtree(run / 'ckpt')  # ckpt/ gone altogether
    before = tree_digest(run)
    code, err = run_in_process([spec_file, 'nosnap', 'train@latest', '-s', 'env.max_frame=2000'], tmp_path, capsys)
    assert code == 2 and 'no snapshot' in one_line_error(err)
    assert tree_digest(run) == before


def test_extending_max_frame_warns_of_each_schedule_it_moves(tmp_path):
    spec = json.loads(json.dumps(PPO))
    # slope (0.02 - 0.2) / 1000 = -0.00018 (an end_val of 0 would mean a constant 0.2, as in SLM-Lab)
    spec['agent']['algorithm']['clip_eps_spec'] = {'name': 'linear_decay', 'start_val': 0.2, 'end_val': 0.02,
                                                   'start_step': 0, 'end_step': 1000}
    spec['agent']['net']['lr_scheduler_spec'] = {'name': 'LinearToZero'}
    spec_file = write_spec(tmp_path, 'sched', spec)
    data = str(tmp_path / 'data')
    lab.run(spec_file, 'sched', 'train', ['env.max_frame=1000'], data_dir=data)
    (run,) = run_dirs(Path(data), 'sched')
    with LabWarnings() as warned:
        lab.run(spec_file, 'sched', 'train@latest', ['env.max_frame=2000'], data_dir=data)
    record = json.loads((run / 'sched_resumes.json').read_text())[-1]
    changes = {c['key']: c for c in record['schedule_changes']}
    lr = changes['agent.net.optim_spec.lr']
    assert lr['before']['0'] == 0.0 and lr['after']['0'] == pytest.approx(5e-4), lr
    assert 'LinearToZero' in lr['why']
    clip = changes['agent.algorithm.clip_eps_spec']
    assert clip['before']['0'] == clip['after']['0'] == 0.02
    assert 'stays at end_val 0.02' in clip['why'] and 'agent.algorithm.clip_eps_spec.end_step=2000' in clip['why']
    assert 'agent.algorithm.clip_eps_spec: at frame 1000' in warned.text
    assert 'agent.net.optim_spec.lr: at frame 1000 the value goes 0 -> 0.0005' in warned.text
    # the rule's remedy is allowed: stretch the schedule while extending again
    lab.run(spec_file, 'sched', 'train@latest', ['env.max_frame=3000',
                                                 'agent.algorithm.clip_eps_spec.end_step=3000'], data_dir=data)
    record = json.loads((run / 'sched_resumes.json').read_text())[-1]
    clip = {c['key']: c for c in record['schedule_changes']}['agent.algorithm.clip_eps_spec']
    # at frame 2000: max(0.2 - 0.18 * 2000 / 3000, 0.02) = 0.08
    assert clip['before']['0'] == 0.02 and clip['after']['0'] == pytest.approx(0.08), clip
    assert not record['forced']
    assert train_csv(run, 'sched')['frame'].iloc[-1] == 3000


def test_dqn_without_snapshot_replay_resumes_approximately_and_says_so(tmp_path):
    spec = json.loads(json.dumps(DQN))
    spec['meta']['snapshot_replay'] = False
    spec_file = write_spec(tmp_path, 'refill', spec)
    data = str(tmp_path / 'data')
    lab.run(spec_file, 'refill', 'train', ['env.max_frame=1000'], data_dir=data)
    with LabWarnings() as warned:
        lab.run(spec_file, 'refill', 'train@latest', ['env.max_frame=1500'], data_dir=data)
    (run,) = run_dirs(Path(data), 'refill')
    assert 'replay memory was not in the snapshot' in warned.text and 'approximate' in warned.text
    session_record = json.loads((run / 'info' / 'refill_t0_s0_resumes.json').read_text())[-1]
    assert session_record['exact'] is False
    assert any('snapshot_replay' in r for r in session_record['approximate'])
    run_record = json.loads((run / 'refill_resumes.json').read_text())[-1]
    assert 'snapshot_replay' in run_record['approximate']['0'][0]


@pytest.mark.slow
def test_a_state_that_fails_to_load_changes_nothing(tmp_path, capsys, no_png):
    spec_file = write_spec(tmp_path, 'misfit', DQN)
    lab.run(spec_file, 'misfit', 'train', ['env.max_frame=1000'], data_dir=str(tmp_path / 'data'))
    (run,) = run_dirs(tmp_path / 'data', 'misfit')
    before = tree_digest(run)
    code, err = run_in_process([spec_file, 'misfit', 'train@latest', '-s', 'env.max_frame=2000', '-s', 'env.num_envs=4',
                                '--force'], tmp_path, capsys)
    assert code == 2 and 'does not fit this spec' in one_line_error(err)
    assert tree_digest(run) == before


def test_a_flipped_byte_in_a_replay_array_falls_back_to_the_previous_snapshot(tmp_path, monkeypatch, no_png):
    monkeypatch.setattr(checkpoint, 'ARRAY_FILE_MIN_BYTES', 1024)  # so this small replay gets .npy files
    spec = json.loads(json.dumps(DQN))
    spec['meta'].update({'keep_checkpoints': 3, 'log_frequency': 500, 'checkpoint_frequency': 500})
    spec_file = write_spec(tmp_path, 'flip', spec)
    data = str(tmp_path / 'data')
    lab.run(spec_file, 'flip', 'train', ['env.max_frame=1500'], data_dir=data)
    (run,) = run_dirs(Path(data), 'flip')
    ckpt = run / 'ckpt' / 'flip_t0_s0'
    newest = checkpoint.list_snapshots(ckpt)[0]
    array = newest / 'agent.memory.states.npy'
    assert array.is_file()
    flip_byte(array, offset=array.stat().st_size - 8)  # in the data, past the .npy header
    with LabWarnings() as warned:
        lab.run(spec_file, 'flip', 'train@latest', ['env.max_frame=2500'], data_dir=data)
    assert 'fails its checksum' in warned.text or 'damaged' in warned.text, warned.text
    records = json.loads((run / 'info' / 'flip_t0_s0_resumes.json').read_text())
    assert len(records) == 1 and records[0]['frame'] == 1000, records  # the attempt from 1500 left no record
    assert 'kept as f000000001500.damaged' in warned.text
    assert train_csv(run, 'flip')['frame'].tolist() == [500, 1000, 1500, 2000, 2500]
    for snap in checkpoint.list_snapshots(ckpt):  # what was saved since verifies in full
        checkpoint.verify_snapshot(snap, full=True)


def test_best_weights_from_a_discarded_future_are_kept_aside(tmp_path, no_png):
    spec = json.loads(json.dumps(DQN))
    spec['meta'].update({'snapshot_replay': False, 'keep_checkpoints': 5})
    spec_file = write_spec(tmp_path, 'future', spec)
    data = str(tmp_path / 'data')
    lab.run(spec_file, 'future', 'train', ['env.max_frame=2000'], data_dir=data)
    (run,) = run_dirs(Path(data), 'future')
    best_path = run / 'model' / 'future_t0_s0_model_best.pt'
    best, _ = load_model_file(best_path)
    # as after a crash between saving a better model_best.pt and the next snapshot
    best['frame'], best['total_reward_ma'] = 1900, 1e6
    save_model_file(best_path, best)
    for snap in checkpoint.list_snapshots(run / 'ckpt' / 'future_t0_s0'):
        if int(snap.name[1:]) > 1000:
            shutil.rmtree(snap)
    lab.run(spec_file, 'future', 'train@latest', ['env.max_frame=2000'], data_dir=data)
    aside = run / 'model' / 'future_t0_s0_model_best_discarded_f1900.pt'
    assert aside.is_file() and torch.load(aside, weights_only=True)['total_reward_ma'] == 1e6
    restored = torch.load(best_path, weights_only=True)
    assert restored['frame'] <= 2000 and restored['total_reward_ma'] < 1e6


@pytest.mark.slow
def test_a_loss_that_becomes_non_finite_stops_the_session_in_one_line(tmp_path, capsys, no_png):
    """The command line's code in this process (run_in_process): a trial of one session trains in
    the lab's process."""
    spec = json.loads(json.dumps(DQN))
    spec['agent']['net']['optim_spec'] = {'name': 'SGD', 'lr': 1e30}
    spec['meta'].update({'log_frequency': 50, 'checkpoint_frequency': 50})
    spec_file = write_spec(tmp_path, 'diverge', spec)
    code, err = run_in_process([spec_file, 'diverge', 'train', '-s', 'env.max_frame=3000'], tmp_path, capsys)
    assert code == TrainingDiverged.exit_code, err
    line = one_line_error(err)
    assert 'training diverged at frame' in line and 'train@' in line, line
    (run,) = run_dirs(tmp_path / 'data', 'diverge')
    snaps = checkpoint.list_snapshots(run / 'ckpt' / 'diverge_t0_s0')
    assert snaps
    state, _ = checkpoint.load_snapshot(snaps[0])
    for net in state['agent']['algorithm']['nets'].values():
        assert all(torch.isfinite(t).all() for t in net.values())
    # the snapshot before the divergence continues under a changed spec
    code, err = run_in_process([spec_file, 'diverge', 'train@latest', '-s', 'env.max_frame=3000',
                                '-s', 'agent.net.optim_spec.lr=0.001', '--force'], tmp_path, capsys)
    assert code == 0, err
    assert train_csv(run, 'diverge')['frame'].iloc[-1] == 3000


STOP_DURING = '''
import os, signal, sys
sys.path.insert(0, {root!r})
from slm_lab.experiment import analysis
original = analysis.{fn}
def stop_here(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)  # as if it arrived while the final files are written
    return original(*args, **kwargs)
analysis.{fn} = stop_here
sys.argv = ['run_lab.py', {spec_file!r}, {name!r}, 'train']
import runpy
runpy.run_path({run_lab!r}, run_name='__main__')
'''


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize('fn,missing', [
    ('calc_session_metrics', ['info/stopsess_t0_s0_session_metrics.json', 'info/stopsess_t0_trial_metrics.json',
                              'graph/stopsess_t0_trial_graph.html']),
    ('calc_trial_metrics', ['info/stoptrial_t0_trial_metrics.json', 'graph/stoptrial_t0_trial_graph.html'])])
def test_a_stop_while_final_files_are_written_ends_resumable(tmp_path, fn, missing, capsys, no_png):
    """SIGTERM after max_frame, while the session's or the trial's final files are written: exit
    143, the run resumable; train@latest of the finished run (here in this process, run_in_process)
    writes what is missing."""
    name = 'stopsess' if fn == 'calc_session_metrics' else 'stoptrial'
    spec = copy_spec(PPO, max_frame=1000)
    spec_file = write_spec(tmp_path, name, spec)
    script = STOP_DURING.format(root=str(Path(RUN_LAB).parent), fn=fn, spec_file=spec_file, name=name,
                                run_lab=RUN_LAB)
    done = subprocess.run([sys.executable, '-c', script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, 'BROWSER_PATH': '/dev/null/none'})
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    (run,) = run_dirs(tmp_path / 'data', name)
    assert not any((run / m).exists() for m in missing), missing
    code, out, err = run_in_process_with_output([spec_file, name, 'train@latest'], tmp_path, capsys)
    assert code == 0, err
    assert 'already finished' in out and 'completed its missing final files' in out, out
    assert all((run / m).is_file() for m in missing)
    assert train_csv(run, name)['frame'].iloc[-1] == 1000


def test_latest_skips_a_run_directory_that_never_got_its_spec(tmp_path):
    spec_file = write_spec(tmp_path, 'half', PPO)
    data = tmp_path / 'data'
    lab.run(spec_file, 'half', 'train', ['env.max_frame=1000'], data_dir=str(data))
    (run,) = run_dirs(data, 'half')
    (data / 'half_2099_01_01_000000' / 'info').mkdir(parents=True)  # killed while being created
    with LabWarnings() as warned:
        lab.run(spec_file, 'half', 'train@latest', ['env.max_frame=1500'], data_dir=str(data))
    assert 'skipping' in warned.text and 'half_2099_01_01_000000' in warned.text
    assert train_csv(run, 'half')['frame'].iloc[-1] == 1500


@pytest.fixture(scope='module')
def badspec_run(tmp_path_factory) -> Path:
    """A finished 500-frame PPO run, trained once and copied by each test that damages it."""
    root = tmp_path_factory.mktemp('badspec')
    lab.run(write_spec(root, 'badspec', PPO), 'badspec', 'train', ['env.max_frame=500'], data_dir=str(root / 'data'))
    (run,) = run_dirs(root / 'data', 'badspec')
    return run


@pytest.mark.slow
@pytest.mark.parametrize('content', ['[]', '{}', '{"agent": {}, "env": {}, "meta": 5}', 'not json'])
def test_a_damaged_run_spec_is_one_line(tmp_path, badspec_run, content, capsys):
    """Refused by the command line's code in this process (run_in_process)."""
    spec_file = write_spec(tmp_path, 'badspec', PPO)
    run = tmp_path / 'data' / badspec_run.name
    shutil.copytree(badspec_run, run)
    (run / 'badspec_spec.json').write_text(content)
    before = tree_digest(run)
    code, err = run_in_process([spec_file, 'badspec', 'train@latest', '-s', 'env.max_frame=1000'], tmp_path, capsys)
    assert code == 2 and 'badspec_spec.json' in one_line_error(err)
    assert tree_digest(run) == before


@pytest.mark.parametrize('log', ['badlog_resumes.json', 'info/badlog_t0_s0_resumes.json'])
def test_a_damaged_resume_log_is_one_line(tmp_path, log):
    spec_file = write_spec(tmp_path, 'badlog', PPO)
    data = str(tmp_path / 'data')
    lab.run(spec_file, 'badlog', 'train', ['env.max_frame=500'], data_dir=data)
    (run,) = run_dirs(Path(data), 'badlog')
    (run / log).write_text('{"format_version": 1}')
    before = tree_digest(run)
    with pytest.raises(ResumeError, match=log.split('/')[-1]):
        lab.run(spec_file, 'badlog', 'train@latest', ['env.max_frame=1000'], data_dir=data)
    assert tree_digest(run) == before


@pytest.mark.slow
def test_a_diverged_session_of_several_is_one_line(tmp_path, capsys, no_png):
    """The command line's code in this process (run_in_process); the sessions in processes of
    their own, as ever for a trial of several."""
    spec = json.loads(json.dumps(DQN))
    spec['agent']['net']['optim_spec'] = {'name': 'SGD', 'lr': 1e30}
    spec['meta'].update({'log_frequency': 50, 'checkpoint_frequency': 50, 'max_session': 2})
    spec_file = write_spec(tmp_path, 'diverge2', spec)
    code, err = run_in_process([spec_file, 'diverge2', 'train', '-s', 'env.max_frame=3000'], tmp_path, capsys)
    assert code == TrainingDiverged.exit_code, err
    assert 'training diverged at frame' in one_line_error(err)


@pytest.mark.slow
@pytest.mark.subprocess
def test_ctrl_c_is_named_sigint_in_every_session_log_and_said_once(tmp_path):
    """Ctrl-C to a run of 2 sessions: exit 130; each session's log names SIGINT (not the SIGTERM the
    lab stops them with), and the lab's console says it once (the sessions' processes, which it
    asks to stop, do not say it again), without a traceback."""
    spec = copy_spec(PPO, max_frame=10**7)
    spec['meta']['max_session'] = 2
    spec_file = write_spec(tmp_path, 'ctrlc', spec)
    proc = subprocess.Popen([sys.executable, RUN_LAB, spec_file, 'ctrlc', 'train'], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        logs = []
        while time.monotonic() < deadline:  # both sessions training: each wrote its first row
            runs = run_dirs(tmp_path / 'data', 'ctrlc')
            logs = [runs[0] / 'log' / f'ctrlc_t0_s{s}.log' for s in range(2)] if runs else []
            if logs and all(p.exists() and 'frame 500/' in p.read_text() for p in logs):
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)  # what a terminal's Ctrl-C sends the lab
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.count('SIGINT received') == 1, err
    assert 'Traceback' not in err
    for log in logs:
        text = log.read_text()
        assert 'SIGINT received' in text and 'SIGTERM' not in text, text[-500:]


@pytest.mark.subprocess
def test_a_new_run_directory_appears_with_its_specs_and_old_leftovers_go(tmp_path):
    dead = subprocess.Popen([sys.executable, '-c', 'pass'])
    dead.wait()
    data = tmp_path / 'data'
    leftover = data / f'.made_2000_01_01_000000.tmp-{dead.pid}'  # a lab killed while creating its run
    (leftover / 'info').mkdir(parents=True)
    spec_file = write_spec(tmp_path, 'made', PPO)
    lab.run(spec_file, 'made', 'train', ['env.max_frame=500'], data_dir=str(data))
    assert not leftover.exists()
    (run,) = run_dirs(data, 'made')
    assert (run / 'made_spec.json').is_file() and (run / 'made_t0_s0_spec.json').is_file()
    assert [p.name for p in visible(data)] == [run.name]


def test_a_run_stopped_after_its_first_step_resumes(tmp_path, monkeypatch, no_png):
    from slm_lab.experiment.signals import StopSignal
    from slm_lab.lib.errors import Preempted
    install = StopSignal.install

    def stopped_at_once(self):  # as if SIGTERM arrived while the session started
        install(self)
        self.signum = signal.SIGTERM
        return self
    spec_file = write_spec(tmp_path, 'first', copy_spec(PPO, num_envs=1))
    data = str(tmp_path / 'data')
    monkeypatch.setattr(StopSignal, 'install', stopped_at_once)
    with pytest.raises(Preempted, match='at frame 1;'):
        lab.run(spec_file, 'first', 'train', ['env.max_frame=500'], data_dir=data)
    monkeypatch.setattr(StopSignal, 'install', install)
    lab.run(spec_file, 'first', 'train@latest', ['env.max_frame=500'], data_dir=data)
    (run,) = run_dirs(Path(data), 'first')
    assert train_csv(run, 'first')['frame'].iloc[-1] == 500


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_full_disk_stops_a_run_in_one_line_and_it_resumes_once_there_is_space(tmp_path, no_png):
    """The run that fills the disk in a process of its own (its one line, its exit code); the resume
    once there is space in this one."""
    with tmpfs(tmp_path / 'data', '6m') as data:
        spec = json.loads(json.dumps(DQN))
        spec['agent']['memory']['max_size'] = 100000
        spec['meta'].update({'log_frequency': 1000, 'keep_checkpoints': 3})
        spec_file = write_spec(tmp_path, 'full', spec)
        done = cli([spec_file, 'full', 'train', '-s', 'env.max_frame=20000'], cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert one_line_error(done).startswith('error: disk full:'), done.stderr
        assert 'snapshot' in one_line_error(done), done.stderr  # the disk filled up mid-run, at a snapshot
        assert not [p for p in data.rglob('*') if '.tmp' in p.name], 'partial files left behind'
        subprocess.run(['mount', '-o', 'remount,size=64m', str(data)], check=True)
        lab.run(spec_file, 'full', 'train@latest', data_dir=str(data))
        (run,) = run_dirs(data, 'full')
        assert train_csv(run, 'full')['frame'].iloc[-1] == 20000


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_crash_before_the_first_scheduled_snapshot_resumes(tmp_path, no_png):
    """Rows are written before the first snapshot of checkpoint_frequency: the snapshot taken
    before the first step still lets the run continue (from frame 0, here in this process) after a
    SIGKILL."""
    spec_file = write_spec(tmp_path, 'early', copy_spec(PPO, max_frame=10**7))
    proc = subprocess.Popen([sys.executable, RUN_LAB, spec_file, 'early', 'train',
                             '-s', 'meta.checkpoint_frequency=10000000'],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            runs = run_dirs(tmp_path / 'data', 'early')
            if runs and (runs[0] / 'info' / 'early_t0_s0_session_df_train.csv').exists():
                break
            time.sleep(0.1)
        proc.kill()
    finally:
        proc.wait()
    (run,) = run_dirs(tmp_path / 'data', 'early')
    assert [s.name for s in checkpoint.list_snapshots(run / 'ckpt' / 'early_t0_s0')] == ['f000000000000']
    lab.run(spec_file, 'early', 'train@latest', ['env.max_frame=1000'], data_dir=str(tmp_path / 'data'))
    assert train_csv(run, 'early')['frame'].tolist() == [500, 1000]


def test_extending_linear_to_zero_moves_the_rate_from_the_first_resumed_update(tmp_path, no_png):
    from slm_lab.experiment.session import Session
    from slm_lab.persistence.run_dir import RunDir
    from slm_lab.spec import load_spec
    spec = json.loads(json.dumps(PPO))  # 4 envs x time_horizon 32: an update every 128 frames
    spec['agent']['net']['lr_scheduler_spec'] = {'name': 'LinearToZero'}
    spec_file = write_spec(tmp_path, 'ltz', spec)
    data = str(tmp_path / 'data')
    lab.run(spec_file, 'ltz', 'train', ['env.max_frame=1000'], data_dir=data)
    (run,) = run_dirs(Path(data), 'ltz')
    state, _ = checkpoint.load_snapshot(checkpoint.list_snapshots(run / 'ckpt' / 'ltz_t0_s0')[0])
    longer = load_spec(spec_file, 'ltz', ['env.max_frame=2000', 'meta.random_seed=7'])
    session = Session(longer, RunDir(run, 'ltz'))
    try:
        session.load_state_dict(state, quiet=True)
        last_update = 892  # the 7th update (7 x 128 frames) runs before that step's frames are counted
        assert session.agent.algorithm.current_lr() == pytest.approx(1e-3 * (1 - last_update / 2000))
    finally:
        session.close()


def test_a_key_a_newer_lab_added_is_not_an_edit(tmp_path):
    spec_file = write_spec(tmp_path, 'newkey', PPO)
    data = str(tmp_path / 'data')
    lab.run(spec_file, 'newkey', 'train', ['env.max_frame=500'], data_dir=data)
    (run,) = run_dirs(Path(data), 'newkey')
    for path in run.glob('newkey*_spec.json'):  # as written by a lab that did not know these keys yet
        saved = json.loads(path.read_text())
        del saved['agent']['algorithm']['clip_vloss'], saved['meta']['keep_checkpoints']
        path.write_text(json.dumps(saved))
    lab.run(spec_file, 'newkey', 'train@latest', ['env.max_frame=1000'], data_dir=data)
    assert train_csv(run, 'newkey')['frame'].iloc[-1] == 1000
    assert json.loads((run / 'newkey_resumes.json').read_text())[-1]['spec_diff'] == [
        {'key': 'env.max_frame', 'old': 500, 'new': 1000}]


def test_a_run_made_before_clip_obs_existed_resumes_without_clipping(tmp_path):
    """clip_obs / clip_reward default to 10 with normalisation on (SLM-Lab v5); a run whose saved
    spec predates them ran unclipped, and resumes unclipped without --force."""
    spec = json.loads(json.dumps(PPO))
    spec['env'].update({'normalize_obs': True, 'normalize_reward': True})
    spec_file = write_spec(tmp_path, 'preclip', spec)
    data = str(tmp_path / 'data')
    lab.run(spec_file, 'preclip', 'train', ['env.max_frame=500'], data_dir=data)
    (run,) = run_dirs(Path(data), 'preclip')
    for path in run.glob('preclip*_spec.json'):
        saved = json.loads(path.read_text())
        assert saved['env']['clip_obs'] == 10
        del saved['env']['clip_obs'], saved['env']['clip_reward']
        path.write_text(json.dumps(saved))
    lab.run(spec_file, 'preclip', 'train@latest', ['env.max_frame=1000'], data_dir=data)
    saved = json.loads((run / 'preclip_spec.json').read_text())
    assert saved['env']['clip_obs'] is None and saved['env']['clip_reward'] is None
    assert train_csv(run, 'preclip')['frame'].iloc[-1] == 1000


# --- damaged snapshots passed over (issue 27) ----------------------------------------------------

SKIP = 'skipped'


@pytest.fixture(scope='module')
def skipping_run(tmp_path_factory) -> tuple[Path, str]:
    """A PPO run of two sessions to frame 2000, its snapshots at 1000, 1500 and 2000 kept, trained
    once and copied by each test that damages it: (run, spec file)."""
    root = tmp_path_factory.mktemp('skipping')
    spec = copy_spec(PPO, max_frame=2000)
    spec['meta'].update(keep_checkpoints=3, max_session=2)
    spec_file = write_spec(root, SKIP, spec)
    lab.run(spec_file, SKIP, 'train', data_dir=str(root / 'data'))
    (run,) = run_dirs(root / 'data', SKIP)
    return run, spec_file


def _rename_newest(snap: Path) -> str:
    snap.rename(snap.with_name('f000000002500'))
    return 'f000000002500'


def _replace_newest(snap: Path) -> str:
    shutil.rmtree(snap)
    shutil.copytree(snap.with_name('f000000001000'), snap)
    return snap.name


DAMAGES = {  # how the newest snapshot (f2000) is damaged -> (the name it then has, what the lab says of it)
    'flipped byte in state.pt': (lambda s: flip_byte(s / checkpoint.STATE_FILE) or s.name,
                                 'state.pt fails its checksum'),
    'damaged manifest': (lambda s: (s / checkpoint.MANIFEST).write_text('{"format') and s.name, 'manifest'),
    'deleted manifest': (lambda s: (s / checkpoint.MANIFEST).unlink() or s.name, 'manifest missing'),
    'renamed directory': (_rename_newest, 'does not match the directory name'),
    'replaced directory': (_replace_newest, 'does not match the directory name'),
}


# every damage once, two to a resume (one in each session), and a resume with session 0 intact: each
# resume of the two-session run starts two session processes (seconds each)
DAMAGE_PAIRS = [('flipped byte in state.pt', 'damaged manifest'), ('deleted manifest', 'renamed directory'),
                (None, 'replaced directory')]


@pytest.mark.slow
@pytest.mark.parametrize('damages', DAMAGE_PAIRS, ids=[f'{a or "intact"} + {b}' for a, b in DAMAGE_PAIRS])
def test_a_damaged_snapshot_passed_over_is_said_recorded_and_set_aside(tmp_path, skipping_run, damages, no_png,
                                                                       capfd):
    """train@latest continues each session whose newest snapshot (f2000) is damaged (damages: session
    0's, session 1's; None: intact) from its older intact snapshot, and says which one it skipped
    and why: on the console, in the session's log and in its resume record; the damaged one is set
    aside as f{frame}.damaged (renamed: not overwritten by the session's next save of that frame). An
    intact session continues from f2000 and says nothing. The sessions run in their own processes,
    which read what the lab read."""
    assert sorted(d for pair in DAMAGE_PAIRS for d in pair if d) == sorted(DAMAGES)  # every damage is tried
    template, spec_file = skipping_run
    run = Path(shutil.copytree(template, tmp_path / 'data' / template.name))
    names = {s: DAMAGES[damage][0](run / 'ckpt' / f'{SKIP}_t0_s{s}' / 'f000000002000')
             for s, damage in enumerate(damages) if damage}
    capfd.readouterr()
    lab.run(spec_file, SKIP, 'train@latest', ['env.max_frame=2500'], data_dir=str(run.parent))
    console = capfd.readouterr().err
    for s, damage in enumerate(damages):
        log = (run / 'log' / f'{SKIP}_t0_s{s}.log').read_text()
        record = json.loads((run / 'info' / f'{SKIP}_t0_s{s}_resumes.json').read_text())[-1]
        if damage is None:
            assert 'skipped damaged' not in log and f'{SKIP}_t0_s{s}: skipped damaged' not in console
            assert record['frame'] == 2000, record
            continue
        name, said = names[s], DAMAGES[damage][1]
        line = f'{SKIP}_t0_s{s}: skipped damaged snapshot {name} ('
        for text in (console, log):
            assert line in text, text
            said_line = text.split(line, 1)[1].splitlines()[0]
            assert said in said_line and f'kept as {name}.damaged; continuing from f000000001500' in said_line, \
                said_line
        assert record['frame'] == 1500 and record['fell_back_from'] == [name], record
        (skipped,) = record['damaged_skipped']
        assert skipped['snapshot'] == name and said in skipped['problem'] and skipped['kept_as'] == f'{name}.damaged'
    for s in (0, 1):
        frames = pd.read_csv(run / 'info' / f'{SKIP}_t0_s{s}_session_df_train.csv')['frame'].tolist()
        assert frames == [500, 1000, 1500, 2000, 2500], (s, frames)


@pytest.mark.slow
def test_a_damaged_snapshot_passed_over_is_said_on_the_console_of_one_session(tmp_path, no_png, capsys):
    """The same for a trial of one session (in the lab's process), through the command line (its
    code in this process, run_in_process, the console read here); the damaged snapshot is set aside
    as it is, and resuming again does not pass over it again."""
    spec = copy_spec(PPO, max_frame=2000)
    spec['meta']['keep_checkpoints'] = 5
    one = write_spec(tmp_path, SKIP, spec)
    lab.run(one, SKIP, 'train', data_dir=str(tmp_path / 'data'))  # the run to damage, in this process
    (run,) = run_dirs(tmp_path / 'data', SKIP)
    ckpt = run / 'ckpt' / f'{SKIP}_t0_s0'
    flip_byte(ckpt / 'f000000002000' / checkpoint.STATE_FILE)
    damaged_bytes = (ckpt / 'f000000002000' / checkpoint.STATE_FILE).read_bytes()
    # to frame 1900: the resumed session's last snapshot is older than the damaged one, which stays
    code, err = run_in_process([one, SKIP, 'train@latest', '-s', 'env.max_frame=1900', '-s', 'meta.log_frequency=100'],
                               tmp_path, capsys)
    assert code == 0, err
    assert (f'{SKIP}_t0_s0: skipped damaged snapshot f000000002000 (state.pt fails its checksum); it is kept as '
            'f000000002000.damaged; continuing from f000000001500') in err, err
    aside = ckpt / 'f000000002000.damaged'
    assert (aside / checkpoint.STATE_FILE).read_bytes() == damaged_bytes
    assert not (ckpt / 'f000000002000').exists()
    code, err = run_in_process([one, SKIP, 'train@latest', '-s', 'env.max_frame=2000', '-s', 'meta.log_frequency=100'],
                               tmp_path, capsys)
    assert code == 0 and 'frame 2000/' in err, err  # the lab's console, read here
    assert 'skipped damaged' not in err, err


@pytest.fixture(scope='module')
def recorded_run(tmp_path_factory) -> tuple[Path, str]:
    """A PPO run trained to frame 1000 and resumed once to 1500: (run, spec file)."""
    root = tmp_path_factory.mktemp('recorded')
    spec_file = write_spec(root, 'recorded', PPO)
    lab.run(spec_file, 'recorded', 'train', ['env.max_frame=1000'], data_dir=str(root / 'data'))
    lab.run(spec_file, 'recorded', 'train@latest', ['env.max_frame=1500'], data_dir=str(root / 'data'))
    (run,) = run_dirs(root / 'data', 'recorded')
    return run, spec_file


@pytest.mark.slow
@pytest.mark.parametrize('deleted,told_by', [
    (['ckpt', 'info', 'model'], 'tb/recorded_t0_s0, its TensorBoard records'),
    (['ckpt', 'info', 'model', 'tb'], 'log/recorded_t0_s0.log, which logs a record at frame 500'),
    (['ckpt', 'info', 'model', 'tb', 'log'], 'recorded_resumes.json, which records frame 1000'),
])
def test_a_run_whose_records_were_deleted_is_not_started_over(tmp_path, recorded_run, deleted, told_by, capsys):
    """Before: train@ after ckpt/, info/ and model/ were deleted started the run again from frame
    0 (exit 0, 'no snapshot to resume from (nothing recorded yet)'). What the run still holds
    tells that it had progressed: refused in one line naming what is missing, nothing written (by
    the command line's code in this process, run_in_process)."""
    template, spec_file = recorded_run
    run = Path(shutil.copytree(template, tmp_path / 'data' / template.name))
    for sub in deleted:
        shutil.rmtree(run / sub)
    before = (tree_digest(run), sorted(p.name for p in run.rglob('*')))
    code, err = run_in_process([spec_file, 'recorded', 'train@latest', '-s', 'env.max_frame=2000'], tmp_path, capsys)
    assert code == 2, err
    line = one_line_error(err)
    assert f'session 0 of data/{run.name} has recorded progress (data/{run.name}/{told_by})' in line, line
    assert 'it has no snapshot (ckpt/, info/ and model/ are missing from the run)' in line, line
    assert 'start a new run' in line and 'left unchanged' in line, line
    assert (tree_digest(run), sorted(p.name for p in run.rglob('*'))) == before
