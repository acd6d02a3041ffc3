"""The lab and Stable-Baselines3 side by side: frames/s and learning on rl-zoo3's configs.

    pip install -r requirements-bench.txt            # once: stable-baselines3 (bench only)
    python bench/sb3_side_by_side.py                 # 5 rows x seeds 0,1,2 x 2 tools, about 30 min (see below)
    python bench/sb3_side_by_side.py --rows ppo,a2c --seeds 0,1,2 --cpu 1
    python bench/sb3_side_by_side.py --frames-scale 0.2 --json /tmp/side.json   # a quick check
    python bench/sb3_side_by_side.py --full          # every row at its full length: learning for all rows
    python bench/sb3_side_by_side.py --rows ppo --seeds 0 --lab-only --frames-scale 0.005   # no SB3 needed

After the table it prints each row's floor (bench/floor.py: the row's env alone plus its matrix
products at this CPU's measured peak) and each tool's median frames/s as a share of it.

Rows (rl-zoo3's hyperparameters, SB3's defaults where rl-zoo3 gives none; the lab's spec that
maps them is named, docs/BENCHMARKS.md has the mapping and what the lab cannot express):

    ppo  PPO CartPole-v1, 8 envs, 100k frames           spec/benchmark/ppo/ppo_cartpole_zoo.json ppo_cartpole_zoo
    a2c  A2C CartPole-v1, 8 envs, 500k frames           spec/benchmark/a2c/a2c_cartpole_zoo.json a2c_cartpole_zoo
    dqn  DQN CartPole-v1, 1 env, 50k frames             spec/benchmark/dqn/dqn_cartpole_zoo.json dqn_cartpole_zoo
    sac  SAC Pendulum-v1, 1 env, 20k frames             spec/benchmark/sac/sac_pendulum_zoo.json sac_pendulum_zoo
    td3  TD3 Pendulum-v1, 1 env, 20k frames             spec/benchmark/td3/td3_pendulum.json td3_pendulum

How it runs. For each row and seed, SB3 and the lab run one after the other (SB3 first for the
first seed, the lab first for the second, and so on), each in a fresh Python process with one
torch thread (torch.set_num_threads(1), OMP_NUM_THREADS and MKL_NUM_THREADS 1) and, with
--cpu N, pinned to core N (os.sched_setaffinity).

What is measured, the same way on both sides:
  fps          env frames (summed over the vector envs) / wall seconds, over a window of the training
               call: SB3's model.learn, timed by a callback at the window's start (or the call itself
               from frame 0); the lab's Session loop, from its train CSV (`frame`, `wall_t` of the row
               at the window's start, or 0 from frame 0; `wall_t` of the last row). Both include what
               each tool does while it trains: SB3 its logger, the lab its records, model files and
               snapshots at the spec's frequencies (the lab's clock also counts building its agent).
  cpu_fps      the same frames / the CPU seconds of the process over the same window (time.process_time;
               the lab's loop from Session.run's start, or its log row at the window's start, to its last
               row): the figure to compare on a machine that other work shares, where wall time is
               mostly waiting for a core.
  learning     mean return of the last 100 training episodes (SB3: the Monitor's ep_info_buffer; the
               lab: total_reward_ma of the last train row), exploration included; and, with
               --eval-episodes N (default 10), the mean return of N greedy episodes of the final
               weights on a separate env (SB3: evaluate_policy(deterministic=True); the lab: enjoy
               with --ckpt latest).
  total_s      the child process from start to the end of training: imports, setup and training, not
               the greedy evaluation.

The default run is the affordable one: PPO and DQN at their full length, A2C over its first 100k
frames, SAC over 3k frames (speed from frame 1,000, once training has run 900 steps) and TD3 over
12k (speed over frames 10k-12k: it acts at random, without training, until 10k). Learning figures
of A2C, SAC and TD3 are then those of the shortened runs (the printout says so); --full runs every
row at its full length (speed windows from 0 for the on-policy and DQN rows, from 1k for SAC, from
10k for TD3). --frames-scale F multiplies each window's length (not its start) for a quick check.

Cost, estimated on this project's 2-core VM from earlier speeds (SB3 SAC/TD3 ~40 frames/s while
training, the lab's PPO ~6k fps, DQN ~1.7k): per seed and both tools, PPO ~1.5 min, DQN ~2 min,
A2C ~2 min, SAC ~2.5 min, TD3 ~2 min, so the default table (3 seeds) takes about 30 minutes; --full
adds A2C's 400k frames and SAC's and TD3's 17k and 8k training frames: about 2 hours.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Row:
    """One comparison: an rl-zoo3 config for SB3 and the lab spec that maps it."""
    key: str
    algo: str  # SB3's class name
    env_id: str
    n_envs: int
    full_frames: int  # rl-zoo3's n_timesteps
    quick_frames: int  # the default run's length
    window_start: int  # frames/s is measured from this frame to the run's end
    spec_file: str
    spec_name: str
    sb3_kwargs: dict = field(default_factory=dict)


ROWS = {
    'ppo': Row('ppo', 'PPO', 'CartPole-v1', 8, 100_000, 100_000, 0,
               'spec/benchmark/ppo/ppo_cartpole_zoo.json', 'ppo_cartpole_zoo',
               dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
                    learning_rate='lin_0.001', clip_range='lin_0.2')),
    'a2c': Row('a2c', 'A2C', 'CartPole-v1', 8, 500_000, 100_000, 0,
               'spec/benchmark/a2c/a2c_cartpole_zoo.json', 'a2c_cartpole_zoo', dict(ent_coef=0.0)),
    'dqn': Row('dqn', 'DQN', 'CartPole-v1', 1, 50_000, 50_000, 0,
               'spec/benchmark/dqn/dqn_cartpole_zoo.json', 'dqn_cartpole_zoo',
               dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
                    target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
                    exploration_final_eps=0.04, policy_kwargs={'net_arch': [256, 256]})),
    'sac': Row('sac', 'SAC', 'Pendulum-v1', 1, 20_000, 3_000, 1_000,
               'spec/benchmark/sac/sac_pendulum_zoo.json', 'sac_pendulum_zoo', dict(learning_rate=1e-3)),
    'td3': Row('td3', 'TD3', 'Pendulum-v1', 1, 20_000, 12_000, 10_000,
               'spec/benchmark/td3/td3_pendulum.json', 'td3_pendulum',
               dict(gamma=0.98, buffer_size=200_000, learning_starts=10_000, action_noise='normal_0.1', train_freq=1,
                    gradient_steps=1, learning_rate=1e-3, policy_kwargs={'net_arch': [400, 300]})),
}
SB3_MISSING = ('stable_baselines3 is not installed in this Python: pip install -r requirements-bench.txt '
               '(bench only), or pass --lab-only')


def run_frames(row: Row, full: bool, scale: float) -> int:
    """The length of a run: the window's start plus its (scaled) length, at least one vector step."""
    end = row.full_frames if full else row.quick_frames
    return row.window_start + max(row.n_envs, int(round((end - row.window_start) * scale)))


# --- the child processes ---------------------------------------------------------------------------

def _limit_threads(cpu: int | None) -> None:
    """One torch thread (and one core with --cpu) for the child, before torch does any work."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    import torch  # here, after the thread variables are set, so its pools start at one thread
    torch.set_num_threads(1)


def _linear(initial: float):
    """rl-zoo3's lin_X: X times the fraction of training left (SB3's progress_remaining)."""
    return lambda progress_remaining: progress_remaining * initial


def sb3_child(row: Row, seed: int, frames: int, eval_episodes: int) -> dict:
    """Train SB3 on the row's config; measure as the module docstring says."""
    import numpy as np
    import stable_baselines3 as sb3
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.noise import NormalActionNoise

    kwargs = dict(row.sb3_kwargs)
    for key in ('learning_rate', 'clip_range'):
        if isinstance(kwargs.get(key), str):
            kwargs[key] = _linear(float(kwargs[key][len('lin_'):]))
    env = make_vec_env(row.env_id, n_envs=row.n_envs, seed=seed)
    if kwargs.get('action_noise') == 'normal_0.1':
        n_actions = env.action_space.shape[0]
        kwargs['action_noise'] = NormalActionNoise(np.zeros(n_actions), 0.1 * np.ones(n_actions))
    model = getattr(sb3, row.algo)('MlpPolicy', env, seed=seed, device='cpu', verbose=0, **kwargs)

    class WindowStart(BaseCallback):
        """The time and frame at the first step at or past the window's start."""

        def __init__(self, start: int):
            super().__init__()
            self.start, self.at = start, None

        def _on_step(self) -> bool:
            if self.at is None and self.num_timesteps >= self.start:
                self.at = (self.num_timesteps, time.perf_counter(), time.process_time())
            return True

    callback = WindowStart(row.window_start) if row.window_start else None
    t0, c0 = time.perf_counter(), time.process_time()
    model.learn(total_timesteps=frames, callback=callback)
    t1, c1 = time.perf_counter(), time.process_time()
    start_frame, start_t, start_c = callback.at if callback else (0, t0, c0)
    returns = [info['r'] for info in model.ep_info_buffer]
    result = {'frames': int(model.num_timesteps), 'window_frames': int(model.num_timesteps) - start_frame,
              'window_s': t1 - start_t, 'window_cpu_s': c1 - start_c, 'train_s': t1 - t0,
              'last100_return': float(np.mean(returns)) if returns else math.nan, 'episodes': len(returns)}
    if eval_episodes:
        t2 = time.perf_counter()
        eval_env = make_vec_env(row.env_id, n_envs=1, seed=seed + 10**6)
        mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=eval_episodes, deterministic=True)
        result.update(greedy_return=float(mean), eval_s=time.perf_counter() - t2)
    return result


def lab_child(row: Row, seed: int, frames: int, eval_episodes: int, work_dir: Path) -> dict:
    """Train the lab's spec for the row (one session, this seed); measure from its train CSV."""
    sys.path.insert(0, str(REPO_ROOT))
    sys.path.insert(0, str(REPO_ROOT / 'bench'))
    from benchmark import read_train_rows
    from slm_lab import lab
    from slm_lab.experiment import session, viz
    from slm_lab.experiment.enjoy import enjoy
    viz.png_available = lambda: False  # PNG export (kaleido) is a run's end, not training; HTML graphs stay
    cpu_at: dict[str, float] = {}  # process CPU seconds at the loop's start and end and at each log row
    run, log_row = session.Session.run, session.Session.log_row

    def timed_run(self, *args, **kwargs):
        cpu_at['start'] = time.process_time()
        try:
            return run(self, *args, **kwargs)
        finally:
            cpu_at.setdefault('end', time.process_time())

    def timed_log_row(self):
        log_row(self)
        cpu_at[f'row{self.clock.frame}'] = time.process_time()
        if self.clock.frame >= self.clock.max_frame:
            cpu_at['end'] = time.process_time()  # before the session's final files and graphs

    session.Session.run, session.Session.log_row = timed_run, timed_log_row
    overrides = [f'meta.random_seed={seed}', 'meta.max_session=1', f'env.max_frame={frames}',
                 'meta.torch_num_threads=1']
    with open(work_dir / 'lab.log', 'a', encoding='utf-8') as log, contextlib.redirect_stderr(log):
        lab.run(str(REPO_ROOT / row.spec_file), row.spec_name, 'train', overrides, data_dir=str(work_dir))
    run_root = next(p for p in work_dir.iterdir() if p.is_dir() and not p.name.startswith('.'))  # not data/.cache
    rows = read_train_rows(run_root)
    last = rows[-1]
    start = next((r for r in rows if r['frame'] >= row.window_start), None) if row.window_start else None
    start_frame, start_t = (start['frame'], start['wall_t']) if start else (0, 0.0)
    start_c = cpu_at[f'row{int(start_frame)}'] if start else cpu_at['start']
    ma = last['total_reward_ma']
    result = {'frames': int(last['frame']), 'window_frames': int(last['frame'] - start_frame),
              'window_s': last['wall_t'] - start_t, 'window_cpu_s': cpu_at['end'] - start_c, 'train_s': last['wall_t'],
              'last100_return': ma, 'episodes': int(last['epi'])}
    if eval_episodes:
        t2 = time.perf_counter()
        spec_path = run_root / f'{row.spec_name}_t0_s0_spec.json'
        with open(os.devnull, 'w') as devnull, contextlib.redirect_stdout(devnull):
            returns = enjoy(str(spec_path), episodes=eval_episodes, ckpt='latest')
        result.update(greedy_return=float(sum(returns) / len(returns)), eval_s=time.perf_counter() - t2)
    return result


def child_main(args: argparse.Namespace) -> int:
    _limit_threads(args.cpu)
    row = ROWS[args.rows[0]]
    with tempfile.TemporaryDirectory(prefix='sb3_side_') as tmp:
        if args.child == 'sb3':
            result = sb3_child(row, args.seed, args.frames, args.eval_episodes)
        else:
            result = lab_child(row, args.seed, args.frames, args.eval_episodes, Path(tmp))
    result['fps'] = result['window_frames'] / result['window_s'] if result['window_s'] > 0 else math.nan
    cpu_s = result['window_cpu_s']
    result['cpu_fps'] = result['window_frames'] / cpu_s if cpu_s > 0 else math.nan
    print('RESULT ' + json.dumps(result), flush=True)
    return 0


# --- the parent: interleave, print ------------------------------------------------------------------

@dataclass
class Measured:
    """One child's figures (see the module docstring)."""
    tool: str
    row: str
    seed: int
    frames: int
    fps: float
    cpu_fps: float
    window_frames: int
    train_s: float
    total_s: float
    last100_return: float
    episodes: int
    greedy_return: float = math.nan


def run_child(tool: str, row: Row, seed: int, frames: int, args: argparse.Namespace) -> Measured:
    """One training in a fresh process; its figures, or SystemExit with the child's last lines."""
    cmd = [sys.executable, str(Path(__file__).resolve()), '--child', tool, '--rows', row.key, '--seed', str(seed),
           '--frames', str(frames), '--eval-episodes', str(args.eval_episodes)]
    if args.cpu is not None:
        cmd += ['--cpu', str(args.cpu)]
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1'}
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO_ROOT)
    elapsed = time.perf_counter() - start
    lines = [line for line in proc.stdout.splitlines() if line.startswith('RESULT ')]
    if proc.returncode != 0 or not lines:
        tail = '\n'.join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise SystemExit(f'error: the {tool} run of {row.key} seed {seed} failed (exit {proc.returncode}):\n{tail}')
    r = json.loads(lines[-1][len('RESULT '):])
    return Measured(tool, row.key, seed, r['frames'], r['fps'], r['cpu_fps'], r['window_frames'], r['train_s'],
                    elapsed - r.get('eval_s', 0.0), r['last100_return'], r['episodes'],
                    r.get('greedy_return', math.nan))


def _fmt(x: float, digits: int = 0) -> str:
    return '-' if x is None or (isinstance(x, float) and math.isnan(x)) else f'{x:,.{digits}f}'


def _learning(m: Measured | None) -> str:
    if m is None:
        return '-'
    text = _fmt(m.last100_return, 1)
    return text if math.isnan(m.greedy_return) else f'{text} / {_fmt(m.greedy_return, 1)}'


def format_table(results: list[Measured]) -> str:
    """One line per row and seed, then the median ratio per row."""
    pairs: dict[tuple[str, int], dict[str, Measured]] = {}
    for m in results:
        pairs.setdefault((m.row, m.seed), {})[m.tool] = m
    head = ('row', 'seed', 'frames', 'SB3 fps', 'lab fps', 'lab/SB3', 'SB3 cpu_fps', 'lab cpu_fps', 'cpu lab/SB3',
            'SB3 total_s', 'lab total_s', 'SB3 learning', 'lab learning')
    lines = []
    ratios: dict[str, list[float]] = {}
    cpu_ratios: dict[str, list[float]] = {}

    def ratio_of(ours: float | None, sb3: float | None, into: list[float]) -> str:
        ratio = ours / sb3 if ours is not None and sb3 and not math.isnan(ours) and sb3 > 0 else math.nan
        if not math.isnan(ratio):
            into.append(ratio)
        return '-' if math.isnan(ratio) else f'{ratio:.2f}x'

    for (row, seed), tools in pairs.items():
        sb3, ours = tools.get('sb3'), tools.get('lab')
        frames = (ours or sb3).frames
        lines.append([row, str(seed), f'{frames:,}', _fmt(sb3.fps if sb3 else math.nan),
                      _fmt(ours.fps if ours else math.nan),
                      ratio_of(ours and ours.fps, sb3 and sb3.fps, ratios.setdefault(row, [])),
                      _fmt(sb3.cpu_fps if sb3 else math.nan), _fmt(ours.cpu_fps if ours else math.nan),
                      ratio_of(ours and ours.cpu_fps, sb3 and sb3.cpu_fps, cpu_ratios.setdefault(row, [])),
                      _fmt(sb3.total_s if sb3 else math.nan, 1), _fmt(ours.total_s if ours else math.nan, 1),
                      _learning(sb3), _learning(ours)])
    rows = [list(head)] + lines
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    out = ['  '.join(c.ljust(w) if j in (0, 11, 12) else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths)))
           for r in rows]
    out.insert(1, '  '.join('-' * w for w in widths))
    summary = [f'{row}: median lab/SB3 over {len(rs)} seed{"s" if len(rs) > 1 else ""}: frames/s '
               f'{statistics.median(rs):.2f}x, CPU frames/s {statistics.median(cpu_ratios[row]):.2f}x'
               for row, rs in ratios.items() if rs and cpu_ratios.get(row)]
    return '\n'.join(out + ([''] + summary if summary else []))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog='bench/sb3_side_by_side.py', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rows', default=','.join(ROWS), type=lambda s: [k.strip() for k in s.split(',') if k.strip()],
                        help=f'comma-separated rows (default all: {",".join(ROWS)})')
    parser.add_argument('--seeds', default='0,1,2', type=lambda s: [int(k) for k in s.split(',') if k.strip()],
                        help='comma-separated seeds (default 0,1,2)')
    parser.add_argument('--frames-scale', type=float, default=1.0, metavar='F',
                        help='multiply the length of each speed window (not its start) by F, e.g. 0.2')
    parser.add_argument('--full', action='store_true',
                        help="every row at rl-zoo3's full length (learning of A2C, SAC, TD3 too; about 2 hours)")
    parser.add_argument('--cpu', type=int, metavar='N', help='pin each run to core N')
    parser.add_argument('--eval-episodes', type=int, default=10, metavar='N',
                        help='greedy episodes of the final weights per run (0: none; default 10)')
    parser.add_argument('--lab-only', action='store_true', help='run only the lab side (no SB3 needed)')
    parser.add_argument('--sb3-only', action='store_true', help='run only the SB3 side')
    parser.add_argument('--json', metavar='OUT', help='also write every figure to OUT as JSON')
    parser.add_argument('--no-floor', action='store_true',
                        help="skip the floor lines (bench/floor.py) printed after the table")
    parser.add_argument('--child', choices=('sb3', 'lab'), help=argparse.SUPPRESS)
    parser.add_argument('--seed', type=int, help=argparse.SUPPRESS)
    parser.add_argument('--frames', type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = [k for k in args.rows if k not in ROWS]
    if unknown or not args.rows:
        parser.error(f'--rows: unknown {", ".join(unknown) or "(none given)"}; choose from {", ".join(ROWS)}')
    if not args.seeds:
        parser.error('--seeds: give at least one seed, e.g. --seeds 0,1,2')
    if args.frames_scale <= 0:
        parser.error('--frames-scale must be > 0')
    if args.lab_only and args.sb3_only:
        parser.error('--lab-only and --sb3-only exclude each other')
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        return child_main(args)
    if not args.lab_only and importlib.util.find_spec('stable_baselines3') is None:
        print(f'error: {SB3_MISSING}', file=sys.stderr)
        return 2
    tools = ['lab'] if args.lab_only else ['sb3'] if args.sb3_only else ['sb3', 'lab']
    rows = [ROWS[k] for k in args.rows]
    print(f'# {time.strftime("%Y-%m-%d %H:%M %Z")} | {os.cpu_count()} CPU cores | one torch thread per run'
          f'{f" | pinned to core {args.cpu}" if args.cpu is not None else ""} | '
          f'{"full lengths" if args.full else "default lengths"} | frames scale {args.frames_scale:g} | '
          f'greedy episodes {args.eval_episodes}', flush=True)
    for row in rows:
        frames = run_frames(row, args.full, args.frames_scale)
        partial = (f" of rl-zoo3's {row.full_frames:,} (learning figures are of this shortened run)"
                   if frames < row.full_frames else '')
        print(f'# {row.key}: {row.algo} {row.env_id} x{row.n_envs}, {frames:,} frames{partial}, '
              f'fps from frame {row.window_start:,}', flush=True)
    results: list[Measured] = []
    try:
        for row in rows:
            frames = run_frames(row, args.full, args.frames_scale)
            for i, seed in enumerate(args.seeds):
                order = tools if i % 2 == 0 else tools[::-1]
                for tool in order:
                    m = run_child(tool, row, seed, frames, args)
                    results.append(m)
                    print(f'done {tool} {row.key} seed {seed}: {m.frames:,} frames, fps {_fmt(m.fps)} over '
                          f'{m.window_frames:,} frames, last-100 return {_fmt(m.last100_return, 1)}, greedy '
                          f'{_fmt(m.greedy_return, 1)}, total {m.total_s:.1f} s', flush=True)
    finally:
        if results:
            print()
            print('learning: mean return of the last 100 training episodes / of the greedy episodes')
            print(format_table(results), flush=True)
            meta = {'date': time.strftime('%Y-%m-%dT%H:%M:%S%z'), 'cpu_count': os.cpu_count(), 'cpu': args.cpu,
                    'full': args.full, 'frames_scale': args.frames_scale, 'eval_episodes': args.eval_episodes}
            figures = json.dumps({'meta': meta, 'runs': [asdict(m) for m in results]}, indent=1)
            if args.json:
                from slm_lab.lib.io import atomic_write_text  # noqa: E402 (the lab's atomic write)
                atomic_write_text(args.json, figures)
            if not args.no_floor:
                print()
                print(floor_lines(args, figures), flush=True)
    return 0


def floor_lines(args: argparse.Namespace, figures: str) -> str:
    """bench/floor.py's lines for the rows run, with these runs' frames/s as shares of each floor,
    measured in a fresh process of one thread on the same core."""
    with tempfile.TemporaryDirectory(prefix='slm_side_') as tmp:
        side = Path(tmp, 'side.json')
        side.write_text(figures)
        cmd = [sys.executable, str(Path(__file__).resolve().parent / 'floor.py'), '--rows', ','.join(args.rows),
               '--side', str(side)] + (['--cpu', str(args.cpu)] if args.cpu is not None else [])
        env = {**os.environ, 'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1'}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO_ROOT)
    if done.returncode != 0:
        return 'floor not measured: ' + ((done.stderr or done.stdout).strip().splitlines() or ['?'])[-1]
    return ('the floor of each row (bench/floor.py: the env alone + the products at this CPU\'s peak) and each '
            "tool's median frames/s as a share of it:\n" + done.stdout.strip())


if __name__ == '__main__':
    sys.path.insert(0, str(REPO_ROOT))
    sys.exit(main())
