"""bench/sb3_side_by_side.py: its lab side trains a tiny row and prints the table and the row's
floor (bench/floor.py), and without Stable-Baselines3 it stops in one line naming
requirements-bench.txt. The floor's FLOP counts agree with torch's profiler."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / 'bench'))
import floor  # noqa: E402
import sb3_side_by_side as side  # noqa: E402


def test_lab_side_of_a_tiny_row_prints_its_table(tmp_path, capsys):
    out = tmp_path / 'side.json'
    code = side.main(['--frames-scale', '0.005', '--rows', 'ppo', '--seeds', '1', '--lab-only',
                      '--eval-episodes', '1', '--json', str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert 'frames scale 0.005' in printed
    table = printed[printed.index('row  seed'):]
    line = next(ln for ln in table.splitlines() if ln.startswith('ppo'))
    cells = line.split()
    assert cells[1] == '1' and cells[2] == '504'  # seed 1; 500 frames of 8 envs end at 504
    run = json.loads(out.read_text())['runs'][0]
    assert (run['tool'], run['row'], run['seed'], run['frames']) == ('lab', 'ppo', 1, 504)
    assert run['fps'] > 0 and run['episodes'] > 0 and run['greedy_return'] > 0
    # the floor line after the table: the row's floor and the lab's share of it
    floor_line = next(ln for ln in printed.splitlines() if ln.startswith('ppo: floor'))
    floor_fps = float(floor_line.split()[2].replace(',', ''))
    share = float(floor_line.split('fps = ')[-1].split('%')[0])
    assert floor_fps > run['fps'] and abs(share - 100 * run['fps'] / floor_fps) < 1.0


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
    assert side.run_frames(side.ROWS['ppo'], full=True, scale=1.0) == 100_000
    assert side.run_frames(side.ROWS['a2c'], full=False, scale=1.0) == 100_000
    assert side.run_frames(side.ROWS['a2c'], full=True, scale=1.0) == 500_000


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
    # per frame: one acting pass, plus the update times its share of the frames
    share = (1 - kw['learning_starts'] / row.full_frames) * kw['gradient_steps'] / kw['train_freq']
    expected = 2 * floor.macs(4, 256, 256, 2) / 1e6 + share * per_update
    assert abs(floor.FLOPS_PER_FRAME['dqn'](row) / 1e6 - expected) < 1e-9


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
        mflop = floor.FLOPS_PER_FRAME[key](side.ROWS[key]) / 1e6
        assert abs(mflop - profiled) / profiled < 0.005, (key, mflop)
