"""enjoy@<run dir>/<spec_name>_t{t}_s{s}_spec.json: replay a trained session's agent.

Loads the session's best weights (or, with --ckpt latest, its newest snapshot), plays episodes
with the greedy (argmax) or mean action, and prints each return. It never trains and never
writes into the run's records, models or snapshots; --record writes videos under video/.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import torch

from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import ResumeError, SpecError
from slm_lab.lib.io import read_json

logger = lab_logger.get_logger('slm_lab.enjoy')
SESSION_SPEC_RE = re.compile(r'^(?P<name>.+)_t(?P<trial>\d+)_s(?P<session>\d+)_spec\.json$')


def parse_session_spec_path(path: str) -> tuple[Path, str, int, int]:
    """(run root, spec_name, trial, session) from a session spec path."""
    p = Path(path)
    m = SESSION_SPEC_RE.match(p.name)
    if not m:
        raise SpecError(f'enjoy@{path}: expected a session spec file named {{spec_name}}_t0_s0_spec.json '
                        'inside a run directory')
    if not p.is_file():
        raise SpecError(f'enjoy@{path}: file not found; give a session spec of a run, e.g. '
                        f'enjoy@data/<run dir>/{m.group("name")}_t0_s0_spec.json')
    return p.parent, m.group('name'), int(m.group('trial')), int(m.group('session'))


def load_weights(run_root: Path, spec_name: str, trial: int, session: int, which: str) -> tuple[dict, dict | None, str]:
    """(net weights by name, observation-normalisation state or None, description) from the
    best model file or the newest snapshot."""
    from slm_lab import checkpoint
    from slm_lab.experiment.run_dir import RunDir
    run_dir = RunDir(run_root, spec_name)
    if which == 'best':
        path = run_dir.model_path(trial, session, 'best')
        if not path.is_file():
            raise ResumeError(f'{path} not found: this session saved no best weights yet; try --ckpt latest')
        state = torch.load(path, weights_only=True, map_location='cpu')
        return state['nets'], state.get('obs_norm'), f'best weights ({path.name}, frame {state.get("frame")})'
    loaded = checkpoint.load_latest_snapshot(run_dir.ckpt_dir(trial, session))
    if loaded is None:
        raise ResumeError(f'{run_dir.ckpt_dir(trial, session)}: no intact snapshot to replay; try --ckpt best')
    state, manifest, path = loaded
    obs_norm = None
    for layer in state['env']['layers']:
        if 'obs_rms' in layer:
            obs_norm = layer['obs_rms']['__rms__'] | {'epsilon': layer.get('epsilon', 1e-8)}
    return state['agent']['algorithm']['nets'], obs_norm, f'snapshot {path.name} (frame {manifest["frame"]})'


def enjoy(session_spec_path: str, episodes: int = 5, ckpt: str = 'best', render: bool = False,
          record: bool = False) -> list[float]:
    """Play `episodes` greedy episodes with a trained session's agent; returns their returns."""
    from slm_lab.agent import Agent
    from slm_lab.env import Clock, make_single_env
    from slm_lab.spec import validate_spec
    run_root, spec_name, trial, session = parse_session_spec_path(session_spec_path)
    if render and not (os.environ.get('DISPLAY') or os.environ.get('WAYLAND_DISPLAY')):
        raise SpecError('--render needs a display (DISPLAY is not set); use --record to write videos instead')
    try:
        raw = read_json(session_spec_path)
    except ValueError as e:
        raise SpecError(f'{session_spec_path}: invalid JSON ({e})') from None
    spec = validate_spec(raw, spec_name)
    nets, obs_norm, what = load_weights(run_root, spec_name, trial, session, ckpt)
    render_mode = 'human' if render else ('rgb_array' if record else None)
    env = make_single_env(spec['env'], render_mode=render_mode)
    if record:
        try:
            import moviepy  # noqa: F401  (gymnasium's RecordVideo writes with it)
        except ImportError:
            env.close()
            raise SpecError('--record needs the optional package moviepy: pip install moviepy') from None
        from gymnasium.wrappers import RecordVideo
        video_dir = run_root / 'video'
        env = RecordVideo(env, str(video_dir), episode_trigger=lambda _: True,
                          name_prefix=f'{spec_name}_t{trial}_s{session}_{ckpt}')
    agent = Agent(spec, env.observation_space, env.action_space, 1, Clock(1, 1), seed=0)
    for name, net in agent.algorithm.nets().items():
        net.load_state_dict(nets[name])
        net.eval()
    normalize = None
    if obs_norm is not None:
        mean, var, eps = np.asarray(obs_norm['mean']), np.asarray(obs_norm['var']), obs_norm.get('epsilon', 1e-8)
        normalize = lambda o: ((o - mean) / np.sqrt(var + eps)).astype(np.float32)  # noqa: E731
    seed = int(spec['meta'].get('random_seed') or 0) + 10**7
    print(f'replaying {spec_name} t{trial} s{session} on {spec["env"]["name"]} with {what}')
    returns = []
    try:
        for i in range(episodes):
            obs, _ = env.reset(seed=seed + i)
            total, done = 0.0, False
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
