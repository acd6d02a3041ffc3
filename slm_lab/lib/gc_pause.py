"""Python's cyclic garbage collector kept off the objects that exist before a training loop starts.

A session's process holds a few hundred thousand Python objects before its first step (torch,
numpy, gymnasium and the lab, imported; the nets and envs, built). The collector's full
(oldest-generation) collections walk every one of them: about 0.1-0.2 s each on the machines
measured, taken in the middle of training whenever enough objects have survived since the last one
(a log point that imports TensorBoard's writer is enough). The training loop itself creates few
objects that outlive a step, so those collections find nothing to free.

`frozen_heap()` wraps a training loop: on entry the objects alive then move to the collector's
permanent generation (`gc.freeze()`, Python's public API for this), which its collections skip; on
exit they go back (`gc.unfreeze()`), so whatever became garbage meanwhile is collected as before.
Collections still run on everything created in the loop. Nothing a run computes changes. A
process that has frozen objects of its own is left as it is.
Sessions that train concurrently in one process (threads) share one freeze: the heap is unfrozen
when the last of them leaves. Measured in docs/BENCHMARKS.md ("Writes off the training thread and
the garbage collector"). Off with SLM_LAB_GC=plain in the environment.
"""
from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator

OPT_OUT = 'SLM_LAB_GC'  # =plain: leave the collector as it is
_lock = threading.Lock()
_holders = 0
_owned = False  # whether the lab froze the heap (not when the process had frozen objects of its own)


def enabled() -> bool:
    return os.environ.get(OPT_OUT, '').strip().lower() != 'plain'


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze the objects alive now for the duration of the block (see the module docstring)."""
    global _holders, _owned
    if not enabled():
        yield
        return
    with _lock:
        if _holders == 0:
            # a process that froze objects itself (the Python API's user) keeps its freeze as it is
            _owned = gc.get_freeze_count() == 0
            if _owned:
                gc.freeze()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _owned:
                gc.unfreeze()
                _owned = False
