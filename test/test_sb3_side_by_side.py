"""bench/sb3_side_by_side.py: its lab columns (the spec as it is, and with the fast opt-ins) train
a tiny row and print the run table, the per-row summary against the row's floor (bench/floor.py) and
the floor's parts; each expensive row (MuJoCo, Atari) trains in its cheapest real form; without
Stable-Baselines3 it stops in one line naming requirements-bench.txt (SB3 is a bench-only
dependency, so these tests run the lab's side only). The floor's FLOP counts agree with torch's
profiler."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / 'bench'))
import floor  # noqa: E402
import sb3_side_by_side as side  # noqa: E402
import side_rows  # noqa: E402

from slm_lab.agent.net.precision import cpu_has_bf16  # noqa: E402

PPO_FAST = ['agent.net.optim_spec.fused=true']  # [64, 64] tanh: too narrow for oneDNN, not an image net


def _table_line(printed: str, head: str, row: str) -> list[str]:
    """The cells of `row`'s line in the table whose head line starts with `head`."""
    table = printed[printed.index(head):]
    return next(ln for ln in table.splitlines() if ln.startswith(row + ' ')).split()


def test_lab_columns_of_a_tiny_row_print_the_runs_the_summary_and_the_floor(tmp_path, capsys):
    out = tmp_path / 'side.json'
    code = side.main(['--frames-scale', '0.005', '--rows', 'ppo', '--seeds', '1', '--lab-only',
                      '--eval-episodes', '1', '--json', str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert 'frames scale 0.005' in printed
    assert f'fast -s {" -s ".join(PPO_FAST)}' in printed  # the row's header names the fast column's edits
    cells = _table_line(printed, 'row  seed', 'ppo')
    assert cells[1] == '1' and cells[2] == '512'  # seed 1; 500 frames end on a whole rollout of 32 x 8
    figures = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f'{c} in --json: not standard JSON'))
    runs = {run['tool']: run for run in figures['runs']}
    assert set(runs) == {'lab', 'lab_fast'}
    assert figures['summary'][0]['lab_vs_sb3'] is None  # no SB3 column: null, not NaN
    assert runs['lab']['edits'] == [] and runs['lab_fast']['edits'] == PPO_FAST
    for run in runs.values():
        assert (run['row'], run['seed'], run['frames']) == ('ppo', 1, 512)
        assert run['fps'] > 0 and run['episodes'] > 0 and run['greedy_return'] > 0
    assert figures['meta']['rows']['ppo']['fast_edits'] == PPO_FAST
    # the summary: each column's median over the seeds as a share of the row's floor
    (summary,), (row_floor,) = figures['summary'], figures['floors']
    assert row_floor['row'] == 'ppo' and summary['floor_fps'] == row_floor['fps']
    for tool in ('lab', 'lab_fast'):
        assert summary[f'{tool}_fps'] == runs[tool]['fps'] < row_floor['fps']
        assert abs(summary[f'{tool}_of_floor'] - runs[tool]['fps'] / row_floor['fps']) < 1e-12
    cells = _table_line(printed, 'row  seeds', 'ppo')
    assert cells[-2] == f'{summary["lab_of_floor"]:.1%}' and cells[-1] == f'{summary["lab_fast_of_floor"]:.1%}'
    floor_line = next(ln for ln in printed.splitlines() if ln.startswith('ppo: floor'))
    assert float(floor_line.split()[2].replace(',', '')) == pytest.approx(row_floor['fps'], rel=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize('key, scale, frames', [
    ('sac_cheetah', 0.01, 1_050),  # 1,000 random frames, then 50 updates
    ('ppo_hopper', 0.05, 2_048),  # one rollout and its update (320 minibatches)
    ('ppo_pong', 0.05, 1_024),  # one rollout of 128 x 8 and its update (16 minibatches)
    ('dqn_pong', 0.06, 1_200),  # 1,000 frames before learning, then 50 updates
])
def test_each_expensive_row_trains_both_lab_columns(tmp_path, capsys, key, scale, frames):
    out = tmp_path / 'side.json'
    episodes = '1' if key == 'dqn_pong' else '0'  # one greedy Atari game through enjoy
    code = side.main(['--frames-scale', str(scale), '--rows', key, '--seeds', '0', '--lab-only', '--no-floor',
                      '--eval-episodes', episodes, '--json', str(out)])
    assert code == 0
    row = side.ROWS[key]
    runs = {run['tool']: run for run in json.loads(out.read_text())['runs']}
    assert runs['lab']['edits'] == list(row.lab_edits)
    assert runs['lab_fast']['edits'] == [*row.lab_edits, *side_rows.fast_edits(row)]
    for run in runs.values():
        assert run['frames'] == frames and run['fps'] > 0
        assert run['window_frames'] == frames - row.window_start
    if key == 'dqn_pong':
        assert all(-21 <= run['greedy_return'] <= 21 for run in runs.values())  # one whole game of Pong


def test_without_sb3_one_line_names_requirements_bench(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, 'stable_baselines3', None)  # find_spec then answers None
    assert side.main(['--rows', 'ppo', '--seeds', '0']) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'requirements-bench.txt' in err and err.startswith('error: ')


def test_unknown_row_is_refused_with_the_valid_ones(capsys):
    with pytest.raises(SystemExit) as e:
        side.main(['--rows', 'ppo,nope'])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert 'nope' in err and 'a2c' in err


def test_frames_scale_shortens_the_window_not_its_start():
    assert side.run_frames(side.ROWS['td3'], full=False, scale=0.2) == 10_000 + 400
    assert side.run_frames(side.ROWS['sac_cheetah'], full=False, scale=1.0) == 6_000
    assert side.run_frames(side.ROWS['sac_cheetah'], full=False, scale=0.01) == 1_000 + 50
    assert side.run_frames(side.ROWS['a2c'], full=False, scale=1.0) == 100_000
    assert side.run_frames(side.ROWS['a2c'], full=True, scale=1.0) == 500_000


def test_on_policy_runs_end_on_a_whole_rollout_as_sb3s_do():
    """SB3's learn finishes the rollout that passes total_timesteps; the lab trains on whole rollouts:
    the bench rounds up, so both sides take the same gradient steps."""
    assert side.run_frames(side.ROWS['ppo'], full=True, scale=1.0) == 391 * 32 * 8  # 100,096
    assert side.run_frames(side.ROWS['ppo_pong'], full=False, scale=1.0) == 20 * 128 * 8
    assert side.run_frames(side.ROWS['ppo_pong'], full=False, scale=0.01) == 128 * 8
    assert side.run_frames(side.ROWS['ppo_hopper'], full=False, scale=1.0) == 10 * 2048
    assert side.run_frames(side.ROWS['a2c'], full=False, scale=0.001) == 3 * 5 * 8


def test_the_default_column_has_no_opt_in_and_fast_adds_the_documented_ones():
    """Each row's spec file names none of the speed opt-ins (its default column is a user's run of
    it); the fast column's edits validate and set them on every net and optimizer that takes them."""
    from slm_lab.spec import load_spec
    for row in side.ROWS.values():
        assert side_rows.speed_opt_ins(side_rows.raw_spec(row)) == [], row.key
        edits = side_rows.fast_edits(row)
        spec = load_spec(str(REPO_ROOT / row.spec_file), row.spec_name, [*row.lab_edits, *edits])
        net = spec['agent']['net']
        option = {'Adam': 'fused', 'RMSprop': 'foreach'}[net['optim_spec']['name']]
        assert net['optim_spec'][option] is True, row.key
        wide = net['type'] != 'ConvNet' and min(net['hid_layers']) >= side_rows.FAST_ONEDNN_MIN_WIDTH \
            and side_rows.amd_cpu()
        assert net.get('linear_kernel') == ('onednn' if wide else None if net['type'] == 'ConvNet' else 'default'), \
            row.key
        big_batch = (spec['agent']['memory'].get('batch_size') or 0) >= side_rows.FAST_BF16_MIN_BATCH
        assert net['precision'] == ('bf16' if (net['type'] == 'ConvNet' or wide and big_batch) and cpu_has_bf16()
                                    else 'fp32'), row.key
        assert sorted(side_rows.speed_opt_ins(side_rows.raw_spec(row, edits))) == sorted(edits), row.key


def test_the_expensive_rows_specs_map_their_sb3_settings():
    """The settings both sides run, key by key, for the four expensive rows (the lab's edits applied)."""
    from slm_lab.spec import load_spec

    def lab(key):
        row = side.ROWS[key]
        spec = load_spec(str(REPO_ROOT / row.spec_file), row.spec_name, list(row.lab_edits))
        return row.sb3_kwargs, spec['agent']['algorithm'], spec['agent']['net'], spec['agent']['memory'], spec['env']

    kw, algo, net, memory, env = lab('sac_cheetah')
    assert (env['name'], algo['training_start_step'], kw['learning_starts']) == ('HalfCheetah-v5', 1000, 1000)
    assert (memory['batch_size'], memory['max_size'], net['hid_layers']) == (256, 1_000_000, [256, 256])
    assert (kw['batch_size'], kw['buffer_size'], kw['policy_kwargs']['net_arch']) == (256, 1_000_000, [256, 256])
    assert net['optim_spec']['lr'] == 3e-4  # SB3's default
    kw, algo, net, memory, env = lab('ppo_hopper')
    assert env['normalize_obs'] and env['normalize_reward'] and side.ROWS['ppo_hopper'].normalize
    assert (algo['time_horizon'], algo['minibatch_size'], algo['training_epoch']) == (2048, 64, 10)  # SB3's defaults
    kw, algo, net, memory, env = lab('ppo_pong')
    assert (env['name'], env['num_envs'], env['frame_op_len']) == (
        'PongNoFrameskip-v4', 8, side.ROWS['ppo_pong'].frame_stack)
    assert (algo['time_horizon'], algo['minibatch_size'], algo['training_epoch']) == (
        kw['n_steps'], kw['batch_size'], kw['n_epochs'])
    assert (algo['entropy_coef_spec']['start_val'], algo['val_loss_coef']) == (kw['ent_coef'], kw['vf_coef'])
    assert (algo['clip_eps_spec']['start_val'], algo['clip_eps_spec']['end_step']) == (
        0.1, side.ROWS['ppo_pong'].full_frames)
    assert (net['optim_spec']['lr'], net['lr_scheduler_spec']['frame']) == (2.5e-4, side.ROWS['ppo_pong'].full_frames)
    assert (net['type'], net['shared'], net['fc_hid_layers'], net['batch_norm']) == ('ConvNet', True, [512], False)
    kw, algo, net, memory, env = lab('dqn_pong')
    assert (memory['max_size'], memory['batch_size'], net['optim_spec']['lr']) == (
        kw['buffer_size'], kw['batch_size'], kw['learning_rate'])
    assert (algo['training_frequency'], algo['training_iter'], net['update_frequency']) == (
        kw['train_freq'], kw['gradient_steps'], kw['target_update_interval'])
    assert (algo['training_start_step'], algo['double_q']) == (kw['learning_starts'], False)
    explore = algo['explore_var_spec']
    assert (explore['end_val'], explore['end_step']) == (
        kw['exploration_final_eps'], kw['exploration_fraction'] * side.ROWS['dqn_pong'].full_frames)


def _profiled_mflop(step) -> float:
    """MFLOP of the matrix products torch.profiler counts in one call of `step`."""
    import torch
    with torch.profiler.profile(with_flops=True) as prof:
        step()
    return sum(e.flops for e in prof.key_averages()) / 1e6


def test_floor_counts_agree_with_the_profiler_on_one_dqn_update():
    """The DQN row's per-update count (batch 64: 3 Q online + Q target per sample) against the
    profiler's count of a real forward, backward and target forward of its net."""
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    q = nn.Sequential(nn.Linear(4, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2))
    target = nn.Sequential(*[nn.Linear(m.in_features, m.out_features) if isinstance(m, nn.Linear) else m for m in q])
    x = torch.randn(64, 4)

    def update():
        with torch.no_grad():
            target(x)
        q(x).sum().backward()
    measured = _profiled_mflop(update)
    row = side.ROWS['dqn']
    kw = row.sb3_kwargs
    per_update = 2 * kw['batch_size'] * 4 * floor.macs(4, 256, 256, 2) / 1e6
    # the profiler skips the input layer's input gradient (x needs none): 2 x 64 x 4 x 256 FLOPs
    assert abs(measured - (per_update - 2 * 64 * 4 * 256 / 1e6)) < 1e-6
    # per frame: an acting pass on the greedy frames, plus the update times its share of the frames
    share = (1 - kw['learning_starts'] / row.full_frames) * kw['gradient_steps'] / kw['train_freq']
    expected = floor.greedy_share(row) * 2 * floor.macs(4, 256, 256, 2) / 1e6 + share * per_update
    assert abs(floor.flops_per_frame(row) / 1e6 - expected) < 1e-9
    # epsilon 1 -> 0.04 over 8,000 of 50,000 frames: greedy on 1 - (0.52 x 8k + 0.04 x 42k) / 50k of them
    assert floor.greedy_share(row) == pytest.approx(1 - (0.52 * 8_000 + 0.04 * 42_000) / 50_000, abs=1e-6)


def test_nature_cnn_counts_agree_with_the_profiler_on_the_labs_nets():
    """The Nature CNN's per-layer counts against torch.profiler over the lab's ConvNet of the Atari
    specs (forward: every product; backward: the profiler counts the dense layers' products, not
    convolution_backward, so the convolutions' backward is the rule of the floor's docstring)."""
    import torch
    from slm_lab.agent.net import build_net
    from slm_lab.spec import load_spec
    torch.manual_seed(0)
    layers = floor.nature_cnn_macs(4)
    assert layers == [3_276_800, 2_654_208, 1_806_336, 1_605_632]
    x = torch.rand(32, 4, 84, 84)
    for key, heads in (('dqn_pong', [6]), ('ppo_pong', [6, 1])):
        row = side.ROWS[key]
        net_spec = load_spec(str(REPO_ROOT / row.spec_file), row.spec_name)['agent']['net']
        net = build_net(net_spec, (4, 84, 84), heads if len(heads) > 1 else heads[0])
        with torch.no_grad():
            forward = _profiled_mflop(lambda: net(x))
        head_macs = 512 * sum(heads)
        assert forward == pytest.approx(2 * 32 * (sum(layers) + head_macs) / 1e6, abs=1e-6), key
    # the dense layers' backward: weight and input gradients of 3136-512 and 512-6
    dense = torch.nn.Sequential(torch.nn.Linear(3136, 512), torch.nn.ReLU(), torch.nn.Linear(512, 6))
    h = torch.rand(32, 3136, requires_grad=True)
    out = dense(h).sum()
    backward = _profiled_mflop(out.backward)
    assert backward == pytest.approx(2 * 32 * 2 * (layers[-1] + 512 * 6) / 1e6, abs=1e-6)


def test_floor_of_the_atari_rows_by_hand():
    """ppo_pong: F + 4 epochs x (3 F - L1) per frame, F = 9,346,560 (heads 512-6 and 512-1);
    dqn_pong: greedy share x F + 0.95 (frames past learning_starts) x 1/4 x 32 x (3 F - L1 + F),
    F = 9,346,048; 2 FLOPs per multiply-add."""
    l1 = 3_276_800
    f = 9_346_560
    assert floor.flops_per_frame(side.ROWS['ppo_pong']) == 2 * (f + 4 * (3 * f - l1))
    row = side.ROWS['dqn_pong']
    f = 9_346_048
    assert floor.training_share(row) == 0.95
    assert floor.greedy_share(row) == pytest.approx(0.99 * 10_000 / 1_000_000, rel=1e-6)  # epsilon ~0.99 throughout
    expected = 2 * (floor.greedy_share(row) * f + 0.95 * 32 / 4 * (3 * f - l1 + f))
    assert floor.flops_per_frame(row) == pytest.approx(expected, rel=1e-12)
    # a shortened run's window: 1,200 frames, of which the last 200 train
    assert floor.training_share(row, 1_200) == pytest.approx(200 / 1_200)
    assert floor.flops_per_frame(row, 1_200) < floor.flops_per_frame(row) / 4


@pytest.mark.parametrize('key, obs_shape', [('dqn_pong', (1, 4, 84, 84)), ('sac_cheetah', (1, 17))])
def test_floor_env_of_the_atari_and_mujoco_rows(key, obs_shape):
    """The floor's env of an Atari row is the game under the preprocessing both tools apply."""
    row = side.ROWS[key]
    env = floor._make_vec_env(row)
    obs, _ = env.reset(seed=0)
    env.close()
    assert obs.shape == obs_shape
    assert floor.env_seconds_per_frame(row, frames=100) > 0


def test_the_dqn_row_is_vanilla_dqn_as_sb3s():
    """SB3's DQN takes the target net's max; the lab's spec says so explicitly (a flat spec's DQN
    would otherwise compute SLM-Lab v5's Double DQN targets, and one more online pass per sample
    than the floor counts)."""
    from slm_lab.spec import load_spec
    row = side.ROWS['dqn']
    spec = load_spec(str(REPO_ROOT / row.spec_file), row.spec_name)
    assert spec['agent']['algorithm']['name'] == 'DQN' and spec['agent']['algorithm']['double_q'] is False


def test_floor_of_the_off_policy_rows_matches_their_profiled_updates():
    """SAC's and TD3's per-frame counts hold the 546 and 715 MFLOP per update that torch.profiler
    counted over the lab's updates (docs/BENCHMARKS.md), within 0.5%."""
    for key, profiled in (('sac', 546), ('td3', 715)):
        mflop = floor.flops_per_frame(side.ROWS[key]) / 1e6
        assert abs(mflop - profiled) / profiled < 0.005, (key, mflop)
