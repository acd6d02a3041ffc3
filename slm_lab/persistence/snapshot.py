"""Snapshots: write and read the complete state of a session, crash-safely.

A snapshot is a directory `ckpt/{prename}/f{frame:012d}/` holding
  state.pt       torch.save of the plain state dict {component: component.state_dict()}
                 (tensors, numbers, strings, lists, dicts only; read back with weights_only=True)
  <name>.npy     each large numpy array of that state (e.g. a replay memory), written
                 sequentially as raw .npy and read back by memory-mapping
  MANIFEST.json  format version, lab version, git sha, spec digest, frame, and every file's
                 size and CRC32
The directory is built under a temporary name `.f{frame:012d}.tmp-{pid}` and renamed into place
after everything in it is fsynced, so a snapshot either exists complete or not at all. Loading
still verifies the manifest and falls back to the previous intact snapshot when the newest one is
damaged: a malformed manifest, a missing or resized file, or a state.pt failing its checksum.

Array files are only checked by size at load (reading a replay of gigabytes in full would delay
the first resumed step by as much), so that resuming maps them at once; `verify_arrays_async`
then checks their checksums in a background thread while the first steps run, and no snapshot is
ever written from a mapped array whose file has not passed that check (`save_snapshot`). So a
flipped byte in a replay is found before it is copied into a new snapshot under a valid checksum.

Incremental snapshots: an array given as `identified_array(array, content_id)` (a replay's
fixed-size chunks) is written once per content id: when an earlier snapshot in the same directory
holds a file of that id (its manifest says so), the new snapshot hard-links that file instead of
writing it again, so a snapshot costs what changed since the previous one, and each snapshot
stays complete on its own (pruning one removes its names, not the files others share). Such files
are written with their data at a page boundary, so that `join_chunks` can map the chunks of a
loaded array side by side into one array without reading or copying them.

A full disk during a save removes the partial snapshot and raises DiskFullError; the previous
snapshots are untouched, so the run resumes once space is freed. Array checks and chunk mapping
are in arrays.py; the newest intact snapshot, setting aside and pruning in snapshots.py; the
leftovers of killed writes in tmpfiles.py.
"""
from __future__ import annotations

import copy
import hashlib
import io
import os
import re
import shutil
import time
import zlib
from collections import deque
from dataclasses import dataclass
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import ujson

from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import ResumeError
from slm_lab.lib.io import fsync_dir, disk_full_error, is_disk_full, read_json, write_json
from slm_lab.lib.version import __version__, git_sha
from slm_lab.lib.arrays import (ARRAY_KEY, CONTENT_ID_KEY, PAGE, STATE_FILE, ArrayVerifier, crc_array,
                                        crc_file, file_check, FileCheck, is_identified, mapped_checks,
                                        map_arrays)

logger = lab_logger.get_logger('slm_lab.checkpoint')
FORMAT_VERSION = 1
MANIFEST = 'MANIFEST.json'
ARRAY_FILE_MIN_BYTES = 1 << 20  # numpy arrays at least this big get their own memory-mapped file
SNAPSHOT_DIR = re.compile(r'f([0-9]+)')
SET_ASIDE_DIR = re.compile(r'f([0-9]+)\.damaged(?:\.[0-9]+)?')
SAVE_OVERHEAD_BYTES = 1 << 16  # manifest, .npy headers and torch's zip records, for the space estimate


class UnknownSnapshotFormat(ResumeError):
    """A snapshot in a format version this lab cannot read (a newer lab's): refused, never skipped
    or pruned."""


def spec_digest(spec: dict) -> str:
    """sha256 of the spec's canonical JSON."""
    return hashlib.sha256(ujson.dumps(spec, sort_keys=True).encode()).hexdigest()


# --- plain state <-> files --------------------------------------------------------------------
def _split(obj, arrays: dict, path: str, sources: list, ids: dict):
    """Plain copy of a state dict (sharing nothing mutable with it): big numpy arrays moved to
    `arrays` (the live arrays, not copies), small ones copied to tensors,
    identified arrays to `arrays` whatever their size, with their content ids in `ids`.
    Arrays read from a loaded snapshot's memory-mapped file are listed in `sources` (key, check)."""
    if is_identified(obj):
        array, content_id = obj[ARRAY_KEY], str(obj[CONTENT_ID_KEY])
        sources.extend((path, check) for check in mapped_checks(array))
        name = f'{path.replace("/", "_")}.npy'
        arrays[name], ids[name] = array, content_id
        return {'__npy__': name, CONTENT_ID_KEY: content_id}
    if isinstance(obj, dict):
        return {k: _split(v, arrays, f'{path}.{k}' if path else str(k), sources, ids) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, deque)):
        out = [_split(v, arrays, f'{path}.{i}', sources, ids) for i, v in enumerate(obj)]
        return tuple(out) if isinstance(obj, tuple) else out
    if isinstance(obj, np.ndarray):
        sources.extend((path, check) for check in mapped_checks(obj))
        if obj.nbytes >= ARRAY_FILE_MIN_BYTES:
            name = f'{path.replace("/", "_")}.npy'
            arrays[name] = obj
            return {'__npy__': name}
        return {'__nd__': torch.from_numpy(np.ascontiguousarray(obj).copy()) if obj.dtype != object else None}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
        return obj
    return copy.deepcopy(obj)  # the copy is the snapshot's own: training goes on while it is written


def _npy_header(arr: np.ndarray, page_aligned: bool) -> bytes:
    """The .npy (format 1.0) header of arr; page_aligned: padded with spaces (as numpy pads) to a
    whole page, so the data starts at a page boundary and can be memory-mapped at any address."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, np.lib.format.header_data_from_array_1_0(arr))
    header = buf.getvalue()
    if not page_aligned or len(header) % PAGE == 0:
        return header
    total = -(-len(header) // PAGE) * PAGE
    text = header[10:-1] + b' ' * (total - len(header))  # magic (6), version (2), length (2); '\n' last
    return header[:8] + (total - 10).to_bytes(2, 'little') + text + b'\n'


def _write_npy(path: Path, arr: np.ndarray, crc_pool: ThreadPoolExecutor,
               page_aligned: bool = False) -> tuple[int, Future]:
    """Write one array as .npy sequentially (no copy for contiguous arrays), not yet fsynced; return
    its size and the future of its CRC, which `crc_pool` computes from the array in memory while
    this and the following files are written (zlib and file writes release the GIL). The caller
    fsyncs the files once all are written (_fsync_files), so the disk streams them as one write
    instead of draining its queue at the end of every file."""
    arr = np.ascontiguousarray(arr)
    header = _npy_header(arr, page_aligned)
    crc = crc_pool.submit(crc_array, arr.reshape(-1).view(np.uint8), zlib.crc32(header))
    with open(path, 'wb') as f:
        f.write(header)
        arr.tofile(f)
    return len(header) + arr.nbytes, crc


def _fsync_files(paths) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _reusable_files(ckpt_dir: Path, wanted: set) -> dict[str, tuple[Path, dict]]:
    """content id -> (file, its manifest entry) for the files of the earlier snapshots in ckpt_dir
    whose manifests record one of the `wanted` ids (damaged or unreadable manifests are passed
    over). The file itself is checked by size when it is linked; its checksum travels with it."""
    found: dict[str, tuple[Path, dict]] = {}
    for path in list_snapshots(ckpt_dir):
        try:
            files = read_manifest(path)['files']
        except ResumeError:
            continue
        for name, info in files.items():
            content_id = info.get('content_id')
            if content_id in wanted and content_id not in found:
                entry = {k: info[k] for k in ('size', 'crc32', 'content_id')}
                found[content_id] = (path / name, entry)
    return found


def _link_reusable(source: tuple[Path, dict] | None, target: Path) -> bool:
    """Hard-link an earlier snapshot's file of the same content id as `target`; False when there
    is none, it has not its recorded size, or the file system refuses (the caller writes it)."""
    if source is None:
        return False
    path, info = source
    try:
        if os.stat(path).st_size != info['size']:
            return False
        os.link(path, target)
        return True
    except OSError:
        return False


def _tensor_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


@dataclass(frozen=True)
class PreparedSnapshot:
    """A state split for writing (prepare_snapshot): `plain`, the state.pt part, is a copy that no
    longer shares anything mutable with the live state; `arrays`, the big numpy arrays, are the
    live ones (a replay's), so a snapshot that has any must be written before training goes on."""
    frame: int
    plain: dict
    arrays: dict
    ids: dict

    @property
    def detached(self) -> bool:
        """Whether it can be written while training goes on (no live arrays in it)."""
        return not self.arrays


def prepare_snapshot(frame: int, state: dict, verifier: ArrayVerifier | None = None) -> PreparedSnapshot:
    """Split `state` for writing at `frame` (see PreparedSnapshot). Nothing is written from a
    damaged source: `verifier` (the background check of the snapshot the session resumed from) is
    waited for, and every array of `state` still memory-mapped from a loaded snapshot is checked
    (once per file) unless that check already passed; a damaged one raises ResumeError. (An array
    copied out of a mapping, e.g. into a replay of another size, is covered only by `verifier`.)"""
    if verifier is not None and (error := verifier.result()) is not None:
        raise error
    arrays: dict[str, np.ndarray] = {}
    sources: list[tuple[str, FileCheck]] = []
    ids: dict[str, str] = {}
    plain = _split(state, arrays, '', sources, ids)
    for key, check in sources:
        if (error := check.run()) is not None:
            raise ResumeError(f'{error}; the state at frame {frame} holds data read from it ({key}), so no '
                              'snapshot was written: resume from an earlier snapshot')
    return PreparedSnapshot(frame, plain, arrays, ids)


def save_snapshot(ckpt_dir: Path, frame: int, state: dict, spec: dict, verifier: ArrayVerifier | None = None) -> Path:
    """Write `state` as snapshot f{frame} under ckpt_dir and return its path (prepare_snapshot,
    then write_snapshot)."""
    return write_snapshot(ckpt_dir, prepare_snapshot(frame, state, verifier), spec)


def write_snapshot(ckpt_dir: Path, prepared: PreparedSnapshot, spec: dict) -> Path:
    """Write a prepared state as snapshot f{frame} under ckpt_dir and return its path. An intact
    snapshot of the same frame is kept as it is (the state at a frame is the same); a damaged one
    is replaced. A full disk raises DiskFullError after the partial snapshot is removed; the
    earlier snapshots are untouched."""
    ckpt_dir = Path(ckpt_dir)
    frame, plain, arrays, ids = prepared.frame, prepared.plain, prepared.arrays, prepared.ids
    final = ckpt_dir / f'f{frame:012d}'
    if final.is_dir():
        try:
            verify_snapshot(final)
            return final
        except UnknownSnapshotFormat:  # a newer lab's: not this lab's to replace
            raise
        except ResumeError:  # a damaged snapshot of this frame: replace it
            shutil.rmtree(final, ignore_errors=True)
    reusable = _reusable_files(ckpt_dir, set(ids.values())) if ids else {}
    needed = sum(arr.nbytes for name, arr in arrays.items() if ids.get(name) not in reusable) \
        + _tensor_bytes(plain) + SAVE_OVERHEAD_BYTES
    tmp = ckpt_dir / f'.{final.name}.tmp-{os.getpid()}'
    t0 = time.perf_counter()
    try:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        files, written = {}, {}
        with ThreadPoolExecutor(max_workers=1) as crc_pool:
            for name, arr in arrays.items():
                content_id = ids.get(name)
                if content_id is not None and _link_reusable(reusable.get(content_id), tmp / name):
                    files[name] = {**reusable[content_id][1], 'reused': True}
                    continue
                written[name] = _write_npy(tmp / name, arr, crc_pool, page_aligned=content_id is not None)
                files[name] = {} if content_id is None else {'content_id': content_id}
            _fsync_files(tmp / name for name in written)
            for name, (size, crc) in written.items():
                files[name] = {'size': size, 'crc32': crc.result(), **files[name]}
        state_path = tmp / STATE_FILE
        with open(state_path, 'wb') as f:
            torch.save(plain, f)
            f.flush()
            os.fsync(f.fileno())
        files[STATE_FILE] = {'size': state_path.stat().st_size, 'crc32': crc_file(state_path)}
        manifest = {'format_version': FORMAT_VERSION, 'lab_version': __version__, 'git_sha': git_sha(),
                    'spec_digest': spec_digest(spec), 'frame': frame, 'created': time.time(), 'files': files,
                    'save_s': round(time.perf_counter() - t0, 4)}
        write_json(tmp / MANIFEST, manifest)
        fsync_dir(tmp)
        os.rename(tmp, final)
    except BaseException as e:
        # judged before the partial snapshot goes: torch's errors are recognised by the free space
        full = isinstance(e, Exception) and is_disk_full(e, ckpt_dir)
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise disk_full_error(ckpt_dir, f'snapshot {final.name} of {ckpt_dir} could not be written', needed,
                                  'the partial snapshot was removed and the earlier snapshots are intact') from e
        raise
    fsync_dir(ckpt_dir)
    return final


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def read_manifest(path: Path) -> dict:
    """The manifest of the snapshot at `path`, checked for shape: UnknownSnapshotFormat for
    another format version, ResumeError when it is missing, unreadable or malformed (any JSON
    that is not a manifest of this format counts as damage)."""
    path = Path(path)
    try:
        manifest = read_json(path / MANIFEST)
    except (OSError, ValueError) as e:
        raise ResumeError(f'snapshot {path}: manifest missing or unreadable ({e})') from None

    def malformed(why: str) -> ResumeError:
        return ResumeError(f'snapshot {path}: {MANIFEST} is malformed ({why})')

    if not isinstance(manifest, dict):
        raise malformed(f'a JSON {type(manifest).__name__}, not an object')
    version = manifest.get('format_version')
    if _is_int(version) and version != FORMAT_VERSION:
        raise UnknownSnapshotFormat(f'snapshot {path}: unknown snapshot format version {version} (this lab reads '
                                    f'version {FORMAT_VERSION}); use the lab version that wrote it '
                                    f"({manifest.get('lab_version')})")
    if version != FORMAT_VERSION:
        raise malformed(f'format_version is {version!r}')
    frame = manifest.get('frame')
    if not _is_int(frame) or frame < 0:
        raise malformed(f'frame is {frame!r}')
    named = SNAPSHOT_DIR.fullmatch(path.name)
    if named and int(named[1]) != frame:
        raise malformed(f'frame {frame} does not match the directory name')
    files = manifest.get('files')
    if not isinstance(files, dict) or STATE_FILE not in files:
        raise malformed(f'files does not list {STATE_FILE}')
    for name, info in files.items():
        if name in ('', '.', '..', MANIFEST) or os.path.basename(name) != name or '\\' in name:
            raise malformed(f'file name {name!r}')
        if not isinstance(info, dict) or not _is_int(info.get('size')) or not _is_int(info.get('crc32')) \
                or info['size'] < 0:
            raise malformed(f'no size and checksum for {name}')
    return manifest


def verify_snapshot(path: Path, full: bool = True) -> dict:
    """The snapshot's manifest after checking it and every file's size (and CRC32 when `full`).
    Raises ResumeError describing what is wrong (UnknownSnapshotFormat for another version)."""
    path = Path(path)
    manifest = read_manifest(path)
    for name, info in manifest['files'].items():
        try:
            size = os.stat(path / name).st_size
        except OSError:
            size = None
        if size != info['size']:
            raise ResumeError(f'snapshot {path}: {name} is missing or has the wrong size')
        if full:
            check_file_crc(path, name, info)
    return manifest


def check_file_crc(path: Path, name: str, info: dict) -> None:
    try:
        crc = crc_file(path / name)
    except OSError as e:
        raise ResumeError(f'snapshot {path}: {name} cannot be read ({e.strerror or e})') from None
    if crc != info['crc32']:
        raise ResumeError(f'snapshot {path}: {name} fails its checksum')


def read_snapshot(path: Path, verify_arrays: bool = False) -> tuple[dict, dict]:
    """(plain state, manifest) of a snapshot: the state file's contents, its arrays not mapped yet
    (map_arrays maps them; load_snapshot does both). The manifest is checked and the state file
    checksummed; big arrays are checked by size only (by checksum too when verify_arrays: a full
    read). Raises ResumeError when the snapshot is damaged or unreadable."""
    path = Path(path)
    manifest = verify_snapshot(path, full=False)
    files = manifest['files']
    try:  # read once: checksummed in memory, then loaded from the same bytes
        with open(path / STATE_FILE, 'rb', buffering=0) as f:
            data = f.readall()
    except OSError as e:
        raise ResumeError(f'snapshot {path}: {STATE_FILE} cannot be read ({e.strerror or e})') from None
    if zlib.crc32(data) != files[STATE_FILE]['crc32']:
        raise ResumeError(f'snapshot {path}: {STATE_FILE} fails its checksum')
    if verify_arrays:
        for name, info in files.items():
            if name != STATE_FILE and (error := file_check(path / name, info).run()) is not None:
                raise error
    if manifest.get('lab_version') != __version__:
        logger.warning(f"snapshot {path.name} was written by lab version {manifest.get('lab_version')}; "
                       f'this is {__version__}: loading it anyway')
    try:
        plain = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as e:  # checksummed, yet not a state this torch reads
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ''
        raise ResumeError(f'snapshot {path}: {STATE_FILE} cannot be read ({type(e).__name__}: {first})') from None
    del data
    if not isinstance(plain, dict):
        raise ResumeError(f'snapshot {path}: {STATE_FILE} holds a {type(plain).__name__}, not a state dict')
    return plain, manifest


def load_snapshot(path: Path, verify_arrays: bool = False) -> tuple[dict, dict]:
    """(state, manifest) of a snapshot, read and checked by read_snapshot, its big arrays
    memory-mapped copy-on-write. Start verify_arrays_async on the result to check them while
    training runs. Raises ResumeError when the snapshot is damaged or unreadable."""
    plain, manifest = read_snapshot(path, verify_arrays)
    return map_arrays(plain, Path(path), manifest['files']), manifest


def scan_dirs(ckpt_dir: Path, pattern: re.Pattern) -> list[tuple[int, Path]]:
    """(frame, path) of the directories in ckpt_dir whose name matches `pattern` (group 1: the
    frame). Anything else (files, links, odd names) is ignored."""
    try:
        entries = list(os.scandir(ckpt_dir))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as e:
        raise ResumeError(f'{ckpt_dir}: the snapshots cannot be listed ({e.strerror or e}); '
                          'check the permissions of that directory') from None
    found = []
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        try:
            if match and entry.is_dir(follow_symlinks=False):
                found.append((int(match[1]), Path(ckpt_dir) / entry.name))
        except OSError:
            continue
    return found


def list_snapshots(ckpt_dir: Path) -> list[Path]:
    """Snapshot directories (f<frame>), newest (highest frame) first, whether intact or not."""
    return [path for _, path in sorted(scan_dirs(Path(ckpt_dir), SNAPSHOT_DIR), key=lambda x: x[0], reverse=True)]
