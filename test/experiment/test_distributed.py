"""meta.distributed ("shared" Hogwild, "synced"): sessions in their own processes train one set of
global weights in shared memory; a resumed run restores them and continues its records."""
from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from slm_lab import lab
from slm_lab.persistence import snapshot as checkpoint
from slm_lab.agent.net.optimizers import GlobalAdam, GlobalRMSprop
from slm_lab.experiment.session import Session
from slm_lab.experiment.trial import Trial
from slm_lab.experiment.distributed import GlobalNets, newest_global_state
from slm_lab.persistence.run_dir import RunDir
from slm_lab.lib.errors import ResumeError, SpecError
from slm_lab.persistence.edits import check_edits
from slm_lab.spec import validate_spec

RUN_LAB = str(Path(__file__).resolve().parents[2] / 'run_lab.py')

A3C = {  # SLM-Lab's A3C on CartPole, small: a shared actor-critic net, GlobalAdam
    'agent': {'name': 'A3C',
              'algorithm': {'name': 'ActorCritic', 'gamma': 0.99, 'lam': 0.95, 'training_frequency': 32,
                            'entropy_coef_spec': {'name': 'no_decay', 'start_val': 0.01}, 'val_loss_coef': 0.5},
              'memory': {'name': 'OnPolicyBatchReplay'},
              'net': {'type': 'MLPNet', 'shared': True, 'hid_layers': [32], 'hid_layers_activation': 'relu',
                      'clip_grad_val': 0.5, 'use_same_optim': True, 'loss_spec': {'name': 'MSELoss'},
                      'actor_optim_spec': {'name': 'GlobalAdam', 'lr': 0.002},
                      'critic_optim_spec': {'name': 'GlobalAdam', 'lr': 0.002}}},
    'env': {'name': 'CartPole-v1', 'num_envs': 1, 'max_frame': 2000},
    'meta': {'distributed': 'shared', 'max_session': 2, 'log_frequency': 250, 'eval_frequency': 500,
             'random_seed': 5},
}


def a3c(max_frame: int = 2000, **meta) -> dict:
    spec = copy.deepcopy(A3C)
    spec['env']['max_frame'] = max_frame
    spec['meta'].update(meta)
    return spec


def write_spec(tmp_path: Path, name: str, spec: dict) -> str:
    path = tmp_path / f'{name}.json'
    path.write_text(json.dumps({name: spec}))
    return str(path)


def the_run(data: Path, name: str) -> Path:
    (run,) = [p for p in data.iterdir() if p.name.startswith(name + '_')]
    return run


def frames(run: Path, name: str, session: int) -> pd.Series:
    return pd.read_csv(run / 'info' / f'{name}_t0_s{session}_session_df_train.csv')['frame']


def newest(run: Path, name: str, session: int) -> tuple[dict, dict]:
    return checkpoint.load_snapshot(checkpoint.list_snapshots(run / 'ckpt' / f'{name}_t0_s{session}')[0])


def test_spec_accepts_the_modes_and_names_the_key_otherwise():
    for mode in ('shared', 'synced', False):
        assert validate_spec(a3c(distributed=mode))['meta']['distributed'] == mode
    for bad in ('hogwild', True):
        with pytest.raises(SpecError, match=r'^meta\.distributed: .*valid values: false, "shared", "synced"'):
            validate_spec(a3c(distributed=bad))


def test_global_optimizers_keep_their_state_in_shared_memory():
    for cls in (GlobalAdam, GlobalRMSprop):
        net = torch.nn.Linear(3, 2)
        net.share_memory()
        opt = cls(net.parameters(), lr=0.01)
        opt.share_memory()
        states = [v for s in opt.state.values() for v in s.values()]
        assert states and all(v.is_shared() for v in states)
        net(torch.ones(1, 3)).sum().backward()
        opt.step()  # torch updates the state in place: it stays shared
        assert all(v.is_shared() for s in opt.state.values() for v in s.values())
        assert all(float(s['step']) == 1.0 for s in opt.state.values())


SAC = {  # twin critics with polyak targets, and a temperature that stays each session's own
    'agent': {'name': 'SAC', 'algorithm': {'name': 'SoftActorCritic', 'training_start_step': 64},
              'memory': {'name': 'Replay', 'batch_size': 32, 'max_size': 1000},
              'net': {'type': 'MLPNet', 'hid_layers': [32], 'optim_spec': {'name': 'GlobalAdam', 'lr': 3e-4}}},
    'env': {'name': 'Pendulum-v1', 'num_envs': 1, 'max_frame': 200},
    'meta': {'random_seed': 3, 'max_session': 1},
}


@pytest.mark.slow
@pytest.mark.parametrize('mode', ['shared', 'synced'])
@pytest.mark.parametrize('base', ['a3c', 'sac'])
def test_one_session_on_global_nets_trains_as_without_them(tmp_path, mode, base):
    """The mechanics add nothing: a session training the global nets alone gets the very weights
    of a session that trains its own nets (target nets and SAC's temperature stay its own)."""
    raw = a3c(max_frame=300, max_session=1) if base == 'a3c' else copy.deepcopy(SAC)
    raw['meta']['distributed'] = mode
    spec = validate_spec(raw)
    weights = []
    for attach in (False, True):
        run_dir = RunDir(tmp_path / f'{attach}', 'one')
        run_dir.create()
        session_spec = Trial(spec, run_dir, 'train').session_spec(0)
        sess = Session(session_spec, run_dir, 'train', 0, 0)
        if attach:
            owner = Session(session_spec, run_dir, 'train', 0, 0)
            global_nets = GlobalNets.build(mode, owner.agent.algorithm)
            owner.close()
            sess.attach_global_nets(global_nets)
        sess.run()
        weights.append({name: net.state_dict() for name, net in sess.agent.algorithm.nets().items()})
        if attach:
            expected = {'a3c': (['model'], ['net']), 'sac': (['net', 'q1_net', 'q2_net'], ['actor', 'critic'])}[base]
            assert (list(global_nets.nets), list(global_nets.optimizers)) == expected
            if base == 'a3c':
                assert global_nets.updates.value == sess.clock.opt_step > 0
            for name, shared in global_nets.nets.items():
                for key, value in shared.items():
                    assert torch.equal(value, weights[-1][name][key])
    for name in weights[0]:
        for key in weights[0][name]:
            assert torch.equal(weights[0][name][key], weights[1][name][key]), (name, key)


@pytest.mark.slow
def test_shared_run_resumes_with_its_global_weights_and_continuous_records(tmp_path):
    """2 Hogwild sessions of 500 frames each, stopped by max_frame; resumed to twice as long."""
    name = 'a3c_shared'
    spec_file = write_spec(tmp_path, name, a3c(max_frame=1000))
    data = tmp_path / 'data'
    lab.run(spec_file, name, 'train', data_dir=str(data))
    run = the_run(data, name)
    saved = [newest(run, name, s)[0] for s in (0, 1)]
    updates = [state['global']['updates'] for state in saved]
    opt_steps = [state['clock']['opt_step'] for state in saved]
    assert max(updates) == sum(opt_steps) > 0  # both sessions stepped the one set of weights
    for s in (0, 1):
        assert frames(run, name, s).tolist() == [250, 500]  # each its share of 1000

    # the global state a resume starts from: the newest snapshot's, loaded into shared memory
    expected, origin = newest_global_state([run / 'ckpt' / f'{name}_t0_s{s}' for s in (0, 1)])
    assert origin['updates'] == max(updates)
    resumed_spec = validate_spec(a3c(max_frame=2000))
    trial = Trial(resumed_spec, RunDir(run, name), 'train', resume=True)
    global_nets = trial.global_nets(trial.session_spec(0))
    assert global_nets.updates.value == max(updates)
    for key, value in expected['nets']['model'].items():
        assert torch.equal(global_nets.nets['model'][key], value), key
        assert global_nets.nets['model'][key].is_shared()
    for index, state in expected['optimizers']['net']['state'].items():
        for key, value in state.items():
            assert torch.equal(global_nets.optimizers['net']['state'][index][key], value), (index, key)

    lab.run(spec_file, name, f'train@{run}', ['env.max_frame=2000'], data_dir=str(data))
    for s in (0, 1):
        assert frames(run, name, s).tolist() == [250, 500, 750, 1000]  # no gap, no repeat
        record = json.loads((run / 'info' / f'{name}_t0_s{s}_resumes.json').read_text())[-1]
        assert record['exact'] is False and 'asynchronously' in record['approximate'][0]
        assert record['global_nets_from']['updates'] == max(updates)
    final = [newest(run, name, s)[0] for s in (0, 1)]
    # the shared GlobalAdam went on counting from the restored state: every step of both runs
    total = sum(state['clock']['opt_step'] for state in final)
    assert max(state['global']['updates'] for state in final) == total
    assert max(float(state['global']['optimizers']['net']['state'][0]['step']) for state in final) == total

    # finished at its sessions' share of env.max_frame: resumed again as it is, it says so and runs nothing
    before = {p: p.stat().st_mtime_ns for p in run.rglob('*') if p.is_file()}
    assert lab.run(spec_file, name, f'train@{run}', ['env.max_frame=2000'], data_dir=str(data)) is None
    # a lower env.max_frame gives each session less than it reached: refused with the total to give
    for lower in (1500, 1000):
        with pytest.raises(ResumeError, match=r'env.max_frame \d+ \(\d+ frames for each of its 2 distributed '
                                              r'sessions\) is below frame 1000 .* use env.max_frame >= 2000'):
            lab.run(spec_file, name, f'train@{run}', [f'env.max_frame={lower}'], data_dir=str(data))
    assert {p: p.stat().st_mtime_ns for p in run.rglob('*') if p.is_file()} == before


def session_processes(pid: int) -> list[int]:
    """The processes `pid` spawned to run sessions (not multiprocessing's resource tracker)."""
    found = []
    for d in os.listdir('/proc'):
        if d.isdigit() and _ppid(int(d)) == pid:
            try:
                if b'spawn_main' in Path(f'/proc/{d}/cmdline').read_bytes():
                    found.append(int(d))
            except OSError:
                pass
    return found


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


@pytest.mark.slow
@pytest.mark.subprocess
def test_sigterm_stops_every_session_and_train_at_latest_continues(tmp_path, no_png):
    """SIGTERM to the lab: both session processes snapshot and end, the lab exits 143; train@latest
    restores the global nets and each session's records go on with no gap or repeat."""
    name = 'a3c_term'
    spec_file = write_spec(tmp_path, name, a3c(max_frame=400000))
    proc = subprocess.Popen([sys.executable, RUN_LAB, spec_file, name, 'train'], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and len(list(tmp_path.glob(f'data/{name}_*/info/*_session_df_train.csv'))) < 2:
        time.sleep(0.1)
    sessions = session_processes(proc.pid)
    assert len(sessions) == 2, 'the sessions never logged a row'
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert not [pid for pid in sessions if _ppid(pid) is not None], 'a session process outlived the lab'
    run = the_run(tmp_path / 'data', name)
    stopped = [newest(run, name, s)[0]['clock']['frame'] for s in (0, 1)]
    end = 2 * (max(stopped) // 250 + 2) * 250  # two more rows for the session furthest on
    # train@latest in this process (its sessions in theirs, as ever)
    lab.run(spec_file, name, 'train@latest', [f'env.max_frame={end}'], data_dir=str(tmp_path / 'data'))
    for s in (0, 1):
        assert frames(run, name, s).tolist() == list(range(250, end // 2 + 1, 250))
        record = json.loads((run / 'info' / f'{name}_t0_s{s}_resumes.json').read_text())[-1]
        assert record['frame'] == stopped[s] and 'global_nets_from' in record


@pytest.mark.slow
def test_synced_run_trains_the_global_weights(tmp_path):
    name = 'a3c_synced'
    spec_file = write_spec(tmp_path, name, a3c(distributed='synced', max_frame=1000, keep_checkpoints=10))
    data = tmp_path / 'data'
    lab.run(spec_file, name, 'train', data_dir=str(data))
    run = the_run(data, name)
    first, _ = checkpoint.load_snapshot(checkpoint.list_snapshots(run / 'ckpt' / f'{name}_t0_s0')[-1])
    assert first['clock']['frame'] == 0
    final = [newest(run, name, s)[0] for s in (0, 1)]
    last = max(final, key=lambda state: state['global']['updates'])
    assert last['global']['updates'] == sum(state['clock']['opt_step'] for state in final) > 0
    start, end = first['global']['nets']['model'], last['global']['nets']['model']
    assert any(not torch.equal(start[key], end[key]) for key in start)
    for s in (0, 1):
        assert frames(run, name, s).iloc[-1] == 500


def test_dev_mode_runs_one_session_of_the_whole_max_frame(tmp_path):
    name = 'a3c_dev'
    spec_file = write_spec(tmp_path, name, a3c(max_frame=500, max_session=4))
    data = tmp_path / 'data'
    lab.run(spec_file, name, 'dev', data_dir=str(data))
    run = the_run(data, name)
    assert frames(run, name, 0).iloc[-1] == 500
    assert not (run / 'info' / f'{name}_t0_s1_session_df_train.csv').exists()


def test_resume_refuses_another_number_of_sessions():
    old = validate_spec(a3c())
    new = validate_spec(a3c(max_session=3))
    with pytest.raises(ResumeError, match=r'^meta\.max_session: 2 -> 3: .*use meta\.max_session=2$'):
        check_edits(old, new, force=True)


def test_lookahead_shares_its_slow_weights_and_not_the_state_of_the_optimizer_it_wraps(tmp_path):
    """Lookahead around RAdam (SLM-Lab v4's a3c_cartpole): the slow weights are global, RAdam's
    state each session's own, in a fresh run and in a resumed one (whose RAdam state is loaded)."""
    raw = a3c(max_frame=300)
    raw['agent']['net']['actor_optim_spec'] = {'name': 'Lookahead', 'optimizer': 'RAdam', 'lr': 0.002}
    spec = validate_spec(raw)
    run_dir = RunDir(tmp_path, 'la')
    run_dir.create()
    sess = Session(Trial(spec, run_dir, 'train').session_spec(0), run_dir, 'train', 0, 0)
    algorithm = sess.agent.algorithm
    fresh = GlobalNets.build('shared', algorithm, n_sessions=2)
    assert fresh.optimizers['net']['state'] == {} and fresh.optimizers['net']['slow_weights']
    opt = algorithm.optimizers['net']
    algorithm.nets()['model'].pd_out(torch.zeros(1, 4)).sum().backward()
    opt.step()  # RAdam now has state, as a snapshot's optimizer does
    state = {'updates': 1, 'nets': {'model': algorithm.nets()['model'].state_dict()},
             'optimizers': {'net': opt.state_dict()}}
    resumed = GlobalNets.build('shared', algorithm, state, n_sessions=2)
    assert resumed.optimizers['net']['state'] == {}
    assert resumed.updates.value == 1
    sess.close()


@pytest.mark.parametrize('mode, kept', [('shared', False), ('synced', True)])
def test_ppo_keeps_acting_outputs_unless_other_sessions_move_its_weights(tmp_path, mode, kept):
    # "shared": the weights change under a rollout (other sessions step them), so log pi_old and
    # V(s) come from the update's own forward; "synced": a session's copy moves at its own steps only
    raw = {'agent': {'name': 'ppo', 'algorithm': {'name': 'PPO', 'time_horizon': 16, 'minibatch_size': 8},
                     'memory': {'name': 'OnPolicyBatchReplay'},
                     'net': {'type': 'MLPNet', 'hid_layers': [8], 'shared': True,
                             'optim_spec': {'name': 'GlobalAdam', 'lr': 1e-3}}},
           'env': {'name': 'CartPole-v1', 'num_envs': 2, 'max_frame': 64},
           'meta': {'random_seed': 1, 'max_session': 1, 'distributed': mode}}
    spec = validate_spec(raw)
    run_dir = RunDir(tmp_path, 'ppo')
    run_dir.create()
    session_spec = Trial(spec, run_dir, 'train').session_spec(0)
    owner = Session(session_spec, run_dir, 'train', 0, 0)
    global_nets = GlobalNets.build(mode, owner.agent.algorithm)
    owner.close()
    sess = Session(session_spec, run_dir, 'train', 0, 0)
    try:
        assert sess.agent.algorithm.acting_outputs is not None
        sess.attach_global_nets(global_nets)
        assert (sess.agent.algorithm.acting_outputs is not None) is kept
    finally:
        sess.close()
