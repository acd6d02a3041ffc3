"""Resolving train@latest / train@<run dir>: the run directory, its saved spec and resume logs,
the lock that keeps other processes off it, and each session's newest intact snapshot, read once
(lab.py hands what it read to the sessions that continue from it). The checks of an edited spec
are in edits.py."""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import ResumeError, SpecError
from slm_lab.lib.io import append_json_list, is_dict_spec, read_json
from slm_lab.persistence.run_dir import SUBDIRS, RunDir, is_search_run
from slm_lab.persistence.snapshot import list_snapshots
from slm_lab.persistence.snapshots import load_latest_snapshot
from slm_lab.persistence.snapshots import Snapshot
from slm_lab.spec import validate_spec

logger = lab_logger.get_logger('slm_lab.resume')


def _runs_of(spec_name: str, data_dir: str) -> list[Path]:
    pattern = re.compile(re.escape(spec_name) + r'_\d{4}_\d{2}_\d{2}_\d{6}$')
    root = Path(data_dir)
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and pattern.match(p.name)), key=lambda p: p.name[-17:])


def _run_meta(root: Path, spec_name: str) -> dict:
    """The meta of a run's saved spec ({} when it cannot be read: read_run_spec says why)."""
    try:
        meta = read_json(root / f'{spec_name}_spec.json')['meta']
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return meta if isinstance(meta, dict) else {}


def resolve_run_dir(target: str, spec_name: str, data_dir: str, mode: str = 'train',
                    label: str | None = None, spec_file: str | None = None) -> RunDir:
    """The run directory named by {mode}@<target>: 'latest' (newest run of spec_name of that
    kind, by the timestamp in its name) or a path. train@ continues train runs and search@
    searches; each refuses the other's run directory, which it would damage. `label` names the
    option in errors (default {mode}@{target}; e.g. '--fork DIR'). With `spec_file`, 'latest' is
    the newest such run made from that file, where there is one: two files may name a spec
    alike (SLM-Lab's ppo_cartpole and the demo's), and a run of the other is not this one's."""
    search = mode == 'search'
    said = label or f'{mode}@{target}'
    if target == 'latest':  # dev runs are debugging runs: resume them only by name
        runs = {}  # run directory -> its saved spec's meta, oldest first
        for r in _runs_of(spec_name, data_dir):
            if not (r / f'{spec_name}_spec.json').is_file():
                # killed while it was being created: it never started, so there is nothing to resume
                logger.warning(f'{mode}@latest: skipping {r}: it has no {spec_name}_spec.json (a run that never '
                               'started); remove it when no process is creating it')
            elif is_search_run(r) == search and (meta := _run_meta(r, spec_name)).get('mode') != 'dev':
                runs[r] = meta
        if not runs:
            raise ResumeError(f"{said}: no {'search' if search else 'run'} of spec '{spec_name}' in "
                              f'{data_dir}/; start one with: python run_lab.py SPEC_FILE {spec_name} {mode}')
        root = list(runs)[-1] if spec_file is None else _newest_of_file(runs, spec_name, spec_file, said)
    else:
        root = Path(target.rstrip('/') or '/')
        try:
            exists = root.is_dir()
        except OSError:  # a name too long for the filesystem, a loop of links: no run directory either
            exists = False
        if not exists:
            beside = Path(data_dir) / root
            try:
                named = not root.is_absolute() and beside.is_dir()  # the name of a run, without data/
            except OSError:
                named = False
            if named:
                meant = (f'{label[:-len(target)]}{beside}' if label is not None and label.endswith(target)
                         else f'{mode}@{beside}')
                raise ResumeError(f'{said}: no such run directory here; did you mean {meant}?')
            runs = ', '.join(str(p) for p in _runs_of(spec_name, data_dir)) or 'none'
            raise ResumeError(f'{said}: no such run directory; runs of {spec_name}: {runs}')
    run_dir = RunDir(root, spec_name)
    if not run_dir.spec_path().is_file():
        runs = ', '.join(str(p) for p in _runs_of(spec_name, data_dir)) or 'none'
        raise ResumeError(f'{said}: {root} is not a run of spec {spec_name} '
                          f'(no {run_dir.spec_path().name}); runs of {spec_name}: {runs}')
    if is_search_run(root) != search:
        other = 'train' if search else 'search'
        raise ResumeError(f'{said}: {root} is a {"train run" if search else "search"}, not a '
                          f'{"search" if search else "train run"}; continue it with {other}@{target}')
    return run_dir


def run_spec_file(root: Path, spec_name: str, meta: dict | None = None) -> str | None:
    """The spec file a run was made from (its saved spec's meta.spec_file, `meta` where read
    already), or None."""
    spec_file = (_run_meta(root, spec_name) if meta is None else meta).get('spec_file')
    return spec_file if isinstance(spec_file, str) else None


def shown_path(path: str | None) -> str | None:
    """`path` as a message shows it: relative to the working directory when it lies under it."""
    if path is None:
        return None
    rel = os.path.relpath(path)
    return path if rel.startswith('..') else rel


def same_file(a: str | None, b: str) -> bool:
    """Whether path `a` (as a run recorded it) names the file `b`."""
    return a is not None and os.path.realpath(a) == os.path.realpath(b)


def _newest_of_file(runs: dict[Path, dict], spec_name: str, spec_file: str, said: str) -> Path:
    """The newest of `runs` ({run directory: its saved meta}, oldest first) made from `spec_file`;
    the newest of all, said, where none was (a run made before the repository moved, or by
    another file of the same spec name: the checks of the spec's edits then tell whether it
    continues)."""
    newest = list(runs)[-1]
    if is_dict_spec(spec_file):  # a spec dict given to slm_lab.run has no file to tell its runs by
        return newest
    mine = [r for r, meta in runs.items() if same_file(run_spec_file(r, spec_name, meta), spec_file)]
    newest_from = shown_path(run_spec_file(newest, spec_name, runs[newest])) or 'a file it did not record'
    if mine and mine[-1] != newest:
        logger.info(f'{said}: {mine[-1]}, the newest run of {spec_name} made from {shown_path(spec_file)} '
                    f'({newest}, newer, was made from {newest_from})')
    elif not mine:
        logger.warning(f'{said}: no run of {spec_name} here was made from {shown_path(spec_file)}; taking the newest, '
                       f'{newest}, made from {newest_from}')
    return mine[-1] if mine else newest


TRIAL_TARGET = re.compile(r't(\d+)')


def resolve_trial(target: str, label: str) -> tuple[RunDir, int, dict]:
    """A trained trial of any run, whatever its spec name: RUN_DIR (a train run: its trial 0) or
    RUN_DIR/tN (trial N of a search). Returns (the run directory, named by its own spec name; the
    trial; the trial's saved spec). `label` names the option in errors (e.g. '--warm-start DIR')."""
    root, trial = Path(target.rstrip('/') or '/'), None
    m = TRIAL_TARGET.fullmatch(root.name)
    if m and not root.is_dir():
        root, trial = root.parent, int(m[1])
    if not root.is_dir():
        raise ResumeError(f'{label}: no such run directory (give a run directory, or RUN_DIR/t3 for trial 3 of a '
                          'search)')
    names = []
    for path in root.glob('*_spec.json'):  # the run's spec: {spec_name}_spec.json, its meta naming it
        try:
            meta = read_json(path).get('meta') or {}
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(meta, dict) and f"{meta.get('spec_name')}_spec.json" == path.name:
            names.append(meta['spec_name'])
    if len(names) != 1:
        raise ResumeError(f'{label}: {root} is not a run directory (no {{spec_name}}_spec.json naming its spec)')
    run_dir = RunDir(root, names[0])
    if is_search_run(root):
        trials = sorted(int(p.name[len(names[0]) + 2:-len('_spec.json')]) for p in
                        root.glob(f'{glob_escape(names[0])}_t*_spec.json')
                        if re.fullmatch(re.escape(names[0]) + r'_t\d+_spec\.json', p.name))
        if trial is None or trial not in trials:
            said = 'is a search' if trial is None else f'has no trial {trial}'
            raise ResumeError(f'{label}: {root} {said}; give one of its trials, {root}/tN; its trials: '
                              + (', '.join(f't{t}' for t in trials) or 'none yet'))
    elif trial not in (None, 0):
        raise ResumeError(f'{label}: {root} is a train run, with trial 0 only: give {root}')
    trial = trial or 0
    path = run_dir.spec_path(trial)
    try:
        spec = read_json(path)
        sessions = spec['meta']['max_session']
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ResumeError(f"{path}: cannot read the trial's spec ({type(e).__name__}: {e}); restore it or give "
                          'another run') from None
    if not isinstance(sessions, int) or isinstance(sessions, bool) or sessions < 1:
        raise ResumeError(f'{path}: meta.max_session is {sessions!r}, not a count of sessions; restore the file')
    return run_dir, trial, spec


def glob_escape(text: str) -> str:
    """`text` with glob's special characters taken literally."""
    return re.sub(r'([*?\[])', r'[\1]', text)


def read_run_spec(run_dir: RunDir) -> dict:
    """The run's saved spec, checked to be a valid spec; ResumeError naming the file otherwise."""
    path = run_dir.spec_path()
    try:
        spec = read_json(path)
    except (OSError, ValueError) as e:
        raise ResumeError(f"{path}: cannot read the run's spec ({e}); the run cannot be resumed without it") from None
    problem = None
    if not isinstance(spec, dict):
        problem = f'expected a JSON object, got {type(spec).__name__}'
    else:
        for key in ('agent', 'env', 'meta'):
            if not isinstance(spec.get(key), dict):
                problem = f'"{key}" is missing or not an object'
                break
    if problem is None:
        try:
            validate_spec({k: v for k, v in spec.items() if k != 'name'}, run_dir.spec_name)
        except SpecError as e:
            problem = str(e)
        else:
            meta = spec['meta']
            for key, types in (('random_seed', int), ('experiment_ts', str), ('max_session', int)):
                if not isinstance(meta.get(key), types) or isinstance(meta.get(key), bool):
                    problem = f'meta.{key} is missing or not a {types.__name__}'
                    break
            if problem is None and not isinstance(meta.get('overrides') or [], list):
                problem = 'meta.overrides is not a list'
    if problem:
        raise ResumeError(f"{path}: the run's saved spec is damaged or not valid for this lab ({problem}); "
                          f"restore it from the trial's spec ({run_dir.spec_name}_t0_spec.json holds the same "
                          "spec; a session's spec records that session's own seed) or start a new run")
    return spec


def check_resume_logs(run_dir: RunDir, max_session: int) -> None:
    """The run's and each session's resume logs must be JSON lists (they are appended to)."""
    paths = [run_dir.resume_log_path()] + [run_dir.session_resume_log_path(0, s) for s in range(max_session)]
    for path in paths:
        if not path.exists():
            continue
        try:
            records = read_json(path)
        except (OSError, ValueError) as e:
            records = e
        if not isinstance(records, list):
            raise ResumeError(f'{path}: not a JSON list of resume records (damaged); it is only a log: move it '
                              'away and resume again')


# a session's log line of a training record (experiment/session.py, Session.log_row):
# 'trial 0 session 0 | frame 1000/100000 | fps ...'
LOGGED_ROW = re.compile(r'\| frame (\d+)/\d+ \|')


def session_has_progress(run_dir: RunDir, session: int) -> list[str]:
    """What a session has recorded on disk: its progress, which a fresh start would overwrite or
    contradict. Empty when the session never got past its start. Its records (CSV rows), weights
    and snapshot directories are the progress itself; when those were deleted, what the session
    wrote about them still tells: its resume log, its TensorBoard events (written from its rows),
    its log's record lines and the run's resume log naming a frame it had reached."""
    found = []
    for df_mode in ('train', 'eval'):
        path = run_dir.session_df_path(0, session, df_mode)
        try:
            text = path.read_bytes()
        except OSError:
            continue
        try:
            if sum(1 for line in text.decode('utf-8').splitlines() if line.strip()) > 1:  # a header and a row
                found.append(str(path))
        except UnicodeDecodeError:  # damaged, and still what a fresh start would overwrite
            found.append(f'{path}, damaged: not UTF-8 text')
    for which in ('latest', 'best'):
        if run_dir.model_path(0, session, which).exists():
            found.append(str(run_dir.model_path(0, session, which)))
    ckpt = run_dir.ckpt_dir(0, session)
    found += [str(p) for p in list_snapshots(ckpt)]
    if ckpt.is_dir():  # snapshots set aside as damaged are progress too
        found += [str(p) for p in sorted(ckpt.glob('f*.damaged*'))]
    if run_dir.session_resume_log_path(0, session).exists():  # it resumed from a snapshot once
        found.append(str(run_dir.session_resume_log_path(0, session)))
    tb = run_dir.tb_dir(0, session)
    if tb.is_dir() and any(p.is_file() for p in tb.iterdir()):
        found.append(f'{tb}, its TensorBoard records')
    logged = _frame_in_log(run_dir.log_path(0, session))
    if logged:
        found.append(f'{run_dir.log_path(0, session)}, which logs a record at frame {logged}')
    reached = _frame_in_run_resume_log(run_dir, session)
    if reached:
        found.append(f'{run_dir.resume_log_path()}, which records frame {reached}')
    return found


def _frame_in_run_resume_log(run_dir: RunDir, session: int) -> int:
    """The highest frame of `session` that the run's resume log records it had reached (0: none)."""
    try:
        records = read_json(run_dir.resume_log_path())
    except (OSError, ValueError):
        return 0
    if not isinstance(records, list):
        return 0
    frames = [r['frames'].get(str(session)) for r in records
              if isinstance(r, dict) and isinstance(r.get('frames'), dict)]
    return max((f for f in frames if isinstance(f, int) and not isinstance(f, bool)), default=0)


def _frame_in_log(path: Path) -> int:
    """The frame of the first record line at a frame > 0 in a session's log (0: none)."""
    try:
        with open(path, encoding='utf-8', errors='replace') as f:
            for line in f:
                match = LOGGED_ROW.search(line)
                if match and int(match[1]) > 0:
                    return int(match[1])
    except OSError:
        pass
    return 0


def load_sessions(run_dir: RunDir, max_session: int, seconds: dict[int, float] | None = None) -> dict[int, Snapshot]:
    """The newest intact snapshot of each session, by session index (each read once: the lab
    hands it on to the session that continues from it; `seconds`, when given, receives how long
    each took to load). A session with recorded progress but no intact snapshot cannot continue:
    ResumeError (a fresh start would overwrite its records). Sessions that never recorded
    anything are left out."""
    loaded = {}
    for s in range(max_session):
        # the damaged snapshots passed over travel with the one found (Snapshot.passed_over): the
        # session that continues from it says so (console, log, resume record) and sets them aside;
        # when none is intact, the refusal below names them
        damaged: list = []
        t0 = time.perf_counter()
        found = load_latest_snapshot(run_dir.ckpt_dir(0, s), damaged=damaged)
        if found is not None:
            loaded[s] = found
            if seconds is not None:
                seconds[s] = time.perf_counter() - t0
            continue
        progress = session_has_progress(run_dir, s)
        if progress:
            missing = [f'{sub}/' for sub in ('ckpt', 'info', 'model') if not (run_dir.root / sub).is_dir()]
            if damaged:
                what = (f'all {len(damaged)} snapshot(s) in {run_dir.ckpt_dir(0, s)} are damaged '
                        f'(newest: {damaged[0][1]})')
            elif len(missing) > 1:
                what = f'it has no snapshot ({", ".join(missing[:-1])} and {missing[-1]} are missing from the run)'
            elif missing:
                what = f'it has no snapshot ({missing[0]} is missing from the run)'
            else:
                what = f'it has no snapshot ({run_dir.ckpt_dir(0, s)} is missing or empty)'
            raise ResumeError(f'session {s} of {run_dir.root} has recorded progress ({progress[0]}) but {what}; '
                              'it cannot continue without starting over its records: start a new run with '
                              f'python run_lab.py SPEC_FILE {run_dir.spec_name} train (this run is left unchanged)')
    return loaded


def files_written_on_resume(run_dir: RunDir, max_session: int, trial: int = 0) -> list[Path]:
    """Every file a resume of the run (re)writes: the specs, each session's records, metrics,
    model files, log and resume log, the trial's metrics and the run's resume log."""
    paths = [run_dir.spec_path(), run_dir.spec_path(trial), run_dir.trial_metrics_path(trial),
             run_dir.resume_log_path()]
    for s in range(max_session):
        paths += [run_dir.spec_path(trial, s), run_dir.session_df_path(trial, s, 'train'),
                  run_dir.session_df_path(trial, s, 'eval'), run_dir.session_metrics_path(trial, s),
                  run_dir.model_path(trial, s, 'best'), run_dir.model_path(trial, s, 'latest'),
                  run_dir.log_path(trial, s), run_dir.session_resume_log_path(trial, s)]
    return paths


def board_dirs(run_dir: RunDir, max_session: int, trial: int = 0) -> list[Path]:
    """The TensorBoard directories a resume writes: tb/, each session's and the trial's."""
    return [run_dir.root / 'tb'] + [run_dir.tb_dir(trial, s) for s in range(max_session)] + [run_dir.tb_dir(trial)]


def _kind(path: Path) -> str:
    """What stands at `path` that is not a directory, in a user's words."""
    if path.is_symlink():
        return 'a link to nothing' if not path.exists() else 'a link to a file'
    return 'a file' if path.is_file() else 'not a directory'


def restore_layout(run_dir: RunDir, max_session: int, tensorboard: bool = True) -> None:
    """Before a resume writes anything: make again the run's subdirectories the lab writes into
    (log/, info/, model/, graph/) where they were deleted (they are the lab's own, and a resume
    writes them anew), after checking that nothing stands where the resume will write: a file
    where a subdirectory belongs, or a directory where a file belongs, is a ResumeError naming
    it, and the run is left as it was. With `tensorboard` (meta.tensorboard), the same for tb/
    and the TensorBoard directories of the sessions and the trial (a file or a dangling link
    there would fail at the first log point, after a row was written)."""
    for sub in SUBDIRS:
        path = run_dir.root / sub
        if path.exists() and not path.is_dir():
            raise ResumeError(f'{path} is not a directory, where the run keeps its {sub} files; move it away and '
                              'resume again')
    for path in files_written_on_resume(run_dir, max_session):
        if path.exists() and not path.is_file():
            raise ResumeError(f'{path} is not a file (a directory?), where the run writes its '
                              f'{path.name.rsplit("_", 1)[-1]}; move it away and resume again')
    if tensorboard:
        for path in board_dirs(run_dir, max_session):
            if path.is_symlink() or path.exists():
                if not path.is_dir():
                    raise ResumeError(f'{path} is {_kind(path)}, where the run writes its TensorBoard event files '
                                      '(a directory); move it away and resume again')
    run_dir.create()


def append_run_record(run_dir: RunDir, record: dict) -> None:
    """Append a record of this resume to the run's resume log."""
    append_json_list(run_dir.resume_log_path(), record)
