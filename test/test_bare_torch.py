"""bench/bare_torch.py: each row's bare torch loop (the CartPole rows, PPO Hopper) trains for real
(a short run past the first update, learning starts and a target copy for DQN), prints its table
and writes its JSON;
with the lab's column the runs interleave and the table gives the lab against the bare loop."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / 'bench'))
import bare_torch  # noqa: E402
from side_rows import ROWS  # noqa: E402


@pytest.mark.parametrize('key, frames', [('ppo', 512), ('a2c', 400), ('dqn', 1280),
                                         pytest.param('ppo_hopper', 2048, marks=pytest.mark.slow)])
def test_each_bare_loop_trains(key, frames):
    import torch
    row = ROWS[key]
    before = torch.get_num_threads()
    out = (bare_torch.bare_dqn if row.algo == 'DQN' else bare_torch.bare_on_policy)(row, 0, frames)
    assert out['frames'] >= frames and out['seconds'] > 0
    assert out['returns']  # whole episodes were played
    if row.env_id.startswith('CartPole'):
        assert all(r >= 8 for r in out['returns'])  # CartPole's shortest episode
    assert torch.get_num_threads() == before


@pytest.mark.slow
def test_bare_and_lab_columns_interleave_and_print_their_ratio(tmp_path, capsys):
    out = tmp_path / 'bare.json'
    assert bare_torch.main(['--rows', 'ppo', '--seeds', '0', '--frames', '512', '--json', str(out)]) == 0
    printed = capsys.readouterr().out
    assert 'done bare ppo seed 0' in printed and 'done lab ppo seed 0' in printed
    line = next(ln for ln in printed.splitlines() if ln.startswith('ppo ') and ln.rstrip().endswith('x'))
    assert float(line.split()[-1].rstrip('x')) > 0
    figures = json.loads(out.read_text())
    assert {r['tool'] for r in figures['runs']} == {'bare', 'lab'}
    assert figures['summary'][0]['median_ratio_to_bare']['lab'] > 0


def test_unknown_row_is_one_line(capsys):
    with pytest.raises(SystemExit):
        bare_torch.main(['--rows', 'sac'])
    assert '--rows: unknown sac' in capsys.readouterr().err
