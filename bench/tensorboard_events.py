"""Measure what TensorBoard logging costs a session: the import at its first log point, a resume's
first log point, one log point, and writing a whole stream (a new directory: a fork's run, the
trial's mean at the end of a trial).

    python bench/tensorboard_events.py               # 1,000, 10,000 and 20,000 rows, 5 repetitions
    python bench/tensorboard_events.py --reps 9 --rows 100 1000

The import is timed in a fresh process after `import torch, pandas` (what a session has loaded
by its first log point), for the modules the lab imports (tensorboard's EventFileWriter and event
protos) and, for comparison, torch.utils.tensorboard. A row holds every CSV column; a stream of N
rows holds N train rows and N/2 eval rows. "resume" is the first log point of a session resumed
from its snapshot at the last of N rows whose stream is on disk: a new event file with purge_step
and the one new row. Each figure is the best and the median of --reps.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

IMPORT_CODE = ('import time, torch, pandas; t = time.perf_counter(); {stmt}; '
               'print(time.perf_counter() - t)')
IMPORTS = {
    "the lab's (tensorboard's EventFileWriter, event protos)":
        'import tensorboard.summary.writer.event_file_writer, tensorboard.compat.proto.event_pb2',
    'torch.utils.tensorboard': 'from torch.utils.tensorboard import SummaryWriter',
}


def row(frame: int) -> dict:
    return {'epi': frame // 50, 't': frame // 4, 'wall_t': frame / 1000, 'opt_step': frame // 8, 'frame': frame,
            'fps': 1000.0, 'total_reward': 40.0, 'total_reward_ma': 35.5, 'loss': 0.25, 'lr': 3e-4,
            'explore_var': 0.1, 'entropy_coef': 0.01, 'entropy': 0.6, 'grad_norm': 1.5}


class FakeBody:
    def __init__(self, n: int):
        self.train_rows = [row(1000 * (i + 1)) for i in range(n)]
        self.eval_rows = [row(2000 * (i + 1)) for i in range(n // 2)]


class FakeClock:
    wall_t = 0.0


def stats(times: list[float]) -> str:
    return f'best {min(times) * 1000:.1f} ms, median {statistics.median(times) * 1000:.1f} ms'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--reps', type=int, default=5)
    parser.add_argument('--rows', type=int, nargs='+', default=[1000, 10000, 20000])
    args = parser.parse_args()
    for name, stmt in IMPORTS.items():
        times = [float(subprocess.run([sys.executable, '-c', IMPORT_CODE.format(stmt=stmt)], capture_output=True,
                                      text=True, check=True).stdout) for _ in range(args.reps)]
        print(f'import {name}: {stats(times)}')
    from slm_lab.experiment.tensorboard import SessionBoard
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.rows:
            whole, resume, append = [], [], []
            for rep in range(args.reps):
                directory = Path(tmp) / f'{n}_{rep}'
                body, board = FakeBody(n), SessionBoard(directory)
                board.begin(0)
                t = time.perf_counter()
                board.sync(body, FakeClock)  # a new directory: the whole stream
                whole.append(time.perf_counter() - t)
                board.close()
                board = SessionBoard(directory)  # resumed from the snapshot at the last row's frame
                board.begin(body.train_rows[-1]['frame'])
                body.train_rows.append(row(1000 * (n + 1)))
                t = time.perf_counter()
                board.sync(body, FakeClock)
                resume.append(time.perf_counter() - t)
                body.train_rows.append(row(1000 * (n + 2)))
                t = time.perf_counter()
                board.sync(body, FakeClock)
                append.append(time.perf_counter() - t)
                board.close()
            print(f'{n} rows: resume {stats(resume)}; one log point {stats(append)}; '
                  f'whole stream {stats(whole)}')


if __name__ == '__main__':
    main()
