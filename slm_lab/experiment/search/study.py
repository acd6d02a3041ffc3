"""The Optuna study that draws each trial's values (reproducible per trial), and the trials'
records read back from their train CSVs."""
from __future__ import annotations

import csv
import math
from pathlib import Path

from slm_lab.experiment.search.space import Param
from slm_lab.persistence.run_dir import RunDir

METRIC, TIME_ATTR = 'total_reward_ma', 'frame'
# set on a report a continued trial replays from its records (the rows before this command): the
# console's summary lines are about the training under way, not the history
HISTORY = 'history'
STUDY = 'search'


def open_study(run_dir: RunDir):
    """The search's Optuna study in search/optuna.journal. A write cut off by a kill leaves a last
    line without its newline, which the next append would join into an unreadable line: it is cut
    away first (every journal operation the lab makes is one line, see draw)."""
    import optuna  # noqa: PLC0415 the search extra, found by check_installed
    from optuna.storages import JournalStorage  # noqa: PLC0415 the search extra, found by check_installed
    from optuna.storages.journal import JournalFileBackend  # noqa: PLC0415 the search extra, found by check_installed
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
    import optuna  # noqa: PLC0415 the search extra, found by check_installed
    from optuna.trial import TrialState, create_trial  # noqa: PLC0415 the search extra, found by check_installed
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


def mtime_of(path: Path) -> int | None:
    """The file's modification time in ns, None when it does not exist."""
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None


def trial_finished(run_dir: RunDir, index: int) -> bool:
    return run_dir.trial_metrics_path(index).exists()
