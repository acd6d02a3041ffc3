"""The watchdog of a local Ray a search starts: when the search's process ends, even by SIGKILL,
every process that carries the search's marker in its environment is killed, so none is left
behind. The marker is SLM_LAB_SEARCH_ID, which Ray's head processes, workers and the trial
processes inherit, or the search's own RAY_AUTH_TOKEN, which Ray passes to its agents (they get
a fresh environment otherwise).

python -m slm_lab.experiment.search.reaper MARKER PARENT_PID   (Linux: /proc; the token, when the
search made its own, comes in SLM_LAB_REAPER_TOKEN)
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

from slm_lab.lib.cores import keep_nice_in_own_session

MARKER_VAR = 'SLM_LAB_SEARCH_ID'


def parent_pid(pid: int | str) -> int:
    """A process's parent, from /proc (OSError when it is gone, ValueError/IndexError if unreadable)."""
    with open(f'/proc/{pid}/stat', 'rb') as f:
        return int(f.read().rsplit(b')', 1)[1].split()[1])


def marked_pids(marker: str, token: str | None = None) -> list[int]:
    """Processes whose environment holds MARKER_VAR=marker or RAY_AUTH_TOKEN=token (other than
    this one), and their descendants: Ray starts its dashboard and runtime-env agents with a fresh
    environment (no marker, and no token either when the cluster came from `ray start`), as
    children of the raylet."""
    needles = {f'{MARKER_VAR}={marker}'.encode()} | ({f'RAY_AUTH_TOKEN={token}'.encode()} if token else set())
    found, parent = [], {}
    for entry in os.listdir('/proc'):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f'/proc/{entry}/environ', 'rb') as f:
                env = set(f.read().split(b'\0'))
            parent[int(entry)] = parent_pid(entry)
        except (OSError, ValueError, IndexError):
            continue
        if needles & env:
            found.append(int(entry))
    marked = set(found)
    grew = True
    while grew:  # descendants, however deep
        grew = False
        for pid, ppid in parent.items():
            if ppid in marked and pid not in marked and pid != os.getpid():
                marked.add(pid)
                found.append(pid)
                grew = True
    return found


def sweep(marker: str, token: str | None = None) -> int:
    """SIGKILL every marked process; how many there were."""
    pids = marked_pids(marker, token)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return len(pids)


def main(marker: str, parent: int, token: str | None = None) -> None:
    try:
        ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    signal.signal(signal.SIGTERM, lambda *_: None)  # wakes the sleep below
    keep_nice_in_own_session()  # its sweep's CPU, in a session of its own, keeps a niced search's nice
    while os.getppid() == parent:
        time.sleep(0.5)
    sweep(marker, token)


if __name__ == '__main__':
    os.environ.pop(MARKER_VAR, None)
    main(sys.argv[1], int(sys.argv[2]), os.environ.get('SLM_LAB_REAPER_TOKEN') or None)
