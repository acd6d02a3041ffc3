"""A stop signal that lands while the lab writes a log line: CI caught Ctrl-C arriving inside
logging's flush of the session's log file, where the handler's own log line re-entered the same
buffered writer (RuntimeError: reentrant call) and printed a traceback."""
from __future__ import annotations

import logging
import os
import signal

from slm_lab.experiment.signals import StopSignal


class GuardedStream:
    """A stream that fails as io.BufferedWriter does when written to from inside its own flush,
    and that receives a SIGTERM in the middle of its first flush (SIGTERM: a SIGINT that the
    shell running the tests ignores stays ignored, by design)."""

    def __init__(self):
        self.lines: list[str] = []
        self.in_flush = False
        self.signalled = False

    def write(self, text: str) -> None:
        if self.in_flush:
            raise RuntimeError('reentrant call inside GuardedStream')
        self.lines.append(text)

    def flush(self) -> None:
        self.in_flush = True
        try:
            if not self.signalled:
                self.signalled = True
                os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before os.kill returns to Python
        finally:
            self.in_flush = False


def test_a_stop_signal_during_a_log_write_is_said_at_once_on_the_console_and_then_in_the_log(capfd):
    stream = GuardedStream()
    handler = logging.StreamHandler(stream)
    errors = []
    handler.handleError = lambda record: errors.append(record)  # logging's traceback print, as in CI
    session_logger = logging.getLogger('slm_lab.session')
    session_logger.addHandler(handler)
    stop = StopSignal().install()
    try:
        session_logger.warning('a row of the training log')
        assert stream.signalled and not errors, 'the handler must not log from inside the flush'
        assert stop.signum == signal.SIGTERM
        console = capfd.readouterr().err  # written to descriptor 2 by the handler, at once
        assert console.count('SIGTERM received: stopping after this step') == 1, console
        assert not any('received' in line for line in stream.lines)  # the log's line: not yet, nothing asked
        assert stop.requested
        assert stop.requested  # said once
        said = [line for line in stream.lines if 'SIGTERM received: stopping after this step' in line]
        assert len(said) == 1 and not errors
        assert 'received' not in capfd.readouterr().err  # the console's line is not said again
    finally:
        stop.uninstall()
        session_logger.removeHandler(handler)


def test_a_stop_set_by_the_lab_itself_is_not_announced_as_received():
    """The pool sets signum to stop its other sessions cleanly: no signal came, none is claimed."""
    stream = GuardedStream()
    stream.signalled = True
    handler = logging.StreamHandler(stream)
    session_logger = logging.getLogger('slm_lab.session')
    session_logger.addHandler(handler)
    stop = StopSignal()
    try:
        stop.signum = signal.SIGTERM
        assert stop.requested
        assert not any('received' in line for line in stream.lines)
    finally:
        session_logger.removeHandler(handler)


def test_the_first_outside_signal_after_the_lab_stopped_by_itself_stops_and_does_not_exit():
    """A session that failed has the pool stop the others (it sets signum itself): a user's Ctrl-C
    then is a first signal, said and waited for, not the 'second' one that exits at once."""
    stop = StopSignal(announce=False).install()
    try:
        stop.signum = signal.SIGTERM  # as pool.py does
        os.kill(os.getpid(), signal.SIGTERM)  # exits the test process if taken for a second signal
        assert stop.requested and stop.signum == signal.SIGTERM
    finally:
        stop.uninstall()
