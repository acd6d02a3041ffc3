"""Frames per second of Atari training in ALE's own vector env against gymnasium's.

    python bench/atari_vector.py                        # 3 interleaved pairs of 4096-frame runs
    python bench/atari_vector.py --rounds 5 --frames 8192 --env-steps 500

SLM-Lab's ppo_pong (spec/benchmark/atari/atari_slm_lab_v5.json: PPO, Nature ConvNet, ALE/Pong-v5
in 16 envs, life_loss_info) is trained through run_lab.py, one session, once with
env.vector_backend "ale" and once with "gymnasium", alternating (ale, gymnasium, ale, ...) so that
a change in the machine's load falls on both. Each run's frames/s is its session's own: frames
over the wall time of its last CSV row (from the session's start to its last step; process
start-up excluded), and frames per CPU second of the whole command (every thread of it, start-up
included: on a machine shared with other work, CPU time varies far less than wall time). Before
each pair, alternating too, the env alone: the vector env that make_env builds for that spec
stepped with random actions (no agent), in env steps over all envs per second and per CPU second.

Prints one line per run and the median of each backend with their ratio.
"""
from __future__ import annotations

import argparse
import csv
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC, NAME = 'spec/benchmark/atari/atari_slm_lab_v5.json', 'ppo_pong'
BACKENDS = ('ale', 'gymnasium')


def train_fps(backend: str, frames: int, work: Path) -> tuple[float, float]:
    """Frames/s of one ppo_pong session of `frames` frames on `backend` (its last CSV row), and
    frames per CPU second of the whole command (every thread, start-up included)."""
    cwd = work / f'{backend}_{time.monotonic_ns()}'  # the run's data/ lands in the command's directory
    cwd.mkdir()
    sets = [f'env.max_frame={frames}', f'env.vector_backend={backend}', 'meta.max_session=1',
            f'meta.log_frequency={min(frames, 2048)}', f'meta.eval_frequency={frames}']
    cmd = [sys.executable, str(ROOT / 'run_lab.py'), str(ROOT / SPEC), NAME, 'train']
    for s in sets:
        cmd += ['-s', s]
    cpu = _children_cpu_s()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    cpu = _children_cpu_s() - cpu
    if proc.returncode != 0:
        sys.exit(f'{" ".join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}')
    (csv_path,) = (cwd / 'data').glob(f'*/info/{NAME}_t0_s0_session_df_train.csv')
    with open(csv_path) as f:
        last = list(csv.DictReader(f))[-1]
    return float(last['frame']) / float(last['wall_t']), float(last['frame']) / cpu


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def env_fps(backend: str, steps: int) -> tuple[float, float]:
    """Env steps (over all envs) per second of make_env's vector env for ppo_pong on `backend`,
    stepped with random actions, and per CPU second of this process (ALE's threads included)."""
    import numpy as np

    from slm_lab.env import make_env
    from slm_lab.spec import load_spec
    spec = load_spec(str(ROOT / SPEC), NAME)
    env = make_env({**spec['env'], 'vector_backend': backend})
    try:
        env.reset(seed=0)
        rng = np.random.default_rng(0)
        actions = rng.integers(0, env.single_action_space.n, size=(steps, env.num_envs))
        start, cpu = time.perf_counter(), time.process_time()
        for action in actions:
            env.step(action)
        return (steps * env.num_envs / (time.perf_counter() - start),
                steps * env.num_envs / (time.process_time() - cpu))
    finally:
        env.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rounds', type=int, default=3, help='interleaved pairs of each measurement')
    parser.add_argument('--frames', type=int, default=4096, help='frames of each training run')
    parser.add_argument('--env-steps', type=int, default=300, help='vector steps of each env-only measurement')
    parser.add_argument('--skip-train', action='store_true', help='measure the env alone only')
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    results: dict[str, dict[str, list[tuple[float, float]]]] = {what: {b: [] for b in BACKENDS}
                                                                 for what in ('train', 'env')}
    with tempfile.TemporaryDirectory(prefix='slm_atari_bench_') as work:
        for r in range(args.rounds):
            for backend in (BACKENDS if r % 2 == 0 else BACKENDS[::-1]):
                fps, per_cpu = env_fps(backend, args.env_steps)
                results['env'][backend].append((fps, per_cpu))
                print(f'round {r} env alone  {backend:9s} {fps:8.0f} steps/s  {per_cpu:8.0f} steps/CPU-s', flush=True)
            if args.skip_train:
                continue
            for backend in (BACKENDS if r % 2 == 0 else BACKENDS[::-1]):
                fps, per_cpu = train_fps(backend, args.frames, Path(work))
                results['train'][backend].append((fps, per_cpu))
                print(f'round {r} ppo_pong   {backend:9s} {fps:8.0f} frames/s {per_cpu:8.0f} frames/CPU-s', flush=True)
    for what, unit in (('env', 'env steps/s, random actions'), ('train', f'frames/s, ppo_pong {args.frames} frames')):
        if not results[what]['ale']:
            continue
        for i, per in enumerate(('s', 'CPU-s')):
            ale, gymnasium = (statistics.median(x[i] for x in results[what][b]) for b in BACKENDS)
            print(f'median {what:5s} per {per:5s}: ale {ale:.0f}, gymnasium {gymnasium:.0f} ({unit}); '
                  f'ale / gymnasium = {ale / gymnasium:.2f}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
