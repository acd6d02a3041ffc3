"""TensorBoard event files of a run (meta.tensorboard, on by default): one event stream per session
that mirrors its train and eval records, and the trial's mean across its sessions.

Each record row becomes one event at step = the row's frame, holding every non-empty cell of the
row as the scalar `train/{column}` or `eval/{column}` (an empty CSV cell, NaN, is left out; the
frame is the step). A session's stream lives in `tb/{spec_name}_t{trial}_s{session}/`, the
trial's mean in `tb/{spec_name}_t{trial}/`.

The records are the truth, and a stream is rebuilt from them whenever they may differ from it:
a session's first write (a fresh start or a resume) writes its stream anew from the rows it holds,
as one file that is complete before it is renamed into place, and removes every other file of the
directory; later log points append to that file. A resumed session holds the rows of its
snapshot, so what a stopped or killed run logged after that snapshot is dropped, then logged
again as the run reproduces it: each curve stays one curve, its steps strictly increasing.

An event's wall time is the row's `wall_t` counted from the session's latest (re)start, so the
time a run spent stopped is left out and the rewritten history and the new events agree.
"""
from __future__ import annotations

import importlib.util
import math
import os
import struct
import time
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from slm_lab.agent.body import COLUMNS
from slm_lab.lib.errors import SpecError
from slm_lab.lib.io import atomic_write_bytes, disk_full_error, is_disk_full

EVENT_FILE_PREFIX = 'events.out.tfevents.'  # TensorBoard reads the files whose name holds 'tfevents'
SCALAR_COLUMNS = tuple(c for c in COLUMNS if c != 'frame')  # the frame is each event's step
KINDS = ('train', 'eval')


def require_tensorboard() -> None:
    """SpecError when the tensorboard package is missing (checked without importing it)."""
    if importlib.util.find_spec('tensorboard') is None:
        raise SpecError('meta.tensorboard is true (the default) but the tensorboard package is not installed: '
                        'pip install -r requirements.txt (tensorboard==2.21.0), or set meta.tensorboard false')


def row_scalars(kind: str, row: dict) -> list[tuple[str, float]]:
    """The (tag, value) pairs of one record row: every column but the frame whose cell is not empty."""
    return [(f'{kind}/{column}', float(row[column])) for column in SCALAR_COLUMNS
            if row.get(column) is not None and row[column] == row[column]]  # NaN != NaN: an empty cell


def in_frame_order(train_rows: list[dict], eval_rows: list[dict]) -> list[tuple[str, dict]]:
    """(kind, row) pairs by frame, a train row before the eval row of its frame, as a session logs
    them: TensorBoard's reader takes a step below the one before it for a restart and drops
    what it had read past that step."""
    keyed = [(row['frame'], k, i, kind, row) for k, (kind, rows) in enumerate((('train', train_rows),
                                                                            ('eval', eval_rows)))
             for i, row in enumerate(rows)]
    return [(kind, row) for *_, kind, row in sorted(keyed, key=lambda item: item[:3])]


def _crc32c_table() -> np.ndarray:
    """The byte table of CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of
    TFRecord files."""
    crc = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        crc = np.where(crc & 1, (crc >> 1) ^ np.uint32(0x82F63B78), crc >> 1).astype(np.uint32)
    return crc


CRC32C_TABLE = _crc32c_table()


def masked_crc32c(messages: list[bytes]) -> np.ndarray:
    """The masked CRC-32C of each message (TFRecord's checksum), all messages at once: one numpy
    step per byte position rather than a Python step per byte, which is what makes rewriting a
    stream of thousands of events at a resume take milliseconds, not seconds."""
    lengths = np.array([len(m) for m in messages], dtype=np.int64)
    order = np.argsort(-lengths, kind='stable')  # longest first: the messages still going are a prefix
    lengths = lengths[order]
    data = np.frombuffer(b''.join(messages[i] for i in order), dtype=np.uint8)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    crc = np.full(len(messages), 0xFFFFFFFF, dtype=np.uint32)
    going = len(messages)
    for position in range(int(lengths[0]) if len(messages) else 0):
        while lengths[going - 1] <= position:
            going -= 1
        part = crc[:going]
        crc[:going] = CRC32C_TABLE[(part ^ data[starts[:going] + position]) & 0xFF] ^ (part >> 8)
    crc ^= np.uint32(0xFFFFFFFF)
    masked = ((crc >> 15) | (crc << 17)) + np.uint32(0xA282EAD8)  # wraps at 32 bits, as the format means
    out = np.empty_like(masked)
    out[order] = masked
    return out


def frame_records(payloads: list[bytes]) -> bytes:
    """TFRecord framing of serialized events, as tensorboard's RecordWriter writes them one by one:
    per record, its length (uint64), the length's masked CRC-32C, the payload, its masked CRC-32C
    (little-endian)."""
    if not payloads:
        return b''
    headers = [struct.pack('<Q', len(p)) for p in payloads]
    header_crcs, payload_crcs = masked_crc32c(headers), masked_crc32c(payloads)
    return b''.join(b''.join((h, struct.pack('<I', hc), p, struct.pack('<I', pc)))
                    for h, hc, p, pc in zip(headers, header_crcs.tolist(), payloads, payload_crcs.tolist()))


def encode_events(rows: Iterable[tuple[str, dict]], anchor: float, header: bool = False) -> bytes:
    """The TFRecord bytes of one scalar event per row (after the file-version event that opens a
    file, with `header`); an event's wall time is `anchor` + the row's wall_t."""
    # imported here, at the first log point, to keep them off the start-up path
    from tensorboard.compat.proto import event_pb2
    payloads = []
    if header:
        now = time.time()
        payloads.append(event_pb2.Event(wall_time=now, file_version='brain.Event:2').SerializeToString())
        # a restart at step 0: a TensorBoard reading the directory drops what it read before this file
        payloads.append(event_pb2.Event(wall_time=now, step=0, session_log=event_pb2.SessionLog(
            status=event_pb2.SessionLog.START)).SerializeToString())
    for kind, row in rows:
        wall_t = float(row.get('wall_t', math.nan))
        event = event_pb2.Event(wall_time=anchor + (wall_t if math.isfinite(wall_t) else 0.0), step=int(row['frame']))
        add_value = event.summary.value.add  # adding in place: twice as fast as building Values to copy in
        for tag, value in row_scalars(kind, row):
            add_value(tag=tag, simple_value=value)
        payloads.append(event.SerializeToString())
    return frame_records(payloads)


def write_stream(directory: Path, rows: list[tuple[str, dict]], anchor: float) -> Path:
    """Write a directory's event stream anew: one event file with `rows`, complete before it takes
    its name (it is staged under a name TensorBoard ignores). Then the event file before it is
    emptied (a TensorBoard reading it moves on to the next file, where one deleted under it would
    stop there), and every other file is removed: older, emptied streams and what a crash
    mid-write left. Returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = time.time_ns()  # later streams sort after earlier ones, as TensorBoard reads them
    path = directory / f'{EVENT_FILE_PREFIX}{stamp}.slm_lab'
    staged = directory / f'.staged.{stamp}'
    atomic_write_bytes(staged, encode_events(rows, anchor, header=True))
    os.replace(staged, path)
    for entry in directory.iterdir():
        if entry == path or not entry.is_file():
            continue
        if entry.name.startswith(EVENT_FILE_PREFIX) and entry.stat().st_size:
            os.truncate(entry, 0)
        else:
            entry.unlink(missing_ok=True)
    return path


class SessionBoard:
    """The event stream of one session (see the module docstring). `sync` after each record
    row: the first call writes the stream anew from every row, later ones append the new rows.
    A disabled board (meta.tensorboard false) does nothing."""

    def __init__(self, directory: Path, enabled: bool = True):
        self.directory, self.enabled = Path(directory), enabled
        self.path: Path | None = None
        self._file = None
        self._synced = (0, 0)  # train and eval rows in the stream
        self._anchor = 0.0
        if enabled:
            require_tensorboard()

    def sync(self, body, clock) -> None:
        """Bring the stream up to the body's train and eval rows."""
        if not self.enabled:
            return
        train_rows, eval_rows = body.train_rows, body.eval_rows
        if self.path is None:
            self._anchor = time.time() - clock.wall_t
            self.path = write_stream(self.directory, in_frame_order(train_rows, eval_rows), self._anchor)
        else:
            n_train, n_eval = self._synced
            rows = in_frame_order(train_rows[n_train:], eval_rows[n_eval:])
            if rows:
                self._append(encode_events(rows, self._anchor))
        self._synced = (len(train_rows), len(eval_rows))

    def _append(self, data: bytes) -> None:
        try:
            if self._file is None:
                self._file = open(self.path, 'ab')
            self._file.write(data)
            self._file.flush()  # readers see each log point; the records, not this file, are kept safe
        except OSError as e:
            if is_disk_full(e, self.directory):
                raise disk_full_error(self.directory, f'appending to {self.path} failed', len(data),
                                      'the event file is written anew from the records at the next resume') from e
            raise

    def close(self) -> None:
        """Close the event file (again is harmless)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def write_trial_board(directory: Path, dfs: dict[str, list[pd.DataFrame]]) -> None:
    """The trial's stream: at each frame every session recorded, the mean over the sessions of each
    column (empty cells left out), for the 'train' and 'eval' records (`dfs`: kind -> one
    dataframe per session). Written anew each time the trial ends."""
    means = {}
    for kind in KINDS:
        frames = pd.concat(dfs[kind], ignore_index=True).groupby('frame')
        mean = frames.mean()[frames.size() == len(dfs[kind])]
        means[kind] = [{'frame': frame, **row} for frame, row in zip(mean.index.tolist(), mean.to_dict('records'))]
    rows = in_frame_order(means['train'], means['eval'])
    last_wall_t = max((float(row['wall_t']) for _, row in rows if math.isfinite(float(row['wall_t']))), default=0.0)
    write_stream(directory, rows, time.time() - last_wall_t)
