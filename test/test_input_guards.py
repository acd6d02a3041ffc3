"""Input that used to end in a traceback, a hang, garbage or files outside data/: spec names that
are paths, non-finite numbers, sizes the machine cannot hold, absurd session counts, names given
as objects. Each is refused in one line before a run directory exists; and a trial's sessions
run in a pool no wider than the machine's cores."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from lab_helpers import cli as lab_cli, visible
from lab_helpers import lab_env, run_in_process

from slm_lab import lab, resources
from slm_lab.agent.estimate import estimate_session
from slm_lab.env import agent_action_space, make_env
from slm_lab.lib.errors import Preempted, SpecError
from slm_lab.spec import load_spec, validate_spec

REPO_ROOT = Path(__file__).resolve().parent.parent
RUN_LAB = str(REPO_ROOT / 'run_lab.py')
DEMO = str(REPO_ROOT / 'spec' / 'demo.json')


def refused(spec: dict, tmp_path: Path, spec_name: str = 'guard', overrides: list[str] | None = None,
            mode: str = 'train') -> str:
    """The one-line SpecError lab.run gives for `spec` under `spec_name`; checks that nothing was
    written anywhere in tmp_path but the spec file."""
    spec_path = tmp_path / 'specs' / 'specs.json'
    spec_path.parent.mkdir(exist_ok=True)
    spec_path.write_text(json.dumps({spec_name: spec}))
    data_dir = tmp_path / 'work' / 'data'
    with pytest.raises(SpecError) as info:
        lab.run(str(spec_path), spec_name, mode, overrides, data_dir=str(data_dir))
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob('*') if p.parent != spec_path.parent)
    assert written == ['specs'], f'a refused spec must write nothing, found {written}'
    message = str(info.value)
    assert '\n' not in message, f'the message must be one line: {message!r}'
    return message


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return lab_cli(args, cwd, timeout=120, env=lab_env())


# --- spec names are names, not paths ------------------------------------------------------------

@pytest.mark.parametrize('name', ['../escape', 'a/b', '/tmp/abs', '.hidden', '..', 'x' * 129, 'a b', ''])
def test_a_spec_name_that_is_not_a_plain_name_is_refused(name, make_spec, tmp_path):
    message = refused(make_spec('PPO'), tmp_path, spec_name=name)
    assert 'spec name' in message and 'letters, digits' in message


def test_train_at_latest_checks_the_spec_name_too(make_spec, tmp_path):
    message = refused(make_spec('PPO'), tmp_path, spec_name='../escape', mode='train@latest')
    assert 'spec name' in message


def test_a_spec_name_with_dots_and_dashes_is_fine(make_spec, spec_file):
    path = spec_file({'ppo-cartpole.v2': make_spec('PPO')})
    assert load_spec(path, 'ppo-cartpole.v2')['name'] == 'ppo-cartpole.v2'


# --- non-finite numbers ---------------------------------------------------------------------------

NON_FINITE = {  # key path: where the value goes, as a -s override (JSON: NaN, Infinity, -Infinity)
    'agent.algorithm.gamma': 'NaN',  # a schema key with a range that NaN passes
    'agent.algorithm.lam': 'Infinity',
    'agent.net.optim_spec.lr': 'Infinity',  # a torch keyword argument: free-form
    'agent.net.loss_spec.beta': 'NaN',
    'agent.algorithm.clip_eps_spec.start_val': '-Infinity',  # a schedule value
    'env.make_kwargs.sutton_barto_reward': 'NaN',
}


@pytest.mark.parametrize('key', list(NON_FINITE))
def test_non_finite_numbers_are_refused_naming_the_key(key, make_spec, tmp_path):
    spec = make_spec('PPO')
    spec['agent']['net']['loss_spec'] = {'name': 'SmoothL1Loss'}
    message = refused(spec, tmp_path, overrides=[f'{key}={NON_FINITE[key]}'])
    assert message.startswith(f'{key}: {NON_FINITE[key]} is not allowed'), message


def test_non_finite_numbers_in_the_spec_file_are_refused(make_spec, tmp_path):
    spec_path = tmp_path / 'nan.json'
    text = json.dumps({'s': make_spec('DQN')})
    assert '"lr": 0.001' in text and '"max_size": 1000' in text
    spec_path.write_text(text.replace('"lr": 0.001', '"lr": NaN'))  # as Python's json writes and reads NaN
    with pytest.raises(SpecError, match=r'agent\.net\.optim_spec\.lr: NaN is not allowed'):
        load_spec(str(spec_path), 's')
    spec_path.write_text(text.replace('"max_size": 1000', '"max_size": 1e400'))  # overflows to Infinity
    with pytest.raises(SpecError, match=r'agent\.memory\.max_size: Infinity is not allowed'):
        load_spec(str(spec_path), 's')


def test_non_finite_list_items_name_their_index(make_spec):
    spec = make_spec('PPO')
    spec['agent']['net']['hid_layers'] = [32, float('inf')]
    with pytest.raises(SpecError, match=r'agent\.net\.hid_layers\[1\]: Infinity'):
        validate_spec(spec)


# --- memory the machine cannot hold -------------------------------------------------------------

HUGE = {  # (algorithm, override, the key the message must blame)
    'net of 40 GB': ('PPO', 'agent.net.hid_layers=[100000, 100000]', 'agent.net.hid_layers'),
    'on-policy batch of 1e9 steps': ('PPO', 'agent.algorithm.time_horizon=1000000000', 'agent.algorithm.time_horizon'),
    'replay of 1e12': ('DQN', 'agent.memory.max_size=1000000000000', 'agent.memory.max_size'),
    'replay batch of 1e12': ('DQN', 'agent.memory.batch_size=1000000000000', 'agent.memory.batch_size'),
}


@pytest.mark.parametrize('case', list(HUGE))
def test_a_spec_the_machine_cannot_hold_is_refused_before_anything_is_built(case, make_spec, tmp_path):
    algorithm, override, key = HUGE[case]
    t0 = time.perf_counter()
    message = refused(make_spec(algorithm), tmp_path, overrides=[override])
    assert time.perf_counter() - t0 < 20, 'the estimate must not allocate what it estimates'
    total = resources.format_bytes(resources.machine_memory().total)
    assert message.startswith('the spec needs about ') and f'this machine has {total} of memory' in message
    assert key in message


@pytest.mark.parametrize('num_envs', [4097, 2**63])
def test_env_count_is_bounded(num_envs, make_spec, tmp_path):
    message = refused(make_spec('PPO'), tmp_path, overrides=[f'env.num_envs={num_envs}'])
    assert message.startswith('env.num_envs:') and 'it must be <= 4096' in message


def test_the_estimate_counts_each_net_as_built(make_spec):
    """Trained nets cost weights + grads + two Adam moments (16 bytes a parameter), a target net its
    weights (4): compared with the parameters of the nets the algorithm really builds."""
    from slm_lab.agent import Agent
    from slm_lab.env import Clock
    for algorithm, shared in (('DQN', False), ('VanillaDQN', False), ('PPO', False), ('PPO', True),
                              ('Reinforce', False)):
        spec = make_spec(algorithm)
        spec['agent']['net']['hid_layers'] = [48, 24]
        spec['agent']['net']['shared'] = shared
        spec = validate_spec(spec)
        env = make_env({**spec['env'], 'num_envs': 1})
        agent = Agent(spec, env.single_observation_space, env.single_action_space, 1, Clock(100, 1), seed=0)
        trained = {id(p) for opt in agent.algorithm.optimizers.values() for g in opt.param_groups for p in g['params']}
        params = {id(p): p for net in agent.algorithm.nets().values() for p in net.parameters()}
        expected = sum(p.numel() * (16 if i in trained else 4) for i, p in params.items())
        needs = estimate_session(spec, env.single_observation_space, env.single_action_space)
        env.close()
        assert [n.nbytes for n in needs if n.what == 'nets'] == [expected], (algorithm, shared)


def test_the_estimate_counts_the_replay_and_the_on_policy_batch(make_spec):
    spec = validate_spec(make_spec('DQN'))  # CartPole: 4 float32 observations, int64 actions
    env = make_env({**spec['env'], 'num_envs': 1})
    needs = {n.what: n for n in estimate_session(spec, env.single_observation_space,
                                                            env.single_action_space)}
    assert needs['replay memory'].nbytes == 1000 * (2 * 16 + 8 + 4 * 4)
    spec = validate_spec(make_spec('PPO', num_envs=3))
    needs = {n.what: n for n in estimate_session(spec, env.single_observation_space,
                                                            env.single_action_space)}
    env.close()
    # the batch buffers twice (and their tensors): at least what the memory allocates
    assert needs['on-policy batch'].nbytes > 2 * 32 * 3 * (2 * 16 + 8 + 4 * 4)


SUITES = REPO_ROOT / 'spec' / 'benchmark' / 'suites'  # benchmark suite files (docs/benchmark.md)


def test_shipped_specs_pass_the_estimate_on_a_small_machine():
    """Every spec the lab ships fits a 4 GiB machine, with a session per core of a 16-core one;
    the Atari ones (a DQN replay of 200k frames; the side-by-side's dqn_pong_zoo) fit this 24 GiB
    one with 4 sessions."""
    small = resources.MachineMemory(total=4 * 2**30, available=None)
    paths = [Path(DEMO)] + sorted(p for p in (REPO_ROOT / 'spec' / 'benchmark').rglob('*.json') if p.parent != SUITES)
    for path in paths:
        for name in json.loads(path.read_text()):
            spec = load_spec(str(path), name, ['meta.max_session=4'])
            env = make_env({**spec['env'], 'num_envs': 1})
            atari = len(env.single_observation_space.shape) == 3  # frames, wherever the file lies
            machine = resources.MachineMemory(total=24 * 2**30, available=None) if atari else small
            bound = 16 * 2**30 if atari else 2 * 2**30
            needs = estimate_session(spec, env.single_observation_space, agent_action_space(env))
            assert resources.check_memory(spec, needs, machine) < bound, f'{path.name} {name}'
            env.close()


def test_the_estimate_multiplies_by_the_sessions_that_run_at_once(make_spec, monkeypatch):
    spec = validate_spec(make_spec('DQN', max_session=5))
    env = make_env({**spec['env'], 'num_envs': 1})
    needs = estimate_session(spec, env.single_observation_space, env.single_action_space)
    per_session = sum(n.nbytes for n in needs)
    big = resources.MachineMemory(total=2**50, available=None)
    for width, at_once in ((1, 1), (2, 2), (8, 5)):
        monkeypatch.setattr(resources, 'session_pool_width', lambda w=width: w)
        assert resources.check_memory(spec, needs, big) == per_session * at_once
    tight = resources.MachineMemory(total=per_session * 4, available=None)
    with pytest.raises(SpecError, match=r'x 5 sessions at once.*or meta\.max_session'):
        resources.check_memory(spec, needs, tight)
    # a distributed trial's sessions all start together, however few cores
    monkeypatch.setattr(resources, 'session_pool_width', lambda: 1)
    spec['meta']['distributed'] = 'shared'
    assert resources.check_memory(spec, needs, big) == per_session * 5
    env.close()


# --- absurd counts --------------------------------------------------------------------------------

@pytest.mark.parametrize('override, key', [
    ('meta.max_session=1000', 'meta.max_session'), (f'meta.max_session={2**63}', 'meta.max_session'),
    (f'meta.max_trial={2**63}', 'meta.max_trial'), (f'meta.torch_num_threads={2**63}', 'meta.torch_num_threads'),
    (f'meta.random_seed={10**30}', 'meta.random_seed')])
def test_absurd_counts_are_refused_at_validation(override, key, make_spec, tmp_path):
    t0 = time.perf_counter()
    message = refused(make_spec('PPO'), tmp_path, overrides=[override])
    assert message.startswith(f'{key}: ') and 'out of range' in message
    assert time.perf_counter() - t0 < 20


# --- names given as objects -----------------------------------------------------------------------

@pytest.mark.parametrize('key, value', [
    ('agent.memory.name', {}), ('agent.algorithm.name', {}), ('agent.net.type', []), ('env.name', {}),
    ('agent.net.optim_spec.name', {}), ('agent.net.loss_spec.name', []),
    ('agent.net.lr_scheduler_spec.name', {}), ('agent.algorithm.explore_var_spec.name', {})])
def test_a_name_given_as_an_object_is_refused_naming_the_key(key, value, make_spec, tmp_path):
    spec = make_spec('DQN')
    message = refused(spec, tmp_path, overrides=[f'{key}={json.dumps(value)}'])
    assert message.startswith(f'{key}: '), message


def test_a_component_name_given_as_an_object_lists_the_valid_names(make_spec):
    spec = make_spec('DQN')
    spec['agent']['memory']['name'] = {}
    with pytest.raises(SpecError, match=r'agent\.memory\.name: expected a string, got dict.*Replay'):
        validate_spec(spec)


# --- the command line -----------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.subprocess
def test_the_command_line_answers_each_guard_in_one_line(tmp_path, capsys):
    """Each refused in one line on stderr, exit 2, nothing written: the first by run_lab.py in a
    process of its own, the others by the same code in this process (run_in_process: no process
    start and lab imports, seconds each, for what the interpreter's start does not change)."""
    spec_file = tmp_path / 'escape.json'
    specs = json.loads(Path(DEMO).read_text())
    spec_file.write_text(json.dumps({'../escape': specs['ppo_cartpole']}))
    cases = [([str(spec_file), '../escape', 'train'], 'spec name'),
             ([DEMO, 'ppo_cartpole', 'train', '-s', 'agent.algorithm.gamma=NaN'], 'agent.algorithm.gamma: NaN'),
             ([DEMO, 'ppo_cartpole', 'train', '-s', 'agent.net.hid_layers=[100000,100000]'], 'this machine has'),
             ([DEMO, 'ppo_cartpole', 'train', '-s', f'meta.max_session={2**63}'], 'meta.max_session'),
             ([DEMO, 'ppo_cartpole', 'train', '-s', 'agent.net.optim_spec.lr=true'],
              'agent.net.optim_spec.lr: expected a number, got true'),
             ([DEMO, 'ppo_cartpole', 'train', '-s', 'agent.algorithm.training_epoch=1000000000'],
              'agent.algorithm.training_epoch: 1000000000 is out of range; it must be <= 10000')]
    for i, (args, expected) in enumerate(cases):
        cwd = tmp_path / 'cwd'
        cwd.mkdir()
        if i == 0:
            out = cli(args, cwd)
            code, stderr = out.returncode, out.stderr
        else:
            code, stderr = run_in_process(args, cwd, capsys)
        lines = stderr.strip().splitlines()
        assert code == 2 and len(lines) == 1, stderr
        assert lines[0].startswith('error: ') and expected in lines[0]
        assert not list(cwd.iterdir()) and not (tmp_path / 'escape').exists(), 'nothing may be written'
        cwd.rmdir()


# --- sessions run in a pool no wider than the cores -----------------------------------------------

def _session_processes() -> set[int]:
    """Pids of this process's children that are multiprocessing spawn workers (the sessions;
    not the resource tracker)."""
    pids = set()
    for task in Path(f'/proc/{os.getpid()}/task').iterdir():
        try:
            children = (task / 'children').read_text().split()
        except OSError:
            continue
        for pid in children:
            try:
                if b'spawn_main' in Path(f'/proc/{pid}/cmdline').read_bytes():
                    pids.add(int(pid))
            except OSError:
                pass
    return pids


def _has_children(pid: int) -> bool:
    try:
        return any((task / 'children').read_text().split() for task in Path(f'/proc/{pid}/task').iterdir())
    except OSError:
        return False


class SessionWatcher:
    """Samples the live session processes every few milliseconds while a trial runs."""

    def __init__(self):
        self.most_at_once, self.seen = 0, set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        while not self._done.is_set():
            alive = _session_processes()
            # a session runs once it has made its async envs (processes of its own); a process
            # started ahead of its turn waits without any
            running = [pid for pid in alive if _has_children(pid)]
            self.most_at_once = max(self.most_at_once, len(running))
            self.seen |= alive
            time.sleep(0.005)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()


@pytest.mark.slow
@pytest.mark.skipif(not Path('/proc/self/task').is_dir(), reason='reads child processes from /proc')
def test_sessions_run_at_most_pool_width_at_once(make_spec, lab_run, monkeypatch):
    monkeypatch.setattr(resources, 'session_pool_width', lambda: 2)
    # async envs: a session process starts env processes of its own (a daemon process could not)
    # 8192 frames: a session trains for seconds, longer than two sessions' start-ups drift apart on a
    # loaded machine (with 128 frames the first had ended before the second made its envs; with 2048,
    # once, in a slow tier run beside a niced benchmark; with 4096, once, in CI beside three)
    spec = make_spec('PPO', max_frame=8192, num_envs=2, log_frequency=2048, max_session=3)
    spec['env']['vectorization_mode'] = 'async'
    with SessionWatcher() as watcher:
        metrics, run_dir = lab_run(spec, 'pool')
    assert watcher.most_at_once == 2, f'at most 2 sessions at once (and 2 did run together): {watcher.most_at_once}'
    assert len(watcher.seen) == 3
    for s in range(3):  # every session ran to the end, in its own process
        lines = (run_dir / 'info' / f'pool_t0_s{s}_session_df_eval.csv').read_text().splitlines()
        assert lines[-1].split(',')[4] == str(spec['env']['max_frame'])  # the frame column
    assert metrics['scalar']['final_return_ma'] is not None


@pytest.mark.slow
@pytest.mark.skipif(not Path('/proc/self/task').is_dir(), reason='reads child processes from /proc')
def test_a_stop_counts_sessions_not_started_as_stopped_and_they_run_on_resume(make_spec, lab_run, tmp_path,
                                                                              monkeypatch):
    monkeypatch.setattr(resources, 'session_pool_width', lambda: 1)
    spec = make_spec('PPO', max_frame=1000, log_frequency=64, max_session=2)
    data_dir = tmp_path / 'data'

    def stop_when_session_0_trains():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list(data_dir.glob('*/info/stop_t0_s0_session_df_train.csv')):
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGTERM)  # what a scheduler sends; the trial forwards it once

    stopper = threading.Thread(target=stop_when_session_0_trains, daemon=True)
    stopper.start()
    with pytest.raises(Preempted) as info:
        lab_run(spec, 'stop')
    stopper.join()
    assert info.value.signum == signal.SIGTERM
    run_dir = visible(data_dir)[0]
    assert not (run_dir / 'log' / 'stop_t0_s1.log').exists(), 'session 1 waited for a free core'
    metrics = lab.run(str(tmp_path / 'spec' / 'stop.json'), 'stop', 'train@latest', data_dir=str(data_dir))
    assert metrics is not None
    for s in range(2):
        lines = (run_dir / 'info' / f'stop_t0_s{s}_session_df_eval.csv').read_text().splitlines()
        assert lines[-1].split(',')[4] == '1000'  # the frame column


# --- a bool is not a number; every count has a bound (issue 27) -------------------------------------

def _all_fields():
    """(key path, Field) of every key of every schema the validator checks a spec against (nested
    ones included): top level, meta, env, schedules, and each algorithm, memory and net."""
    from slm_lab.agent.algorithm import ALGORITHMS
    from slm_lab.agent.memory import MEMORIES
    from slm_lab.agent.net import NETS
    from slm_lab.lib.decay import SCHEDULE_SCHEMA
    from slm_lab.spec import AGENT_SCHEMA, ENV_SCHEMA, META_SCHEMA, TOP_SCHEMA
    schemas = [('spec', TOP_SCHEMA), ('meta', META_SCHEMA), ('env', ENV_SCHEMA), ('agent', AGENT_SCHEMA),
               ('schedule', SCHEDULE_SCHEMA)]
    schemas += [(f'agent.algorithm({name})', {**cls.spec_schema, **cls.memory_schema})
                for name, cls in ALGORITHMS.items()]
    schemas += [(f'agent.memory({name})', cls.spec_schema) for name, cls in MEMORIES.items()]
    schemas += [(f'agent.net({name})', cls.spec_schema) for name, cls in NETS.items()]
    stack = list(schemas)
    while stack:
        path, schema = stack.pop()
        for key, fld in schema.items():
            yield f'{path}.{key}', fld
            if fld.schema is not None:
                stack.append((f'{path}.{key}', fld.schema))


def test_no_numeric_key_of_any_schema_takes_a_bool():
    """Python's bool is an int: each check that takes a number must refuse true and false (and an
    int list's items too), naming the key."""
    from slm_lab.lib.schema import check_value
    numeric = [(path, fld) for path, fld in _all_fields() if (int in fld.types or float in fld.types)
               and bool not in fld.types]
    assert len(numeric) > 100, 'the walk must reach the algorithms, memories and nets'
    for path, fld in numeric:
        for value in (True, False):
            with pytest.raises(SpecError, match=rf'^{re.escape(path)}: expected'):
                check_value(value, fld, path)
    for path, fld in _all_fields():
        if fld.item_type in (int, float):
            with pytest.raises(SpecError, match=rf'^{re.escape(path)}\[1\]: expected'):
                check_value([1, True], fld, path)


BOOL_AS_NUMBER = {  # -s override: the message's start
    'agent.net.optim_spec.lr=true': 'agent.net.optim_spec.lr: expected a number, got true (a bool is not a number); '
                                     "Adam's default: 0.001",
    'agent.net.optim_spec.betas=[0.9, true]': 'agent.net.optim_spec.betas[1]: expected a number, got true',
    'agent.net.optim_spec.amsgrad=1': "agent.net.optim_spec.amsgrad: expected true or false, got 1; Adam's default: "
                                      'false',
    'agent.net.lr_scheduler_spec={"name": "StepLR", "step_size": true}':
        'agent.net.lr_scheduler_spec.step_size: expected a number, got true',
    'agent.net.lr_scheduler_spec={"name": "MultiStepLR", "milestones": [100, false]}':
        'agent.net.lr_scheduler_spec.milestones[1]: expected a number, got false',
    'agent.net.loss_spec={"name": "HuberLoss", "delta": false}': 'agent.net.loss_spec.delta: expected a number',
    'agent.net.optim_spec={"name": "Lookahead", "k": true}': 'agent.net.optim_spec.k: expected an integer >= 1',
    'agent.net.lr_scheduler_spec={"name": "LinearToZero", "frame": true}':
        'agent.net.lr_scheduler_spec.frame: expected a frame count',
    'agent.algorithm.gamma=true': 'agent.algorithm.gamma: expected number, got bool',
    'agent.algorithm.training_epoch=false': 'agent.algorithm.training_epoch: expected int, got bool',
    'env.clip_reward=[false, true]': 'env.clip_reward: [False, True] is not valid',
    'agent.net.optim_spec.lr=null': "agent.net.optim_spec.lr: null is not allowed; expected a number (Adam's "
                                    'default 0.001: leave the key out for it)',
    'agent.net.lr_scheduler_spec={"name": "StepLR", "step_size": null}':
        'agent.net.lr_scheduler_spec.step_size: null is not allowed; expected a number',
    'agent.net.optim_spec.lr="fast"': 'agent.net.optim_spec.lr: expected a number, got "fast"',
}


@pytest.mark.parametrize('override', list(BOOL_AS_NUMBER))
def test_a_bool_or_null_where_a_number_goes_is_refused_naming_the_key(override, make_spec, tmp_path):
    """Before: -s agent.net.optim_spec.lr=true trained with a learning rate of 1.0, and lr=null
    failed inside Adam with its own message."""
    message = refused(make_spec('PPO'), tmp_path, overrides=[override])
    assert message.startswith(BOOL_AS_NUMBER[override]), message


def test_null_stays_valid_where_torch_takes_it(make_spec, spec_file):
    spec = make_spec('PPO')
    spec['agent']['net']['optim_spec'].update(foreach=None, fused=None, betas=[0.9, 0.99], amsgrad=True)
    spec['agent']['net']['loss_spec'] = {'name': 'MSELoss', 'reduce': None}
    loaded = load_spec(spec_file({'ok': spec}), 'ok')
    assert loaded['agent']['net']['optim_spec']['foreach'] is None


COUNTS = [  # (algorithm, -s key, bound)
    ('PPO', 'agent.algorithm.training_epoch', 10_000), ('PPO', 'agent.algorithm.minibatch_size', 10**8),
    ('DQN', 'agent.algorithm.training_iter', 10_000), ('DQN', 'agent.algorithm.training_batch_iter', 10_000),
    ('DQN', 'agent.algorithm.training_frequency', 10**15), ('DQN', 'agent.algorithm.training_start_step', 10**15),
    ('DQN', 'agent.net.update_frequency', 10**15), ('DQN', 'agent.algorithm.explore_var_spec.end_step', 10**15),
    ('PPO', 'meta.log_frequency', 10**15), ('PPO', 'meta.eval_frequency', 10**15),
    ('PPO', 'meta.checkpoint_frequency', 10**15), ('PPO', 'meta.keep_checkpoints', 10_000),
    ('PPO', 'env.max_t', 10**15), ('PPO', 'meta.num_gpus', 1024), ('PPO', 'agent.net.cuda_id', 1024),
    ('ActorCritic', 'agent.algorithm.num_step_returns', 10**15),
    ('Reinforce', 'agent.algorithm.training_frequency', 10**15),
]


@pytest.mark.parametrize('algorithm, key, bound', COUNTS)
def test_every_count_has_an_upper_bound_naming_the_key(algorithm, key, bound, make_spec, tmp_path):
    """Before: agent.algorithm.training_epoch=1000000000 was accepted, and the run never logged a row."""
    spec = make_spec(algorithm)
    if key == 'agent.algorithm.num_step_returns':
        spec['agent']['algorithm']['lam'] = None
    message = refused(spec, tmp_path, overrides=[f'{key}={bound + 1}'])
    assert message == f'{key}: {bound + 1} is out of range; it must be <= {bound}', message
    validate_spec(spec)  # the spec itself is fine


def test_the_bounds_of_recurrent_nets_and_frame_stacks(make_spec, tmp_path):
    spec = make_spec('DQN')
    spec['agent']['net'] = {'type': 'RecurrentNet', 'cell_type': 'GRU', 'fc_hid_layers': [8], 'rnn_hidden_size': 6,
                            'seq_len': 3, 'optim_spec': {'name': 'Adam', 'lr': 1e-3}}
    for override, start in (('agent.net.rnn_hidden_size=4097', 'agent.net.rnn_hidden_size: 4097 is out of range'),
                            ('agent.net.rnn_num_layers=65', 'agent.net.rnn_num_layers: 65 is out of range'),
                            ('agent.net.seq_len=1025', 'agent.net.seq_len: 1025 is out of range')):
        assert refused(spec, tmp_path, overrides=[override]).startswith(start)
    spec = make_spec('DQN')
    spec['env'].update(frame_op='concat', frame_op_len=1025)
    assert refused(spec, tmp_path).startswith('env.frame_op_len: 1025 is out of range; it must be <= 1024')


def test_shipped_specs_stay_within_the_bounds():
    """Every spec the lab ships (placeholders filled) loads: no bound refuses a real spec."""
    from slm_lab.spec.read import read_spec_file
    from slm_lab.experiment.benchmark import read_suite
    paths = sorted(p for p in (REPO_ROOT / 'spec').rglob('*') if p.suffix in ('.json', '.yaml', '.yml'))
    for suite in [p for p in paths if p.parent == SUITES]:  # suite files, not spec files: read as suites
        assert read_suite(str(suite)).rows
    paths = [p for p in paths if p.parent != SUITES]
    loaded = 0
    for path in paths:
        for name, raw in read_spec_file(str(path)).items():
            if not name.startswith('_'):
                holes = '${' in json.dumps(raw)
                load_spec(str(path), name, ['env=CartPole-v1', 'max_frame=10000'] if holes else [])
                loaded += 1
    assert loaded > 40
