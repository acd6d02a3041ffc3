"""A benchmark's suite file: its rows (spec, frame budget, seeds, score) and the published
references each row is judged against, read and checked before anything runs.

A suite file is JSON (trailing commas accepted) or YAML, as spec files are:

    {"name": "slm_lab_v5_cpu",                 the benchmark directory: data/{name}_{timestamp}/
     "description": "...",                     optional, printed atop the report
     "seeds": 4,                               default seeds per row (4: SLM-Lab's sessions)
     "score": "slm_ma",                        default score definition (SCORES)
     "resources": {"cpu": 1, "gpu": 0},        what each row-seed's trial reserves on Ray
     "rows": [
       {"id": "ppo_acrobot",                   unique; default spec_name
        "env": "Acrobot-v1", "algorithm": "PPO",   labels for the report (default: the spec's)
        "spec_file": "spec/benchmark/ppo/ppo_slm_lab_v5.json", "spec_name": "ppo_acrobot",
        "max_frame": 300000,                   the frames each seed trains (env.max_frame)
        "seeds": 4, "score": "slm_ma",         optional, else the suite's
        "set": {"meta.log_frequency": 1000},   optional spec overrides (as -s KEY=VALUE)
        "resources": {"cpu": 1, "gpu": 0.25},  optional, else the suite's
        "random_score": -500,                  optional: a random policy's score, which with the
                                               first reference normalises the row for the aggregate
                                               (default: the lab's random baseline of the row's env)
        "references": [{"value": -81.28, "source": "SLM-Lab v5 docs/BENCHMARKS.md at 96be393",
                        "max_frame": 300000, "score": "slm_ma", "seeds": 4, "note": "..."}]}]}

Every mistake is a SuiteError of one line naming the file, the key path (rows[2].max_frame) and
the fix."""
from __future__ import annotations

import difflib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from slm_lab.lib.errors import LabError, SpecError

# what a row's score means, per seed (the report prints the definition beside the number)
SCORES = {
    'slm_ma': "mean of the last 100 train log rows' total_reward_ma (the 100-episode moving average): SLM-Lab's "
              'score of a session; its published figure is the mean over 4 sessions',
    'final_ma': "total_reward_ma of the last train log row: the mean return of the last 100 training episodes",
    'final_return_ma': "the trial metrics' final_return_ma: total_reward_ma of the last eval log row (with "
                       'meta.rigorous_eval, the mean return of greedy eval episodes)',
}
DEFAULT_SEEDS = 4  # SLM-Lab's max_session behind its published figures
MAX_SEEDS = 1000  # seeds are sessions' random_seed values 0..N-1
NAME = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]*$')
SUITE_KEYS = ('name', 'description', 'seeds', 'score', 'resources', 'rows')
ROW_KEYS = ('id', 'env', 'algorithm', 'spec_file', 'spec_name', 'max_frame', 'seeds', 'score', 'set', 'resources',
            'random_score', 'references', 'note')
REFERENCE_KEYS = ('value', 'source', 'max_frame', 'score', 'seeds', 'note')


class SuiteError(LabError):
    """A suite file (or a benchmark's --rows / --seeds) that cannot run: one line, exit code 2."""


@dataclass(frozen=True)
class Reference:
    """A published score a row is judged against: its value, where it is published, at which frame
    budget, under which definition (a SCORES name, or words for another project's), over how many
    seeds."""
    value: float
    source: str
    max_frame: int | None = None
    score: str | None = None
    seeds: int | None = None
    note: str = ''


@dataclass(frozen=True)
class Row:
    """One row of a suite: a spec trained for max_frame frames with each of `seeds` seeds."""
    id: str
    spec_file: str
    spec_name: str
    max_frame: int
    seeds: int
    score: str
    env: str = ''
    algorithm: str = ''
    set: dict = field(default_factory=dict)
    resources: dict = field(default_factory=dict)
    random_score: float | None = None
    references: tuple[Reference, ...] = ()
    note: str = ''

    def same_terms_reference(self) -> Reference | None:
        """The first reference published at this row's budget under its score's definition (or
        not saying either): the one a normalised score can be scaled by. None without one."""
        return next((r for r in self.references
                     if r.max_frame in (None, self.max_frame) and r.score in (None, self.score)), None)

    def overrides(self, seed: int) -> list[str]:
        """The -s KEY=VALUE overrides of seed `seed`'s trial: the row's own, then its budget, one
        session whose random_seed is the seed."""
        own = [f'{k}={v if isinstance(v, str) else json.dumps(v)}' for k, v in self.set.items()]
        return own + [f'env.max_frame={self.max_frame}', 'meta.max_session=1', f'meta.random_seed={seed}']


@dataclass(frozen=True)
class Suite:
    """A suite file, read and checked."""
    name: str
    path: str
    rows: tuple[Row, ...]
    description: str = ''
    resources: dict = field(default_factory=dict)

    def row(self, row_id: str) -> Row:
        return next(r for r in self.rows if r.id == row_id)


def _err(path: str, where: str, what: str) -> SuiteError:
    return SuiteError(f'suite file {path}: {where}: {what}')


def _number(value, path: str, where: str, fix: str, integer: bool = False, positive: bool = False) -> float | int:
    """A number (an int where `integer`; 3e5 as JSON writes it is accepted for an int), or SuiteError."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and integer:
        ok = float(value).is_integer()
        value = int(value) if ok else value
    if ok and positive:
        ok = value > 0
    if not ok:
        kind = 'a positive integer' if integer and positive else 'an integer' if integer else \
            'a positive number' if positive else 'a number'
        raise _err(path, where, f'expected {kind}, got {json.dumps(value)}; {fix}')
    return value


def _text(value, path: str, where: str, fix: str, empty: bool = True) -> str:
    if not isinstance(value, str) or (not empty and not value.strip()):
        raise _err(path, where, f'expected {"a string" if empty else "a non-empty string"}, got {json.dumps(value)}; '
                   f'{fix}')
    return value


def _keys(obj, allowed: tuple, path: str, where: str) -> None:
    if not isinstance(obj, dict):
        raise _err(path, where, f'expected an object, got {json.dumps(obj)[:60]}')
    for key in obj:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ''
            raise _err(path, f'{where}.{key}' if where else key,
                       f"unknown key ({hint}the keys there: {', '.join(allowed)})")


def _score(value, path: str, where: str) -> str:
    if value not in SCORES:
        raise _err(path, where, f'unknown score {json.dumps(value)}; the scores: {", ".join(SCORES)}')
    return value


def _resources(value, path: str, where: str) -> dict:
    if not isinstance(value, dict) or set(value) - {'cpu', 'gpu'}:
        raise _err(path, where, f'expected {{"cpu": N, "gpu": N}} (what each trial reserves on Ray), got '
                   f'{json.dumps(value)[:60]}')
    for key, n in value.items():
        if not isinstance(n, (int, float)) or isinstance(n, bool) or n < 0 or (key == 'cpu' and n == 0):
            raise _err(path, f'{where}.{key}', f'expected a number {">" if key == "cpu" else ">="} 0, got '
                       f'{json.dumps(n)}')
    return dict(value)


def _reference(obj, path: str, where: str) -> Reference:
    _keys(obj, REFERENCE_KEYS, path, where)
    for key in ('value', 'source'):
        if key not in obj:
            raise _err(path, f'{where}.{key}', 'missing; a reference is a published value with its source '
                       '(e.g. "SLM-Lab v5 docs/BENCHMARKS.md at 96be393")')
    return Reference(
        value=float(_number(obj['value'], path, f'{where}.value', 'give the published score')),
        source=_text(obj['source'], path, f'{where}.source', 'say where the value is published', empty=False),
        max_frame=None if obj.get('max_frame') is None else _number(
            obj['max_frame'], path, f'{where}.max_frame', "give the reference's frame budget", True, True),
        score=None if obj.get('score') is None else _text(obj['score'], path, f'{where}.score',
                                                          'name its definition (a score name or words)'),
        seeds=None if obj.get('seeds') is None else _number(obj['seeds'], path, f'{where}.seeds',
                                                            'give how many seeds the reference averages', True, True),
        note=_text(obj.get('note', ''), path, f'{where}.note', 'a note is text'))


def _row(obj, i: int, path: str, defaults: dict) -> Row:
    where = f'rows[{i}]'
    _keys(obj, ROW_KEYS, path, where)
    for key in ('spec_file', 'spec_name', 'max_frame'):
        if key not in obj:
            raise _err(path, f'{where}.{key}', 'missing; every row names its spec_file, spec_name and max_frame '
                       '(the frames each seed trains)')
    spec_file = _text(obj['spec_file'], path, f'{where}.spec_file', 'give the path of a spec file', empty=False)
    spec_name = _text(obj['spec_name'], path, f'{where}.spec_name', 'give the name of a spec in that file', empty=False)
    row_id = _text(obj.get('id', spec_name), path, f'{where}.id', 'give a name for the row', empty=False)
    if not NAME.match(row_id):
        raise _err(path, f'{where}.id', f'{json.dumps(row_id)}: use letters, digits, _ . - only (it names the row '
                   'in --rows and in file names)')
    sets = obj.get('set', {})
    if not isinstance(sets, dict) or not all(isinstance(k, str) for k in sets):
        raise _err(path, f'{where}.set', f'expected an object {{"key.path": value}}, got {json.dumps(sets)[:60]}')
    for key in sets:
        if key == 'env.max_frame' or key in ('meta.random_seed', 'meta.max_session'):
            raise _err(path, f'{where}.set.{key}', 'set by the benchmark itself (max_frame, the seeds, one session '
                       'per seed): remove it from set' + ('; give the row\'s max_frame instead'
                                                          if key == 'env.max_frame' else ''))
    refs = obj.get('references', [])
    if not isinstance(refs, list):
        raise _err(path, f'{where}.references', f'expected a list of references, got {json.dumps(refs)[:60]}')
    return Row(
        id=row_id, spec_file=spec_file, spec_name=spec_name,
        max_frame=_number(obj['max_frame'], path, f'{where}.max_frame', 'give the frames each seed trains, e.g. '
                          '300000', True, True),
        seeds=_seeds(obj.get('seeds', defaults['seeds']), path, f'{where}.seeds'),
        score=_score(obj.get('score', defaults['score']), path, f'{where}.score'),
        env=_text(obj.get('env', ''), path, f'{where}.env', 'an env label is text'),
        algorithm=_text(obj.get('algorithm', ''), path, f'{where}.algorithm', 'an algorithm label is text'),
        set=dict(sets),
        resources=_resources(obj['resources'], path, f'{where}.resources') if 'resources' in obj
        else dict(defaults['resources']),
        random_score=None if obj.get('random_score') is None else float(
            _number(obj['random_score'], path, f'{where}.random_score', "give a random policy's score")),
        references=tuple(_reference(r, path, f'{where}.references[{j}]') for j, r in enumerate(refs)),
        note=_text(obj.get('note', ''), path, f'{where}.note', 'a note is text'))


def _seeds(value, path: str, where: str) -> int:
    n = _number(value, path, where, f'give the number of seeds (1 to {MAX_SEEDS}; SLM-Lab used 4)', True, True)
    if n > MAX_SEEDS:
        raise _err(path, where, f'{n} seeds: at most {MAX_SEEDS}')
    return n


def parse_suite(data, path: str) -> Suite:
    """A Suite from a suite file's content (checked; SuiteError names the first mistake)."""
    _keys(data, SUITE_KEYS, path, '')
    if 'name' not in data:
        raise _err(path, 'name', 'missing; name the suite (it names the benchmark directory data/{name}_{timestamp})')
    name = _text(data['name'], path, 'name', 'give a plain name', empty=False)
    if not NAME.match(name):
        raise _err(path, 'name', f'{json.dumps(name)}: use letters, digits, _ . - only (it names the benchmark '
                   'directory)')
    defaults = {'seeds': _seeds(data.get('seeds', DEFAULT_SEEDS), path, 'seeds'),
                'score': _score(data.get('score', 'slm_ma'), path, 'score'),
                'resources': _resources(data.get('resources', {'cpu': 1}), path, 'resources')}
    rows = data.get('rows')
    if not isinstance(rows, list) or not rows:
        raise _err(path, 'rows', 'expected a non-empty list of rows ({"spec_file": ..., "spec_name": ..., '
                   '"max_frame": ...})')
    parsed = tuple(_row(r, i, path, defaults) for i, r in enumerate(rows))
    seen: dict[str, int] = {}
    for i, r in enumerate(parsed):
        if r.id in seen:
            raise _err(path, f'rows[{i}].id', f'{json.dumps(r.id)} is also rows[{seen[r.id]}]\'s id; give each row an '
                       'id of its own (a spec run twice needs two ids)')
        seen[r.id] = i
    return Suite(name=name, path=path, rows=parsed,
                 description=_text(data.get('description', ''), path, 'description', 'a description is text'),
                 resources=defaults['resources'])


def read_suite(path: str) -> Suite:
    """Read and check a suite file (JSON or YAML, as the spec reader reads them)."""
    from slm_lab.spec.read import read_spec_file  # noqa: PLC0415 yaml: only when a suite is read
    if not isinstance(path, (str, os.PathLike)):
        raise SuiteError(f'suite file {path!r}: give the path of a JSON or YAML suite file')
    path = os.fspath(path)
    if not os.path.isfile(path):
        where = 'is a directory' if os.path.isdir(path) else f'not found (in {os.getcwd()})'
        raise SuiteError(f'suite file {path} {where}; give the path of a JSON or YAML suite file, e.g. '
                         'spec/benchmark/suites/slm_lab_v5_cpu.json')
    try:
        data = read_spec_file(path)
    except SpecError as e:
        raise SuiteError(str(e).replace(f'spec file {path}', f'suite file {path}', 1)
                         .replace('mapping spec names to specs', 'holding a suite (name, rows)')) from None
    return parse_suite(data, path)


def select(suite: Suite, rows: list[str] | None = None, seeds: int | None = None) -> Suite:
    """The suite narrowed to `rows` (row ids, env labels or algorithm labels; all when None) with
    `seeds` seeds per row (each row's own when None)."""
    chosen = list(suite.rows)
    if rows:
        unknown = [r for r in rows if not any(r in (row.id, row.env, row.algorithm) for row in suite.rows)]
        if unknown:
            raise SuiteError(f'--rows {",".join(unknown)}: no row of {suite.path} has that id, env or algorithm; its '
                             f'rows: {", ".join(r.id for r in suite.rows)}')
        chosen = [row for row in suite.rows if any(r in (row.id, row.env, row.algorithm) for r in rows)]
    if seeds is not None:
        if isinstance(seeds, bool) or not isinstance(seeds, int) or not 1 <= seeds <= MAX_SEEDS:
            raise SuiteError(f'--seeds {seeds!r}: give the number of seeds per row, 1 to {MAX_SEEDS}')
        chosen = [Row(**{**row.__dict__, 'seeds': seeds}) for row in chosen]
    return Suite(name=suite.name, path=suite.path, rows=tuple(chosen), description=suite.description,
                 resources=suite.resources)


def suite_to_dict(suite: Suite) -> dict:
    """The suite as its file would hold it (what the benchmark directory keeps)."""
    def row(r: Row) -> dict:
        out = {k: v for k, v in r.__dict__.items() if k != 'references'}
        out['references'] = [ref.__dict__.copy() for ref in r.references]
        return out
    return {'name': suite.name, 'description': suite.description, 'resources': suite.resources,
            'rows': [row(r) for r in suite.rows]}


FOLDER = 'benchmark'  # a benchmark directory's own files: suite.json, plan.json, the report


def is_benchmark_run(root: Path) -> bool:
    """Whether `root` is a directory a benchmark made (its plan is in root/benchmark/)."""
    return (root / FOLDER / 'plan.json').is_file()


def read_saved(root: Path) -> tuple[Suite, list[dict]]:
    """The suite and plan a benchmark directory holds (root/benchmark/suite.json, plan.json);
    OSError, ValueError or SuiteError when they cannot be read."""
    path = root / FOLDER / 'suite.json'
    suite = parse_suite(json.loads(path.read_text(encoding='utf-8')), str(path))
    plan = json.loads((root / FOLDER / 'plan.json').read_text(encoding='utf-8'))
    if not isinstance(plan, list):
        raise ValueError(f'{root / FOLDER / "plan.json"} holds no list of trials')
    return suite, plan
