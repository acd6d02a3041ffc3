"""One thread on one core, as the timing scripts under bench/ run: `--cpu N` and what it does."""
from __future__ import annotations

import argparse
import os


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
