"""File helpers. Every file the lab writes goes through an atomic write: temp file, fsync, rename."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

import ujson

_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write_with(path: str | os.PathLike, write_fn: Callable[[str], None]) -> None:
    """Call write_fn(tmp_path) to write a temporary file beside `path`, fsync it, then rename it
    over `path`, so a reader (or a crash) sees either the old file or the complete new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f'.{path.name}.', suffix='.tmp', dir=path.parent)
    os.close(fd)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the usual permissions
        write_fn(tmp)
        with open(tmp, 'rb+') as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(dirpath: Path) -> None:
    try:
        fd = os.open(dirpath, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write bytes to `path` atomically."""
    def write(tmp: str) -> None:
        with open(tmp, 'wb') as f:
            f.write(data)
    atomic_write_with(path, write)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write text (utf-8) to `path` atomically."""
    atomic_write_bytes(path, text.encode('utf-8'))


def write_json(path: str | os.PathLike, obj, indent: int = 2) -> None:
    """Write `obj` as JSON to `path` atomically."""
    atomic_write_text(path, ujson.dumps(obj, indent=indent, escape_forward_slashes=False) + '\n')


def read_json(path: str | os.PathLike):
    """Read a JSON file."""
    with open(path, encoding='utf-8') as f:
        return ujson.load(f)


def append_json_list(path: str | os.PathLike, record: dict) -> None:
    """Append a record to a JSON list file (rewritten atomically)."""
    records = read_json(path) if os.path.exists(path) else []
    records.append(record)
    write_json(path, records)
