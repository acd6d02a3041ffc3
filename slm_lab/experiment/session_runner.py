"""One session as the lab runs it, in its own process or in the lab's: its own log file and stop
signal, and a resume that falls back past damaged snapshots to the next older intact one."""
from __future__ import annotations

import time
from typing import Any, NamedTuple

from slm_lab.experiment.session import Session, Start
from slm_lab.experiment.signals import StopSignal
from slm_lab.lib import logger as lab_logger
from slm_lab.persistence.run_dir import RunDir
from slm_lab.persistence.snapshots import DamagedSnapshot, IntactSnapshots, Snapshot


class ResumePoint(NamedTuple):
    """What the lab read and checked before a resumed session runs in its own process: the
    session's newest intact snapshot, the session it built to check that the snapshot fits (its
    state loaded; None to build it again), why that continuation is approximate, and how long
    reading and loading took (the session's resume record counts it)."""

    snapshot: Snapshot
    session: Session | None
    approximate: list[str] | None
    seconds: float


def run_session(spec: dict, run_dir: RunDir, mode: str, trial: int, session: int, log_level: int,
                resume: bool = False, stop: StopSignal | None = None, global_nets=None,
                run_record: dict | None = None, report_to: tuple[Any, int] | None = None,
                resume_point: ResumePoint | None = None) -> dict:
    """Run one session with its own log file (in-process, or as a child process). With `resume`,
    continue from the session's newest intact snapshot (a session without one starts fresh: the
    lab has checked that it recorded nothing): `resume_point`'s when the lab read it already (the
    snapshot is then not read again, and its session, when given, not built again: it was built
    with this `stop`), else read here (a session in a child process reads its snapshot itself:
    its replay arrays are memory-mapped from the files, not sent through a pipe). When a
    snapshot's arrays turn out damaged before anything was written, the session starts again
    from the next older intact snapshot (persistence.snapshots.IntactSnapshots). `global_nets`:
    the trial's shared nets of meta.distributed, which the session trains. `run_record`,
    `report_to`: see Start (the run's resume is recorded at the first write, once a resumed
    session's snapshot has passed its checks)."""
    lab_logger.setup_console(log_level)
    handler = lab_logger.add_file_handler(str(run_dir.log_path(trial, session)), level=log_level)
    own_stop = stop is None
    stop = (stop or StopSignal()).install() if own_stop else stop
    built = resume_point.session if resume_point is not None else None  # the session the lab built, if any
    try:
        if not resume:
            sess = Session(spec, run_dir, mode, trial, session, stop=stop)
            try:
                return sess.run(Start(global_nets=global_nets, run_record=run_record, report_to=report_to))
            finally:
                sess.close()
        first = resume_point.snapshot if resume_point is not None else None
        candidates = IntactSnapshots(run_dir.ckpt_dir(trial, session), run_dir.prename(trial, session), first)
        for snapshot, skipped in candidates:
            t0 = time.perf_counter()
            sess, built = built or Session(spec, run_dir, mode, trial, session, stop=stop), None
            approximate = None
            if snapshot is not None and snapshot is first:
                t0 -= resume_point.seconds  # read and loaded by the lab
                approximate = resume_point.approximate if sess is resume_point.session else None
            try:
                return sess.run(Start(snapshot, approximate, tuple(skipped), t0, True, global_nets, run_record,
                                      report_to))
            except DamagedSnapshot as e:
                candidates.damaged(e)
            finally:
                sess.close()
        raise AssertionError('unreachable: IntactSnapshots ends after a run that did not find damage')
    finally:
        if built is not None:  # not run (a damaged snapshot stopped it first)
            built.close()
        if own_stop:
            stop.uninstall()
        lab_logger.remove_handler(handler)
