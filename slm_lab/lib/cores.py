"""The CPU cores this process may run on: its affinity set (taskset, a container's cpuset), not
the machine's count, so a search or benchmark pinned to one core runs one trial at a time there."""
from __future__ import annotations

import errno
import os
import random
import threading
import time


def usable_cores() -> int:
    """Cores in this process's affinity set (Linux), else the machine's count; at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


# the nice a search's driver ran at, which its local Ray's processes and trials take for their sessions
# (set by search/driver.py for a local Ray only: a trial on a user's cluster leaves its session as it is)
NICE_VAR = 'SLM_LAB_SEARCH_NICE'


def keep_nice_in_own_session() -> None:
    """For a process of a search's local Ray that runs in a session of its own (the Ray head's
    process, a trial, the reaper): give the session the nice the search's driver ran at (NICE_VAR).
    On Linux with autogroup scheduling (most desktop kernels) the CPU is shared first between
    sessions and only then by nice within each, so `nice -n 19 python run_lab.py ... search` left
    each trial an equal share beside the user's foreground work, as if it were not niced. Raising a
    session's nice needs no privilege, but the kernel takes one such write every 100 ms from an
    unprivileged user: a refused write is tried again, from a thread, for a few seconds. Nothing to
    do without autogroup, outside a local search, or at nice 0 or below."""
    try:
        niceness = int(os.environ.get(NICE_VAR, '0'))
    except ValueError:
        return
    if niceness <= 0 or not os.path.exists('/proc/self/autogroup'):
        return
    if not _set_autogroup_nice(niceness):
        threading.Thread(target=_retry_autogroup_nice, args=(niceness,), daemon=True,
                         name='autogroup-nice').start()


def _set_autogroup_nice(niceness: int) -> bool:
    """Write the session's nice; False when the kernel asks to try again (its rate limit)."""
    try:
        with open('/proc/self/autogroup', 'w') as f:
            f.write(str(niceness))
        return True
    except OSError as e:
        return e.errno != errno.EAGAIN  # anything else (not this process's to set): give up


def _retry_autogroup_nice(niceness: int, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(random.uniform(0.1, 0.25))  # apart from the other processes of the search starting now
        if _set_autogroup_nice(niceness):
            return
