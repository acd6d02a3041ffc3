"""Ray Tune's side of a search: the searcher that asks the study for values, the trainable that
runs a trial in its process (processes.py) and reports its records, and the stop files that
reach a trial on whichever node it runs."""
from __future__ import annotations

import json
import math
import signal
import time
from pathlib import Path

from slm_lab.experiment.search.space import Param, grid_points
from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import LabError
from slm_lab.lib.io import atomic_write_text
from slm_lab.experiment.search.processes import start_trial_process, stop_process
from slm_lab.experiment.search.specs import total_trials, write_trial_specs
from slm_lab.experiment.search.study import (HISTORY, METRIC, TIME_ATTR, draw, mtime_of, open_study, trial_finished,
                                             trial_reports, values_of)
from slm_lab.persistence.run_dir import RunDir

logger = lab_logger.get_logger('slm_lab.search')
STOPPED_CODES = (130, 143)  # a trial process stopped by SIGINT / SIGTERM after saving its snapshots


def stop_file(run_dir: RunDir, index: int | None = None) -> Path:
    """search/stop/all (the whole search stops) or search/stop/{i} (trial i stops, e.g. by ASHA):
    the trial's process watches for them (search/trial.py), on whichever node it runs, and stops
    with a snapshot as on SIGTERM."""
    return run_dir.root / 'search' / 'stop' / ('all' if index is None else str(index))


def request_stop(run_dir: RunDir, index: int | None = None, signum: int | None = None) -> None:
    """Write the stop file; `signum`: the signal that stopped the search (Ctrl-C's SIGINT), which
    the trials then stop by too, so that their logs name it (else SIGTERM, as for ASHA)."""
    path = stop_file(run_dir, index)
    path.parent.mkdir(parents=True, exist_ok=True)
    name = signal.Signals(signum).name if signum in (signal.SIGINT, signal.SIGTERM) else 'SIGTERM'
    atomic_write_text(path, f'{name} {time.strftime("%Y-%m-%dT%H:%M:%S")}')


def make_searcher(run_dir: RunDir, spec: dict, params: list[Param], stopping=lambda: False):
    """The search's Searcher; `stopping()` says whether the search is stopping (a stop signal)."""
    from ray.tune.search import Searcher  # noqa: PLC0415 the search extra, found by check_installed

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

        def save(self, checkpoint_path: str) -> None:
            pass  # the search's state is the Optuna journal and the trials' files in the run directory

        def restore(self, checkpoint_path: str) -> None:
            pass

        def suggest(self, trial_id: str):
            import optuna  # noqa: PLC0415 the search extra, found by check_installed
            if self.given >= self.total or stopping():
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
            if number is None or stopping():
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
            import optuna  # noqa: PLC0415 the search extra, found by check_installed
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
    from ray import tune  # noqa: PLC0415 the search extra, found by check_installed

    class LabTrainable(tune.Trainable):
        """One trial: its Trial runs in a child process; each step returns the next report."""

        def setup(self, config: dict, run_root: str = '', spec_name: str = '', max_session: int = 1,
                  max_frame: int = 0):
            self.params = dict(run_root=run_root, spec_name=spec_name, max_session=max_session, max_frame=max_frame)
            self.run_dir = RunDir(Path(run_root), spec_name)
            # a benchmark's trials differ in frames (its rows' budgets): the config names each one's
            self.index = config['trial']
            self.max_session = config.get('max_session', max_session)
            self.max_frame = config.get('max_frame', max_frame)
            # replayed first, marked as the trial's history
            self.reports = [{**r, HISTORY: True} for r in trial_reports(self.run_dir, self.index, self.max_session)]
            if config.get('until') is not None:  # where a trial stopped early ended
                self.reports = [r for r in self.reports if r[TIME_ATTR] <= config['until']]
            self.reported = 0
            self.seen = None  # the train CSVs' modification times when last read
            self.proc = None
            if not config['replay']:
                # a trial that continues holds back its row at max_frame until its process ends, as
                # step() does: it may have been stopped there before writing its final records, and
                # reported to Tune (which stops a trial at max_t) it would be stopped unfinished
                self.reports = [r for r in self.reports if r[TIME_ATTR] < self.max_frame]
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
                stamp = [mtime_of(self.run_dir.session_df_path(self.index, s, 'train'))
                         for s in range(self.max_session)]
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
                    if rc in STOPPED_CODES and stop_file(self.run_dir).exists():
                        # stopped with the search (a snapshot saved): no error, search@ continues it
                        return {**(self.reports[-1] if self.reports else {TIME_ATTR: 0, METRIC: float('nan')}),
                                'done': True}
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
    import ray  # noqa: PLC0415 the search extra, found by check_installed
    ctx = ray.get_runtime_context()
    path = run_dir.root / 'search' / 'nodes'
    path.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path / str(index), json.dumps({'node_id': ctx.get_node_id(),
                                                     'address': ray.util.get_node_ip_address()}))


def make_queue_searcher(trials: list[dict], stopping=lambda: False):
    """A Searcher that hands out `trials` (Tune configs, each with its 'trial' index) in order: a
    benchmark's row-seeds, which draw nothing. `stopping()` says whether the experiment is stopping."""
    from ray.tune.search import Searcher  # noqa: PLC0415 the search extra, found by check_installed

    class QueueSearcher(Searcher):
        def __init__(self):
            super().__init__(metric=METRIC, mode='max')
            self.queue = list(trials)

        def suggest(self, trial_id: str):
            if not self.queue or stopping():
                return Searcher.FINISHED
            return self.queue.pop(0)

        def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
            pass  # a trial's outcome is its files in the run directory

        def save(self, checkpoint_path: str) -> None:
            pass

        def restore(self, checkpoint_path: str) -> None:
            pass

    return QueueSearcher()
