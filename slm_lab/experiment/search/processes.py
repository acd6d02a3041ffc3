"""A search's trial processes: each trial runs in a process of trial.py started ahead of
its turn (its imports done while the trial before trains), by its Ray worker or, for the first
trial of a local search, by the driver before Ray starts; stopping one as SIGTERM does (its
sessions save snapshots)."""
from __future__ import annotations

import threading
import shutil
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from slm_lab.lib.io import atomic_write_text
from slm_lab.persistence.run_dir import RunDir

REPO_ROOT = Path(__file__).resolve().parents[3]


_SPARE: subprocess.Popen | None = None  # per Ray worker: a trial process started ahead, waiting for its trial


def _spawn_trial_process(args: tuple[str, ...] = (), **popen) -> subprocess.Popen:
    """A trial.py process (its line on stdin unless `args` say otherwise), in its own session,
    with the lab on its path."""
    env = dict(os.environ)
    paths = [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p]
    env['PYTHONPATH'] = os.pathsep.join([str(REPO_ROOT)] + paths)
    return subprocess.Popen([sys.executable, '-m', 'slm_lab.experiment.search.trial', *args], env=env,
                            stdin=popen.pop('stdin', subprocess.PIPE), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, **popen)


def start_trial_process(run_dir: RunDir, index: int):
    """Trial `index` in a process of trial.py, started ahead: the one the search's driver
    started before Ray (see DriverSpare), for the first trial that claims it, or the one this Ray
    worker started while its previous trial trained; else a new child. Another is started ahead
    for this worker's next trial. Returns a subprocess.Popen, or an AdoptedProcess (the driver's)."""
    global _SPARE
    line = (json.dumps([str(run_dir.root), run_dir.spec_name, index]) + '\n').encode()
    proc = DriverSpare.claim(line)
    if proc is None:
        proc = _SPARE if _SPARE is not None and _SPARE.poll() is None else _spawn_trial_process()
        _SPARE = None
        proc.stdin.write(line)
        proc.stdin.close()
    _SPARE = _spawn_trial_process()
    return proc


class AdoptedProcess:
    """A trial process the search's driver started (its child, not this worker's), used as the
    trainable uses a Popen: poll, send_signal, wait, kill. Its exit status comes from the file the
    driver writes when it reaps the process (DriverSpare.start)."""

    def __init__(self, pid: int, status: Path):
        self.pid, self.status, self.returncode = pid, status, None

    def poll(self) -> int | None:
        if self.returncode is None and self.status.exists():
            self.returncode = int(self.status.read_text())
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(f'trial process {self.pid}', timeout)
            time.sleep(0.05)
        return self.returncode


class DriverSpare:
    """The first trial's process, started by the search's driver before Ray starts, so that its
    imports (torch and the lab, about 2 s) run while Ray and Tune start (about 3 s) instead of after.
    It waits on a named pipe for its trial's line. The first trainable on this machine to claim it
    (an atomic rename of the pipe, named in SPARE_VAR) writes the line and adopts the process; the
    driver reaps it and writes its exit status beside the pipe. Local searches only: a trainable on
    another node has no such pipe and starts its own process."""

    SPARE_VAR = 'SLM_LAB_SPARE_TRIAL'

    def __init__(self, fifo: Path, proc: subprocess.Popen, reaper):
        self.fifo, self.proc, self.reaper = fifo, proc, reaper

    @classmethod
    def start(cls, folder: Path) -> 'DriverSpare':
        """The process and its pipe in `folder` (inside Ray's session directory of the search, so
        that what a killed search leaves goes with that directory; emptied first)."""
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        fifo = folder / 'trial.fifo'
        os.mkfifo(fifo, 0o600)
        # the child reads the pipe through a descriptor opened here, read and write: it holds the
        # pipe from its first instant (a claim, which renames the pipe, can come at any time) and
        # its read blocks until the line comes instead of ending at a writer's close
        fd = os.open(fifo, os.O_RDWR)
        try:
            proc = _spawn_trial_process(('--fd', str(fd)), stdin=subprocess.DEVNULL, pass_fds=(fd,))
        finally:
            os.close(fd)
        atomic_write_text(folder / 'pid', str(proc.pid))

        def reap():
            atomic_write_text(folder / 'status', str(proc.wait()))

        reaper = threading.Thread(target=reap, daemon=True, name='spare-trial-reaper')
        reaper.start()
        os.environ[cls.SPARE_VAR] = str(fifo)  # Ray's processes, started after this, inherit it
        return cls(fifo, proc, reaper)

    def close(self) -> None:
        """Stop the process if no trial took it, and remove the pipe's folder once it has ended."""
        os.environ.pop(self.SPARE_VAR, None)
        if self.fifo.exists():  # never claimed: it waits for a line that will not come
            self.proc.kill()
        stop_process(self.proc)  # claimed and still running (its trainable did not stop it): a snapshot
        self.reaper.join(timeout=10)  # its status written before the folder goes
        shutil.rmtree(self.fifo.parent, ignore_errors=True)

    @classmethod
    def claim(cls, line: bytes) -> AdoptedProcess | None:
        """Give `line` to the driver's spare process when this is the first claim on this machine
        and the process is alive; None otherwise (the caller starts its own)."""
        fifo = os.environ.get(cls.SPARE_VAR)
        if not fifo:
            return None
        fifo = Path(fifo)
        claimed = fifo.with_name('claimed.fifo')
        try:
            os.rename(fifo, claimed)  # only one claim succeeds
            pid = int((fifo.parent / 'pid').read_text())
        except (OSError, ValueError):
            return None
        status = fifo.parent / 'status'
        end = time.monotonic() + 30.0
        while not status.exists():
            try:  # ENXIO: no reader, the process has ended (its status is on its way)
                fd = os.open(claimed, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                if time.monotonic() > end:
                    return None
                time.sleep(0.02)
                continue
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
            return AdoptedProcess(pid, status)
        return None  # it ended before its trial came


def stop_process(proc: 'subprocess.Popen | AdoptedProcess | None', timeout: float = 600.0) -> None:
    """SIGTERM a trial process (its sessions save snapshots) and wait for it; SIGKILL after timeout."""
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except ProcessLookupError:
        pass
