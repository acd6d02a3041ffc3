"""Metrics computed from the training dataframes of sessions and trials.

A session dataframe has one row per log point, with at least the columns `frame`, `opt_step`
and `total_reward_ma` (the moving average of episode returns). Rows whose `total_reward_ma`
is NaN (no episode has finished yet) are dropped before any metric is computed; "row i" below
runs over the N rows that remain, in order, i = 1 .. N.

Session metrics, with r the mean return of a uniformly random policy on the same env (same
env.name, env.max_t and env.make_kwargs):

    strength_i          = total_reward_ma_i - r
    strength            = mean_i strength_i
    max_strength        = max_i strength_i
    final_strength      = strength_N                          (last row)
    final_return_ma     = total_reward_ma_N                   (last row)

    efficiency over an index x (frame, or opt_step), with x_i = 0 counted as 1
    (rows where x is NaN are left out):
    efficiency          = sum_i (strength_i / x_i) / sum_i (1 / x_i)
    efficiency_i        = the same sums taken over rows 1 .. i  (the local series)
    sample_efficiency   = efficiency over x = frame
    training_efficiency = efficiency over x = opt_step

    stability           = (number of i >= 2 with strength_i >= strength_(i-1)) / (N - 1)
                          (1.0 when there are fewer than 2 rows)

Trial metrics, over S sessions:

    each scalar         = mean over sessions of that session scalar (None values skipped)
    strength series are cut to the length L of the shortest one, then for each row i <= L:
    mean_i, std_i       = mean and population standard deviation (ddof=0) across sessions
    consistency_i       = 1 - std_i / |mean_i|, clipped to [0, 1];
                          when mean_i = 0: 1 if std_i = 0, else 0
    consistency         = mean_i consistency_i  (1.0 for a single session; None if L = 0)

Efficiency weights early log points most (1 / x is large when x is small), so it rewards
reaching a high strength with few frames or few optimizer steps. Every scalar is a plain
float or None (for NaN, or when there is no data); metrics never raise on empty input.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from slm_lab.lib.errors import DiskFullError
from slm_lab.lib.io import read_json, write_json
from slm_lab.lib.version import __version__

SESSION_SCALARS = (
    'final_return_ma', 'strength', 'max_strength', 'final_strength',
    'sample_efficiency', 'training_efficiency', 'stability',
)
SESSION_LOCALS = ('strength', 'sample_efficiency', 'training_efficiency', 'frame', 'opt_step')


# the packages whose envs or random numbers shape a baseline: a cached one is reused only while
# every version matches (see docs/metrics.md, "The random baseline")
BASELINE_PACKAGES = ('gymnasium', 'numpy', 'ale-py', 'mujoco', 'box2d', 'box2d-py')
BASELINE_CACHE_DIR = '.cache'  # under the lab's data dir: data/.cache/random_baseline_*.json
CACHE_DIR_ENV = 'SLM_LAB_CACHE_DIR'  # where the lab keeps caches instead (the test suite points it at a tmp dir)
_memo: dict[tuple, float] = {}  # this process's baselines, by env, settings and cache directory


def baseline_cache_dir(data_dir: str | os.PathLike) -> Path:
    """Where random baselines are cached: $SLM_LAB_CACHE_DIR when set, else {data_dir}/.cache."""
    return Path(os.environ.get(CACHE_DIR_ENV) or Path(data_dir) / BASELINE_CACHE_DIR)


def random_baseline(env_spec: dict, episodes: int = 20, max_frames: int = 20000, seed: int = 0,
                    cache_dir: str | os.PathLike | None = None) -> float:
    """Mean return of a uniformly random policy on the env of `env_spec` (its name, max_t and
    make_kwargs), built as the lab builds its evaluation env, so the baseline plays the same
    episodes (same step limit, same env arguments) as the agent it is compared with.

    Plays up to `episodes` episodes of uniformly random actions within the env's bounds (the
    agent's action space's sample(), seeded with `seed`; the first reset seeded with `seed`),
    stopping early once `max_frames` env steps are used. Returns the mean over completed episodes;
    if none completed within `max_frames`, the return of the partial episode. Memoised per process, per env spec;
    with `cache_dir`, also kept on disk there (one JSON file per key: `baseline_cache_key`), so
    that later runs do not play the episodes again (an Atari game's 20,000 steps take half a minute).
    """
    key = json.dumps({'name': env_spec['name'], 'max_t': env_spec.get('max_t'),
                      'make_kwargs': env_spec.get('make_kwargs') or {}}, sort_keys=True)
    memo_key = (key, episodes, max_frames, seed, None if cache_dir is None else str(cache_dir))
    if memo_key not in _memo:
        _memo[memo_key] = _random_baseline(key, episodes, max_frames, seed, cache_dir)
    return _memo[memo_key]


def baseline_cache_key(env_key: str, episodes: int, max_frames: int, seed: int) -> dict:
    """What a random baseline depends on: the env (id, max_t, make_kwargs), the episodes, step
    cap and seed, the lab's version (its env wrappers) and the versions of the env packages."""
    versions = {}
    for package in BASELINE_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return {'env': json.loads(env_key), 'episodes': episodes, 'max_frames': max_frames, 'seed': seed,
            'lab_version': __version__, 'packages': versions}


def baseline_cache_path(cache_dir: str | os.PathLike, key: dict) -> Path:
    """The file of a cached baseline: named by a digest of its key, which it holds in full."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return Path(cache_dir) / f'random_baseline_{digest}.json'


def _read_cached_baseline(path: Path, key: dict) -> float | None:
    """The cached value when the file holds this very key and a finite number; None otherwise
    (missing, damaged or another key: the baseline is played again and the file rewritten)."""
    try:
        cached = read_json(path)
    except (OSError, ValueError):
        return None
    if not isinstance(cached, dict) or cached.get('key') != key:
        return None
    value = cached.get('random_baseline')
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _random_baseline(env_key: str, episodes: int, max_frames: int, seed: int,
                     cache_dir: str | os.PathLike | None = None) -> float:
    """random_baseline for an env spec given as JSON: read from `cache_dir`, else played (and
    written there)."""
    path = None
    if cache_dir is not None:
        key = baseline_cache_key(env_key, episodes, max_frames, seed)
        path = baseline_cache_path(cache_dir, key)
        value = _read_cached_baseline(path, key)
        if value is not None:
            return value
    value = _play_random_baseline(env_key, episodes, max_frames, seed)
    if path is not None and math.isfinite(value):
        try:
            write_json(path, {'key': key, 'random_baseline': value})  # atomic: a reader sees all of it or none
        except (OSError, DiskFullError):  # a read-only data dir, a full disk: the next run plays it again
            pass
    return value


def _play_random_baseline(env_key: str, episodes: int, max_frames: int, seed: int) -> float:
    """Play the random policy's episodes (see random_baseline)."""
    from slm_lab.env import agent_action_space, make_single_env  # noqa: PLC0415 gymnasium's envs: only when a baseline is due

    env = make_single_env(json.loads(env_key))
    # the agent's space: uniform within the env's bounds (env.action_space is ClipAction's, which
    # reports no bounds and would sample a Gaussian)
    action_space = agent_action_space(env)
    try:
        action_space.seed(seed)
        returns: list[float] = []
        frames = 0
        env.reset(seed=seed)
        episode_return = 0.0
        while len(returns) < episodes and frames < max_frames:
            _, reward, terminated, truncated, _ = env.step(action_space.sample())
            frames += 1
            episode_return += float(reward)
            if terminated or truncated:
                returns.append(episode_return)
                episode_return = 0.0
                env.reset()
        return float(np.mean(returns)) if returns else episode_return
    finally:
        env.close()


def _to_scalar(value: Any) -> float | None:
    """A plain float for JSON, or None for NaN / inf / missing."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _to_list(values: np.ndarray) -> list[float | None]:
    return [_to_scalar(v) for v in values]


def _column(df: pd.DataFrame, name: str) -> np.ndarray:
    """Column `name` as float64, or all-NaN when the column is absent."""
    if name not in df.columns:
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[name], errors='coerce').to_numpy(dtype=np.float64, na_value=np.nan)


def calc_efficiency(local_strengths: np.ndarray, x: np.ndarray) -> tuple[float, np.ndarray]:
    """Efficiency of a strength series over an index x (frame or opt_step).

    efficiency = sum_i(strength_i / x_i) / sum_i(1 / x_i), with x_i = 0 counted as 1 and rows
    whose x is NaN left out. Returns (efficiency, local series of the same sums up to row i).
    """
    x = np.where(x == 0, 1.0, x)
    valid = np.isfinite(x) & np.isfinite(local_strengths)
    weights = np.zeros(len(x))
    weights[valid] = 1.0 / x[valid]
    weighted = np.zeros(len(x))
    weighted[valid] = local_strengths[valid] * weights[valid]
    cum_weights = np.cumsum(weights)
    local = np.full(len(x), np.nan)
    has_weight = cum_weights > 0
    local[has_weight] = np.cumsum(weighted)[has_weight] / cum_weights[has_weight]
    efficiency = local[-1] if len(local) else np.nan
    return float(efficiency), local


def calc_stability(local_strengths: np.ndarray) -> float:
    """Fraction of consecutive pairs where strength does not decrease; 1.0 with < 2 rows."""
    if len(local_strengths) < 2:
        return 1.0
    return float(np.mean(np.diff(local_strengths) >= 0))


def _empty_session_metrics() -> dict:
    return {
        'scalar': {name: None for name in SESSION_SCALARS},
        'local': {name: [] for name in SESSION_LOCALS},
    }


def calc_session_metrics(session_df: pd.DataFrame, rand_return: float) -> dict:
    """Metrics of one session from its dataframe (see the module docstring for formulas).

    Returns {'scalar': {final_return_ma, strength, max_strength, final_strength,
    sample_efficiency, training_efficiency, stability}, 'local': {strength, sample_efficiency,
    training_efficiency, frame, opt_step}}. Scalars are floats or None; each local list has one
    entry per row with a non-NaN total_reward_ma. An empty or all-NaN dataframe gives all
    scalars None and empty lists.
    """
    if session_df is None or len(session_df) == 0:
        return _empty_session_metrics()
    return_ma = _column(session_df, 'total_reward_ma')
    keep = np.isfinite(return_ma)
    if not keep.any():
        return _empty_session_metrics()
    return_ma = return_ma[keep]
    frame = _column(session_df, 'frame')[keep]
    opt_step = _column(session_df, 'opt_step')[keep]

    local_strengths = return_ma - float(rand_return)
    sample_eff, local_sample_eff = calc_efficiency(local_strengths, frame)
    training_eff, local_training_eff = calc_efficiency(local_strengths, opt_step)
    scalar = {
        'final_return_ma': return_ma[-1],
        'strength': np.mean(local_strengths),
        'max_strength': np.max(local_strengths),
        'final_strength': local_strengths[-1],
        'sample_efficiency': sample_eff,
        'training_efficiency': training_eff,
        'stability': calc_stability(local_strengths),
    }
    return {
        'scalar': {name: _to_scalar(value) for name, value in scalar.items()},
        'local': {
            'strength': _to_list(local_strengths),
            'sample_efficiency': _to_list(local_sample_eff),
            'training_efficiency': _to_list(local_training_eff),
            'frame': _to_list(frame),
            'opt_step': _to_list(opt_step),
        },
    }


def _mean_std(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column-wise mean and population std of (sessions, rows), ignoring NaN, without warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', RuntimeWarning)
        return np.nanmean(rows, axis=0), np.nanstd(rows, axis=0)


def calc_consistency(local_strengths: np.ndarray) -> tuple[float | None, np.ndarray]:
    """Consistency of aligned strength series, shape (sessions, rows).

    consistency_i = 1 - std_i / |mean_i| across sessions (population std), clipped to [0, 1];
    where mean_i = 0 it is 1 if std_i = 0 else 0. Returns (mean over rows or None if there
    are no rows, local series).
    """
    if local_strengths.size == 0:
        return None, np.zeros(0)
    mean, std = _mean_std(local_strengths)
    abs_mean = np.abs(mean)
    ratio = np.where(std > 0, np.inf, 0.0)  # the mean_i = 0 case
    nonzero = abs_mean > 0
    ratio[nonzero] = std[nonzero] / abs_mean[nonzero]
    ratio[np.isnan(mean)] = np.nan
    local = np.clip(1.0 - ratio, 0.0, 1.0)  # NaN (a column of NaNs) stays NaN and is skipped
    if np.isnan(local).all():
        return None, local
    return _to_scalar(np.nanmean(local)), local


def bootstrap_interval(values, confidence: float = 0.95, resamples: int = 10000,
                       seed: int = 0) -> tuple[float, float] | None:
    """The percentile bootstrap interval of the mean of `values` (one per seed): the mean of
    `resamples` resamples with replacement, drawn by a fixed seed so that the same values always
    give the same interval; its (1 - confidence) / 2 and (1 + confidence) / 2 quantiles. None for
    fewer than 2 values (no spread to resample). With few seeds the interval is narrow for what
    it claims (4 seeds: the resampled means take at most 35 distinct values); rliable's
    stratified bootstrap over many tasks is the aggregate's tool."""
    values = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=np.float64)
    if len(values) < 2:
        return None
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(resamples, len(values)))].mean(axis=1)
    low, high = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(low), float(high)


def score_summary(values, confidence: float = 0.95) -> dict:
    """{'n', 'mean', 'low', 'high', 'confidence'} of per-seed scores; low/high None for one seed."""
    kept = [float(v) for v in values if v is not None and np.isfinite(v)]
    interval = bootstrap_interval(kept, confidence)
    return {'n': len(kept), 'mean': float(np.mean(kept)) if kept else None,
            'low': interval[0] if interval else None, 'high': interval[1] if interval else None,
            'confidence': confidence}


def calc_trial_metrics(session_metrics_list: list[dict]) -> dict:
    """Aggregate the metrics of a trial's sessions (outputs of calc_session_metrics).

    Returns {'scalar': mean of each session scalar over sessions (None values skipped; None if
    all are None) plus 'consistency', 'local': {'frame' (first session's, truncated),
    'strength_mean', 'strength_std'}, 'interval': {'final_return_ma': score_summary of the
    sessions' final_return_ma (its mean and 95% bootstrap interval)}}, with the local series cut
    to the shortest session.
    """
    scalar: dict[str, float | None] = {}
    for name in SESSION_SCALARS:
        values = [m['scalar'].get(name) for m in session_metrics_list]
        values = [v for v in values if v is not None]
        scalar[name] = _to_scalar(np.mean(values)) if values else None

    strength_lists = [m['local'].get('strength', []) for m in session_metrics_list]
    length = min((len(s) for s in strength_lists), default=0)
    strengths = np.array([[np.nan if v is None else v for v in s[:length]] for s in strength_lists],
                         dtype=np.float64).reshape(len(strength_lists), length)
    consistency, _ = calc_consistency(strengths)
    scalar['consistency'] = consistency

    if length:
        strength_mean, strength_std = _mean_std(strengths)
        frame = session_metrics_list[0]['local'].get('frame', [])[:length]
    else:
        strength_mean = strength_std = np.zeros(0)
        frame = []
    return {
        'scalar': scalar,
        'local': {
            'frame': list(frame),
            'strength_mean': _to_list(strength_mean),
            'strength_std': _to_list(strength_std),
        },
        'interval': {'final_return_ma': score_summary([m['scalar'].get('final_return_ma')
                                                       for m in session_metrics_list])},
    }
