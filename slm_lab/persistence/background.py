"""A session's periodic writes done in one background thread, in order, while training goes on.

Every file the lab writes is written atomically and made durable: a temp file, fsync, rename,
fsync of the directory (lib/io.py, snapshot.py). The fsyncs wait on the disk: a few milliseconds
each on a local SSD, far more on a network filesystem, and a small run's snapshot, CSV rewrite or
model file needs several. At every log point that waiting stopped training (under load on the
project's VM, A2C CartPole's log points took a seventh of its loop, about half of it waiting on the
disk: docs/BENCHMARKS.md, "Writes off the training thread and the garbage collector").

`BackgroundWriter.submit(fn, *args)` queues a write; one worker thread runs the writes in the order
they were submitted, so a snapshot never lands before the records written ahead of it, exactly as
when they were written in line. The caller hands over data that nothing else will change: text
already rendered, tensors already copied (snapshot.PreparedSnapshot.detached says when a state
can go). A write that fails (a full disk) is reported by the next `submit` or `wait`, with its
own one-line error; its partial file was removed by the write itself, as always. A process
killed meanwhile loses the writes still queued, as it would lose the steps after them: the files
they would have replaced are intact, and a resume continues from the newest complete snapshot.

After a write fails, the writes queued behind it are skipped (a snapshot never lands after a
failed write of the records made before it). At most MAX_PENDING writes wait in the queue: a
`submit` beyond that first waits for the oldest, so a disk slower than the run's log points slows
the run down instead of piling copies of its state up in memory.

`wait()` returns once everything queued is on disk (the session calls it before the writes it
makes in line: the final snapshot, the one at a stop, the records at the end); `close()` waits
and stops the thread.
"""
from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

logger = logging.getLogger(__name__)
MAX_PENDING = 8  # queued writes before submit waits (a log point makes up to 5: two CSVs, two model files, a snapshot)


class BackgroundWriter:
    """One ordered queue of writes (see the module docstring). The thread starts at the first
    submit, so a writer that never writes costs nothing. After a write fails the writer is spent:
    the writes queued behind it are skipped, and every later submit or wait raises that error."""

    def __init__(self, name: str = 'slm-lab-writer'):
        self.name = name
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self._error: BaseException | None = None  # the first write that failed
        self._reported = False  # whether a submit or wait has raised it

    def submit(self, fn: Callable, *args, **kwargs) -> None:
        """Queue fn(*args, **kwargs), after the oldest queued writes while MAX_PENDING wait. Raises
        the error of an earlier write that failed, if any."""
        self._raise_error()
        self._pending = [f for f in self._pending if not f.done()]
        while len(self._pending) >= MAX_PENDING:
            self._pending.pop(0).exception()  # waits; an error is the writer's (_run)
            self._raise_error()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        self._pending.append(self._executor.submit(self._run, fn, args, kwargs))

    def wait(self) -> None:
        """Block until every queued write is done; raise the error of a write that failed."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.exception()  # waits
        self._raise_error()

    def close(self) -> None:
        """Wait for the queued writes and stop the thread. An error no submit or wait has raised
        yet is logged, not raised: close runs while the session ends for another reason, which it
        must not hide (the session's normal end waits with `wait` first, which raises)."""
        reported = self._reported
        try:
            self.wait()
        except Exception as e:  # noqa: BLE001 (reported, see the docstring)
            if not reported:
                logger.error(f'a background write failed: {type(e).__name__}: {e}')
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    def _run(self, fn: Callable, args: tuple, kwargs: dict) -> None:
        """A queued write, in the worker; skipped once one has failed."""
        if self._error is not None:
            return
        try:
            fn(*args, **kwargs)
        except BaseException as e:
            self._error = e

    def _raise_error(self) -> None:
        if self._error is not None:
            self._reported = True
            raise self._error
