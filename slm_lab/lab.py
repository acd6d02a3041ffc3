"""The lab's entry: parse a mode, load and check the spec, create the run directory, run."""
from __future__ import annotations

import logging
import os
from pathlib import Path

from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import DataDirError, ModeError
from slm_lab.spec import check_spec_name, load_run_spec

logger = lab_logger.get_logger('slm_lab.lab')
MODES = ('dev', 'train', 'search')
DATA_DIR = 'data'


def check_mode(mode: str) -> str:
    """The mode, or a ModeError naming the valid ones."""
    if not isinstance(mode, str):
        raise ModeError(f'unknown mode {mode!r}; give the mode as a string: dev, train, train@latest, '
                        'train@<run dir>, search, search@latest, search@<run dir>')
    if mode.startswith('benchmark'):
        raise ModeError(f"mode '{mode}' runs a suite file, not a spec: python run_lab.py SUITE_FILE {mode} "
                        "(slm_lab.benchmark from Python)")
    if mode in MODES or (mode.startswith(('train@', 'enjoy@')) and len(mode) > len('train@')) \
            or (mode.startswith('search@') and len(mode) > len('search@')):
        return mode
    raise ModeError(f"unknown mode '{mode}'; valid modes: dev, train, train@latest, train@<run dir>, "
                    'enjoy@<run dir>/<spec_name>_t0_s0_spec.json, search, search@latest, search@<run dir>')


def check_data_dir(data_dir: str | os.PathLike, new_run: bool = True) -> str:
    """The data directory as a string, once it is known to be able to hold a new run directory
    (`new_run`; else only that it is a path): it (or, when missing, its nearest existing parent,
    where it will be made) is a directory the lab can create a directory in. DataDirError naming
    it otherwise, before anything is built."""
    if not isinstance(data_dir, (str, os.PathLike)):
        raise DataDirError(f'data_dir {data_dir!r}: give the path of a directory (a string), where run directories '
                           'are made')
    path = os.fspath(data_dir)
    if not new_run:
        return path
    existing = os.path.abspath(path)
    while not os.path.lexists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    fix = ('move it away or use another data directory (slm_lab.run\'s data_dir; the command line makes runs in '
           './data: run it from another directory)')
    if not os.path.isdir(existing):
        what = 'is' if existing == os.path.abspath(path) else f'is under {existing}, which is'
        raise DataDirError(f'data directory {path} {what} not a directory, so no run directory can be made in it; '
                           f'{fix}')
    # a real try, for what permissions do not tell (root in /proc, a read-only mount); its name is
    # that of a run being created, so that a kill's leftover is removed as theirs are (create_run_dir)
    probe = os.path.join(existing, f'.data_dir_check.tmp-{os.getpid()}')
    try:
        os.mkdir(probe)
    except FileExistsError:  # this process's own, left by an earlier call
        return path
    except OSError as e:
        where = '' if existing == os.path.abspath(path) else f' (in {existing}, where it would be made)'
        raise DataDirError(f'data directory {path}: cannot make a run directory there{where}: {e.strerror or e}; '
                           f'{fix}') from None
    os.rmdir(probe)
    return path


def run(spec_file: str, spec_name: str, mode: str = 'train', overrides: list[str] | None = None,
        data_dir: str = DATA_DIR, force: bool = False, ray_address: str | None = None,
        keep: int | None = None, on_run_dir=None, run_dir: str | None = None) -> dict | None:
    """Run a spec in a mode; returns the trial metrics (None when a resumed run was already
    finished). Raises LabError for user errors, before anything is written. `on_run_dir`, if
    given, is called with the run's RunDir once it is known (the Python API returns it).
    `run_dir` (mode train): the run's own directory, chosen by the user: see `train_in`."""
    mode = check_mode(mode)
    check_spec_name(spec_name)  # before train@ looks for data/{spec_name}_* or a run is made
    if run_dir is not None and mode != 'train':
        raise ModeError(f"--run-dir {run_dir}: it names a train run's directory (started there, or continued when "
                        f"it exists); use mode train, not '{mode}'")
    if run_dir is None:
        data_dir = check_data_dir(data_dir, new_run=not mode.startswith(('train@', 'search@')))
    else:  # where the run's directory is made, or found
        check_data_dir(str(Path(run_dir.rstrip('/') or '/').parent), new_run=True)
    lab_logger.setup_console(logging.DEBUG if mode == 'dev' else logging.INFO)
    if run_dir is not None:
        return runs().train_in(spec_file, spec_name, run_dir, overrides, force, on_run_dir)
    if mode.startswith('train@'):
        return runs().resume(spec_file, spec_name, mode[len('train@'):], overrides, data_dir, force, on_run_dir)
    if mode == 'search' or mode.startswith('search@'):
        return runs().search(spec_file, spec_name, mode, overrides, data_dir, force, ray_address, keep, on_run_dir)
    spec = load_run_spec(spec_file, spec_name, mode, overrides)  # a spec's mistakes are told before torch loads
    return runs().start(spec, mode, data_dir, on_run_dir)


def runs():
    """slm_lab.runs, the half of the run command that builds envs and agents (torch, gymnasium,
    pandas): imported once the mode, the data directory and the spec are known to be good, so a
    typo is told in a fraction of a second (test_cli: test_a_typo_fails_without_importing_torch)."""
    from slm_lab import runs as runs_module  # noqa: PLC0415 the heavy half: only after the checks above
    return runs_module
