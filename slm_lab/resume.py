"""Resolving train@latest / train@<run dir>, and checking that an edited spec is consistent with
the run it continues."""
from __future__ import annotations

import re
from pathlib import Path

from slm_lab import checkpoint
from slm_lab.experiment.run_dir import RunDir
from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import ResumeError, SpecError
from slm_lab.lib.io import append_json_list, read_json
from slm_lab.spec import RUNTIME_META, diff_specs, validate_spec

logger = lab_logger.get_logger('slm_lab.resume')

# edits that keep the past and the future of a run consistent
ALLOWED_EDITS = ('env.max_frame', 'meta.log_frequency', 'meta.eval_frequency', 'meta.checkpoint_frequency',
                 'meta.keep_checkpoints', 'meta.rigorous_eval', 'meta.snapshot_replay', 'meta.max_session',
                 'meta.torch_num_threads')
IGNORED = tuple(f'meta.{k}' for k in RUNTIME_META) + ('meta.random_seed',)


def _runs_of(spec_name: str, data_dir: str) -> list[Path]:
    pattern = re.compile(re.escape(spec_name) + r'_\d{4}_\d{2}_\d{2}_\d{6}$')
    root = Path(data_dir)
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and pattern.match(p.name)), key=lambda p: p.name[-17:])


def _is_dev_run(root: Path, spec_name: str) -> bool:
    try:
        return read_json(root / f'{spec_name}_spec.json')['meta'].get('mode') == 'dev'
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # damaged: read_run_spec says so
        return False


def is_search_run(root: Path) -> bool:
    """A search's run directory has search/ (made with the directory itself)."""
    return (root / 'search').is_dir()


def resolve_run_dir(target: str, spec_name: str, data_dir: str, mode: str = 'train') -> RunDir:
    """The run directory named by {mode}@<target>: 'latest' (newest run of spec_name of that
    kind, by the timestamp in its name) or a path. train@ continues train runs and search@
    searches; each refuses the other's run directory, which it would damage."""
    search = mode == 'search'
    if target == 'latest':  # dev runs are debugging runs: resume them only by name
        runs = []
        for r in _runs_of(spec_name, data_dir):
            if not (r / f'{spec_name}_spec.json').is_file():
                # killed while it was being created: it never started, so there is nothing to resume
                logger.warning(f'{mode}@latest: skipping {r}: it has no {spec_name}_spec.json (a run that never '
                               'started); remove it when no process is creating it')
            elif is_search_run(r) == search and not _is_dev_run(r, spec_name):
                runs.append(r)
        if not runs:
            raise ResumeError(f"{mode}@latest: no {'search' if search else 'run'} of spec '{spec_name}' in "
                              f'{data_dir}/; start one with: python run_lab.py SPEC_FILE {spec_name} {mode}')
        root = runs[-1]
    else:
        root = Path(target.rstrip('/') or '/')
        if not root.is_dir():
            runs = ', '.join(str(p) for p in _runs_of(spec_name, data_dir)) or 'none'
            raise ResumeError(f'{mode}@{target}: no such run directory; runs of {spec_name}: {runs}')
    run_dir = RunDir(root, spec_name)
    if not run_dir.spec_path().is_file():
        runs = ', '.join(str(p) for p in _runs_of(spec_name, data_dir)) or 'none'
        raise ResumeError(f'{mode}@{target}: {root} is not a run of spec {spec_name} '
                          f'(no {run_dir.spec_path().name}); runs of {spec_name}: {runs}')
    if is_search_run(root) != search:
        other = 'train' if search else 'search'
        raise ResumeError(f'{mode}@{target}: {root} is a {"train run" if search else "search"}, not a '
                          f'{"search" if search else "train run"}; continue it with {other}@{target}')
    return run_dir


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


# Keys a newer lab added whose default changes what a run made before them did: a run's saved spec
# lacks them, and resuming it fills them with the value that keeps its old behaviour (not the
# new default), so a run continues as it was started.
KEYS_ADDED_LATER = {
    ('env', 'clip_obs'): None,  # no clipping before clip_obs existed (its default is 10 with normalize_obs)
    ('env', 'clip_reward'): None,
}


def fill_keys_added_later(spec: dict) -> dict:
    """The run's saved spec with each key of KEYS_ADDED_LATER it lacks set to its old behaviour."""
    for (section, key), old_value in KEYS_ADDED_LATER.items():
        if isinstance(spec.get(section), dict) and key not in spec[section]:
            spec[section][key] = old_value
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


SCHEDULE_EDIT_RE = re.compile(r'^agent\.algorithm\.(\w+_spec)\.(name|start_val|end_val|start_step|end_step|'
                              r'decay_rate|frequency)$')


def _is_schedule_edit(key: str, old_spec: dict, new_spec: dict) -> bool:
    """An edit inside a frame-driven schedule (explore_var_spec, clip_eps_spec, ...): a schedule
    is a function of the frame with no state of its own, so the run continues under the edited
    one as if it had been started with it."""
    m = SCHEDULE_EDIT_RE.match(key)
    if not m:
        return False
    pieces = [spec['agent']['algorithm'].get(m.group(1)) for spec in (old_spec, new_spec)]
    return all(isinstance(p, dict) and 'start_val' in p for p in pieces)


def check_edits(old_spec: dict, new_spec: dict, force: bool) -> list[tuple]:
    """The spec diff (key, old, new). Edits outside ALLOWED_EDITS raise ResumeError listing each
    one, unless force; a lower max_session is never allowed. The run's spec is first filled with
    this lab's defaults, so a key a newer lab added (at its default) is not an edit."""
    try:
        old_spec = {**validate_spec({k: v for k, v in old_spec.items() if k != 'name'}), 'name': old_spec.get('name')}
    except SpecError:  # read_run_spec has checked it; diff it as saved
        pass
    diff = [d for d in diff_specs(old_spec, new_spec) if not d[0].startswith(IGNORED) and d[0] != 'name']
    seed_old, seed_new = old_spec['meta'].get('random_seed'), new_spec['meta'].get('random_seed')
    if seed_new != seed_old:
        diff.append(('meta.random_seed', seed_old, seed_new))
    bad = [d for d in diff if d[0] not in ALLOWED_EDITS and not _is_schedule_edit(d[0], old_spec, new_spec)]
    old_sessions, new_sessions = old_spec['meta']['max_session'], new_spec['meta']['max_session']
    if new_sessions < old_sessions:
        raise ResumeError(f'meta.max_session: {old_sessions} -> {new_sessions}: a run cannot lose sessions; '
                          f'use meta.max_session >= {old_sessions}')
    if new_sessions != old_sessions and (old_spec['meta'].get('distributed') or new_spec['meta'].get('distributed')):
        raise ResumeError(f'meta.max_session: {old_sessions} -> {new_sessions}: the sessions of a meta.distributed '
                          'run train one set of weights and split env.max_frame between them, so their number '
                          f'cannot change; use meta.max_session={old_sessions}')
    if bad and not force:
        changes = '; '.join(f'{k}: {o!r} -> {n!r}' for k, o, n in bad)
        raise ResumeError(f'the spec changed in ways that break the run\'s continuity: {changes}; '
                          'revert them, or pass --force to resume anyway (recorded in the run)')
    return diff


def session_has_progress(run_dir: RunDir, session: int) -> list[str]:
    """What a session has recorded on disk (rows, weights, snapshot directories): its progress,
    which a fresh start would overwrite. Empty when the session never got that far."""
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
    found += [str(p) for p in checkpoint.list_snapshots(ckpt)]
    if ckpt.is_dir():  # snapshots set aside as damaged are progress too
        found += [str(p) for p in sorted(ckpt.glob('f*.damaged*'))]
    return found


def load_sessions(run_dir: RunDir, max_session: int) -> dict[int, tuple[dict, dict, Path]]:
    """The newest intact snapshot of each session (state, manifest, path), by session index.
    A session with recorded progress but no intact snapshot cannot continue: ResumeError (a fresh
    start would overwrite its records). Sessions that never recorded anything are left out."""
    loaded = {}
    for s in range(max_session):
        # damaged snapshots are reported by the session that falls back past them (in its log), or
        # named in the refusal below: not twice
        damaged: list = []
        found = checkpoint.load_latest_snapshot(run_dir.ckpt_dir(0, s), damaged=damaged)
        if found is not None:
            loaded[s] = found
            continue
        progress = session_has_progress(run_dir, s)
        if progress:
            what = (f'all {len(damaged)} snapshot(s) in {run_dir.ckpt_dir(0, s)} are damaged (newest: {damaged[0][1]})'
                    if damaged else f'it has no snapshot ({run_dir.ckpt_dir(0, s)} is missing or empty)')
            raise ResumeError(f'session {s} of {run_dir.root} has recorded progress ({progress[0]}) but {what}; '
                              'it cannot continue without starting over its records: start a new run with '
                              f'python run_lab.py SPEC_FILE {run_dir.spec_name} train (this run is left unchanged)')
    return loaded


def _schedules(spec: dict) -> dict[str, tuple]:
    """Every frame-driven schedule of a spec: {key path: (kind, spec piece)}."""
    out = {}
    for key, value in spec['agent']['algorithm'].items():
        if key.endswith('_spec') and isinstance(value, dict) and 'start_val' in value:
            out[f'agent.algorithm.{key}'] = ('schedule', value)
    net = spec['agent'].get('net') or {}
    lr_spec = net.get('lr_scheduler_spec')
    if isinstance(lr_spec, dict) and lr_spec.get('name') == 'LinearToZero':
        for optim_key in ('optim_spec', 'actor_optim_spec', 'critic_optim_spec'):
            if isinstance(net.get(optim_key), dict) and 'lr' in net[optim_key]:
                out[f'agent.net.{optim_key}.lr'] = ('linear_to_zero', (net[optim_key]['lr'], lr_spec))
    return out


def _schedule_value(kind: str, piece, frame: int, max_frame: int) -> float:
    if kind == 'linear_to_zero':  # see net_util.make_lr_scheduler
        from slm_lab.agent.net.net_util import linear_to_zero_end
        lr, lr_spec = piece
        return float(lr) * max(0.0, 1.0 - frame / linear_to_zero_end(lr_spec, max_frame))
    from slm_lab.lib.decay import Schedule
    return Schedule(piece).value(frame)


def schedule_changes(old_spec: dict, new_spec: dict, frames: dict[int, int]) -> list[dict]:
    """How resuming under new_spec changes each frame-driven schedule (the lab's rule, SLM-Lab's:
    the run continues as if it had been started with the edited spec). One entry per affected
    schedule: its key, its value before and after at each session's resume frame, and why.

    A schedule is affected when its value at the resume frame changes (LinearToZero follows
    env.max_frame; an edited schedule), or when the run is extended past the end_step of a
    schedule that was set to span the whole old run (end_step == the old env.max_frame: it then
    stays at end_val for the whole extension)."""
    old_max, new_max = old_spec['env']['max_frame'], new_spec['env']['max_frame']
    old_scheds, new_scheds = _schedules(old_spec), _schedules(new_spec)
    changes = []
    for key, (kind, piece) in new_scheds.items():
        old_kind, old_piece = old_scheds.get(key, (kind, piece))
        values = {s: (_schedule_value(old_kind, old_piece, f, old_max), _schedule_value(kind, piece, f, new_max))
                  for s, f in frames.items()}
        moved = {s: v for s, v in values.items() if not _same(*v)}
        if moved:
            if kind == 'linear_to_zero' and old_max != new_max:
                why = (f'LinearToZero decays the learning rate to 0 at env.max_frame, which changed from {old_max} '
                       f'to {new_max}')
            else:
                why = 'the schedule was edited'
            changes.append({'key': key, 'frames': {str(s): frames[s] for s in moved},
                            'before': {str(s): v[0] for s, v in moved.items()},
                            'after': {str(s): v[1] for s, v in moved.items()}, 'why': why})
            continue
        end_step = piece.get('end_step', 0) if kind == 'schedule' else None
        decays = kind == 'schedule' and piece.get('name') != 'no_decay' and \
            piece.get('start_val') != _schedule_value(kind, piece, end_step, new_max)
        if decays and new_max > old_max and end_step == old_max:
            end_val = _schedule_value(kind, piece, end_step, new_max)
            last_val = _schedule_value(kind, piece, new_max, new_max)
            # SLM-Lab's linear_decay keeps rising past end_step when end_val > start_val
            after_end = (f'it stays at end_val {end_val:g} for the whole extension' if _same(end_val, last_val) else
                         f'past it the value goes on from {end_val:g} to {last_val:g}')
            changes.append({'key': key, 'frames': {str(s): f for s, f in frames.items()},
                            'before': {str(s): v[0] for s, v in values.items()},
                            'after': {str(s): v[1] for s, v in values.items()},
                            'why': f'its end_step {end_step} spanned the old run (env.max_frame {old_max}); '
                                   f'{after_end} to env.max_frame {new_max}; '
                                   f'to stretch it, resume with -s {key}.end_step={new_max}'})
    return changes


def _same(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)  # NaN == NaN for unset schedules


def describe_schedule_change(change: dict) -> str:
    """One log line for a schedule change."""
    pairs = [f"{change['before'][s]:.4g} -> {change['after'][s]:.4g}" + (f' (session {s})' if len(change['before']) > 1
                                                                          else '')
             for s in change['before']]
    frames = sorted(set(change['frames'].values()))
    at = f"frame {frames[0]}" if len(frames) == 1 else f"frames {', '.join(map(str, frames))}"
    return f"{change['key']}: at {at} the value goes {', '.join(pairs)}: {change['why']}"


def lock_run(run_dir: RunDir):
    """Hold an exclusive lock on the run for as long as the returned file stays open, so two
    processes never train one run at once; ResumeError when another process holds it."""
    import fcntl
    path = run_dir.root / '.lock'
    try:
        f = open(path, 'a')  # an empty file; the kernel drops the lock if we die
    except OSError as e:
        what = 'is a directory' if path.is_dir() else f'cannot be opened ({e.strerror})'
        raise ResumeError(f'{path} {what}; it should be the empty file the lab locks a run with: move it away '
                          'and run again') from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise ResumeError(f'{run_dir.root} is being trained by another process; wait for it to finish or '
                          'stop it first') from None
    return f


def check_sessions_load(run_dir: RunDir, spec: dict, loaded: dict[int, tuple[dict, dict, Path]]) -> dict[int, list]:
    """Load each session's whole snapshot state (agent, env, records, clock, generators) into a
    session built from `spec`, so that a snapshot that does not fit (a net shape or env count
    changed with --force) is refused before the run changes. Nothing is written. Returns, per
    session, why its continuation will be approximate (empty when exact)."""
    from slm_lab.experiment.control import Session
    approximate = {}
    from slm_lab.spec import session_max_frame
    n_sessions, share = spec['meta']['max_session'], session_max_frame(spec)
    if share != spec['env']['max_frame']:  # meta.distributed: each session runs its share of env.max_frame
        reached = max((manifest['frame'] for _, manifest, _ in loaded.values()), default=0)
        if share < reached:
            raise ResumeError(f"env.max_frame {spec['env']['max_frame']} gives each of the {n_sessions} sessions of "
                              f'this meta.distributed run {share} frames, below frame {reached} that a session '
                              f'already reached; use env.max_frame >= {reached * n_sessions}')
    for s, (state, _, path) in loaded.items():
        session = Session(spec, run_dir, 'train', 0, s)
        try:
            approximate[s] = session.load_state_dict(state, quiet=True)
        except (RuntimeError, KeyError, ValueError, IndexError, TypeError, AttributeError) as e:
            first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ''
            raise ResumeError(f'snapshot {path} does not fit this spec ({type(e).__name__}: {first}); '
                              'resume with the spec the run was trained with') from None
        finally:
            session.close()
    return approximate


def restore_layout(run_dir: RunDir) -> None:
    """Make again the run's subdirectories the lab writes into (log/, info/, model/, graph/) where
    they were deleted: they are the lab's own, and a resume writes them anew. ResumeError when a
    file stands where a subdirectory belongs."""
    from slm_lab.experiment.run_dir import SUBDIRS
    for sub in SUBDIRS:
        path = run_dir.root / sub
        if path.exists() and not path.is_dir():
            raise ResumeError(f'{path} is not a directory, where the run keeps its {sub} files; move it away and '
                              'resume again')
    run_dir.create()


def append_run_record(run_dir: RunDir, record: dict) -> None:
    """Append a record of this resume to the run's resume log."""
    append_json_list(run_dir.resume_log_path(), record)


def continuation_spec(spec_file: str, spec_name: str, overrides: list[str] | None, old_spec: dict,
                      mode: str) -> tuple[dict, dict]:
    """The spec a run (or search) continues under: the spec file with the run's own -s overrides
    first (so a bare train@latest continues the run as it was started), then these; keys the file
    leaves out taken from the run's saved spec; its seed and timestamp kept. Returns (spec, the
    saved spec filled with keys added later)."""
    from slm_lab import __version__
    from slm_lab.lib.version import git_sha
    from slm_lab.spec import load_spec
    old_spec = fill_keys_added_later(old_spec)
    overrides = list(old_spec['meta'].get('overrides') or []) + list(overrides or [])
    spec = load_spec(spec_file, spec_name, overrides, base=old_spec)
    meta = spec['meta']
    if meta['random_seed'] is None:
        meta['random_seed'] = old_spec['meta']['random_seed']
    meta['experiment_ts'] = old_spec['meta']['experiment_ts']
    meta['lab_version'], meta['git_sha'], meta['mode'] = __version__, git_sha(), mode
    return spec, old_spec
