"""Trial: max_session sessions of one spec, their resume prepared from the snapshots the lab
read, and their metrics and graph aggregated."""
from __future__ import annotations

import copy
import logging
import os
import time

from slm_lab.experiment.distributed import GlobalNets, newest_global_state_of
from slm_lab.experiment.pool import run_in_processes
from slm_lab.experiment.results import fmt_metric, write_trial_results
from slm_lab.experiment.seeds import session_seed
from slm_lab.experiment.session import Session
from slm_lab.experiment.session_runner import ResumePoint, run_session
from slm_lab.experiment.signals import StopSignal
from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import ResumeError
from slm_lab.persistence.run_dir import RunDir
from slm_lab.persistence.snapshots import load_latest_snapshot
from slm_lab.persistence.snapshots import Portable, Snapshot
from slm_lab.spec import check_frames_reached, session_max_frame

logger = lab_logger.get_logger('slm_lab.session')


class Trial:
    """max_session sessions of one spec with seeds random_seed + 1000*trial + s; sessions run in
    parallel processes when there are several. Aggregates their metrics and graphs. With
    meta.distributed and several sessions, the sessions train one set of global nets together
    (experiment/distributed.py), each for its share of env.max_frame."""

    def __init__(self, spec: dict, run_dir: RunDir, mode: str = 'train', trial: int = 0, resume: bool = False):
        self.spec, self.run_dir, self.mode, self.index = spec, run_dir, mode, trial
        self.resume = resume
        self._snapshots: dict[int, Snapshot] | None = None  # read by the lab (check_resume)
        self._read: dict[int, tuple[Portable, float]] = {}  # what each session's process continues from
        self._resume_point: ResumePoint | None = None  # a single session's, checked in this process
        self.stop = StopSignal()  # installed while the trial runs; a session built before (check_resume) holds it
        self.max_session = 1 if mode == 'dev' else spec['meta']['max_session']
        self.log_level = logging.DEBUG if mode == 'dev' else logging.INFO
        # one session alone trains exactly as without meta.distributed: it runs in-process as one
        self.distributed = (spec['meta'].get('distributed') or False) if self.max_session > 1 else False

    def rename_run_dir(self, run_dir: RunDir) -> None:
        """The run directory took another name as it was created (run_dir.create_run_dir: another run
        had taken this one's in the same second); nothing of the trial has run yet."""
        self.run_dir = run_dir

    def session_spec(self, session: int | None) -> dict:
        """The spec of the trial (session None) or of one of its sessions, as the run directory
        saves it. As in SLM-Lab, a session's spec records the seed that session used as
        meta.random_seed; with meta.max_session 1 it is a spec that repeats that session alone
        (the first session of a run uses random_seed itself). The trial's spec keeps the base seed."""
        spec = copy.deepcopy(self.spec)
        meta = spec['meta']
        meta['trial'], meta['session'] = self.index, session
        if session is not None:
            meta['random_seed'] = session_seed(self.spec, self.index, session)
            meta['max_session'] = 1
            if meta.get('distributed'):
                # as SLM-Lab: each session runs its share of the frames (the records count each
                # session's own); the global nets are in CPU shared memory, so the nets are on the CPU
                spec['env']['max_frame'] = session_max_frame(self.spec, self.max_session)
                if self.distributed and spec['agent'].get('net'):
                    spec['agent']['net']['gpu'] = False
        return spec

    def run(self, run_record: dict | None = None) -> dict:
        """Run every session, then write the trial metrics and graph. Returns trial metrics.
        Raises Preempted when stopped by a signal (after every session saved a snapshot).
        `run_record`: train@'s record of the run's resume, appended to the run's resume log when the
        first session is about to write (its snapshot loaded and verified, or its fresh start made):
        the resume has happened then, and a try that fails earlier is not recorded."""
        specs = [self.session_spec(s) for s in range(self.max_session)]
        stop = self.stop.install()
        try:
            if self.max_session == 1:
                point, self._resume_point = self._resume_point, None
                session_metrics = [run_session(specs[0], self.run_dir, self.mode, self.index, 0, self.log_level,
                                               self.resume, stop, run_record=run_record, resume_point=point)]
            else:
                global_nets = self.global_nets(specs[0]) if self.distributed else None
                self._snapshots = None
                read, self._read = self._read, {}  # sent to the sessions' processes: not read again there
                session_metrics = run_in_processes(specs, self.run_dir, self.mode, self.index, self.log_level,
                                                   self.resume, stop, global_nets, run_record, read)
            return self.finish(session_metrics, stop)  # a stop signal here ends the run resumable
        finally:
            stop.uninstall()
            self.release()

    def check_resume(self, snapshots: dict[int, Snapshot], seconds: dict[int, float] | None = None,
                     advice: str = 'resume with the spec the run was trained with') -> dict[int, list]:
        """Load each session's snapshot (read once by the lab: `snapshots`, by session index, with
        how long each took to read in `seconds`) into a session built from its spec, so that a
        snapshot that does not fit (a net shape or env count changed with --force) is refused
        before the run changes. Nothing is written. A trial of one session keeps that session,
        its state loaded, to run it (run); the sessions of a trial of several run in their own
        processes, each sent what its snapshot's state file held (Snapshot.portable), so none is
        read twice. Returns, per session, why its continuation will be approximate (empty when
        exact)."""
        if snapshots:
            newest = max(snapshots.values(), key=lambda snapshot: snapshot.frame)
            check_frames_reached(self.spec, newest.frame, f'snapshot {newest.path}')
        approximate = {}
        for s, snapshot in snapshots.items():
            t0 = time.perf_counter()
            session = Session(self.session_spec(s), self.run_dir, self.mode, self.index, s, stop=self.stop)
            keep = self.max_session == 1 and s == 0
            try:
                approximate[s] = session.load_state_dict(snapshot.state, quiet=True)
            except (RuntimeError, KeyError, ValueError, IndexError, TypeError, AttributeError) as e:
                first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ''
                keep = False
                why = first if isinstance(e, ValueError) and first else f'{type(e).__name__}: {first}'
                raise ResumeError(f'snapshot {snapshot.path} does not fit this spec ({why}); {advice}') from None
            finally:
                if not keep:
                    session.close()
            took = (seconds or {}).get(s, 0.0) + time.perf_counter() - t0
            if keep:
                self._resume_point = ResumePoint(snapshot, session, approximate[s], took)
            elif self.max_session > 1:
                self._read[s] = (snapshot.portable(), took)
        self._snapshots = snapshots if self.distributed else None
        return approximate

    def release(self) -> None:
        """Close the session check_resume kept, if run did not take it (again is harmless)."""
        point, self._resume_point = self._resume_point, None
        if point is not None and point.session is not None:
            point.session.close()

    def global_nets(self, spec: dict):
        """meta.distributed: the global nets, built from session 0's spec in this process and
        put in shared memory; when resuming, with the global state of the sessions' newest snapshot."""
        mode = self.spec['meta']['distributed']
        restored = None
        if self.resume:
            snapshots = self._snapshots
            if snapshots is None:  # not read by the lab (check_resume): read here
                snapshots = {s: load_latest_snapshot(self.run_dir.ckpt_dir(self.index, s))
                             for s in range(self.max_session)}
            restored = newest_global_state_of(s for s in snapshots.values() if s is not None)
            if restored:  # named as the session's resume record names its own snapshot
                restored[1]['snapshot'] = os.path.relpath(restored[1]['snapshot'], self.run_dir.root)
        sess = Session(spec, self.run_dir, self.mode, self.index, 0)
        try:
            global_nets = GlobalNets.build(mode, sess.agent.algorithm, *(restored or (None, None)),
                                           n_sessions=self.max_session)
        finally:
            sess.close()
        if restored:
            logger.info(f'trial {self.index}: global nets ({mode}) restored from {restored[1]["snapshot"]} '
                        f'({restored[1]["updates"]} updates)')
        else:
            logger.info(f'trial {self.index}: global nets ({mode}) {", ".join(global_nets.nets) or "(none)"} for '
                        f'{self.max_session} sessions of {spec["env"]["max_frame"]} frames each')
        return global_nets

    def finish(self, session_metrics: list[dict], stop: StopSignal | None = None) -> dict:
        """Write the trial metrics and graph; Preempted when a stop signal arrives meanwhile."""
        metrics = write_trial_results(self.spec, self.run_dir, self.index, len(session_metrics), session_metrics,
                                      stop, self.spec['env']['max_frame'])
        s = metrics['scalar']
        logger.info(f'trial {self.index}: {len(session_metrics)} session(s) | final_return_ma '
                    f'{fmt_metric(s.get("final_return_ma"))} | strength {fmt_metric(s.get("strength"))} | '
                    f'consistency {fmt_metric(s.get("consistency"))}')
        return metrics
