"""The records and final files of a session and a trial: the CSV of record rows, the metrics
JSON and graphs written when a session or trial ends, and completing a finished run whose final
files a stop signal interrupted."""
from __future__ import annotations

import math
import os

import pandas as pd

from slm_lab.agent.body import COLUMNS
from slm_lab.experiment import analysis, viz
from slm_lab.experiment.signals import StopSignal
from slm_lab.experiment.tensorboard import write_trial_board
from slm_lab.lib.errors import Preempted
from slm_lab.lib.io import read_json, write_json
from slm_lab.persistence.run_dir import RunDir


def _fmt(value) -> str:
    if isinstance(value, float):
        return '' if math.isnan(value) else repr(value)
    return str(value)


def rows_to_csv(rows: list[dict]) -> str:
    """CSV text of record rows (NaN as empty), fast enough to rewrite at every log point."""
    lines = [','.join(COLUMNS)]
    lines += [','.join(_fmt(row[c]) for c in COLUMNS) for row in rows]
    return '\n'.join(lines) + '\n'


def rows_to_df(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _check_stop(stop: StopSignal | None, frame: int | None) -> None:
    if stop is not None and stop.requested:
        raise Preempted(stop.signum, frame)


def write_session_results(spec: dict, run_dir: RunDir, trial: int, session: int, train_df: pd.DataFrame,
                          eval_df: pd.DataFrame, png: bool, stop: StopSignal | None = None,
                          frame: int | None = None) -> dict:
    """The final files of a session: metrics JSON and graph. Raises Preempted between writes when
    a stop signal arrived (each file is atomic, so what is written is whole)."""
    # cached beside the runs (data/.cache): an Atari game's baseline takes half a minute to play
    rand_return = analysis.random_baseline(spec['env'], cache_dir=analysis.baseline_cache_dir(run_dir.root.parent))
    metrics = {
        'eval': analysis.calc_session_metrics(eval_df, rand_return),
        'train': analysis.calc_session_metrics(train_df, rand_return),
        'random_baseline': rand_return,
    }
    _check_stop(stop, frame)
    write_json(run_dir.session_metrics_path(trial, session), metrics)
    _check_stop(stop, frame)
    title = f'{run_dir.prename(trial, session)} {spec["agent"]["algorithm"]["name"]} {spec["env"]["name"]}'
    viz.plot_session(train_df, title, run_dir.graph_prefix(trial, session), png=png)
    _check_stop(stop, frame)
    return metrics


def write_trial_results(spec: dict, run_dir: RunDir, trial: int, max_session: int, session_metrics: list[dict],
                        stop: StopSignal | None = None, frame: int | None = None) -> dict:
    """The final files of a trial: metrics JSON, TensorBoard mean and graph, from its sessions'
    metrics and records."""
    metrics = analysis.calc_trial_metrics([m['eval'] for m in session_metrics])
    _check_stop(stop, frame)
    write_json(run_dir.trial_metrics_path(trial), metrics)
    _check_stop(stop, frame)
    # the train rows: one per log point (the eval rows are a few points for a short run)
    dfs = [pd.read_csv(run_dir.session_df_path(trial, s, 'train')) for s in range(max_session)]
    if spec['meta'].get('tensorboard', True):
        eval_dfs = [pd.read_csv(run_dir.session_df_path(trial, s, 'eval')) for s in range(max_session)]
        write_trial_board(run_dir.tb_dir(trial), {'train': dfs, 'eval': eval_dfs})
    viz.plot_trial(dfs, f'{run_dir.prename(trial)} {spec["agent"]["algorithm"]["name"]} {spec["env"]["name"]}',
                   run_dir.graph_prefix(trial), png=True)
    _check_stop(stop, frame)
    return metrics


def complete_finished_run(spec: dict, run_dir: RunDir, trial: int = 0) -> list[str]:
    """Write the final files a finished run lacks (a stop signal arrived while they were written),
    from its records. Returns the names of the files written."""
    written, session_metrics = [], []
    n = spec['meta']['max_session']
    for s in range(n):
        metrics_path = run_dir.session_metrics_path(trial, s)
        graph_path = f'{run_dir.graph_prefix(trial, s)}_session_graph.html'
        try:
            metrics = read_json(metrics_path) if os.path.exists(graph_path) else None
        except (OSError, ValueError):
            metrics = None
        if not isinstance(metrics, dict) or 'eval' not in metrics:
            dfs = {m: pd.read_csv(run_dir.session_df_path(trial, s, m)) for m in ('train', 'eval')}
            metrics = write_session_results(spec, run_dir, trial, s, dfs['train'], dfs['eval'], png=True)
            written += [metrics_path.name, os.path.basename(graph_path)]
        session_metrics.append(metrics)
    trial_graph = f'{run_dir.graph_prefix(trial)}_trial_graph.html'
    if not (run_dir.trial_metrics_path(trial).exists() and os.path.exists(trial_graph)):
        write_trial_results(spec, run_dir, trial, n, session_metrics)
        written += [run_dir.trial_metrics_path(trial).name, os.path.basename(trial_graph)]
    return written


def fmt_metric(x) -> str:
    """A metric for a log line: two decimals, or n/a."""
    return 'n/a' if x is None else f'{x:.2f}'
