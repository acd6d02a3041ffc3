"""Errors a user can cause (run_lab.py prints their message as one line and exits non-zero), and
the stop of a run by a signal."""

import signal

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
    """SIGTERM outside training (while a spec is checked, during enjoy@): the command ends as
    Ctrl-C ends it, with one line and exit code 143. A BaseException, as KeyboardInterrupt, so
    that no `except Exception` on the way turns it into another error."""

    exit_code = EXIT_CODES[signal.SIGTERM]


_TERMINATED: list[int] = []  # the SIGTERMs raise_terminated received


def raise_terminated(signum, _frame) -> None:
    """SIGTERM handler of the lab's command outside training (Trial installs its own meanwhile).
    The signal is also remembered: an exception raised from a handler can be lost when it lands
    in C code that clears errors (an extension module's import, a C-level hasattr), so the lab
    checks again before it first writes (check_terminated)."""
    _TERMINATED.append(signum)
    raise Terminated()


def terminated_signals() -> list[int]:
    """The SIGTERMs raise_terminated received in this process."""
    return list(_TERMINATED)


def clear_terminated() -> None:
    """Forget the SIGTERMs received: the command they ended has ended (a caller that runs several)."""
    _TERMINATED.clear()


def check_terminated() -> None:
    """Raise Terminated if raise_terminated received a SIGTERM that did not end the command."""
    if _TERMINATED:
        raise Terminated()


class DiskFullError(LabError):
    """A write failed because its disk (or the user's quota) is full. What was partly written has
    been removed, so earlier files (a run's previous snapshots) are intact; the message names the
    filesystem, the space needed where known, and the space free."""
