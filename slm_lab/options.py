"""The rules a run's options follow together (mode, --force, --fork, --frame, --warm-start, --ckpt,
--ray-address, --keep, --run-dir), in one place for the command line (cli.parse_run_args, which turns a
refusal into its one `error:` line) and the Python API (slm_lab.run, which raises it): each
mistake gets the same message from both. Imports nothing heavy: the command line checks its
arguments before the lab is imported."""
from __future__ import annotations

import os
from typing import Any

from slm_lab.lib.errors import ModeError


def _is_path(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike))


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_benchmark_mode(mode: Any) -> bool:
    """benchmark, benchmark@latest, benchmark@<dir>: the modes that take a suite file."""
    return isinstance(mode, str) and (mode == 'benchmark' or (mode.startswith('benchmark@') and len(mode) > 10))


def check_run_options(mode: Any, *, force: Any = False, fork: Any = None, frame: Any = None,
                      warm_start: Any = None, ckpt: Any = None, ray_address: Any = None, keep: Any = None,
                      run_dir: Any = None, rows: Any = None, seeds: Any = None,
                      missing_from: Any = None) -> None:
    """ModeError naming the first option that is of the wrong type, or that does not go with the
    mode or the other options; the message is the command line's (its options' spelling)."""
    if not isinstance(mode, str):
        raise ModeError(f'unknown mode {mode!r}; give the mode as a string: dev, train, train@latest, '
                        'train@<run dir>, search, search@latest, search@<run dir>')
    if not isinstance(force, bool):
        raise ModeError(f'--force {force!r}: give True or False')
    if ray_address is not None and not isinstance(ray_address, str):
        raise ModeError(f'--ray-address {ray_address!r}: give the address of a Ray cluster as a string, HOST:PORT')
    if keep is not None and not (_is_count(keep) and keep >= 0):
        raise ModeError(f'--keep {keep!r}: give the number of best trials whose models to keep (an int >= 0)')
    for option, value in (('--fork', fork), ('--warm-start', warm_start), ('--run-dir', run_dir)):
        if value is not None and not _is_path(value):
            raise ModeError(f'{option} {value!r}: give the path of a run directory')
    if missing_from is not None and not _is_path(missing_from):
        raise ModeError(f'--missing-from {missing_from!r}: give the path of a folder of published results '
                        '(slm-lab publish --to FOLDER)')
    if frame is not None and not (_is_count(frame) and frame >= 0):
        raise ModeError(f'--frame {frame!r}: give the frame of a snapshot (an int >= 0)')
    if ckpt is not None and ckpt not in ('best', 'latest'):
        raise ModeError(f'--ckpt {ckpt!r}: use best or latest')
    if rows is not None and not (isinstance(rows, (list, tuple)) and rows and all(isinstance(r, str) and r
                                                                               for r in rows)):
        raise ModeError(f'--rows {rows!r}: give row ids (or env / algorithm labels) of the suite, e.g. '
                        'ppo_acrobot,sac_pendulum')
    if seeds is not None and not (_is_count(seeds) and seeds >= 1):
        raise ModeError(f'--seeds {seeds!r}: give the number of seeds per row (an int >= 1)')
    if is_benchmark_mode(mode):
        if mode != 'benchmark' and (rows is not None or seeds is not None or missing_from is not None):
            raise ModeError(f'--rows, --seeds and --missing-from choose the row-seeds of a new benchmark; {mode} '
                            'continues the ones it was started with: drop them')
        for option, value in (('--keep', keep), ('--fork', fork), ('--warm-start', warm_start),
                              ('--run-dir', run_dir), ('--frame', frame), ('--ckpt', ckpt)):
            if value is not None:
                raise ModeError(f'{option} does not apply to {mode}, which runs a suite file\'s rows')
        if force:
            raise ModeError(f'--force does not apply to {mode}: a benchmark continues with the specs it saved')
        return
    if mode.startswith('benchmark'):
        raise ModeError(f"unknown mode '{mode}'; a suite file runs with benchmark, benchmark@latest or "
                        'benchmark@<benchmark dir>')
    for option, value in (('--rows', rows), ('--seeds', seeds), ('--missing-from', missing_from)):
        if value is not None:
            raise ModeError(f'{option} only applies to benchmark mode (SUITE_FILE benchmark), not to {mode!r}')
    if not mode.startswith('search'):
        for option, value in (('--ray-address', ray_address), ('--keep', keep)):
            if value is not None:
                also = ' (and benchmark)' if option == '--ray-address' else ''
                raise ModeError(f'{option} only applies to search and search@ modes{also}, not to {mode!r}')
    if fork is not None or warm_start is not None:
        option = '--fork' if fork is not None else '--warm-start'
        if fork is not None and warm_start is not None:
            raise ModeError('--fork and --warm-start: give one (a fork continues the parent\'s training from a '
                            'snapshot; a warm start begins a new run from its weights)')
        if mode != 'train':
            raise ModeError(f"{option} makes a new train run: use mode train, not {mode!r}")
        if force:
            raise ModeError(f'--force applies to train@ only: {option} takes any spec the saved weights fit')
    if run_dir is not None:
        if mode != 'train':
            raise ModeError(f"--run-dir names a train run's directory (started there, or continued when it exists): "
                            f'use mode train, not {mode!r}')
        if fork is not None or warm_start is not None:
            raise ModeError('--run-dir and --fork / --warm-start: a new run from a trained one gets its own directory '
                            'under data/; give one of them')
    if frame is not None and fork is None:
        raise ModeError('--frame picks the snapshot a fork continues from: use it with --fork RUN_DIR')
