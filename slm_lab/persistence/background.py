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

At most MAX_PENDING writes wait in the queue: a `submit` beyond that first waits for the oldest, so
a disk slower than the run's log points slows the run down instead of piling copies of its state up
in memory.

`wait()` returns once everything queued is on disk (the session calls it before the writes it
makes in line: the final snapshot, the one at a stop, the records at the end); `close()` waits
and stops the thread.
"""
from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

logger = logging.getLogger(__name__)
MAX_PENDING = 4  # queued writes (a snapshot's copy of the state among them) before submit waits


class BackgroundWriter:
    """One ordered queue of writes (see the module docstring). The thread starts at the first
    submit, so a writer that never writes costs nothing."""

    def __init__(self, name: str = 'slm-lab-writer'):
        self.name = name
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []

    def submit(self, fn: Callable, *args, **kwargs) -> None:
        """Queue fn(*args, **kwargs), after the oldest queued writes while MAX_PENDING wait. Raises
        the error of an earlier write that failed, if any."""
        self._raise_done()
        while len(self._pending) >= MAX_PENDING:
            future = self._pending.pop(0)
            if (e := future.exception()) is not None:
                raise e
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        self._pending.append(self._executor.submit(fn, *args, **kwargs))

    def wait(self) -> None:
        """Block until every queued write is done; raise the first error among them."""
        pending, self._pending = self._pending, []
        error = None
        for future in pending:
            e = future.exception()
            if e is not None and error is None:
                error = e
        if error is not None:
            raise error

    def close(self) -> None:
        """Wait for the queued writes and stop the thread. An error among them is logged, not
        raised: close runs while the session ends for another reason, which it must not hide
        (the session's normal end waits with `wait` first, which raises)."""
        try:
            self.wait()
        except Exception as e:  # noqa: BLE001 (reported, see the docstring)
            logger.error(f'a background write failed: {e}')
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    def _raise_done(self) -> None:
        """Drop the writes already done; raise the first one's error (the rest stay queued)."""
        while self._pending and self._pending[0].done():
            future = self._pending.pop(0)
            if (e := future.exception()) is not None:
                raise e
