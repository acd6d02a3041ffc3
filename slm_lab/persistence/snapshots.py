"""The snapshots of one session (`ckpt/{prename}/`) and what a read snapshot holds: the newest
intact one, the ones a session can continue from in turn (IntactSnapshots), damaged ones set aside,
pruning to the newest few; and the Snapshot class, the one accessor of a snapshot's parts. The
format of one snapshot (its files, manifest and checks) is snapshot.py's.

A session's snapshot state is `{component: component.state_dict()}` (Session.state_dict): its
nesting (the agent's algorithm inside the agent, the replay memory beside it, the env's wrapper
layers...) is known here and nowhere else outside persistence/, so a reader asks for
`nets(state)`, not for `state['agent']['algorithm']['nets']`.

    snapshot = load_latest_snapshot(ckpt_dir)      # a Snapshot, or None
    snapshot.frame, snapshot.nets, snapshot.obs_norm, snapshot.agent_state

A Snapshot read in one process continues in another without being read again: `portable()` is
what the state file held (tensors, no mapped arrays) with its manifest and directory, small
enough to send to a session's process, where `Snapshot.reopen` maps its array files again.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import NamedTuple

from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import ResumeError
from slm_lab.lib.arrays import map_arrays
from slm_lab.lib.io import fsync_dir
from slm_lab.persistence.env_state import obs_norm_from_state
from slm_lab.persistence.snapshot import (SET_ASIDE_DIR, SNAPSHOT_DIR, STATE_FILE, UnknownSnapshotFormat,
                                          check_file_crc, list_snapshots, read_snapshot, scan_dirs, verify_snapshot)
from slm_lab.persistence.tmpfiles import cleanup_stale_tmp


def nets(state: dict) -> dict[str, dict]:
    """The algorithm's nets: {net name: its state_dict}."""
    return state['agent']['algorithm']['nets']


def optimizers(state: dict) -> dict[str, dict]:
    """The algorithm's optimizers: {optimizer name: its state_dict}."""
    return state['agent']['algorithm']['optimizers']


def agent_state(state: dict) -> dict:
    """The agent's part (Agent.state_dict()): its algorithm's and its memory's states."""
    return state['agent']


def env_state(state: dict) -> dict:
    """The training vector env's state (env_state.vector_env_state_dict)."""
    return state['env']


def obs_norm(state: dict) -> dict | None:
    """The observation-normalisation statistics of the training env, None when not normalised."""
    return obs_norm_from_state(env_state(state))


def global_state(state: dict) -> dict | None:
    """meta.distributed: the global nets as the session read them ('mode', 'updates', 'nets',
    'optimizers'); None in a session that trained alone."""
    return state.get('global')


def best_model(state: dict) -> dict | None:
    """What model_best.pt held at the snapshot's frame (None before the first, and in snapshots of
    older lab versions)."""
    return state.get('best_model')


class PassedOver(NamedTuple):
    """A damaged snapshot passed over on the way to an older intact one, and what is wrong with it."""

    path: Path
    problem: str


class Portable(NamedTuple):
    """A snapshot as it travels to another process: the state file's plain contents (arrays as
    references to their files), the manifest and the snapshot's directory, and the damaged
    snapshots passed over to reach it."""

    plain: dict
    manifest: dict
    path: str
    passed_over: tuple[PassedOver, ...] = ()


class Snapshot:
    """A loaded snapshot: its state (arrays memory-mapped), manifest and directory. Unpacks as
    (state, manifest, path). `plain` (what its state file held, before the arrays were mapped)
    makes it portable to another process. `passed_over`: the newer snapshots of its session that
    were found damaged on the way to it (load_latest_snapshot), for whoever continues from it to
    report and set aside."""

    __slots__ = ('state', 'manifest', 'path', 'plain', 'passed_over')

    def __init__(self, state: dict, manifest: dict, path: Path, plain: dict | None = None,
                 passed_over: tuple[PassedOver, ...] = ()):
        self.state, self.manifest, self.path, self.plain = state, manifest, Path(path), plain
        self.passed_over = tuple(passed_over)

    def __iter__(self):
        return iter((self.state, self.manifest, self.path))

    def portable(self) -> Portable:
        """What another process needs to continue from this snapshot without reading it again."""
        if self.plain is None:
            raise ValueError(f'snapshot {self.path} was not loaded with its plain state: it cannot be sent on')
        return Portable(self.plain, self.manifest, str(self.path), self.passed_over)

    @classmethod
    def reopen(cls, portable: Portable) -> Snapshot:
        """The snapshot `portable()` sent, its array files mapped again (not read: the state file's
        contents came with it, and the arrays' checks run as after any load)."""
        path = Path(portable.path)
        return cls(map_arrays(portable.plain, path, portable.manifest['files']), portable.manifest, path,
                   portable.plain, portable.passed_over)

    @property
    def frame(self) -> int:
        """The frame the snapshot was taken at."""
        return self.manifest['frame']

    @property
    def nets(self) -> dict[str, dict]:
        return nets(self.state)

    @property
    def optimizers(self) -> dict[str, dict]:
        return optimizers(self.state)

    @property
    def agent_state(self) -> dict:
        return agent_state(self.state)

    @property
    def env_state(self) -> dict:
        return env_state(self.state)

    @property
    def obs_norm(self) -> dict | None:
        return obs_norm(self.state)

    @property
    def global_state(self) -> dict | None:
        return global_state(self.state)

    @property
    def best_model(self) -> dict | None:
        return best_model(self.state)


logger = lab_logger.get_logger('slm_lab.checkpoint')
session_logger = lab_logger.get_logger('slm_lab.session')  # a resume's lines belong to the session's log


class DamagedSnapshot(Exception):
    """A resumed snapshot's memory-mapped arrays failed their checksum before anything was written."""

    def __init__(self, path, message: str):
        super().__init__(message)
        self.path = path


class IntactSnapshots:
    """The snapshots a session can continue from, newest intact first: iterating yields
    (snapshot, skipped), `first` (a snapshot the caller read already) before the ones read here;
    (None, []) when the session has none (a fresh start: the lab has checked that it recorded
    nothing). After each yield the caller runs the session from that snapshot; when the run finds
    the snapshot's arrays damaged before anything was written (DamagedSnapshot), it reports that
    with `damaged(error)` and the iteration goes on to the next older intact snapshot; otherwise
    the iteration ends. Every damaged snapshot passed over (its files damaged, its manifest
    damaged or missing, or its arrays failing their checksums) is said in a warning and set aside
    as f{frame}.damaged (never deleted, and so never overwritten by a later save of that frame)
    once an older intact snapshot is found; `skipped` lists them ({'snapshot', 'problem',
    'kept_as'}) for the session's resume record. ResumeError when array-damaged snapshots leave
    none intact.

        candidates = IntactSnapshots(ckpt_dir, prename)
        for snapshot, skipped in candidates:
            try:
                return run_from(snapshot, skipped)
            except DamagedSnapshot as e:
                candidates.damaged(e)
    """

    def __init__(self, ckpt_dir: Path, prename: str, first: Snapshot | None = None):
        self.ckpt_dir, self.prename, self.first = Path(ckpt_dir), prename, first
        self._array_damaged: list[Path] = []  # snapshots whose arrays failed their checksums, newest last
        self._to_set_aside: dict[Path, str] = {}  # damaged snapshots passed over, not yet set aside: what is wrong
        self._skipped: list[dict] = []  # those set aside, for the resume record
        self._retry = False

    def damaged(self, error: DamagedSnapshot) -> None:
        """The snapshot last yielded had damaged arrays and nothing was written: go on to the next."""
        session_logger.warning(f'{self.prename}: {error}; nothing was written: starting again from the previous '
                               'snapshot')
        self._array_damaged.append(Path(error.path))
        self._to_set_aside[Path(error.path)] = problem_of(error.path, error)
        self._retry = True

    def __iter__(self):
        snapshot = self.first
        while True:
            if snapshot is None:
                snapshot = load_latest_snapshot(self.ckpt_dir, skip=self._array_damaged, damaged=[])
            if snapshot is None:
                if self._array_damaged:  # each failed before anything was written, and none is deleted
                    raise ResumeError(f'{self.prename}: the arrays of snapshot {self._array_damaged[-1]} are damaged '
                                      'and no older intact snapshot is left; nothing of this session was written or '
                                      'deleted: start a new run (SPEC_FILE SPEC_NAME train)')
                yield None, []
                return
            self._set_aside_passed_over(snapshot)
            self._retry = False
            yield snapshot, list(self._skipped)
            if not self._retry:
                return
            snapshot = None

    def _set_aside_passed_over(self, snapshot: Snapshot) -> None:
        """An older intact snapshot was found: the damaged ones passed over go aside, newest first."""
        for path, problem in snapshot.passed_over:
            self._to_set_aside.setdefault(Path(path), problem)
        for path in sorted(self._to_set_aside, key=lambda p: p.name, reverse=True):
            if not path.is_dir():  # another process set it aside meanwhile
                continue
            aside = set_aside_damaged(path)
            problem = self._to_set_aside[path]
            session_logger.warning(f'{self.prename}: skipped damaged snapshot {path.name} ({problem}); '
                                   f'it is kept as {aside.name}; continuing from {Path(snapshot.path).name}')
            self._skipped.append({'snapshot': path.name, 'problem': self._to_set_aside[path], 'kept_as': aside.name})
        self._to_set_aside.clear()


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
    fsync_dir(path.parent)
    return target


def _intact(path: Path) -> bool | None:
    """True when the snapshot's manifest is well formed, its files have their sizes and state.pt
    its checksum; False when damaged; None for an unknown format version."""
    try:
        manifest = verify_snapshot(path, full=False)
        check_file_crc(path, STATE_FILE, manifest['files'][STATE_FILE])
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
    candidates = scan_dirs(ckpt_dir, SNAPSHOT_DIR) + scan_dirs(ckpt_dir, SET_ASIDE_DIR)
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
