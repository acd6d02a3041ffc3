"""bench/sb3_side_by_side.py: its lab side trains a tiny row and prints the table, and without
Stable-Baselines3 it stops in one line naming requirements-bench.txt."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / 'bench'))
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
