"""One thread on one core, as the timing scripts under bench/ run: `--cpu N` and what it does."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def add_cpu_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--cpu', type=int, help='pin this process to one CPU core')


def pin(cpu: int | None) -> str:
    """Pin this process to core `cpu` (None: leave it) and limit torch to one thread; returns the
    words a script's header prints about it."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    import torch  # noqa: PLC0415 (after pinning: torch's thread pools start on the chosen core)
    torch.set_num_threads(1)
    return f'torch {torch.__version__} | one thread' + (f' | core {cpu}' if cpu is not None else '')


def child_result(cmd: list[str], what: str) -> dict:
    """Run a bench script's child process (`cmd`, from the repo root, OMP and MKL at one thread)
    and return the JSON of its last `RESULT {...}` line, or exit with `what` failed and the
    child's last lines. The wall seconds of the whole child are in the result as `child_s`."""
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1'}
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO_ROOT)
    elapsed = time.perf_counter() - start
    lines = [line for line in proc.stdout.splitlines() if line.startswith('RESULT ')]
    if proc.returncode != 0 or not lines:
        tail = '\n'.join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise SystemExit(f'error: {what} failed (exit {proc.returncode}):\n{tail}')
    return {**json.loads(lines[-1][len('RESULT '):]), 'child_s': elapsed}


def python_child(script: str, *args: str) -> list[str]:
    """The command of a bench script run as a child by this Python."""
    return [sys.executable, str(Path(script).resolve()), *args]
