"""Stable-Baselines3 on a benchmark suite's rows, seed by seed, beside the lab's benchmark of it.

    pip install -r requirements-bench.txt                      # once: stable-baselines3 (bench only)
    python bench/sb3_tier.py spec/benchmark/suites/mujoco_reduced.json --out sb3_mujoco.json --cpu 1
    python bench/sb3_tier.py spec/benchmark/suites/mujoco_reduced.json --out sb3_mujoco.json \\
        --lab data/mujoco_reduced_2026_12_01_120000           # the comparison only (no training)

For each row of the suite whose spec has an SB3 counterpart here (SB3_CONFIGS: rl-zoo3's settings
for the same spec, keyed by the row's spec_name) and each seed 0..N-1 of the row (the suite's seed
count, or --seeds), one SB3 training of the row's env for the row's max_frame agent steps (SB3's
num_timesteps), in a fresh process with one torch thread (pinned with --cpu), seeded with the seed
(SB3's `seed`; the lab's seeds are sessions' random_seed: the same numbers, not the same draws).
Its score is the suite's `final_ma` definition: the mean return of the last 100 training episodes
(SB3's Monitor ep_info_buffer; the lab: total_reward_ma of the last train row).

--out is a JSON file written (atomically) after each training: run the command again and it
trains only the row-seeds not in it yet, so a stopped tier loses at most the training under way.
It cannot stand for anything else: a file of another suite, of capped runs (--max-frame) where
full ones are asked for, or holding a row's runs shorter than its budget is refused, as is a row
scored otherwise than `final_ma`. SB3 trains the env the lab trains (the row's env.name edit).

--lab RUN_DIR: the lab's benchmark of the same suite (its benchmark/scores.csv, scored `final_ma`), or
the folder its row-seeds are published in (slm-lab publish: seeds.csv);
each row is printed with both sides' mean and 95% bootstrap interval over the seeds (SB3's seeds
0..N-1, N from --seeds or the row; the lab's finished seeds; the lab's report's statistics) and
whether the intervals overlap. Frames/s are not compared here (the tier's
runs share a machine: bench/sb3_side_by_side.py is the speed comparison).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
from dataclasses import replace
from pathlib import Path

from pinning import child_result, python_child  # bench/ (not a package) is on sys.path
from side_rows import REPO_ROOT, ROWS, Row

sys.path.insert(0, str(REPO_ROOT))
from slm_lab.experiment.benchmark.stats import row_summary  # noqa: E402
from slm_lab.experiment.benchmark.suite import SuiteError, read_suite  # noqa: E402
from slm_lab.lib.io import atomic_write_text  # noqa: E402

SCORE = 'final_ma'
# rl-zoo3's settings for the lab's zoo specs at their full budgets (hyperparams/sac.yml's and
# ppo.yml's `mujoco-defaults`; learning from 10,000 steps, as the spec's training_start_step), as
# side_rows' rows for the same specs but without the short windows' edits
SB3_CONFIGS = {
    'sac_halfcheetah_zoo': replace(ROWS['sac_cheetah'], lab_edits=(),
                                   sb3_kwargs=dict(learning_starts=10_000, buffer_size=1_000_000, batch_size=256,
                                                   policy_kwargs={'net_arch': [256, 256]})),
    'ppo_hopper_zoo': ROWS['ppo_hopper'],
}
SB3_MISSING = 'stable_baselines3 is not installed in this Python: pip install -r requirements-bench.txt (bench only)'


def sb3_row(spec_name: str, env_id: str, frames: int) -> Row:
    """The SB3 config for a suite row: its spec's, on the row's env, over its frames."""
    return replace(SB3_CONFIGS[spec_name], env_id=env_id, full_frames=frames, quick_frames=frames, window_start=0)


def child(spec_name: str, env_id: str, frames: int, seed: int, cpu: int | None) -> None:
    """One SB3 training (in its own process); prints RESULT {json}."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    import torch
    torch.set_num_threads(1)
    from sb3_side_by_side import sb3_child
    result = sb3_child(sb3_row(spec_name, env_id, frames), seed, frames, eval_episodes=0)
    print('RESULT ' + json.dumps(result), flush=True)


def env_of(row) -> str:
    """The env the lab trains the row on (its `set` may name another than its env label)."""
    return row.set.get('env.name', row.env)


def train(row, seed: int, frames: int, cpu: int | None) -> dict:
    cmd = python_child(__file__, '--child', row.spec_name, env_of(row), str(frames), str(seed))
    if cpu is not None:
        cmd += ['--cpu', str(cpu)]
    r = child_result(cmd, f'SB3 on {row.id} seed {seed}')
    return {'row': row.id, 'seed': seed, 'frames': r['frames'], 'score': r['last100_return'],
            'episodes': r['episodes'], 'train_s': round(r['train_s'], 1), 'total_s': round(r['child_s'], 1)}


def read_out(path: Path) -> dict:
    if not path.exists():
        return {'runs': []}
    try:
        data = json.loads(path.read_text())
        assert isinstance(data.get('runs'), list)
        return data
    except (ValueError, AssertionError, AttributeError):
        raise SystemExit(f'error: {path} is not a results file of this script; give another --out') from None


def lab_scores(run_dir: Path, suite=None) -> dict[str, list[float]]:
    """Row id -> the lab's finished seeds' scores, from RUN_DIR/benchmark/scores.csv, or from a
    folder of published results (slm-lab publish: its seeds.csv, every seed finished; with `suite`,
    the folder must publish it, rows defined the same way)."""
    if (run_dir / 'seeds.csv').is_file() and (run_dir / 'suite.json').is_file():
        if suite is not None:
            from slm_lab.experiment.benchmark.publish import PublishError, check_same_rows, read_published
            try:
                check_same_rows(read_published(run_dir)[0], suite, run_dir, f'the suite file {suite.path}')
            except PublishError as e:
                raise SystemExit(f'error: --lab {e}') from None
        scores: dict[str, list[float]] = {}
        with (run_dir / 'seeds.csv').open() as f:
            for rec in csv.DictReader(f):
                scores.setdefault(rec['row'], []).append(float(rec['score']) if rec['score'] else math.nan)
        return scores
    path = run_dir / 'benchmark' / 'scores.csv'
    if not path.exists():
        raise SystemExit(f'error: {path} not found: --lab takes a benchmark run directory whose report was written '
                         '(slm-lab report RUN_DIR writes it) or a folder of published results (slm-lab publish)')
    scores: dict[str, list[float]] = {}
    with path.open() as f:
        for rec in csv.DictReader(f):
            if rec.get('finished') != 'True':  # a seed still training: the report leaves it out too
                continue
            value = float(rec['score']) if rec.get('score') not in (None, '') else math.nan
            scores.setdefault(rec['row'], []).append(value)
    return scores


def _interval(s: dict) -> str:
    if s['mean'] is None:
        return '-'
    if s['low'] is None:
        return f"{s['mean']:,.1f} (n={s['n']})"
    return f"{s['mean']:,.1f} [{s['low']:,.1f}, {s['high']:,.1f}] (n={s['n']})"


def overlap(sb3: dict, lab: dict) -> str:
    """'overlap', 'lab above' or 'lab below' from the two 95% intervals; '-' without both."""
    if None in (sb3['low'], sb3['high'], lab['low'], lab['high']):
        return '-'
    if lab['low'] > sb3['high']:
        return 'lab above'
    if lab['high'] < sb3['low']:
        return 'lab below'
    return 'overlap'


def short_runs(rows, runs: list[dict], cap: int | None) -> str | None:
    """Words for the stored runs of a row that trained fewer frames than the row's budget (capped
    at `cap`, the file's --max-frame): runs of another budget (the suite's row changed since);
    None when there are none."""
    for row in rows:
        frames = min(row.max_frame, cap) if cap else row.max_frame
        short = sorted(r['seed'] for r in runs
                       if r['row'] == row.id and r.get('frames') is not None and r['frames'] < frames)
        if short:
            return (f'holds SB3 runs of row {row.id} (seeds {", ".join(map(str, short))}) shorter than its '
                    f'{frames:,} frames')
    return None


def compare(rows, runs: list[dict], lab: dict[str, list[float]], seeds: int | None = None) -> list[dict]:
    """Per row, SB3's seeds 0..N-1 (N: `seeds`, else the row's) against the lab's finished seeds."""
    out = []
    for row in rows:
        sb3 = row_summary([r['score'] for r in runs if r['row'] == row.id and r['seed'] < (seeds or row.seeds)])
        ours = row_summary(lab.get(row.id, []))
        out.append({'row': row.id, 'sb3': sb3, 'lab': ours, 'verdict': overlap(sb3, ours)})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog='bench/sb3_tier.py', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('suite', nargs='?', help='a suite file (spec/benchmark/suites/*.json)')
    parser.add_argument('--out', help='the results JSON, read first and written after each training')
    parser.add_argument('--rows', help='comma-separated row ids (default: every row with an SB3 config)')
    parser.add_argument('--seeds', type=int, help="seeds 0..N-1 (default: the row's)")
    parser.add_argument('--max-frame', type=int, help='cap each row at this many frames (a quick check; recorded)')
    parser.add_argument('--cpu', type=int, help='pin each training to this core')
    parser.add_argument('--lab', help="the lab's benchmark run directory of the same suite, or the folder its seeds "
                        'are published in (slm-lab publish): compare, train nothing')
    parser.add_argument('--child', nargs=4, metavar=('SPEC_NAME', 'ENV', 'FRAMES', 'SEED'), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        spec_name, env_id, frames, seed = args.child
        child(spec_name, env_id, int(frames), int(seed), args.cpu)
        return 0
    if not args.suite or not args.out:
        parser.error('give a suite file and --out')
    try:
        suite = read_suite(args.suite)
    except SuiteError as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    rows = [r for r in suite.rows if r.spec_name in SB3_CONFIGS and r.env]
    for row in rows if not args.rows else [r for r in rows if r.id in args.rows.split(',')]:
        if set(row.set) - {'env.name'}:  # SB3 gets rl-zoo3's settings on the row's env, nothing else
            print(f"error: row {row.id} sets {', '.join(sorted(set(row.set) - {'env.name'}))}, which the SB3 side "
                  'cannot mirror: leave it out with --rows', file=sys.stderr)
            return 2
        if row.score != SCORE:  # SB3's Monitor gives the last 100 training episodes, nothing else
            print(f'error: row {row.id} is scored {row.score}, which the SB3 side cannot compute (it scores '
                  f'{SCORE}): set the row\'s "score" to "{SCORE}" or leave it out with --rows', file=sys.stderr)
            return 2
    if args.rows:
        wanted = args.rows.split(',')
        unknown = [w for w in wanted if w not in {r.id for r in rows}]
        if unknown:
            valid = ', '.join(r.id for r in rows) or 'none'
            print(f"error: --rows: {', '.join(unknown)} not a row of {args.suite} with an SB3 config; valid: {valid}",
                  file=sys.stderr)
            return 2
        rows = [r for r in rows if r.id in wanted]
    if not rows:
        print(f'error: no row of {args.suite} has an SB3 config here (spec names: {", ".join(SB3_CONFIGS)})',
              file=sys.stderr)
        return 2
    out = Path(args.out)
    data = read_out(out)
    held = (data.get('meta') or {}).get('suite_name') or Path((data.get('meta') or {}).get('suite') or '').stem
    if data['runs'] and held and held != suite.name:
        print(f"error: {out} holds SB3 runs of suite {held}, not {suite.name}: give another --out",
              file=sys.stderr)
        return 2
    if args.lab:
        if short := short_runs(rows, data['runs'], (data.get('meta') or {}).get('max_frame_cap')):
            print(f'error: {out} {short}: they cannot stand for the row', file=sys.stderr)
            return 2
        table = compare(rows, data['runs'], lab_scores(Path(args.lab), suite), args.seeds)
        print(f'# {suite.name}: score {SCORE} (mean of the last 100 training episodes), mean [95% bootstrap interval]')
        if (data.get('meta') or {}).get('max_frame_cap'):
            print(f"# SB3's runs were capped at {data['meta']['max_frame_cap']:,} frames (--max-frame), "
                  "not the rows' budgets")
        print('| row | SB3 | lab | intervals |\n|---|---|---|---|')
        for t in table:
            print(f"| {t['row']} | {_interval(t['sb3'])} | {_interval(t['lab'])} | {t['verdict']} |")
        return 0
    data.setdefault('meta', {'suite': args.suite, 'score': SCORE, 'max_frame_cap': args.max_frame})
    data['meta'].setdefault('suite_name', suite.name)
    cap = data['meta'].get('max_frame_cap')
    if cap != args.max_frame:  # its runs trained another number of frames
        held, give = (f'--max-frame {cap}', f'--max-frame {cap}') if cap else ("the rows' budgets", 'no --max-frame')
        print(f'error: {out} holds runs of {held}: give {give}, or another --out', file=sys.stderr)
        return 2
    if short := short_runs(rows, data['runs'], cap):
        print(f'error: {out} {short}: give another --out', file=sys.stderr)
        return 2
    done = {(r['row'], r['seed']) for r in data['runs']}
    import importlib.util
    if importlib.util.find_spec('stable_baselines3') is None:
        print(f'error: {SB3_MISSING}', file=sys.stderr)
        return 2
    for row in rows:
        frames = min(row.max_frame, args.max_frame) if args.max_frame else row.max_frame
        for seed in range(args.seeds or row.seeds):
            if (row.id, seed) in done:
                continue
            run = train(row, seed, frames, args.cpu)
            data['runs'].append(run)
            atomic_write_text(out, json.dumps(data, indent=1) + '\n')
            print(f"{row.id} seed {seed}: {run['frames']:,} frames, {SCORE} {run['score']:.1f} "
                  f"({run['episodes']} episodes, {run['train_s']:.0f} s)", flush=True)
    for t in compare(rows, data['runs'], {}, args.seeds):
        print(f"{t['row']}: SB3 {_interval(t['sb3'])}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
