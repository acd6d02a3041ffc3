"""What the tests share: running the lab's command line as a user does (one runner), small
specs, reading a run's records, and the exact-resume checks that every algorithm's tests call
(stopped and resumed == straight)."""
from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from slm_lab import lab
from slm_lab.experiment.search.ray_head import LOOPBACK_VAR
from slm_lab.experiment.search.reaper import marked_pids
from slm_lab.persistence import snapshot as checkpoint

ROOT = Path(__file__).resolve().parents[1]
RUN_LAB = str(ROOT / 'run_lab.py')
COMPARE = ['epi', 't', 'opt_step', 'frame', 'total_reward', 'total_reward_ma', 'loss', 'lr', 'explore_var',
           'entropy_coef', 'entropy', 'grad_norm']

PPO = {
    'agent': {'name': 'PPO',
              'algorithm': {'name': 'PPO', 'gamma': 0.98, 'lam': 0.8, 'time_horizon': 32, 'minibatch_size': 64,
                            'training_epoch': 2,
                            'entropy_coef_spec': {'name': 'no_decay', 'start_val': 0.01}},
              'memory': {'name': 'OnPolicyBatchReplay'},
              'net': {'type': 'MLPNet', 'hid_layers': [32], 'hid_layers_activation': 'tanh',
                      'init_fn': 'orthogonal_', 'clip_grad_val': 0.5,
                      'optim_spec': {'name': 'Adam', 'lr': 1e-3}}},
    'env': {'name': 'CartPole-v1', 'num_envs': 4, 'max_frame': 2000},
    'meta': {'log_frequency': 500, 'eval_frequency': 1000, 'random_seed': 7},
}
DQN = {
    'agent': {'name': 'DQN',
              'algorithm': {'name': 'DQN', 'explore_var_spec': {'name': 'linear_decay', 'start_val': 1.0,
                                                                'end_val': 0.1, 'start_step': 0, 'end_step': 1500},
                            'training_frequency': 16, 'training_iter': 2, 'training_start_step': 64},
              'memory': {'name': 'Replay', 'batch_size': 32, 'max_size': 5000},
              'net': {'type': 'MLPNet', 'hid_layers': [32], 'optim_spec': {'name': 'Adam', 'lr': 1e-3},
                      'update_type': 'replace', 'update_frequency': 100}},
    'env': {'name': 'CartPole-v1', 'num_envs': 2, 'max_frame': 2000},
    'meta': {'log_frequency': 500, 'eval_frequency': 1000, 'random_seed': 11, 'snapshot_replay': True},
}


def write_spec(tmp_path: Path, name: str, spec: dict) -> str:
    path = tmp_path / f'{name}.json'
    path.write_text(json.dumps({name: spec}))
    return str(path)


def run_dirs(data: Path, name: str) -> list[Path]:
    return sorted(p for p in data.iterdir() if p.name.startswith(name + '_')) if data.exists() else []


SAVED_SPEC_PARTS = ('', 't0_', 't0_s0_')  # a run's, its trial's and its session's saved specs


def saved_values(run: Path, name: str, path: str) -> list:
    """The value at the dotted key `path` in the run's, the trial's and the session's saved specs
    ('absent' where a spec lacks it)."""
    values = []
    for part in SAVED_SPEC_PARTS:
        node = json.loads((run / f'{name}_{part}spec.json').read_text())
        for key in path.split('.'):
            node = node.get(key, 'absent') if isinstance(node, dict) else 'absent'
        values.append(node)
    return values


def drop_saved_key(run: Path, name: str, path: str) -> None:
    """The run as a lab before the key `path` saved it: the key gone from every saved spec."""
    *parents, last = path.split('.')
    for spec_path in run.glob(f'{name}_*spec.json'):
        spec = json.loads(spec_path.read_text())
        node = spec
        for key in parents:
            node = node[key]
        del node[last]
        spec_path.write_text(json.dumps(spec, indent=2))


def spec_file_in(directory: Path, name: str, spec: dict) -> str:
    """The spec written as {name}.json in its own directory (one file per variant of a spec)."""
    directory.mkdir(parents=True, exist_ok=True)
    return write_spec(directory, name, spec)


def train_one(spec_file: str, name: str, mode: str, overrides: list[str], data: Path) -> Path:
    """lab.run in `data`, which then holds exactly one run of `name`: its directory."""
    lab.run(spec_file, name, mode, overrides, data_dir=str(data))
    (found,) = run_dirs(data, name)
    return found


def visible(directory: Path) -> list[Path]:
    """The entries of a directory a user sees with ls, sorted: the lab's own hidden ones (the data
    directory's .plotly/ bundle, .cache/) left out."""
    return sorted(p for p in Path(directory).iterdir() if not p.name.startswith('.'))


def train_csv(run: Path, name: str, mode: str = 'train') -> pd.DataFrame:
    return pd.read_csv(run / 'info' / f'{name}_t0_s0_session_df_{mode}.csv')


def final_weights(run: Path, name: str) -> dict:
    snap = checkpoint.list_snapshots(run / 'ckpt' / f'{name}_t0_s0')[0]
    state, _ = checkpoint.load_snapshot(snap)
    return state['agent']['algorithm']['nets']


def assert_same_run(a: Path, b: Path, name: str) -> None:
    for mode in ('train', 'eval'):
        df_a, df_b = train_csv(a, name, mode), train_csv(b, name, mode)
        pd.testing.assert_frame_equal(df_a[COMPARE], df_b[COMPARE])
        timing = ['wall_t', 'fps']  # every other cell must match
        pd.testing.assert_frame_equal(df_a.drop(columns=timing), df_b.drop(columns=timing))
    wa, wb = final_weights(a, name), final_weights(b, name)
    assert wa.keys() == wb.keys()
    for net in wa:
        for key in wa[net]:
            assert torch.equal(wa[net][key], wb[net][key]), f'{net}.{key} differs'


def tree_digest(root: Path, skip_logs: bool = False) -> dict:
    out = {}
    for p in sorted(root.rglob('*')):
        if p.is_file() and not (skip_logs and p.parent.name == 'log'):
            out[str(p.relative_to(root))] = hashlib.md5(p.read_bytes()).hexdigest()
    return out


def lab_env() -> dict:
    """The environment for a command a test runs: no headless browser for PNG export (runs stay
    short; HTML graphs are still written), unbuffered output (a test can read it as it comes)."""
    return {**os.environ, 'BROWSER_PATH': os.devnull + '/no-browser', 'PYTHONUNBUFFERED': '1'}


def cli(args: list[str], cwd: Path, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """Run `python run_lab.py ARGS` in `cwd` (its data/ lands there), as a user does; the one
    command-line runner of the suite."""
    return subprocess.run([sys.executable, RUN_LAB, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def run_in_process(args: list[str], cwd: Path, capsys) -> tuple[int, str]:
    """`python run_lab.py ARGS` in `cwd` run in this process, as cli() runs it in its own: the same
    code after the interpreter's start (cli.run_main), without the seconds a process's start and the
    lab's imports cost; a refusal by the argument parser exits as it does there. Returns (exit code,
    stderr), read through pytest's `capsys`. It changes the process's directory while it runs: one
    at a time, never from threads."""
    code, _, err = run_in_process_with_output(args, cwd, capsys)
    return code, err


def run_in_process_with_output(args: list[str], cwd: Path, capsys) -> tuple[int, str, str]:
    """run_in_process, and what the command printed on stdout: (exit code, stdout, stderr)."""
    from slm_lab.cli import run_main
    capsys.readouterr()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        code, _ = run_main(args, own_process=False)
    except SystemExit as e:  # the parser's refusals exit, as in a process of its own
        code = e.code
    finally:
        os.chdir(here)
    out = capsys.readouterr()
    return code, out.out, out.err


def resume_spec(make_spec, *args, **keys) -> dict:
    """A test file's small spec of an algorithm with a replay, `make_spec(*args, **keys)`, as its
    exact-resume checks run it (check_resume_after_max_frame, check_resume_after_sigterm): 300
    frames on 2 envs, training from step 50 (before the stop and after the resume), the replay's
    contents in the snapshots, a record and an evaluation every 100 frames."""
    spec = make_spec(*args, **{'max_frame': 300, 'num_envs': 2, 'training_start_step': 50, **keys})
    spec['meta'].update(snapshot_replay=True, log_frequency=100, eval_frequency=100)
    return spec


def check_resume_after_max_frame(tmp_path: Path, name: str, spec: dict) -> None:
    """Stopped at F by max_frame, resumed to 2F == one uninterrupted run of 2F: the same CSV
    cells (COMPARE, train and eval) and the same final weights. Call it from any algorithm's
    tests with a small spec of that algorithm."""
    spec_file = write_spec(tmp_path, name, spec)
    data_a, data_b = str(tmp_path / 'a'), str(tmp_path / 'b')
    lab.run(spec_file, name, 'train', data_dir=data_a)
    end = 2 * spec['env']['max_frame']
    lab.run(spec_file, name, 'train@latest', [f'env.max_frame={end}'], data_dir=data_a)
    lab.run(spec_file, name, 'train', [f'env.max_frame={end}'], data_dir=data_b)
    (run_a,), (run_b,) = run_dirs(Path(data_a), name), run_dirs(Path(data_b), name)
    assert train_csv(run_a, name)['frame'].iloc[-1] == end
    assert_same_run(run_a, run_b, name)


def check_resume_after_sigterm(tmp_path: Path, name: str, spec: dict) -> Path:
    """SIGTERM mid-run: exits promptly (within 30 s, loose for a loaded machine; the uninterrupted
    run takes minutes) with a snapshot at the current frame; train@latest
    continues to the same numbers and weights as an uninterrupted run. Returns the run stopped and
    resumed."""
    spec = json.loads(json.dumps(spec))
    spec['env']['max_frame'] = 400000
    spec_file = write_spec(tmp_path, name, spec)
    data = tmp_path / 'a'
    data.mkdir()
    proc = subprocess.Popen([sys.executable, RUN_LAB, spec_file, name, 'train'], cwd=data,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    csv = None
    while time.time() < deadline and csv is None:
        found = list(data.glob(f'data/{name}_*/info/{name}_t0_s0_session_df_train.csv'))
        csv = found[0] if found else None
        time.sleep(0.05)
    assert csv is not None, 'training never logged a row'
    time.sleep(random.uniform(0.0, 0.5))
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert time.time() - t0 < 30, 'SIGTERM took longer than 30 s to exit'
    assert proc.returncode == 143, proc.stderr.read()
    run = run_dirs(data / 'data', name)[0]
    snap_frame = int(checkpoint.list_snapshots(run / 'ckpt' / f'{name}_t0_s0')[0].name[1:])
    logged = train_csv(run, name)
    assert snap_frame >= logged['frame'].iloc[-1]
    stop_frame = snap_frame
    # resume to an end two to three log points on, and compare with a run that never stopped
    every = spec['meta']['log_frequency']
    end = (stop_frame // every + 3) * every
    # the resume and the uninterrupted reference in this process, one after the other (the stopped
    # run's process is what a signal needs; a process for the resume costs seconds of imports)
    lab.run(spec_file, name, 'train@latest', [f'env.max_frame={end}'], data_dir=str(data / 'data'))
    lab.run(spec_file, name, 'train', [f'env.max_frame={end}'], data_dir=str(tmp_path / 'b'))
    assert_same_run(run, run_dirs(tmp_path / 'b', name)[0], name)
    return run


PENDULUM = {  # continuous actions, observation and reward normalisation, rigorous eval
    'agent': {'name': 'PPO',
              'algorithm': {'name': 'PPO', 'time_horizon': 64, 'minibatch_size': 64, 'training_epoch': 2},
              'memory': {'name': 'OnPolicyBatchReplay'},
              'net': {'type': 'MLPNet', 'hid_layers': [32], 'hid_layers_activation': 'tanh',
                      'optim_spec': {'name': 'Adam', 'lr': 3e-4}}},
    'env': {'name': 'Pendulum-v1', 'num_envs': 2, 'max_frame': 2048, 'normalize_obs': True,
            'normalize_reward': True},
    'meta': {'log_frequency': 512, 'eval_frequency': 1024, 'rigorous_eval': 1, 'random_seed': 3},
}


def value_from_first_entry(algo) -> None:
    """Replace an actor-critic's critic by V(s) = s[0], so a test sets each state's value by hand
    (the policy stays the net's)."""
    model, pd_out = algo.model, algo.model.pd_out
    model.value = lambda x, prepared=False: x[:, 0]
    model.pd_out_and_value = lambda x, prepared=False: (pd_out(x, prepared), x[:, 0])


def fill_replay(agent, clock, steps: int) -> None:
    """Store `steps` vector steps of random observations and rewards, with the agent's actions
    (in the unit range an off-policy memory stores for Box actions), ticking the clock."""
    rng = np.random.default_rng(0)
    alg = agent.algorithm
    n, obs_dim = alg.num_envs, alg.in_dim
    for _ in range(steps):
        obs = rng.normal(size=(n, obs_dim)).astype(np.float32)
        action = alg.act(obs)
        alg.memory.add(obs, alg.memory_action(action), rng.normal(size=n),
                       rng.normal(size=(n, obs_dim)).astype(np.float32), np.zeros(n, bool), np.zeros(n, bool))
        clock.tick()


def assert_same_steps(a, b, actions) -> None:
    """Step two vector envs with the same actions: every array they return is equal, step by step."""
    for action in actions:
        for x, y in zip(a.step(action), b.step(action)):
            if isinstance(x, np.ndarray):
                np.testing.assert_array_equal(x, y)


def assert_truncated_at(env, ends: list[int], steps: int = 120) -> None:
    """Step a 2-env vector env with action 0 for `steps` steps (from a seed-0 reset), then close
    it: its first episodes end (all its envs at once) at exactly the step indices `ends`."""
    try:
        env.reset(seed=0)
        done = [i for i in range(steps) if env.step(np.zeros(2, dtype=int))[3].all()]
        assert done[:len(ends)] == ends
    finally:
        env.close()


def lab_processes(root: Path) -> list[str]:
    """Processes of a search or benchmark under `root`: its trial processes (their command names the
    run) and Ray's (marked through the environment the lab gave them)."""
    found = []
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f'/proc/{entry}/cmdline').read_bytes().replace(b'\0', b' ').decode(errors='replace')
            env = Path(f'/proc/{entry}/environ').read_bytes()
        except OSError:
            continue
        if str(root) in cmd or (b'SLM_LAB_SEARCH_ID=' in env and str(root).encode() in env):
            found.append(f'{entry}: {cmd[:120]}')
    return found


def process_tree(pid: int) -> set[int]:
    """`pid` and its live descendants."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir('/proc')):
        try:
            ppid = int(Path(f'/proc/{entry}/stat').read_text().rsplit(')', 1)[-1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = set(), [pid]
    while todo:
        tree.add(todo[-1])
        todo.extend(children.get(todo.pop(), []))
    return tree


def listening_addresses(pids) -> set[str]:
    """The local addresses ('IP:PORT') the TCP sockets of processes `pids` listen on (/proc/net/tcp
    and tcp6, matched to each process's open sockets)."""
    import ipaddress
    assert sys.byteorder == 'little', '/proc/net/tcp holds addresses in the machine\'s byte order'
    inodes = set()
    for pid in map(str, pids):
        try:
            fds = os.listdir(f'/proc/{pid}/fd')
        except OSError:  # ended meanwhile
            continue
        for fd in fds:
            try:
                link = os.readlink(f'/proc/{pid}/fd/{fd}')
            except OSError:  # closed meanwhile: the others still count
                continue
            if link.startswith('socket:['):
                inodes.add(link[8:-1])
    found = set()
    for table in ('/proc/net/tcp', '/proc/net/tcp6'):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != '0A' or fields[9] not in inodes:  # 0A: LISTEN
                continue
            host, port = fields[1].split(':')
            raw = bytes.fromhex(host)  # 32-bit words in the machine's (little-endian) order
            raw = b''.join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            found.add(f'{ipaddress.ip_address(raw)}:{int(port, 16)}')
    return found


def off_loopback(addresses) -> set[str]:
    """Those of `addresses` ('IP:PORT', from listening_addresses) reachable from outside the machine."""
    import ipaddress
    def loopback(address: str) -> bool:
        ip = ipaddress.ip_address(address.rsplit(':', 1)[0])
        return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)
    return {a for a in addresses if not loopback(a)}


def sessions_have_autogroups() -> bool:
    """Whether the kernel shares the CPU between sessions first (autogroup scheduling): a process in
    a new session reads its group from /proc/self/autogroup. False off Linux and where autogroup is
    off or does not apply (a cgroup of its own for the CPU reads empty)."""
    if not Path('/proc/self/autogroup').exists():
        return False
    done = subprocess.run([sys.executable, '-c', 'print(open("/proc/self/autogroup").read())'],
                          capture_output=True, text=True, start_new_session=True)
    return done.returncode == 0 and done.stdout.strip().startswith('/autogroup-')


def ray_processes() -> set[str]:
    """Live Ray processes on this machine: gcs_server, raylet, ray::* workers and agents."""
    found = set()
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            cmd = Path(f'/proc/{pid}/cmdline').read_bytes()
            state = Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[-1].split()[0]
        except OSError:
            continue
        if state != 'Z' and (cmd.startswith(b'ray::') or b'gcs_server' in cmd or b'/raylet' in cmd):
            found.add(pid)
    return found


class TwoNodeRayCluster:
    """A real Ray cluster on loopback: a head and a second node of one CPU each, started with `ray
    start` (token authentication, its token in the environment); `address` is its HOST:PORT and
    `env` the environment to run the lab against it with. Every one of its servers listens on
    loopback only (checked): `--node-ip-address=127.0.0.1` alone does not do it, Ray turns 127.0.0.1
    into the machine's network address and listens on every interface; with multi-node clusters
    switched off (LOOPBACK_VAR=0, as the lab's local Ray: search/ray_head.py) it keeps 127.0.0.1,
    and `ray start` then refuses a second node, which therefore joins through JOIN_ON_LOOPBACK.
    On exit every process of it is gone (checked: nothing of it may outlive the test)."""

    # `ray start` for the second node with Ray's loopback setting on, except in the one check of
    # that command's that refuses a second node under it (ray.scripts.scripts reads it there)
    JOIN_ON_LOOPBACK = '\n'.join([
        'import sys, types',
        'import ray._private.ray_constants as constants',
        'import ray.scripts.scripts as scripts',
        'view = types.ModuleType(constants.__name__)',
        'view.__dict__.update(vars(constants), ENABLE_RAY_CLUSTER=True)',
        'scripts.ray_constants = view',
        "sys.argv = ['ray', *sys.argv[1:]]",
        'scripts.main()'])

    def __enter__(self):
        import secrets
        import socket

        from slm_lab.experiment.search.reaper import MARKER_VAR
        with socket.socket() as s:
            s.bind(('127.0.0.1', 0))
            port = s.getsockname()[1]
        self.marker, self.token = secrets.token_hex(8), secrets.token_hex(32)
        env = {**os.environ, MARKER_VAR: self.marker, 'RAY_AUTH_MODE': 'token', 'RAY_AUTH_TOKEN': self.token,
               'PYTHONPATH': str(ROOT), LOOPBACK_VAR: '0'}
        ray_bin = str(Path(sys.executable).parent / 'ray')
        self.temp = Path('/tmp') / f'slm_ray_test_{self.marker}'
        self.address = f'127.0.0.1:{port}'
        self.env = {k: v for k, v in env.items() if k != MARKER_VAR}
        try:
            head = subprocess.run([ray_bin, 'start', '--head', '--node-ip-address=127.0.0.1', f'--port={port}',
                                   '--num-cpus=1', '--include-dashboard=false', f'--temp-dir={self.temp}',
                                   '--disable-usage-stats'], env=env, capture_output=True, text=True, timeout=120)
            assert head.returncode == 0, head.stderr[-2000:]
            node = subprocess.run([sys.executable, '-c', self.JOIN_ON_LOOPBACK, 'start', f'--address={self.address}',
                                   '--node-ip-address=127.0.0.1', '--num-cpus=1', '--disable-usage-stats'],
                                  env=env, capture_output=True, text=True, timeout=120)
            assert node.returncode == 0, node.stderr[-2000:]
            # `ray start` returns before the cluster's resource view counts the second node (seconds
            # on a loaded machine): a search started then sees one CPU and runs its trials in turn
            deadline, status = time.monotonic() + 90, ''
            while '/2.0 CPU' not in status:
                assert time.monotonic() < deadline, f'the cluster never showed its 2 CPUs: {status[-2000:]}'
                status = subprocess.run([ray_bin, 'status', f'--address={self.address}'], env=env,
                                        capture_output=True, text=True, timeout=60).stdout
            exposed = off_loopback(listening_addresses(marked_pids(self.marker, self.token)))
            assert not exposed, f'the test cluster listens beyond loopback: {sorted(exposed)}'
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        import shutil

        from slm_lab.experiment.search.reaper import sweep
        sweep(self.marker, self.token)  # Ray's agents too (their RAY_RAYLET_PID names a marked raylet)
        shutil.rmtree(self.temp, ignore_errors=True)
        if exc_type is None:
            time.sleep(0.5)
            # the cluster's processes only (its marker or token, and their children): a search or a
            # benchmark elsewhere on the machine runs Ray processes of its own meanwhile
            left = set(map(str, marked_pids(self.marker, self.token))) & ray_processes()
            assert not left, f'processes of the test cluster left behind: {left}'
