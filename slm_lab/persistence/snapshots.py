"""The snapshots of one session (`ckpt/{prename}/`): the newest intact one, damaged ones set
aside, and pruning to the newest few."""
from __future__ import annotations

import os
import shutil
from collections.abc import Collection
from pathlib import Path

from slm_lab.lib.errors import ResumeError
from slm_lab.lib.io import _fsync_dir
from slm_lab.persistence.snapshot import (SET_ASIDE_DIR, SNAPSHOT_DIR, STATE_FILE, UnknownSnapshotFormat, _check_crc,
                                          _scan, list_snapshots, logger, map_arrays, read_snapshot,
                                          verify_snapshot)
from slm_lab.persistence.state import PassedOver, Snapshot
from slm_lab.persistence.tmpfiles import cleanup_stale_tmp


def load_latest_snapshot(ckpt_dir: Path, skip: Collection = (), verify_arrays: bool = False,
                         damaged: list | None = None) -> Snapshot | None:
    """The newest intact snapshot (a Snapshot: state, manifest, path), falling back past damaged ones
    (and past those in `skip`, e.g. ones whose arrays failed the background check); None when there
    is none. The damaged ones passed over are the Snapshot's `passed_over` (path, what is wrong),
    for the caller to report and set aside; when `damaged` is a list, each is also appended to it
    as (path, ResumeError) (the only report when none is intact), else each is warned about here.
    `verify_arrays`: the array files are checksummed too (a full read), so a snapshot whose arrays
    are damaged is passed over as well. A snapshot of an unknown format version is refused
    (UnknownSnapshotFormat), not skipped."""
    skip = {Path(p) for p in skip}
    passed_over = []
    for path in list_snapshots(ckpt_dir):
        if path in skip:
            continue
        try:
            plain, manifest = read_snapshot(path, verify_arrays=verify_arrays)
            return Snapshot(map_arrays(plain, path, manifest['files']), manifest, path, plain, passed_over)
        except UnknownSnapshotFormat:
            raise
        except ResumeError as e:
            passed_over.append(PassedOver(path, problem_of(path, e)))
            if damaged is None:
                logger.warning(f'{e}; falling back to the previous snapshot')
            else:
                damaged.append((path, e))
    return None


def problem_of(path: Path, error: Exception) -> str:
    """What is wrong with the snapshot at `path`, from the error that says so (without the
    'snapshot {path}: ' its messages begin with)."""
    text = str(error)
    prefix = f'snapshot {path}: '
    return text[len(prefix):] if text.startswith(prefix) else text


def set_aside_damaged(path: Path) -> Path:
    """Rename a damaged snapshot to f<frame>.damaged (numbered when taken) so that no later resume
    picks it, without deleting it; prune_snapshots removes it once it is older than the newest
    intact snapshot. Returns the new path."""
    path = Path(path)
    target, n = path.with_name(f'{path.name}.damaged'), 1
    while os.path.lexists(target):
        target, n = path.with_name(f'{path.name}.damaged.{n}'), n + 1
    os.rename(path, target)
    _fsync_dir(path.parent)
    return target


def _intact(path: Path) -> bool | None:
    """True when the snapshot's manifest is well formed, its files have their sizes and state.pt
    its checksum; False when damaged; None for an unknown format version."""
    try:
        manifest = verify_snapshot(path, full=False)
        _check_crc(path, STATE_FILE, manifest['files'][STATE_FILE])
    except UnknownSnapshotFormat:
        return None
    except ResumeError:
        return False
    return True


def prune_snapshots(ckpt_dir: Path, keep: int) -> list[Path]:
    """Keep the newest `keep` (at least 1) intact snapshots of a session and return what was
    removed. The rule, newest first:
      - intact snapshots beyond the newest `keep` are removed; damaged ones never count toward
        `keep`, so they never push an intact one out;
      - a damaged snapshot (or one set aside by set_aside_damaged) older than the newest intact
        one is removed: a resume picks the newest intact snapshot and falls back past damaged ones,
        so it can never be used;
      - a damaged snapshot newer than every intact one is kept (a resume fell back past it; a
        save at its frame replaces it, and it goes once an intact snapshot is newer);
      - with no intact snapshot nothing is removed, nor is a snapshot of an unknown format version.
    'Intact' is checked cheaply (manifest, sizes, checksum of state.pt): reading big arrays at
    every save would cost a full read of a replay; their checksums are checked on resume.
    Leftovers of interrupted saves by dead processes are removed as well."""
    ckpt_dir = Path(ckpt_dir)
    keep = max(1, keep)
    kept_intact = 0
    removed = []
    candidates = _scan(ckpt_dir, SNAPSHOT_DIR) + _scan(ckpt_dir, SET_ASIDE_DIR)
    for _, path in sorted(candidates, key=lambda x: x[0], reverse=True):
        status = _intact(path) if SNAPSHOT_DIR.fullmatch(path.name) else False
        if status is None:
            continue
        if status and kept_intact < keep:
            kept_intact += 1
            continue
        if status or kept_intact:  # an intact one beyond `keep`, or damaged and older than an intact one
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed + cleanup_stale_tmp(ckpt_dir)
