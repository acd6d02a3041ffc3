"""Every algorithm trains a few hundred frames through the lab and leaves the full run directory:
specs, train and eval records, metrics, models, graphs and the log."""
from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import torch

import slm_lab

REPO_ROOT = Path(__file__).resolve().parents[2]
COLUMNS = ['epi', 't', 'wall_t', 'opt_step', 'frame', 'fps', 'total_reward', 'total_reward_ma', 'loss', 'lr',
           'explore_var', 'entropy_coef', 'entropy', 'grad_norm']
RUN_DIR_RE = r'{name}_(\d{{4}}_\d{{2}}_\d{{2}}_\d{{6}})'


def in_git_checkout() -> bool:
    out = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=REPO_ROOT, capture_output=True, text=True)
    return out.returncode == 0


def read_df(run_dir: Path, name: str, df_mode: str, trial: int = 0, session: int = 0) -> pd.DataFrame:
    return pd.read_csv(run_dir / 'info' / f'{name}_t{trial}_s{session}_session_df_{df_mode}.csv')


def assert_run_layout(run_dir: Path, name: str, max_frame: int, sessions: int = 1) -> dict[str, pd.DataFrame]:
    """The files a finished train run leaves (SLM-Lab's layout); returns the session dataframes."""
    match = re.fullmatch(RUN_DIR_RE.format(name=re.escape(name)), run_dir.name)
    assert match, f'run directory {run_dir.name} is not {name}_YYYY_MM_DD_HHMMSS'
    experiment_ts = match.group(1)

    spec = json.loads((run_dir / f'{name}_spec.json').read_text())
    assert spec['name'] == name and spec['env']['max_frame'] == max_frame
    trial_spec = json.loads((run_dir / f'{name}_t0_spec.json').read_text())
    assert trial_spec['meta']['trial'] == 0
    git = in_git_checkout()
    dfs = {}
    for s in range(sessions):
        prename = f'{name}_t0_s{s}'
        meta = json.loads((run_dir / f'{prename}_spec.json').read_text())['meta']
        assert meta['experiment_ts'] == experiment_ts
        assert meta['trial'] == 0 and meta['session'] == s
        assert isinstance(meta['random_seed'], int)
        assert meta['lab_version'] == slm_lab.__version__
        if git:
            assert re.fullmatch(r'[0-9a-f]{40}', meta['git_sha']), meta['git_sha']
        else:
            assert meta['git_sha'] is None
        for df_mode in ('train', 'eval'):
            df = read_df(run_dir, name, df_mode, session=s)
            assert set(COLUMNS) <= set(df.columns)
            assert len(df) >= 1 and df['frame'].iloc[-1] == max_frame
            assert df['frame'].is_monotonic_increasing and df['opt_step'].is_monotonic_increasing
            dfs[f'{df_mode}{s}'] = df
        metrics = json.loads((run_dir / 'info' / f'{prename}_session_metrics.json').read_text())
        assert {'eval', 'train'} <= set(metrics) and 'final_return_ma' in metrics['eval']['scalar']
        for which in ('latest', 'best'):
            model = torch.load(run_dir / 'model' / f'{prename}_model_{which}.pt', weights_only=True)
            assert 'nets' in model
        assert torch.load(run_dir / 'model' / f'{prename}_model_latest.pt', weights_only=True)['frame'] == max_frame
        assert (run_dir / 'graph' / f'{prename}_session_graph.html').stat().st_size > 0
        log = (run_dir / 'log' / f'{prename}.log').read_text()
        assert f'frame {max_frame}/{max_frame}' in log
    trial_metrics = json.loads((run_dir / 'info' / f'{name}_t0_trial_metrics.json').read_text())
    assert 'consistency' in trial_metrics['scalar']
    assert (run_dir / 'graph' / f'{name}_t0_trial_graph.html').stat().st_size > 0
    return dfs


# name: (algorithm, env, memory override, algorithm overrides, net overrides, env overrides)
CASES = {
    'random_cartpole': ('Random', 'CartPole-v1', None, {}, {}, {}),
    'reinforce_cartpole': ('Reinforce', 'CartPole-v1', None, {}, {}, {}),
    'reinforce_batch_cartpole': ('Reinforce', 'CartPole-v1', {'name': 'OnPolicyBatchReplay'},
                                 {'training_frequency': 32}, {}, {'num_envs': 2}),
    'vanilla_dqn_cartpole': ('VanillaDQN', 'CartPole-v1', None, {}, {}, {}),
    'dqn_cartpole': ('DQN', 'CartPole-v1', None, {}, {'update_type': 'replace', 'update_frequency': 16}, {}),
    'ddqn_replace_cartpole': ('DoubleDQN', 'CartPole-v1', None, {}, {'update_type': 'replace',
                                                                     'update_frequency': 16}, {}),
    'ddqn_polyak_cartpole': ('DoubleDQN', 'CartPole-v1', None, {'action_policy': 'boltzmann',
                                                                'explore_var_spec': {'name': 'no_decay',
                                                                                     'start_val': 1.0}},
                             {'update_type': 'polyak', 'polyak_coef': 0.1}, {'num_envs': 2}),
    'ppo_cartpole': ('PPO', 'CartPole-v1', None, {}, {'shared': True}, {'num_envs': 4}),
    'ppo_pendulum': ('PPO', 'Pendulum-v1', None, {}, {'actor_optim_spec': {'name': 'Adam', 'lr': 3e-4},
                                                      'critic_optim_spec': {'name': 'Adam', 'lr': 1e-3}},
                     {'num_envs': 4, 'max_t': 50}),
    'reinforce_pendulum': ('Reinforce', 'Pendulum-v1', None, {}, {}, {'max_t': 50}),
}
LEARNS = {name for name, case in CASES.items() if case[0] != 'Random'}
MAX_FRAME = 256


def case_spec(make_spec, name: str, max_frame: int = MAX_FRAME) -> dict:
    algorithm, env, memory, algo_kw, net_kw, env_kw = CASES[name]
    spec = make_spec(algorithm, env=env, max_frame=max_frame, num_envs=env_kw.get('num_envs', 1),
                     log_frequency=max_frame // 4)
    spec['env'].update(env_kw)
    if memory:
        spec['agent']['memory'] = memory
    spec['agent']['algorithm'].update(algo_kw)
    if net_kw:
        spec['agent']['net'].update(net_kw)
    return spec


@pytest.mark.subprocess
@pytest.mark.parametrize('name', list(CASES))
def test_train_writes_the_full_run_directory(lab_run, make_spec, name):
    metrics, run_dir = lab_run(case_spec(make_spec, name), name)
    dfs = assert_run_layout(run_dir, name, MAX_FRAME)
    train, evaluation = dfs['train0'], dfs['eval0']
    assert len(train) == 4, 'a row every log_frequency frames'
    assert train['epi'].iloc[-1] > 0, 'episodes finished within max_frame'
    assert not math.isnan(train['total_reward_ma'].iloc[-1])
    assert set(metrics) >= {'scalar', 'local'}
    if name in LEARNS:
        model = torch.load(run_dir / 'model' / f'{name}_t0_s0_model_best.pt', weights_only=True)
        assert model['nets'], 'the model file holds the network weights'
        assert train['opt_step'].iloc[-1] > 0
        assert train['loss'].notna().any() and train['grad_norm'].notna().any()
        assert train['lr'].notna().all()
    else:
        assert (train['opt_step'] == 0).all() and train['loss'].isna().all()
    if CASES[name][0] in ('PPO', 'Reinforce'):
        assert train['entropy'].notna().any()
    if 'DQN' in CASES[name][0]:
        explore = train['explore_var']
        assert explore.notna().all()
    assert list(evaluation['frame']) == list(train['frame']), 'eval_frequency defaults to log_frequency'


def test_epsilon_decays_in_the_records(lab_run, make_spec):
    spec = case_spec(make_spec, 'dqn_cartpole')
    spec['agent']['algorithm']['explore_var_spec'] = {'name': 'linear_decay', 'start_val': 1.0, 'end_val': 0.1,
                                                      'start_step': 0, 'end_step': MAX_FRAME // 2}
    _, run_dir = lab_run(spec, 'dqn_eps')
    explore = read_df(run_dir, 'dqn_eps', 'train')['explore_var']
    assert explore.iloc[0] == pytest.approx(1.0 - 0.9 * 0.5)
    assert explore.iloc[-1] == pytest.approx(0.1)


@pytest.mark.parametrize('frequency', [1, 0.9])
def test_polyak_coef_is_the_weight_of_the_online_net(lab_run, make_spec, frequency):
    # the spec reference (and SLM-Lab) define polyak_coef as the online net's weight in each
    # target update: with 1.0 the target net is the online net after every update. A frequency
    # below one frame (SLM-Lab's ddqn_lunar_search.json gives 0.9) updates at every step, as there
    spec = case_spec(make_spec, 'ddqn_polyak_cartpole', max_frame=128)
    spec['agent']['net'].update({'update_type': 'polyak', 'polyak_coef': 1.0, 'update_frequency': frequency})
    _, run_dir = lab_run(spec, 'polyak_one')
    nets = torch.load(run_dir / 'model' / 'polyak_one_t0_s0_model_latest.pt', weights_only=True)['nets']
    for key, value in nets['net'].items():
        assert torch.equal(nets['target_net'][key], value), f'target {key} does not follow the online net'


def test_dev_mode_runs_one_session_and_logs_the_dev_check(lab_run, make_spec):
    spec = case_spec(make_spec, 'ppo_cartpole', max_frame=128)
    spec['meta']['max_session'] = 2
    _, run_dir = lab_run(spec, 'ppo_dev', mode='dev')
    log = (run_dir / 'log' / 'ppo_dev_t0_s0.log').read_text()
    assert re.search(r'DEBUG .*dev check passed', log), log
    assert not (run_dir / 'log' / 'ppo_dev_t0_s1.log').exists(), 'dev runs one session'
    assert read_df(run_dir, 'ppo_dev', 'train')['frame'].iloc[-1] == 128
    assert json.loads((run_dir / 'ppo_dev_t0_s0_spec.json').read_text())['meta']['mode'] == 'dev'


def test_train_mode_logs_no_debug_lines(lab_run, make_spec):
    _, run_dir = lab_run(case_spec(make_spec, 'reinforce_cartpole', max_frame=64), 'quiet')
    log = (run_dir / 'log' / 'quiet_t0_s0.log').read_text()
    assert ' INFO ' in log and ' DEBUG ' not in log


def test_rigorous_eval_records_greedy_returns(lab_run, make_spec):
    spec = case_spec(make_spec, 'ppo_cartpole')
    spec['meta']['rigorous_eval'] = 2
    _, run_dir = lab_run(spec, 'ppo_rigorous')
    train = read_df(run_dir, 'ppo_rigorous', 'train')
    evaluation = read_df(run_dir, 'ppo_rigorous', 'eval')
    assert list(evaluation['frame']) == list(train['frame'])
    assert evaluation['total_reward'].notna().all(), 'every eval row plays its own episodes'
    assert (evaluation['total_reward'] != train['total_reward']).any()
    assert (evaluation['total_reward_ma'] != train['total_reward_ma']).any()
