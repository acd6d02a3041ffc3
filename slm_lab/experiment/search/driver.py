"""Running a search on Ray Tune: the ASHA scheduler, Ray started (or joined) and shut down, each
trial's resources, the stop signals, and the experiment's records when it ends (experiment_df,
graphs, --keep)."""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from slm_lab.experiment import viz
from slm_lab.experiment.search.specs import total_trials
from slm_lab.experiment.search.study import METRIC, TIME_ATTR, open_study, trial_finished, trial_reports, values_of
from slm_lab.experiment.search.processes import DriverSpare
from slm_lab.experiment.search.tune import make_searcher, make_trainable, request_stop
from slm_lab.experiment.search.watch import SearchWatch, make_callback
from slm_lab.experiment.search.ray_head import RayHead, driver_on_loopback
from slm_lab.experiment.search.reaper import MARKER_VAR, sweep
from slm_lab.experiment.search.space import LOG_SPACES, Param
from slm_lab.experiment.signals import StopSignal, keep_stop_handlers
from slm_lab.lib import logger as lab_logger
from slm_lab.lib.cores import NICE_VAR, usable_cores
from slm_lab.lib.errors import Preempted
from slm_lab.lib.io import atomic_write_text, write_json
from slm_lab.persistence.run_dir import PRUNED_FILE, RunDir, read_pruned
from slm_lab.persistence.tmpfiles import cleanup_stale_tmp
from slm_lab.spec import session_max_frame

logger = lab_logger.get_logger('slm_lab.search')
REPO_ROOT = Path(__file__).resolve().parents[3]
_OWN_TOKEN: str | None = None  # the RAY_AUTH_TOKEN this process made for its own local Ray


def make_scheduler(spec: dict):
    """ASHA on frames from meta.search_scheduler, or None without one. A grace_period longer than a
    trial's sessions run (a search shortened with -s env.max_frame) could stop no trial, and Ray
    refuses it: then every trial runs to its end, with a warning."""
    from ray.tune.schedulers import AsyncHyperBandScheduler  # noqa: PLC0415 the search extra, found by check_installed
    options = spec['meta'].get('search_scheduler')
    if not options:
        return None
    frames = session_max_frame(spec)
    if options['grace_period'] > frames:
        lab_logger.warn_once('slm_lab.search', f"meta.search_scheduler.grace_period {options['grace_period']} is "
                             f'more than the {frames} frames a session of each trial runs, so no trial can be '
                             'stopped early: every trial runs to its end (lower grace_period to stop the weak ones)')
        return None
    return AsyncHyperBandScheduler(time_attr=TIME_ATTR, max_t=frames, **options)


def run_search(spec: dict, run_dir: RunDir, params: list[Param], ray_address: str | None = None,
               keep: int | None = None) -> 'pd.DataFrame':
    """Run (or continue) the search in run_dir; returns the experiment dataframe. A stop signal at
    any instant (before Ray is up, while it starts, with trials running) raises Preempted once
    the running trials have saved snapshots and Ray is gone; search@ continues the search."""
    study = ended_study(spec, run_dir, params)
    if study is None:
        study = run_on_ray(run_dir, ray_address, lambda stop: run_trials(spec, run_dir, params, ray_address, stop))
    return write_experiment(spec, run_dir, params, study, keep)


def ended_study(spec: dict, run_dir: RunDir, params: list[Param]):
    """The study of a continued search whose every trial ended before this command (completed,
    stopped early by ASHA, or failed): nothing is left to run, so no Ray is started (it takes
    seconds) for search@ to write the experiment's records again. None otherwise."""
    total = total_trials(spec, params)
    if not (run_dir.root / 'search' / 'optuna.journal').exists():
        return None  # a new search
    study = open_study(run_dir)
    trials = study.get_trials(deepcopy=False)
    if len(trials) < total or not all(t.state.is_finished() for t in trials[:total]):
        return None
    logger.info(f'all {total} trials ended before (kept): nothing to run')
    return study


def run_on_ray(run_dir: RunDir, ray_address: str | None, fit):
    """`fit(stop)` with this process connected to Ray (the cluster at ray_address, or a local Ray of
    its own), the stop signals the lab's from the first instant: what fit returns. The engine of
    search and benchmark mode, whose trials run as search/trial.py processes of run_dir. A stop
    signal at any instant raises Preempted once the running trials have saved snapshots and Ray
    is gone."""
    shutil.rmtree(run_dir.root / 'search' / 'stop', ignore_errors=True)  # of the previous run in run_dir
    stop = _SearchStop(run_dir).install()  # first: a stop reaches every trial, even one not started yet
    try:
        ray_environment(ray_address)
        with ray_cluster(run_dir, ray_address, stop) as connected:
            result = fit(stop) if connected else None
        if stop.requested:
            where = 'with the running trials saved in snapshots' if connected else 'before its trials started'
            raise Preempted(stop.signum, None, where)
        return result
    finally:
        stop.uninstall()


def ray_environment(ray_address: str | None) -> None:
    """The environment of the search's Ray, set before Ray is imported, which reads it once (a local
    Ray's processes and the trials inherit it): a local Ray of this process only, with token
    authentication whose token lives in the environment rather than in ~/.ray (a token the user
    exported is theirs: the lab uses it and never sweeps by it); the lab on PYTHONPATH."""
    global _OWN_TOKEN
    if not ray_address and hasattr(os, 'nice'):  # the local Ray's processes and trials keep this process's nice
        os.environ[NICE_VAR] = str(os.nice(0))    # (lib/cores.py); a user's cluster is left as it runs
    else:
        os.environ.pop(NICE_VAR, None)
    if not ray_address and 'RAY_AUTH_TOKEN' not in os.environ:
        os.environ.setdefault('RAY_AUTH_MODE', 'token')
        os.environ['RAY_AUTH_TOKEN'] = _OWN_TOKEN = secrets.token_hex(32)
    os.environ['PYTHONPATH'] = os.pathsep.join(
        [str(REPO_ROOT)] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p])
    os.environ.setdefault('RAY_DEDUP_LOGS', '0')
    os.environ['TUNE_DISABLE_SIGINT_HANDLER'] = '1'  # Ctrl-C is the lab's: _SearchStop
    os.environ['RAY_AIR_NEW_OUTPUT'] = '0'
    # Tune warns on the console ("The `on_step_begin` operation took 0.5 s, which may be a performance
    # bottleneck") whenever its loop waits half a second: it does on a machine the trials themselves
    # load, or a niced benchmark beside other work; not the lab's line, nothing to act on. A
    # threshold the user exported stays theirs.
    os.environ.setdefault('TUNE_WARN_THRESHOLD_S', '3600')


@contextlib.contextmanager
def ray_cluster(run_dir: RunDir, ray_address: str | None, stop: StopSignal):
    """This process connected to Ray: the cluster at ray_address, or a local Ray of this search's
    own (its head in a session of its own: ray_head.py), started while this process imports
    Ray and Tune. Yields False when a stop signal came before Ray was up (the search does not wait
    for it). On the way out: disconnected, and a local Ray stopped with nothing of it left."""
    temp_dir = reaper = spare = head = None
    connected = False
    loopback = contextlib.ExitStack()
    try:
        if not ray_address:
            previous = run_dir.root / 'search' / 'ray_temp'
            if previous.exists():  # the session files of a run of this search that was killed
                keep_ray_logs(previous.read_text().strip(), run_dir)
            temp_dir = ray_temp_dir(run_dir)
            atomic_write_text(previous, temp_dir)
            reaper, marker = start_reaper()
            spare = DriverSpare.start(Path(temp_dir) / 'spare')  # the first trial's process imports while Ray starts
            head = RayHead.start(temp_dir, usable_cores(), run_dir.root / 'search' / 'ray_head.log')
        # SIGINT and SIGTERM stay the lab's (_SearchStop). Ray's C++ crash handler would take SIGTERM
        # first and abort this process 3 s later (absl's alarm): a stop with trials running can take
        # longer. Read as Ray is imported; the local Ray's own processes, started before, keep theirs.
        os.environ.setdefault('RAY_DISABLE_FAILURE_SIGNAL_HANDLER', '1')
        import ray  # noqa: PLC0415 the search extra, found by check_installed
        address = ray_address or head.address(stopping=lambda: stop.requested)
        if address is not None and not stop.requested:
            with keep_stop_handlers():  # ray.init sets a handler by which SIGTERM exits at once (code 15)
                if not ray_address:  # the local Ray listens on loopback only (ray_head.py)
                    loopback.enter_context(driver_on_loopback())
                ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level='WARNING',
                         configure_logging=True)
            connected = True
        yield connected
    finally:
        if connected:
            ray.shutdown()
        loopback.close()
        if spare is not None:
            spare.close()
        if head is not None:
            head.stop()
        if reaper is not None:
            sweep(marker, _OWN_TOKEN)  # whatever of the local Ray outlived its head
            os.environ.pop(MARKER_VAR, None)
            reaper.kill()
            reaper.wait()
        if temp_dir is not None:
            keep_ray_logs(temp_dir, run_dir)
            (run_dir.root / 'search' / 'ray_temp').unlink(missing_ok=True)


def run_trials(spec: dict, run_dir: RunDir, params: list[Param], ray_address: str | None, stop: StopSignal):
    """The trials on Ray Tune, until they are done or a stop signal has stopped them; the study."""
    meta = spec['meta']
    searcher = make_searcher(run_dir, spec, params, stopping=lambda: stop.requested)
    watch = SearchWatch(total_trials(spec, params), session_max_frame(spec), meta['log_frequency'],
                        stopping=lambda: stop.requested, finished=lambda index: trial_finished(run_dir, index))
    tune_trials(run_dir, searcher, watch, num_samples=total_trials(spec, params),
                resources=trial_resources(meta, local=not ray_address), scheduler=make_scheduler(spec),
                max_session=meta['max_session'], max_frame=session_max_frame(spec))
    return searcher.study


def tune_trials(run_dir: RunDir, searcher, watch: SearchWatch, num_samples: int, resources, scheduler=None,
                max_session: int = 1, max_frame: int = 0) -> None:
    """`num_samples` trials of run_dir on Ray Tune, in the order `searcher` gives them, each in a
    search/trial.py process of its own (tune.make_trainable); `resources`: what each trial reserves,
    a dict or a function of the trial's config; `max_session`, `max_frame`: each trial's, unless
    its config names its own."""
    from ray import tune  # noqa: PLC0415 the search extra, found by check_installed
    trainable = tune.with_parameters(make_trainable(), run_root=str(run_dir.root.resolve()),
                                     spec_name=run_dir.spec_name, max_session=max_session, max_frame=max_frame)
    tuner = tune.Tuner(
        tune.with_resources(trainable, resources),
        tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler, metric=METRIC, mode='max',
                                    num_samples=num_samples, reuse_actors=True),
        run_config=tune.RunConfig(name='tune', storage_path=str((run_dir.root / 'search').resolve()),
                                  verbose=0, log_to_file=True, callbacks=[make_callback(watch)]))
    tuner.fit()


def trial_resources(meta: dict, local: bool) -> dict:
    """meta.search_resources (default one CPU, no GPU). On this machine, a trial asking for more
    CPUs than it has gets all of them, and GPUs only when torch sees one (as SLM-Lab does), with a
    warning each: Ray would otherwise wait for them forever."""
    asked = meta.get('search_resources') or {}
    cpu, gpu = asked.get('cpu', 1), asked.get('gpu', 0)
    if local:
        cores = usable_cores()
        if cpu > cores:
            logger.warning(f'meta.search_resources.cpu {cpu} is more than the {cores} CPU cores this process may '
                           f'use; each trial reserves {cores}')
            cpu = cores
        if gpu:
            import torch  # noqa: PLC0415 kept out of the search driver, which does not otherwise need it
            if not torch.cuda.is_available():
                logger.warning(f'meta.search_resources.gpu {gpu}: no GPU here; the trials run on the CPU')
                gpu = 0
    return {'cpu': cpu, 'gpu': gpu}


def start_reaper() -> tuple[subprocess.Popen, str]:
    """The watchdog (reaper.py) that kills the local Ray's processes if this process dies;
    they are marked through the environment they inherit from here."""
    marker = secrets.token_hex(8)
    env = {k: v for k, v in os.environ.items() if k not in (MARKER_VAR, 'RAY_AUTH_TOKEN')}
    if _OWN_TOKEN:
        env['SLM_LAB_REAPER_TOKEN'] = _OWN_TOKEN  # not on its command line, which any user can read
    reaper = subprocess.Popen([sys.executable, '-m', 'slm_lab.experiment.search.reaper', marker, str(os.getpid())],
                              env=env, start_new_session=True, stdin=subprocess.DEVNULL)
    os.environ[MARKER_VAR] = marker
    return reaper, marker


def ray_temp_dir(run_dir: RunDir) -> str:
    """Ray's session files (logs, sockets) inside the run directory; a Unix socket path has at
    most 107 bytes, so a deep run directory gets a short directory under /tmp instead (named in
    the log)."""
    path = (run_dir.root / 'search' / 'ray').resolve()
    if len(str(path)) > 40:
        short = tempfile.mkdtemp(prefix='slm_ray_')
        logger.info(f"Ray's session files: {short} (the run directory's path is too long for Ray's sockets)")
        return short
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def keep_ray_logs(temp_dir: str, run_dir: RunDir) -> None:
    """Ray's session logs into search/ray/ of the run directory when they had to live elsewhere
    (a short directory under /tmp, see ray_temp_dir), and that directory removed."""
    dest = (run_dir.root / 'search' / 'ray').resolve()
    if not Path(temp_dir).is_dir() or Path(temp_dir).resolve() == dest:
        return
    for session in Path(temp_dir).glob('session_2*'):
        logs = session / 'logs'
        if logs.is_dir():
            shutil.move(str(logs), str(dest / session.name / 'logs'))
    shutil.rmtree(temp_dir, ignore_errors=True)


class _SearchStop(StopSignal):
    """SIGTERM / SIGINT during a search, from its first instant (a second one exits at once, as
    StopSignal): the stop file tells every running trial's process to stop with a snapshot, on any
    node, and is there for a trial that would start later; the searcher starts no new trial. A stop
    deferred while the run directory was made (errors.defer_stops) is taken up at install."""

    def __init__(self, run_dir: RunDir):
        super().__init__()
        self.run_dir = run_dir
        self._file_written = False

    def install(self) -> '_SearchStop':
        super().install()
        _ = self.requested  # writes the stop file for a deferred stop
        return self

    def _handle(self, signum, frame):
        super()._handle(signum, frame)
        self._write_stop_file()

    def _write_stop_file(self) -> None:
        try:
            request_stop(self.run_dir, signum=self.signum)
            self._file_written = True
        except OSError:  # in a signal handler: not into the code it interrupted; tried again at `requested`
            pass

    @property
    def requested(self) -> bool:
        asked = super().requested
        if asked and not self._file_written:
            self._write_stop_file()
        return asked


# ---------------------------------------------------------------------------------------------
# the experiment's records

def write_experiment(spec: dict, run_dir: RunDir, params: list[Param], study, keep: int | None):
    """info/{name}_experiment_df.csv (one row per trial) and the experiment graphs."""
    rows = []
    max_frame = session_max_frame(spec)  # each session's frames (a distributed trial's share)
    for ot in study.get_trials(deepcopy=False):
        i = ot.number
        row = {'trial': i, **{p.path: json.dumps(v) if isinstance(v, (list, dict)) else v
                              for p, v in zip(params, values_of(ot, params).values())}}
        reports = trial_reports(run_dir, i, spec['meta']['max_session'])
        stopped_at = ot.user_attrs.get('last_frame')
        stopped = ot.state.name == 'COMPLETE' and stopped_at is not None and stopped_at < max_frame
        if stopped:  # the trial's records end where ASHA stopped it (its process may have gone a little further)
            reports = [r for r in reports if r[TIME_ATTR] <= stopped_at]
        row['frame'] = reports[-1][TIME_ATTR] if reports else 0
        row[METRIC] = reports[-1][METRIC] if reports else float('nan')
        scalar = {}
        if stopped:
            row['status'] = 'stopped early (ASHA)'
        elif ot.state.name == 'FAIL':
            row['status'] = 'error'
        elif trial_finished(run_dir, i):
            scalar = json.loads(run_dir.trial_metrics_path(i).read_text()).get('scalar', {})
            row['status'] = 'completed'
        else:
            row['status'] = 'not finished'
        for key in ('final_return_ma', 'strength', 'max_strength', 'sample_efficiency', 'training_efficiency',
                    'stability', 'consistency'):
            row[key] = scalar.get(key, float('nan'))
        rows.append(row)
    df = pd.DataFrame(rows)
    atomic_write_text(run_dir.root / 'info' / f'{spec["name"]}_experiment_df.csv', df.to_csv(index=False))
    if keep is not None:
        prune_models(run_dir, df, keep)
    try:
        viz.plot_experiment(df, [p.path for p in params], str(run_dir.root / 'graph' / spec['name']),
                            log_keys={p.path for p in params if p.space in LOG_SPACES})
    except Exception as e:  # a graph must not lose the search's results
        logger.warning(f'experiment graphs not drawn: {type(e).__name__}: {e}')
    best = df.sort_values(METRIC, ascending=False).head(1)
    if len(best):
        b = best.iloc[0]
        logger.info(f'search done: {len(df)} trials; best trial {int(b["trial"])} with {METRIC} {b[METRIC]:.2f}: '
                    + ', '.join(f'{p.path}={b[p.path]}' for p in params))
    return df


def prune_models(run_dir: RunDir, df, keep: int) -> None:
    """--keep N: delete the model files and the session snapshots (ckpt/) of all trials but the N
    best (by final total_reward_ma). Every trial has ended by then (a search that stopped early
    writes no records and prunes nothing), so no snapshot is needed to continue one; the records
    (info/, graph/, log/) and the trials' specs stay."""

    cleanup_stale_tmp(run_dir.root / 'model')  # a trial killed mid-write left its temporary file
    order = [int(i) for i in df.sort_values(METRIC, ascending=False, na_position='last')['trial'].tolist()]
    files = {i: list((run_dir.root / 'model').glob(f'{run_dir.prename(i)}_*'))
             + list((run_dir.root / 'ckpt').glob(f'{run_dir.prename(i)}_s*')) for i in order[keep:]}
    removed = sorted(i for i, paths in files.items() if paths)
    gone = set(removed) | set(read_pruned(run_dir)['removed'])  # with an earlier --keep's
    kept = sorted(i for i in order[:keep] if i not in gone)
    # recorded before anything goes: --warm-start refuses a removed trial by it, naming --keep
    write_json(run_dir.root / 'search' / PRUNED_FILE, {'keep': keep, 'kept': kept, 'removed': sorted(gone)})
    for path in (path for paths in files.values() for path in paths):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if removed:
        logger.info(f'--keep {keep}: removed the model files and snapshots of trial(s) '
                    f'{", ".join(map(str, removed))}; kept those of trial(s) {", ".join(map(str, kept)) or "none"}')
