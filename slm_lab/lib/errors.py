"""Errors a user can cause (run_lab.py prints their message as one line and exits non-zero), and
the stop of a run by a signal."""

import os
import signal
import sys

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + signal number, as shells report


class LabError(Exception):
    """Base of every user-caused error: the message names the cause and the fix."""

    exit_code = 2


class SpecError(LabError):
    """The spec file, spec name or spec content is invalid."""


class ModeError(LabError):
    """The lab mode on the command line is unknown or not available yet."""


class ResumeError(LabError):
    """A run cannot be resumed as asked."""


class DataDirError(LabError):
    """The data directory cannot hold run directories: not a directory, or not writable."""


class TrainingDiverged(LabError):
    """A loss or gradient norm became NaN or infinite; the session stopped without saving that state."""

    exit_code = 3


class SessionKilled(LabError):
    """A session's process was killed by a signal it could not catch (SIGKILL: `kill -9` or the
    out-of-memory killer), so it saved nothing at that point; the other sessions stopped with
    snapshots and the run continues with train@latest from the newest ones. Exit code 128 +
    the signal, as shells report a killed process."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class Preempted(Exception):
    """A session (or trial) stopped on SIGTERM/SIGINT after saving a snapshot at its current frame."""

    def __init__(self, signum: int, frame: int | None = None, where: str | None = None):
        if where is None:
            where = f'at frame {frame}; a snapshot was saved' if frame is not None else 'before training started'
        super().__init__(f'stopped by {signal.Signals(signum).name} {where}')
        self.signum, self.frame = signum, frame

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.signum, 1)


class Terminated(BaseException):
    """SIGTERM while the command writes a run directory, or during enjoy@ --record: the command
    ends as Ctrl-C ends it, with one line and exit code 143, what it was writing removed on the
    way out. A BaseException, as KeyboardInterrupt, so that no `except Exception` on the way turns
    it into another error."""

    exit_code = EXIT_CODES[signal.SIGTERM]


# How the lab's command meets SIGINT and SIGTERM before a trial or a search takes them over (each
# installs its own StopSignal, which saves snapshots). The command's handler, handle_stop, is in
# place from the first lines of run_lab.py and of the `slm-lab run` script (slm_lab/entry.py) and
# acts as the phase asks:
#   AT_ONCE  nothing written yet (imports, the checks, a replay): one line and exit, from the
#            handler itself; an exception raised there could land inside an extension module's
#            C import (numpy's "PyCapsule_Import could not import module datetime")
#   RAISE    a run directory is being written (begin_writing): KeyboardInterrupt / Terminated, so
#            that what was half written is removed on the way out
#   DEFER    what is written is kept and continues (defer_stops: a run directory renamed into
#            place, a search's): recorded for the StopSignal installed next, which stops the run
#            resumably; a second signal exits at once, as StopSignal's does
AT_ONCE, RAISE, DEFER = 'at once', 'raise', 'defer'
_STOPS: list[int] = []  # the SIGINTs and SIGTERMs handle_stop received
_PHASE = {'phase': RAISE, 'mode': None}  # the phase, and the command's mode (its stop line) once known


def stopped_line(signum: int, mode: str | None = None) -> str:
    """The one line of a command stopped by `signum` before it trained (or during a replay)."""
    if signum == signal.SIGINT:
        return 'interrupted'
    if mode is None:  # the command line not read yet
        return 'stopped by SIGTERM; nothing was written'
    if mode.startswith('enjoy@'):
        return 'stopped by SIGTERM during the replay (it writes nothing)'
    return 'stopped by SIGTERM before training started; nothing was written'


def catch_stops(at_once: bool) -> dict:
    """Install handle_stop for SIGINT and SIGTERM, in phase AT_ONCE (`at_once`: the command owns its
    process and has written nothing) or RAISE (a caller's process, which must not end). Returns the
    handlers it replaced. A SIGINT ignored by whoever started the process (a shell's background
    job, so that Ctrl-C at the terminal leaves it running) stays ignored, as Python leaves it."""
    _PHASE['phase'] = AT_ONCE if at_once else RAISE
    return {sig: signal.signal(sig, handle_stop) for sig in (signal.SIGINT, signal.SIGTERM)
            if not (sig == signal.SIGINT and signal.getsignal(sig) == signal.SIG_IGN)}


def set_stop_mode(mode: str | None) -> None:
    """The command's mode, once its command line is read: it words the line of a stop at once."""
    _PHASE['mode'] = mode


def handle_stop(signum, _frame) -> None:
    """The command's SIGINT/SIGTERM handler outside training (see AT_ONCE, RAISE, DEFER above)."""
    _STOPS.append(signum)
    phase = _PHASE['phase']
    if phase == AT_ONCE or (phase == DEFER and len(_STOPS) > 1):
        if phase == AT_ONCE:
            for stream in (sys.stdout, sys.stderr):
                try:  # what was printed before: its buffer is not flushed by os._exit
                    stream.flush()
                except (OSError, ValueError, RuntimeError):  # RuntimeError: the stream was mid-write
                    pass
            os.write(2, (stopped_line(signum, _PHASE['mode']) + '\n').encode())
        os._exit(EXIT_CODES[signum])
    if phase == RAISE:
        raise KeyboardInterrupt() if signum == signal.SIGINT else Terminated()


def begin_writing() -> None:
    """The command is about to write: from here a stop signal raises (RAISE), so that what was
    half written is removed on the way out. A stop that came earlier and was lost (an exception
    raised in a handler can vanish in C code that clears errors, such as a C-level hasattr)
    raises now."""
    if _PHASE['phase'] == AT_ONCE:
        _PHASE['phase'] = RAISE
    if _STOPS and _PHASE['phase'] == RAISE:
        raise KeyboardInterrupt() if _STOPS[0] == signal.SIGINT else Terminated()


def defer_stops() -> None:
    """What the command writes from here is kept (a run directory in place): a stop signal is
    recorded for the StopSignal installed next, which stops the run so that it can be continued."""
    _PHASE['phase'] = DEFER


def stop_signals() -> list[int]:
    """The SIGINTs and SIGTERMs handle_stop received in this process (since clear_stops)."""
    return list(_STOPS)


def clear_stops() -> None:
    """Forget the stops received: the command they ended has ended (a caller that runs several)."""
    _STOPS.clear()
    _PHASE['mode'] = None


class DiskFullError(LabError):
    """A write failed because its disk (or the user's quota) is full. What was partly written has
    been removed, so earlier files (a run's previous snapshots) are intact; the message names the
    filesystem, the space needed where known, and the space free."""
