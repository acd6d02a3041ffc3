"""Resolving train@latest / train@<run dir>, and checking that an edited spec is consistent with
the run it continues."""
from __future__ import annotations

import re
from pathlib import Path

from slm_lab import checkpoint
from slm_lab.experiment.run_dir import RunDir
from slm_lab.lib.errors import ResumeError
from slm_lab.lib.io import append_json_list, read_json
from slm_lab.spec import RUNTIME_META, diff_specs

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
    except (OSError, ValueError, KeyError, TypeError):
        return False


def resolve_run_dir(target: str, spec_name: str, data_dir: str) -> RunDir:
    """The run directory named by train@<target>: 'latest' (newest run of spec_name by the
    timestamp in its name) or a path."""
    if target == 'latest':  # dev runs are debugging runs: resume them only by name
        runs = [r for r in _runs_of(spec_name, data_dir) if not _is_dev_run(r, spec_name)]
        if not runs:
            raise ResumeError(f"train@latest: no run of spec '{spec_name}' in {data_dir}/; "
                              f'start one with: python run_lab.py SPEC_FILE {spec_name} train')
        root = runs[-1]
    else:
        root = Path(target.rstrip('/') or '/')
        if not root.is_dir():
            runs = ', '.join(str(p) for p in _runs_of(spec_name, data_dir)) or 'none'
            raise ResumeError(f'train@{target}: no such run directory; runs of {spec_name}: {runs}')
    run_dir = RunDir(root, spec_name)
    if not run_dir.spec_path().is_file():
        runs = ', '.join(str(p) for p in _runs_of(spec_name, data_dir)) or 'none'
        raise ResumeError(f'train@{target}: {root} is not a run of spec {spec_name} '
                          f'(no {run_dir.spec_path().name}); runs of {spec_name}: {runs}')
    return run_dir


def read_run_spec(run_dir: RunDir) -> dict:
    try:
        return read_json(run_dir.spec_path())
    except (OSError, ValueError) as e:
        raise ResumeError(f'{run_dir.spec_path()}: cannot read the run\'s spec ({e})') from None


def check_edits(old_spec: dict, new_spec: dict, force: bool) -> list[tuple]:
    """The spec diff (key, old, new). Edits outside ALLOWED_EDITS raise ResumeError listing each
    one, unless force; a lower max_session is never allowed."""
    diff = [d for d in diff_specs(old_spec, new_spec) if not d[0].startswith(IGNORED) and d[0] != 'name']
    seed_old, seed_new = old_spec['meta'].get('random_seed'), new_spec['meta'].get('random_seed')
    if seed_new != seed_old:
        diff.append(('meta.random_seed', seed_old, seed_new))
    bad = [d for d in diff if d[0] not in ALLOWED_EDITS]
    old_sessions, new_sessions = old_spec['meta']['max_session'], new_spec['meta']['max_session']
    if new_sessions < old_sessions:
        raise ResumeError(f'meta.max_session: {old_sessions} -> {new_sessions}: a run cannot lose sessions; '
                          f'use meta.max_session >= {old_sessions}')
    if bad and not force:
        changes = '; '.join(f'{k}: {o!r} -> {n!r}' for k, o, n in bad)
        raise ResumeError(f'the spec changed in ways that break the run\'s continuity: {changes}; '
                          'revert them, or pass --force to resume anyway (recorded in the run)')
    return diff


def session_frames(run_dir: RunDir, old_spec: dict) -> dict[str, int]:
    """Frame of each session's newest snapshot, by session index (as a string)."""
    frames = {}
    for s in range(old_spec['meta']['max_session']):
        snaps = checkpoint.list_snapshots(run_dir.ckpt_dir(0, s))
        for snap in snaps:
            try:
                frames[str(s)] = checkpoint.verify_snapshot(snap, full=False)['frame']
                break
            except ResumeError:
                continue
    return frames


def lock_run(run_dir: RunDir):
    """Hold an exclusive lock on the run for as long as the returned file stays open, so two
    processes never train one run at once; ResumeError when another process holds it."""
    import fcntl
    f = open(run_dir.root / '.lock', 'a')  # an empty file; the kernel drops the lock if we die
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise ResumeError(f'{run_dir.root} is being trained by another process; wait for it to finish or '
                          'stop it first') from None
    return f


def check_snapshots_fit(run_dir: RunDir, spec: dict) -> None:
    """Load each session's newest snapshot into an agent built from `spec`, so that a snapshot
    that does not fit (e.g. a net shape changed with --force) is refused before the run changes."""
    from slm_lab.agent import Agent
    from slm_lab.env import Clock, make_env
    env = make_env({**spec['env'], 'vectorization_mode': 'sync'})
    try:
        for s in range(spec['meta']['max_session']):
            loaded = checkpoint.load_latest_snapshot(run_dir.ckpt_dir(0, s))
            if loaded is None:
                continue
            state, _, path = loaded
            agent = Agent(spec, env.single_observation_space, env.single_action_space, env.num_envs,
                          Clock(spec['env']['max_frame'], env.num_envs), seed=0)
            try:
                agent.load_state_dict(state['agent'])
            except (RuntimeError, KeyError, ValueError, IndexError) as e:
                first = str(e).strip().splitlines()[0][:300]
                raise ResumeError(f'snapshot {path} does not fit this spec ({type(e).__name__}: {first}); '
                                  'resume with the spec the run was trained with') from None
    finally:
        env.close()


def append_run_record(run_dir: RunDir, record: dict) -> None:
    """Append a record of this resume to the run's resume log."""
    append_json_list(run_dir.resume_log_path(), record)
