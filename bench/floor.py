"""The floor of each side-by-side row: how fast its training could go on this CPU at best.

    python bench/floor.py                          # every row of bench/sb3_side_by_side.py, one thread
    python bench/floor.py --rows ppo,dqn --cpu 1   # pinned to core 1, as the side-by-side runs are
    python bench/floor.py --side side.json         # and each tool's measured frames/s as a share of it

A row's floor is the time of its work that neither tool can avoid, per env frame:
  env          the row's gymnasium env alone (gymnasium.make_vec, sync, the row's number of envs,
               actions drawn ahead at random), measured here;
  compute      the matrix products of acting and training, counted from the row's nets and
               rl-zoo3's hyperparameters (FLOPS_PER_FRAME below: 2 FLOPs per multiply-add), run at
               this CPU's measured single-thread peak (`peak_gflops`: the best of torch's MKL and
               oneDNN products of 256x400x300 and 1024x1024x1024).
floor fps = 1 / (env seconds + compute seconds per frame). Everything else a training does
(elementwise work, the optimizer, the replay buffer, Python and torch's per-call costs, records)
is above the floor, so no implementation reaches it; the figure says how much room is left: a tool
at 10% of the floor spends 90% of its time on that.

The counts (multiply-adds per sample of a net = the sum of in x out over its linear layers; a
training pass forward and backward = 3 forward passes: the backward has the input and the weight
gradient products; a pass that needs only the input's gradient, through a critic to the action,
= 2), with rl-zoo3's settings of bench/sb3_side_by_side.py:
  ppo  actor 4-64-64-2 and critic 4-64-64-1 (A + C = 8,896): acting A + C per frame; training
       n_epochs 20 passes over each frame, 3 (A + C) each: 61 (A + C) per frame.
  a2c  the same nets; one pass over each frame: 4 (A + C) per frame.
  dqn  Q 4-256-256-2 (Q = 67,072); acting Q per frame; from frame 1,000 (learning_starts) on,
       gradient_steps / train_freq = 128 / 256 updates per frame of batch 64, each 3 Q (online)
       + Q (target) per sample.
  sac  actor 3-256-256-2 (A = 66,816), critics 4-256-256-1 (C = 66,816 each); acting A; per frame
       one update of batch 256: critic loss A + 2 C (targets) + 2 x 3 C, actor loss 3 A + 2 x 2 C.
  td3  actor 3-400-300-1 (A = 121,500), critics 4-400-300-1 (C = 121,900); acting A; per frame one
       critic update of batch 256, A + 2 C (targets) + 2 x 3 C, and every 2nd frame (policy_delay)
       an actor update 3 A + 2 C (critic 1 only).
The SAC and TD3 counts agree with torch.profiler(with_flops=True) over the lab's updates (546 and
715 MFLOP per update, docs/BENCHMARKS.md "Off-policy speed").
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sb3_side_by_side import ROWS, Row  # noqa: E402  (bench/ is not a package)


def macs(*widths: int) -> int:
    """Multiply-adds per sample of an MLP with these layer widths (input first)."""
    return sum(a * b for a, b in zip(widths, widths[1:]))


def _ppo_like(passes: int) -> float:
    actor_critic = macs(4, 64, 64, 2) + macs(4, 64, 64, 1)
    return 2.0 * actor_critic * (1 + 3 * passes)


def _dqn(row: Row) -> float:
    q = macs(4, 256, 256, 2)
    kw = row.sb3_kwargs
    updates_per_frame = kw['gradient_steps'] / kw['train_freq']
    training_share = 1 - kw['learning_starts'] / row.full_frames  # the speed window is the whole run
    return 2.0 * (q + training_share * updates_per_frame * kw['batch_size'] * (3 * q + q))


def _sac() -> float:
    a, c = macs(3, 256, 256, 2), macs(4, 256, 256, 1)
    return 2.0 * (a + 256 * ((a + 2 * c + 6 * c) + (3 * a + 4 * c)))


def _td3() -> float:
    a, c = macs(3, 400, 300, 1), macs(4, 400, 300, 1)
    return 2.0 * (a + 256 * ((a + 2 * c + 6 * c) + (3 * a + 2 * c) / 2))


FLOPS_PER_FRAME = {'ppo': lambda row: _ppo_like(row.sb3_kwargs['n_epochs']), 'a2c': lambda row: _ppo_like(1),
                   'dqn': _dqn, 'sac': lambda row: _sac(), 'td3': lambda row: _td3()}


def limit_threads(cpu: int | None) -> None:
    """One torch thread (and one core with `cpu`), as the side-by-side runs have."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    os.environ.setdefault('OMP_NUM_THREADS', '1')
    os.environ.setdefault('MKL_NUM_THREADS', '1')
    import torch
    torch.set_num_threads(1)


def peak_gflops(rounds: int = 7) -> float:
    """This CPU's single-thread fp32 product speed: the best round of MKL (torch.mm) and of oneDNN
    (torch.ops.mkldnn._linear_pointwise, where this build has it) over two shapes."""
    import torch
    onednn = getattr(torch.ops.mkldnn, '_linear_pointwise', None) if torch.backends.mkldnn.is_available() else None
    best = 0.0
    for m, k, n, calls in ((256, 400, 300, 20), (1024, 1024, 1024, 2)):
        x, w = torch.randn(m, k), torch.randn(n, k)
        kernels = [lambda: torch.mm(x, w.t())]
        if onednn is not None:
            kernels.append(lambda: onednn(x, w, None, 'none', [], ''))
        for kernel in kernels:
            kernel()
            for _ in range(rounds):
                t = time.perf_counter()
                for _ in range(calls):
                    kernel()
                best = max(best, 2.0 * m * k * n * calls / (time.perf_counter() - t) / 1e9)
    return best


def env_seconds_per_frame(row: Row, frames: int = 20_000, seed: int = 0) -> float:
    """The row's env alone: seconds per frame of gymnasium's sync vector env under random actions
    (the same autoreset as the lab's vector envs: in the same step)."""
    import gymnasium as gym
    import numpy as np
    env = gym.make_vec(row.env_id, num_envs=row.n_envs, vectorization_mode='sync',
                       vector_kwargs={'autoreset_mode': gym.vector.AutoresetMode.SAME_STEP})
    env.reset(seed=seed)
    env.action_space.seed(seed)
    steps = max(1, frames // row.n_envs)
    actions = [env.action_space.sample() for _ in range(min(steps, 1000))]
    for a in actions[:50]:  # warm up
        env.step(a)
    t = time.perf_counter()
    for i in range(steps):
        env.step(actions[i % len(actions)])
    elapsed = time.perf_counter() - t
    env.close()
    return elapsed / (steps * row.n_envs)


@dataclass
class Floor:
    row: str
    env_us: float  # per frame
    mflop: float  # per frame
    peak_gflops: float

    @property
    def compute_us(self) -> float:
        return self.mflop * 1e3 / self.peak_gflops

    @property
    def fps(self) -> float:
        return 1e6 / (self.env_us + self.compute_us)


def measure(rows: list[Row], peak: float | None = None) -> list[Floor]:
    peak = peak or peak_gflops()
    return [Floor(row.key, env_seconds_per_frame(row) * 1e6, FLOPS_PER_FRAME[row.key](row) / 1e6, peak)
            for row in rows]


def format_floors(floors: list[Floor], side: dict | None = None) -> str:
    """One line per row: the floor and its parts; with `side` (sb3_side_by_side.py's --json),
    each tool's median frames/s over its seeds as a share of the floor, and 2x SB3's."""
    by_tool: dict[tuple[str, str], list[float]] = {}
    for run in (side or {}).get('runs', []):
        by_tool.setdefault((run['row'], run['tool']), []).append(run['fps'])
    lines = []
    for f in floors:
        line = (f'{f.row}: floor {f.fps:,.0f} fps = env {f.env_us:.1f} us + compute {f.compute_us:.1f} us per frame '
                f'({f.mflop:.3g} MFLOP at {f.peak_gflops:.0f} GFLOP/s)')
        sb3, lab = by_tool.get((f.row, 'sb3')), by_tool.get((f.row, 'lab'))
        if lab:
            line += f' | lab {statistics.median(lab):,.0f} fps = {statistics.median(lab) / f.fps:.1%} of the floor'
        if sb3:
            line += (f' | SB3 {statistics.median(sb3):,.0f} fps = {statistics.median(sb3) / f.fps:.1%}; '
                     f'2x SB3 = {2 * statistics.median(sb3) / f.fps:.1%}')
        lines.append(line)
    return '\n'.join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog='bench/floor.py', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rows', default=','.join(ROWS), type=lambda s: [k.strip() for k in s.split(',') if k.strip()],
                        help=f'comma-separated rows (default all: {",".join(ROWS)})')
    parser.add_argument('--cpu', type=int, metavar='N', help='pin to core N')
    parser.add_argument('--side', metavar='JSON', help="sb3_side_by_side.py's --json output: compare its frames/s")
    args = parser.parse_args(argv)
    unknown = [k for k in args.rows if k not in ROWS]
    if unknown or not args.rows:
        parser.error(f'--rows: unknown {", ".join(unknown) or "(none given)"}; choose from {", ".join(ROWS)}')
    side = None
    if args.side:
        try:
            side = json.loads(Path(args.side).read_text())
        except (OSError, ValueError) as e:
            parser.error(f'--side {args.side}: not a side-by-side JSON file ({e})')
    limit_threads(args.cpu)
    floors = measure([ROWS[k] for k in args.rows])
    print(f'# {time.strftime("%Y-%m-%d %H:%M %Z")} | one thread{f", core {args.cpu}" if args.cpu is not None else ""}')
    print(format_floors(floors, side))
    return 0


if __name__ == '__main__':
    sys.exit(main())
