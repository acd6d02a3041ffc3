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


def _spec_file(spec: str | os.PathLike | dict, spec_name: str | None, tmp: str) -> tuple[str, str]:
    """(spec file, spec name) for what `run` was given; a dict is written to a JSON file in `tmp`."""
    if isinstance(spec, (str, os.PathLike)):
        path = os.fspath(spec)
        if spec_name is None:
            from slm_lab.spec.read import read_spec_file  # yaml: not at `import slm_lab`
            names = list(read_spec_file(path))
            if len(names) != 1:
                raise SpecError(f'spec file {path} holds {len(names)} specs ({", ".join(names[:10])}); '
                                'give spec_name= to pick one')
            spec_name = names[0]
        return path, spec_name
    if not isinstance(spec, dict):
        raise SpecError(f'spec: give a spec file path or a spec dict, not {type(spec).__name__}')
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
    from slm_lab import lab  # the lab's modules: imported at the first run, so that import slm_lab stays cheap
    if isinstance(overrides, dict):
        overrides = [f'{key}={value if isinstance(value, str) else json.dumps(value)}'
                     for key, value in overrides.items()]
    if mode.startswith('enjoy@'):
        raise SpecError(f"mode '{mode}': replay from the command line: slm-lab run {mode}")
    found: list = []
    with tempfile.TemporaryDirectory(prefix='slm_lab_spec_') as tmp:
        spec_file, name = _spec_file(spec, spec_name, tmp)
        if fork is not None or warm_start is not None or frame is not None or ckpt is not None:
            from slm_lab import branch  # imports lab (gymnasium): not at `import slm_lab`
            metrics = branch.run(spec_file, name, mode, list(overrides or []), data_dir,
                                 fork_from=None if fork is None else os.fspath(fork), frame=frame,
                                 warm_start_from=None if warm_start is None else os.fspath(warm_start), ckpt=ckpt,
                                 on_run_dir=found.append)
        else:
            metrics = lab.run(spec_file, name, mode, list(overrides or []), data_dir=data_dir, force=force,
                              ray_address=ray_address, keep=keep, on_run_dir=found.append,
                              run_dir=None if run_dir is None else os.fspath(run_dir))
    return RunResult(run_dir=Path(found[-1].root), metrics=metrics)
