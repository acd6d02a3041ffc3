"""Train benchmark specs and print how well and how fast they learned.

    python bench/benchmark.py                       # every shipped CartPole spec, 1 seed
    python bench/benchmark.py --seeds 3             # seeds 0, 1, 2
    python bench/benchmark.py spec/benchmark/ppo/ppo_cartpole_zoo.json:ppo_cartpole_zoo
    python bench/benchmark.py --targets --seeds 3                  # every row of SLM_LAB_TARGETS
    python bench/benchmark.py --targets Acrobot-v1 PPO --seeds 3   # the rows whose env or algorithm match

Each run is an ordinary `slm_lab.lab.run(spec_file, spec_name, 'train', ['meta.random_seed=S', ...])`
in this process, one session at a time (meta.max_session is set to 1), so frames/s is the speed of
one session on one core (meta.torch_num_threads of the spec, 1 by default). Runs go to a temporary
directory that is deleted at the end, unless --data-dir names one to keep.

--targets trains the specs of spec/benchmark/*/*_slm_lab_v5.json, which carry the hyperparameters of
the SLM-Lab v5 benchmark specs behind SLM-Lab's published moving averages (SLM_LAB_TARGETS: the rows of
spec/benchmark/suites/slm_lab_v5_cpu.json, which `slm-lab benchmark` runs with 4 seeds and intervals), and
prints per row, per seed, final_ma and slm_ma (below), and the median slm_ma over the seeds next to
SLM-Lab's figure: met when that median is at or above it. SLM-Lab's figure is its trial's
total_reward_ma, the mean over its sessions of each session's slm_ma (its analysis takes the mean of
the last 100 rows' 100-episode moving average), so slm_ma is the like-for-like number; on a curve
still rising at the end it is below final_ma.

    python bench/benchmark.py --score DIR ...      # final_ma and slm_ma of kept runs (run dirs or --data-dir)

Per run the table gives, from the session's train CSV (info/*_session_df_train.csv):
  final_ma      total_reward_ma of the last row: mean return of the last 100 training episodes
  slm_ma        mean total_reward_ma of the last 100 rows (100 rows of env.log_frequency frames:
                the last 50k-100k frames of the benchmark rows), as SLM-Lab scores a session
  frames_to_475 frame of the first row whose total_reward_ma >= --threshold ('-' if never)
  fps           frame / wall_t of the last row: mean frames per second of the whole session
  wall_s        seconds the run took, including setup and writing graphs and metrics
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

BENCHMARK_DIR = REPO_ROOT / 'spec' / 'benchmark'
CARTPOLE = 'CartPole-v1'


@dataclass
class RunResult:
    """What one benchmark run measured."""
    spec_name: str
    seed: int
    final_ma: float
    slm_ma: float
    frames_to_threshold: int | None
    frames: int
    fps: float
    wall_s: float


# (env, algorithm, spec file, spec name, SLM-Lab v5's published final moving average): the rows and
# references of the CPU tier's suite file, their one home (slm-lab benchmark runs the same file)
CPU_SUITE = REPO_ROOT / 'spec' / 'benchmark' / 'suites' / 'slm_lab_v5_cpu.json'


def _targets() -> list[tuple]:
    from slm_lab.experiment.benchmark.suite import read_suite
    rows = read_suite(str(CPU_SUITE)).rows
    return [(r.env, r.algorithm, r.spec_file, r.spec_name, r.references[0].value) for r in rows]


SLM_LAB_TARGETS = _targets()


def target_rows(filters: list[str]) -> list[tuple]:
    """The SLM_LAB_TARGETS rows whose env, algorithm or spec name is one of `filters` (all when empty)."""
    return [row for row in SLM_LAB_TARGETS
            if not filters or row[0] in filters or row[1] in filters or row[3] in filters]


def format_targets(rows: list[tuple], results: list[RunResult]) -> str:
    """One line per target row that ran: final_ma and slm_ma per seed, the median slm_ma,
    SLM-Lab's figure, met."""
    lines = ['| env | algorithm | spec | frames | final_ma per seed | slm_ma per seed | median slm_ma | SLM-Lab v5 '
             '| met |',
             '|---|---|---|---:|---|---|---:|---:|---|']
    for env, algo, spec_file, spec_name, slm in rows:
        rs = [r for r in results if r.spec_name == spec_name]
        if not rs:
            continue
        median = statistics.median(r.slm_ma for r in rs)
        lines.append(f'| {env} | {algo} | `{spec_name}` | {rs[0].frames:,} | '
                     f'{", ".join(_fmt(r.final_ma, 2) for r in rs)} | {", ".join(_fmt(r.slm_ma, 2) for r in rs)} | '
                     f'{median:.2f} | {slm:.2f} | '
                     f'{"yes" if median >= slm else "no"} ({len(rs)} seed{"s" if len(rs) > 1 else ""}) |')
    return '\n'.join(lines)


def shipped_specs(env_name: str = CARTPOLE) -> list[tuple[str, str]]:
    """(spec_file, spec_name) of every spec under spec/benchmark/ whose env is `env_name`."""
    found = []
    for path in sorted(BENCHMARK_DIR.rglob('*.json')):
        with open(path, encoding='utf-8') as f:
            specs = json.load(f)
        for name, spec in specs.items():
            if spec.get('env', {}).get('name') == env_name:
                found.append((os.path.relpath(path), name))
    return found


def parse_spec_arg(text: str) -> tuple[str, str]:
    """'path/to/file.json:spec_name' -> (file, name)."""
    path, sep, name = text.rpartition(':')
    if not sep or not path or not name:
        raise argparse.ArgumentTypeError(f"'{text}': expected SPEC_FILE:SPEC_NAME, "
                                         'e.g. spec/benchmark/ppo/ppo_cartpole.json:ppo_cartpole')
    return path, name


def read_csv_rows(path: str | Path) -> list[dict]:
    """The rows of a session's train CSV as dicts of floats (NaN for empty cells)."""
    with open(path, encoding='utf-8') as f:
        header = f.readline().strip().split(',')
        rows = []
        for line in f:
            cells = line.rstrip('\n').split(',')
            rows.append({k: float(v) if v else math.nan for k, v in zip(header, cells)})
    return rows


def read_train_rows(run_root: Path) -> list[dict]:
    """The rows of the run's first session's train CSV."""
    paths = sorted(glob.glob(str(run_root / 'info' / '*_t0_s0_session_df_train.csv')))
    if not paths:
        raise FileNotFoundError(f'no train CSV under {run_root}/info')
    return read_csv_rows(paths[0])


def score_runs(dirs: list[str]) -> str:
    """final_ma and slm_ma of every session train CSV under the given folders (run dirs, or
    folders holding them), and per trial the mean over its sessions: SLM-Lab's trial figure."""
    lines = []
    for d in dirs:
        paths = sorted(Path(d).rglob('*_session_df_train.csv'))
        if not paths:
            raise FileNotFoundError(f'{d}: no info/*_session_df_train.csv under it; give a run dir '
                                    '(data/<spec_name>_<timestamp>) or a --data-dir of bench/benchmark.py')
        trials: dict[tuple[Path, str], list[tuple[str, list[dict]]]] = {}
        for path in paths:
            stem = path.name[:-len('_session_df_train.csv')]
            trial, _, session = stem.rpartition('_')
            trials.setdefault((path.parent.parent, trial), []).append((session, read_csv_rows(path)))
        for (run, trial), sessions in trials.items():
            for session, rows in sessions:
                if rows:
                    lines.append(f'{run}  {trial}_{session}  frame {int(rows[-1]["frame"]):,}  '
                                 f'final_ma {_fmt(rows[-1]["total_reward_ma"], 2)}  slm_ma {_fmt(slm_lab_ma(rows), 2)}')
            scored = [slm_lab_ma(rows) for _, rows in sessions if rows]
            if len(scored) > 1:
                mean = _fmt(statistics.fmean(scored), 2)
                lines.append(f'{run}  {trial}  mean slm_ma of {len(scored)} sessions {mean}')
    return '\n'.join(lines)


def slm_lab_ma(rows: list[dict]) -> float:
    """SLM-Lab's score of one session: the mean total_reward_ma of its last 100 rows (empty cells,
    before the first episode ends, left out as pandas' mean leaves them out); the benchmark
    command's `slm_ma` (slm_lab/experiment/benchmark/scores.py), NaN without a value."""
    from slm_lab.experiment.benchmark.scores import slm_ma
    value = slm_ma(rows)
    return math.nan if value is None else value


def summarize(spec_name: str, seed: int, rows: list[dict], wall_s: float, threshold: float) -> RunResult:
    """A RunResult from the train rows of one run."""
    last = rows[-1]
    reached = next((int(r['frame']) for r in rows if r['total_reward_ma'] >= threshold), None)
    fps = last['frame'] / last['wall_t'] if last['wall_t'] > 0 else math.nan
    return RunResult(spec_name, seed, last['total_reward_ma'], slm_lab_ma(rows), reached, int(last['frame']), fps,
                     wall_s)


def run_one(spec_file: str, spec_name: str, seed: int, data_dir: Path, overrides: list[str],
            threshold: float, quiet: bool) -> RunResult:
    """Train one spec with one seed into its own folder under data_dir; measure it."""
    from slm_lab import lab
    out_dir = data_dir / f'{spec_name}_seed{seed}'
    out_dir.mkdir(parents=True, exist_ok=True)
    before = set(out_dir.iterdir())
    run_overrides = [f'meta.random_seed={seed}', 'meta.max_session=1'] + overrides
    start = time.perf_counter()
    log = open(out_dir / 'console.log', 'a', encoding='utf-8') if quiet else None
    try:
        with contextlib.redirect_stderr(log) if quiet else contextlib.nullcontext():
            lab.run(spec_file, spec_name, 'train', run_overrides, data_dir=str(out_dir))
    finally:
        if log is not None:
            log.close()
    wall_s = time.perf_counter() - start
    # run directories only, not the lab's data/.cache
    new_runs = sorted(p for p in set(out_dir.iterdir()) - before if p.is_dir() and not p.name.startswith('.'))
    return summarize(spec_name, seed, read_train_rows(new_runs[-1]), wall_s, threshold)


def _fmt(x: float | None, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return '-'
    return f'{x:,.{digits}f}'


def format_table(results: list[RunResult], threshold: float) -> str:
    """A plain-text table: one row per run, then one per spec when a spec ran with several seeds."""
    head = ('spec', 'seed', 'frames', 'final_ma', 'slm_ma', f'frames_to_{threshold:g}', 'fps', 'wall_s')
    lines = [[r.spec_name, str(r.seed), f'{r.frames:,}', _fmt(r.final_ma), _fmt(r.slm_ma),
              _fmt(r.frames_to_threshold, 0), _fmt(r.fps, 0), _fmt(r.wall_s)] for r in results]
    by_spec: dict[str, list[RunResult]] = {}
    for r in results:
        by_spec.setdefault(r.spec_name, []).append(r)
    summary = []
    for name, rs in by_spec.items():
        if len(rs) < 2:
            continue
        mas = [r.final_ma for r in rs]
        reached = [r.frames_to_threshold for r in rs if r.frames_to_threshold is not None]
        summary.append([name, f'mean of {len(rs)}', f'{statistics.mean(r.frames for r in rs):,.0f}',
                        f'{statistics.mean(mas):.1f} (min {min(mas):.1f})',
                        f'{statistics.mean(r.slm_ma for r in rs):.1f}',
                        f'{statistics.mean(reached):,.0f} ({len(reached)}/{len(rs)} reached)' if reached
                        else f'- (0/{len(rs)} reached)',
                        f'{statistics.median(r.fps for r in rs):,.0f} (median)',
                        f'{statistics.mean(r.wall_s for r in rs):.1f}'])
    rows = [list(head)] + lines + summary
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    out = []
    for i, row in enumerate(rows):
        if i == 1 or (summary and i == len(lines) + 1):
            out.append('  '.join('-' * w for w in widths))
        out.append('  '.join(cell.ljust(w) if j == 0 else cell.rjust(w) for j, (cell, w) in
                             enumerate(zip(row, widths))))
    return '\n'.join(out)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog='bench/benchmark.py', description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('specs', nargs='*', metavar='SPEC_FILE:SPEC_NAME',
                        help=f'specs to train (default: every spec under spec/benchmark/ on {CARTPOLE}); '
                             'with --targets: env ids or algorithm labels of the rows to train')
    parser.add_argument('--targets', action='store_true',
                        help="train the rows of SLM_LAB_TARGETS (filtered by the env ids or algorithm labels given "
                             "as positional arguments) and compare with SLM-Lab's published figures")
    parser.add_argument('--score', action='store_true',
                        help='train nothing: print final_ma and slm_ma of the runs under the folders given as '
                             'positional arguments')
    parser.add_argument('--seeds', type=int, default=1, metavar='N',
                        help='seeds per spec: --seed-start .. --seed-start+N-1 (default 1)')
    parser.add_argument('--seed-start', type=int, default=0, metavar='S', help='first seed (default 0)')
    parser.add_argument('--data-dir', metavar='DIR',
                        help='keep the runs in DIR/{spec_name}_seed{S}/ (default: a temporary directory, deleted)')
    parser.add_argument('-s', '--set', dest='overrides', action='append', default=[], metavar='KEY=VALUE',
                        help='spec override for every run, as in run_lab.py (e.g. -s env.max_frame=20000)')
    parser.add_argument('--threshold', type=float, default=475.0,
                        help='total_reward_ma for the frames-to column (default 475, CartPole-v1 solved)')
    parser.add_argument('--png', action='store_true',
                        help='also export PNG graphs (about 2 s each; off by default, HTML graphs are always written)')
    parser.add_argument('-q', '--quiet', action='store_true',
                        help="send the lab's progress lines to DIR/.../console.log instead of stderr")
    args = parser.parse_args(argv)
    if args.score:
        if not args.specs:
            parser.error('--score needs folders: run dirs, or the --data-dir of earlier benchmark runs')
    elif not args.targets:
        try:
            args.specs = [parse_spec_arg(text) for text in args.specs]
        except argparse.ArgumentTypeError as e:
            parser.error(str(e))
    if args.seeds < 1:
        parser.error('--seeds must be >= 1')
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.score:
        try:
            print(score_runs(args.specs))
        except FileNotFoundError as e:
            print(f'error: {e}', file=sys.stderr)
            return 2
        return 0
    rows = target_rows(args.specs) if args.targets else []
    if args.targets and not rows:
        print(f'error: no row of SLM_LAB_TARGETS matches {" ".join(args.specs)}; envs: '
              f'{", ".join(sorted({r[0] for r in SLM_LAB_TARGETS}))}; algorithms: '
              f'{", ".join(sorted({r[1] for r in SLM_LAB_TARGETS}))}', file=sys.stderr)
        return 2
    specs = [(str(REPO_ROOT / r[2]), r[3]) for r in rows] if args.targets else (args.specs or shipped_specs())
    if not args.png:
        from slm_lab.experiment import viz
        viz.png_available = lambda: False
    data_dir = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix='slm_bench_'))
    seeds = range(args.seed_start, args.seed_start + args.seeds)
    import torch
    print(f'# {time.strftime("%Y-%m-%d %H:%M")} | {os.cpu_count()} CPU cores | torch {torch.__version__} | '
          f'data dir {data_dir}{"" if args.data_dir else " (temporary)"}', flush=True)
    from slm_lab.lib.errors import LabError
    results = []
    try:
        for spec_file, spec_name in specs:
            for seed in seeds:
                r = run_one(spec_file, spec_name, seed, data_dir, args.overrides, args.threshold, args.quiet)
                results.append(r)
                print(f'done {r.spec_name} seed {r.seed}: final_ma {_fmt(r.final_ma)}, slm_ma {_fmt(r.slm_ma)}, '
                      f'frames_to_'
                      f'{args.threshold:g} {_fmt(r.frames_to_threshold, 0)}, fps {_fmt(r.fps, 0)}, '
                      f'wall {_fmt(r.wall_s)} s', flush=True)
    except LabError as e:
        print(f'error: {e}', file=sys.stderr)
        return e.exit_code
    finally:
        if results:
            print()
            print(format_table(results, args.threshold), flush=True)
            if rows:
                print()
                print(format_targets(rows, results), flush=True)
        if not args.data_dir:
            shutil.rmtree(data_dir, ignore_errors=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
