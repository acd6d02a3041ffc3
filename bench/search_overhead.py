"""What search mode costs beyond the training it runs.

    python bench/search_overhead.py                  # 8 trials of 20k CartPole frames, one at a time
    python bench/search_overhead.py --trials 4 --frames 10000

Runs spec/search/ppo_cartpole_search.json in search mode (through run_lab.py, as a user would)
with ASHA off, so every trial trains all its frames, and each trial reserving every core, so the
trials run one after another and the search's wall time is their training plus the machinery.

Prints:
  search_wall_s    wall time of the whole command (Ray start, every trial, the experiment records, Ray stop)
  trials_train_s   the sum over trials of each session's own training time (wall_t of its last CSV row:
                   from the session's start to its last step)
  overhead         (search_wall_s - trials_train_s) / trials_train_s: Ray's start and stop, each trial's
                   Ray actor and process start (Python, torch, env and agent), reporting, the records
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC, NAME = 'spec/search/ppo_cartpole_search.json', 'ppo_cartpole_search'


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--trials', type=int, default=8)
    parser.add_argument('--frames', type=int, default=20000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix='slm_search_bench_') as work:
        sets = [f'meta.max_trial={args.trials}', f'env.max_frame={args.frames}', 'meta.search_scheduler=null',
                f'meta.search_resources={{"cpu": {os.cpu_count()}}}']
        cmd = [sys.executable, str(ROOT / 'run_lab.py'), str(ROOT / SPEC), NAME, 'search']
        cmd += [a for s in sets for a in ('-s', s)]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            print(done.stderr[-3000:], file=sys.stderr)
            return done.returncode
        (run,) = Path(work, 'data').glob(f'{NAME}_*')
        train = 0.0
        for path in sorted((run / 'info').glob(f'{NAME}_t*_s*_session_df_train.csv')):
            rows = list(csv.DictReader(path.read_text().splitlines()))
            train += float(rows[-1]['wall_t'])
    print(f'# {time.strftime("%Y-%m-%d %H:%M")} | {os.cpu_count()} CPU cores | {args.trials} trials x {args.frames} '
          'CartPole frames, one at a time, ASHA off')
    print(f'search_wall_s  {wall:.1f}')
    print(f'trials_train_s {train:.1f}')
    print(f'overhead       {(wall - train) / train:.1%}  ({(wall - train) / args.trials:.1f} s per trial)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
