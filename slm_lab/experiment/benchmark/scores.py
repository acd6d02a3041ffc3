"""A seed's score under each of the suite's definitions (suite.SCORES), read from its session's
train and eval CSVs, and its learning curve."""
from __future__ import annotations

import csv
import math
from pathlib import Path

SLM_LAB_ROWS = 100  # the log rows SLM-Lab's session analysis averages (its PLOT_MA_WINDOW)


def read_rows(path: Path) -> list[dict]:
    """A session CSV's rows with frame and total_reward_ma as floats (NaN for an empty cell); []
    when the file is not there."""
    try:
        text = path.read_text(encoding='utf-8')
    except FileNotFoundError:
        return []
    rows = []
    for row in csv.DictReader(text.splitlines()):
        try:
            rows.append({'frame': float(row['frame']), 'total_reward_ma': float(row['total_reward_ma'] or 'nan')})
        except (KeyError, TypeError, ValueError):
            continue
    return rows


def slm_ma(rows: list[dict]) -> float | None:
    """The mean total_reward_ma of the last 100 rows, cells before the first episode ended left out
    (as pandas' mean leaves them out in SLM-Lab's analysis); None without a value."""
    values = [r['total_reward_ma'] for r in rows[-SLM_LAB_ROWS:] if math.isfinite(r['total_reward_ma'])]
    return sum(values) / len(values) if values else None


def last_ma(rows: list[dict]) -> float | None:
    """The last finite total_reward_ma; None without one."""
    return next((r['total_reward_ma'] for r in reversed(rows) if math.isfinite(r['total_reward_ma'])), None)


def score(definition: str, train_csv: Path, eval_csv: Path) -> float | None:
    """A seed's score under `definition` (a suite.SCORES name)."""
    return score_rows(definition, lambda: read_rows(train_csv), lambda: read_rows(eval_csv))


def score_rows(definition: str, train, evals) -> float | None:
    """A seed's score under `definition` from its train and eval rows (each given as a function
    returning read_rows' list, so only the one the definition needs is read)."""
    if definition == 'slm_ma':
        return slm_ma(train())
    if definition == 'final_ma':
        return last_ma(train())
    if definition == 'final_return_ma':
        return last_ma(evals())
    raise ValueError(f'unknown score {definition!r}')
