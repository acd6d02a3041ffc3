"""Shared fixtures: minimal specs per algorithm and a runner that keeps every file in tmp_path.

PNG export (a headless browser, ~2 s per graph) is switched off in `lab_run` so the suite stays
fast; the HTML graphs, which every run writes, are still checked.
"""
from __future__ import annotations

import contextlib
import copy
import gc
import json
import logging
import os
import signal
import struct
import subprocess
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config):
    """The tests send SIGINT to the lab as a terminal's Ctrl-C does, to a foreground job. Started as a
    background job (`pytest ... &` in a script), pytest inherits SIGINT ignored, every child would
    too, and the lab rightly leaves an ignored SIGINT ignored (lib/errors.py): each such test would
    then see its run finish. So the suite restores Python's own handler, in the main process and in
    each xdist worker, before any child starts."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)

NET = {'type': 'MLPNet', 'hid_layers': [32], 'hid_layers_activation': 'tanh',
       'optim_spec': {'name': 'Adam', 'lr': 0.001}}

ALGORITHMS = {
    'Random': {'algorithm': {'name': 'Random'}},
    'Reinforce': {
        'algorithm': {'name': 'Reinforce', 'gamma': 0.99, 'training_frequency': 1,
                      'entropy_coef_spec': {'name': 'linear_decay', 'start_val': 0.01, 'end_val': 0.001,
                                            'start_step': 0, 'end_step': 1000}},
        'memory': {'name': 'OnPolicyReplay'}, 'net': NET},
    'VanillaDQN': {
        'algorithm': {'name': 'VanillaDQN', 'training_start_step': 32, 'training_frequency': 4,
                      'explore_var_spec': {'name': 'linear_decay', 'start_val': 1.0, 'end_val': 0.1,
                                           'start_step': 0, 'end_step': 200}},
        'memory': {'name': 'Replay', 'batch_size': 32, 'max_size': 1000}, 'net': NET},
    'PPO': {
        'algorithm': {'name': 'PPO', 'time_horizon': 32, 'minibatch_size': 32, 'training_epoch': 2,
                      'entropy_coef_spec': {'name': 'no_decay', 'start_val': 0.01}},
        'memory': {'name': 'OnPolicyBatchReplay'}, 'net': NET},
}
ALGORITHMS['ActorCritic'] = {
    'algorithm': {'name': 'ActorCritic', 'lam': 0.95, 'training_frequency': 32,
                  'entropy_coef_spec': {'name': 'no_decay', 'start_val': 0.01}},
    'memory': {'name': 'OnPolicyBatchReplay'}, 'net': NET}
ALGORITHMS['SIL'] = {
    'algorithm': {'name': 'SIL', 'lam': 0.95, 'training_frequency': 1, 'training_iter': 2, 'training_batch_iter': 1,
                  'entropy_coef_spec': {'name': 'no_decay', 'start_val': 0.01}},
    'memory': {'name': 'OnPolicyReplay', 'sil_replay_name': 'Replay', 'batch_size': 32, 'max_size': 1000}, 'net': NET}
ALGORITHMS['PPOSIL'] = copy.deepcopy(ALGORITHMS['PPO'])
ALGORITHMS['PPOSIL']['algorithm'].update(name='PPOSIL', training_iter=2, training_batch_iter=1)
ALGORITHMS['PPOSIL']['memory'].update(sil_replay_name='Replay', batch_size=32, max_size=1000)
ALGORITHMS['DQN'] = copy.deepcopy(ALGORITHMS['VanillaDQN'])
ALGORITHMS['DQN']['algorithm']['name'] = 'DQN'
ALGORITHMS['DoubleDQN'] = copy.deepcopy(ALGORITHMS['DQN'])
ALGORITHMS['DoubleDQN']['algorithm']['name'] = 'DoubleDQN'


def build_spec(algorithm: str, env: str = 'CartPole-v1', max_frame: int = 256, num_envs: int = 1,
               log_frequency: int | None = None, random_seed: int | None = 42, **meta) -> dict:
    """A small runnable spec for `algorithm` (a key of ALGORITHMS) on `env`."""
    agent = copy.deepcopy(ALGORITHMS[algorithm])
    agent['name'] = algorithm
    return {
        'agent': agent,
        'env': {'name': env, 'num_envs': num_envs, 'max_frame': max_frame},
        'meta': {'log_frequency': log_frequency or max(max_frame // 4, num_envs), 'random_seed': random_seed,
                 **meta},
    }


def make_agent(spec: dict, seed: int = 0, obs_dim: int | None = None, n_actions: int = 2,
               num_envs: int | None = None):
    """The Agent (and its Clock) a session would build from a raw spec, without a session: for
    tests of an algorithm's nets, losses and state. Its spaces are its env's (env.name), or, given
    `obs_dim`, a Box(obs_dim) observation and Discrete(n_actions) actions, for a test that feeds
    arrays of its own; `num_envs`: env.num_envs unless given. Returns (agent, clock)."""
    import gymnasium as gym
    import numpy as np
    import torch

    from slm_lab.agent import Agent
    from slm_lab.env.clock import Clock
    from slm_lab.spec import validate_spec
    spec = validate_spec(spec)
    torch.manual_seed(seed)  # as a session seeds torch before building: nets start the same in any test order
    if obs_dim is None:
        env = gym.make(spec['env']['name'])
        obs_space, action_space = env.observation_space, env.action_space
        env.close()
    else:
        obs_space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        action_space = gym.spaces.Discrete(n_actions)
    num_envs = spec['env']['num_envs'] if num_envs is None else num_envs
    clock = Clock(spec['env']['max_frame'], num_envs)
    return Agent(spec, obs_space, action_space, num_envs, clock, seed=seed), clock


def make_algorithm(spec: dict, num_envs: int = 1, obs_dim: int = 4, seed: int = 0):
    """The algorithm of a raw spec on a Box(obs_dim) observation and Discrete(2) actions (make_agent)."""
    return make_agent(spec, seed, obs_dim=obs_dim, num_envs=num_envs)[0].algorithm


def write_spec_file(path: Path, specs: dict) -> str:
    """Write {spec_name: spec} as a JSON spec file; return its path as a string."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(specs, indent=2))
    return str(path)


def flip_weight_bytes(model: Path, count: int = 64) -> None:
    """Invert `count` bytes inside the largest tensor record of a torch zip file, as bit rot in
    a weight would (torch's loader does not notice it)."""
    with zipfile.ZipFile(model) as z:
        record = max((i for i in z.infolist() if '/data/' in i.filename), key=lambda i: i.file_size)
    data = bytearray(model.read_bytes())
    name_len, extra_len = struct.unpack('<HH', data[record.header_offset + 26:record.header_offset + 30])
    start = record.header_offset + 30 + name_len + extra_len + record.file_size // 4
    for i in range(min(count, record.file_size // 2)):
        data[start + i] ^= 0xFF
    model.write_bytes(bytes(data))


@pytest.fixture(autouse=True, scope='session')
def lab_cache_dir(request, tmp_path_factory):
    """The lab's caches (random baselines) go to one directory, not to each test's data/ (whose
    listing tests check) nor to a user's: pytest's cache (.pytest_cache/d/lab_cache_DIGEST), which
    both xdist workers and both tiers share, so that an Atari game's 20,000 random steps (about 25 s
    on a loaded machine) are played once, not once per worker and tier. DIGEST is that of the lab's
    source, so any change to the lab plays them again (the cache key itself holds the env packages'
    versions); test_analysis.py and test_random_baseline_plays_the_runs_episodes play theirs in
    directories of their own. Without pytest's cache (-p no:cacheprovider): a directory of the session."""
    import hashlib
    source = hashlib.sha256()
    for path in sorted((REPO_ROOT / 'slm_lab').rglob('*.py')):
        source.update(str(path.relative_to(REPO_ROOT)).encode() + b'\0' + path.read_bytes())
    cache = getattr(request.config, 'cache', None)
    folder = (cache.mkdir(f'lab_cache_{source.hexdigest()[:16]}') if cache is not None
              else tmp_path_factory.mktemp('lab_cache'))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv('SLM_LAB_CACHE_DIR', str(folder))
        yield


@pytest.fixture
def make_spec():
    """build_spec(algorithm, env=..., max_frame=..., num_envs=..., log_frequency=..., **meta)."""
    return build_spec


@pytest.fixture
def spec_file(tmp_path):
    """spec_file(specs: dict, name='specs.json') -> path of a spec file in tmp_path."""
    def write(specs: dict, name: str = 'specs.json') -> str:
        return write_spec_file(tmp_path / 'spec' / name, specs)
    return write


@pytest.fixture
def no_png(monkeypatch):
    """No PNG export, here and in session subprocesses (they find no browser)."""
    from slm_lab.experiment import viz
    monkeypatch.setattr(viz, 'png_available', lambda: False)
    monkeypatch.setenv('BROWSER_PATH', os.devnull + '/no-browser')


@pytest.fixture
def lab_run(tmp_path, no_png):
    """lab_run(spec, spec_name, mode='train', overrides=None, data_dir=tmp_path/'data') runs the
    lab on a spec dict (written to a file in tmp_path) and returns (trial metrics, run dir)."""
    from slm_lab import lab

    def run(spec: dict, spec_name: str, mode: str = 'train', overrides: list[str] | None = None,
            data_dir: Path | None = None):
        data_dir = Path(data_dir or tmp_path / 'data')
        path = write_spec_file(tmp_path / 'spec' / f'{spec_name}.json', {spec_name: spec})
        def runs() -> set:  # the data directory's hidden entries (.plotly/, .cache/) are not runs
            return {p for p in data_dir.iterdir() if not p.name.startswith('.')} if data_dir.exists() else set()
        before = runs()
        metrics = lab.run(path, spec_name, mode, overrides, data_dir=str(data_dir))
        new = sorted(runs() - before)
        assert len(new) == 1, f'expected one new run directory, got {new}'
        return metrics, new[0]
    return run


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """Mount a tmpfs of `size` (e.g. '2m') at `path` (created) for the block: a real small disk.
    Root only: skips the test where mounting is not permitted."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f'cannot mount a tmpfs here: {done.stderr.decode().strip()}')
    try:
        yield path
    finally:
        gc.collect()  # a writer torch left open in a traceback keeps the mount busy
        if subprocess.run(['umount', str(path)], capture_output=True).returncode != 0:
            subprocess.run(['umount', '-l', str(path)], check=True)


class LabWarnings:
    """Collect the lab's warnings within a `with` block (its logger does not propagate to pytest's)."""

    def __enter__(self):
        self.records = []
        self.handler = logging.Handler(logging.WARNING)
        self.handler.emit = self.records.append
        logging.getLogger('slm_lab').addHandler(self.handler)
        return self

    def __exit__(self, *exc):
        logging.getLogger('slm_lab').removeHandler(self.handler)

    @property
    def lines(self) -> list[str]:
        return [r.getMessage() for r in self.records]

    @property
    def text(self) -> str:
        return '\n'.join(self.lines)


# --- the order of the test files -----------------------------------------------------------------
# pytest-xdist (--dist loadfile, --no-loadscope-reorder in pyproject.toml) hands each worker whole
# files in the order below, the next one when a worker is almost out of tests. The costliest files
# go first, so that the two workers end together: a long file taken last would leave the other
# worker idle for its whole length. A file's cost: the seconds its selected tests took on a loaded
# machine (2026-11-29; those marked * on 2026-12-07, beside background trainings, several after
# their slow tests dropped processes), its slow tests' in SLOW_FILE_SECONDS (12 s a slow test for a
# file not listed), its other tests' in FAST_FILE_SECONDS (0.3 s a test for a file not listed). A
# file missing here or a figure gone stale costs only some balance, never a test.
SLOW_FILE_SECONDS = {
    'test/persistence/test_resume_safety.py': 177,  # *
    'test/experiment/test_benchmark.py': 178,  # *
    'test/experiment/test_search.py': 165,  # *
    'test/test_python_api.py': 110,  # *
    'test/test_run_dir_names.py': 70,  # *
    'test/test_sb3_side_by_side.py': 160,  # *
    'test/persistence/test_resume.py': 95,  # *
    'test/agent/test_conv_net.py': 70,  # *
    'test/test_fork.py': 45,  # *
    'test/experiment/test_distributed.py': 95,  # *
    'test/test_scheduler.py': 56,  # *
    'test/test_input_guards.py': 60,  # *
    'test/experiment/test_tensorboard.py': 40,  # *
    'test/test_reliability.py': 43,  # *
    'test/experiment/test_search_watch.py': 20,  # *
    'test/persistence/test_resume_reads.py': 50,  # *
    'test/test_cli.py': 75,  # * (many short slow tests: 12 s each would put them first)
    'test/persistence/test_exact_resume.py': 35,  # *
    'test/spec/test_spec_reading.py': 26,  # *
    'test/env/test_env_families.py': 30,  # *
    'test/experiment/test_control.py': 20,  # *
}
FAST_FILE_SECONDS = {  # the fast tier's few costly files (a module fixture that trains, a run in a process)
    'test/experiment/test_benchmark.py': 10,
    'test/test_reliability.py': 48,
    'test/test_sb3_side_by_side.py': 20,
    'test/agent/test_td3.py': 20,
}


@pytest.hookimpl(trylast=True)  # after -m has deselected: the costs of the tests that run
def pytest_collection_modifyitems(config, items):
    tiers: dict[str, set[bool]] = {}
    counts: dict[tuple[str, bool], int] = {}
    for item in items:
        path, slow = item.nodeid.split('::', 1)[0], item.get_closest_marker('slow') is not None
        tiers.setdefault(path, set()).add(slow)
        counts[path, slow] = counts.get((path, slow), 0) + 1
    cost = {path: (SLOW_FILE_SECONDS.get(path, 12 * counts.get((path, True), 0)) if True in slow else 0)
            + (FAST_FILE_SECONDS.get(path, 0.3 * counts.get((path, False), 0)) if False in slow else 0)
            for path, slow in tiers.items()}
    items.sort(key=lambda item: -cost[item.nodeid.split('::', 1)[0]])  # stable: a file's tests keep their order
