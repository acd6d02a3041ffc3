"""Bad input and damage found by a torture campaign against the lab (issue 23): each case is one
line and a clear exit code, never a traceback, and nothing of an existing run is lost."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import build_spec, flip_weight_bytes, write_spec_file
from lab_helpers import PPO, RUN_LAB, cli, lab_env, run_dirs, run_in_process_with_output, tree_digest, write_spec

from slm_lab import lab
from slm_lab.persistence import model_file, snapshot as checkpoint
from slm_lab.experiment import viz
from slm_lab.experiment.analysis import BASELINE_CACHE_DIR
from slm_lab.lib.errors import ResumeError, SpecError, TrainingDiverged
from slm_lab.resources import format_bytes

REPO_ROOT = Path(__file__).resolve().parent.parent
ATARI_SPEC = str(REPO_ROOT / 'spec' / 'benchmark' / 'atari' / 'atari_slm_lab_v5.json')


def one_line(done: subprocess.CompletedProcess) -> str:
    """stderr's only line (no traceback, no banner before it)."""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and 'Traceback' not in done.stderr, done.stderr
    return lines[0]


def refused_before_writing(tmp_path: Path, spec: dict, overrides: list[str], error=SpecError) -> str:
    """Run a spec in-process with overrides; the error it must raise, with no data/ entry made."""
    spec_file = write_spec(tmp_path, 'bad', spec)
    data = tmp_path / 'data'
    with pytest.raises(error) as info:
        lab.run(spec_file, 'bad', 'train', overrides, data_dir=str(data))
    assert not data.exists() or not list(data.iterdir()), list(data.iterdir())
    assert '\n' not in str(info.value)
    return str(info.value)


# --- fuzzed specs and -s values ------------------------------------------------------------------

def test_byte_counts_beyond_a_float_are_formatted():
    assert format_bytes(10**400) == f'2^{(10**400).bit_length() - 1} B'
    assert format_bytes(1536) == '1.5 KiB'


@pytest.mark.parametrize('override', ['agent.algorithm.time_horizon=1e308', 'agent.net.hid_layers=[1e308]'])
def test_a_size_beyond_a_float_is_refused_as_too_large(tmp_path, override):
    message = refused_before_writing(tmp_path, PPO, [override])
    assert 'needs about' in message and 'smaller' in message, message


@pytest.mark.parametrize('override,key', [
    ('agent.net.optim_spec.lr=1e300', 'agent.net.optim_spec.lr'),
    ('agent.net.optim_spec.lr=1e39', 'agent.net.optim_spec.lr'),
    ('agent.net.optim_spec={"name": "Adam", "lr": 0.001, "betas": [1e39, 0.999]}',
     'agent.net.optim_spec.betas[0]'),
    ('agent.net.optim_spec={"name": "Lookahead", "optimizer": "Adam", "lr": 1e39}', 'agent.net.optim_spec.lr'),
])
def test_a_value_float32_cannot_hold_is_refused_before_the_run_exists(tmp_path, override, key):
    message = refused_before_writing(tmp_path, PPO, [override])
    assert message.startswith(f'{key}: ') and 'float32' in message, message


def test_a_huge_reward_scale_is_a_divergence_and_keeps_the_last_snapshot(tmp_path):
    spec_file = write_spec(tmp_path, 'huge', PPO)
    data = tmp_path / 'data'
    with pytest.raises(TrainingDiverged) as info, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        lab.run(spec_file, 'huge', 'train', ['env.reward_scale=1e300'], data_dir=str(data))
    # the one line is all a user sees: numpy's arithmetic on the non-finite values warns nothing
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in caught]
    message = str(info.value)
    assert 'training diverged' in message and 'non-finite' in message and '\n' not in message, message
    (run,) = run_dirs(data, 'huge')
    snaps = checkpoint.list_snapshots(run / 'ckpt' / 'huge_t0_s0')
    assert snaps
    state, _ = checkpoint.load_snapshot(snaps[-1])
    for net in state['agent']['algorithm']['nets'].values():
        assert all(torch.isfinite(t).all() for t in net.values())


def test_an_error_in_training_with_finite_values_stays_a_bug(tmp_path, monkeypatch):
    """Only non-finite values make an error a divergence: any other stays a traceback."""
    from slm_lab.agent import Agent

    def broken(self, *args):
        raise ValueError('an ordinary bug')
    monkeypatch.setattr(Agent, 'update', broken)
    monkeypatch.setattr(viz, 'png_available', lambda: False)
    spec_file = write_spec(tmp_path, 'bug', PPO)
    with pytest.raises(ValueError, match='an ordinary bug'):
        lab.run(spec_file, 'bug', 'train', data_dir=str(tmp_path / 'data'))


def nested(depth: int, leaf=1) -> dict:
    value = leaf
    for _ in range(depth):
        value = {'a': value}
    return value


def test_a_deeply_nested_override_is_one_line(tmp_path):
    message = refused_before_writing(tmp_path, PPO, ['env.make_kwargs=' + json.dumps(nested(500))])
    assert message.startswith('-s env.make_kwargs: ') and 'deep' in message, message
    # deeper than the JSON reader itself goes
    message = refused_before_writing(tmp_path, PPO, ['env.make_kwargs=' + '[' * 100_000 + ']' * 100_000])
    assert message.startswith('-s env.make_kwargs: ') and 'deep' in message, message


def test_a_deeply_nested_spec_file_is_one_line(tmp_path):
    spec = json.loads(json.dumps(PPO))
    spec['env']['make_kwargs'] = nested(500)
    path = tmp_path / 'deep.json'
    path.write_text(json.dumps({'deep': spec}))
    with pytest.raises(SpecError) as info:
        lab.run(str(path), 'deep', 'train', data_dir=str(tmp_path / 'data'))
    assert str(info.value).startswith(f'spec file {path}: deep.env.make_kwargs.a... nests'), str(info.value)
    assert not (tmp_path / 'data').exists()


def test_the_deepest_slm_lab_spec_is_far_from_the_depth_limit():
    from slm_lab.spec import MAX_SPEC_DEPTH, read_spec_file, spec_depth_error
    specs = read_spec_file(str(REPO_ROOT / 'spec' / 'slm_lab' / 'cartpole_v5.yaml'))
    assert spec_depth_error(specs) is None and MAX_SPEC_DEPTH >= 32


@pytest.mark.parametrize('override,start', [
    ('env.max_frame=1' + '0' * 400, 'env.max_frame: 100000000000... (401 digits) is out of range'),
    ('env.max_frame=' + '9' * 5000, '-s env.max_frame: Exceeds the limit (4300 digits)'),
    ('meta.rigorous_eval=1e308', 'meta.rigorous_eval: 1e+308 is out of range'),
    ('env.make_kwargs={"render_mode": "human"}', 'env.make_kwargs.render_mode: training renders nothing'),
    ('env.render_mode=human', 'env.render_mode: training renders nothing'),
])
def test_values_no_run_can_use_are_refused(tmp_path, override, start):
    message = refused_before_writing(tmp_path, PPO, [override])
    assert message.startswith(start), message


@pytest.mark.parametrize('ext,text', [
    ('json', '{"x": {"env": {"max_frame": ' + '9' * 5000 + '}}}'),
    ('yaml', 'x:\n  env:\n    max_frame: ' + '9' * 5000 + '\n'),
])
def test_a_number_too_long_to_read_in_a_spec_file_is_one_line(tmp_path, ext, text):
    path = tmp_path / f'long.{ext}'
    path.write_text(text)
    with pytest.raises(SpecError, match='4300 digits'):
        lab.run(str(path), 'x', 'train', data_dir=str(tmp_path / 'data'))


@pytest.mark.slow
@pytest.mark.subprocess
def test_an_atari_refusal_is_one_line_without_ales_banner(tmp_path):
    pytest.importorskip('ale_py')
    done = cli([ATARI_SPEC, 'ppo_pong', 'train', '-s', 'env.make_kwargs.mode=99'], cwd=tmp_path)
    assert done.returncode == 2
    assert one_line(done).startswith('error: env.make_kwargs:')
    assert 'A.L.E' not in done.stdout + done.stderr and 'Stella' not in done.stdout + done.stderr


# --- damaged run directories ---------------------------------------------------------------------

@pytest.fixture(scope='module')
def stopped_run(tmp_path_factory) -> Path:
    """A PPO run stopped by SIGTERM part way (snapshots, records, model files), made once;
    tests copy it. Trained in this process (a process of its own costs seconds of imports): the
    SIGTERM comes to this process, as a scheduler sends it, once the run has what the tests damage."""
    import threading

    from slm_lab.lib.errors import Preempted
    root = tmp_path_factory.mktemp('stopped')
    spec = json.loads(json.dumps(PPO))
    spec['env']['max_frame'] = 400_000
    spec['meta'].update(log_frequency=256, eval_frequency=256, checkpoint_frequency=512)
    spec_file = write_spec(root, 'stopped', spec)

    def stop_part_way():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            runs = run_dirs(root / 'data', 'stopped')
            if runs and len(checkpoint.list_snapshots(runs[0] / 'ckpt' / 'stopped_t0_s0')) >= 2 \
                    and (runs[0] / 'model' / 'stopped_t0_s0_model_best.pt').exists():
                break
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)  # the trial's handler takes it: a stop with a snapshot
    stopper = threading.Thread(target=stop_part_way, daemon=True)
    with pytest.MonkeyPatch.context() as patch, pytest.raises(Preempted) as info:
        patch.setattr(viz, 'png_available', lambda: False)
        stopper.start()
        lab.run(spec_file, 'stopped', 'train', data_dir=str(root / 'data'))
    stopper.join()
    assert info.value.signum == signal.SIGTERM
    (run,) = run_dirs(root / 'data', 'stopped')
    return run


@pytest.fixture
def damaged(stopped_run, tmp_path):
    """A copy of the stopped run in tmp_path/data, and the spec file to resume it with."""
    run = Path(shutil.copytree(stopped_run, tmp_path / 'data' / stopped_run.name))
    spec_file = str(stopped_run.parent.parent / 'stopped.json')
    return run, spec_file


def resume_cli(tmp_path: Path, spec_file: str, *extra: str) -> subprocess.CompletedProcess:
    return cli([spec_file, 'stopped', 'train@latest', *extra], cwd=tmp_path,
               env={**os.environ, 'BROWSER_PATH': os.devnull + '/no-browser'})


def resume_in_process(tmp_path: Path, spec_file: str, capsys, *extra: str) -> subprocess.CompletedProcess:
    """resume_cli's command run by the command line's code in this process (run_in_process): its
    exit code, stdout and stderr, without a process's start and the lab's imports. Call it with the
    no_png fixture in place."""
    code, out, err = run_in_process_with_output([spec_file, 'stopped', 'train@latest', *extra], tmp_path, capsys)
    return subprocess.CompletedProcess(['run_lab.py', spec_file, 'stopped', 'train@latest', *extra], code, out, err)


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_train_record_that_is_not_text_is_named_in_one_line(damaged, tmp_path, capsys, no_png):
    run, spec_file = damaged
    shutil.rmtree(run / 'ckpt')
    csv = run / 'info' / 'stopped_t0_s0_session_df_train.csv'
    csv.write_bytes(bytes([0xE5, 0xFF, 0x00, 0x0A] * 75))
    before = tree_digest(run)
    done = resume_in_process(tmp_path, spec_file, capsys)
    assert done.returncode == 2
    line = one_line(done)
    assert str(csv.relative_to(tmp_path)) in line and 'not UTF-8' in line, line
    assert tree_digest(run) == before


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_lock_that_is_a_directory_is_one_line(damaged, tmp_path, capsys, no_png):
    run, spec_file = damaged
    (run / '.lock').unlink()
    (run / '.lock').mkdir()
    before = tree_digest(run)
    done = resume_in_process(tmp_path, spec_file, capsys)
    assert done.returncode == 2
    line = one_line(done)
    assert '.lock is a directory' in line, line
    assert tree_digest(run) == before


@pytest.mark.subprocess
@pytest.mark.parametrize('where', ['stopped_t0_s0_spec.json', 'info/stopped_t0_s0_session_df_train.csv',
                                   'log/stopped_t0_s0.log', 'model/stopped_t0_s0_model_best.pt'])
def test_a_directory_where_a_resume_writes_a_file_is_refused_before_anything_changes(damaged, tmp_path, where):
    run, spec_file = damaged
    path = run / where
    path.unlink()
    path.mkdir()
    before = tree_digest(run)
    done = resume_cli(tmp_path, spec_file, '-s', 'env.max_frame=500000')
    assert done.returncode == 2, done.stderr
    assert f'{path.relative_to(tmp_path)} is not a file' in done.stderr.strip().splitlines()[-1], done.stderr
    assert 'Traceback' not in done.stderr
    assert tree_digest(run) == before


@pytest.mark.subprocess
def test_a_path_too_long_for_the_filesystem_is_one_line(tmp_path):
    done = cli([f'enjoy@{"a" * 5000}.json'], cwd=tmp_path)
    assert done.returncode == 2 and one_line(done).startswith('error: enjoy@aaa') and 'too long' in done.stderr
    spec_file = write_spec(tmp_path, 'long', PPO)
    with pytest.raises(ResumeError, match='no such run directory'):
        lab.run(spec_file, 'long', 'train@' + 'a' * 5000, data_dir=str(tmp_path / 'data'))


@pytest.mark.parametrize('scheduler', [{'name': 'StepLR', 'step_size': -1, 'gamma': 0.5},
                                       {'name': 'ExponentialLR', 'gamma': 2.0}])
def test_an_lr_schedule_that_leaves_float32_is_refused_before_the_run_exists(tmp_path, scheduler):
    spec = json.loads(json.dumps(PPO))
    spec['agent']['net']['lr_scheduler_spec'] = scheduler
    message = refused_before_writing(tmp_path, spec, [])
    assert message.startswith('agent.net.lr_scheduler_spec: ') and 'takes the learning rate to' in message, message


@pytest.mark.subprocess
def test_sigterm_during_an_evaluation_stops_at_once_and_the_run_continues(tmp_path):
    spec = json.loads(json.dumps(PPO))
    spec['meta'].update(rigorous_eval=10_000, eval_frequency=1000, log_frequency=500)
    spec_file = write_spec(tmp_path, 'evalstop', spec)
    env = {**os.environ, 'BROWSER_PATH': os.devnull + '/no-browser', 'PYTHONUNBUFFERED': '1'}
    proc = subprocess.Popen([sys.executable, RUN_LAB, spec_file, 'evalstop', 'train'], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stderr:  # the first evaluation (10,000 episodes) starts after this row
        if 'frame 1000/' in line:
            break
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    err = proc.stderr.read()
    proc.wait(timeout=60)
    assert proc.returncode == 143, err
    last = err.strip().splitlines()[-1]
    assert last.startswith('stopped: stopped by SIGTERM during an evaluation at frame 1000'), err
    done = cli([spec_file, 'evalstop', 'train@latest', '-s', 'meta.rigorous_eval=1', '--force'], cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_deleted_log_directory_is_made_again_and_the_resume_recorded_once(damaged, tmp_path, capsys, no_png):
    run, spec_file = damaged
    shutil.rmtree(run / 'log')
    shutil.rmtree(run / 'graph')
    frame = max(int(p.name[1:]) for p in checkpoint.list_snapshots(run / 'ckpt' / 'stopped_t0_s0'))
    done = resume_in_process(tmp_path, spec_file, capsys, '-s', f'env.max_frame={frame + 512}')
    assert done.returncode == 0, done.stderr
    assert (run / 'log' / 'stopped_t0_s0.log').is_file() and (run / 'graph').is_dir()
    assert len(json.loads((run / 'stopped_resumes.json').read_text())) == 1


def test_a_resume_that_fails_before_any_session_resumed_is_not_recorded(damaged, monkeypatch):
    from slm_lab.experiment.session import Session
    run, spec_file = damaged
    monkeypatch.setattr(viz, 'png_available', lambda: False)

    def fails(self, *args, **kwargs):
        raise RuntimeError('failed while loading')
    monkeypatch.setattr(Session, 'resume_from', fails)
    with pytest.raises(RuntimeError, match='failed while loading'):
        lab.run(spec_file, 'stopped', 'train@latest', data_dir=str(run.parent))
    assert not (run / 'stopped_resumes.json').exists()
    monkeypatch.undo()
    monkeypatch.setattr(viz, 'png_available', lambda: False)
    frame = max(int(p.name[1:]) for p in checkpoint.list_snapshots(run / 'ckpt' / 'stopped_t0_s0'))
    lab.run(spec_file, 'stopped', 'train@latest', [f'env.max_frame={frame + 256}'], data_dir=str(run.parent))
    assert len(json.loads((run / 'stopped_resumes.json').read_text())) == 1


# --- model files' integrity ----------------------------------------------------------------------

def test_a_model_file_records_a_checksum_of_its_contents(tmp_path):
    path = tmp_path / 'm.pt'
    state = {'nets': {'net': {'w': torch.arange(6.0).reshape(2, 3)}}, 'frame': 7,
             'obs_norm': {'mean': np.zeros(3), 'count': 2.0}}
    model_file.save_model_file(path, state)
    loaded, verified = model_file.load_model_file(path)
    assert verified and loaded['frame'] == 7 and torch.equal(loaded['nets']['net']['w'], state['nets']['net']['w'])
    changed = torch.load(path, weights_only=True)
    changed['nets']['net']['w'][0, 0] = 0.5  # one weight changed after writing
    torch.save(changed, path)
    with pytest.raises(model_file.DamagedModelFile, match='checksum'):
        model_file.load_model_file(path)
    torch.save(state, path)  # a file of an older lab: no checksum, loads unchecked
    assert model_file.load_model_file(path)[1] is False


@pytest.mark.slow
@pytest.mark.subprocess
def test_resume_writes_a_damaged_best_model_again_from_the_snapshot(damaged, tmp_path, capsys, no_png):
    run, spec_file = damaged
    best = run / 'model' / 'stopped_t0_s0_model_best.pt'
    flip_weight_bytes(best)
    frame = max(int(p.name[1:]) for p in checkpoint.list_snapshots(run / 'ckpt' / 'stopped_t0_s0'))
    done = resume_in_process(tmp_path, spec_file, capsys, '-s', f'env.max_frame={frame + 256}')
    assert done.returncode == 0, done.stderr
    assert 'fail the checksum' in (run / 'log' / 'stopped_t0_s0.log').read_text()
    assert model_file.load_model_file(best)[1]


# --- signals outside training --------------------------------------------------------------------

def _catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (Linux: the SigCgt mask in /proc)."""
    try:
        status = Path(f'/proc/{pid}/status').read_text()
    except OSError:
        return False
    mask = next((int(line.split()[1], 16) for line in status.splitlines() if line.startswith('SigCgt:')), 0)
    return bool(mask >> (signum - 1) & 1)


@pytest.mark.subprocess
def test_sigterm_while_the_spec_is_checked_is_one_line_and_writes_nothing(tmp_path):
    spec_file = write_spec(tmp_path, 'early', PPO)
    proc = subprocess.Popen([sys.executable, RUN_LAB, spec_file, 'early', 'train'], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # once the lab catches SIGTERM (its handler is in place: /proc's SigCgt mask), while it is still
    # importing torch and checking the spec (nothing written yet); on a busy machine the
    # interpreter's own start can take longer than any fixed wait
    deadline = time.monotonic() + 60
    while not _catches(proc.pid, signal.SIGTERM) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    assert proc.poll() is None and not (tmp_path / 'data').exists()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    # the line says when, if the signal came after the arguments were read
    assert err.strip().splitlines() in (['stopped by SIGTERM before training started; nothing was written'],
                                        ['stopped by SIGTERM; nothing was written']), err
    assert not (tmp_path / 'data').exists() or not list((tmp_path / 'data').iterdir())


# from the lab's handler in place (run_lab.py's first lines; slm-lab run's after its imports): in
# the lab's imports (torch, gymnasium: the first second or so), the spec's checks, the run
# directory being made, or the first steps
START_UP_INSTANTS = [0, 0.03, 0.1, 0.25, 0.5, 0.8, 1.2, 1.8]


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM], ids=['SIGINT', 'SIGTERM'])
def test_a_stop_at_any_instant_of_start_up_is_one_line_and_leaves_nothing_half_made(tmp_path, signum):
    """Issue 27 point 6: SIGINT 0.1 s after start gave KeyboardInterrupt tracebacks, once numpy's
    40-line ImportError (the KeyboardInterrupt landed in its C import). At each instant, with
    run_lab.py and slm-lab run (python -m slm_lab.entry) in turn: exit 130/143 and no traceback;
    before training, one line and no run directory; once training started, the run's own stop
    (a snapshot, `stopped: ...`); never a directory left under its temporary name."""
    spec_file = write_spec(tmp_path, 'startup', {**PPO, 'env': {**PPO['env'], 'max_frame': 10**7}})
    # the SIGTERM line says when, if the command line was read
    lines = [['interrupted']] if signum == signal.SIGINT else \
        [['stopped by SIGTERM before training started; nothing was written'],
         ['stopped by SIGTERM; nothing was written']]
    code = 128 + signum
    for i, delay in enumerate(START_UP_INSTANTS):
        cwd = tmp_path / f'at_{i}'
        cwd.mkdir()
        entry = [RUN_LAB] if i % 2 == 0 else ['-m', 'slm_lab.entry', 'run']  # as the installed slm-lab
        # a terminal's foreground job, whose SIGINT is not ignored (conftest.pytest_configure)
        proc = subprocess.Popen([sys.executable, *entry, spec_file, 'startup', 'train'], cwd=cwd,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**lab_env(), 'PYTHONPATH': str(REPO_ROOT)})
        deadline = time.monotonic() + 60
        while not _catches(proc.pid, signal.SIGTERM) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.002)
        time.sleep(delay)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
        at = f'{" ".join(entry)}, {signum!r} {delay} s after its handler: {err[-2000:]}'
        assert proc.returncode == code and 'Traceback' not in err, at
        # what a run writes beside the run directories (random baselines, the graphs' plotly.js) is not one
        shared = {BASELINE_CACHE_DIR, viz.JS_DIR}
        data = cwd / 'data'
        made = sorted(p.name for p in data.iterdir() if p.name not in shared) if data.exists() else []
        assert not any('.tmp-' in name for name in made), (made, at)
        if not made:
            assert err.splitlines() in lines and out == '', at
        else:  # training had started: the run's stop, resumable
            assert err.strip().splitlines()[-1].startswith(f'stopped: stopped by {signal.Signals(signum).name} ') \
                and err.strip().endswith(f'continue with train@data/{made[0]}'), at  # that run, by name
            assert list((cwd / 'data' / made[0] / 'ckpt').rglob('MANIFEST.json')), at


def test_a_stop_once_the_run_directory_is_in_place_stops_the_run_resumably(tmp_path):
    """A stop that comes after the run directory was renamed into place, before the trial took
    the signals over, is the trial's: it stops at its first step with a snapshot, resumable."""
    from slm_lab.lib.errors import EXIT_CODES, Preempted, catch_stops, clear_stops
    spec_file = write_spec(tmp_path, 'placed', PPO)
    previous = catch_stops(at_once=False)
    try:
        with pytest.raises(Preempted) as info:
            lab.run(spec_file, 'placed', 'train', data_dir=str(tmp_path / 'data'),
                    on_run_dir=lambda _: os.kill(os.getpid(), signal.SIGTERM))
    finally:
        clear_stops()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert info.value.exit_code == EXIT_CODES[signal.SIGTERM] and info.value.frame is not None
    (run,) = run_dirs(tmp_path / 'data', 'placed')
    assert list((run / 'ckpt').rglob('MANIFEST.json'))
    assert lab.run(spec_file, 'placed', 'train@latest', data_dir=str(tmp_path / 'data'))['scalar']


@pytest.mark.slow
@pytest.mark.subprocess
def test_sigterm_during_enjoy_is_one_line(tmp_path, no_png):
    """The replay in a process of its own, stopped by SIGTERM; the run it replays trained here."""
    spec_file = write_spec_file(tmp_path / 'replay.json', {'replay': build_spec('PPO', max_frame=256)})
    env = {**os.environ, 'BROWSER_PATH': os.devnull + '/no-browser', 'PYTHONUNBUFFERED': '1'}
    lab.run(spec_file, 'replay', 'train', data_dir=str(tmp_path / 'data'))
    (run,) = run_dirs(tmp_path / 'data', 'replay')
    before = tree_digest(run)
    proc = subprocess.Popen([sys.executable, RUN_LAB, f'enjoy@{run}/replay_t0_s0_spec.json', '--episodes', '100000'],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().startswith('replaying')
    assert proc.stdout.readline().startswith('episode 1:')
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert err.strip().splitlines() == ['stopped by SIGTERM during the replay (it writes nothing)'], err
    assert tree_digest(run) == before
