"""File helpers. Every file the lab writes goes through an atomic write: temp file, fsync, rename.

A temp file is named `.{name}.{pid}.{random}.tmp` beside its target, so that the leftover of a
writer killed mid-write can be told from the file of a writer still at work (see
`tmp_file_pid`; `checkpoint.cleanup_stale_tmp` removes the leftovers of dead processes). A write
that fails because the disk is full removes its temp file and raises DiskFullError.
"""
from __future__ import annotations

import ctypes
import errno
import os
import re
import tempfile
from pathlib import Path
from typing import Callable

import ujson

from slm_lab.lib.errors import DiskFullError

_UMASK = os.umask(0)
os.umask(_UMASK)
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# torch.save to a path reports a full disk as a bare RuntimeError; a failed write that leaves less
# than this free on its filesystem is taken for a full disk
DISK_FULL_SLACK = 1 << 20
_TMP_NAME_MAX = 100  # characters of the target's name kept in its temp file's name (NAME_MAX is 255)
# mkstemp's random part is 8 characters of [a-z0-9_]
_TMP_FILE = re.compile(r'\.(?s:.*)\.([0-9]+)\.[a-z0-9_]{8}\.tmp')


def atomic_write_with(path: str | os.PathLike, write_fn: Callable[[str], None], nbytes: int | None = None) -> None:
    """Call write_fn(tmp_path) to write a temporary file beside `path`, fsync it, then rename it
    over `path`, so a reader (or a crash) sees either the old file or the complete new one.
    On any failure the temp file is removed; a full disk raises DiskFullError (`nbytes`, when
    known, is what the file needs, for its message)."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f'.{path.name[:_TMP_NAME_MAX]}.{os.getpid()}.', suffix='.tmp',
                                   dir=path.parent)
        os.close(fd)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the usual permissions
        write_fn(tmp)
        with open(tmp, 'rb+') as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        # judged before the temp file goes: the heuristic for torch's errors looks at the free space
        full = isinstance(e, Exception) and is_disk_full(e, path.parent)
        if tmp is not None and os.path.lexists(tmp):
            os.unlink(tmp)
        if full:
            raise disk_full_error(path.parent, f'writing {path} failed', nbytes, 'the partial file was removed') from e
        raise
    fsync_dir(path.parent)


def tmp_file_pid(name: str) -> int | None:
    """The pid of the process that wrote an atomic-write temp file of this name, or None when the
    name is not one of those."""
    match = _TMP_FILE.fullmatch(name)
    return int(match[1]) if match else None


# --- a full disk --------------------------------------------------------------------------------

def is_disk_full(exc: BaseException, path: str | os.PathLike) -> bool:
    """Whether `exc`, raised while writing under `path`, means the disk (or quota) is full: an
    ENOSPC/EDQUOT OSError in its chain, or (torch writing to a path reports only a RuntimeError)
    an OSError/RuntimeError while less than DISK_FULL_SLACK is free there."""
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, DiskFullError) or (isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS):
            return True
        e = e.__cause__ or e.__context__
    return isinstance(exc, (OSError, RuntimeError)) and (free_bytes(path) or 0) < DISK_FULL_SLACK


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes this process can still write on the filesystem holding `path` (or its nearest
    existing parent); root may use the blocks reserved for it. None when it cannot be told."""
    try:
        st = os.statvfs(_existing(path))
    except OSError:
        return None
    blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return blocks * st.f_frsize


def mount_point(path: str | os.PathLike) -> str:
    """The mount point of the filesystem holding `path` (or its nearest existing parent)."""
    p = os.path.realpath(_existing(path))
    while not os.path.ismount(p):
        p = os.path.dirname(p)
    return p


def format_bytes(nbytes: float) -> str:
    """Bytes in the largest unit that keeps a number >= 1 (kB, MB, GB, TB: powers of 10)."""
    for unit, scale in (('TB', 1e12), ('GB', 1e9), ('MB', 1e6), ('kB', 1e3)):
        if nbytes >= scale:
            return f'{nbytes / scale:.1f} {unit}'
    return f'{int(nbytes)} bytes'


def disk_full_error(path: str | os.PathLike, what: str, needed: int | None, cleaned: str) -> DiskFullError:
    """A one-line DiskFullError: `what` failed under `path`, what it needed (when known) and what
    is free now that `cleaned` (the partial files) is done, and the way on."""
    mount = mount_point(path)
    free = free_bytes(path)
    needs = f'needed about {format_bytes(needed)}, ' if needed is not None else ''
    has = f'{format_bytes(free)} free' if free is not None else 'free space unknown'
    return DiskFullError(f'disk full: {what} ({needs}{has} on the filesystem mounted at {mount}); {cleaned}; '
                         f'free space on {mount}, then run again (a training run resumes from its last '
                         'snapshot with train@latest)')


def _existing(path: str | os.PathLike) -> str:
    p = os.path.abspath(path)
    while not os.path.exists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    return p


def fsync_dir(dirpath: Path) -> None:
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


_RENAME_NOREPLACE = 1  # linux/fs.h
_AT_FDCWD = -100


def _renameat2():
    """libc's renameat2 (glibc >= 2.28), or None."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


def rename_no_replace(src: str | os.PathLike, dst: str | os.PathLike) -> bool:
    """Rename `src` to `dst` unless something is already at `dst`, atomically; False (nothing
    renamed) when `dst` exists. os.rename alone replaces an empty directory at `dst` without a
    word, and a check before it races with another process. Where renameat2(RENAME_NOREPLACE) is
    missing or the filesystem refuses it, `dst` is claimed with mkdir (atomic, and exclusive among
    callers of this function) and `src` renamed over that empty directory."""
    fn = _renameat2()
    if fn is not None:
        if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return True
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            return False
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), os.fspath(src), None, os.fspath(dst))
    try:
        os.mkdir(dst)
    except FileExistsError:
        return False
    try:
        os.rename(src, dst)
    except BaseException:
        os.rmdir(dst)
        raise
    return True


# --- convenience writers ------------------------------------------------------------------------

def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write bytes to `path` atomically."""
    def write(tmp: str) -> None:
        with open(tmp, 'wb') as f:
            f.write(data)
    atomic_write_with(path, write, nbytes=len(data))


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


# slm_lab.run writes a spec given as a dict to a file in a temporary directory of this prefix: a
# run made from it records that file, which is gone after the call and names no spec file
DICT_SPEC_PREFIX = 'slm_lab_spec_'


def is_dict_spec(path: str | None) -> bool:
    """Whether `path` is a temporary file slm_lab.run wrote a spec dict to (in whatever
    temporary directory the process that ran it had)."""
    return bool(path) and os.path.basename(os.path.dirname(path)).startswith(DICT_SPEC_PREFIX)
