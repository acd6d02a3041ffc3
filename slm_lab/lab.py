"""The lab's entry: parse a mode, load and check the spec, create the run directory, run."""
from __future__ import annotations

import logging
import math
import os
import secrets
import shutil
import time
import warnings
from pathlib import Path

from slm_lab import resources
from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import DataDirError, ModeError, ResumeError, SpecError, begin_writing, defer_stops
from slm_lab.lib.io import rename_no_replace, write_json
from slm_lab.lib.schema import FLOAT32_MAX
from slm_lab.lib.version import __version__, git_sha
from slm_lab.persistence import edits
from slm_lab.persistence.run_dir import TS_FORMAT, RunDir, lock_run, new_experiment_ts
from slm_lab.persistence.tmpfiles import cleanup_stale_tmp, pid_is_stale
from slm_lab.spec import check_frames_reached, check_spec_name, load_spec, session_max_frame

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


def preflight(spec: dict, data_dir: str | os.PathLike, own_snapshots: Path | None = None) -> None:
    """Build the env and agent once, so that a spec that cannot run (e.g. an algorithm that does
    not fit the env's action space) fails before the run directory exists. Between the two, the
    memory the spec needs is estimated from the env's spaces, so a spec the machine cannot hold
    is refused before anything of its size is allocated; and the same estimate settles
    meta.snapshot_replay where the spec leaves it null (meta.snapshot_replay_auto, see
    resources.decide_snapshot_replay): `data_dir` is where the run's files go, `own_snapshots` the
    ckpt/ of a run being continued, whose snapshots the new ones replace."""
    # the boards' packages (tensorboard, wandb), found without importing them
    from slm_lab.experiment.tensorboard import require_tensorboard  # noqa: PLC0415 (finds the boards' packages without importing them; kept out of start-up with the rest)
    from slm_lab.experiment.wandb_board import require_wandb  # noqa: PLC0415 (as above)
    require_tensorboard(spec['meta'])
    require_wandb(spec['meta'])
    from slm_lab.agent import Agent  # noqa: PLC0415 imports torch: kept out of start-up, so a bad mode or spec fails fast
    from slm_lab.env import Clock, agent_action_space, make_env  # noqa: PLC0415 (imports gymnasium: kept out of start-up (as Agent above))
    check_gpu(spec)
    try:
        env = make_env({**spec['env'], 'num_envs': 1, 'vectorization_mode': 'sync'})
    except Exception as e:  # whatever gym.make raises for these arguments is a spec problem
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ''
        kwargs = spec['env'].get('make_kwargs') or {}
        where = f'env.make_kwargs: {kwargs} do not fit' if kwargs else 'env.name:'
        raise SpecError(f"{where} '{spec['env']['name']}' cannot be made ({type(e).__name__}: {first})") from None
    try:
        obs_space, action_space = env.single_observation_space, agent_action_space(env)
        needs = resources.estimate_session(spec, obs_space, action_space)
        resources.check_memory(spec, obs_space, action_space, needs=needs)
        reclaimable = resources.bytes_under(own_snapshots) if own_snapshots is not None else 0
        spec['meta']['snapshot_replay_auto'] = resources.decide_snapshot_replay(
            spec, needs, data_dir, trials=_trials_on_disk(spec), reclaimable=reclaimable)
        agent = Agent(spec, obs_space, action_space, spec['env']['num_envs'],
                      Clock(spec['env']['max_frame'], spec['env']['num_envs']), seed=0)
    finally:
        env.close()
    _try_torch_pieces(agent.algorithm)


def _trials_on_disk(spec: dict) -> int:
    """The trials whose snapshots a run keeps on disk together: every trial of a search (its
    --keep prunes them only at its end), else one."""
    if not str(spec['meta'].get('mode')).startswith('search') or not spec.get('search'):
        return 1
    from slm_lab.experiment.search_space import grid_points, parse_search  # noqa: PLC0415 only a search needs it
    return spec['meta']['max_trial'] * len(grid_points(parse_search(spec['search'])))


def check_gpu(spec: dict) -> None:
    """Say it, once per command, when the spec asks for a GPU (agent.net.gpu true) and this machine
    has no CUDA device: the run trains on the CPU ('auto' asks for one only where there is one)."""
    import torch  # noqa: PLC0415 kept out of start-up (see preflight)
    if (spec['agent'].get('net') or {}).get('gpu') is True and not torch.cuda.is_available():
        logger.warning(f'agent.net.gpu is true but torch {torch.__version__} finds no CUDA device here: training on '
                       "the CPU (agent.net.gpu 'auto' uses a GPU only where there is one, without this line)")


def _try_torch_pieces(algorithm) -> None:
    """Use the loss and step the LR schedulers of a throwaway agent once: some torch arguments
    (a loss's reduction, a scheduler's step_size) are only checked when first used."""
    import torch  # noqa: PLC0415 kept out of start-up (see preflight)
    loss_fn = algorithm.loss_fn
    if loss_fn is not None:
        try:
            loss_fn(torch.zeros(2), torch.zeros(2))
        except (ValueError, TypeError, RuntimeError) as e:
            raise SpecError(f'agent.net.loss_spec: {type(loss_fn).__name__} fails with these arguments: {e}') from None
    from slm_lab.agent.net.net_util import step_lr_scheduler  # noqa: PLC0415 imports torch (see preflight)
    clock = algorithm.clock
    for sched in algorithm.lr_schedulers.values():
        # as at the first update (a step_size of 0 fails there), then where the run goes: a
        # negative step_size makes StepLR's rate grow past what float32 holds as frames pass
        for frame in (clock.num_envs, clock.max_frame // 2, clock.max_frame):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter('ignore')  # stepping a scheduler before its optimizer
                    step_lr_scheduler(sched, frame)
            except (ValueError, TypeError, ZeroDivisionError, IndexError) as e:
                raise SpecError(f'agent.net.lr_scheduler_spec: {type(sched).__name__} fails with these arguments: '
                                f'{e}') from None
            except OverflowError:
                bad = [math.inf]
            else:
                bad = [lr for lr in sched.get_last_lr() if not 0 <= lr <= FLOAT32_MAX]
            if bad:
                raise SpecError(f'agent.net.lr_scheduler_spec: {type(sched).__name__} takes the learning rate to '
                                f'{bad[0]:.3g} at frame {frame}; its arguments must keep it between 0 and '
                                f'{FLOAT32_MAX:.3g} (a step_size, T_max or total_iters >= 1)')


def prepare_spec(spec_file: str, spec_name: str, mode: str, overrides: list[str] | None,
                 data_dir: str | os.PathLike) -> dict:
    """Load, validate and preflight a spec (`data_dir`: where its run goes), and fill the run's
    meta (seed, versions)."""
    spec = load_spec(spec_file, spec_name, overrides)
    meta = spec['meta']
    if meta['random_seed'] is None:
        meta['random_seed'] = secrets.randbelow(2**31 - 10**7)
    meta['lab_version'] = __version__
    meta['git_sha'] = git_sha()
    meta['mode'] = mode
    if mode == 'dev':  # dev runs one session; the saved specs say so
        meta['max_session'] = 1
    preflight(spec, data_dir)
    return spec


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
        return train_in(spec_file, spec_name, run_dir, overrides, force, on_run_dir)
    if mode.startswith('train@'):
        return resume(spec_file, spec_name, mode[len('train@'):], overrides, data_dir, force, on_run_dir)
    if mode == 'search' or mode.startswith('search@'):
        return search(spec_file, spec_name, mode, overrides, data_dir, force, ray_address, keep, on_run_dir)
    spec = prepare_spec(spec_file, spec_name, mode, overrides, data_dir)
    from slm_lab.experiment.trial import Trial  # noqa: PLC0415 imports torch (see preflight)
    ts = new_experiment_ts(data_dir, spec_name)
    spec['meta']['experiment_ts'] = ts
    run_dir = RunDir.for_spec(data_dir, spec_name, ts)
    return run_new(run_dir, Trial(spec, run_dir, mode, trial=0), on_run_dir)


def train_in(spec_file: str, spec_name: str, path: str, overrides: list[str] | None, force: bool,
             on_run_dir=None) -> dict | None:
    """`train --run-dir PATH`, one command for a job that a scheduler may start again at any time:
    a new run in PATH when PATH does not exist (or is an empty directory), else PATH's run continued
    as train@PATH does (from each session's newest intact snapshot; at once None, exit 0, when it
    is already finished). The same command thus starts, continues and completes the run."""
    root = Path(path.rstrip('/') or '/')
    try:
        started = root.is_dir() and any(root.iterdir())
    except OSError as e:
        raise ModeError(f'--run-dir {path}: cannot be read ({e.strerror}); give a directory the lab may create '
                        'or a run directory') from None
    if started or (root.exists() and not root.is_dir()):
        return resume(spec_file, spec_name, str(root), overrides, str(root.parent), force, on_run_dir)
    spec = prepare_spec(spec_file, spec_name, 'train', overrides, root)
    from slm_lab.experiment.trial import Trial  # noqa: PLC0415 imports torch (see preflight)
    spec['meta']['experiment_ts'] = time.strftime(TS_FORMAT)
    new = RunDir(root, spec_name)
    return run_new(new, Trial(spec, new, 'train', trial=0), on_run_dir, fixed=True)


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


def resume(spec_file: str, spec_name: str, target: str, overrides: list[str] | None, data_dir: str,
           force: bool, on_run_dir=None) -> dict | None:
    """train@latest / train@<run dir>: continue a run in its own directory under the (possibly
    edited) spec. Everything is checked before the run directory is touched, under a lock so that
    no other process trains the run meanwhile."""
    from slm_lab.persistence import resume as resume_lib  # noqa: PLC0415 imports torch (see preflight)
    run_dir = resume_lib.resolve_run_dir(target, spec_name, data_dir)
    if on_run_dir is not None:
        on_run_dir(run_dir)
    lock = lock_run(run_dir)
    try:
        return _resume_locked(spec_file, spec_name, target, overrides, force, run_dir)
    finally:
        lock.close()


def _resume_locked(spec_file, spec_name, target, overrides, force, run_dir) -> dict | None:
    """The resume itself, under the run's lock. Each session's snapshot is read once: the checks
    load it into a session built from the spec, and a trial of one session continues with that
    very session (experiment/trial.py)."""
    # all three import torch (see preflight)
    from slm_lab.experiment.results import complete_finished_run  # noqa: PLC0415 (imports torch (see preflight))
    from slm_lab.experiment.trial import Trial  # noqa: PLC0415 (imports torch (see preflight))
    from slm_lab.persistence import resume as resume_lib  # noqa: PLC0415 (imports torch (see preflight))
    spec, old_spec = edits.continuation_spec(spec_file, spec_name, overrides, resume_lib.read_run_spec(run_dir),
                                             f'train@{target}')
    meta = spec['meta']
    diff = edits.check_edits(old_spec, spec, force)
    resume_lib.check_resume_logs(run_dir, max(old_spec['meta']['max_session'], meta['max_session']))
    # every session's newest intact snapshot, loaded now: nothing is written before all of them
    # (and the whole state of each) are known to load
    seconds: dict[int, float] = {}
    loaded = resume_lib.load_sessions(run_dir, old_spec['meta']['max_session'], seconds)
    frames = {s: snapshot.frame for s, snapshot in loaded.items()}
    reached = max(frames.values()) if frames else 0
    n_sessions = spec['meta']['max_session']
    check_frames_reached(spec, reached, run_dir.root)
    share = session_max_frame(spec)  # each session's frames (a distributed trial's share of env.max_frame)
    total = reached * n_sessions if spec['meta'].get('distributed') and n_sessions > 1 else reached
    begin_writing()  # a stop signal during the checks ended the command before anything was written
    # nothing stands where the lab writes; log/, info/, ... deleted by hand are the lab's own: made again
    resume_lib.restore_layout(run_dir, max(n_sessions, old_spec['meta']['max_session']),
                              tensorboard=meta['tensorboard'] or old_spec['meta'].get('tensorboard', True))
    if frames and len(frames) >= n_sessions and all(f >= share for f in frames.values()):
        written = complete_finished_run(old_spec, run_dir)
        done = f'; completed its missing final files: {", ".join(written)}' if written else ''
        print(f'{run_dir.root} is already finished at frame {reached} (env.max_frame {spec["env"]["max_frame"]})'
              f'{done}; to continue, raise it, e.g. -s env.max_frame={2 * total}')
        return None
    preflight(spec, run_dir.root, own_snapshots=run_dir.root / 'ckpt')
    record = {}
    # recorded once a session has resumed (its snapshot verified): a try that fails before is no resume
    trial = Trial(spec, run_dir, 'train', trial=0, resume=True,
                  on_resumed=lambda: resume_lib.append_run_record(run_dir, record))
    try:
        approximate = trial.check_resume(loaded, seconds)
        del loaded  # the trial keeps what its sessions continue from
        changes = edits.schedule_changes(old_spec, spec, frames)
        for change in changes:
            logger.warning(f'schedule change on resume: {edits.describe_schedule_change(change)}')
        removed = cleanup_stale_tmp(run_dir.root)
        if removed:
            logger.info(f'removed {len(removed)} leftover temporary file(s) of interrupted writes')
        record.update({
            'when': time.strftime('%Y-%m-%dT%H:%M:%S'), 'mode': f'train@{target}',
            'frames': {str(s): f for s, f in frames.items()},
            'spec_diff': [{'key': k, 'old': o, 'new': n} for k, o, n in diff], 'forced': force,
            'schedule_changes': changes,
            'approximate': {str(s): reasons for s, reasons in approximate.items() if reasons}})
        logger.info(f'resuming {run_dir.root} at frame(s) {frames or 0} to max_frame {spec["env"]["max_frame"]}')
        write_specs(run_dir, trial)
        metrics = trial.run()
    finally:
        trial.release()
    logger.info(f'done: {run_dir.root}')
    return metrics


def search(spec_file: str, spec_name: str, mode: str, overrides: list[str] | None, data_dir: str, force: bool,
           ray_address: str | None, keep: int | None, on_run_dir=None):
    """search / search@latest / search@<run dir>: an experiment of meta.max_trial trials on Ray
    Tune (slm_lab.experiment.search). Everything is checked before a run directory is made or
    touched. Returns the experiment dataframe."""
    from slm_lab.experiment import search as search_lib  # noqa: PLC0415 pandas and plotly: only a search needs them
    from slm_lab.persistence import resume as resume_lib  # noqa: PLC0415 imports torch (see preflight)
    search_lib.check_installed()
    if ray_address is None:
        ray_address = os.environ.get('RAY_ADDRESS') or None
    if ray_address:
        search_lib.check_ray_address(ray_address)
    if keep is not None and keep < 0:
        raise ModeError(f'--keep {keep}: give the number of best trials whose models to keep (>= 0)')
    if mode == 'search':
        spec = prepare_spec(spec_file, spec_name, mode, overrides, data_dir)
        params = search_lib.search_params(spec)
        ts = new_experiment_ts(data_dir, spec_name)
        spec['meta']['experiment_ts'] = ts
        run_dir = RunDir.for_spec(data_dir, spec_name, ts)
        def write_search(staging, _):
            write_json(staging.spec_path(), spec)
            (staging.root / 'search').mkdir()  # what makes it a search's directory (resume.is_search_run)
        lock, run_dir = create_run_dir(run_dir, None, write=write_search, spec=spec)
        logger.info(f'run directory {run_dir.root}: search of {search_lib.total_trials(spec, params)} trial(s)')
    else:
        target = mode[len('search@'):]
        run_dir = resume_lib.resolve_run_dir(target, spec_name, data_dir, mode='search')
        lock = lock_run(run_dir)
        try:
            old_spec = resume_lib.read_run_spec(run_dir)
            spec, params = search_lib.resume_spec(spec_file, spec_name, overrides, old_spec, force, mode)
            preflight(spec, run_dir.root, own_snapshots=run_dir.root / 'ckpt')
            begin_writing()  # a stop signal during the checks ended the command before anything was written
            write_json(run_dir.spec_path(), spec)
            defer_stops()  # the search stops resumably (run_search)
        except BaseException:
            lock.close()
            raise
        logger.info(f'continuing the search in {run_dir.root}')
    if on_run_dir is not None:
        on_run_dir(run_dir)
    try:
        df = search_lib.run_search(spec, run_dir, params, ray_address, keep)
    finally:
        lock.close()
    logger.info(f'done: {run_dir.root}')
    return df
