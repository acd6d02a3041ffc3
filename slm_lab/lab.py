"""The lab's entry: parse a mode, load and check the spec, create the run directory, run."""
from __future__ import annotations

import logging
import os
import secrets
import shutil
from pathlib import Path

from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import DataDirError, ModeError, ResumeError, begin_writing, defer_stops
from slm_lab.lib.io import rename_no_replace, write_json
from slm_lab.lib.version import __version__, git_sha
from slm_lab.persistence.run_dir import RunDir, lock_run, new_experiment_ts
from slm_lab.persistence.tmpfiles import pid_is_stale
from slm_lab.spec import check_spec_name, load_spec

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


def load_run_spec(spec_file: str, spec_name: str, mode: str, overrides: list[str] | None) -> dict:
    """Load and validate a spec for a run in `mode`, and fill the run's meta (seed, versions)."""
    spec = load_spec(spec_file, spec_name, overrides)
    meta = spec['meta']
    if meta['random_seed'] is None:
        meta['random_seed'] = secrets.randbelow(2**31 - 10**7)
    meta['lab_version'] = __version__
    meta['git_sha'] = git_sha()
    meta['mode'] = mode
    if mode == 'dev':  # dev runs one session; the saved specs say so
        meta['max_session'] = 1
    return spec


def run_new(run_dir: RunDir, trial, on_run_dir=None, write=None, what: str = '', fixed: bool = False) -> dict:
    """Create a new run directory (create_run_dir, `write` filling it; `fixed`: under exactly its
    name) and run its trial under the run's lock; `what` ends the log line that names the directory."""
    lock, run_dir = create_run_dir(run_dir, trial, write=write, fixed=fixed)
    if on_run_dir is not None:
        on_run_dir(run_dir)
    logger.info(f'run directory {run_dir.root}{what}')
    try:
        metrics = trial.run()
    finally:
        lock.close()
    logger.info(f'done: {run_dir.root}')
    return metrics


def create_run_dir(run_dir: RunDir, trial, write=None, spec: dict | None = None, fixed: bool = False):
    """Create the run directory with its specs in place, atomically: it is built under a
    temporary name (`.{name}.tmp-{pid}`) and renamed, so a kill at any instant leaves either no
    run or a run with its specs (a kill's leftover is removed by the next run of the lab).
    Returns (the open lock file that keeps other processes off the run while it trains, the run
    directory). Two runs started in the same second pick the same name: the rename never
    replaces what is there, and the run that comes second takes the next free second's name,
    its directory written again with meta.experiment_ts of `spec` (default: the trial's) and
    the trial's run directory changed to match. A `fixed` name (`--run-dir`, chosen by the user)
    is never changed: an empty directory there is taken, and one that another process filled
    meanwhile is a ResumeError. A stop signal while it is built removes it on the way out; once it
    is renamed into place, the trial (or search) that it is made for stops as on any stop,
    resumably."""
    begin_writing()
    spec = trial.spec if spec is None else spec
    parent = run_dir.root.parent
    if parent.is_dir():
        for leftover in parent.glob('.*.tmp-*'):
            pid = leftover.name.rsplit('-', 1)[1]
            if leftover.is_dir() and pid.isdigit() and pid_is_stale(int(pid)):
                shutil.rmtree(leftover, ignore_errors=True)
    if fixed:
        try:
            run_dir.root.rmdir()  # an empty directory made for the run (a job script's mkdir -p): taken
        except OSError:
            pass  # none there, or not empty: the rename below tells
    while True:
        staging = RunDir(parent / f'.{run_dir.root.name}.tmp-{os.getpid()}', run_dir.spec_name)
        lock = None
        try:  # a stop signal may come while the staging directory is made: it goes with it
            staging.create()
            lock = lock_run(staging)  # the lock is on the file, which the rename keeps
            (write or write_specs)(staging, trial)
            defer_stops()
            placed = rename_no_replace(staging.root, run_dir.root)
        except BaseException:
            if lock is not None:
                lock.close()
            shutil.rmtree(staging.root, ignore_errors=True)
            raise
        if placed:
            return lock, run_dir
        lock.close()
        shutil.rmtree(staging.root, ignore_errors=True)
        if fixed:
            raise ResumeError(f'--run-dir {run_dir.root}: another process started a run there at the same time; '
                              'run the command again to continue that run (once it is not being trained)')
        taken = run_dir.root.name
        spec['meta']['experiment_ts'] = new_experiment_ts(str(parent), run_dir.spec_name,
                                                          after=spec['meta']['experiment_ts'])
        run_dir = RunDir.for_spec(str(parent), run_dir.spec_name, spec['meta']['experiment_ts'])
        if trial is not None:
            trial.rename_run_dir(run_dir)
        logger.info(f'{taken} was taken by a run started at the same time: this run is {run_dir.root.name}')


def write_specs(run_dir, trial) -> None:
    """The resolved specs of the run, the trial and each session."""
    write_json(run_dir.spec_path(), trial.spec)
    write_json(run_dir.spec_path(trial.index), trial.session_spec(None))
    for s in range(trial.max_session):
        write_json(run_dir.spec_path(trial.index, s), trial.session_spec(s))


