"""TensorBoard event files of a run (meta.tensorboard, on by default), written by tensorboard's own
writer (`EventFileWriter`, what `torch.utils.tensorboard.SummaryWriter` writes with): one stream per
session with the scalars of its train and eval records (slm_lab.experiment.scalars), and the
trial's mean across its sessions.
A session's stream lives in `tb/{spec_name}_t{trial}_s{session}/`, the trial's in
`tb/{spec_name}_t{trial}/`.

Each (re)start of a session opens a new event file beside the earlier ones. A session that
continues from its snapshot at frame F opens it with `purge_step` F + 1: TensorBoard's readers then
drop what the earlier files hold at steps past F (what a stopped or killed run logged after its
snapshot), and the resumed run logs those frames again as it reproduces them, so each scalar stays
one curve, its steps strictly increasing. The rows up to F are in the earlier files already: the
writer is flushed at each log point, and the snapshot at F is taken after the log point at F.
A directory with no event file (a fork's new run, `tb/` deleted, meta.tensorboard turned on at a
resume) gets every row the session's records hold.

An event's wall time is the row's `wall_t` counted from the session's latest (re)start, so the
time a run spent stopped is left out of TensorBoard's "relative" axis.
"""
from __future__ import annotations

import hashlib
import importlib.util
import time
from pathlib import Path

import pandas as pd

from slm_lab.experiment.scalars import frame_points, rows_through
from slm_lab.lib.errors import SpecError
from slm_lab.lib.io import disk_full_error, is_disk_full, read_json, write_json

KINDS = ('train', 'eval')
TRIAL_STATE = '.trial_stream.json'  # beside the trial's event files; TensorBoard reads only *tfevents* files


def require_tensorboard(meta: dict) -> None:
    """SpecError when meta.tensorboard is on and the tensorboard package is missing (checked
    without importing it)."""
    if meta.get('tensorboard', True) and importlib.util.find_spec('tensorboard') is None:
        raise SpecError('meta.tensorboard is true (the default) but the tensorboard package is not installed: '
                        'pip install -r requirements.txt (tensorboard==2.21.0), or set meta.tensorboard false')


def event_files(directory: Path) -> list[Path]:
    """The event files of a directory (TensorBoard reads the files whose name holds 'tfevents')."""
    return sorted(p for p in directory.iterdir() if 'tfevents' in p.name) if directory.is_dir() else []


def event_writer(directory: Path, purge_step: int | None = None):
    """tensorboard's writer of a new event file in `directory` (flushed by the lab at each log
    point). With `purge_step`, the file opens with TensorBoard's restart marker, as
    SummaryWriter(purge_step=...) writes it: a SessionLog START at that step, on which TensorBoard's
    readers drop what the earlier files hold at steps >= purge_step (its Rust data server drops them
    on seeing a step go back)."""
    # imported at the first log point, not at start-up (about 0.1-0.5 s)
    from tensorboard.compat.proto import event_pb2  # noqa: PLC0415 (TensorBoard's writer: only a run that writes its records needs it)
    from tensorboard.summary.writer.event_file_writer import EventFileWriter  # noqa: PLC0415 (as above)
    writer = EventFileWriter(str(directory), max_queue_size=1000, flush_secs=3600)
    if purge_step is not None:
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=purge_step,
                                         session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))
    return writer


def add_points(writer, points, anchor: float) -> None:
    """One event per point, at step = its frame, holding its scalars (one event rather than one per
    scalar: tensorboard's writer checksums each event in Python, so this is several times faster)."""
    from tensorboard.compat.proto import event_pb2  # noqa: PLC0415 imported with the writer (see event_writer)
    for point in points:
        event = event_pb2.Event(wall_time=anchor + point.wall_t, step=point.frame)
        add_value = event.summary.value.add  # in place: faster than building Values to copy in
        for tag, value in point.scalars.items():
            add_value(tag=tag, simple_value=value)
        writer.add_event(event)


class SessionBoard:
    """The event stream of one session (see the module docstring). `begin` with the frame the
    session starts at, then `sync` after each record row: it writes the rows the stream lacks.
    A disabled board (meta.tensorboard false) does nothing."""

    def __init__(self, directory: Path, enabled: bool = True):
        self.directory, self.enabled = Path(directory), enabled
        self._writer = None
        self._start_frame = 0
        self._purge_step: int | None = None
        self._synced: tuple[int, int] | None = None  # train and eval rows in the stream; None: not known yet
        self._anchor = 0.0

    def begin(self, frame: int) -> None:
        """The session starts (frame 0) or continues from its snapshot at `frame`: the stream holds
        its rows up to that frame, and what it holds past it is dropped (purge_step)."""
        self._start_frame = frame

    def sync(self, body, clock) -> None:
        """Bring the stream up to the body's train and eval rows."""
        if not self.enabled:
            return
        train_rows, eval_rows = body.train_rows, body.eval_rows
        if self._synced is None:  # the first write since the session (re)started
            self._anchor = time.time() - clock.wall_t
            if event_files(self.directory):
                self._synced = (rows_through(train_rows, self._start_frame), rows_through(eval_rows, self._start_frame))
                self._purge_step = self._start_frame + 1
            else:
                self._synced = (0, 0)
        n_train, n_eval = self._synced
        points = frame_points(train_rows[n_train:], eval_rows[n_eval:])
        if points:
            try:
                if self._writer is None:
                    self._writer = event_writer(self.directory, self._purge_step)
                    self._purge_step = None
                add_points(self._writer, points, self._anchor)
                self._writer.flush()  # on disk before the snapshot that may follow this log point
            except OSError as e:
                if is_disk_full(e, self.directory):
                    raise disk_full_error(self.directory, f'writing the TensorBoard events of {self.directory} failed',
                                          None, 'train@latest logs what is missing again from the newest '
                                          'snapshot') from e
                raise
        self._synced = (len(train_rows), len(eval_rows))

    def close(self) -> None:
        """Close the event file (again is harmless)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def means_digest(means: dict[str, pd.DataFrame], through: int) -> str:
    """A digest of the mean rows (indexed by frame) at frames up to `through`."""
    digest = hashlib.sha256()
    for kind in KINDS:
        held = means[kind][means[kind].index <= through]
        digest.update(repr(list(held.columns)).encode())
        digest.update(pd.util.hash_pandas_object(held, index=True).to_numpy().tobytes())
    return digest.hexdigest()


def write_trial_board(directory: Path, dfs: dict[str, list[pd.DataFrame]]) -> None:
    """The trial's stream: at each frame every session recorded, the mean over the sessions of each
    column (empty cells left out), for the 'train' and 'eval' records (`dfs`: kind -> one
    dataframe per session). Written each time the trial ends. When the stream on disk is the start
    of this one (TRIAL_STATE records its files, the frame it ends at and the digest of its means),
    only the frames past it are written, in a new file: an extended trial costs what it adds.
    Otherwise (a session's records changed, one more session, files missing or left by a kill) the
    whole stream is, in a new file that opens with purge_step 0 (a TensorBoard reading the older
    files drops what it read of them), and the older files are removed."""
    means = {}
    for kind in KINDS:
        frames = pd.concat(dfs[kind], ignore_index=True).groupby('frame')
        means[kind] = frames.mean()[frames.size() == len(dfs[kind])]
    last = max((int(m.index.max()) for m in means.values() if len(m)), default=-1)
    last_wall_t = max((float(m['wall_t'].max()) for m in means.values() if m['wall_t'].notna().any()), default=0.0)
    directory.mkdir(parents=True, exist_ok=True)
    state_path, older = directory / TRIAL_STATE, event_files(directory)
    try:
        state = read_json(state_path) if state_path.exists() else {}
    except (OSError, ValueError):
        state = {}
    held = state.get('frame') if isinstance(state, dict) else None
    appending = (isinstance(held, int) and state.get('files') == [p.name for p in older]
                 and state.get('digest') == means_digest(means, held))
    start = held if appending else -1
    rows = {kind: [{'frame': frame, **row} for frame, row in zip(m.index[m.index > start].tolist(),
                                                                 m[m.index > start].to_dict('records'))]
            for kind, m in means.items()}
    points = frame_points(rows['train'], rows['eval'])
    if points or not appending:
        writer = event_writer(directory, purge_step=None if appending else 0)
        try:
            add_points(writer, points, time.time() - last_wall_t)
        finally:
            writer.close()
        if not appending:
            for path in older:
                path.unlink(missing_ok=True)
    write_json(state_path, {'frame': last, 'digest': means_digest(means, last),
                            'files': [p.name for p in event_files(directory)]})
