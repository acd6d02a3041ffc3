"""search mode: an experiment of trials on Ray Tune, values drawn by Optuna, early stopping by ASHA.

The run directory is the whole state of a search, so a search resumes the way a run does:

  {name}_spec.json                    the spec with its search block
  {name}_t{i}_spec.json               trial i's spec: the values it drew set in place
  info/, model/, ckpt/, log/, graph/  the trials' sessions, as train writes them (prefix _t{i})
  search/optuna.journal               the Optuna study: every trial's draw and outcome
  search/tune/                        Ray Tune's own files (results, trial logs)
  info/{name}_experiment_df.csv       one row per trial: values, metrics, status

Each trial runs as a child process of its Ray worker (`python -m slm_lab.experiment.search_trial`),
so it is an ordinary Trial with its signal handling and snapshots; the Ray trainable reports the
rows of the trial's train CSVs to Tune (frame, total_reward_ma) as they appear. Optuna draws trial
i with a sampler seeded from (meta.random_seed, i) given the trials before it, so a resumed search
draws what an uninterrupted one would have; on resume the finished trials are replayed to Tune from
their CSVs (ASHA sees the same history) and the unfinished ones continue from their snapshots.
"""
from __future__ import annotations

import csv
import json
import math
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from slm_lab.experiment.search_space import Param, grid_points, parse_search
from slm_lab.experiment.signals import StopSignal
from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import LabError, SpecError
from slm_lab.lib.io import atomic_write_text, write_json
from slm_lab.persistence import edits
from slm_lab.persistence.run_dir import RunDir
from slm_lab.persistence.tmpfiles import cleanup_stale_tmp
from slm_lab.spec import session_max_frame

logger = lab_logger.get_logger('slm_lab.search')
METRIC, TIME_ATTR = 'total_reward_ma', 'frame'
REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL = 'pip install -r requirements-search.txt  (or: pip install ".[search]")'
STUDY = 'search'


def check_installed() -> None:
    """Ray Tune and Optuna are the search extra; a one-line error names its install command."""
    import importlib.util
    missing = [name for name in ('ray', 'optuna') if importlib.util.find_spec(name) is None]
    if missing:
        raise SpecError(f'search mode needs {" and ".join(missing)} (the search extra), which is not installed; '
                        f'install it with: {INSTALL}')


# ---------------------------------------------------------------------------------------------
# the spaces, the trials' specs

# keys SLM-Lab's experimental search blocks (lunar_pg.json, mountain_car.json) still search, from
# versions before v4, which neither SLM-Lab v4 nor v5 reads: searched there, they changed nothing
UNREAD_SEARCH_KEYS = {
    'agent.algorithm.clip_eps': "SLM-Lab's old name of clip_eps_spec",
    'agent.algorithm.entropy_coef': "SLM-Lab's old name of entropy_coef_spec",
    'agent.net.lr_decay_frequency': "SLM-Lab's old learning-rate decay key (lr_scheduler_spec since v4)",
    'agent.net.lr_anneal_timestep': "SLM-Lab's old learning-rate annealing key (lr_scheduler_spec since v4)",
}


def search_params(spec: dict) -> list[Param]:
    """The searched keys of a validated spec, each value they can take checked against the spec."""
    if spec.get('search') is None:
        raise SpecError(f"search: spec '{spec['name']}' has no search block, so search mode has nothing to draw; "
                        'add one (e.g. "search": {"agent.algorithm.gamma__uniform": [0.9, 0.999]}) or use train')
    params = []
    unread = dict(UNREAD_SEARCH_KEYS)
    searched = parse_search(spec['search'])
    net = spec['agent'].get('net') or {}
    if net.get('type') == 'RecurrentNet':  # SLM-Lab's recurrent specs search it
        unread['agent.net.hid_layers'] = "MLPNet's layers key, which a RecurrentNet has not (its dense layers are " \
                                         'fc_hid_layers)'
    if net.get('shared') or net.get('use_same_optim'):  # SLM-Lab's a3c_cartpole.json searches it on shared nets
        why = 'shared: true (one optimizer, from actor_optim_spec)' if net.get('shared') else \
            "use_same_optim: true (the critic's optimizer is made from actor_optim_spec)"
        unread.update({p.path: f"the critic's optimizer key, unused by a net with {why}" for p in searched
                       if p.path.startswith('agent.net.critic_optim_spec.')})
    for p in searched:
        if p.path in unread:
            lab_logger.warn_once('slm_lab.search', f'search.{p.key}: {p.path} is {unread[p.path]}, which SLM-Lab v4 and v5 do not read '
                       'either (searching it changed nothing there); this search leaves it out')
        else:
            params.append(p)
    for p in params:
        # a value is refused when it fits neither the spec as it is nor with any one other searched
        # key at one of its extremes: a start_step searched beside its end_step may pass the spec's
        # end_step (SLM-Lab's pendulum.json does); a trial that draws a pair that does not fit fails
        # alone, with its line in the search's log
        others = [{}] + [{q.path: v} for q in params if q is not p for v in q.extremes()]
        for value in p.extremes():
            error = None
            for other in others:
                try:
                    trial_spec(spec, {**other, p.path: value}, 0)
                    error = None
                    break
                except SpecError as e:
                    error = error or e
            if error is not None:
                raise SpecError(f'search.{p.key}: the value {json.dumps(value)} does not fit the spec: {error}')
    return params


def trial_spec(spec: dict, values: dict, index: int) -> dict:
    """Trial `index`'s spec: the search spec without its search block, `values` ({path: value})
    set, validated."""
    import copy

    from slm_lab.spec import RUNTIME_META, set_by_path, validate_spec
    raw = copy.deepcopy(spec)
    raw.pop('search', None)
    name = raw.pop('name')
    kept = {k: raw['meta'].pop(k) for k in list(raw['meta']) if k in RUNTIME_META}
    for path, value in values.items():
        set_by_path(raw, path, copy.deepcopy(value))
    out = validate_spec(raw, name)
    out['name'] = name
    out['meta'].update(kept)
    out['meta']['trial'] = index
    return out


def write_trial_specs(run_dir: RunDir, spec: dict, values: dict, index: int) -> None:
    """{name}_t{i}_spec.json and its sessions' specs, as train writes them (kept when a resumed
    search finds them: they hold what the trial drew)."""
    from slm_lab.experiment.trial import Trial  # imports torch: the search driver does not otherwise
    if run_dir.spec_path(index).exists():
        return
    trial = Trial(trial_spec(spec, values, index), run_dir, 'train', trial=index)
    for s in range(trial.max_session):
        write_json(run_dir.spec_path(index, s), trial.session_spec(s))
    write_json(run_dir.spec_path(index), trial.session_spec(None))  # last: its presence means all are there


def total_trials(spec: dict, params: list[Param]) -> int:
    """max_trial trials per grid point (Ray Tune's num_samples with grid_search)."""
    return spec['meta']['max_trial'] * len(grid_points(params))


SEARCH_EDITS = ('meta.max_trial', 'meta.log_frequency', 'meta.eval_frequency', 'meta.checkpoint_frequency',
                'meta.keep_checkpoints', 'meta.torch_num_threads')


def resume_spec(spec_file: str, spec_name: str, overrides: list[str] | None, old_spec: dict, force: bool,
                mode: str) -> tuple[dict, list[Param]]:
    """The spec a resumed search continues under: the spec file (with the search's own -s
    overrides, then these), keys it leaves out taken from the search's saved spec. Edits other
    than SEARCH_EDITS are refused with the list of them (unless force); max_trial cannot drop."""
    from slm_lab.lib.errors import ResumeError
    from slm_lab.spec import diff_specs
    spec, old_spec = edits.continuation_spec(spec_file, spec_name, overrides, old_spec, mode)
    meta = spec['meta']
    diff = [d for d in diff_specs(old_spec, spec) if not d[0].startswith(edits.IGNORED) and d[0] != 'name']
    if meta['random_seed'] != old_spec['meta']['random_seed']:
        diff.append(('meta.random_seed', old_spec['meta']['random_seed'], meta['random_seed']))
    if meta['max_trial'] < old_spec['meta']['max_trial']:
        raise ResumeError(f"meta.max_trial: {old_spec['meta']['max_trial']} -> {meta['max_trial']}: a search "
                          f"cannot lose trials; use meta.max_trial >= {old_spec['meta']['max_trial']}")
    bad = [d for d in diff if d[0] not in SEARCH_EDITS]
    if bad and not force:
        changes = '; '.join(f'{k}: {o!r} -> {n!r}' for k, o, n in bad)
        raise ResumeError(f"the spec changed in ways that break the search's continuity: {changes}; revert them "
                          f'(a search resumes with more trials, meta.max_trial, or other frequencies), or pass '
                          '--force to resume anyway')
    return spec, search_params(spec)


def check_ray_address(address: str) -> None:
    """A --ray-address (or RAY_ADDRESS) must answer before anything is written."""
    import socket
    if address == 'auto':
        return
    hostport = address.split('://', 1)[-1]
    host, _, port = hostport.rpartition(':')
    if not host or not port.isdigit():
        raise LabError(f'--ray-address {address}: expected HOST:PORT of a Ray head node (e.g. 127.0.0.1:6379), '
                       'or auto')
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as e:
        raise LabError(f'--ray-address {address}: no Ray cluster answers there ({type(e).__name__}: {e}); start '
                       'one (ray start --head) or leave --ray-address out to run on this machine') from None


# ---------------------------------------------------------------------------------------------
# Optuna: the draws, reproducible per trial

def open_study(run_dir: RunDir):
    """The search's Optuna study in search/optuna.journal. A write cut off by a kill leaves a last
    line without its newline, which the next append would join into an unreadable line: it is cut
    away first (every journal operation the lab makes is one line, see draw)."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    path = run_dir.root / 'search' / 'optuna.journal'
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        data = path.read_bytes()
        if data and not data.endswith(b'\n'):
            with open(path, 'r+b') as f:
                f.truncate(data.rfind(b'\n') + 1)
    storage = JournalStorage(JournalFileBackend(str(path)))
    return optuna.create_study(study_name=STUDY, storage=storage, direction='maximize', load_if_exists=True)


def draw(study, params: list[Param], seed: int, number: int, grid: dict):
    """Trial `number`'s values, drawn by a TPE sampler seeded from (seed, number) on an in-memory
    copy of the finished trials, then written to the study as one journal line (a kill cannot
    leave a trial with half its values). The draw depends only on the seed, the number and the
    trials finished before it."""
    import optuna
    from optuna.trial import TrialState, create_trial
    scratch = optuna.create_study(direction='maximize',
                                  sampler=optuna.samplers.TPESampler(seed=(seed * 7919 + number) % 2**32))
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)):
        scratch.add_trial(t)
    distributions = {p.path: p.distribution() for p in params if not p.is_grid}
    drawn = scratch.ask(distributions)
    study.add_trial(create_trial(state=TrialState.RUNNING, params=drawn.params, distributions=distributions,
                                 user_attrs={'grid': grid}))
    (trial,) = [t for t in study.get_trials(deepcopy=False) if t.number == number]
    return trial


def values_of(trial, params: list[Param]) -> dict:
    """{path: spec value} of an Optuna trial (grid values from its user attrs)."""
    grid = trial.user_attrs.get('grid') or {}
    return {p.path: (grid[p.path] if p.is_grid else p.value(trial.params[p.path])) for p in params}


# ---------------------------------------------------------------------------------------------
# the trials' records

def read_rows(path: Path) -> list[dict]:
    """Rows of a session's train CSV (frame and total_reward_ma as numbers); [] if absent."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    rows = []
    for row in csv.DictReader(text.splitlines()):
        try:
            rows.append({'frame': int(float(row['frame'])), METRIC: float(row[METRIC] or 'nan')})
        except (KeyError, ValueError):
            continue
    return rows


def trial_reports(run_dir: RunDir, index: int, max_session: int) -> list[dict]:
    """The reports of trial `index` so far: at each log frame every session reached, the mean of
    the sessions' total_reward_ma (NaN ones left out)."""
    per = [{r['frame']: r[METRIC] for r in read_rows(run_dir.session_df_path(index, s, 'train'))}
           for s in range(max_session)]
    frames = sorted(set.intersection(*(set(p) for p in per))) if per else []
    out = []
    for f in frames:
        vals = [p[f] for p in per if not math.isnan(p[f])]
        out.append({TIME_ATTR: f, METRIC: sum(vals) / len(vals) if vals else float('nan')})
    return out


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None


def trial_finished(run_dir: RunDir, index: int) -> bool:
    return run_dir.trial_metrics_path(index).exists()


# ---------------------------------------------------------------------------------------------
# Ray Tune: the searcher and the trainable

def stop_file(run_dir: RunDir, index: int | None = None) -> Path:
    """search/stop/all (the whole search stops) or search/stop/{i} (trial i stops, e.g. by ASHA):
    the trial's process watches for them (search_trial.py), on whichever node it runs, and stops
    with a snapshot as on SIGTERM."""
    return run_dir.root / 'search' / 'stop' / ('all' if index is None else str(index))


def request_stop(run_dir: RunDir, index: int | None = None) -> None:
    path = stop_file(run_dir, index)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, time.strftime('%Y-%m-%dT%H:%M:%S'))


def make_searcher(run_dir: RunDir, spec: dict, params: list[Param]):
    from ray.tune.search import Searcher

    class LabSearcher(Searcher):
        """Trials in order of their Optuna number: first those a previous run of the search
        started (finished ones replayed, unfinished ones continued), then new draws."""

        def __init__(self):
            super().__init__(metric=METRIC, mode='max')
            self.study = open_study(run_dir)
            self.seed = int(spec['meta']['random_seed'])
            self.total = total_trials(spec, params)
            self.grid = grid_points(params)
            self.live: dict[str, int] = {}  # Ray trial id -> Optuna number
            self.given = 0
            self.stopping = False

        def save(self, checkpoint_path: str) -> None:
            pass  # the search's state is the Optuna journal and the trials' files in the run directory

        def restore(self, checkpoint_path: str) -> None:
            pass

        def suggest(self, trial_id: str):
            import optuna
            if self.given >= self.total or self.stopping:
                return Searcher.FINISHED
            number = self.given
            trials = self.study.get_trials(deepcopy=False)
            if number < len(trials):
                ot = trials[number]
                if ot.state == optuna.trial.TrialState.RUNNING and trial_finished(run_dir, number):
                    self._tell(ot, None)  # it finished as the previous run of the search stopped
                    ot = self.study.get_trials(deepcopy=False)[number]
            else:
                ot = draw(self.study, params, self.seed, number, self.grid[number % len(self.grid)])
            self.given += 1
            self.live[trial_id] = number
            values = values_of(ot, params)
            replay = ot.state.is_finished()
            if not replay:
                try:
                    write_trial_specs(run_dir, spec, values, number)
                except LabError as e:  # a drawn value the spec refuses (a normal's tail): this trial fails
                    logger.warning(f'trial {number}: {e}')
                    self.study._storage.set_trial_user_attr(ot._trial_id, 'error', str(e))
                    self.study.tell(number, state=optuna.trial.TrialState.FAIL)
                    replay = True
            return {'trial': number, 'values': values, 'replay': replay,
                    'until': ot.user_attrs.get('last_frame')}

        def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
            number = self.live.pop(trial_id, None)
            if number is None or self.stopping:
                return  # stopped with the search: it continues when the search resumes
            ot = self.study.get_trials(deepcopy=False)[number]
            if ot.state.is_finished():
                return  # replayed
            if not error and not trial_finished(run_dir, number):
                request_stop(run_dir, number)  # stopped by ASHA: its process stops with a snapshot
            self._tell(ot, result, error)

        def _tell(self, ot, result: dict | None, error: bool = False) -> None:
            """Record a trial's outcome: the last value reported to Tune (and its frame, where the
            experiment's records of the trial end), or the trial's last report on disk."""
            import optuna
            if result and TIME_ATTR in result:
                frame, value = int(result[TIME_ATTR]), float(result.get(METRIC, float('nan')))
            else:
                reports = trial_reports(run_dir, ot.number, spec['meta']['max_session'])
                frame, value = (reports[-1][TIME_ATTR], reports[-1][METRIC]) if reports else (0, float('nan'))
            self.study._storage.set_trial_user_attr(ot._trial_id, 'last_frame', frame)
            if error or not math.isfinite(value):
                self.study.tell(ot.number, state=optuna.trial.TrialState.FAIL)
            else:
                self.study.tell(ot.number, value)

    return LabSearcher()


def make_trainable():
    from ray import tune

    class LabTrainable(tune.Trainable):
        """One trial: its Trial runs in a child process; each step returns the next report."""

        def setup(self, config: dict, run_root: str = '', spec_name: str = '', max_session: int = 1,
                  max_frame: int = 0):
            self.params = dict(run_root=run_root, spec_name=spec_name, max_session=max_session, max_frame=max_frame)
            self.run_dir = RunDir(Path(run_root), spec_name)
            self.index, self.max_session, self.max_frame = config['trial'], max_session, max_frame
            self.reports = trial_reports(self.run_dir, self.index, max_session)  # replayed first
            if config.get('until') is not None:  # where a trial stopped early ended
                self.reports = [r for r in self.reports if r[TIME_ATTR] <= config['until']]
            self.reported = 0
            self.seen = None  # the train CSVs' modification times when last read
            self.proc = None
            if not config['replay']:
                # a trial that continues holds back its row at max_frame until its process ends, as
                # step() does: it may have been stopped there before writing its final records, and
                # reported to Tune (which stops a trial at max_t) it would be stopped unfinished
                self.reports = [r for r in self.reports if r[TIME_ATTR] < max_frame]
            if not config['replay'] and not stop_file(self.run_dir).exists():
                self.proc = start_trial_process(self.run_dir, self.index)
                record_node(self.run_dir, self.index)

        def step(self) -> dict:
            while True:
                if self.reported < len(self.reports):
                    report = dict(self.reports[self.reported])
                    self.reported += 1
                    return report
                if self.proc is None:  # replayed to its end
                    return {**(self.reports[-1] if self.reports else {TIME_ATTR: 0, METRIC: float('nan')}),
                            'done': True}
                rc = self.proc.poll()
                stamp = [_mtime(self.run_dir.session_df_path(self.index, s, 'train')) for s in range(self.max_session)]
                if rc is None and stamp == self.seen:  # no new row yet: nothing to read
                    time.sleep(0.1)
                    continue
                self.seen = stamp
                fresh = trial_reports(self.run_dir, self.index, self.max_session)
                last = self.reports[-1][TIME_ATTR] if self.reports else -1
                # the report at max_frame waits for the trial's end: ASHA stops a trial that reaches
                # max_t, and the trial must first write its final records
                self.reports += [r for r in fresh if r[TIME_ATTR] > last and (rc is not None or
                                                                              r[TIME_ATTR] < self.max_frame)]
                if self.reported < len(self.reports):
                    continue
                if rc is not None:
                    self.proc = None
                    if rc != 0:
                        raise RuntimeError(f'trial {self.index} ended with exit code {rc}; see its log under '
                                           f'{self.run_dir.root / "log"}')
                    continue
                time.sleep(0.1)

        def save_checkpoint(self, checkpoint_dir: str) -> dict:
            return {}  # a trial's state is its sessions' snapshots in the run directory

        def load_checkpoint(self, checkpoint) -> None:
            pass

        def reset_config(self, new_config: dict) -> bool:
            """Tune reuses this actor for the next trial (reuse_actors): no new Ray worker to start."""
            self.cleanup()
            LabTrainable.setup(self, new_config, **self.params)  # not with_parameters' wrapper, which adds them
            return True

        def cleanup(self):
            stop_process(self.proc)
            self.proc = None

    return LabTrainable


def record_node(run_dir: RunDir, index: int) -> None:
    """search/nodes/{i}: the Ray node (id and address) trial i ran on."""
    import ray
    ctx = ray.get_runtime_context()
    path = run_dir.root / 'search' / 'nodes'
    path.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path / str(index), json.dumps({'node_id': ctx.get_node_id(),
                                                     'address': ray.util.get_node_ip_address()}))


_SPARE: subprocess.Popen | None = None  # per Ray worker: a trial process started ahead, waiting for its trial


def _spawn_trial_process() -> subprocess.Popen:
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join([str(REPO_ROOT)] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
    return subprocess.Popen([sys.executable, '-m', 'slm_lab.experiment.search_trial'], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def start_trial_process(run_dir: RunDir, index: int) -> subprocess.Popen:
    """Trial `index` in a child process (search_trial). The process was started ahead when this
    Ray worker ran a trial before (its imports, a few seconds, done while that trial trained);
    another is started ahead for the next trial."""
    global _SPARE
    proc = _SPARE if _SPARE is not None and _SPARE.poll() is None else _spawn_trial_process()
    _SPARE = None
    proc.stdin.write((json.dumps([str(run_dir.root), run_dir.spec_name, index]) + '\n').encode())
    proc.stdin.close()
    _SPARE = _spawn_trial_process()
    return proc


def stop_process(proc: subprocess.Popen | None, timeout: float = 600.0) -> None:
    """SIGTERM a trial process (its sessions save snapshots) and wait for it; SIGKILL after timeout."""
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except ProcessLookupError:
        pass


# ---------------------------------------------------------------------------------------------
# the experiment

_OWN_TOKEN: str | None = None  # the RAY_AUTH_TOKEN this process made for its own local Ray


def make_scheduler(spec: dict):
    """ASHA on frames from meta.search_scheduler, or None without one. A grace_period longer than a
    trial's sessions run (a search shortened with -s env.max_frame) could stop no trial, and Ray
    refuses it: then every trial runs to its end, with a warning."""
    from ray.tune.schedulers import AsyncHyperBandScheduler
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
    """Run (or continue) the search in run_dir; returns the experiment dataframe."""
    global _OWN_TOKEN
    if not ray_address and 'RAY_AUTH_TOKEN' not in os.environ:
        # a loopback cluster of this process only, with token authentication whose token lives in
        # the environment rather than in ~/.ray; set before Ray is imported, which reads them once
        # (a token the user exported is theirs: the lab uses it and never sweeps by it)
        os.environ.setdefault('RAY_AUTH_MODE', 'token')
        os.environ['RAY_AUTH_TOKEN'] = _OWN_TOKEN = secrets.token_hex(32)
    import ray
    from ray import tune
    meta = spec['meta']
    resources = trial_resources(meta, local=not ray_address)
    os.environ['PYTHONPATH'] = os.pathsep.join(
        [str(REPO_ROOT)] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p])
    os.environ.setdefault('RAY_DEDUP_LOGS', '0')
    os.environ['TUNE_DISABLE_SIGINT_HANDLER'] = '1'  # Ctrl-C is the lab's: _SearchStop
    os.environ['RAY_AIR_NEW_OUTPUT'] = '0'
    init = dict(include_dashboard=False, log_to_driver=False, logging_level='WARNING', configure_logging=True)
    temp_dir = reaper = None
    if ray_address:
        ray.init(address=ray_address, **init)
    else:
        previous = run_dir.root / 'search' / 'ray_temp'
        if previous.exists():  # the session files of a run of this search that was killed
            keep_ray_logs(previous.read_text().strip(), run_dir)
        temp_dir = ray_temp_dir(run_dir)
        atomic_write_text(previous, temp_dir)
        reaper, marker = start_reaper()
        ray.init(num_cpus=os.cpu_count(), _temp_dir=temp_dir, _node_ip_address='127.0.0.1', **init)
    import shutil
    shutil.rmtree(run_dir.root / 'search' / 'stop', ignore_errors=True)  # of the search's previous run
    searcher = make_searcher(run_dir, spec, params)
    stop = _SearchStop(searcher, run_dir).install()
    try:
        scheduler = make_scheduler(spec)
        trainable = tune.with_parameters(make_trainable(), run_root=str(run_dir.root.resolve()),
                                         spec_name=spec['name'], max_session=meta['max_session'],
                                         max_frame=session_max_frame(spec))
        tuner = tune.Tuner(
            tune.with_resources(trainable, resources),
            tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler, metric=METRIC, mode='max',
                                        num_samples=total_trials(spec, params), reuse_actors=True),
            run_config=tune.RunConfig(name='tune', storage_path=str((run_dir.root / 'search').resolve()),
                                      verbose=0, log_to_file=True))
        tuner.fit()
    finally:
        stop.uninstall()
        ray.shutdown()
        if reaper is not None:
            from slm_lab.experiment.search_reaper import MARKER_VAR, sweep
            sweep(marker, _OWN_TOKEN)  # whatever of the local Ray outlived its shutdown
            os.environ.pop(MARKER_VAR, None)
            reaper.kill()
            reaper.wait()
        if temp_dir is not None:
            keep_ray_logs(temp_dir, run_dir)
            (run_dir.root / 'search' / 'ray_temp').unlink(missing_ok=True)
    if stop.signum is not None:
        from slm_lab.lib.errors import Preempted
        raise Preempted(stop.signum, None, 'with the running trials saved in snapshots')
    return write_experiment(spec, run_dir, params, searcher.study, keep)


def trial_resources(meta: dict, local: bool) -> dict:
    """meta.search_resources (default one CPU, no GPU). On this machine, a trial asking for more
    CPUs than it has gets all of them, and GPUs only when torch sees one (as SLM-Lab does), with a
    warning each: Ray would otherwise wait for them forever."""
    asked = meta.get('search_resources') or {}
    cpu, gpu = asked.get('cpu', 1), asked.get('gpu', 0)
    if local:
        cores = os.cpu_count() or 1
        if cpu > cores:
            logger.warning(f'meta.search_resources.cpu {cpu} is more than the {cores} CPU cores here; each trial '
                           f'reserves {cores}')
            cpu = cores
        if gpu:
            import torch
            if not torch.cuda.is_available():
                logger.warning(f'meta.search_resources.gpu {gpu}: no GPU here; the trials run on the CPU')
                gpu = 0
    return {'cpu': cpu, 'gpu': gpu}


def start_reaper() -> tuple[subprocess.Popen, str]:
    """The watchdog (search_reaper) that kills the local Ray's processes if this process dies;
    they are marked through the environment they inherit from here."""
    from slm_lab.experiment.search_reaper import MARKER_VAR
    marker = secrets.token_hex(8)
    env = {k: v for k, v in os.environ.items() if k not in (MARKER_VAR, 'RAY_AUTH_TOKEN')}
    if _OWN_TOKEN:
        env['SLM_LAB_REAPER_TOKEN'] = _OWN_TOKEN  # not on its command line, which any user can read
    reaper = subprocess.Popen([sys.executable, '-m', 'slm_lab.experiment.search_reaper', marker, str(os.getpid())],
                              env=env, start_new_session=True, stdin=subprocess.DEVNULL)
    os.environ[MARKER_VAR] = marker
    return reaper, marker


def ray_temp_dir(run_dir: RunDir) -> str:
    """Ray's session files (logs, sockets) inside the run directory; a Unix socket path has at
    most 107 bytes, so a deep run directory gets a short directory under /tmp instead (named in
    the log)."""
    path = (run_dir.root / 'search' / 'ray').resolve()
    if len(str(path)) > 40:
        import tempfile
        short = tempfile.mkdtemp(prefix='slm_ray_')
        logger.info(f"Ray's session files: {short} (the run directory's path is too long for Ray's sockets)")
        return short
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def keep_ray_logs(temp_dir: str, run_dir: RunDir) -> None:
    """Ray's session logs into search/ray/ of the run directory when they had to live elsewhere
    (a short directory under /tmp, see ray_temp_dir), and that directory removed."""
    import shutil
    dest = (run_dir.root / 'search' / 'ray').resolve()
    if not Path(temp_dir).is_dir() or Path(temp_dir).resolve() == dest:
        return
    for session in Path(temp_dir).glob('session_2*'):
        logs = session / 'logs'
        if logs.is_dir():
            shutil.move(str(logs), str(dest / session.name / 'logs'))
    shutil.rmtree(temp_dir, ignore_errors=True)


class _SearchStop(StopSignal):
    """SIGTERM / SIGINT during a search (a second one exits at once, as StopSignal): the searcher
    starts no new trial and every running trial's process stops itself with a snapshot when the
    stop file appears, on any node; Tuner.fit then returns and search@ continues the search."""

    def __init__(self, searcher, run_dir: RunDir):
        super().__init__()
        self.searcher, self.run_dir = searcher, run_dir

    def _handle(self, signum, frame):
        super()._handle(signum, frame)
        self.searcher.stopping = True
        request_stop(self.run_dir)


# ---------------------------------------------------------------------------------------------
# the experiment's records

def write_experiment(spec: dict, run_dir: RunDir, params: list[Param], study, keep: int | None):
    """info/{name}_experiment_df.csv (one row per trial) and the experiment graphs."""
    import pandas as pd
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
        from slm_lab.experiment import viz
        viz.plot_experiment(df, [p.path for p in params], str(run_dir.root / 'graph' / spec['name']))
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
    import shutil

    cleanup_stale_tmp(run_dir.root / 'model')  # a trial killed mid-write left its temporary file
    order = df.sort_values(METRIC, ascending=False, na_position='last')['trial'].tolist()
    for i in order[keep:]:
        prename = run_dir.prename(int(i))
        for f in (run_dir.root / 'model').glob(f'{prename}_*'):
            f.unlink()
        for d in (run_dir.root / 'ckpt').glob(f'{prename}_s*'):
            shutil.rmtree(d, ignore_errors=True)
