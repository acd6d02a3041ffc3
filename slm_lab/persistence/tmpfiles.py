"""Leftovers of writes that a kill interrupted: the temporary files of atomic writes and the
temporary directories of snapshot saves, removed once the process that wrote them is gone."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from slm_lab.lib.io import tmp_file_pid

SNAPSHOT_TMP_DIR = re.compile(r'\.f[0-9]+\.tmp-([0-9]+)')


def cleanup_stale_tmp(root: Path) -> list[Path]:
    """Remove, under `root` (a run directory; links are not followed), the temporary files of
    atomic writes (`.{name}.{pid}.{random}.tmp`) and the temporary directories of snapshot saves
    (`.f{frame}.tmp-{pid}`) whose writing process is no longer alive: what a kill mid-write left.
    Those of live processes, this one included, are kept. Returns the paths removed."""
    removed = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in list(dirnames):
            match = SNAPSHOT_TMP_DIR.fullmatch(name)
            if match and pid_is_stale(int(match[1])):
                shutil.rmtree(os.path.join(dirpath, name), ignore_errors=True)
                dirnames.remove(name)
                removed.append(Path(dirpath) / name)
        for name in filenames:
            pid = tmp_file_pid(name)
            if pid is not None and pid_is_stale(pid):
                try:
                    os.unlink(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue
                removed.append(Path(dirpath) / name)
    return removed


def pid_is_stale(pid: int) -> bool:
    """Whether a temporary file named with `pid` was left by a process that no longer runs."""
    return pid != os.getpid() and not _alive(pid)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return False
    return True
