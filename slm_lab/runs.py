"""What a run command does once its mode, data directory and spec are known to be good (lab.py
checks them without torch): build the env and an agent once to check the spec against them
(preflight), then start a new run, continue one (train@, --run-dir) or run a search. The light
front, lab.py, imports this module in one place (lab.runs)."""
from __future__ import annotations

import math
import os
import time
import warnings
from pathlib import Path

import torch

from slm_lab import resources
from slm_lab.agent import Agent
from slm_lab.agent.estimate import estimate_session
from slm_lab.agent.net.net_util import step_lr_scheduler
from slm_lab.env import Clock, agent_action_space, make_env
from slm_lab.experiment.results import complete_finished_run
from slm_lab.experiment.search import driver as search_driver
from slm_lab.experiment.search import specs as search_specs
from slm_lab.experiment.search.space import grid_points, parse_search
from slm_lab.experiment.tensorboard import require_tensorboard
from slm_lab.lib.io import is_dict_spec
from slm_lab.experiment.trial import Trial
from slm_lab.experiment.wandb_board import require_wandb
from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import ModeError, SpecError, begin_writing
from slm_lab.lib.io import write_json
from slm_lab.lib.schema import FLOAT32_MAX
from slm_lab.persistence import edits
from slm_lab.persistence import resume as resume_lib
from slm_lab.persistence.run_dir import (TS_FORMAT, RunDir, create_run_dir, lock_run, locked_to_continue,
                                         new_experiment_ts, write_specs)
from slm_lab.persistence.tmpfiles import cleanup_stale_tmp
from slm_lab.spec import check_frames_reached, load_run_spec, session_max_frame

logger = lab_logger.get_logger('slm_lab.lab')


def preflight(spec: dict, data_dir: str | os.PathLike, own_snapshots: Path | None = None) -> None:
    """Build the env and agent once, so that a spec that cannot run (e.g. an algorithm that does
    not fit the env's action space) fails before the run directory exists. Between the two, the
    memory the spec needs is estimated from the env's spaces, so a spec the machine cannot hold
    is refused before anything of its size is allocated; and the same estimate settles
    meta.snapshot_replay where the spec leaves it null (meta.snapshot_replay_auto, see
    resources.decide_snapshot_replay): `data_dir` is where the run's files go, `own_snapshots` the
    ckpt/ of a run being continued, whose snapshots the new ones replace."""
    require_tensorboard(spec['meta'])
    require_wandb(spec['meta'])
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
        needs = estimate_session(spec, obs_space, action_space)
        resources.check_memory(spec, needs)
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
    return spec['meta']['max_trial'] * len(grid_points(parse_search(spec['search'])))


def check_gpu(spec: dict) -> None:
    """Say it, once per command, when the spec asks for a GPU (agent.net.gpu true) and this machine
    has no CUDA device: the run trains on the CPU ('auto' asks for one only where there is one)."""
    if (spec['agent'].get('net') or {}).get('gpu') is True and not torch.cuda.is_available():
        logger.warning(f'agent.net.gpu is true but torch {torch.__version__} finds no CUDA device here: training on '
                       "the CPU (agent.net.gpu 'auto' uses a GPU only where there is one, without this line)")


def _try_torch_pieces(algorithm) -> None:
    """Use the loss and step the LR schedulers of a throwaway agent once: some torch arguments
    (a loss's reduction, a scheduler's step_size) are only checked when first used."""
    loss_fn = algorithm.loss_fn
    if loss_fn is not None:
        try:
            loss_fn(torch.zeros(2), torch.zeros(2))
        except (ValueError, TypeError, RuntimeError) as e:
            raise SpecError(f'agent.net.loss_spec: {type(loss_fn).__name__} fails with these arguments: {e}') from None
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


def prepare_spec(spec_file: str, spec_name: str, mode: str, overrides: list[str] | None,
                 data_dir: str | os.PathLike) -> dict:
    """Load and validate a spec and fill its run's meta (spec.load_run_spec), then preflight it
    (`data_dir`: where its run goes)."""
    spec = load_run_spec(spec_file, spec_name, mode, overrides)
    preflight(spec, data_dir)
    return spec


def start(spec: dict, mode: str, data_dir: str, on_run_dir=None) -> dict:
    """A new run (dev, train) of a spec that spec.load_run_spec loaded: preflighted, then its
    directory made under data_dir and its trial run."""
    preflight(spec, data_dir)
    spec_name = spec['name']
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
    if root.exists() and not root.is_dir():
        raise ModeError(f'--run-dir {path}: a file is there, not a directory; give the directory the run lives in '
                        '(made when absent)')
    if started:
        return resume(spec_file, spec_name, str(root), overrides, str(root.parent), force, on_run_dir,
                      label=f'--run-dir {path}')
    spec = prepare_spec(spec_file, spec_name, 'train', overrides, root)
    spec['meta']['experiment_ts'] = time.strftime(TS_FORMAT)
    new = RunDir(root, spec_name)
    return run_new(new, Trial(spec, new, 'train', trial=0), on_run_dir, fixed=True)


def resume(spec_file: str, spec_name: str, target: str, overrides: list[str] | None, data_dir: str,
           force: bool, on_run_dir=None, label: str | None = None) -> dict | None:
    """train@latest / train@<run dir>: continue a run in its own directory under the (possibly
    edited) spec. Everything is checked before the run directory is touched, under a lock so that
    no other process trains the run meanwhile. `label`: how errors name the option (train --run-dir)."""
    run_dir = resume_lib.resolve_run_dir(target, spec_name, data_dir, label=label, spec_file=spec_file)
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
    spec, old_spec = edits.continuation_spec(spec_file, spec_name, overrides, resume_lib.read_run_spec(run_dir),
                                             f'train@{target}')
    meta = spec['meta']
    made_from = resume_lib.run_spec_file(run_dir.root, spec_name)
    advice = None
    if (made_from is not None and os.path.isfile(made_from) and not resume_lib.same_file(made_from, spec_file)
            and not is_dict_spec(made_from) and not is_dict_spec(spec_file)):  # a dict's file names nothing
        made_from, given = resume_lib.shown_path(made_from), resume_lib.shown_path(spec_file)
        advice = (f'{run_dir.root} was made from {made_from}, not {given}: revert the changes, continue it with '
                  f'python run_lab.py {made_from} {spec_name} train@{run_dir.root}, or start a run of {given} with '
                  'train (--force resumes it under this file anyway)')
    diff = edits.check_edits(old_spec, spec, force, advice)
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
    trial = Trial(spec, run_dir, 'train', trial=0, resume=True)
    try:
        approximate = trial.check_resume(loaded, seconds)
        del loaded  # the trial keeps what its sessions continue from
        changes = edits.schedule_changes(old_spec, spec, frames)
        for change in changes:
            logger.warning(f'schedule change on resume: {edits.describe_schedule_change(change)}')
        removed = cleanup_stale_tmp(run_dir.root)
        if removed:
            logger.info(f'removed {len(removed)} leftover temporary file(s) of interrupted writes')
        # recorded once a session has resumed (its snapshot verified): a try that fails before is no resume
        record = {
            'when': time.strftime('%Y-%m-%dT%H:%M:%S'), 'mode': f'train@{target}',
            'frames': {str(s): f for s, f in frames.items()},
            'spec_diff': [{'key': k, 'old': o, 'new': n} for k, o, n in diff], 'forced': force,
            'schedule_changes': changes,
            'approximate': {str(s): reasons for s, reasons in approximate.items() if reasons}}
        logger.info(f'resuming {run_dir.root} at frame(s) {frames or 0} to max_frame {spec["env"]["max_frame"]}')
        write_specs(run_dir, trial)
        metrics = trial.run(run_record=record)
    finally:
        trial.release()
    logger.info(f'done: {run_dir.root}')
    return metrics


def search(spec_file: str, spec_name: str, mode: str, overrides: list[str] | None, data_dir: str, force: bool,
           ray_address: str | None, keep: int | None, on_run_dir=None):
    """search / search@latest / search@<run dir>: an experiment of meta.max_trial trials on Ray
    Tune (slm_lab.experiment.search). Everything is checked before a run directory is made or
    touched. Returns the experiment dataframe."""
    search_specs.check_installed()
    if ray_address is None:
        ray_address = os.environ.get('RAY_ADDRESS') or None
    if ray_address:
        search_specs.check_ray_address(ray_address)
    if keep is not None and keep < 0:
        raise ModeError(f'--keep {keep}: give the number of best trials whose models to keep (>= 0)')
    if mode == 'search':
        spec = prepare_spec(spec_file, spec_name, mode, overrides, data_dir)
        params = search_specs.search_params(spec)
        ts = new_experiment_ts(data_dir, spec_name)
        spec['meta']['experiment_ts'] = ts
        run_dir = RunDir.for_spec(data_dir, spec_name, ts)
        def write_search(staging, _):
            write_json(staging.spec_path(), spec)
            (staging.root / 'search').mkdir()  # what makes it a search's directory (resume.is_search_run)
        lock, run_dir = create_run_dir(run_dir, None, write=write_search, spec=spec)
        logger.info(f'run directory {run_dir.root}: search of {search_specs.total_trials(spec, params)} trial(s)')
    else:
        target = mode[len('search@'):]
        run_dir = resume_lib.resolve_run_dir(target, spec_name, data_dir, mode='search', spec_file=spec_file)
        with locked_to_continue(run_dir) as lock:
            old_spec = resume_lib.read_run_spec(run_dir)
            spec, params = search_specs.resume_spec(spec_file, spec_name, overrides, old_spec, force, mode)
            preflight(spec, run_dir.root, own_snapshots=run_dir.root / 'ckpt')
        try:
            write_json(run_dir.spec_path(), spec)
        except BaseException:
            lock.close()
            raise
        logger.info(f'continuing the search in {run_dir.root}')
    if on_run_dir is not None:
        on_run_dir(run_dir)
    try:
        df = search_driver.run_search(spec, run_dir, params, ray_address, keep)
    finally:
        lock.close()
    logger.info(f'done: {run_dir.root}')
    return df
