"""The lab from Python (a notebook, a script): `slm_lab.run`, the same checks, modes and errors as
the command line, with the run directory and metrics returned instead of printed."""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slm_lab.lib.errors import SpecError
from slm_lab.lib.io import DICT_SPEC_PREFIX
from slm_lab.options import check_run_options


@dataclass(frozen=True)
class RunResult:
    """What `slm_lab.run` returns.

    run_dir: the run directory (data/{spec_name}_{timestamp}); its files are described in
        docs/run-directory.md.
    metrics: for train and dev, the trial metrics (a dict: `scalar` holds final_return_ma,
        strength, ...; as info/{spec_name}_t0_trial_metrics.json); for search, the experiment
        dataframe (one row per trial); None when train@ found the run already finished.
    """

    run_dir: Path
    metrics: Any


def plain(value: Any, what: str) -> Any:
    """`value` as JSON values only, numpy's scalars and arrays as Python numbers and lists (a
    notebook's np.float32(3e-4) is a number); SpecError naming `what` and the key path of the first
    value that is no spec value, of an object that contains itself, or of nesting deeper than a
    spec file may nest. Walked without recursion, so any depth or cycle is caught."""
    # the spec reader's limits, a spec file's; its package imports gymnasium: not at `import slm_lab`
    from slm_lab.spec.read import MAX_SPEC_DEPTH, MAX_SPEC_VALUES  # noqa: PLC0415 (spec.read imports yaml: not at `import slm_lab`)
    count = 0
    stack = [(value, '', ())]
    while stack:
        node, path, inside = stack.pop()
        count += 1
        if count > MAX_SPEC_VALUES:
            raise SpecError(f'{what}: more than {MAX_SPEC_VALUES} values; a spec holds settings, not data')
        where = f'{what}: {path}' if path else what
        if isinstance(node, (dict, list, tuple)):
            if id(node) in inside:
                raise SpecError(f'{where} contains itself (an object that refers to one holding it); a spec must be '
                                'a tree of JSON values')
            if len(inside) >= MAX_SPEC_DEPTH:
                parts = path.split('.')
                short = '.'.join(parts[:4]) + ('...' if len(parts) > 4 else '')  # as the spec file reader says it
                raise SpecError(f'{what}: {short} nests objects or lists more than {MAX_SPEC_DEPTH} deep, which no '
                                'spec does; flatten it')
            inside = inside + (id(node),)
        if isinstance(node, dict):
            for key, item in node.items():
                if not isinstance(key, str):
                    raise SpecError(f'{where}{"." if path else ": "}{key!r}: keys must be strings, got '
                                    f'{type(key).__name__}')
                stack.append((item, f'{path}.{key}' if path else key, inside))
        elif isinstance(node, (list, tuple)):
            stack.extend((item, f'{path}[{i}]', inside) for i, item in enumerate(node))
        elif not (node is None or isinstance(node, (str, bool, int, float)) or _is_numpy(node)):
            raise SpecError(f'{where}: {type(node).__name__} {repr(node)[:60]} is not a spec value (string, number, '
                            'boolean, null, list or object)')
    try:
        return json.loads(json.dumps(value, default=_numpy_to_python))
    except (TypeError, ValueError, AttributeError) as e:  # inside a numpy array of objects or dates
        raise SpecError(f'{what}: holds a value that is no spec value ({e}); give numbers, strings, booleans, '
                        'null, lists and objects') from None


def _is_numpy(value: Any) -> bool:
    """A numpy scalar (np.float32, np.int64, np.bool_, np.str_) or array (0-d ones too), told by
    its type's module so that numpy need not be imported."""
    return type(value).__module__ == 'numpy' and hasattr(value, 'tolist')


def _numpy_to_python(value: Any) -> Any:
    """json.dumps's fallback: numpy's numbers, bools and arrays as Python's (np.bool_ stays a bool,
    never a number); plain() has refused anything else."""
    return value.tolist()


def _overrides(overrides: Any) -> list[str]:
    """The overrides as the command line's --set strings; SpecError for what is neither a list of
    'KEY=VALUE' strings nor a dict {key: value}."""
    if overrides is None:
        return []
    if isinstance(overrides, dict):
        out = []
        for key, value in overrides.items():
            if not isinstance(key, str):
                raise SpecError(f'overrides: key {key!r} is not a string; give dotted key paths, e.g. '
                                '{"env.max_frame": 20000}')
            value = plain(value, f'overrides: {key}')
            out.append(f'{key}={value if isinstance(value, str) else json.dumps(value)}')
        return out
    if isinstance(overrides, (list, tuple)):
        for i, item in enumerate(overrides):
            if not isinstance(item, str):
                raise SpecError(f'overrides[{i}]: {item!r} is not a string; give "KEY=VALUE" strings as --set takes '
                                'them, or a dict {key: value}')
        return list(overrides)
    raise SpecError(f'overrides: give a list of "KEY=VALUE" strings (as --set takes them) or a dict {{key: value}}, '
                    f'not {type(overrides).__name__} {repr(overrides)[:60]}')


def _spec_file(spec: str | os.PathLike | dict, spec_name: str | None, tmp: str) -> tuple[str, str]:
    """(spec file, spec name) for what `run` was given; a dict is written to a JSON file in `tmp`."""
    if isinstance(spec, (str, os.PathLike)):
        path = os.fspath(spec)
        if spec_name is None:
            from slm_lab.spec.read import read_spec_file  # noqa: PLC0415 yaml: not at `import slm_lab`
            names = list(read_spec_file(path))
            if len(names) != 1:
                raise SpecError(f'spec file {path} holds {len(names)} specs ({", ".join(names[:10])}); '
                                'give spec_name= to pick one')
            spec_name = names[0]
        return path, spec_name
    if not isinstance(spec, dict):
        raise SpecError(f'spec: give a spec file path or a spec dict, not {type(spec).__name__}')
    spec = plain(spec, 'spec')
    if 'agent' in spec or 'env' in spec:  # one spec's body: the name comes from spec_name
        if spec_name is None:
            raise SpecError("spec is a spec's body (it has agent/env keys): give spec_name= to name it")
        spec = {spec_name: spec}
    elif spec_name is None:
        if len(spec) != 1:
            raise SpecError(f'spec dict holds {len(spec)} specs ({", ".join(map(str, list(spec)[:10]))}); '
                            'give spec_name= to pick one')
        spec_name = next(iter(spec))
    path = os.path.join(tmp, f'{spec_name}.json' if isinstance(spec_name, str) and '/' not in spec_name
                        else 'spec.json')
    with open(path, 'w', encoding='utf-8') as f:
        json.dump(spec, f)
    return path, spec_name


def run(spec: str | os.PathLike | dict, spec_name: str | None = None, mode: str = 'train',
        overrides: list[str] | dict[str, Any] | None = None, data_dir: str = 'data', *, force: bool = False,
        ray_address: str | None = None, keep: int | None = None, fork: str | os.PathLike | None = None,
        frame: int | None = None, warm_start: str | os.PathLike | None = None,
        ckpt: str | None = None, run_dir: str | os.PathLike | None = None) -> RunResult:
    """Run a spec as `slm-lab run SPEC_FILE SPEC_NAME MODE --set KEY=VALUE ...` does.

    spec: a spec file's path (JSON or YAML), or a dict: either a file's content ({name: spec}; with
        one spec, spec_name may be left out) or one spec's body ({"agent": ..., "env": ..., "meta": ...},
        named by spec_name).
    spec_name: the spec to run; may be left out when the file or dict holds one spec.
    mode: dev, train, train@latest, train@<run dir>, search, search@latest, search@<run dir>
        (enjoy@ is the command line's only).
    overrides: ["env.max_frame=20000", ...] as --set takes them, or {"env.max_frame": 20000}
        (each value written as JSON).
    data_dir: where run directories are made (and train@latest looks).
    fork, frame: a new run continuing from the snapshots of the run directory `fork` (at `frame`,
        default each session's newest), as `--fork RUN_DIR --frame N` (docs/fork.md).
    warm_start, ckpt: a fresh run whose nets start from the weights of the run directory
        `warm_start` ('best' or 'latest'), as `--warm-start RUN_DIR --ckpt best`.
    run_dir: mode train in this directory, as `--run-dir DIR`: a new run there the first time,
        that run continued on later calls, metrics None at once when it is finished.

    Returns a RunResult(run_dir, metrics). Raises the lab's own exceptions: a LabError subclass
    (SpecError, ModeError, ResumeError, ...) for what the command line prints as one `error:`
    line (nothing is written then), TrainingDiverged, and Preempted when a signal stopped the run
    after saving a snapshot.
    """
    # the arguments first, as the command line parses its own before importing the lab
    check_run_options(mode, force=force, fork=fork, frame=frame, warm_start=warm_start, ckpt=ckpt,
                      ray_address=ray_address, keep=keep, run_dir=run_dir)
    if mode.startswith('enjoy@'):
        raise SpecError(f"mode '{mode}': replay from the command line: slm-lab run {mode}")
    overrides = _overrides(overrides)
    from slm_lab import lab  # noqa: PLC0415 the lab's modules: imported at the first run, so that import slm_lab stays cheap
    new_run = not mode.startswith(('train@', 'search@')) or fork is not None or warm_start is not None
    data_dir = lab.check_data_dir(data_dir, new_run=new_run)
    found: list = []
    with tempfile.TemporaryDirectory(prefix=DICT_SPEC_PREFIX) as tmp:
        spec_file, name = _spec_file(spec, spec_name, tmp)
        if fork is not None or warm_start is not None or frame is not None or ckpt is not None:
            from slm_lab import branch  # noqa: PLC0415 imports lab (gymnasium): not at `import slm_lab`
            metrics = branch.run(spec_file, name, mode, overrides, data_dir,
                                 fork_from=None if fork is None else os.fspath(fork), frame=frame,
                                 warm_start_from=None if warm_start is None else os.fspath(warm_start), ckpt=ckpt,
                                 on_run_dir=found.append)
        else:
            metrics = lab.run(spec_file, name, mode, overrides, data_dir=data_dir, force=force,
                              ray_address=ray_address, keep=keep, on_run_dir=found.append,
                              run_dir=None if run_dir is None else os.fspath(run_dir))
    return RunResult(run_dir=Path(found[-1].root), metrics=metrics)


@dataclass(frozen=True)
class BenchmarkResult:
    """What `slm_lab.benchmark` returns.

    run_dir: the benchmark directory (data/{suite}_{timestamp}; docs/benchmark.md).
    report: the report in Markdown (as benchmark/report.md holds it).
    files: the report's files: report.md, report.csv, scores.csv and the rows' graphs.
    """

    run_dir: Path | None
    report: str
    files: list


def benchmark(suite_file: str | os.PathLike, mode: str = 'benchmark', rows: list[str] | None = None,
              seeds: int | None = None, data_dir: str = 'data', *, ray_address: str | None = None,
              graphs: bool = True, missing_from: str | os.PathLike | None = None) -> BenchmarkResult:
    """Run a suite file as `slm-lab benchmark SUITE_FILE [MODE] --rows ... --seeds N` does.

    mode: benchmark (a new one), benchmark@latest (continue the newest of this suite in data_dir)
        or benchmark@<benchmark dir>.
    rows: row ids (or env / algorithm labels) to run, default all; seeds: seeds per row, default
        each row's. Both for a new benchmark only.
    ray_address: a Ray cluster's HOST:PORT (default RAY_ADDRESS, else a local Ray).
    graphs: draw each row's learning-curve graph (HTML).
    missing_from: a folder of published results (slm_lab.publish): only the row-seeds not in it
        run; when none is missing, nothing runs and run_dir is None.

    Raises SuiteError (a LabError) for a suite that cannot run, before anything is written;
    Preempted when a signal stopped it (its running trials saved snapshots: continue with
    benchmark@latest); a LabError naming the row-seeds that failed, after the report is written."""
    if isinstance(rows, str):  # 'a,b' as --rows takes it
        rows = [r.strip() for r in rows.split(',') if r.strip()]
    check_run_options(mode, ray_address=ray_address, rows=rows, seeds=seeds, missing_from=missing_from)
    from slm_lab import benchmark_mode  # noqa: PLC0415 the lab's modules: imported at the first run (import slm_lab stays cheap)
    done = benchmark_mode.benchmark(os.fspath(suite_file), mode, rows, seeds, data_dir=data_dir,
                                    ray_address=ray_address, graphs=graphs,
                                    missing_from=None if missing_from is None else os.fspath(missing_from))
    return BenchmarkResult(run_dir=None if done['run_dir'] is None else Path(done['run_dir']), report=done['report'],
                           files=done['files'])


@dataclass
class PublishResult:
    """What `slm_lab.publish` returns.

    report: the report over every published seed, in Markdown (as FOLDER/report.md holds it).
    files: the files written.
    left_out: row-seeds not published, each with why (published before from another benchmark).
    """

    report: str
    files: list
    left_out: list


def publish(benchmarks, to: str | os.PathLike, data_dir: str = 'data') -> PublishResult:
    """Publish the finished row-seeds of benchmark directories into a folder of small files, as
    `slm-lab publish BENCHMARK_DIR ... --to FOLDER` does (slm_lab/experiment/benchmark/publish.py):
    each seed's score, source and learning curve, and the report over every published seed.
    benchmarks: one directory or a list; data_dir: where random baselines are cached."""
    if isinstance(benchmarks, (str, os.PathLike)):
        benchmarks = [benchmarks]
    from slm_lab.experiment.benchmark.publish import publish as publish_seeds  # noqa: PLC0415 kept out of import slm_lab
    text, files, notes = publish_seeds([os.fspath(b) for b in benchmarks], os.fspath(to), data_dir)
    return PublishResult(report=text, files=files, left_out=notes)
