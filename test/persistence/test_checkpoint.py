"""Snapshot files as a user relies on them when things go wrong: damaged arrays are found before
they are saved again, pruning never deletes the last intact snapshots, malformed manifests and odd
entries fall back instead of crashing, a full disk is one line that leaves the run resumable, and
the leftovers of killed writers are cleaned up."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import tmpfs

from slm_lab.lib import arrays
from slm_lab.persistence import snapshot as checkpoint, snapshots as session_snapshots
from slm_lab.lib.errors import DiskFullError, ResumeError
from slm_lab.lib.io import atomic_write_bytes, atomic_write_with, tmp_file_pid

ROOT = Path(__file__).resolve().parents[2]
SPEC = {'test': 'checkpoint'}  # save_snapshot only digests the spec
BIG = 1 << 18  # float32 elements: a 1 MiB array, big enough for its own memory-mapped .npy


def replay_state(seed: int = 0, n: int = BIG) -> dict:
    """A state shaped like a session's: small tensors in state.pt, one big array in its own file."""
    rng = np.random.default_rng(seed)
    return {'agent': {'net': {'w': torch.arange(6.0).reshape(2, 3)}, 'frame': 7},
            'memory': {'states': rng.random(n, dtype=np.float32), 'head': 3}}


def flip_byte(path: Path, offset_from_end: int = 1000) -> None:
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0xFF
    path.write_bytes(bytes(data))


def saved(tmp_path: Path, frames=(100,), seed: int = 0) -> list[Path]:
    ckpt = tmp_path / 'ckpt'
    return [checkpoint.save_snapshot(ckpt, f, replay_state(seed + i), SPEC) for i, f in enumerate(frames)]


# --- 1. a flipped byte in a memory-mapped array -------------------------------------------------

def test_background_check_finds_a_flipped_array_byte(tmp_path):
    (snap,) = saved(tmp_path)
    flip_byte(snap / 'memory.states.npy')
    state, manifest = checkpoint.load_snapshot(snap)  # arrays are checked by size only: it loads
    verifier = arrays.verify_arrays_async(snap, manifest)
    error = verifier.result(timeout=60)
    assert verifier.done()
    assert isinstance(error, ResumeError)
    assert 'memory.states.npy' in str(error) and 'checksum' in str(error)


def test_background_check_passes_an_intact_snapshot(tmp_path):
    (snap,) = saved(tmp_path)
    state, manifest = checkpoint.load_snapshot(snap)
    verifier = arrays.verify_arrays_async(snap, manifest)
    assert verifier.result(timeout=60) is None
    assert verifier.nbytes == manifest['files']['memory.states.npy']['size'] and verifier.seconds >= 0
    # and the next save, which reads the mapped array, writes an intact snapshot
    state['memory']['states'][:10] = 1.0  # copy-on-write: training changes the mapped replay
    new = checkpoint.save_snapshot(tmp_path / 'ckpt', 200, state, SPEC, verifier=verifier)
    assert checkpoint.verify_snapshot(new)['frame'] == 200
    np.testing.assert_array_equal(checkpoint.load_snapshot(new)[0]['memory']['states'][:10], 1.0)


@pytest.mark.parametrize('with_verifier', [True, False])
def test_damaged_mapped_array_is_never_saved_again(tmp_path, with_verifier):
    """Before: the damaged bytes went into the next snapshot under a freshly computed, valid CRC."""
    (snap,) = saved(tmp_path)
    flip_byte(snap / 'memory.states.npy')
    state, manifest = checkpoint.load_snapshot(snap)
    state['memory']['states'] = state['memory']['states'][:BIG // 2]  # a view of the mapping, as Replay saves
    with pytest.raises(ResumeError, match='memory.states.npy fails its checksum'):
        if with_verifier:
            verifier = arrays.verify_arrays_async(snap, manifest)
            checkpoint.save_snapshot(tmp_path / 'ckpt', 200, state, SPEC, verifier=verifier)
        else:  # the check happens at the save even when no verifier was started
            checkpoint.save_snapshot(tmp_path / 'ckpt', 200, state, SPEC)
    assert sorted(p.name for p in (tmp_path / 'ckpt').iterdir()) == [snap.name]  # nothing written


def test_small_slice_of_damaged_mapping_is_not_copied_into_state_pt(tmp_path):
    (snap,) = saved(tmp_path)
    flip_byte(snap / 'memory.states.npy', offset_from_end=4 * BIG - 100)  # near the start of the data
    state, _ = checkpoint.load_snapshot(snap)
    state['memory']['states'] = state['memory']['states'][:1000]  # under 1 MiB: would go into state.pt
    with pytest.raises(ResumeError, match='checksum'):
        checkpoint.save_snapshot(tmp_path / 'ckpt', 200, state, SPEC)


def test_fallback_load_with_verified_arrays_skips_the_damaged_one(tmp_path):
    old, new = saved(tmp_path, frames=(100, 200))
    flip_byte(new / 'memory.states.npy')
    _, _, path = session_snapshots.load_latest_snapshot(tmp_path / 'ckpt', verify_arrays=True)
    assert path == old
    _, _, path = session_snapshots.load_latest_snapshot(tmp_path / 'ckpt', skip=[new])
    assert path == old


# --- 2. pruning counts intact snapshots only ----------------------------------------------------

def test_pruning_keeps_the_newest_intact_snapshots(tmp_path):
    """Before: damaged snapshots counted toward keep, so with two damaged among the newest, only
    one intact snapshot survived a prune with keep=2 (and none with two damaged at the top)."""
    s100, s200, s300, s400 = saved(tmp_path, frames=(100, 200, 300, 400))
    (s400 / checkpoint.STATE_FILE).write_bytes(b'torn')  # damaged, newer than every intact one
    (s200 / checkpoint.MANIFEST).write_text('[]')  # damaged, between intact ones
    removed = session_snapshots.prune_snapshots(tmp_path / 'ckpt', keep=2)
    assert checkpoint.list_snapshots(tmp_path / 'ckpt') == [s400, s300, s100]
    assert removed == [s200]


def test_pruning_removes_nothing_without_an_intact_snapshot(tmp_path):
    snaps = saved(tmp_path, frames=(100, 200, 300))
    for snap in snaps:
        (snap / checkpoint.STATE_FILE).write_bytes(b'torn')
    removed = session_snapshots.prune_snapshots(tmp_path / 'ckpt', keep=1)
    assert checkpoint.list_snapshots(tmp_path / 'ckpt') == snaps[::-1]
    assert removed == []


def test_set_aside_snapshot_is_hidden_then_pruned_once_older_than_an_intact_one(tmp_path):
    s100, s200 = saved(tmp_path, frames=(100, 200))
    aside = session_snapshots.set_aside_damaged(s200)
    assert aside.name == 'f000000000200.damaged' and aside.is_dir()
    assert checkpoint.list_snapshots(tmp_path / 'ckpt') == [s100]
    assert session_snapshots.prune_snapshots(tmp_path / 'ckpt', keep=2) == []  # newer than every intact one
    (s300,) = saved(tmp_path, frames=(300,))
    assert session_snapshots.prune_snapshots(tmp_path / 'ckpt', keep=2) == [aside]
    assert checkpoint.list_snapshots(tmp_path / 'ckpt') == [s300, s100]


# --- 3. malformed manifests and odd entries -----------------------------------------------------

MALFORMED = {
    'a list': [],
    'a string': 'x',
    'null': None,
    'version only': {'format_version': 1},
    'files not an object': {'format_version': 1, 'frame': 200, 'files': 5},
    'no frame': {'format_version': 1, 'files': 'KEEP'},
    'frame is text': {'format_version': 1, 'frame': '200', 'files': 'KEEP'},
    'frame of another directory': {'format_version': 1, 'frame': 100, 'files': 'KEEP'},
    'version is text': {'format_version': '1', 'frame': 200, 'files': 'KEEP'},
    'file entry not an object': {'format_version': 1, 'frame': 200, 'files': {'state.pt': 3}},
    'a path outside the snapshot': {'format_version': 1, 'frame': 200,
                                    'files': {'state.pt': {'size': 1, 'crc32': 1}, '../x': {'size': 1, 'crc32': 1}}},
}


@pytest.mark.parametrize('case', sorted(MALFORMED))
def test_malformed_manifest_falls_back_to_the_previous_snapshot(tmp_path, case):
    old, new = saved(tmp_path, frames=(100, 200))
    good = json.loads((new / checkpoint.MANIFEST).read_text())
    manifest = MALFORMED[case]
    if isinstance(manifest, dict) and manifest.get('files') == 'KEEP':
        manifest = {**manifest, 'files': good['files']}
    (new / checkpoint.MANIFEST).write_text(json.dumps(manifest))
    _, loaded_manifest, path = session_snapshots.load_latest_snapshot(tmp_path / 'ckpt')
    assert path == old and loaded_manifest['frame'] == 100
    with pytest.raises(ResumeError, match='MANIFEST.json is malformed'):
        checkpoint.verify_snapshot(new)


def test_state_file_that_is_not_a_state_is_damage(tmp_path):
    """A state.pt with a valid checksum that torch cannot read: a ResumeError, not a traceback."""
    old, new = saved(tmp_path, frames=(100, 200))
    (new / checkpoint.STATE_FILE).write_bytes(b'not a torch file')
    manifest = json.loads((new / checkpoint.MANIFEST).read_text())
    manifest['files']['state.pt'] = {'size': 16, 'crc32': arrays.crc_file(new / checkpoint.STATE_FILE)}
    (new / checkpoint.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ResumeError, match='state.pt cannot be read'):
        checkpoint.load_snapshot(new)
    assert session_snapshots.load_latest_snapshot(tmp_path / 'ckpt').path == old


def test_odd_entries_in_the_snapshot_directory_are_ignored(tmp_path):
    (snap,) = saved(tmp_path)
    ckpt = tmp_path / 'ckpt'
    (ckpt / 'f000000000500').write_text('a file, not a snapshot')
    (ckpt / 'f²').mkdir()  # str.isdigit() is true for '²', int() is not
    (ckpt / 'fabc').mkdir()
    (ckpt / 'f000000000900').symlink_to(snap)
    (ckpt / '.f000000000700.tmp-1').mkdir()
    assert checkpoint.list_snapshots(ckpt) == [snap]
    assert session_snapshots.load_latest_snapshot(ckpt).path == snap
    assert checkpoint.list_snapshots(tmp_path / 'missing') == []


def test_unreadable_snapshot_directory_is_one_line(tmp_path, monkeypatch):
    def denied(path):
        raise PermissionError(13, 'Permission denied', str(path))
    monkeypatch.setattr(checkpoint.os, 'scandir', denied)
    with pytest.raises(ResumeError, match='cannot be listed.*Permission denied'):
        checkpoint.list_snapshots(tmp_path)


# --- 4. a full disk ---------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs mounted in tmp_path (root only; skipped where mounting is not permitted)."""
    with tmpfs(tmp_path / 'mnt', '2m') as mnt:
        yield mnt


def assert_no_leftovers(directory: Path) -> None:
    left = [p.name for p in directory.rglob('*') if '.tmp' in p.name]
    assert left == [], left


@pytest.mark.subprocess
@pytest.mark.parametrize('where', ['array file', 'state.pt'])
def test_disk_full_snapshot_is_removed_and_one_line(small_disk, where):
    """Before: OSError then torch's RuntimeError, and the partial snapshot kept the space."""
    ckpt = small_disk / 'ckpt'
    first = checkpoint.save_snapshot(ckpt, 100, {'agent': {'w': torch.zeros(10)}}, SPEC)
    free_before = os.statvfs(small_disk).f_bfree
    big = np.ones(3 * BIG, dtype=np.float32)  # 3 MiB on a 2 MiB disk
    state = {'memory': {'states': big}} if where == 'array file' else {'agent': {'w': torch.from_numpy(big)}}
    with pytest.raises(DiskFullError) as raised:
        checkpoint.save_snapshot(ckpt, 200, state, SPEC)
    message = str(raised.value)
    assert '\n' not in message and message.startswith('disk full: snapshot f000000000200')
    assert re.search(rf'needed about 3\.\d MB, \d\.\d MB free on the filesystem mounted at {small_disk}\)', message)
    assert 'partial snapshot was removed' in message and 'train@latest' in message
    assert checkpoint.list_snapshots(ckpt) == [first]
    checkpoint.verify_snapshot(first)
    assert_no_leftovers(small_disk)
    assert os.statvfs(small_disk).f_bfree == free_before  # the space is given back


@pytest.mark.subprocess
@pytest.mark.parametrize('writer', ['bytes', 'torch.save to a path'])
def test_disk_full_atomic_write_removes_its_temp_file(small_disk, writer):
    target = small_disk / 'model' / 'best.pt'
    big = torch.ones(3 * BIG)
    with pytest.raises(DiskFullError, match=f'disk full: writing {target} failed .*mounted at {small_disk}'):
        if writer == 'bytes':
            atomic_write_bytes(target, big.numpy().tobytes())
        else:
            atomic_write_with(target, lambda tmp: torch.save({'w': big}, tmp))
    assert not target.exists()
    assert_no_leftovers(small_disk)


def test_other_write_errors_are_not_disk_full(tmp_path):
    def fail(tmp):
        raise ValueError('not about space')
    with pytest.raises(ValueError):
        atomic_write_with(tmp_path / 'x.json', fail)
    assert list(tmp_path.iterdir()) == []


# --- 5. leftovers of killed writers ------------------------------------------------------------------

WRITER = textwrap.dedent('''
    import sys, time
    from slm_lab.lib.io import atomic_write_with
    def write(tmp):
        with open(tmp, 'w') as f:
            f.write('half')
        print('writing', flush=True)
        time.sleep(120)
    atomic_write_with(sys.argv[1], write)
''')


def start_writer(target: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, '-c', WRITER, str(target)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == 'writing'
    return proc


def test_atomic_temp_file_names_its_writer(tmp_path):
    seen = []
    atomic_write_with(tmp_path / 'x.txt', lambda tmp: (seen.append(tmp_file_pid(Path(tmp).name)),
                                                       Path(tmp).write_text('x')))
    assert seen == [os.getpid()] and (tmp_path / 'x.txt').read_text() == 'x'


@pytest.mark.subprocess
def test_leftovers_of_killed_writers_are_removed_and_live_ones_kept(tmp_path):
    run = tmp_path / 'run'
    killed = start_writer(run / 'info' / 'session_df.csv')
    live = start_writer(run / 'spec.json')
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        left = [p for p in (run / 'info').iterdir()]
        assert len(left) == 1 and tmp_file_pid(left[0].name) == killed.pid  # the kill left it behind
        snapshot_tmp = run / 'ckpt' / 's0' / f'.f000000000100.tmp-{killed.pid}'
        snapshot_tmp.mkdir(parents=True)
        (snapshot_tmp / 'state.pt').write_bytes(b'partial')
        own_tmp = run / 'ckpt' / 's0' / f'.f000000000200.tmp-{os.getpid()}'
        own_tmp.mkdir()
        live_tmp = [p for p in run.iterdir() if tmp_file_pid(p.name) == live.pid]

        removed = session_snapshots.cleanup_stale_tmp(run)

        assert sorted(removed) == sorted([left[0], snapshot_tmp])
        assert not left[0].exists() and not snapshot_tmp.exists()
        assert own_tmp.is_dir() and len(live_tmp) == 1 and live_tmp[0].exists()
    finally:
        live.kill()
        live.wait()
