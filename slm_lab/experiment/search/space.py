"""A spec's `search` block: the values a search draws, in SLM-Lab's syntax (v4 and v5).

Each leaf of the block is `<key path>__<space>: <arguments>`, nested (`{"agent": {"algorithm":
{"gamma__uniform": [0.9, 0.99]}}}`), dotted (`{"agent.algorithm.gamma__uniform": ...}`) or both;
SLM-Lab v4's one-element `agent` / `env` lists are unwrapped as in its specs. The spaces are Ray
Tune's (SLM-Lab v5 calls them by name) plus v4's `normal` and `grid_search`:

  uniform [low, high]            a float in [low, high]
  quniform [low, high, q]        a multiple of q in [low, high]
  loguniform [low, high]         a float in [low, high], uniform in log space (low > 0)
  qloguniform [low, high, q]     loguniform, rounded to the nearest multiple of q in [low, high]
  randint [low, high]            an int in [low, high) (high excluded, as numpy and Ray)
  qrandint [low, high, q]        a multiple of q in [low, high] (high included, as Ray)
  lograndint [low, high]         an int in [low, high), uniform in log space (low >= 1)
  qlograndint [low, high, q]     lograndint with high included, rounded to the nearest multiple of q in [low, high]
  randn / normal [mean, sd]      a float from a normal distribution
  qrandn [mean, sd, q]           randn, rounded to a multiple of q
  choice [v1, v2, ...]           one of the values (any JSON: numbers, strings, lists, objects)
  grid_search [v1, v2, ...]      every value in turn: the search runs max_trial trials per grid point

Every space but grid_search is an Optuna distribution, so Optuna's sampler models all of them
(a normal through its quantile: Optuna has no normal distribution; a choice through the index of
the value, so that any JSON value can be one).
"""
from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass
from typing import Any

from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import suggest
from slm_lab.spec.search_block import SPACES, search_leaves

# how many numbers each numeric space takes
ARITY = {'uniform': 2, 'loguniform': 2, 'randint': 2, 'lograndint': 2, 'randn': 2, 'normal': 2,
         'quniform': 3, 'qloguniform': 3, 'qrandint': 3, 'qlograndint': 3, 'qrandn': 3}
LOG_SPACES = ('loguniform', 'qloguniform', 'lograndint', 'qlograndint')  # drawn uniformly in log space
ARGS_DOC = {2: '[low, high]', 3: '[low, high, q]'}
_EDGE = 1e-12  # a normal's quantile is drawn from [_EDGE, 1 - _EDGE]: finite values only


@dataclass(frozen=True)
class Param:
    """One searched key: `path` (dotted spec path), `space`, its `args`; `key` is how the spec
    wrote it (for error messages: search.<key>)."""

    key: str
    path: str
    space: str
    args: tuple

    @property
    def is_grid(self) -> bool:
        return self.space == 'grid_search'

    def distribution(self):
        """The Optuna distribution Optuna draws this key's raw value from."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution  # noqa: PLC0415 (the search extra, found by check_installed)
        s, a = self.space, self.args
        if s == 'choice':
            return CategoricalDistribution(list(range(len(a))))
        if s in ('uniform', 'qloguniform') or s == 'loguniform':
            return FloatDistribution(a[0], a[1], log=s != 'uniform')
        if s in ('quniform', 'qrandint'):
            return IntDistribution(math.ceil(a[0] / a[2] - 1e-9), math.floor(a[1] / a[2] + 1e-9))
        if s == 'randint':
            return IntDistribution(a[0], a[1] - 1)
        if s == 'lograndint':
            return IntDistribution(a[0], a[1] - 1, log=True)
        if s == 'qlograndint':
            return IntDistribution(a[0], a[1], log=True)
        if s in ('randn', 'normal', 'qrandn'):
            return FloatDistribution(_EDGE, 1 - _EDGE)
        raise AssertionError(s)

    def value(self, raw) -> Any:
        """The spec value for a raw draw of distribution()."""
        s, a = self.space, self.args
        if s in ('choice', 'grid_search'):
            return a[raw]
        if s in ('quniform', 'qrandint'):
            return _multiple(raw * a[2], a[2])
        if s in ('qloguniform', 'qlograndint'):  # the nearest multiple of q within [low, high]
            k = min(max(round(raw / a[2]), math.ceil(a[0] / a[2] - 1e-9)), math.floor(a[1] / a[2] + 1e-9))
            return _multiple(k * a[2], a[2])
        if s in ('randn', 'normal', 'qrandn'):
            x = statistics.NormalDist(a[0], a[1]).inv_cdf(raw)
            return _multiple(round(x / a[2]) * a[2], a[2]) if s == 'qrandn' else x
        return raw

    def extremes(self) -> list:
        """Values worth validating before the search starts: the ends of a range, every choice."""
        s, a = self.space, self.args
        if s in ('choice', 'grid_search'):
            return list(a)
        if s in ('randn', 'normal', 'qrandn'):
            return [self.value(0.5)]
        d = self.distribution()
        return [self.value(d.low), self.value(d.high)]


def _multiple(x: float, q) -> int | float:
    """x (a multiple of q) as an int when q is one, else a float without rounding noise."""
    if isinstance(q, int) and not isinstance(q, bool):
        return int(round(x))
    digits = max(0, -math.floor(math.log10(abs(q)))) + 6 if q else 6
    return round(x, digits)


def parse_search(block: dict) -> list[Param]:
    """The searched keys of a search block, each checked: a known space, arguments that fit it.
    An empty block searches nothing: the trials differ by their seeds only (SLM-Lab's too)."""
    if not isinstance(block, dict):
        raise SpecError('search: expected an object of "<key>__<space>": [...] entries, e.g. '
                        '{"agent.algorithm.gamma__uniform": [0.9, 0.999]}')
    params = []
    for key, args in search_leaves(block):
        path, space = key.rsplit('__', 1)
        if space not in SPACES:
            raise SpecError(f"search.{key}: unknown space '{space}'{suggest(space, SPACES)}; "
                            f"valid: {', '.join(SPACES)}")
        params.append(Param(key, path, space, _check_args(key, space, args)))
    paths = [p.path for p in params]
    for path in paths:
        if paths.count(path) > 1:
            raise SpecError(f'search: {path} is searched twice ({", ".join(p.key for p in params if p.path == path)}); '
                            'keep one')
    return params


def _check_args(key: str, space: str, args) -> tuple:
    where = f'search.{key}'
    if space in ('choice', 'grid_search'):
        if not isinstance(args, list) or not args:
            raise SpecError(f'{where}: expected a non-empty list of values, got {args!r}')
        return tuple(args)
    n = ARITY[space]
    if not (isinstance(args, list) and len(args) == n
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in args)):
        raise SpecError(f'{where}: expected {n} numbers {ARGS_DOC[n]}, got {args!r}')
    a, b = args[0], args[1]
    if space in ('randn', 'normal', 'qrandn'):
        if b <= 0:
            raise SpecError(f'{where}: the standard deviation {b} must be > 0')
    elif a > b:
        raise SpecError(f'{where}: low {a} > high {b}; give [low, high{", q" if n == 3 else ""}]')
    if space in ('randint', 'lograndint', 'qrandint', 'qlograndint') and not all(isinstance(x, int) for x in args):
        raise SpecError(f'{where}: {space} takes whole numbers, got {args!r}')
    if space in ('randint', 'lograndint') and a >= b:
        raise SpecError(f'{where}: {space} draws from [low, high) with high excluded, so high must be > low; '
                        f'got {args!r}')
    if space.startswith(('log', 'qlog')) and a <= 0:
        raise SpecError(f'{where}: {space} needs low > 0 (log scale), got {a}')
    if n == 3:
        q = args[2]
        if q <= 0:
            raise SpecError(f'{where}: the step q {q} must be > 0')
        if space != 'qrandn' and math.floor(b / q + 1e-9) < math.ceil(a / q - 1e-9):
            raise SpecError(f'{where}: no multiple of {q} lies in [{a}, {b}]')
    return tuple(args)


def grid_points(params: list[Param]) -> list[dict]:
    """Every combination of the grid_search values ({path: value}), in key order; [{}] when
    nothing is grid-searched."""
    grid = [p for p in params if p.is_grid]
    return [dict(zip([p.path for p in grid], combo)) for combo in itertools.product(*(p.args for p in grid))]
