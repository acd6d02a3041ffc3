"""The CPU cores this process may run on: its affinity set (taskset, a container's cpuset), not
the machine's count, so a search or benchmark pinned to one core runs one trial at a time there."""
from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores in this process's affinity set (Linux), else the machine's count; at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def keep_nice_in_own_session() -> None:
    """For a process that runs in a session of its own (a search's local Ray, its trials): give the
    session the process's nice. On Linux with autogroup scheduling (most desktop kernels) the CPU
    is shared first between sessions and only then by nice within each, so `nice -n 19 python
    run_lab.py ... search` left each trial an equal share beside the user's foreground work, as if
    it were not niced. A process's nice is inherited, its session's group is new: the group takes
    the process's nice here (raising it needs no privilege). Nothing to do without autogroup."""
    niceness = os.nice(0)
    if niceness <= 0:
        return
    try:
        with open('/proc/self/autogroup', 'w') as f:
            f.write(str(niceness))
    except OSError:  # no autogroup (another kernel, not Linux) or a group not this process's to set
        pass
