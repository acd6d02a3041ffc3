"""The run directory layout: data/{spec_name}_{YYYY_MM_DD_HHMMSS}/ and the paths inside it, and the
lock that keeps a second process off a run."""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import ResumeError, begin_writing, defer_stops
from slm_lab.lib.io import read_json, rename_no_replace, write_json
from slm_lab.persistence.tmpfiles import pid_is_stale
from slm_lab.spec import check_spec_name

logger = lab_logger.get_logger('slm_lab.lab')  # a run's lines name the lab, as the mode's do

TS_FORMAT = '%Y_%m_%d_%H%M%S'
SUBDIRS = ('info', 'model', 'graph', 'log')
PRUNED_FILE = 'pruned.json'  # under a search's search/: the trials whose weights --keep removed


def is_search_run(root: Path) -> bool:
    """A search's run directory has search/ (made with the directory itself)."""
    return (root / 'search').is_dir()


def read_pruned(run_dir: RunDir) -> dict[str, list[int]]:
    """What a search's --keep did: {'removed': the trials whose model files and snapshots it
    removed, 'kept': those whose it kept} (both empty when it never ran or the file is unreadable)."""
    try:
        pruned = read_json(run_dir.root / 'search' / PRUNED_FILE)
    except (OSError, ValueError):
        pruned = None
    pruned = pruned if isinstance(pruned, dict) else {}
    return {key: [i for i in (pruned.get(key) or []) if isinstance(i, int)] for key in ('removed', 'kept')}


def new_experiment_ts(data_dir: str, spec_name: str, after: str | None = None) -> str:
    """A timestamp for a new run whose directory does not exist yet: now, or the next second
    whose name is free; with `after` (a timestamp another run took meanwhile), the first free one
    after it. The next second rather than a suffix keeps every run's name
    data/{spec_name}_{YYYY_MM_DD_HHMMSS}, which train@latest sorts by; the seconds are counted on
    the name itself, so a later name is always greater (a DST change cannot send it back)."""
    ts = time.strftime(TS_FORMAT) if after is None else next_second(after)
    while os.path.lexists(os.path.join(data_dir, f'{spec_name}_{ts}')):
        ts = next_second(ts)
    return ts


def next_second(ts: str) -> str:
    """The timestamp one second after `ts` (both in TS_FORMAT)."""
    return (datetime.strptime(ts, TS_FORMAT) + timedelta(seconds=1)).strftime(TS_FORMAT)


@dataclass(frozen=True)
class RunDir:
    """Paths of one run: `root` = data/{spec_name}_{experiment_ts}."""

    root: Path
    spec_name: str

    @classmethod
    def for_spec(cls, data_dir: str, spec_name: str, experiment_ts: str) -> 'RunDir':
        """The run directory of a new run; a spec name that is not a plain name (a path such as
        '../x') is refused, so a run never lands outside data_dir."""
        return cls(Path(data_dir) / f'{check_spec_name(spec_name)}_{experiment_ts}', spec_name)

    def create(self) -> None:
        for sub in SUBDIRS:
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def prename(self, trial: int | None = None, session: int | None = None) -> str:
        """{spec_name}, {spec_name}_t{trial} or {spec_name}_t{trial}_s{session}."""
        name = self.spec_name
        if trial is not None:
            name += f'_t{trial}'
        if session is not None:
            name += f'_s{session}'
        return name

    def spec_path(self, trial: int | None = None, session: int | None = None) -> Path:
        return self.root / f'{self.prename(trial, session)}_spec.json'

    def session_df_path(self, trial: int, session: int, df_mode: str) -> Path:
        return self.root / 'info' / f'{self.prename(trial, session)}_session_df_{df_mode}.csv'

    def session_metrics_path(self, trial: int, session: int) -> Path:
        return self.root / 'info' / f'{self.prename(trial, session)}_session_metrics.json'

    def trial_metrics_path(self, trial: int) -> Path:
        return self.root / 'info' / f'{self.prename(trial)}_trial_metrics.json'

    def model_path(self, trial: int, session: int, which: str) -> Path:
        """which: 'latest' or 'best'."""
        return self.root / 'model' / f'{self.prename(trial, session)}_model_{which}.pt'

    def graph_prefix(self, trial: int, session: int | None = None) -> str:
        return str(self.root / 'graph' / self.prename(trial, session))

    def ckpt_dir(self, trial: int, session: int) -> Path:
        """Snapshots of one session: ckpt/{prename}/f{frame}/."""
        return self.root / 'ckpt' / self.prename(trial, session)

    def tb_dir(self, trial: int, session: int | None = None) -> Path:
        """TensorBoard event files of a session, or of the trial's mean (session None): tb/{prename}/."""
        return self.root / 'tb' / self.prename(trial, session)

    def session_resume_log_path(self, trial: int, session: int) -> Path:
        """Each resume of a session: when, from which snapshot and frame, how long loading took."""
        return self.root / 'info' / f'{self.prename(trial, session)}_resumes.json'

    def wandb_path(self, trial: int, session: int) -> Path:
        """The id of a session's W&B run (meta.wandb), which train@ continues."""
        return self.root / 'info' / f'{self.prename(trial, session)}_wandb.json'

    def resume_log_path(self) -> Path:
        """Each resume of the run: when, the spec diff, whether forced."""
        return self.root / f'{self.spec_name}_resumes.json'

    def log_path(self, trial: int, session: int) -> Path:
        return self.root / 'log' / f'{self.prename(trial, session)}.log'


def lock_run(run_dir: RunDir):
    """Hold an exclusive lock on the run for as long as the returned file stays open, so two
    processes never train one run at once; ResumeError when another process holds it."""
    path = run_dir.root / '.lock'
    try:
        f = open(path, 'a')  # an empty file; the kernel drops the lock if we die
    except OSError as e:
        what = 'is a directory' if path.is_dir() else f'cannot be opened ({e.strerror})'
        raise ResumeError(f'{path} {what}; it should be the empty file the lab locks a run with: move it away '
                          'and run again') from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise ResumeError(f'{run_dir.root} is being trained by another process; wait for it to finish or '
                          'stop it first') from None
    return f


@contextlib.contextmanager
def locked_to_continue(run_dir: RunDir):
    """The run's lock (lock_run) for a command that continues it on Ray (search@, benchmark@): the
    block reads and checks the run; when it fails the lock is released at once, else it stays held
    for the run (the caller closes it when the run ends), the command may write from then on
    (begin_writing) and a stop signal ends it resumably (defer_stops: the trials stop with snapshots)."""
    lock = lock_run(run_dir)
    try:
        yield lock
        begin_writing()  # a stop signal during the checks ended the command before anything was written
        defer_stops()
    except BaseException:
        lock.close()
        raise


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
