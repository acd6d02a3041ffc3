"""Array files of snapshots: their CRC32 checks (each file checked at most once, in a background
thread while a resumed session's first steps run), arrays with a content id that later snapshots
reuse, and `join_chunks`, which maps the chunk files of a replay side by side into one array.

Array files are only checked by size at load (reading a replay of gigabytes in full would delay
the first resumed step by as much), so that resuming maps them at once; `verify_arrays_async`
then checks their checksums while the first steps run, and no snapshot is ever written from a
mapped array whose file has not passed that check (snapshot.save_snapshot).
"""
from __future__ import annotations

import ctypes
import math
import mmap
import os
import sys
import threading
import time
import weakref
import zlib
from pathlib import Path

import numpy as np

from slm_lab.lib.errors import ResumeError

STATE_FILE = 'state.pt'  # the snapshot's plain state (snapshot.py); every other file is an array
CRC_CHUNK = 1 << 24
ARRAY_KEY, CONTENT_ID_KEY = '__array__', '__content_id__'  # an identified array (see identified_array)
PAGE = mmap.PAGESIZE


class FileCheck:
    """The CRC32 check of one array file of a snapshot. It runs at most once (the background
    verifier, a save, and a load with verify_arrays share it through _CHECKS); a caller arriving
    while it runs waits for its outcome."""

    def __init__(self, path: Path, info: dict, stat: os.stat_result | None):
        self.path, self.size, self.crc32 = path, info['size'], info['crc32']
        self._identity = (stat.st_dev, stat.st_ino) if stat is not None else None
        self._lock = threading.Lock()
        self._done = stat is None
        self.error = (ResumeError(f'snapshot {path.parent}: {path.name} is missing') if stat is None else None)

    def run(self) -> ResumeError | None:
        """None when the file has its recorded size and checksum, else the ResumeError saying why."""
        with self._lock:
            if not self._done:
                self.error = self._check()
                self._done = True
            return self.error

    def _check(self) -> ResumeError | None:
        where = f'snapshot {self.path.parent}: {self.path.name}'
        try:
            with open(self.path, 'rb', buffering=0) as f:
                st = os.fstat(f.fileno())
                if (st.st_dev, st.st_ino) != self._identity:
                    return ResumeError(f'{where} was replaced after it was loaded')
                crc, nbytes = _crc_stream(f)
        except OSError as e:
            return ResumeError(f'{where} cannot be read ({e.strerror or e})')
        if nbytes != self.size or crc != self.crc32:
            return ResumeError(f'{where} fails its checksum (the file is damaged)')
        return None


# one check per array file (identified by device, inode, size, mtime and the expected checksum), so
# a file verified in the background is not read again by the next save; entries live as long as a
# mapping or a verifier refers to them
_CHECKS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_CHECKS_LOCK = threading.Lock()
# mmap object -> the check of the snapshot file it maps (set by load_snapshot)
_MAPPED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def file_check(path: Path, info: dict) -> FileCheck:
    try:
        st = os.stat(path)
    except OSError:
        return FileCheck(path, info, None)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, info['crc32'])
    with _CHECKS_LOCK:
        check = _CHECKS.get(key)
        if check is None:
            check = _CHECKS[key] = FileCheck(path, info, st)
    return check


def mapping_of(arr: np.ndarray) -> mmap.mmap | None:
    """The mmap an array (or a view of it) reads its data from, if any."""
    base = arr
    while base is not None:
        if isinstance(base, mmap.mmap):
            return base
        base = base.obj if isinstance(base, memoryview) else getattr(base, 'base', None)  # np.frombuffer's
    return None


def mapped_checks(arr: np.ndarray) -> list[FileCheck]:
    """The checks of the snapshot files an array reads its data from (several for join_chunks)."""
    mapping = mapping_of(arr)
    checks = _MAPPED.get(mapping) if mapping is not None else None
    return [] if checks is None else checks if isinstance(checks, list) else [checks]


class ArrayVerifier:
    """Checks the CRC32 of every array file of a loaded snapshot in a background thread, while
    training's first steps run (file reads and zlib.crc32 release the GIL, so the thread costs
    the training loop little; reading the files also warms the page cache that the memory-mapped
    arrays are read through).

        verifier = verify_arrays_async(path, manifest)
        ...train...
        verifier.done()      # finished?
        verifier.result()    # waits; None when every array is intact, else a ResumeError naming
                             # the damaged file

    A damaged array file means the state resumed from holds wrong data: before anything is
    written, the session must start again from an older intact snapshot (save_snapshot refuses
    to write such state). `seconds` is how long the check took, once done."""

    def __init__(self, path: Path, manifest: dict):
        self.path = Path(path)
        self.checks = [file_check(self.path / name, info) for name, info in manifest['files'].items()
                       if name != STATE_FILE]
        self.nbytes = sum(check.size for check in self.checks)
        self.seconds: float | None = None
        self._error: ResumeError | None = None
        self._crash: BaseException | None = None
        self._finished = threading.Event()
        self._t0 = time.perf_counter()
        threading.Thread(target=self._run, name=f'verify {self.path.name}', daemon=True).start()

    def _run(self) -> None:
        try:
            for check in self.checks:
                error = check.run()
                if error is not None:
                    self._error = error
                    break
        except BaseException as e:  # a bug: re-raised to whoever asks for the result
            self._crash = e
        finally:
            self.seconds = time.perf_counter() - self._t0
            self._finished.set()

    def done(self) -> bool:
        """Whether the check has finished (result() then returns at once)."""
        return self._finished.is_set()

    def result(self, timeout: float | None = None) -> ResumeError | None:
        """Wait for the check (TimeoutError after `timeout` seconds): None when every array file
        has its recorded size and checksum, else the ResumeError describing the damaged one."""
        if not self._finished.wait(timeout):
            raise TimeoutError(f'checksums of {self.path} still running after {timeout}s')
        if self._crash is not None:
            raise self._crash
        return self._error


def verify_arrays_async(path: Path, manifest: dict) -> ArrayVerifier:
    """Start checking the array files of the snapshot at `path` (as loaded by load_snapshot, with
    its manifest) in a background thread; see ArrayVerifier."""
    return ArrayVerifier(path, manifest)


def identified_array(array: np.ndarray, content_id: str) -> dict:
    """An array of a state dict with a content id: a snapshot writes it as its own file, reused by
    later snapshots (hard-linked) as long as the state gives the same id. The component promises
    that an id always stands for the same content (e.g. a fresh uuid whenever the data changes).
    load_snapshot gives it back in this form, the array memory-mapped."""
    return {ARRAY_KEY: array, CONTENT_ID_KEY: content_id}


def is_identified(obj) -> bool:
    return isinstance(obj, dict) and len(obj) == 2 and ARRAY_KEY in obj and CONTENT_ID_KEY in obj


def _crc_stream(f) -> tuple[int, int]:
    """(CRC32, byte count) of an unbuffered binary file from its position to its end."""
    buf = bytearray(CRC_CHUNK)
    view = memoryview(buf)
    crc = nbytes = 0
    while n := f.readinto(buf):
        crc = zlib.crc32(view[:n], crc)
        nbytes += n
    return crc, nbytes


def crc_file(path: Path) -> int:
    with open(path, 'rb', buffering=0) as f:
        return _crc_stream(f)[0]


def crc_array(flat: np.ndarray, crc: int) -> int:
    for start in range(0, flat.size, CRC_CHUNK):
        crc = zlib.crc32(flat[start:start + CRC_CHUNK], crc)
    return crc

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_MAP_FIXED = 0x10  # Linux


def _mappable(chunks: list[np.ndarray], dtype: np.dtype) -> bool:
    """Whether chunks can be mapped side by side: each a whole memory-mapped .npy file (np.load
    with mmap_mode) whose data starts at a page boundary, all but the last a whole number of pages."""
    if not sys.platform.startswith('linux') or not chunks:
        return False
    for i, chunk in enumerate(chunks):
        if not (isinstance(chunk, np.memmap) and chunk.filename and chunk.dtype == dtype
                and chunk.flags.c_contiguous and isinstance(chunk.offset, int) and chunk.offset % PAGE == 0
                and chunk.base is not None and mapping_of(chunk) is not None
                and (i == len(chunks) - 1 or chunk.nbytes % PAGE == 0)):
            return False
    return True


def join_chunks(chunks: list[np.ndarray], rows: int, dtype: np.dtype, row_shape: tuple) -> np.ndarray:
    """One writable array (rows, *row_shape) whose first rows are the chunks' rows, in order, and
    the rest zeros. Chunks memory-mapped from snapshot files written by identified_array are not
    read nor copied: their files are mapped copy-on-write side by side into one reserved range of
    addresses (mmap MAP_FIXED), so a resumed replay of gigabytes is ready at once and reads its pages
    on first touch; the snapshot checks of those files follow the joined array into the next save.
    Other chunks are copied into a new array."""
    nbytes = rows * math.prod(row_shape) * dtype.itemsize
    if nbytes == 0 or not _mappable(chunks, dtype) or sum(c.nbytes for c in chunks) > nbytes:
        out = np.zeros((rows,) + tuple(row_shape), dtype=dtype)
        start = 0
        for chunk in chunks:
            out[start:start + len(chunk)] = chunk
            start += len(chunk)
        return out
    flags = mmap.MAP_PRIVATE | getattr(mmap, 'MAP_NORESERVE', 0)
    reserved = mmap.mmap(-1, -(-nbytes // PAGE) * PAGE, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    anchor = ctypes.c_char.from_buffer(reserved)
    base = ctypes.addressof(anchor)
    del anchor  # the address stays valid as long as `reserved` (kept by the array below) is open
    offset, checks = 0, []
    for chunk in chunks:
        length = -(-chunk.nbytes // PAGE) * PAGE
        if length:
            fd = os.open(chunk.filename, os.O_RDONLY)
            try:
                addr = _libc.mmap(base + offset, length, mmap.PROT_READ | mmap.PROT_WRITE,
                                  mmap.MAP_PRIVATE | _MAP_FIXED, fd, chunk.offset)
            finally:
                os.close(fd)
            if addr != base + offset:
                err = ctypes.get_errno()
                raise OSError(err, f'mmap of {chunk.filename} failed: {os.strerror(err)}')
        offset += chunk.nbytes
        checks.extend(mapped_checks(chunk))
    _MAPPED[reserved] = checks
    arr = np.frombuffer(reserved, dtype=dtype, count=rows * math.prod(row_shape))
    return arr.reshape((rows,) + tuple(row_shape))


def map_arrays(obj, root: Path, files: dict):
    """A snapshot's plain state (as state.pt holds it) with its array files memory-mapped in place
    (copy-on-write), each mapping remembering its file's check for verify_arrays_async."""
    if isinstance(obj, dict):
        if '__npy__' in obj and len(obj) == 1:
            return _map_array(root, obj['__npy__'], files)
        if '__npy__' in obj and CONTENT_ID_KEY in obj and len(obj) == 2:
            return identified_array(_map_array(root, obj['__npy__'], files), obj[CONTENT_ID_KEY])
        if '__nd__' in obj and len(obj) == 1:
            return obj['__nd__'].numpy()
        return {k: map_arrays(v, root, files) for k, v in obj.items()}
    if isinstance(obj, list):
        return [map_arrays(v, root, files) for v in obj]
    if isinstance(obj, tuple):
        return tuple(map_arrays(v, root, files) for v in obj)
    return obj


def _map_array(root: Path, name, files: dict) -> np.ndarray:
    """Memory-map (copy-on-write) one array file the manifest lists, and remember its check."""
    if not isinstance(name, str) or name == STATE_FILE or name not in files:
        raise ResumeError(f'snapshot {root}: {STATE_FILE} refers to an array file {name!r} its manifest does not list')
    try:
        arr = np.load(root / name, mmap_mode='c', allow_pickle=False)
    except Exception as e:  # a damaged .npy header fails in numpy's parser with various types
        raise ResumeError(f'snapshot {root}: {name} cannot be read ({type(e).__name__}: {e})') from None
    mapping = mapping_of(arr)
    if mapping is not None:
        _MAPPED[mapping] = file_check(root / name, files[name])
    return arr
