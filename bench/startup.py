"""What a command costs before it trains: time to a user error's line, and to the first step.

    python bench/startup.py               # 5 runs of each, medians
    python bench/startup.py --runs 9

Each run is a fresh `python run_lab.py ...` process (interpreter start included) in a temporary
working directory, timed from just before the process starts:

  error: <case>    a command with one mistake, to its one-line error and exit (code 2), and
                   whether the process imported torch on the way
  first_step       `spec/demo.json ppo_cartpole train` to the agent's first act() (the env
                   reset, the run directory and the frame-0 snapshot are done by then)
  first_update     the same command to the end of its first training update (PPO's first
                   batch of 128 x 8 frames; torch's optimizer pays its compiler import at the
                   first step of an optimizer, so this is the honest "training has begun")

The first_step and first_update runs load run_lab.py through a small driver that wraps
Agent.act / Agent.update to print the time and end the process; nothing else differs.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEMO = [str(ROOT / 'spec/demo.json'), 'ppo_cartpole', 'train']
ERRORS = {
    'spec name': [str(ROOT / 'spec/demo.json'), 'ppo_cartpol', 'train'],
    'mode': [str(ROOT / 'spec/demo.json'), 'ppo_cartpole', 'trian'],
    'env key': DEMO + ['-s', 'env.max_frme=1000'],
    'meta key': DEMO + ['-s', 'meta.max_sesion=2'],
    'agent key': DEMO + ['-s', 'agent.algorithm.gama=0.9'],
}
# runs run_lab.py as __main__ and says at exit whether torch was imported
ERROR_DRIVER = """
import atexit, runpy, sys
atexit.register(lambda: print('TORCH_IMPORTED', 'torch' in sys.modules, file=sys.stderr))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
"""
# prints the seconds since T0 at the first act() and at the first update that trained, then ends
STEP_DRIVER = """
import os, runpy, sys, time
t0 = float(os.environ['STARTUP_T0'])
from slm_lab.agent import Agent
act, update = Agent.act, Agent.update
def first_act(self, obs):
    print(f'FIRST_STEP {time.time() - t0:.3f}', flush=True)
    Agent.act = act
    return act(self, obs)
def first_update(self, *args):
    metrics = update(self, *args)
    if metrics is not None:
        print(f'FIRST_UPDATE {time.time() - t0:.3f}', flush=True)
        os._exit(0)
    return metrics
Agent.act, Agent.update = first_act, first_update
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
"""


def time_error(args: list[str], cwd: str) -> tuple[float, bool, str]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, '-c', ERROR_DRIVER, str(ROOT / 'run_lab.py'), *args], cwd=cwd,
                          capture_output=True, text=True, env={**os.environ, 'PYTHONPATH': str(ROOT)})
    seconds = time.perf_counter() - t0
    if done.returncode != 2:
        raise SystemExit(f'expected exit code 2, got {done.returncode}: {done.stderr[-2000:]}')
    lines = done.stderr.splitlines()
    return seconds, 'TORCH_IMPORTED True' in lines, next(line for line in lines if line.startswith('error:'))


def time_first_step(cwd: str) -> tuple[float, float]:
    env = {**os.environ, 'PYTHONPATH': str(ROOT), 'STARTUP_T0': repr(time.time())}
    done = subprocess.run([sys.executable, '-c', STEP_DRIVER, str(ROOT / 'run_lab.py'), *DEMO], cwd=cwd,
                          capture_output=True, text=True, env=env)
    marks = dict(line.split() for line in done.stdout.splitlines() if line.startswith('FIRST_'))
    if set(marks) != {'FIRST_STEP', 'FIRST_UPDATE'}:
        raise SystemExit(f'no first step / update (exit code {done.returncode}): {done.stderr[-2000:]}')
    return float(marks['FIRST_STEP']), float(marks['FIRST_UPDATE'])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--runs', type=int, default=5)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(f'# {time.strftime("%Y-%m-%d %H:%M")} | {os.cpu_count()} CPU cores | load average {load:.1f} at the '
          f'start | medians of {args.runs} runs')
    with tempfile.TemporaryDirectory(prefix='slm_startup_bench_') as work:
        for case, case_args in ERRORS.items():
            runs = [time_error(case_args, work) for _ in range(args.runs)]
            seconds = statistics.median(r[0] for r in runs)
            torch = 'imports torch' if any(r[1] for r in runs) else 'no torch'
            print(f'error: {case:<10} {seconds:6.2f} s  ({torch}) {runs[0][2][:70]}')
        steps = [time_first_step(work) for _ in range(args.runs)]
        print(f'first_step        {statistics.median(s for s, _ in steps):6.2f} s')
        print(f'first_update      {statistics.median(u for _, u in steps):6.2f} s')
    print(f'# load average {os.getloadavg()[0]:.1f} at the end')
    return 0


if __name__ == '__main__':
    sys.exit(main())
