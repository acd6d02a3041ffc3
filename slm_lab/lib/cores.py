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
