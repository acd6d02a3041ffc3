"""Stop signals and process lifetime, shared by the lab's processes (sessions, search trials, the
search driver). No torch here: Ray's workers import this through the search without paying for it."""
from __future__ import annotations

import ctypes
import contextlib
import logging
import os
import signal

from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import EXIT_CODES, handle_stop, stop_signals

logger = lab_logger.get_logger('slm_lab.session')
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


class StopSignal:
    """Turns the first SIGTERM/SIGINT into a request to stop after the current step (so the
    session can save a snapshot); a second one exits at once. A SIGINT that whoever started the
    process ignores (a shell's background job, nohup's caller) stays ignored, as it is before
    training (errors.catch_stops) and as Python leaves it: the same rule from the first instant
    to the last, so a terminal's Ctrl-C never stops a job it does not own; SIGTERM stops it.

    The handler writes nothing through Python's streams: it may run in the middle of a write to
    the log file or the console (Python runs handlers between bytecodes, also inside logging's
    flush), where logging again would re-enter the same buffered stream and fail. The console
    line (`announce`) goes straight to file descriptor 2, at once; the log file's line is logged
    by the first `requested` that sees the signal, which the loops ask every step.
    """

    def __init__(self, announce: bool = True):
        self.signum: int | None = None
        self.announce = announce  # say so on the console: once per command, by the lab's own process
        self._previous = {}
        self._received: int | None = None  # a signal the handler recorded and no one has announced
        self._heard = False  # a stop signal came from outside (the lab may set signum itself: pool.py)

    def install(self) -> 'StopSignal':
        for sig in (signal.SIGTERM, signal.SIGINT):
            if sig == signal.SIGINT and signal.getsignal(sig) == signal.SIG_IGN:
                continue
            self._previous[sig] = signal.signal(sig, self._handle)
        if self._previous.get(signal.SIGTERM) is handle_stop and stop_signals():
            # the command's stop came before (deferred, or lost on its way): said as if it came now
            self.signum = self._received = stop_signals()[0]
            self._heard = True
            self._say_on_console(self.signum)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum, _frame) -> None:
        if self._heard:  # the second: at once
            os._exit(EXIT_CODES.get(signum, 1))
        self._heard = True
        if self.signum is None:  # else the lab is stopping already, by the signal it chose
            self.signum = signum
        self._received = signum
        self._say_on_console(signum)

    def _say_on_console(self, signum: int) -> None:
        """The console's line, once, by the lab's own process (`announce`): written to file
        descriptor 2 directly, as the logger's console handler would format it."""
        if not self.announce:
            return
        record = logging.LogRecord(logger.name, logging.WARNING, __file__, 0, _announcement(signum), None, None)
        try:
            os.write(2, (_CONSOLE_FORMAT.format(record) + '\n').encode())
        except OSError:  # no console to write to
            pass

    @property
    def requested(self) -> bool:
        signum = self.signum  # read first: a signal arriving after it is announced at the next call
        received = self._received
        if received is not None:  # the session's log file says it, in every process
            self._received = None  # (a signal between these lines is a second one: it exits at once)
            logger.warning(_announcement(received), extra=lab_logger.FILE_ONLY)
        return signum is not None


_CONSOLE_FORMAT = logging.Formatter(lab_logger.LOG_FORMAT, '%Y-%m-%d %H:%M:%S')


def _announcement(signum: int) -> str:
    return (f'{signal.Signals(signum).name} received: stopping after this step and saving a snapshot; during '
            'an evaluation at once, keeping the last snapshot (send it again to exit at once)')


@contextlib.contextmanager
def keep_stop_handlers():
    """While it lasts, SIGINT and SIGTERM keep the handlers they have: a library that sets its own
    for them meanwhile is not heard (ray.init sets one by which SIGTERM exits the process at once,
    with exit code 15, and no way to turn it off). It replaces signal.signal, through which every
    Python handler is set, for that time; the handlers of other signals are set as asked. At its
    end the handlers are set again, for a C library that set its own beneath Python's."""
    set_handler = signal.signal

    def set_unless_stop(signum, handler):
        if signum in STOP_SIGNALS:
            return signal.getsignal(signum)
        return set_handler(signum, handler)

    signal.signal = set_unless_stop
    try:
        yield
    finally:
        signal.signal = set_handler
        for signum in STOP_SIGNALS:
            handler = signal.getsignal(signum)
            if handler is not None:  # None: not set from Python
                signal.signal(signum, handler)


def die_with_parent() -> None:
    """Linux: have the kernel kill this process if the lab's process dies (even by SIGKILL)."""
    try:
        libc = ctypes.CDLL('libc.so.6', use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
