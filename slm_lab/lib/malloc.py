"""glibc's malloc set to keep a training step's memory for the next step.

glibc serves an allocation above its mmap threshold (which it raises as it goes, to 32 MiB at
most) with fresh pages from the kernel and gives them back at free; it also gives back the top of
its heap once more than twice that is free there. A training step allocates the same large
tensors step after step: PPO Pong's update runs its convolutions over 1,024 frames (52 MB of
activations for the first layer alone), DQN Pong's over its batches. Each step then takes every
page of them from the kernel again, zeroed, one page fault per 4 KiB: 740,000 faults in 6,144
frames of the PPO Pong zoo spec.

`keep_freed_memory` raises both limits once per process (glibc's public mallopt): allocations up
to MMAP_THRESHOLD come from the heap, and up to TRIM_THRESHOLD of free heap stays with the
process for the next step. The numbers a run computes do not change, only where its memory comes
from; the process's peak memory is the same (the kept memory is what the step used). Arrays larger
than MMAP_THRESHOLD (a large replay) are still mapped on their own, so their pages are only
committed as they are written. Measured in docs/BENCHMARKS.md ("Keeping freed memory").

Off where it cannot apply (not Linux with glibc), where the user set glibc's malloc already
(MALLOC_*_ environment variables, or GLIBC_TUNABLES naming glibc.malloc), or with
SLM_LAB_MALLOC=system in the environment.
"""
from __future__ import annotations

import ctypes
import os
import sys

# mallopt's parameter numbers (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 256 << 20
TRIM_THRESHOLD = 512 << 20
OPT_OUT = 'SLM_LAB_MALLOC'  # =system: leave glibc's malloc as it is

_state: dict = {}


def user_settings() -> str | None:
    """What in the environment already sets glibc's malloc (or opts out): the first such name, or None."""
    if os.environ.get(OPT_OUT, '').strip().lower() == 'system':
        return f'{OPT_OUT}=system'
    for name in os.environ:
        if name.startswith('MALLOC_') and name.endswith('_'):
            return name
    if 'glibc.malloc.' in os.environ.get('GLIBC_TUNABLES', ''):
        return 'GLIBC_TUNABLES'
    return None


def keep_freed_memory() -> bool:
    """Set glibc's thresholds (see the module docstring), once per process. True when they are the
    lab's, now or from an earlier call."""
    if 'on' in _state:
        return _state['on']
    _state['on'] = False
    if not sys.platform.startswith('linux') or user_settings() is not None:
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc only: another libc's mallopt may take other numbers
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # both: setting either one stops glibc's own raising of the mmap threshold (the trim threshold
    # alone would leave it at its 128 KiB start and map every tensor above that afresh)
    _state['on'] = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    return _state['on']
