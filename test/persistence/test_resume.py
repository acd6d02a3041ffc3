"""Resume (train@) and replay (enjoy@) as a user relies on them: exact continuation, crash
safety, clear refusals that leave the run untouched."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from gymnasium.envs.classic_control import CartPoleEnv
from lab_helpers import (RUN_LAB, PPO, DQN, PENDULUM, write_spec, run_dirs, train_csv, tree_digest, cli,
                         run_in_process, run_in_process_with_output, check_resume_after_max_frame,
                         check_resume_after_sigterm)

from slm_lab import lab
from slm_lab.persistence import snapshot as checkpoint, snapshots as session_snapshots
from slm_lab.lib.errors import ResumeError


@pytest.mark.slow
def test_resume_after_max_frame_is_exact_with_normalised_observations_and_rewards(tmp_path):
    """Stopped at F by max_frame, resumed to 2F == one uninterrupted run of 2F; each algorithm's
    plain case is in test_exact_resume.py."""
    check_resume_after_max_frame(tmp_path, 'pendulum_exact', PENDULUM)


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize('name,spec', [('dqn_term', DQN)])
def test_resume_after_sigterm_is_exact(tmp_path, name, spec):
    """SIGTERM mid-run: exits promptly (within 30 s, loose for a loaded machine; the uninterrupted
    run takes minutes) with a snapshot at the current frame; train@latest
    continues to the same numbers and weights as an uninterrupted run. (PPO's case, the same check:
    test_tensorboard.py's test_a_sigterm_and_resume_leave_one_continuous_curve_and_continue_exactly,
    one stopped run for both.)"""
    check_resume_after_sigterm(tmp_path, name, spec)


@pytest.mark.slow
def test_extend_finished_run_then_finished_again(tmp_path, capsys):
    spec = json.loads(json.dumps(PPO))
    spec['env']['max_frame'] = 4000
    spec_file = write_spec(tmp_path, 'extend', spec)
    data = str(tmp_path / 'data')
    lab.run(spec_file, 'extend', 'train', data_dir=data)
    lab.run(spec_file, 'extend', 'train@latest', ['env.max_frame=8000'], data_dir=data)
    (run,) = run_dirs(Path(data), 'extend')
    frames = train_csv(run, 'extend')['frame']
    assert frames.is_monotonic_increasing and frames.is_unique
    assert frames.iloc[-1] == 8000 and frames.diff().max() <= 500
    saved = json.loads((run / 'extend_spec.json').read_text())
    assert saved['env']['max_frame'] == 8000
    records = json.loads((run / 'extend_resumes.json').read_text())
    assert records[-1]['spec_diff'] == [{'key': 'env.max_frame', 'old': 4000, 'new': 8000}]
    before = tree_digest(run)
    capsys.readouterr()
    assert lab.run(spec_file, 'extend', 'train@latest', ['env.max_frame=8000'], data_dir=data) is None
    assert 'already finished at frame 8000' in capsys.readouterr().out
    assert tree_digest(run) == before


@pytest.mark.slow
def test_refusals_are_one_line_and_leave_the_run_unchanged(tmp_path, capsys, no_png):
    """The run to refuse trained in this process (lab.run); the refusals and the final --force
    resume by the command line's code in this one too (run_in_process: the same code after the
    interpreter's start, one at a time), each refusal one line that starts with 'error:'; none
    changes the run."""
    spec_file = write_spec(tmp_path, 'refuse', PPO)
    lab.run(spec_file, 'refuse', 'train', ['env.max_frame=1000'], data_dir=str(tmp_path / 'data'))
    (run,) = run_dirs(tmp_path / 'data', 'refuse')
    before = tree_digest(run)
    cases = {
        'inconsistent edit': ([spec_file, 'refuse', 'train@latest', '-s', 'agent.algorithm.gamma=0.9',
                               '-s', 'agent.net.hid_layers=[64]'], ['agent.algorithm.gamma: 0.98 -> 0.9',
                                                                    'agent.net.hid_layers', '--force']),
        'lower max_frame': ([spec_file, 'refuse', 'train@latest', '-s', 'env.max_frame=500'], ['env.max_frame']),
        'missing run dir': ([spec_file, 'refuse', 'train@data/refuse_2000_01_01_000000'], ['no such run directory',
                                                                                        run.name]),
        'no run of spec': ([spec_file.replace('refuse', 'other'), 'other', 'train@latest'], ['no run of spec']),
        'missing enjoy spec': ([f'enjoy@{run}/refuse_t0_s9_spec.json'], ['not found']),
        "the run's spec to enjoy": ([f'enjoy@{run}/refuse_spec.json'], ['not of a session',
                                                                       f'enjoy@{run}/refuse_t0_s0_spec.json']),
        'a run named without data/': ([spec_file, 'refuse', f'train@{run.name}'],
                                      [f'did you mean train@data/{run.name}?']),
    }
    write_spec(tmp_path, 'other', PPO)
    for what, (args, needles) in cases.items():
        code, stderr = run_in_process(args, tmp_path, capsys)
        assert code != 0, what
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith('error:'), (what, stderr)
        for needle in needles:
            assert needle in lines[0], (what, lines[0])
    assert tree_digest(run) == before
    # --force resumes anyway and records the change
    code, err = run_in_process([spec_file, 'refuse', 'train@latest', '-s', 'env.max_frame=1500', '-s',
                                'agent.algorithm.gamma=0.9', '--force'], tmp_path, capsys)
    assert code == 0, err
    record = json.loads((run / 'refuse_resumes.json').read_text())[-1]
    assert record['forced'] and {'key': 'agent.algorithm.gamma', 'old': 0.98, 'new': 0.9} in record['spec_diff']


def test_train_at_latest_takes_the_newest_run_of_its_own_spec_file(tmp_path, capsys, no_png):
    """Two files may name a spec alike (SLM-Lab's ppo_cartpole and the demo's): train@latest with
    one file continues the newest run made from that file, not a newer run of the other; where no
    run of the name was made from it, the refusal of the edits names the run, the file it was made
    from and the command that continues it, and the run is untouched."""
    data = tmp_path / 'data'
    mine = tmp_path / 'a' / 'twin.json'
    theirs = tmp_path / 'b' / 'twin.json'
    third = tmp_path / 'c' / 'twin.json'
    for path, gamma in ((mine, 0.98), (theirs, 0.9), (third, 0.95)):
        path.parent.mkdir()
        path.write_text(json.dumps({'twin': {**PPO, 'env': {**PPO['env'], 'max_frame': 256},
                                             'agent': {**PPO['agent'],
                                                       'algorithm': {**PPO['agent']['algorithm'], 'gamma': gamma}}}}))
    lab.run(str(mine), 'twin', 'train', data_dir=str(data))
    (my_run,) = run_dirs(data, 'twin')
    time.sleep(1.1)  # run directories are named to the second
    lab.run(str(theirs), 'twin', 'train', data_dir=str(data))
    (their_run,) = set(run_dirs(data, 'twin')) - {my_run}
    theirs_before = tree_digest(their_run)
    lab.run(str(mine), 'twin', 'train@latest', ['env.max_frame=512'], data_dir=str(data))
    assert train_csv(my_run, 'twin')['frame'].iloc[-1] == 512
    assert tree_digest(their_run) == theirs_before
    code, err = run_in_process([str(third), 'twin', 'train@latest', '-s', 'env.max_frame=512'], tmp_path, capsys)
    line = err.strip().splitlines()[-1]
    assert code == 2 and line.startswith('error:'), err
    for needle in ('agent.algorithm.gamma: 0.9 -> 0.95', f'data/{their_run.name} was made from b/twin.json, '
                   'not c/twin.json', f'run_lab.py b/twin.json twin train@data/{their_run.name}'):
        assert needle in line, line
    assert tree_digest(their_run) == theirs_before


def wait_for(condition, proc: subprocess.Popen, log: Path, timeout: float = 90) -> None:
    """Poll condition() every 10 ms until it holds; fail if the process (whose stderr goes to `log`)
    ends or time runs out first."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f'the run ended (exit {proc.returncode}) before the kill point: {log.read_text()}')
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail('the kill point never came')
        time.sleep(0.01)


@pytest.mark.slow
@pytest.mark.subprocess
def test_sigkill_at_three_moments_then_resume(tmp_path, no_png):
    """SIGKILL mid-training, during a resume's start-up, and just after a snapshot is renamed into
    place (while pruning and record writes follow), each followed by train@latest: every resume
    succeeds and the finished run's records are continuous."""
    spec = json.loads(json.dumps(DQN))
    spec['env']['max_frame'] = 5000
    spec['meta'].update({'log_frequency': 250, 'checkpoint_frequency': 250})
    spec_file = write_spec(tmp_path, 'kill', spec)
    data = tmp_path / 'data'

    def run():
        (path,) = run_dirs(data, 'kill')
        return path

    def snapshots() -> list[str]:
        found = run_dirs(data, 'kill')
        return [p.name for p in checkpoint.list_snapshots(found[0] / 'ckpt' / 'kill_t0_s0')] if found else []

    def run_records() -> int:
        path = run() / 'kill_resumes.json'
        return len(json.loads(path.read_text())) if path.exists() else 0

    def newer_snapshot_than(name: str):
        return lambda: bool(snapshots()) and snapshots()[0] != name

    kill_points = [  # (mode, when to kill), each a moment the other two do not cover
        ('train', lambda: len(snapshots()) >= 2),
        ('train@latest', lambda: run_records() >= 1),
        ('train@latest', None),  # set below, once known: a snapshot newer than the one resumed from
    ]
    for i, (mode, condition) in enumerate(kill_points):
        condition = condition or newer_snapshot_than(snapshots()[0])
        log = tmp_path / f'kill{i}.log'  # a file, not a pipe: a full pipe would stall the run
        with open(log, 'w') as stderr:
            proc = subprocess.Popen([sys.executable, RUN_LAB, spec_file, 'kill', mode], cwd=tmp_path,
                                    stdout=subprocess.DEVNULL, stderr=stderr)
            wait_for(condition, proc, log)
            proc.kill()
            proc.wait()
        assert proc.returncode == -signal.SIGKILL, (i, log.read_text())
    lab.run(spec_file, 'kill', 'train@latest', data_dir=str(data))  # the last resume, in this process
    frames = train_csv(run(), 'kill')['frame']
    assert frames.is_monotonic_increasing and frames.is_unique, frames.tolist()
    assert frames.iloc[-1] == 5000 and frames.diff().max() <= 250
    # the last resume, and the one killed after its first new snapshot, loaded the session
    assert len(json.loads((run() / 'info' / 'kill_t0_s0_resumes.json').read_text())) >= 2


def test_damaged_newest_snapshot_falls_back(tmp_path):
    spec = json.loads(json.dumps(PPO))
    spec['meta']['keep_checkpoints'] = 3
    spec_file = write_spec(tmp_path, 'damaged', spec)
    data = str(tmp_path / 'data')
    lab.run(spec_file, 'damaged', 'train', data_dir=data)
    (run,) = run_dirs(Path(data), 'damaged')
    snaps = checkpoint.list_snapshots(run / 'ckpt' / 'damaged_t0_s0')
    assert [s.name for s in snaps] == ['f000000002000', 'f000000001500', 'f000000001000']
    state_file = snaps[0] / checkpoint.STATE_FILE
    data_bytes = bytearray(state_file.read_bytes())
    data_bytes[len(data_bytes) // 2] ^= 0xFF
    state_file.write_bytes(bytes(data_bytes))
    import logging
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logging.getLogger('slm_lab').addHandler(handler)  # the lab's logger does not propagate
    try:
        _, manifest, path = session_snapshots.load_latest_snapshot(run / 'ckpt' / 'damaged_t0_s0')
    finally:
        logging.getLogger('slm_lab').removeHandler(handler)
    assert path == snaps[1] and manifest['frame'] == 1500
    assert any('checksum' in r.getMessage() for r in records)
    # an unknown format version is refused, not skipped
    manifest_path = snaps[1] / checkpoint.MANIFEST
    m = json.loads(manifest_path.read_text())
    m['format_version'] = 99
    manifest_path.write_text(json.dumps(m))
    with pytest.raises(ResumeError, match='unknown snapshot format version 99'):
        session_snapshots.load_latest_snapshot(run / 'ckpt' / 'damaged_t0_s0')


@pytest.mark.slow
def test_enjoy_replays_without_touching_the_run(tmp_path, no_png, capsys):
    """The run trained and the replay (the command line's code, run_in_process) in this process."""
    spec = json.loads(json.dumps(PPO))
    spec['env']['max_frame'] = 12000
    spec['agent']['algorithm']['training_epoch'] = 6
    spec_file = write_spec(tmp_path, 'enjoy', spec)
    lab.run(spec_file, 'enjoy', 'train', data_dir=str(tmp_path / 'data'))  # the run to replay, in this process
    (run,) = run_dirs(tmp_path / 'data', 'enjoy')
    before = tree_digest(run)
    best_ma = torch.load(run / 'model' / 'enjoy_t0_s0_model_best.pt', weights_only=True)['total_reward_ma']
    code, out, err = run_in_process_with_output([f'enjoy@{run}/enjoy_t0_s0_spec.json', '--episodes', '3'], tmp_path,
                                                capsys)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert sum(line.startswith('episode ') for line in lines) == 3
    mean = float(lines[-1].rsplit(':', 1)[1])
    assert mean >= 0.5 * best_ma, (mean, best_ma)
    assert tree_digest(run) == before
    assert not (tmp_path / 'data' / 'enjoy').exists() and len(run_dirs(tmp_path / 'data', 'enjoy')) == 1


def test_resume_keeps_the_runs_values_for_keys_the_spec_omits(tmp_path):
    """A default that changed in a newer lab does not block or alter an older run: keys the spec
    file leaves out are taken from the run's saved spec."""
    spec_file = write_spec(tmp_path, 'olddefault', PPO)
    data = str(tmp_path / 'data')
    lab.run(spec_file, 'olddefault', 'train', ['env.max_frame=1000'], data_dir=data)
    (run,) = run_dirs(Path(data), 'olddefault')
    for path in run.glob('olddefault*_spec.json'):  # as if written by a lab with other defaults
        saved = json.loads(path.read_text())
        saved['agent']['net']['polyak_coef'] = 0.0
        saved['agent']['algorithm']['normalize_advantage'] = False
        path.write_text(json.dumps(saved))
    lab.run(spec_file, 'olddefault', 'train@latest', ['env.max_frame=1500'], data_dir=data)
    saved = json.loads((run / 'olddefault_spec.json').read_text())
    assert saved['agent']['algorithm']['normalize_advantage'] is False
    assert saved['env']['max_frame'] == 1500


class OpaqueCartPole(CartPoleEnv):
    """CartPole defined outside gymnasium's classic-control package: the lab cannot know that
    its dynamics live in plain attributes, so it treats it like a physics-engine env."""


def test_env_that_cannot_be_snapshotted_resumes_approximately(tmp_path):
    import gymnasium as gym
    if 'OpaqueCartPole-v0' not in gym.envs.registry:
        gym.register('OpaqueCartPole-v0', entry_point=OpaqueCartPole, max_episode_steps=500)
    spec = json.loads(json.dumps(PPO))
    spec['env']['name'] = 'OpaqueCartPole-v0'
    spec_file = write_spec(tmp_path, 'opaque', spec)
    data = str(tmp_path / 'data')
    lab.run(spec_file, 'opaque', 'train', ['env.max_frame=1000'], data_dir=data)
    lab.run(spec_file, 'opaque', 'train@latest', ['env.max_frame=2000'], data_dir=data)
    (run,) = run_dirs(Path(data), 'opaque')
    assert 'continuation is approximate' in (run / 'log' / 'opaque_t0_s0.log').read_text()
    frames = train_csv(run, 'opaque')['frame']
    assert frames.tolist() == [500, 1000, 1500, 2000]


@pytest.mark.slow
def test_bare_resume_keeps_the_runs_overrides_and_a_misfit_snapshot_changes_nothing(tmp_path, capsys):
    spec_file = write_spec(tmp_path, 'keep', PPO)  # the file says max_frame 2000
    data = str(tmp_path / 'data')
    lab.run(spec_file, 'keep', 'train', ['env.max_frame=1000'], data_dir=data)
    (run,) = run_dirs(Path(data), 'keep')
    before = tree_digest(run)
    capsys.readouterr()
    assert lab.run(spec_file, 'keep', 'train@latest', data_dir=data) is None  # not extended to 2000
    assert 'already finished at frame 1000' in capsys.readouterr().out
    assert tree_digest(run) == before
    # --force past a net-shape change: the snapshot cannot load, so nothing in the run changes
    with pytest.raises(ResumeError, match='does not fit this spec'):
        lab.run(spec_file, 'keep', 'train@latest', ['env.max_frame=1500', 'agent.net.hid_layers=[8]'],
                data_dir=data, force=True)
    assert tree_digest(run) == before


@pytest.mark.slow
def test_latest_skips_dev_runs(tmp_path):
    spec_file = write_spec(tmp_path, 'devskip', PPO)
    data = str(tmp_path / 'data')
    lab.run(spec_file, 'devskip', 'train', ['env.max_frame=1000'], data_dir=data)
    time.sleep(1.1)  # run directories are named by the second
    lab.run(spec_file, 'devskip', 'dev', ['env.max_frame=1000'], data_dir=data)
    train_run, dev_run = run_dirs(Path(data), 'devskip')
    dev_before = tree_digest(dev_run)
    lab.run(spec_file, 'devskip', 'train@latest', ['env.max_frame=1500'], data_dir=data)
    assert train_csv(train_run, 'devskip')['frame'].iloc[-1] == 1500
    assert tree_digest(dev_run) == dev_before


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_run_being_trained_cannot_be_resumed_twice(tmp_path):
    from slm_lab.persistence.run_dir import RunDir
    from slm_lab.persistence.run_dir import lock_run
    spec_file = write_spec(tmp_path, 'locked', PPO)
    data = str(tmp_path / 'data')
    lab.run(spec_file, 'locked', 'train', ['env.max_frame=1000'], data_dir=data)
    (run,) = run_dirs(Path(data), 'locked')
    before = tree_digest(run)
    held = lock_run(RunDir(run, 'locked'))  # as a training process would
    try:
        done = cli([spec_file, 'locked', 'train@latest', '-s', 'env.max_frame=1500'], cwd=tmp_path)
    finally:
        held.close()
    assert done.returncode == 2 and 'being trained by another process' in done.stderr
    assert tree_digest(run) == before


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_session_killed_by_sigkill_is_one_line_and_the_run_continues(tmp_path):
    """One session of a two-session trial killed with SIGKILL (as the out-of-memory killer does):
    the lab stops the other one with its snapshot, prints one line naming the session and the
    signal, exits 128 + 9, and train@latest finishes the run."""
    spec = json.loads(json.dumps(PPO))
    spec['env']['max_frame'] = 400000
    spec['meta']['max_session'] = 2
    spec_file = write_spec(tmp_path, 'killed', spec)
    proc = subprocess.Popen([sys.executable, RUN_LAB, spec_file, 'killed', 'train'], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, csv = time.time() + 120, []
        while time.time() < deadline and len(csv) < 2:
            csv = list(tmp_path.glob('data/killed_*/info/killed_t0_s*_session_df_train.csv'))
            time.sleep(0.1)
        assert len(csv) == 2, 'the sessions never logged'
        children = subprocess.run(['pgrep', '-P', str(proc.pid), '-f', 'multiprocessing.spawn'], capture_output=True,
                                  text=True).stdout.split()
        assert len(children) == 2, children
        subprocess.run(['kill', '-9', children[0]], check=True)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGKILL, err
    lines = [line for line in err.splitlines() if line.startswith(('error', 'Traceback'))]
    (run,) = run_dirs(tmp_path / 'data', 'killed')
    assert len(lines) == 1 and 'was killed by SIGKILL' in lines[0], err
    assert lines[0].endswith(f'continue with train@data/{run.name}'), lines[0]  # that run, by name
    def last_frames():
        return [pd.read_csv(run / 'info' / f'killed_t0_s{s}_session_df_train.csv')['frame'].iloc[-1] for s in (0, 1)]
    end = (max(last_frames()) // 1000 + 2) * 1000
    lab.run(spec_file, 'killed', 'train@latest', [f'env.max_frame={end}'], data_dir=str(tmp_path / 'data'))
    assert last_frames() == [end, end]
