"""Snapshots: write and read the complete state of a session, crash-safely.

A snapshot is a directory `ckpt/{prename}/f{frame:012d}/` holding
  state.pt       torch.save of the plain state dict {component: component.state_dict()}
                 (tensors, numbers, strings, lists, dicts only; read back with weights_only=True)
  <name>.npy     each large numpy array of that state (e.g. a replay memory), written
                 sequentially as raw .npy and read back by memory-mapping
  MANIFEST.json  format version, lab version, git sha, spec digest, frame, and every file's
                 size and CRC32
The directory is built under a temporary name and renamed into place after everything in it is
fsynced, so a snapshot either exists complete or not at all; loading still verifies the manifest
and falls back to the previous intact snapshot when the newest one is damaged.
"""
from __future__ import annotations

import hashlib
import io
import os
import shutil
import time
import zlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import ujson

from slm_lab import __version__
from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import ResumeError
from slm_lab.lib.io import _fsync_dir, read_json, write_json
from slm_lab.lib.version import git_sha

logger = lab_logger.get_logger('slm_lab.checkpoint')
FORMAT_VERSION = 1
MANIFEST = 'MANIFEST.json'
STATE_FILE = 'state.pt'
ARRAY_FILE_MIN_BYTES = 1 << 20  # numpy arrays at least this big get their own memory-mapped file
CRC_CHUNK = 1 << 24


def spec_digest(spec: dict) -> str:
    """sha256 of the spec's canonical JSON."""
    return hashlib.sha256(ujson.dumps(spec, sort_keys=True).encode()).hexdigest()


# --- plain state <-> files --------------------------------------------------------------------

def _split(obj, arrays: dict, path: str):
    """Plain copy of a state dict: big numpy arrays moved to `arrays`, small ones to tensors."""
    if isinstance(obj, dict):
        return {k: _split(v, arrays, f'{path}.{k}' if path else str(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, deque)):
        out = [_split(v, arrays, f'{path}.{i}') for i, v in enumerate(obj)]
        return tuple(out) if isinstance(obj, tuple) else out
    if isinstance(obj, np.ndarray):
        if obj.nbytes >= ARRAY_FILE_MIN_BYTES:
            name = f'{path.replace("/", "_")}.npy'
            arrays[name] = obj
            return {'__npy__': name}
        return {'__nd__': torch.from_numpy(np.ascontiguousarray(obj).copy()) if obj.dtype != object else None}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    return obj


def _join(obj, root: Path):
    if isinstance(obj, dict):
        if '__npy__' in obj and len(obj) == 1:
            return np.load(root / obj['__npy__'], mmap_mode='c')
        if '__nd__' in obj and len(obj) == 1:
            return obj['__nd__'].numpy()
        return {k: _join(v, root) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_join(v, root) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_join(v, root) for v in obj)
    return obj


def _crc_file(path: Path) -> int:
    crc = 0
    with open(path, 'rb') as f:
        while chunk := f.read(CRC_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def _crc_array(flat: np.ndarray, crc: int) -> int:
    for start in range(0, flat.size, CRC_CHUNK):
        crc = zlib.crc32(flat[start:start + CRC_CHUNK], crc)
    return crc


def _write_npy(path: Path, arr: np.ndarray) -> dict:
    """Write one array as .npy sequentially (no copy for contiguous arrays); fsync; size and CRC.
    The CRC is computed in a thread while the file is written (zlib and file writes release the
    GIL), so it costs no time on top of the write."""
    arr = np.ascontiguousarray(arr)
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, np.lib.format.header_data_from_array_1_0(arr))
    header = buf.getvalue()
    with ThreadPoolExecutor(max_workers=1) as pool:
        crc = pool.submit(_crc_array, arr.reshape(-1).view(np.uint8), zlib.crc32(header))
        with open(path, 'wb') as f:
            f.write(header)
            arr.tofile(f)
            f.flush()
            os.fsync(f.fileno())
        return {'size': path.stat().st_size, 'crc32': crc.result()}


def save_snapshot(ckpt_dir: Path, frame: int, state: dict, spec: dict) -> Path:
    """Write `state` as snapshot f{frame} under ckpt_dir and return its path. An intact snapshot
    of the same frame is kept as it is (the state at a frame is the same)."""
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f'f{frame:012d}'
    if final.exists():
        try:
            verify_snapshot(final)
            return final
        except ResumeError:  # a damaged snapshot of this frame: replace it
            shutil.rmtree(final, ignore_errors=True)
    tmp = ckpt_dir / f'.{final.name}.tmp-{os.getpid()}'
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    t0 = time.perf_counter()
    arrays: dict[str, np.ndarray] = {}
    plain = _split(state, arrays, '')
    files = {}
    for name, arr in arrays.items():
        files[name] = _write_npy(tmp / name, arr)
    state_path = tmp / STATE_FILE
    with open(state_path, 'wb') as f:
        torch.save(plain, f)
        f.flush()
        os.fsync(f.fileno())
    files[STATE_FILE] = {'size': state_path.stat().st_size, 'crc32': _crc_file(state_path)}
    manifest = {'format_version': FORMAT_VERSION, 'lab_version': __version__, 'git_sha': git_sha(),
                'spec_digest': spec_digest(spec), 'frame': frame, 'created': time.time(), 'files': files,
                'save_s': round(time.perf_counter() - t0, 4)}
    write_json(tmp / MANIFEST, manifest)
    _fsync_dir(tmp)
    os.rename(tmp, final)
    _fsync_dir(ckpt_dir)
    return final


def verify_snapshot(path: Path, full: bool = True) -> dict:
    """The snapshot's manifest after checking every file's size (and CRC32 when `full`).
    Raises ResumeError describing what is wrong."""
    path = Path(path)
    try:
        manifest = read_json(path / MANIFEST)
    except (OSError, ValueError) as e:
        raise ResumeError(f'snapshot {path}: manifest missing or unreadable ({e})') from None
    version = manifest.get('format_version')
    if version != FORMAT_VERSION:
        raise ResumeError(f'snapshot {path}: unknown snapshot format version {version!r} (this lab reads '
                          f'version {FORMAT_VERSION}); use the lab version that wrote it '
                          f"({manifest.get('lab_version')})")
    for name, info in manifest['files'].items():
        fpath = path / name
        if not fpath.is_file() or fpath.stat().st_size != info['size']:
            raise ResumeError(f'snapshot {path}: {name} is missing or has the wrong size')
        if full and _crc_file(fpath) != info['crc32']:
            raise ResumeError(f'snapshot {path}: {name} fails its checksum')
    return manifest


def load_snapshot(path: Path, verify_arrays: bool = False) -> tuple[dict, dict]:
    """(state, manifest) of a snapshot. The state file is checksummed; big arrays are checked
    by size (and by checksum too when verify_arrays) and memory-mapped copy-on-write."""
    path = Path(path)
    manifest = verify_snapshot(path, full=False)
    for name, info in manifest['files'].items():
        if (name == STATE_FILE or verify_arrays) and _crc_file(path / name) != info['crc32']:
            raise ResumeError(f'snapshot {path}: {name} fails its checksum')
    if manifest.get('lab_version') != __version__:
        logger.warning(f"snapshot {path.name} was written by lab version {manifest.get('lab_version')}; "
                       f'this is {__version__}: loading it anyway')
    with open(path / STATE_FILE, 'rb') as f:
        plain = torch.load(f, weights_only=True)
    return _join(plain, path), manifest


def list_snapshots(ckpt_dir: Path) -> list[Path]:
    """Complete snapshot directories, newest (highest frame) first."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    snaps = [p for p in ckpt_dir.iterdir() if p.is_dir() and p.name.startswith('f') and p.name[1:].isdigit()]
    return sorted(snaps, key=lambda p: int(p.name[1:]), reverse=True)


def load_latest_snapshot(ckpt_dir: Path) -> tuple[dict, dict, Path] | None:
    """(state, manifest, path) of the newest intact snapshot, falling back past damaged ones
    with a warning; None when there is none."""
    for path in list_snapshots(ckpt_dir):
        try:
            state, manifest = load_snapshot(path)
            return state, manifest, path
        except ResumeError as e:
            if 'unknown snapshot format' in str(e):
                raise
            logger.warning(f'{e}; falling back to the previous snapshot')
        except Exception as e:  # a torn or corrupt state file
            logger.warning(f'snapshot {path} cannot be read ({type(e).__name__}: {e}); '
                           'falling back to the previous snapshot')
    return None


def prune_snapshots(ckpt_dir: Path, keep: int) -> None:
    """Keep the newest `keep` snapshots; remove older ones and leftovers of interrupted saves."""
    ckpt_dir = Path(ckpt_dir)
    for old in list_snapshots(ckpt_dir)[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    for leftover in ckpt_dir.glob('.f*.tmp-*'):
        try:
            pid = int(leftover.name.rsplit('-', 1)[1])
        except ValueError:
            pid = -1
        if pid != os.getpid() and not _alive(pid):
            shutil.rmtree(leftover, ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
