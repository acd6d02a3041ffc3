"""Model files (model/{prename}_model_{best,latest}.pt): weights, optimizer and LR scheduler
state, frame, and a checksum of their contents.

torch.save's zip container does not check its records when read, so bytes flipped inside a
weight tensor load without error and a replay would play the damaged weights. Each file
therefore records a CRC32 of every value it holds (each tensor's and array's bytes, dtype and
shape, and every other leaf's repr, in key order), computed when written and verified when read;
a file whose contents no longer match is a `DamagedModelFile`, as a snapshot whose CRC fails is.
Files written before the checksum existed load without the check (`verified` False).
"""
from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import ResumeError
from slm_lab.lib.io import atomic_write_with

logger = lab_logger.get_logger('slm_lab.session')  # reconcile_best_model's lines belong to the session's log

CHECKSUM_KEY = 'checksum'
CHECKSUM_KIND = 'crc32-v1'  # what the digest covers, should it ever change


class DamagedModelFile(ResumeError):
    """A model file that cannot be read, is not a model file, or whose contents fail their checksum."""


def contents_crc32(obj: Any, crc: int = 0, path: str = '') -> int:
    """CRC32 of a state's values in a fixed order: each tensor's (and numpy array's) key path,
    dtype, shape and bytes, and the repr of every other leaf (numbers, strings, None)."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        crc = zlib.crc32(f'{path}|{t.dtype}|{tuple(t.shape)}'.encode(), crc)
        return zlib.crc32(t.reshape(-1).view(torch.uint8).numpy(), crc) if t.numel() else crc
    if isinstance(obj, np.ndarray) and obj.dtype != object:
        arr = np.ascontiguousarray(obj)
        crc = zlib.crc32(f'{path}|{arr.dtype.str}|{arr.shape}'.encode(), crc)
        return zlib.crc32(arr.reshape(-1).view(np.uint8), crc) if arr.size else crc
    if isinstance(obj, dict):
        for key in sorted(obj, key=repr):
            crc = contents_crc32(obj[key], zlib.crc32(f'{path}{{{key!r}'.encode(), crc), f'{path}.{key}')
        return crc
    if isinstance(obj, (list, tuple)):
        crc = zlib.crc32(f'{path}[{len(obj)}'.encode(), crc)
        for i, item in enumerate(obj):
            crc = contents_crc32(item, crc, f'{path}[{i}]')
        return crc
    return zlib.crc32(f'{path}={obj!r}'.encode(), crc)


# what torch's weights-only loader needs to read a numpy array (the obs_norm statistics)
_NUMPY_GLOBALS = [np._core.multiarray._reconstruct, np.ndarray, np.dtype,
                  *(type(np.dtype(t)) for t in ('float64', 'float32', 'int64', 'int32', 'bool', 'uint8'))]


def _numpy_as_tensors(obj: Any) -> Any:
    """`obj` with each numpy array as a tensor of the same dtype: torch's weights-only loader,
    which reads model files, reads tensors without help."""
    if isinstance(obj, np.ndarray) and obj.dtype != object:
        return torch.from_numpy(np.array(obj))
    if isinstance(obj, dict):
        return {k: _numpy_as_tensors(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_numpy_as_tensors(v) for v in obj)
    return obj


def save_model_file(path: Path, state: dict) -> None:
    """Write `state` (a dict of plain values and tensors) to `path` atomically, with its checksum."""
    if Path(path).is_dir():
        raise DamagedModelFile(f'{path} is a directory, where the lab writes a model file; move it away and '
                               'resume with train@latest')
    state = _numpy_as_tensors(state)
    record = {**state, CHECKSUM_KEY: {'kind': CHECKSUM_KIND, 'crc32': contents_crc32(state)}}
    atomic_write_with(path, lambda tmp: torch.save(record, tmp))


def load_model_file(path: Path) -> tuple[dict, bool]:
    """(state without its checksum, whether a checksum was verified) of a model file.
    DamagedModelFile, naming the file, when it cannot be read as one (a directory, truncated,
    not a torch file, not a dict) or its contents fail their checksum."""
    path = Path(path)
    if path.is_dir():
        raise DamagedModelFile(f'{path} is a directory, not a model file')
    try:
        with torch.serialization.safe_globals(_NUMPY_GLOBALS):  # files of older labs hold numpy arrays
            state = torch.load(path, weights_only=True, map_location='cpu')
    except FileNotFoundError:
        raise
    except Exception as e:  # truncated, overwritten or not a torch file: torch raises many kinds
        first = str(e).strip().splitlines()[0].split('. ')[0][:200] if str(e).strip() else '(no message)'
        raise DamagedModelFile(f'{path} is damaged or not a model file ({type(e).__name__}: {first})') from None
    if not isinstance(state, dict):
        raise DamagedModelFile(f'{path} is not a model file of this lab (it holds a {type(state).__name__})')
    checksum = state.pop(CHECKSUM_KEY, None)
    if checksum is None:
        return state, False
    if not (isinstance(checksum, dict) and checksum.get('kind') == CHECKSUM_KIND
            and isinstance(checksum.get('crc32'), int)):
        raise DamagedModelFile(f'{path}: its checksum record is damaged or of an unknown kind ({checksum!r:.80})')
    if contents_crc32(state) != checksum['crc32']:
        raise DamagedModelFile(f'{path} is damaged: its contents fail the checksum recorded when it was written '
                               '(bytes changed on disk)')
    return state, True


def reconcile_best_model(path: Path, best_model: dict | None, frame: int, approximate: bool, prename: str) -> None:
    """Make model_best.pt (`path`) the best weights as of the snapshot a session continues from at
    `frame` (`best_model`: what the snapshot says it held). After a crash, the file may come from
    frames past the snapshot (a future that the resume discards); an exact resume will write the
    same again, an `approximate` one may never, so that file is kept aside."""
    if best_model is None and not path.exists():
        return
    try:
        disk_frame = load_model_file(path)[0].get('frame') if path.exists() else None
    except DamagedModelFile as e:  # torn, or its bytes changed: replaced from the snapshot, or kept aside
        disk_frame = -1
        if best_model is None:
            aside = path.with_name(f'{path.stem}_damaged.pt')
            os.replace(path, aside)
            logger.warning(f'{prename}: {e}; kept aside as {aside.name} (the snapshot holds no best weights '
                           'yet, so the next evaluation writes new ones)')
            return
        logger.warning(f'{prename}: {e}; written again from the best weights in the snapshot')
    best_frame = best_model['frame'] if best_model is not None else None
    if disk_frame == best_frame:
        return
    if disk_frame is not None and disk_frame > frame and approximate:
        aside = path.with_name(f'{path.stem}_discarded_f{disk_frame}.pt')
        os.replace(path, aside)
        logger.warning(f'{prename}: {path.name} came from frame {disk_frame}, past the snapshot this resume '
                       f'continues from (frame {frame}); kept aside as {aside.name}')
    if best_model is not None:
        save_model_file(path, best_model)
    elif path.exists() and disk_frame is not None and disk_frame > frame:
        os.replace(path, path.with_name(f'{path.stem}_discarded_f{disk_frame}.pt'))
