"""TensorBoard event files, written by tensorboard's own writer and read here as a user's
TensorBoard reads them (tensorboard's EventAccumulator): the record scalars of each session at their
frames, the trial's mean, and a run stopped (max_frame, SIGTERM, SIGKILL between two snapshots) and
resumed shows one continuous curve per scalar."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lab_helpers import (DQN, PPO, RUN_LAB, check_resume_after_sigterm, lab_env, run_dirs, run_in_process,
                         train_csv, write_spec)
from slm_lab import lab
from slm_lab.experiment.scalars import SHOWN_COLUMNS, TAGS
from slm_lab.experiment.tensorboard import event_files, write_trial_board
from slm_lab.lib.errors import SpecError
from slm_lab.persistence import snapshot as checkpoint
from slm_lab.spec import load_spec

NOISE_TAGS = ('train/t', 'train/wall_t', 'train/frame', 'eval/lr', 'eval/fps', 'eval/loss', 'eval/epi', 'eval/t')


def read_board(directory: Path, purge: bool = True) -> dict[str, list[tuple[int, float]]]:
    """Every scalar curve of a directory as TensorBoard shows it: tensorboard's EventAccumulator
    reading all its event files, purging what a restart (purge_step) or a step going back drops
    (purge=False: every event as written, earlier files' included)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    board = EventAccumulator(str(directory), size_guidance={'scalars': 0}, purge_orphaned_data=purge).Reload()
    return {tag: [(e.step, e.value) for e in board.Scalars(tag)] for tag in board.Tags()['scalars']}


def expected_board(dfs: dict[str, pd.DataFrame]) -> dict[str, list[tuple[int, float]]]:
    """What TensorBoard must show for these records: each non-empty cell of a shown column at its
    frame (as float32, TensorBoard's scalar type)."""
    expected = {}
    for kind, df in dfs.items():
        assert df['frame'].is_monotonic_increasing and df['frame'].is_unique, df['frame'].tolist()
        for column in SHOWN_COLUMNS[kind]:
            cells = df[['frame', column]].dropna()
            if len(cells):
                expected[f'{kind}/{column}'] = [(int(f), float(np.float32(v)))
                                                for f, v in cells.itertuples(index=False)]
    return expected


def assert_board_mirrors_records(run: Path, name: str, session: int = 0) -> dict:
    """TensorBoard shows exactly the session's CSV cells: one curve per scalar, steps strictly
    increasing, none missing or repeated. Returns the curves."""
    dfs = {kind: pd.read_csv(run / 'info' / f'{name}_t0_s{session}_session_df_{kind}.csv')
           for kind in ('train', 'eval')}
    curves = read_board(run / 'tb' / f'{name}_t0_s{session}')
    assert curves == expected_board(dfs)
    return curves


def test_the_trial_board_appends_what_an_extended_trial_adds_and_rewrites_what_changed(tmp_path):
    """At each trial end the trial's stream holds the sessions' mean, once per frame: an extended
    trial (train@ with a larger max_frame) adds a file with its new frames only; records that
    changed before the end of the stream on disk, or one more session, write it anew in one file."""
    directory = tmp_path / 'tb'

    def rows(frames, shift=0.0):
        return pd.DataFrame({'frame': frames, 'wall_t': [f / 100 for f in frames], 't': frames,
                             'total_reward_ma': [f + shift for f in frames], 'loss': [1.0] * len(frames)})

    def curves():
        as_written = read_board(directory, purge=False)
        assert read_board(directory) == as_written  # nothing for TensorBoard to purge: each frame once
        return as_written

    write_trial_board(directory, {'train': [rows([10, 20])], 'eval': [rows([20])]})
    write_trial_board(directory, {'train': [rows([10, 20, 30, 40])], 'eval': [rows([20, 40])]})
    assert len(event_files(directory)) == 2
    assert curves()['train/total_reward_ma'] == [(10, 10.0), (20, 20.0), (30, 30.0), (40, 40.0)]
    assert curves()['eval/total_reward_ma'] == [(20, 20.0), (40, 40.0)]
    assert not {'train/t', 'train/wall_t', 'eval/loss'} & set(curves())
    write_trial_board(directory, {'train': [rows([10, 20, 30, 40])], 'eval': [rows([20, 40])]})  # completed again
    assert len(event_files(directory)) == 2
    write_trial_board(directory, {'train': [rows([10, 20, 30, 40], shift=1.0)], 'eval': [rows([20, 40])]})
    assert len(event_files(directory)) == 1
    assert curves()['train/total_reward_ma'] == [(10, 11.0), (20, 21.0), (30, 31.0), (40, 41.0)]
    write_trial_board(directory, {'train': [rows([10, 20, 30, 40]), rows([10, 20, 30, 40], shift=4.0)],
                                  'eval': [rows([20, 40]), rows([20, 40])]})
    assert len(event_files(directory)) == 1
    assert curves()['train/total_reward_ma'] == [(10, 12.0), (20, 22.0), (30, 32.0), (40, 42.0)]
    # a file a kill left beside the stream: the next write does not trust the stream, and writes it anew
    (directory / 'events.out.tfevents.1.killed').write_bytes(b'')
    write_trial_board(directory, {'train': [rows([10, 20, 30, 40, 50])], 'eval': [rows([20, 40])]})
    assert len(event_files(directory)) == 1
    assert [step for step, _ in curves()['train/total_reward_ma']] == [10, 20, 30, 40, 50]


def quick(spec: dict, **meta) -> dict:
    spec = copy.deepcopy(spec)
    spec['meta'].update(meta)
    return spec


@pytest.mark.slow
def test_the_record_scalars_are_on_tensorboard_and_a_resume_at_max_frame_continues_them(tmp_path, no_png):
    spec_file = write_spec(tmp_path, 'tbppo', PPO)
    data = str(tmp_path / 'data')
    lab.run(spec_file, 'tbppo', 'train', ['env.max_frame=1000'], data_dir=data)
    (run,) = run_dirs(Path(data), 'tbppo')
    scalars = assert_board_mirrors_records(run, 'tbppo')
    # the scalars a researcher looks for, at every log point; no column that only repeats another
    for tag in ('train/total_reward_ma', 'train/loss', 'train/lr', 'train/entropy', 'train/entropy_coef',
                'train/fps', 'train/grad_norm', 'eval/total_reward_ma'):
        assert tag in scalars, sorted(scalars)
    assert set(scalars) <= set(TAGS) and not set(scalars) & set(NOISE_TAGS), sorted(scalars)
    assert [step for step, _ in scalars['train/total_reward_ma']] == [500, 1000]
    lab.run(spec_file, 'tbppo', 'train@latest', ['env.max_frame=2000'], data_dir=data)
    assert train_csv(run, 'tbppo')['frame'].tolist() == [500, 1000, 1500, 2000]
    scalars = assert_board_mirrors_records(run, 'tbppo')
    assert [step for step, _ in scalars['train/loss']] == [500, 1000, 1500, 2000]
    assert len(event_files(run / 'tb' / 'tbppo_t0_s0')) == 2  # the resume wrote its own file, nothing again


@pytest.mark.slow
def test_the_trial_stream_is_the_mean_of_its_sessions(tmp_path, no_png):
    spec = quick(DQN, max_session=2)
    spec['env']['max_frame'] = 1000
    lab.run(write_spec(tmp_path, 'tbdqn', spec), 'tbdqn', 'train', data_dir=str(tmp_path / 'data'))
    (run,) = run_dirs(tmp_path / 'data', 'tbdqn')
    for session in (0, 1):
        assert_board_mirrors_records(run, 'tbdqn', session)
    means = {}
    for kind in ('train', 'eval'):
        second = pd.read_csv(run / 'info' / f'tbdqn_t0_s1_session_df_{kind}.csv')
        both = pd.concat([train_csv(run, 'tbdqn', kind), second])
        means[kind] = both.groupby('frame', as_index=False).mean()
    trial = read_board(run / 'tb' / 'tbdqn_t0')
    assert trial == expected_board(means)
    assert 'train/explore_var' in trial  # DQN's epsilon


def test_meta_tensorboard_false_writes_none_and_a_bad_value_is_named(tmp_path, no_png, spec_file, make_spec):
    spec = make_spec('PPO', max_frame=256, num_envs=2, log_frequency=128, tensorboard=False)
    lab.run(spec_file({'off': spec}), 'off', 'train', data_dir=str(tmp_path / 'data'))
    (run,) = run_dirs(tmp_path / 'data', 'off')
    assert (run / 'info' / 'off_t0_s0_session_df_train.csv').exists() and not (run / 'tb').exists()
    spec['meta']['tensorboard'] = 'yes'
    with pytest.raises(SpecError) as info:
        load_spec(spec_file({'bad': spec}), 'bad')
    assert 'meta.tensorboard' in str(info.value) and '\n' not in str(info.value)


@pytest.mark.subprocess
def test_tensorboard_and_wandb_are_not_imported_before_the_first_log_point():
    code = ('import sys; import slm_lab.lab, slm_lab.experiment.session; '
            "print([m for m in sys.modules if m.split('.')[0] in ('tensorboard', 'wandb')])")
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=lab_env(),
                          cwd=Path(RUN_LAB).parent, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == '[]'


def start_run(tmp_path: Path, name: str, spec: dict) -> tuple[str, subprocess.Popen]:
    spec_file = write_spec(tmp_path, name, spec)
    proc = subprocess.Popen([sys.executable, RUN_LAB, spec_file, name, 'train'], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=lab_env())
    return spec_file, proc


def logged_frames(tmp_path: Path, name: str) -> list[int]:
    runs = run_dirs(tmp_path / 'data', name)
    csv = runs[0] / 'info' / f'{name}_t0_s0_session_df_train.csv' if runs else None
    if csv is None or not csv.exists():
        return []
    return pd.read_csv(csv)['frame'].tolist()


def snapshot_frames(run: Path, name: str) -> list[int]:
    return sorted(int(s.name[1:]) for s in checkpoint.list_snapshots(run / 'ckpt' / f'{name}_t0_s0'))


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_sigterm_and_resume_leave_one_continuous_curve_and_continue_exactly(tmp_path, no_png):
    """PPO stopped by SIGTERM mid-run and continued by train@latest (check_resume_after_sigterm, the
    exact-resume check of test_resume.py's test_resume_after_sigterm_is_exact, run here for PPO: one
    stopped run for both): the records go on with no gap or repeat, TensorBoard shows them as one
    continuous curve per scalar, and they and the weights equal the run that never stopped."""
    run = check_resume_after_sigterm(tmp_path, 'tbterm', PPO)
    frames = train_csv(run, 'tbterm')['frame'].tolist()
    assert frames == list(range(500, frames[-1] + 1, 500)), frames
    assert_board_mirrors_records(run, 'tbterm')


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_sigkill_between_two_snapshots_and_resume_leave_one_continuous_curve(tmp_path, no_png):
    """Rows logged after the newest snapshot are in the event file when the run is killed; the
    resume opens its file with purge_step past the snapshot, so TensorBoard drops them, and logs
    them again as it reproduces them: once each. A record cut by the kill does not disturb it."""
    # snapshots 8000 frames apart: a kill 0.2 s after a row in the first half of a gap lands before
    # the next snapshot with 4000 frames or more to spare (with 2000 apart, a fast run had passed it)
    spec = quick(PPO, checkpoint_frequency=8000)
    spec['env']['max_frame'] = 400000
    spec_file, proc = start_run(tmp_path, 'tbkill', spec)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            frames = logged_frames(tmp_path, 'tbkill')
            if frames and frames[-1] > 8000 and 0 < frames[-1] % 8000 <= 4000:  # a row past a snapshot
                break
            time.sleep(0.02)
        time.sleep(0.2)  # the row goes to the event file just after the CSV
        proc.kill()
    finally:
        proc.wait()
    (run,) = run_dirs(tmp_path / 'data', 'tbkill')
    snapshot = snapshot_frames(run, 'tbkill')[-1]
    directory = run / 'tb' / 'tbkill_t0_s0'
    logged = [step for step, _ in read_board(directory)['train/total_reward_ma']]
    assert snapshot >= 8000 and logged[-1] > snapshot, (snapshot, logged)  # killed between two snapshots
    # what a writer killed mid-write leaves: half a record at the end of its file
    (event_file,) = event_files(directory)
    with open(event_file, 'ab') as f:
        f.write(b'\x30\x00\x00\x00\x00\x00\x00\x00\x12\x34')
    end = (logged[-1] // 500 + 2) * 500
    # train@latest in this process
    lab.run(spec_file, 'tbkill', 'train@latest', [f'env.max_frame={end}'], data_dir=str(tmp_path / 'data'))
    assert train_csv(run, 'tbkill')['frame'].tolist() == list(range(500, end + 1, 500))
    assert_board_mirrors_records(run, 'tbkill')
    assert json.loads((run / 'info' / 'tbkill_t0_s0_resumes.json').read_text())[0]['frame'] == snapshot
    # the killed run's events past the snapshot are still in its file: the resume's purge_step hides them
    assert len(event_files(directory)) == 2
    as_written = [step for step, _ in read_board(directory, purge=False)['train/total_reward_ma']]
    again = [step for step in range(snapshot + 1, logged[-1] + 1) if step % 500 == 0]
    assert again and all(as_written.count(step) == 2 for step in again), (snapshot, logged[-1], as_written)


# --- a TensorBoard path of the wrong kind (issue 27) -----------------------------------------------

@pytest.fixture(scope='module')
def finished_run(tmp_path_factory):
    """A short PPO run (two log points), to copy for each case; (spec file, its data dir)."""
    from slm_lab.experiment import viz
    root = tmp_path_factory.mktemp('tb_layout')
    spec = copy.deepcopy(PPO)
    spec['env']['max_frame'] = 1000
    spec['meta'].update(log_frequency=500, eval_frequency=500)
    spec_file = write_spec(root, 'tblay', spec)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(viz, 'png_available', lambda: False)
        lab.run(spec_file, 'tblay', 'train', data_dir=str(root / 'data'))
    return spec_file, root / 'data'


def entries(root: Path) -> dict[str, str]:
    """Every entry under root (dangling links too): a file's content digest, else its kind."""
    import hashlib
    out = {}
    for p in sorted(root.rglob('*')):
        key = str(p.relative_to(root))
        if p.is_symlink():
            out[key] = f'link to {Path(p.readlink())}'
        elif p.is_file():
            out[key] = hashlib.md5(p.read_bytes()).hexdigest()
        else:
            out[key] = 'dir'
    return out


WRONG_KIND = {  # case: (the path under the run, how it is replaced, the kind the message names)
    'tb/ itself a file': ('tb', 'file', 'a file'),
    "a session's tb dir a file": ('tb/tblay_t0_s0', 'file', 'a file'),
    "a session's tb dir a dangling link": ('tb/tblay_t0_s0', 'dangling link', 'a link to nothing'),
    "the trial's tb dir a file": ('tb/tblay_t0', 'file', 'a file'),
}


@pytest.mark.parametrize('case', list(WRONG_KIND))
def test_a_tensorboard_path_of_the_wrong_kind_is_refused_before_resuming(case, finished_run, tmp_path, no_png):
    """Before: train@ wrote the next CSV row, then a FileExistsError traceback (exit 1)."""
    import shutil

    from slm_lab.lib.errors import ResumeError
    spec_file, data = finished_run
    shutil.copytree(data, tmp_path / 'data', symlinks=True)
    (run,) = run_dirs(tmp_path / 'data', 'tblay')
    where, how, kind = WRONG_KIND[case]
    path = run / where
    shutil.rmtree(path)
    if how == 'file':
        path.write_text('not a directory\n')
    else:
        path.symlink_to(tmp_path / 'gone')
    before = entries(run)
    with pytest.raises(ResumeError) as info:
        lab.run(spec_file, 'tblay', 'train@latest', ['env.max_frame=2000'], data_dir=str(tmp_path / 'data'))
    assert str(info.value) == (f'{path} is {kind}, where the run writes its TensorBoard event files (a directory); '
                               'move it away and resume again')
    assert entries(run) == before, 'nothing may be written to the run'
    assert len(train_csv(run, 'tblay')) == 2


@pytest.mark.slow
def test_the_command_line_refuses_a_bad_tensorboard_dir_and_resumes_once_it_is_moved(finished_run, tmp_path, capsys,
                                                                                    no_png):
    """Both commands by the command line's code in this process (run_in_process): its one line,
    exit code and resume are the same as in a process of its own, without its seconds of imports."""
    import shutil
    spec_file, data = finished_run
    shutil.copytree(data, tmp_path / 'data', symlinks=True)
    (run,) = run_dirs(tmp_path / 'data', 'tblay')
    board = run / 'tb' / 'tblay_t0_s0'
    shutil.rmtree(board)
    board.write_text('x')
    args = [spec_file, 'tblay', 'train@latest', '-s', 'env.max_frame=2000']
    code, err = run_in_process(args, tmp_path, capsys)
    assert code == 2 and err.splitlines() == [
        f'error: {Path("data") / board.relative_to(tmp_path / "data")} is a file, where the run writes its '
        'TensorBoard event files (a directory); move it away and resume again'], err
    assert len(train_csv(run, 'tblay')) == 2
    board.rename(tmp_path / 'moved')
    code, err = run_in_process(args, tmp_path, capsys)
    assert code == 0, err
    assert train_csv(run, 'tblay')['frame'].iloc[-1] == 2000
    assert_board_mirrors_records(run, 'tblay')


@pytest.mark.slow
def test_a_fork_of_a_run_whose_tb_is_a_file_makes_its_own(finished_run, tmp_path, capsys, no_png):
    """A fork writes a new run directory: the parent's tb/ is neither read nor written (the fork by
    the command line's code in this process, run_in_process)."""
    import shutil
    spec_file, data = finished_run
    shutil.copytree(data, tmp_path / 'data', symlinks=True)
    (parent,) = run_dirs(tmp_path / 'data', 'tblay')
    shutil.rmtree(parent / 'tb')
    (parent / 'tb').write_text('x')
    before = entries(parent)
    code, err = run_in_process([spec_file, 'tblay', 'train', '--fork', str(parent), '-s', 'env.max_frame=1500'],
                               tmp_path, capsys)
    assert code == 0, err
    (child,) = [r for r in run_dirs(tmp_path / 'data', 'tblay') if r != parent]
    assert entries(parent) == before
    assert_board_mirrors_records(child, 'tblay')
