"""The statistics of a benchmark report, each small enough to check by hand: a row's 95% bootstrap
interval over its seeds, the verdict of a reference against it, and the aggregate over rows as
rliable computes it (interquartile mean of normalised scores with a stratified bootstrap interval).

The rliable package (1.2.0, the newest) needs `arch` < 8, whose 7.2.0 fails to import under the lab's
pandas 3 (`TypeError: deprecate_kwarg() missing 1 required positional argument`), so its two
pieces the report uses are here in numpy, with rliable's definitions:
  IQM      scipy.stats.trim_mean(scores, 0.25) over every (row, seed) score: sort the n scores,
           drop floor(n / 4) from each end, average the rest (rliable's metrics.aggregate_iqm)
  interval rliable's get_interval_estimates with StratifiedBootstrap: each resample draws, within
           every row independently, as many seeds as it has with replacement; the IQM of each
           resample; the (1 - c) / 2 and (1 + c) / 2 percentiles of those IQMs."""
from __future__ import annotations

import math

import numpy as np

from slm_lab.experiment.analysis import bootstrap_interval

CONFIDENCE = 0.95
RESAMPLES = 10000  # rliable's default is 50,000; 10,000 keeps the percentiles within ~0.5% of them
ABOVE, INSIDE, BELOW = 'above', 'inside', 'below'


def row_summary(scores: list[float | None], confidence: float = CONFIDENCE) -> dict:
    """{'n', 'mean', 'low', 'high'} of one row's per-seed scores (None and NaN left out): the mean
    and its percentile bootstrap interval (analysis.bootstrap_interval: 10,000 resamples with
    replacement, a fixed seed); low and high None below 2 seeds."""
    kept = [float(v) for v in scores if v is not None and math.isfinite(v)]
    interval = bootstrap_interval(kept, confidence)
    return {'n': len(kept), 'mean': float(np.mean(kept)) if kept else None,
            'low': interval[0] if interval else None, 'high': interval[1] if interval else None}


def verdict(reference: float, low: float | None, high: float | None) -> str | None:
    """Where the reference lies against the row's interval: 'above' it (the row falls short),
    'inside' (no difference shown), 'below' it (the row does better); None without an interval.
    The interval's ends count as inside."""
    if low is None or high is None:
        return None
    if reference > high:
        return ABOVE
    if reference < low:
        return BELOW
    return INSIDE


def normalise(score: float, random_score: float, reference: float) -> float:
    """(score - random) / (reference - random): 0 at a random policy, 1 at the reference."""
    return (score - random_score) / (reference - random_score)


def iqm(scores) -> float:
    """The interquartile mean of all the scores (any shape, flattened): sorted, floor(n / 4) dropped
    from each end, the rest averaged (scipy.stats.trim_mean(x, 0.25), rliable's aggregate_iqm)."""
    x = np.sort(np.asarray(scores, dtype=np.float64).ravel())
    cut = int(0.25 * len(x))
    return float(np.mean(x[cut:len(x) - cut]))


def stratified_bootstrap_interval(rows: list[list[float]], statistic=iqm, confidence: float = CONFIDENCE,
                                  resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """The percentile interval of `statistic` over stratified bootstrap resamples of `rows` (one list
    of per-seed scores per row, lengths may differ): in each resample every row's seeds are drawn
    with replacement within that row, as rliable's StratifiedBootstrap does, so that each row keeps
    its weight. A fixed seed: the same scores give the same interval."""
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(r, dtype=np.float64) for r in rows]
    draws = [a[rng.integers(0, len(a), size=(resamples, len(a)))] for a in arrays]  # (resamples, n_row)
    stacked = np.concatenate(draws, axis=1)
    values = np.array([statistic(sample) for sample in stacked])
    low, high = np.percentile(values, [100 * (1 - confidence) / 2, 100 * (1 + confidence) / 2])
    return float(low), float(high)
