"""enjoy@<run dir>/<spec_name>_t{t}_s{s}_spec.json: replay a trained session's agent.

Loads the session's best weights (or, with --ckpt latest, its newest snapshot), plays episodes
with the greedy (argmax) or mean action, and prints each return. It never trains and never
writes into the run's records, models or snapshots; --record writes videos under video/.
Whatever it cannot replay (a session spec that does not describe the saved weights, a damaged or
missing model file, no intact snapshot, a directory) is a one-line LabError naming the file and
what to do instead.
"""
from __future__ import annotations

import tempfile
import os
import re
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from slm_lab.agent import Agent
from slm_lab.env import Clock, agent_action_space, make_single_env
from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import LabError, ResumeError, SpecError
from slm_lab.lib.io import read_json
from slm_lab.persistence.edits import fill_keys_added_later
from slm_lab.persistence.model_file import DamagedModelFile, load_model_file
from slm_lab.persistence.resume import glob_escape
from slm_lab.persistence.run_dir import RunDir
from slm_lab.persistence.snapshot import list_snapshots
from slm_lab.persistence.snapshots import load_latest_snapshot
from slm_lab.spec import validate_spec

logger = lab_logger.get_logger('slm_lab.enjoy')
SESSION_SPEC_RE = re.compile(r'^(?P<name>.+)_t(?P<trial>\d+)_s(?P<session>\d+)_spec\.json$')


def parse_session_spec_path(path: str) -> tuple[Path, str, int, int]:
    """(run root, spec_name, trial, session) from a session spec path."""
    p = Path(path)
    try:
        p.stat()
    except FileNotFoundError:
        pass
    except OSError as e:  # a name too long for the filesystem, a loop of links, ...
        raise SpecError(f'enjoy@{path[:80]}{"..." if len(path) > 80 else ""}: {e.strerror}; give a session spec '
                        'of a run, e.g. enjoy@data/<run dir>/<spec_name>_t0_s0_spec.json') from None
    if p.is_dir():
        found = sorted(p.glob('*_t*_s*_spec.json'))
        example = found[0] if found else p / '<spec_name>_t0_s0_spec.json'
        raise SpecError(f'enjoy@{path} is a directory; give one of its session specs, e.g. enjoy@{example}')
    m = SESSION_SPEC_RE.match(p.name)
    if not m:
        base = p.name[:-len('_spec.json')] if p.name.endswith('_spec.json') else None
        trial = re.fullmatch(r'(.+_t\d+)', base) if base else None  # a trial's spec: {spec_name}_t{N}
        found = sorted(p.parent.glob(f'{glob_escape(base)}_s*_spec.json' if trial else
                                     f'{glob_escape(base)}_t*_s*_spec.json')) if base else []
        if found:  # the run's (or a trial's) spec: its sessions' specs lie beside it
            raise SpecError(f'enjoy@{path} is the spec of a run or trial, not of a session; give one of its '
                            f'session specs, e.g. enjoy@{found[0]}')
        raise SpecError(f'enjoy@{path}: expected a session spec file named {{spec_name}}_t0_s0_spec.json '
                        'inside a run directory')
    if not p.is_file():
        raise SpecError(f'enjoy@{path}: file not found; give a session spec of a run, e.g. '
                        f'enjoy@data/<run dir>/{m.group("name")}_t0_s0_spec.json')
    return p.parent, m.group('name'), int(m.group('trial')), int(m.group('session'))


def read_session_spec(path: str, spec_name: str) -> dict:
    """The session spec at `path`, with the keys a newer lab added filled as the run computed
    (edits.fill_keys_added_later: a bf16 net saved before bf16_min_rows acts in bf16, ...),
    validated; a SpecError naming the file otherwise."""
    try:
        raw = read_json(path)
    except (OSError, ValueError) as e:
        raise SpecError(f'{path}: cannot be read as JSON ({e})') from None
    try:
        return validate_spec(fill_keys_added_later(raw) if isinstance(raw, dict) else raw, spec_name)
    except SpecError as e:
        raise SpecError(f'{path}: {e}') from None


class SavedWeights(NamedTuple):
    """What enjoy@ replays: net weights by net name, the observation-normalisation state (None
    when observations were not normalised), the file they came from and a description."""

    nets: dict
    obs_norm: dict | None
    source: Path
    what: str


def _no_weights(run_dir, trial: int, session: int) -> ResumeError:
    return ResumeError(f'{run_dir.root}: session t{trial} s{session} has no saved weights (no '
                       f'{run_dir.model_path(trial, session, "best").relative_to(run_dir.root)}, no snapshot in '
                       f'{run_dir.ckpt_dir(trial, session).relative_to(run_dir.root)}/); it stopped before its '
                       'first log point, its files were moved, or `search --keep` removed them (it keeps only the best '
                       "trials' models)")


def _best_weights(run_dir, trial: int, session: int) -> SavedWeights:
    """The session's model_best.pt; a damaged or foreign file is a ResumeError naming it."""
    path = run_dir.model_path(trial, session, 'best')
    if not path.exists():
        if not list_snapshots(run_dir.ckpt_dir(trial, session)):
            raise _no_weights(run_dir, trial, session)
        raise ResumeError(f'{path} not found: this session saved no best weights yet; replay its newest snapshot '
                          'with --ckpt latest')
    try:
        state, verified = load_model_file(path)
    except DamagedModelFile as e:
        raise DamagedModelFile(f'{e}; replay the newest snapshot with --ckpt latest') from None
    if not isinstance(state.get('nets'), dict):
        raise ResumeError(f'{path} is not a model file of this lab (no net weights in it); replay the newest '
                          'snapshot with --ckpt latest')
    if not verified:
        logger.warning(f'{path} was written by an older version of the lab, without a checksum: its contents '
                       'cannot be checked for damage')
    return SavedWeights(state['nets'], state.get('obs_norm'), path,
                        f'best weights ({path.name}, frame {state.get("frame")})')


def _latest_weights(run_dir, trial: int, session: int) -> SavedWeights:
    """The newest intact snapshot's weights, skipping damaged snapshots (with one warning that
    names them); when none is intact, a ResumeError that says what was damaged."""
    ckpt_dir = run_dir.ckpt_dir(trial, session)
    found: list = []  # (path, error) of each damaged snapshot, reported here in one line
    loaded = load_latest_snapshot(ckpt_dir, damaged=found)  # an unknown format is refused
    damaged = [f'{path.name}: {str(e).split(": ", 1)[-1]}' for path, e in found]
    if loaded is not None:
        path = loaded.path
        if damaged:
            logger.warning(f'{ckpt_dir}: skipped damaged snapshot(s) ({"; ".join(damaged)}); replaying {path.name}')
        return SavedWeights(loaded.nets, loaded.obs_norm, path, f'snapshot {path.name} (frame {loaded.frame})')
    if not damaged:
        if not run_dir.model_path(trial, session, 'best').is_file():
            raise _no_weights(run_dir, trial, session)
        raise ResumeError(f'{ckpt_dir}: no snapshot to replay; replay the best weights with --ckpt best')
    raise ResumeError(f'{ckpt_dir}: no intact snapshot to replay ({len(damaged)} damaged; newest {damaged[0]}); '
                      'replay the best weights with --ckpt best')


def load_weights(run_root: Path, spec_name: str, trial: int, session: int, which: str) -> SavedWeights:
    """The weights to replay: the best model file (`which` 'best') or the newest intact
    snapshot ('latest'). Every way these files can be missing or damaged is a ResumeError."""
    run_dir = RunDir(run_root, spec_name)
    return _best_weights(run_dir, trial, session) if which == 'best' else _latest_weights(run_dir, trial, session)


def load_nets(agent, weights: SavedWeights, spec_path: str) -> None:
    """Load the saved weights into the agent's nets. A session spec that does not describe the
    agent that was trained (copied from another run, or edited) is a SpecError saying so."""
    nets = agent.algorithm.nets()
    algorithm = type(agent.algorithm).__name__
    problem = None
    if set(nets) != set(weights.nets):
        problem = f'a {algorithm} agent has nets {sorted(nets)}, the weights hold {sorted(weights.nets)}'
    else:
        for name, net in nets.items():
            try:
                net.load_state_dict(weights.nets[name])
            except (RuntimeError, TypeError, KeyError) as e:
                lines = [line.strip() for line in str(e).splitlines() if line.strip()]
                problem = f'{algorithm} net {name!r}: {(lines[1] if len(lines) > 1 else lines[0]).rstrip(".")}'
                break
    if problem is not None:
        raise SpecError(f'{spec_path} does not match the weights in {weights.source} ({problem}); replay with the '
                        "session spec the run wrote beside them (a spec from another run, or edited, does not fit)")
    for net in nets.values():
        net.eval()


def _first_line(e: BaseException) -> str:
    """The first sentence of an exception's message: torch and gymnasium add paragraphs of advice
    that do not fit (or, for a damaged file, do not apply to) a one-line error."""
    text = str(e).strip()
    if not text:
        return '(no message)'
    return text.splitlines()[0].split('. ')[0].rstrip('.')[:200]


def quiet_sdl(window: bool) -> None:
    """Settle SDL's environment before pygame (the envs' renderer) loads: without a window, SDL's
    dummy video and audio drivers; with one, a private XDG_RUNTIME_DIR where none is set. Otherwise
    SDL prints `error: XDG_RUNTIME_DIR is invalid or not set`, which reads as the lab's own error
    line. Values the user set are kept."""
    os.environ.setdefault('SDL_AUDIODRIVER', 'dummy')  # no sound is played
    os.environ.setdefault('PYGAME_HIDE_SUPPORT_PROMPT', '1')
    if not window:
        os.environ.setdefault('SDL_VIDEODRIVER', 'dummy')  # rgb_array frames need no display
    elif not os.environ.get('XDG_RUNTIME_DIR'):
        os.environ['XDG_RUNTIME_DIR'] = tempfile.mkdtemp(prefix='slm_lab_xdg_')  # mode 0700, as SDL wants


def enjoy(session_spec_path: str, episodes: int = 5, ckpt: str = 'best', render: bool = False,
          record: bool = False) -> list[float]:
    """Play `episodes` greedy episodes with a trained session's agent; returns their returns."""
    run_root, spec_name, trial, session = parse_session_spec_path(session_spec_path)
    if render and not (os.environ.get('DISPLAY') or os.environ.get('WAYLAND_DISPLAY')):
        raise SpecError('--render needs a display (DISPLAY is not set); use --record to write videos instead')
    spec = read_session_spec(session_spec_path, spec_name)
    weights = load_weights(run_root, spec_name, trial, session, ckpt)
    # the session's arithmetic (meta.flush_denormal; absent: a run saved before the key, which kept denormals)
    torch.set_flush_denormal(bool(spec['meta'].get('flush_denormal', False)))
    render_mode = 'human' if render else ('rgb_array' if record else None)
    if render_mode:
        quiet_sdl(render)
    try:
        env = make_single_env(spec['env'], render_mode=render_mode)
    except LabError:
        raise
    except Exception as e:  # gym.make's errors for these arguments (or a missing render package)
        raise SpecError(f"{session_spec_path}: env '{spec['env']['name']}' cannot be made "
                        f'({type(e).__name__}: {_first_line(e)})') from None
    if record:
        try:
            import moviepy  # noqa: F401, PLC0415 (gymnasium's RecordVideo writes with it)
        except ImportError:
            env.close()
            raise SpecError('--record needs the optional package moviepy: pip install -r requirements-video.txt '
                            '(or pip install ".[video]")') from None
        from gymnasium.wrappers import RecordVideo  # noqa: PLC0415 (the video extra: only a recording needs it)
        video_dir = run_root / 'video'
        env = RecordVideo(env, str(video_dir), episode_trigger=lambda _: True,
                          name_prefix=f'{spec_name}_t{trial}_s{session}_{ckpt}')
    try:
        agent = Agent(spec, env.observation_space, agent_action_space(env), 1, Clock(1, 1), seed=0)
        load_nets(agent, weights, session_spec_path)
    except BaseException:
        env.close()
        raise
    normalize = None
    obs_norm = weights.obs_norm
    if obs_norm is not None:
        mean, var, eps = np.asarray(obs_norm['mean']), np.asarray(obs_norm['var']), obs_norm.get('epsilon', 1e-8)
        bound = spec['env'].get('clip_obs')  # the training normalisation clips (env.clip_obs)
        normalize = lambda o: np.clip((o - mean) / np.sqrt(var + eps), -(bound or np.inf),  # noqa: E731
                                      bound or np.inf).astype(np.float32)
    seed = int(spec['meta'].get('random_seed') or 0) + 10**7
    print(f'replaying {spec_name} t{trial} s{session} on {spec["env"]["name"]} with {weights.what}')
    returns = []
    try:
        for i in range(episodes):
            obs, _ = env.reset(seed=seed + i)
            total, done = 0.0, False
            agent.start_greedy_episode()
            while not done:
                o = np.asarray(obs, dtype=np.float32)[None]
                action = agent.act_greedy(normalize(o) if normalize else o)[0]
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
            print(f'episode {i + 1}: return {total:.2f}')
    finally:
        env.close()
    print(f'mean return over {episodes} episodes: {np.mean(returns):.2f}')
    return returns
