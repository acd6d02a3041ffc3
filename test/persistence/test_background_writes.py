"""The session's periodic writes off the training thread (persistence/background.py) and the
collector freeze around the training loop (lib/gc_pause.py)."""
from __future__ import annotations

import gc
import logging
import threading
import time

import numpy as np
import pytest
import torch

from conftest import tmpfs
from lab_helpers import PPO, run_dirs, train_csv, write_spec
from slm_lab import lab
from slm_lab.lib import gc_pause
from slm_lab.lib.errors import DiskFullError
from slm_lab.lib.io import atomic_write_bytes, atomic_write_text
from slm_lab.persistence import snapshot as checkpoint
from slm_lab.persistence.background import BackgroundWriter

SPEC = {'test': 'background'}


def test_writes_land_in_the_order_they_were_submitted(tmp_path):
    target, done = tmp_path / 'rows.csv', []

    def slow_then(text):
        time.sleep(0.05)  # the first write is still at work while the later ones are queued
        atomic_write_text(target, text)
        done.append(text)

    writer = BackgroundWriter()
    writer.submit(slow_then, 'first')
    for i in range(5):
        writer.submit(lambda t=f'row {i}': (atomic_write_text(target, t), done.append(t)))
    writer.wait()
    assert done == ['first'] + [f'row {i}' for i in range(5)]
    assert target.read_text() == 'row 4'
    writer.close()
    assert not [t for t in threading.enumerate() if t.name.startswith(writer.name)]


def test_a_failed_write_is_raised_by_the_next_submit_or_wait(tmp_path):
    def fail(delay=0.0):
        time.sleep(delay)
        raise OSError('the disk went away')

    writer = BackgroundWriter()
    writer.submit(fail, 0.2)  # still at work when the next write is queued
    writer.submit(atomic_write_text, tmp_path / 'after.txt', 'written')  # queued after it: skipped
    with pytest.raises(OSError, match='the disk went away'):
        writer.wait()
    assert not (tmp_path / 'after.txt').exists(), 'a write queued after a failed one landed'
    # the writer is spent: a later write is refused with the same error, and nothing lands
    with pytest.raises(OSError, match='the disk went away'):
        writer.submit(atomic_write_text, tmp_path / 'never.txt', 'x')
    writer.close()
    assert not (tmp_path / 'never.txt').exists()

    writer = BackgroundWriter()
    writer.submit(fail)
    deadline = time.monotonic() + 10
    while writer._error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(OSError, match='the disk went away'):  # the next submit says so
        writer.submit(atomic_write_text, tmp_path / 'never.txt', 'x')
    writer.close()


def test_after_a_failed_write_nothing_queued_behind_it_lands(tmp_path):
    # a snapshot queued after a failed write of the records must not be there to resume from
    def fail():
        time.sleep(0.2)
        raise OSError('no space')

    writer = BackgroundWriter()
    writer.submit(fail)
    for name in ('snapshot', 'model'):
        writer.submit(atomic_write_text, tmp_path / name, name)
    writer.close()  # logs the error; the session's own error is what the user sees
    assert not list(tmp_path.iterdir())


def test_close_reports_a_failed_write_without_raising(caplog):
    writer = BackgroundWriter()
    writer.submit(lambda: 1 / 0)
    with caplog.at_level(logging.ERROR):
        writer.close()  # the session is ending for another reason, which this must not hide
    assert 'a background write failed: ZeroDivisionError: division by zero' in caplog.text
    caplog.clear()
    writer = BackgroundWriter()  # an error a wait raised already: the caller has it, not logged again
    writer.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        writer.wait()
    with caplog.at_level(logging.ERROR):
        writer.close()
    assert 'background write failed' not in caplog.text


@pytest.mark.subprocess
def test_a_full_disk_in_a_background_write_is_the_one_line_error_and_leaves_nothing(tmp_path):
    with tmpfs(tmp_path / 'mnt', '2m') as disk:
        target = disk / 'model' / 'latest.pt'
        writer = BackgroundWriter()
        writer.submit(atomic_write_bytes, target, np.ones(1 << 20).tobytes())  # 8 MB on a 2 MiB disk
        with pytest.raises(DiskFullError, match=f'disk full: writing {target} failed'):
            writer.wait()
        writer.close()
        assert not target.exists()
        assert not [p for p in disk.rglob('*') if '.tmp' in p.name]


def test_a_prepared_snapshot_holds_the_state_it_was_made_from(tmp_path):
    """What the writer thread writes is a copy: training changing the live state meanwhile does
    not reach the snapshot. A state with a big array (a replay) is not detached: it is written in line."""
    live = {'net': {'w': torch.zeros(4)}, 'rows': [{'frame': 1}], 'obs': np.zeros(3, dtype=np.float32),
            'names': {'a'}}
    prepared = checkpoint.prepare_snapshot(100, live)
    assert prepared.detached
    live['net']['w'].add_(1.0)
    live['rows'][0]['frame'] = 2
    live['rows'].append({'frame': 3})
    live['obs'][:] = 5.0
    live['names'].add('b')
    path = checkpoint.write_snapshot(tmp_path / 'ckpt', prepared, SPEC)
    state, _manifest = checkpoint.load_snapshot(path)
    assert torch.equal(state['net']['w'], torch.zeros(4))
    assert state['rows'] == [{'frame': 1}]
    assert np.array_equal(state['obs'], np.zeros(3, dtype=np.float32))
    assert state['names'] == {'a'}
    big = np.zeros(checkpoint.ARRAY_FILE_MIN_BYTES, dtype=np.uint8)
    assert not checkpoint.prepare_snapshot(200, {'memory': {'states': big}}).detached


def test_a_run_writes_its_periodic_snapshots_in_the_background_and_each_is_intact(tmp_path, no_png):
    spec = {**PPO, 'meta': {**PPO['meta'], 'checkpoint_frequency': 250, 'keep_checkpoints': 100}}
    spec_file = write_spec(tmp_path, 'bg', spec)
    before = {t.ident for t in threading.enumerate()}
    lab.run(spec_file, 'bg', 'train', ['env.max_frame=1500'], data_dir=str(tmp_path / 'data'))
    (run,) = run_dirs(tmp_path / 'data', 'bg')
    snapshots = checkpoint.list_snapshots(run / 'ckpt' / 'bg_t0_s0')
    # every checkpoint_frequency (250) frames, at the first vector step (4 envs) past it
    assert sorted(int(p.name[1:]) for p in snapshots) == [0, 252, 500, 752, 1000, 1252, 1500]
    for path in snapshots:
        checkpoint.verify_snapshot(path)
        assert checkpoint.load_snapshot(path)[0]['clock']['frame'] == int(path.name[1:])
    assert train_csv(run, 'bg')['frame'].tolist() == [500, 1000, 1500]
    assert not [p for p in run.rglob('*') if '.tmp' in p.name]
    # the writer thread ends with its session
    assert not [t for t in threading.enumerate() if t.ident not in before and t.name.startswith('slm-lab-writer')]


def test_the_heap_is_frozen_for_the_loop_and_given_back_after():
    assert gc.get_freeze_count() == 0
    with gc_pause.frozen_heap():
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with gc_pause.frozen_heap():  # a second session in the same process: one freeze
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen
    assert gc.get_freeze_count() == 0


def test_a_process_that_froze_objects_itself_keeps_its_freeze():
    gc.freeze()  # the Python API's user, say
    try:
        mine = gc.get_freeze_count()
        with gc_pause.frozen_heap():
            pass
        assert gc.get_freeze_count() == mine
    finally:
        gc.unfreeze()


def test_the_freeze_can_be_turned_off(monkeypatch):
    monkeypatch.setenv(gc_pause.OPT_OUT, 'plain')
    with gc_pause.frozen_heap():
        assert gc.get_freeze_count() == 0


def test_a_training_loop_runs_with_the_heap_frozen(tmp_path, no_png, monkeypatch):
    from slm_lab.agent import Agent
    counts = []
    act = Agent.act

    def counting_act(self, obs):
        counts.append(gc.get_freeze_count())
        return act(self, obs)

    monkeypatch.setattr(Agent, 'act', counting_act)
    spec_file = write_spec(tmp_path, 'frozen', PPO)
    lab.run(spec_file, 'frozen', 'train', ['env.max_frame=200'], data_dir=str(tmp_path / 'data'))
    assert counts and min(counts) > 0
    assert gc.get_freeze_count() == 0


def test_a_slow_disk_holds_the_run_back_instead_of_piling_writes_up(monkeypatch):
    from slm_lab.persistence import background
    monkeypatch.setattr(background, 'MAX_PENDING', 2)
    release, started = threading.Event(), []

    def blocked(i):
        started.append(i)
        release.wait(10)

    writer = BackgroundWriter()
    writer.submit(blocked, 0)
    writer.submit(blocked, 1)
    waited = threading.Thread(target=writer.submit, args=(blocked, 2))
    waited.start()
    waited.join(0.3)
    assert waited.is_alive(), 'the third write was queued while two waited'
    release.set()
    waited.join(10)
    writer.close()
    assert started == [0, 1, 2]


def test_a_message_names_the_newest_snapshot_on_disk_not_one_still_queued(tmp_path, monkeypatch, caplog):
    """A snapshot written by the writer thread counts as the one to continue from once it is on
    disk: a divergence or a stop met while it is queued waits for it, and one whose write failed
    leaves the snapshot before it named (the failure logged)."""
    import copy

    from lab_helpers import DQN
    from slm_lab.experiment import session as session_module
    from slm_lab.experiment.session import Session
    from slm_lab.experiment.trial import Trial
    from slm_lab.persistence.run_dir import RunDir
    from slm_lab.spec import validate_spec
    raw = copy.deepcopy(DQN)
    raw['env']['max_frame'] = 300
    spec = validate_spec(raw)
    run_dir = RunDir(tmp_path, 'queued')
    run_dir.create()
    session = Session(Trial(spec, run_dir, 'train').session_spec(0), run_dir, 'train', 0, 0)
    write, release = session_module.write_snapshot, threading.Event()
    try:
        session.save_snapshot()
        assert session.durable_snapshot_frame() == 0

        def held(*args, **kwargs):
            assert release.wait(10)
            return write(*args, **kwargs)
        monkeypatch.setattr(session_module, 'write_snapshot', held)
        session.clock.frame = 100
        session.save_snapshot(background=True)
        assert session.last_snapshot_frame == 0  # queued, not on disk yet
        threading.Timer(0.1, release.set).start()
        assert session.durable_snapshot_frame() == 100  # waited for it
        assert (session.ckpt_dir / f'f{100:012d}').is_dir()

        def disk_full(*args, **kwargs):
            raise DiskFullError('no space left on device writing the snapshot')
        monkeypatch.setattr(session_module, 'write_snapshot', disk_full)
        session.clock.frame = 200
        session.save_snapshot(background=True)
        with caplog.at_level(logging.ERROR):
            assert session.durable_snapshot_frame() == 100
        assert 'background write failed' in caplog.text and 'no space left' in caplog.text
        error = session._diverged({'loss': float('nan')})
        assert 'the snapshot at frame 100 is intact' in str(error)
    finally:
        session.close()
