"""The scalars a session's record rows show on its boards (TensorBoard, W&B): one tag per CSV
column worth a curve, `train/{column}` or `eval/{column}`, at step = the row's frame.

Left out: the frame (it is the step), `t` (the frame divided by env.num_envs), `wall_t` (each
board keeps its own wall time), and the eval columns that only repeat the train row of the same
frame (an eval row is that row with the evaluation's returns put in; its `fps`, `loss`, `entropy`
and `grad_norm` cover the instant since that train row). docs/run-directory.md lists the tags.
"""
from __future__ import annotations

from typing import NamedTuple

SHOWN_COLUMNS = {
    'train': ('total_reward', 'total_reward_ma', 'loss', 'lr', 'entropy', 'entropy_coef', 'explore_var',
              'grad_norm', 'fps', 'epi', 'opt_step'),
    'eval': ('total_reward', 'total_reward_ma'),
}
TAGS = tuple(f'{kind}/{column}' for kind, columns in SHOWN_COLUMNS.items() for column in columns)


class FramePoint(NamedTuple):
    """What the boards log at one frame: the scalars of its train and eval rows, and the wall time
    (`wall_t`, seconds of the session's training) of the first of those rows."""
    frame: int
    wall_t: float
    scalars: dict[str, float]


def row_scalars(kind: str, row: dict) -> dict[str, float]:
    """{tag: value} of one record row (`kind`: 'train' or 'eval'); an empty cell (None or NaN) is
    left out."""
    return {f'{kind}/{column}': float(row[column]) for column in SHOWN_COLUMNS[kind]
            if row.get(column) is not None and row[column] == row[column]}  # NaN != NaN: an empty cell


def frame_points(train_rows: list[dict], eval_rows: list[dict]) -> list[FramePoint]:
    """The rows as one point per frame, by frame: a frame's train and eval scalars together (an
    eval row is taken after the train row of its frame)."""
    points: dict[int, FramePoint] = {}
    for kind, rows in (('train', train_rows), ('eval', eval_rows)):
        for row in rows:
            frame = int(row['frame'])
            if frame not in points:
                wall_t = row.get('wall_t')
                points[frame] = FramePoint(frame, float(wall_t) if wall_t == wall_t and wall_t is not None else 0.0,
                                           {})
            points[frame].scalars.update(row_scalars(kind, row))
    return [points[frame] for frame in sorted(points)]


def rows_through(rows: list[dict], frame: int) -> int:
    """How many of `rows` (in frame order) are at frames up to `frame`."""
    return sum(1 for row in rows if row['frame'] <= frame)
