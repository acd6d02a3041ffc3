"""The gap between the sessions of a trial with more sessions than CPU cores.

    python bench/session_gap.py                    # demo PPO CartPole, 4 sessions of 4,000 frames
    python bench/session_gap.py --sessions 6 --frames 8000

Runs `python run_lab.py spec/demo.json ppo_cartpole train` with meta.max_session sessions in a
temporary working directory and timestamps, as they arrive, the lab's log lines of each
session's start ("...: start PPO on ...", logged once its env and agent are built) and end
("...: done at frame ..."). Sessions run one per core, so the k-th session to end frees the
core of the (k + cores)-th to start: gap_k = start(k + cores) - done(k). The gap holds the
ending session's exit and the next session's process start, imports, env and agent builds.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START = re.compile(r'_t0_s(\d+): start ')
DONE = re.compile(r'_t0_s(\d+): done at frame')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--sessions', type=int, default=4)
    parser.add_argument('--frames', type=int, default=4000)
    args = parser.parse_args()
    cmd = [sys.executable, str(ROOT / 'run_lab.py'), str(ROOT / 'spec/demo.json'), 'ppo_cartpole', 'train',
           '-s', f'meta.max_session={args.sessions}', '-s', f'env.max_frame={args.frames}',
           '-s', 'meta.log_frequency=2000', '-s', 'meta.eval_frequency=2000']
    starts, dones = [], []
    load, started = os.getloadavg()[0], time.strftime('%Y-%m-%d %H:%M')
    with tempfile.TemporaryDirectory(prefix='slm_gap_bench_') as work:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, 'PYTHONUNBUFFERED': '1'})
        for line in proc.stdout:
            now = time.perf_counter() - t0
            if START.search(line):
                starts.append(now)
            elif DONE.search(line):
                dones.append(now)
        wall = time.perf_counter() - t0
        if proc.wait() != 0:
            print(f'exit code {proc.returncode}', file=sys.stderr)
            return 1
    width = sum(1 for s in starts if s < min(dones))
    gaps = [start - done for start, done in zip(sorted(starts)[width:], sorted(dones))]
    print(f'# {started} | {os.cpu_count()} CPU cores | load average {load:.1f} -> '
          f'{os.getloadavg()[0]:.1f} | {args.sessions} sessions x {args.frames} frames, {width} at a time')
    print(f'gaps_s       {" ".join(f"{g:.1f}" for g in gaps)}')
    print(f'median_gap_s {statistics.median(gaps):.1f}')
    print(f'first_start  {min(starts):.1f} s after the command')
    print(f'wall_s       {wall:.1f}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
