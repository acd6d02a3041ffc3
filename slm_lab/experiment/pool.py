"""Running a trial's sessions in spawned processes (run_in_processes), each as session_runner.run_session
runs one: at most one per CPU core at once, stop signals passed on once, a killed or failing
session stopping the others, the run's resume recorded once at the first session's first write."""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import sys
import traceback
import types
from queue import Empty

from slm_lab import resources
from slm_lab.experiment import viz
from slm_lab.experiment.session import continue_mode
from slm_lab.experiment.session_runner import ResumePoint, run_session
from slm_lab.experiment.signals import STOP_SIGNALS, StopSignal, die_with_parent
from slm_lab.lib import errors as lab_errors_module
from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import LabError, Preempted, SessionKilled
from slm_lab.persistence.resume import append_run_record
from slm_lab.persistence.run_dir import RunDir
from slm_lab.persistence.snapshots import Portable, Snapshot

logger = lab_logger.get_logger('slm_lab.session')


def _warm_up() -> None:
    """What a session process pays once beyond its imports, paid while it waits for its turn:
    plotly loads its validators at the first graph. (Not torch's compiler, which torch would import
    at the first optimizer: the lab trains without it where no step hooks are set,
    agent/net/compiler_import.py.)"""
    viz.warm_up()


def _session_worker(args, queue, lab_pid: int, global_nets=None, report_first_write: bool = False,
                    go=None, read: tuple[Portable, float] | None = None) -> None:
    """A session's process. `go`: an event of a process started ahead of its turn (imports and
    warm-up done while the sessions before it run); it waits for the lab to set it. The process
    ends with os._exit once its report is sent: the interpreter's teardown of torch and the
    other modules (about a second) would only delay the next session. `read`: the snapshot the
    lab read and checked for this session (Snapshot.portable) and the seconds that took."""
    # own process group: a terminal's Ctrl-C reaches only the lab process, which asks each
    # session to stop exactly once
    os.setpgrp()
    die_with_parent()
    if os.getppid() != lab_pid:  # the lab died while this process started: the death signal missed it
        os._exit(1)
    if go is not None:
        _warm_up()
        while not go.wait(0.5):
            if os.getppid() != lab_pid:
                os._exit(1)
    try:
        _run_worker(args, queue, global_nets, report_first_write, read)
    finally:
        queue.close()
        queue.join_thread()  # the report is in the pipe before the process ends
    os._exit(0)


def _run_worker(args, queue, global_nets, report_first_write: bool, read: tuple[Portable, float] | None) -> None:
    session = args[4]
    stop = StopSignal(announce=False).install()  # the lab's process said it for the command; it passes the signal on
    # the lab started this process with stop signals blocked (so a Ctrl-C to the terminal's
    # process group during start-up cannot kill it half-made); a pending one is handled now
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    queue.put(('started', session, None))  # from now on a SIGTERM from the lab is handled
    try:
        report_to = (queue, session) if report_first_write else None  # the lab records the run's resume
        # the snapshot the lab read and checked: its state file's contents came with `read`, so
        # only its arrays are mapped again here
        point = ResumePoint(Snapshot.reopen(read[0]), None, None, read[1]) if read is not None else None
        queue.put(('ok', session, run_session(*args, stop=stop, global_nets=global_nets,
                                              report_to=report_to, resume_point=point)))
    except Preempted as e:
        queue.put(('preempted', session, (e.signum, e.frame)))
    except LabError as e:  # a user-facing error (diverged, disk full, ...): the lab prints its line
        queue.put(('lab_error', session, (type(e).__name__, str(e))))
    except BaseException as e:  # report to the parent, which re-raises
        queue.put(('error', session, f'{type(e).__name__}: {e}\n{traceback.format_exc()}'))


@contextlib.contextmanager
def without_user_main():
    """Start a spawned process from the lab's own module only. multiprocessing's spawn runs the
    parent's `__main__` again in the child (as `__mp_main__`) so that functions defined there can
    be unpickled; a session needs none of them (its target is this module's), and a user's plain
    script without an `if __name__ == '__main__':` guard would then start the lab again in every
    session's process. The child learns what `__main__` is while `start()` runs, so a bare module
    stands in for it meanwhile (notebooks, `python -c` and interactive shells have no main file
    and never needed this)."""
    main = sys.modules.get('__main__')
    sys.modules['__main__'] = types.ModuleType('__main__')
    try:
        yield
    finally:
        if main is not None:
            sys.modules['__main__'] = main


def run_in_processes(specs: list[dict], run_dir: RunDir, mode: str, trial: int, log_level: int, resume: bool,
                     stop: StopSignal, global_nets=None, run_record: dict | None = None,
                     read: dict[int, tuple[Portable, float]] | None = None) -> list[dict]:
    """Run each session in its own process, at most `resources.session_pool_width()` (the CPU
    cores) running at once; the next runs when one ends. With more sessions than that, the next
    sessions' processes (as many as run at once) start ahead and wait for their turn, their
    imports done, so that a session follows the one before without a process start. SLM-Lab
    starts them all together, which with more sessions than cores only makes each slower while
    all of them hold their memory at once (1000 sessions: 1000 processes). The sessions of a distributed trial
    (`global_nets`) do start all together, as SLM-Lab's: they are the workers of one training.
    On a stop signal the started sessions are asked to stop once (each saves a snapshot) and
    the ones not started yet count as stopped; a failing session stops the others. Returns the
    session metrics in session order. `run_record`: train@'s record of the run's resume, appended
    to the run's resume log when the first session is about to write to the run. `read`: by session index, the
    snapshot the lab read and checked for it (Snapshot.portable()) and the seconds that took; the
    session continues from it without reading it again."""
    read = dict(read or {})
    viz.png_available()  # decided (and said) once for the command: the sessions' processes inherit it
    ctx = mp.get_context('spawn')
    queue = ctx.Queue()
    width = len(specs) if global_nets is not None else min(len(specs), resources.session_pool_width())
    if width < len(specs):
        logger.info(f'trial {trial}: {len(specs)} sessions, {width} at a time (one per CPU core)')
    waiting = list(range(len(specs)))  # not started yet, in session order
    procs: dict[int, mp.process.BaseProcess] = {}
    results: dict[int, dict] = {}
    preempted, errors, lab_errors, killed = [], [], [], []
    started, signalled, ended = set(), set(), set()  # ended: its outcome is known

    # with more sessions than slots, each slot's next session starts its process ahead (its
    # imports done while the sessions before it run) and waits for its event (`go`)
    ahead = len(specs) > width
    go: dict[int, object] = {}

    def launch(s: int) -> None:
        # not a daemon: a daemon may not start processes, and an async vector env is made of
        # them; the session still dies with the lab (PR_SET_PDEATHSIG) and is joined below
        go[s] = ctx.Event() if ahead else None
        proc = ctx.Process(target=_session_worker,
                           args=((specs[s], run_dir, mode, trial, s, log_level, resume),
                                 queue, os.getpid(), global_nets, run_record is not None, go[s],
                                 read.pop(s, None)))
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # inherited by the child
        try:
            with without_user_main():
                proc.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        procs[s] = proc

    released: list[int] = []  # sessions whose turn has come, in session order

    def schedule() -> None:
        """Give the turn to started processes while fewer than `width` sessions run; start the
        waiting sessions' processes: ahead of their turn (at most `width` of them), or at it."""
        running = sum(1 for r in released if r not in ended and procs[r].is_alive())
        if not ahead:
            while waiting and running < width:
                s = waiting.pop(0)
                launch(s)
                released.append(s)
                running += 1
            return
        for _ in range(2):  # the turn to processes started before, then to the ones started now
            for s in [s for s in procs if s not in released]:
                if running >= width:
                    break
                go[s].set()
                released.append(s)
                running += 1
            # the next ones only once the running ones have their imports done ('started'): a
            # core importing torch for a session ahead would slow the start of the one whose turn it is
            while waiting and len(procs) - len(released) < width and all(r in started or r in ended for r in released):
                launch(waiting.pop(0))

    def stopped_before_starting(s: int) -> None:  # nothing to save: stopped, not failed
        preempted.append((stop.signum, None))
        ended.add(s)

    try:
        while len(ended) < len(specs):
            if stop.requested:
                for s in waiting:
                    stopped_before_starting(s)
                waiting.clear()
                for s, p in procs.items():
                    if s in signalled or s in ended or not p.is_alive():
                        continue
                    if s in started:  # it saves a snapshot and reports 'preempted'
                        os.kill(p.pid, stop.signum)  # the signal the lab got, so its log names it
                    else:  # still starting up: nothing to save yet
                        p.kill()
                        stopped_before_starting(s)
                    signalled.add(s)
                if len(ended) >= len(specs):
                    break
            if not stop.requested:
                schedule()
            try:
                status, s, payload = queue.get(timeout=0.2)
            except Empty:
                for s, p in procs.items():
                    # dead first, then nothing queued: a report is in the pipe before its sender exits
                    if s not in ended and not p.is_alive() and queue.empty():
                        if stop.requested:
                            stopped_before_starting(s)
                            continue
                        if p.exitcode is not None and p.exitcode < 0:  # killed by a signal it cannot catch
                            killed.append((s, -p.exitcode))
                        else:
                            errors.append(f'session {s} process died without reporting (exit code {p.exitcode})')
                        ended.add(s)
                        stop.signum = stop.signum or signal.SIGTERM  # stop the others cleanly
                continue
            if status == 'started':
                started.add(s)
                continue
            if status == 'first_write':
                if run_record is not None:  # once: the sessions started later need not report
                    append_run_record(run_dir, run_record)
                    run_record = None
                continue
            if s in ended:  # killed while starting up and already counted as stopped
                continue
            ended.add(s)
            if status == 'ok':
                results[s] = payload
            elif status == 'preempted':
                preempted.append(payload)
            elif status == 'lab_error':
                lab_errors.append(payload)
                stop.signum = stop.signum or signal.SIGTERM  # stop the others cleanly
            else:
                errors.append(f'session {s} failed: {payload}')
                stop.signum = stop.signum or signal.SIGTERM  # stop the others cleanly
    finally:
        for p in procs.values():
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    if errors:
        raise RuntimeError('; '.join(errors))
    again = continue_mode(specs[0], run_dir)
    if killed:
        s, signum = killed[0]
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f'signal {signum}'
        why = ' (kill -9, or the out-of-memory killer: see `dmesg`)' if signum == signal.SIGKILL else ''
        raise SessionKilled(f'session {s} was killed by {name}{why} at some frame after its last snapshot; '
                            f'the other sessions stopped with snapshots; continue with {again}@{run_dir.root}', signum)
    if lab_errors:
        name, message = lab_errors[0]
        cls = getattr(lab_errors_module, name, LabError)
        raise (cls if isinstance(cls, type) and issubclass(cls, LabError) else LabError)(message)
    if preempted:
        frames = [f for _, f in preempted if f is not None]
        if frames:
            raise Preempted(stop.signum or preempted[0][0], min(frames))
        raise Preempted(stop.signum or preempted[0][0], None,
                        f'with {len(results)} session(s) finished and {len(preempted)} not started yet '
                        f'(they start with {again}@latest)' if results else None)
    return [results[s] for s in range(len(specs))]
