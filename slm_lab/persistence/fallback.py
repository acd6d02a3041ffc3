"""Continuing a session past damage: the retry that falls back from a snapshot whose arrays fail
their checksums to the next older intact one (nothing having been written meanwhile), and making
model_best.pt agree with the snapshot a session continues from."""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import ResumeError
from slm_lab.persistence.model_file import DamagedModelFile, load_model_file, save_model_file
from slm_lab.persistence.snapshots import load_latest_snapshot, problem_of, set_aside_damaged
from slm_lab.persistence.state import Snapshot

logger = lab_logger.get_logger('slm_lab.session')  # these lines belong to the session's log


class DamagedSnapshot(Exception):
    """A resumed snapshot's memory-mapped arrays failed their checksum before anything was written."""

    def __init__(self, path, message: str):
        super().__init__(message)
        self.path = path


def continue_from_newest(ckpt_dir: Path, prename: str, build: Callable[[], Any],
                         attempt: Callable[[Any, Snapshot | None, list[dict], float], dict],
                         first: Snapshot | None = None) -> dict:
    """Run a session from its newest intact snapshot: `build()` makes the session (anything with
    a close()), then `attempt(session, snapshot, skipped, t0)` runs it (`t0`: perf_counter
    before the session was built) from `first` when the caller read it already, else from the
    newest intact snapshot in ckpt_dir, or from None when there is none (a fresh start: the lab
    has checked that the session recorded nothing). When the attempt raises DamagedSnapshot,
    nothing was written: a new session runs again from the next older intact snapshot.
    Every damaged snapshot passed over (its files damaged, its manifest damaged or missing, or,
    found here, its arrays failing their checksums) is said in a warning and set aside as
    f{frame}.damaged (never deleted, and so never overwritten by a later save of that frame) once
    an older intact snapshot is found; `skipped` lists them ({'snapshot', 'problem', 'kept_as'})
    for the session's resume record. Returns what the attempt returns; the session is closed
    after."""
    array_damaged: list[Path] = []  # snapshots whose arrays failed their checksums, newest last
    to_set_aside: dict[Path, str] = {}  # damaged snapshots passed over, not yet set aside: what is wrong
    skipped: list[dict] = []  # those set aside, for the resume record
    snapshot = first
    while True:
        t0 = time.perf_counter()
        session = build()
        try:
            if snapshot is None:
                snapshot = load_latest_snapshot(ckpt_dir, skip=array_damaged, damaged=[])
            if snapshot is None:
                if array_damaged:  # each failed before anything was written, and none is deleted
                    raise ResumeError(f'{prename}: the arrays of snapshot {array_damaged[-1]} are damaged and no '
                                      'older intact snapshot is left; nothing of this session was written or '
                                      'deleted: start a new run (SPEC_FILE SPEC_NAME train)')
                return attempt(session, None, [], t0)
            for path, problem in snapshot.passed_over:
                to_set_aside.setdefault(Path(path), problem)
            # an older intact snapshot was found: now the damaged ones can go aside, newest first
            for path in sorted(to_set_aside, key=lambda p: p.name, reverse=True):
                if not path.is_dir():  # another process set it aside meanwhile
                    continue
                aside = set_aside_damaged(path)
                logger.warning(f'{prename}: skipped damaged snapshot {path.name} ({to_set_aside[path]}); it is kept as '
                               f'{aside.name}; continuing from {Path(snapshot.path).name}')
                skipped.append({'snapshot': path.name, 'problem': to_set_aside[path], 'kept_as': aside.name})
            to_set_aside.clear()
            return attempt(session, snapshot, list(skipped), t0)
        except DamagedSnapshot as e:
            logger.warning(f'{prename}: {e}; nothing was written: starting again from the previous snapshot')
            array_damaged.append(Path(e.path))
            to_set_aside[Path(e.path)] = problem_of(e.path, e)
            snapshot = None
        finally:
            session.close()


def reconcile_best_model(path: Path, best_model: dict | None, frame: int, approximate: bool, prename: str) -> None:
    """Make model_best.pt (`path`) the best weights as of the snapshot a session continues from at
    `frame` (`best_model`: what the snapshot says it held). After a crash, the file may come from
    frames past the snapshot (a future that the resume discards); an exact resume will write the
    same again, an `approximate` one may never, so that file is kept aside."""
    if best_model is None and not path.exists():
        return
    try:
        disk_frame = load_model_file(path)[0].get('frame') if path.exists() else None
    except DamagedModelFile as e:  # torn, or its bytes changed: replaced from the snapshot, or kept aside
        disk_frame = -1
        if best_model is None:
            aside = path.with_name(f'{path.stem}_damaged.pt')
            os.replace(path, aside)
            logger.warning(f'{prename}: {e}; kept aside as {aside.name} (the snapshot holds no best weights '
                           'yet, so the next evaluation writes new ones)')
            return
        logger.warning(f'{prename}: {e}; written again from the best weights in the snapshot')
    best_frame = best_model['frame'] if best_model is not None else None
    if disk_frame == best_frame:
        return
    if disk_frame is not None and disk_frame > frame and approximate:
        aside = path.with_name(f'{path.stem}_discarded_f{disk_frame}.pt')
        os.replace(path, aside)
        logger.warning(f'{prename}: {path.name} came from frame {disk_frame}, past the snapshot this resume '
                       f'continues from (frame {frame}); kept aside as {aside.name}')
    if best_model is not None:
        save_model_file(path, best_model)
    elif path.exists() and disk_frame is not None and disk_frame > frame:
        os.replace(path, path.with_name(f'{path.stem}_discarded_f{disk_frame}.pt'))
