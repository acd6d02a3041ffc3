"""glibc's malloc set to keep a training step's memory for the next step.

glibc serves an allocation above its mmap threshold (which it raises as it goes, to 32 MiB at
most) with fresh pages from the kernel and gives them back at free; it also gives back the top of
its heap once more than twice that is free there. A training step allocates the same large
tensors step after step: PPO Pong's update runs its convolutions over 1,024 frames (52 MB of
activations for the first layer alone), DQN Pong's over its batches. Each step then takes every
page of them from the kernel again, zeroed, one page fault per 4 KiB: 740,000 faults in 6,144
frames of the PPO Pong zoo spec.

`keep_freed_memory` raises both limits once per process (glibc's public mallopt): allocations up
to MMAP_THRESHOLD come from the heap, and freed heap memory stays with the process for the next
step (glibc gives the top of its heap back only when more than TRIM_THRESHOLD is free there, and
never a gap below it). The numbers a run computes do not change, only where its memory comes from.
The peak memory of the runs measured did not change, but a one-off peak (a snapshot written, an
evaluation) now stays resident afterwards. Arrays larger than MMAP_THRESHOLD (a large replay) are
still mapped on their own, so their pages are only committed as they are written. Measured in
docs/BENCHMARKS.md ("Keeping freed memory").

Off where it cannot apply (not Linux with glibc), where the user set these thresholds already
(MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_, MALLOC_MMAP_MAX_, or the same
in GLIBC_TUNABLES), or with SLM_LAB_MALLOC=system in the environment.
"""
from __future__ import annotations

import ctypes
import os
import sys

from slm_lab.lib import logger as lab_logger

# mallopt's parameter numbers (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 256 << 20
OLD_GLIBC_MMAP_THRESHOLD = 32 << 20  # the most glibc releases before 2.35 accept (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 512 << 20
OPT_OUT = 'SLM_LAB_MALLOC'  # =system: leave glibc's malloc as it is
# the environment's settings of the same thresholds, which the user's choice keeps
USER_VARIABLES = ('MALLOC_MMAP_THRESHOLD_', 'MALLOC_TRIM_THRESHOLD_', 'MALLOC_TOP_PAD_', 'MALLOC_MMAP_MAX_')
USER_TUNABLES = ('glibc.malloc.mmap_threshold', 'glibc.malloc.trim_threshold', 'glibc.malloc.top_pad',
                 'glibc.malloc.mmap_max')

_state: dict = {}  # 'on': bool, 'mmap_threshold': the threshold set (bytes), once set


def user_settings() -> str | None:
    """What in the environment already sets these thresholds of glibc's malloc (or opts out): the
    first such name, or None. Other malloc settings (MALLOC_ARENA_MAX, MALLOC_PERTURB_, ...) do
    not conflict with the lab's."""
    if os.environ.get(OPT_OUT, '').strip().lower() == 'system':
        return f'{OPT_OUT}=system'
    for name in USER_VARIABLES:
        if name in os.environ:
            return name
    tunables = os.environ.get('GLIBC_TUNABLES', '')
    if any(t in tunables for t in USER_TUNABLES):
        return 'GLIBC_TUNABLES'
    return None


def keep_freed_memory() -> bool:
    """Set glibc's thresholds (see the module docstring), once per process. True when they are the
    lab's, now or from an earlier call."""
    if 'on' in _state:
        return _state['on']
    _state['on'] = False
    value = os.environ.get(OPT_OUT, '').strip()
    if value and value.lower() != 'system':
        lab_logger.warn_once('slm_lab.session', f"{OPT_OUT}={value}: only 'system' is read (it leaves glibc's "
                             "malloc as it is); the lab's malloc settings apply")
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
    # alone would leave it at its 128 KiB start and map every tensor above that afresh); an older
    # glibc refuses a threshold above 32 MiB, which still keeps the tensors up to that size
    for threshold in (MMAP_THRESHOLD, OLD_GLIBC_MMAP_THRESHOLD):
        if mallopt(M_MMAP_THRESHOLD, threshold) == 1:
            _state['mmap_threshold'] = threshold
            _state['on'] = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
            break
    return _state['on']
