"""A search you can watch: the console lines of the search's driver, from Ray Tune's callbacks
(which run in the driver process). One line when a trial starts (the values it drew), one when
it ends (its status, frame and total_reward_ma), and a summary line every log interval: each
time the trials together have logged another meta.log_frequency frames per running trial (a
continued trial's rows from before the command count, without lines of their own)."""
from __future__ import annotations

import math

from slm_lab.experiment.search.study import HISTORY, METRIC, TIME_ATTR
from slm_lab.lib import logger as lab_logger

logger = lab_logger.get_logger('slm_lab.search')


def fmt_value(value) -> str:
    """A drawn value for a console line: floats to 4 significant digits."""
    return f'{value:.4g}' if isinstance(value, float) else str(value)


def fmt_reward(value) -> str:
    return '-' if value is None or (isinstance(value, float) and math.isnan(value)) else f'{value:.2f}'


class SearchWatch:
    """The search's progress as the driver sees it: {trial number: its last report}, statuses."""

    def __init__(self, total: int, max_frame: int, log_frequency: int, stopping=lambda: False,
                 label: str = 'search', finished=lambda index: False):
        """`label`: what the lines call the experiment ('search', 'benchmark'), whose resume is
        `{label}@latest`; a trial whose config names its own max_frame (a benchmark's rows) is
        judged by it. `finished(index)`: whether trial `index` wrote its final records (one that
        ends as the search stops may have finished all the same)."""
        self.total, self.max_frame, self.log_frequency = total, max_frame, log_frequency
        self.label = label
        self.stopping = stopping  # whether the search is stopping (a trial ending then is not finished)
        self.finished = finished
        self.last: dict[int, dict] = {}  # trial -> its last report (frame, total_reward_ma)
        self.running: set[int] = set()
        self.ended: dict[int, str] = {}  # trial -> status
        self.quiet: set[int] = set()  # trials Tune started as the search stopped: no lines
        self.next_summary = 0

    def started(self, config: dict) -> None:
        index = config['trial']
        if self.stopping():  # given out before the stop: it starts nothing (tune.py) and continues at search@
            self.quiet.add(index)
            return
        self.running.add(index)
        if config.get('replay'):
            return  # finished before (a continued search): its end line says so
        values = ', '.join(f'{path}={fmt_value(v)}' for path, v in config['values'].items())
        logger.info(f'trial {index} start: {values or "(no searched values)"}')

    def reported(self, config: dict, result: dict) -> None:
        index = config['trial']
        if TIME_ATTR not in result or index in self.quiet:
            return
        self.last[index] = {TIME_ATTR: int(result[TIME_ATTR]), METRIC: result.get(METRIC)}
        if config.get('replay') or result.get(HISTORY):  # rows from before this command: no summaries
            return
        done = sum(r[TIME_ATTR] for r in self.last.values())
        if done >= self.next_summary:
            step = self.log_frequency * max(1, len(self.running))
            self.next_summary = (done // step + 1) * step
            self.summary()

    def ended_as(self, config: dict, error: bool) -> None:
        index = config['trial']
        self.running.discard(index)
        if index in self.quiet:
            return
        report = self.last.get(index, {})
        frame = report.get(TIME_ATTR, 0)
        if error:
            status = 'error (see its log under log/)'
        elif self.stopping() and self.finished(index):  # (its last report to Tune may be short of max_frame)
            status = 'completed'
        elif self.stopping():
            status = f'stopped with the {self.label}, a snapshot saved (continue with {self.label}@latest)'
        elif config.get('replay'):
            status = 'finished before (kept)'
        elif frame < config.get('max_frame', self.max_frame):
            status = 'stopped early (ASHA)'
        else:
            status = 'completed'
        self.ended[index] = status
        logger.info(f'trial {index} end: {status} | frame {frame} | total_reward_ma {fmt_reward(report.get(METRIC))}')

    def summary(self) -> None:
        best = max(((i, r) for i, r in self.last.items() if r.get(METRIC) is not None and not math.isnan(r[METRIC])),
                   key=lambda item: item[1][METRIC], default=None)
        running = ', '.join(f't{i} frame {self.last.get(i, {}).get(TIME_ATTR, 0)}' for i in sorted(self.running))
        best_text = (f'best: trial {best[0]} total_reward_ma {best[1][METRIC]:.2f} at frame {best[1][TIME_ATTR]}'
                     if best else 'best: -')
        logger.info(f'{self.label}: {len(self.ended)}/{self.total} trials ended, {len(self.running)} running'
                    f'{" (" + running + ")" if running else ""} | {best_text}')


def make_callback(watch: SearchWatch):
    """A Ray Tune callback that feeds `watch`."""
    from ray.tune import Callback  # noqa: PLC0415 the search extra, found by check_installed

    class WatchCallback(Callback):
        def on_step_begin(self, iteration, trials, **info):
            watch.stopping()  # each turn of Tune's loop asks: a stop signal is said in the log then

        def on_trial_start(self, iteration, trials, trial, **info):
            watch.started(trial.config)

        def on_trial_result(self, iteration, trials, trial, result, **info):
            watch.reported(trial.config, result)

        def on_trial_complete(self, iteration, trials, trial, **info):
            watch.ended_as(trial.config, error=False)

        def on_trial_error(self, iteration, trials, trial, **info):
            watch.ended_as(trial.config, error=True)

    return WatchCallback()
