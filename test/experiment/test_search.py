"""search mode on Ray Tune: SLM-Lab's search syntax, bad input, the layout of a search, and a
search killed in its third trial that resumes to the search that never stopped."""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from lab_helpers import (cli, lab_env, lab_processes, listening_addresses, off_loopback, process_tree,
                         run_in_process, run_in_process_with_output, sessions_have_autogroups)

from slm_lab.experiment.search.space import Param, grid_points, parse_search
from slm_lab.lib.errors import SpecError

pytestmark = pytest.mark.ray

pytest.importorskip('ray', reason='search mode needs the search extra')
pytest.importorskip('optuna', reason='search mode needs the search extra')

ROOT = Path(__file__).resolve().parents[2]
RUN_LAB = str(ROOT / 'run_lab.py')
NAME = 'ppo_search'


def search_spec(max_trial: int = 4, max_frame: int = 3000, **meta) -> dict:
    return {
        'agent': {'name': 'PPO',
                  'algorithm': {'name': 'PPO', 'gamma': 0.99, 'lam': 0.95, 'time_horizon': 64, 'minibatch_size': 32,
                                'training_epoch': 2},
                  'memory': {'name': 'OnPolicyBatchReplay'},
                  'net': {'type': 'MLPNet', 'hid_layers': [32], 'optim_spec': {'name': 'Adam', 'lr': 0.001}}},
        'env': {'name': 'CartPole-v1', 'num_envs': 2, 'max_frame': max_frame},
        'meta': {'max_trial': max_trial, 'max_session': 1, 'log_frequency': 250, 'eval_frequency': 1000,
                 'checkpoint_frequency': 500, 'random_seed': 5, 'search_resources': {'cpu': os.cpu_count()},
                 'search_scheduler': {'grace_period': 500, 'reduction_factor': 2}, **meta},
        'search': {'agent': {'algorithm': {'gamma__uniform': [0.9, 0.999]}},
                   'agent.net.optim_spec.lr__loguniform': [1e-4, 1e-2]},
    }


def write(tmp_path: Path, spec: dict, name: str = NAME) -> str:
    path = tmp_path / f'{name}.json'
    path.write_text(json.dumps({name: spec}))
    return str(path)


def lab(args: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return cli(args, cwd, timeout=600, **kwargs)


def run_dir(cwd: Path, name: str = NAME) -> Path:
    (found,) = (cwd / 'data').glob(f'{name}_*')
    return found


def experiment_df(cwd: Path, name: str = NAME) -> pd.DataFrame:
    return pd.read_csv(run_dir(cwd, name) / 'info' / f'{name}_experiment_df.csv')


def search_until(spec_file: str, cwd: Path, trial: int, rows: int, name: str = NAME, nice: int = 0) -> subprocess.Popen:
    """A search started in `cwd` (under `nice -n NICE`), returned once its trial `trial` logged `rows`
    train rows (or it ended, or 300 s passed)."""
    niced = ['nice', '-n', str(nice)] if nice else []
    proc = subprocess.Popen([*niced, sys.executable, RUN_LAB, spec_file, name, 'search'], cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline, logged = time.time() + 300, 0
    while time.time() < deadline and proc.poll() is None and logged < rows:
        csv = list(cwd.glob(f'data/{name}_*/info/{name}_t{trial}_s0_session_df_train.csv'))
        logged = len(csv[0].read_text().splitlines()) - 1 if csv else 0
        time.sleep(0.05)
    return proc


# --- the spaces -----------------------------------------------------------------------------------

def draws(param: Param, n: int = 200) -> list:
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    return [param.value(study.ask({param.path: param.distribution()}).params[param.path]) for _ in range(n)]


@pytest.mark.parametrize('space, args, check', [
    ('uniform', [0.5, 0.9], lambda v: 0.5 <= v <= 0.9),
    ('loguniform', [1e-4, 1e-2], lambda v: 1e-4 <= v <= 1e-2),
    ('quniform', [0.2, 1.0, 0.2], lambda v: 0.2 <= v <= 1.0 and abs(v / 0.2 - round(v / 0.2)) < 1e-9),
    ('qloguniform', [1e-3, 1e-1, 1e-3], lambda v: abs(v / 1e-3 - round(v / 1e-3)) < 1e-6),
    ('randint', [1, 4], lambda v: isinstance(v, int) and 1 <= v <= 3),  # high excluded
    ('qrandint', [8, 64, 8], lambda v: isinstance(v, int) and v % 8 == 0 and 8 <= v <= 64),  # high included
    ('lograndint', [1, 100], lambda v: isinstance(v, int) and 1 <= v <= 99),
    ('qlograndint', [2, 64, 2], lambda v: isinstance(v, int) and v % 2 == 0),
    ('qlograndint', [1, 64, 8], lambda v: isinstance(v, int) and v % 8 == 0 and 8 <= v <= 64),  # never 0
    ('qloguniform', [0.001, 0.1, 0.05], lambda v: v in (0.05, 0.1)),
    ('normal', [10.0, 2.0], lambda v: math.isfinite(v)),
    ('qrandn', [10.0, 2.0, 0.5], lambda v: abs(v / 0.5 - round(v / 0.5)) < 1e-9),
    ('choice', [[64], [64, 64], 'x'], lambda v: v in ([64], [64, 64], 'x')),
])
def test_each_space_draws_what_its_name_says(space, args, check):
    values = draws(Param(f'k__{space}', 'k', space, tuple(args)))
    assert all(check(v) for v in values), [v for v in values if not check(v)][:5]
    assert len({json.dumps(v) for v in values}) > 1


def test_randint_reaches_both_ends_and_normal_has_its_mean_and_spread():
    assert set(draws(Param('k', 'k', 'randint', (1, 4)))) == {1, 2, 3}
    assert set(draws(Param('k', 'k', 'qrandint', (8, 24, 8)))) == {8, 16, 24}
    normal = draws(Param('k', 'k', 'randn', (10.0, 2.0)), 2000)
    mean = sum(normal) / len(normal)
    sd = (sum((v - mean) ** 2 for v in normal) / len(normal)) ** 0.5
    assert abs(mean - 10) < 0.2 and abs(sd - 2) < 0.2


def test_v4_lists_v5_dots_and_nesting_name_the_same_keys():
    v4 = parse_search({'agent': [{'algorithm': {'gamma__grid_search': [0.9, 0.99]}}],
                       'meta': {'max_session__grid_search': [1, 2]}})
    v5 = parse_search({'agent.algorithm.gamma__grid_search': [0.9, 0.99], 'meta': {'max_session__grid_search': [1, 2]}})
    assert [(p.path, p.space, p.args) for p in v4] == [(p.path, p.space, p.args) for p in v5]
    assert grid_points(v4) == [{'agent.algorithm.gamma': g, 'meta.max_session': s} for g in (0.9, 0.99) for s in (1, 2)]


@pytest.mark.parametrize('block, message', [
    ({'agent.algorithm.gamma__uniformm': [0.9, 0.99]}, r"^search\.agent\.algorithm\.gamma__uniformm: unknown space "
                                                       r"'uniformm' \(did you mean 'uniform'\?\)"),
    ({'agent.algorithm.gamma__uniform': [0.99, 0.9]},
     r'^search\.agent\.algorithm\.gamma__uniform: low 0\.99 > high 0\.9'),
    ({'agent.algorithm.gamma__choice': []}, r'^search\.agent\.algorithm\.gamma__choice: expected a non-empty list'),
    ({'agent.algorithm.gamma__uniform': [0.9]}, r'^search\.agent\.algorithm\.gamma__uniform: expected 2 numbers'),
    ({'agent.net.optim_spec.lr__loguniform': [0, 0.1]}, r'needs low > 0'),
    ({'agent.algorithm.training_epoch__randint': [3, 3]}, r'high excluded'),
    ({'agent': {'algorithm': {'gamma': 0.9}}}, r'^search\.agent\.algorithm\.gamma: expected "<key>__<space>"'),
])
def test_a_bad_search_block_is_one_line_naming_the_entry(block, message):
    with pytest.raises(SpecError, match=message):
        parse_search(block)


def test_keys_slm_lab_does_not_read_are_left_out_with_a_warning_and_an_empty_block_searches_seeds(caplog):
    from slm_lab.experiment.search.specs import search_params
    from slm_lab.lib.logger import warn_once
    from slm_lab.spec import validate_spec
    warn_once.cache_clear()
    spec = search_spec()
    spec['search'] = {'agent.algorithm.clip_eps__uniform': [0.1, 0.3], 'agent.algorithm.gamma__uniform': [0.9, 0.99]}
    spec = {**validate_spec(spec), 'name': NAME}
    with caplog.at_level('WARNING'):
        params = search_params(spec)
    assert [p.path for p in params] == ['agent.algorithm.gamma']
    assert any('agent.algorithm.clip_eps is' in r.getMessage() and 'leaves it out' in r.getMessage()
               for r in caplog.records)
    spec['search'] = {'agent': {'algorithm': {}}}  # SLM-Lab's dqn_lunar_search.json: trials differ by seed
    assert search_params(spec) == []
    # SLM-Lab's recurrent specs search hid_layers, which its RecurrentNet does not read
    spec = search_spec()
    spec['agent']['net'] = {'type': 'RecurrentNet', 'shared': True, 'optim_spec': {'name': 'Adam', 'lr': 0.01}}
    spec['search'] = {'agent.net.hid_layers__choice': [[32], [64]], 'agent.net.seq_len__choice': [2, 4]}
    spec = {**validate_spec(spec), 'name': NAME}
    with caplog.at_level('WARNING'):
        assert [p.path for p in search_params(spec)] == ['agent.net.seq_len']
    assert any('agent.net.hid_layers is' in r.getMessage() for r in caplog.records)
    # SLM-Lab's a3c_cartpole.json searches the critic's optimizer of a shared net, which steps with
    # actor_optim_spec alone; a separate net's critic_optim_spec stays searched
    for net, kept in (({'shared': True}, ['agent.net.actor_optim_spec.lr']),
                      ({'shared': False, 'use_same_optim': True}, ['agent.net.actor_optim_spec.lr']),
                      ({'shared': False, 'critic_optim_spec': {'name': 'Adam', 'lr': 0.01}},
                       ['agent.net.actor_optim_spec.lr', 'agent.net.critic_optim_spec.lr'])):
        spec = search_spec()
        spec['agent']['name'] = spec['agent']['algorithm']['name'] = 'ActorCritic'
        spec['agent']['algorithm'] = {'name': 'ActorCritic', 'lam': 0.95, 'training_frequency': 32}
        spec['agent']['net'] = {'type': 'MLPNet', 'hid_layers': [32], 'actor_optim_spec': {'name': 'Adam', 'lr': 0.01},
                                **net}
        spec['search'] = {'agent.net.actor_optim_spec.lr__uniform': [1e-4, 0.1],
                          'agent.net.critic_optim_spec.lr__uniform': [1e-4, 0.1]}
        spec = {**validate_spec(spec), 'name': NAME}
        caplog.clear()
        with caplog.at_level('WARNING'):
            assert [p.path for p in search_params(spec)] == kept
        assert any('agent.net.critic_optim_spec.lr is' in r.getMessage() for r in caplog.records) == (len(kept) == 1)
        warn_once.cache_clear()


def test_a_value_that_fits_beside_another_searched_key_is_kept_and_one_that_fits_nothing_is_refused():
    """SLM-Lab's pendulum.json searches an entropy schedule's start_step and end_step together: a
    start_step past the spec's own end_step fits with a drawn end_step, so the search starts (a
    trial drawing a pair that does not fit fails alone); a start_step past every end_step is refused."""
    from slm_lab.experiment.search.specs import search_params
    from slm_lab.spec import validate_spec
    spec = search_spec()
    spec['agent']['algorithm']['entropy_coef_spec'] = {'name': 'linear_decay', 'start_val': 0.01, 'end_val': 0.001,
                                                       'start_step': 0, 'end_step': 200}
    decay = {'start_step__choice': [100, 300], 'end_step__choice': [300, 400]}
    spec['search'] = {'agent': {'algorithm': {'entropy_coef_spec': decay}}}
    spec = {**validate_spec(spec), 'name': NAME}
    assert [p.path for p in search_params(spec)] == ['agent.algorithm.entropy_coef_spec.start_step',
                                                     'agent.algorithm.entropy_coef_spec.end_step']
    spec['search']['agent']['algorithm']['entropy_coef_spec']['start_step__choice'] = [100, 500]
    with pytest.raises(SpecError, match=r'^search\.agent\.algorithm\.entropy_coef_spec\.start_step__choice: '
                                        r'the value 500 '
                                        r'does not fit the spec: .*end_step'):
        search_params(spec)


# --- the lab's search mode ------------------------------------------------------------------------

@pytest.mark.parametrize('edit, message', [
    (lambda s: s['search'].update({'agent.algorithm.gama__uniform': [0.9, 0.99]}),
     r"^error: search\.agent\.algorithm\.gama__uniform: the value 0\.9 does not fit the spec: .*gama.*did you mean "
     r"'gamma'"),
    (lambda s: s['search'].update({'agent.algorithm.lam__uniform': [0.5, 1.5]}),
     r'^error: search\.agent\.algorithm\.lam__uniform: the value 1\.5 does not fit the spec: agent\.algorithm\.lam'),
    (lambda s: s['search'].update({'agent.net.hid_layers__choice': []}), r'non-empty list'),
    (lambda s: s.pop('search'), r"^error: search: spec 'ppo_search' has no search block"),
])
def test_bad_search_input_is_one_line_and_no_run_directory(tmp_path, edit, message):
    from slm_lab import lab as lab_module
    spec = search_spec()
    edit(spec)
    with pytest.raises(SpecError) as e:
        lab_module.run(write(tmp_path, spec), NAME, 'search', data_dir=str(tmp_path / 'data'))
    assert '\n' not in str(e.value) and __import__('re').search(message, f'error: {e.value}'), str(e.value)
    assert not (tmp_path / 'data').exists() or not list((tmp_path / 'data').iterdir())


def test_a_trial_saved_by_an_older_lab_continues_with_the_keys_added_since_at_their_old_behaviour(tmp_path):
    """A search resumed by a newer lab reads each trial's saved spec as train@ reads a run's: a key
    the lab added since the trial was written takes the behaviour the trial started with (here
    flush_denormal false, Adam stepped per tensor), not today's default; a spec this lab wrote reads
    back as it is."""
    from slm_lab.experiment.search.specs import trial_spec
    from slm_lab.experiment.search.specs import read_trial_spec
    from slm_lab.lib.io import write_json
    from slm_lab.persistence.run_dir import RunDir
    from slm_lab.spec import validate_spec
    search = {**validate_spec(search_spec()), 'name': NAME}
    spec = trial_spec(search, {'agent.algorithm.gamma': 0.95, 'agent.net.optim_spec.lr': 0.001}, 0)
    run = RunDir(tmp_path / f'{NAME}_2026_01_01_000000', NAME)
    run.create()
    write_json(run.spec_path(0), spec)
    assert read_trial_spec(run, 0) == spec
    assert spec['meta']['flush_denormal'] is True and spec['agent']['net']['optim_spec']['fused'] is True
    del spec['meta']['flush_denormal'], spec['agent']['net']['optim_spec']['fused']  # as an older lab wrote it
    write_json(run.spec_path(0), spec)
    old = read_trial_spec(run, 0)
    assert old['meta']['flush_denormal'] is False and old['agent']['net']['optim_spec']['fused'] is False
    assert old['name'] == NAME and old['agent']['algorithm']['gamma'] == 0.95
    from slm_lab.lib.errors import ResumeError
    spec['agent']['net']['hid_layers'] = 'wide'  # a spec this lab refuses, or no spec at all: one line naming the file
    write_json(run.spec_path(0), spec)
    with pytest.raises(ResumeError, match=r'ppo_search_t0_spec\.json: the trial.s spec cannot be read \(agent\.net'):
        read_trial_spec(run, 0)
    run.spec_path(0).write_text('{')
    with pytest.raises(ResumeError, match=r'ppo_search_t0_spec\.json: the trial.s spec cannot be read'):
        read_trial_spec(run, 0)


@pytest.mark.subprocess
def test_a_ray_address_that_does_not_answer_is_one_line_and_no_run_directory(tmp_path):
    result = lab([write(tmp_path, search_spec()), NAME, 'search', '--ray-address', '127.0.0.1:9'], tmp_path)
    assert result.returncode == 2 and result.stderr.startswith('error: --ray-address 127.0.0.1:9: no Ray cluster '
                                                               'answers there'), result.stderr
    assert not (tmp_path / 'data').exists() or not list((tmp_path / 'data').iterdir())


@pytest.mark.subprocess
def test_search_options_belong_to_search(tmp_path):
    result = lab([write(tmp_path, search_spec()), NAME, 'train', '--keep', '1'], tmp_path)
    assert result.returncode == 2 and '--keep only applies to search' in result.stderr


DQN_NAME = 'dqn_search'
# of 12: the third trial early on (its snapshot at frame 100 written), well before its first ASHA
# rung (grace_period 600): a DQN trial of 1,200 frames takes about a second on an idle machine
ROWS = 2
LINE = re.compile(r'^\[[\d\- :]+ INFO slm_lab\.search\] (.*)$')  # a console line of the search's driver


def search_lines(stderr: str) -> list[str]:
    return [m.group(1) for m in map(LINE.match, stderr.splitlines()) if m]


def dqn_search_spec(max_frame: int = 1200, max_trial: int = 4) -> dict:
    """A DQN search of 4 trials, one at a time (each reserves every core), ASHA on (rungs at 600 and
    1,200 frames), that leaves meta.snapshot_replay to the lab."""
    return {
        'agent': {'name': 'DQN',
                  'algorithm': {'name': 'DQN', 'training_frequency': 8, 'training_iter': 2, 'training_start_step': 64,
                                'explore_var_spec': {'name': 'linear_decay', 'start_val': 1.0, 'end_val': 0.1,
                                                     'start_step': 0, 'end_step': max_frame}},
                  'memory': {'name': 'Replay', 'batch_size': 32, 'max_size': 2000},
                  'net': {'type': 'MLPNet', 'hid_layers': [32], 'optim_spec': {'name': 'Adam', 'lr': 0.001},
                          'update_type': 'replace', 'update_frequency': 100}},
        'env': {'name': 'CartPole-v1', 'num_envs': 2, 'max_frame': max_frame},
        'meta': {'max_trial': max_trial, 'max_session': 1, 'log_frequency': 100, 'random_seed': 3,
                 'search_resources': {'cpu': os.cpu_count()},
                 'search_scheduler': {'grace_period': 600, 'reduction_factor': 2}},
        'search': {'agent': {'algorithm': {'gamma__uniform': [0.9, 0.999]}},
                   'agent.net.optim_spec.lr__loguniform': [1e-4, 1e-2]},
    }


def check_search_lines(stderr: str, df: pd.DataFrame, root: Path, name: str, log_frequency: int) -> None:
    """The console of a search run straight through, one trial at a time: a line per trial start
    (its drawn values) and end (its status, frame and total_reward_ma, as experiment_df.csv has
    them), a summary each log interval, no other trial's start before a trial's end; its first
    trial ran in the process the driver started before Ray (its imports overlapped Ray's start),
    the second in the one its Ray worker started while the first trained."""
    lines = search_lines(stderr)
    starts = [x for x in lines if re.match(r'trial \d start: ', x)]
    ends = [x for x in lines if re.match(r'trial \d end: ', x)]
    assert len(starts) == len(ends) == len(df), lines
    assert re.fullmatch(r'trial 0 start: agent\.algorithm\.gamma=0\.\d+, agent\.net\.optim_spec\.lr=[\d.e-]+'
                        r', env\.normalize_obs=(true|false|True|False)', starts[0]), starts[0]
    for i, end in enumerate(ends):
        assert re.fullmatch(rf'trial {i} end: {re.escape(df.loc[i, "status"])} \| frame {df.loc[i, "frame"]} '
                            r'\| total_reward_ma \d+\.\d\d', end), (end, df.loc[i].to_dict())
        if i + 1 < len(df):
            assert lines.index(starts[i + 1]) > lines.index(end)  # one trial at a time (each takes every core)
    summaries = [x for x in lines if x.startswith('search: ')]
    # a summary each log_frequency frames a trial reported (one trial runs at a time): up to the
    # frame where the search judged each trial
    assert len(summaries) == df['frame'].sum() // log_frequency, lines
    last = len(df) - 1
    assert summaries[-1].startswith(f'search: {last}/{len(df)} trials ended, 1 running (t{last} frame '
                                    f'{df.loc[last, "frame"]}) | best: trial '), summaries[-1]
    graph = (root / 'graph' / f'{name}_experiment_graph.html').read_text()
    assert '"type":"log"' in graph  # lr is drawn log-uniformly
    logs = [(root / 'log' / f'{name}_t{i}_process.log').read_text() for i in (0, 1)]
    assert 'started ahead by the search driver, before Ray' in logs[0], logs[0]
    assert 'started ahead by its Ray worker' in logs[1], logs[1]
    assert not list((root / 'search').rglob('*.fifo'))  # the pipe went with the search


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_search_killed_in_its_third_trial_resumes_to_the_search_that_never_stopped(tmp_path, capsys):
    """Point 7 of the search issue: 4 trials one at a time (each reserves every core), ASHA on,
    SIGKILL while the third trial trains, search@latest: the same experiment_df.csv and the same
    trial records as a search run without interruption; nothing of the killed search's processes
    is left behind. The killed processes are the driver and its trial processes at once, as a crash
    takes them (the driver alone lets a short trial train on to its end before the search's reaper
    ends it): Ray's processes are left to the reaper. (A driver killed alone, its reaper ending all
    the rest: test_benchmark.py's SIGKILL of benchmark@latest, the same search driver.)
    One search for issue 29 too: a DQN search with meta.snapshot_replay left out of its spec; the lab
    puts the small replay into the snapshots, so the third trial continues exactly from the frame
    it was killed at (with the replay refilled from empty, its losses would differ). And the search
    that never stopped is the check of a whole search's console lines (check_search_lines).
    It searches env.normalize_obs too: each trial, the one begun after the resume included, clips
    its observations as SLM-Lab's default for what it drew says (10 with normalize_obs, none
    without), not as the search's base spec would."""
    spec = dqn_search_spec()
    spec['search']['env.normalize_obs__choice'] = [True, False]
    spec_file = write(tmp_path, spec, DQN_NAME)
    straight, killed = tmp_path / 'straight', tmp_path / 'killed'
    straight.mkdir()
    killed.mkdir()
    # the uninterrupted search runs beside the one that is killed and resumed (its own local Ray)
    reference = subprocess.Popen([sys.executable, RUN_LAB, spec_file, DQN_NAME, 'search'], cwd=straight,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=lab_env())
    try:
        # niced (its Ray and trials too): on a loaded machine this process, polling, comes first, so
        # that the kill lands while the third trial trains (at nice 0, on a machine loaded beside, a
        # trial in a session of its own once ran past the kill point to its first rung, where ASHA
        # stopped it, before this process polled again)
        proc = search_until(spec_file, killed, trial=2, rows=ROWS, name=DQN_NAME, nice=5)
        assert proc.poll() is None, 'the search should be training its third trial'
        root = run_dir(killed, DQN_NAME)
        trials = [pid for pid in process_tree(proc.pid) if is_trial_process(pid)]
        assert trials, 'the third trial has a process'
        for pid in [proc.pid, *trials]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
        assert not (root / 'info' / f'{DQN_NAME}_t3_s0_session_df_train.csv').exists(), 'killed in the third trial'
        deadline = time.time() + 20
        while lab_processes(root) and time.time() < deadline:
            time.sleep(0.2)
        assert not lab_processes(root), lab_processes(root)
        assert not (root / 'info' / f'{DQN_NAME}_experiment_df.csv').exists()
        # train@ never takes a search's directory (it would continue trial 0 without what it drew);
        # refused before anything runs, here in this process (run_in_process), as the command line does
        code, said = run_in_process([spec_file, DQN_NAME, 'train@latest'], killed, capsys)
        assert code == 2 and 'train@latest: no run of spec' in said, said
        code, said = run_in_process([spec_file, DQN_NAME, f'train@{root}'], killed, capsys)
        assert code == 2 and 'is a search, not a train run; continue it with search@' in said, said
        # a journal line cut off by the kill is cut away, not joined to the next one
        with open(root / 'search' / 'optuna.journal', 'ab') as f:
            f.write(b'{"op_code": 5, "worker_id": "x", "trial_id": 3, "param_na')

        ray_temp = Path((root / 'search' / 'ray_temp').read_text().strip())
        assert ray_temp.is_dir()  # Ray's session files of the killed search, outside the run directory

        result = lab([spec_file, DQN_NAME, 'search@latest'], killed)
        assert result.returncode == 0, result.stderr[-3000:]
        _, err = reference.communicate(timeout=300)
    finally:
        reference.kill()
    assert reference.returncode == 0, err[-3000:]
    assert not ray_temp.exists() and list((root / 'search' / 'ray').glob('session_*/logs'))  # moved in
    a, b = experiment_df(straight, DQN_NAME), experiment_df(killed, DQN_NAME)
    pd.testing.assert_frame_equal(a, b)
    assert set(a['status']) <= {'completed', 'stopped early (ASHA)'} and len(a) == 4
    # the replay left to the lab went into trial 2's snapshots: it continued exactly, mid-way
    saved = json.loads((root / f'{DQN_NAME}_t2_s0_spec.json').read_text())['meta']
    assert saved['snapshot_replay'] is None and saved['snapshot_replay_auto']['on'] is True, saved
    (resumed,) = json.loads((root / 'info' / f'{DQN_NAME}_t2_s0_resumes.json').read_text())
    assert resumed['exact'] is True and 0 < resumed['frame'] < spec['env']['max_frame'], resumed
    for i in range(4):
        # each trial's records up to where the search judged it (a trial ASHA stopped may have
        # logged a row or two more before its process saw the stop; those rows are not the search's)
        cols = ['frame', 'total_reward_ma', 'loss', 'opt_step', 'explore_var']
        ta = pd.read_csv(run_dir(straight, DQN_NAME) / 'info' / f'{DQN_NAME}_t{i}_s0_session_df_train.csv')[cols]
        tb = pd.read_csv(root / 'info' / f'{DQN_NAME}_t{i}_s0_session_df_train.csv')[cols]
        until = a.loc[i, 'frame']
        pd.testing.assert_frame_equal(ta[ta['frame'] <= until].reset_index(drop=True),
                                      tb[tb['frame'] <= until].reset_index(drop=True))
        assert ta['frame'].iloc[-1] >= until and tb['frame'].iloc[-1] >= until
    # the layout: the search spec, each trial's spec with what it drew
    saved = json.loads((root / f'{DQN_NAME}_t2_spec.json').read_text())
    assert not saved.get('search') and saved['meta']['trial'] == 2
    assert saved['agent']['algorithm']['gamma'] == pytest.approx(b.loc[2, 'agent.algorithm.gamma'])
    search_spec = json.loads((root / f'{DQN_NAME}_spec.json').read_text())
    assert search_spec['search'] and 'clip_obs' not in search_spec['env'], search_spec['env']
    for i in range(4):  # the clipping default of what each trial drew, in both searches
        for d in (run_dir(straight, DQN_NAME), root):
            env = json.loads((d / f'{DQN_NAME}_t{i}_spec.json').read_text())['env']
            assert env['clip_obs'] == (10.0 if env['normalize_obs'] else None), (i, env)
    assert list((root / 'graph').glob(f'{DQN_NAME}_experiment_graph.html'))
    assert not Path.home().joinpath('.ray').exists() or not (Path.home() / '.ray' / 'auth_token').exists()
    check_search_lines(err, a, run_dir(straight, DQN_NAME), DQN_NAME, spec['meta']['log_frequency'])


def is_trial_process(pid: int) -> bool:
    """Whether `pid` runs a search's trial (slm_lab/experiment/search/trial.py: a trial, or one
    started ahead for the next)."""
    try:
        return b'slm_lab.experiment.search.trial' in Path(f'/proc/{pid}/cmdline').read_bytes()
    except OSError:
        return False


def stop_search(proc: subprocess.Popen, signum: int, group: bool) -> tuple[str, float]:
    """Send `signum` to a search's driver (or to its whole process group, as a terminal's Ctrl-C
    or a scheduler does); its stderr and how long it took to exit. (SIGINT to the group during a
    trial: test_search_watch.py.)"""
    sent = time.monotonic()
    os.killpg(proc.pid, signum) if group else proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    return err, time.monotonic() - sent


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_search_stopped_while_ray_starts_or_in_a_trial_exits_at_once_and_search_at_latest_finishes_with_keep(
        tmp_path, capsys):
    """One search of 2 trials, stopped three times and finished by search@latest --keep 1 (each
    command a search process and a Ray start of its own, so one search for all the stops):
    1. Issue 27 point 6: SIGTERM while Ray started exited 15 with no `stopped:` line. Now, to the
       driver alone while Ray starts (the search does not wait for Ray to be up): 143, the
       `stopped:` line, within seconds, nothing left running.
    2. search@latest, started niced: its own Ray (head, raylet, workers: the driver's descendants)
       listens on loopback only, and its Ray and trials, in sessions of their own, stay niced;
       SIGTERM to the driver during trial 0 stops the trial with a snapshot, through Ray: 143, the
       line names search@latest, nothing left running.
    3. Issue 27 point 6: SIGTERM to the search's process group during a trial exited 1, once after
       a 60 s stall on a dead GCS (the group's signal had reached Ray's own processes). Now, to
       search@latest's group in trial 0: 143, the `stopped:` line, within seconds, nothing left
       running, a snapshot.
    4. search@latest with a changed max_frame is refused; search@latest --keep 1 finishes the
       search (trial 0 continued from its snapshot, to its end) and keeps the best trial's models
       and snapshots only."""
    # long enough that the trial is still running when the SIGTERM reaches it through Ray (at
    # 1,500 frames an idle machine finished the trial first)
    spec_file = write(tmp_path, search_spec(max_trial=2, max_frame=8000))
    stopped = 'stopped: stopped by {} {}; continue with search@latest'
    trial_csv = f'data/{NAME}_*/info/{NAME}_t0_s0_session_df_train.csv'

    def rows() -> int:
        found = list(tmp_path.glob(trial_csv))
        return len(found[0].read_text().splitlines()) - 1 if found else 0

    def start(mode: str, rows_more: int = 0, nice: int = 0) -> subprocess.Popen:
        """The search (under `nice -n NICE`, the leader of its own process group, as a shell starts
        a job), returned once Ray starts (search/ray_temp names its session files; rows_more 0) or
        once trial 0 has logged `rows_more` train rows more than it had."""
        niced = ['nice', '-n', str(nice)] if nice else []
        before = rows()
        proc = subprocess.Popen([*niced, sys.executable, RUN_LAB, spec_file, NAME, mode], cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, process_group=0)
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if (rows() >= before + rows_more if rows_more else
                    list(tmp_path.glob(f'data/{NAME}_*/search/ray_temp'))):
                return proc
            time.sleep(0.02)
        proc.kill()
        raise AssertionError(f'the search never got there: {proc.communicate()[1][-3000:]}')

    # 1. while Ray starts, to the driver alone
    proc = start('search')
    root = run_dir(tmp_path)
    err, took = stop_search(proc, signal.SIGTERM, group=False)
    assert proc.returncode == 143 and 'Traceback' not in err, err[-3000:]
    assert err.strip().splitlines()[-1] in (stopped.format('SIGTERM', 'before its trials started'),
                                            stopped.format('SIGTERM', 'with the running trials saved in snapshots'))
    assert took < 30, took  # loose for a loaded machine; it takes about a second
    assert not lab_processes(root), lab_processes(root)

    # 2. niced, in trial 0, to the driver alone
    nice = 3
    proc = start('search@latest', rows_more=3, nice=nice)
    try:
        tree = process_tree(proc.pid)
        listening = listening_addresses(tree)
        assert listening and not off_loopback(listening), listening
        # started niced, its Ray and its trials, in sessions of their own, stay niced where the kernel
        # shares the CPU by session first (autogroup): each session's group takes the nice (this
        # process's own plus `nice`: a test run under nice starts the search nicer still)
        if sessions_have_autogroups():
            # this process's own group; none where it runs in the root group (a process tree that never
            # started a session of its own since boot, as a container's: the file reads empty)
            own, groups = (Path('/proc/self/autogroup').read_text().split() or [None])[0], {}
            for pid in tree:
                with contextlib.suppress(OSError, ValueError):  # ended meanwhile; the root group reads empty
                    group, _, niceness = Path(f'/proc/{pid}/autogroup').read_text().split()
                    groups[group] = int(niceness)
            groups.pop(own, None)
            expected = min(os.getpriority(os.PRIO_PROCESS, 0) + nice, 19)
            assert len(groups) >= 2 and set(groups.values()) == {expected}, groups  # Ray's session, the trial's
    except BaseException:
        proc.kill()  # the driver: its reaper ends the rest
        raise
    err, took = stop_search(proc, signal.SIGTERM, group=False)
    assert proc.returncode == 143, err[-2000:]
    assert took < 30, took  # loose for a loaded machine (24 s seen beside a benchmark)
    assert err.strip().splitlines()[-1].endswith('continue with search@latest'), err[-500:]
    assert not lab_processes(root), lab_processes(root)
    log = (root / 'log' / f'{NAME}_t0_s0.log').read_text()
    assert 'stopped at frame' in log and 'with a snapshot' in log
    snapshots_said = log.count('with a snapshot')

    # 3. in trial 0, to the process group: Ray's own processes are out of it
    proc = start('search@latest', rows_more=2)
    err, took = stop_search(proc, signal.SIGTERM, group=True)
    assert proc.returncode == 143 and 'Traceback' not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == stopped.format('SIGTERM', 'with the running trials saved in snapshots')
    assert took < 30 and not lab_processes(root), (took, lab_processes(root))
    assert (root / 'log' / f'{NAME}_t0_s0.log').read_text().count('with a snapshot') > snapshots_said

    # 4. refused before anything runs, here in this process (run_in_process), as the command line does
    code, refused = run_in_process([spec_file, NAME, 'search@latest', '-s', 'env.max_frame=12000'], tmp_path, capsys)
    assert code == 2 and "env.max_frame: 8000 -> 12000" in refused and 'meta.max_trial' in refused, refused
    result = lab([spec_file, NAME, 'search@latest', '--keep', '1'], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    df = experiment_df(tmp_path)
    assert len(df) == 2 and set(df['status']) <= {'completed', 'stopped early (ASHA)'}
    assert df.loc[0, 'status'] == 'completed'  # the stopped trial finished
    best = int(df.sort_values('total_reward_ma', ascending=False)['trial'].iloc[0])
    models = {p.name.split('_s0_')[0] for p in (root / 'model').iterdir()}
    assert models == {f'{NAME}_t{best}'}, models
    assert [p.name for p in (root / 'ckpt').iterdir()] == [f'{NAME}_t{best}_s0']  # the others' snapshots too
    assert (root / 'info' / f'{NAME}_t{1 - best}_s0_session_df_train.csv').exists()  # records stay
    resumes = json.loads((root / 'info' / f'{NAME}_t0_s0_resumes.json').read_text())
    assert resumes, 'trial 0 continued from its snapshot'
    said = result.stdout + result.stderr
    assert (f'--keep 1: removed the model files and snapshots of trial(s) {1 - best}; kept those of trial(s) '
            f'{best}') in said, said[-3000:]
    # the removed trial's weights: one line that names --keep and the trial to warm-start from instead
    code, refused = run_in_process([spec_file, NAME, 'train', '--warm-start', f'{root}/t{1 - best}'], tmp_path, capsys)
    assert code == 2 and '--keep removed' in refused and refused.strip().endswith(f'{root}/t{best}'), refused
    # 5. search@latest of the finished search: nothing to run, so no Ray; the records written again
    from slm_lab.experiment.search import driver
    before = experiment_df(tmp_path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(driver, 'run_on_ray', lambda *a, **k: pytest.fail('a finished search started Ray'))
        code, out, err = run_in_process_with_output([spec_file, NAME, 'search@latest'], tmp_path, capsys)
    assert code == 0 and 'all 2 trials ended before (kept): nothing to run' in out + err, err
    pd.testing.assert_frame_equal(experiment_df(tmp_path), before)


# a search on a two-node Ray cluster (--ray-address): test_benchmark.py's
# test_a_search_and_a_suite_run_on_a_two_node_ray_cluster, on the one cluster its suite runs on


def test_a_grace_period_longer_than_a_trial_runs_every_trial_to_its_end_with_a_warning(caplog):
    """Ray refuses grace_period > max_t; a search shortened with -s env.max_frame below SLM-Lab's
    grace_period still runs, without early stopping, and says so."""
    from ray.tune.schedulers import AsyncHyperBandScheduler

    from slm_lab.experiment.search.driver import make_scheduler
    from slm_lab.lib.logger import warn_once
    from slm_lab.spec import validate_spec
    warn_once.cache_clear()
    spec = validate_spec(search_spec(max_frame=3000))
    assert isinstance(make_scheduler(spec), AsyncHyperBandScheduler)  # grace_period 500 <= 3000
    spec['meta']['search_scheduler']['grace_period'] = 5000
    with caplog.at_level('WARNING'):
        assert make_scheduler(spec) is None
    assert any('grace_period 5000 is more than the 3000 frames' in r.getMessage() for r in caplog.records)
    spec['meta'].update(distributed='shared', max_session=4, search_scheduler={'grace_period': 1000,
                                                                               'reduction_factor': 2})
    assert make_scheduler(spec) is None  # each of the 4 sessions runs 750 frames
    spec['meta']['search_scheduler'] = None
    assert make_scheduler(spec) is None


def test_keep_run_again_records_what_each_keep_removed_and_warm_start_names_what_is_left(tmp_path):
    """--keep 1, then --keep 2, then --keep 0 on one search: pruned.json never lists a removed trial
    as kept; a warm start from a removed trial names the trials still kept, or, when none is, the
    trial's spec to train again."""
    from slm_lab.experiment.search.driver import prune_models
    from slm_lab.lib.errors import LabError
    from slm_lab.persistence.lineage import warm_start_weights
    from slm_lab.persistence.run_dir import RunDir
    root = tmp_path / 's_2026_01_01_000000'
    for d in ('model', 'ckpt', 'search'):
        (root / d).mkdir(parents=True)
    for t in range(3):
        (root / 'model' / f's_t{t}_s0_model_best.pt').write_bytes(b'x')
        (root / 'ckpt' / f's_t{t}_s0').mkdir()
    run, df = RunDir(root, 's'), pd.DataFrame({'trial': [0, 1, 2], 'total_reward_ma': [30., 20., 10.]})
    pruned = root / 'search' / 'pruned.json'
    prune_models(run, df, 1)
    assert json.loads(pruned.read_text()) == {'keep': 1, 'kept': [0], 'removed': [1, 2]}
    assert sorted(p.name for p in (root / 'model').iterdir()) == ['s_t0_s0_model_best.pt']
    prune_models(run, df, 2)  # trial 1's weights are gone already: it is not kept
    assert json.loads(pruned.read_text()) == {'keep': 2, 'kept': [0], 'removed': [1, 2]}
    with pytest.raises(LabError, match=rf"--warm-start {root}/t1: the search's --keep removed .* trial 1; "
                                       rf"warm-start from a trial it kept: {root}/t0$"):
        warm_start_weights(run, 0, 'best', trial=1)
    prune_models(run, df, 0)
    assert json.loads(pruned.read_text()) == {'keep': 0, 'kept': [], 'removed': [0, 1, 2]}
    with pytest.raises(LabError, match=r"it kept no trial's weights \(--keep 0\): train that trial's spec again"):
        warm_start_weights(run, 0, 'best', trial=0)
