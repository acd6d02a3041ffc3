"""bench/sb3_tier.py: the SB3 side of a suite, seed by seed, continued from its results file, and
the comparison with the lab's benchmark of the same suite (both sides' 95% intervals). SB3 is a
bench-only dependency: the training test runs where it is installed."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / 'bench'))
import sb3_tier as tier  # noqa: E402

SUITE = str(REPO_ROOT / 'spec/benchmark/suites/mujoco_reduced.json')


def write_suite(tmp_path: Path, rows: list[dict]) -> str:
    path = tmp_path / 'suite.json'
    path.write_text(json.dumps({'name': 'tiny', 'seeds': 4, 'score': 'final_ma', 'rows': rows}))
    return str(path)


def test_the_comparison_reads_the_labs_scores_and_judges_by_the_intervals(tmp_path, capsys):
    out = tmp_path / 'sb3.json'
    runs = [{'row': 'sac_hopper_100k', 'seed': s, 'score': v} for s, v in enumerate([900, 950, 1000, 1050])]
    runs += [{'row': 'ppo_hopper_1m', 'seed': s, 'score': v} for s, v in enumerate([1500, 1900, 2300, 2600])]
    out.write_text(json.dumps({'runs': runs}))
    lab = tmp_path / 'run' / 'benchmark'
    lab.mkdir(parents=True)
    lines = ['row,seed,trial,frame,finished,score']
    lines += [f'sac_hopper_100k,{s},{s},100000,True,{v}' for s, v in enumerate([2000, 2100, 2200, 2300])]
    lines += [f'ppo_hopper_1m,{s},{4 + s},1000000,True,{v}' for s, v in enumerate([1800, 2000, 2200, 2400])]
    lines += ['sac_halfcheetah_100k,0,8,52000,False,-300.0']  # still training: not a score yet
    (lab / 'scores.csv').write_text('\n'.join(lines) + '\n')
    assert tier.main([SUITE, '--out', str(out), '--lab', str(tmp_path / 'run')]) == 0
    printed = capsys.readouterr().out
    cells = {line.split('|')[1].strip(): [c.strip() for c in line.split('|')[2:-1]]
             for line in printed.splitlines() if line.startswith('| ') and not line.startswith('| row ')}
    assert cells['sac_hopper_100k'][0].startswith('975.0 [') and cells['sac_hopper_100k'][0].endswith('(n=4)')
    assert cells['sac_hopper_100k'][1].startswith('2,150.0 [')
    assert cells['sac_hopper_100k'][2] == 'lab above'
    assert cells['ppo_hopper_1m'][2] == 'overlap'
    assert cells['sac_halfcheetah_100k'] == ['-', '-', '-']  # neither side has run it
    published = tmp_path / 'published'  # the same seeds published (slm-lab publish): the same table
    published.mkdir()
    (published / 'suite.json').write_text(Path(SUITE).read_text())
    (published / 'seeds.csv').write_text('row,seed,frame,score,benchmark,trial,lab_commit\n' + ''.join(
        f'{line.split(",")[0]},{line.split(",")[1]},{line.split(",")[3]},{line.split(",")[5]},b,0,\n'
        for line in lines[1:] if ',True,' in line))
    assert tier.main([SUITE, '--out', str(out), '--lab', str(published)]) == 0
    assert capsys.readouterr().out == printed
    other = json.loads(Path(SUITE).read_text())  # a folder of the suite at another budget: refused
    other['rows'][0]['max_frame'] = 50_000
    (published / 'suite.json').write_text(json.dumps(other))
    with pytest.raises(SystemExit, match=r'^error: --lab row sac_hopper_100k: .*max_frame 50000 there'):
        tier.main([SUITE, '--out', str(out), '--lab', str(published)])


def test_bad_input_is_one_line(tmp_path, capsys, monkeypatch):
    suite = write_suite(tmp_path, [{'id': 'odd', 'env': 'Hopper-v5',
                                    'spec_file': 'spec/benchmark/sac/sac_halfcheetah_zoo.json',
                                    'spec_name': 'sac_halfcheetah_zoo', 'max_frame': 1000,
                                    'set': {'env.name': 'Hopper-v5', 'agent.algorithm.gamma': 0.9}}])
    assert tier.main([suite, '--out', str(tmp_path / 'o.json')]) == 2
    assert 'agent.algorithm.gamma' in capsys.readouterr().err
    assert tier.main([SUITE, '--out', str(tmp_path / 'o.json'), '--rows', 'nope']) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and 'sac_hopper_100k' in err
    assert tier.main([str(tmp_path / 'missing.json'), '--out', str(tmp_path / 'o.json')]) == 2
    assert capsys.readouterr().err.startswith('error: ')
    (tmp_path / 'capped.json').write_text(json.dumps({'meta': {'max_frame_cap': 500}, 'runs': []}))
    assert tier.main([SUITE, '--out', str(tmp_path / 'capped.json')]) == 2  # runs of 500 frames, asked for full
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and '--max-frame 500' in err
    (tmp_path / 'junk.json').write_text('[1, 2]')
    with pytest.raises(SystemExit, match='not a results file'):
        tier.main([SUITE, '--out', str(tmp_path / 'junk.json')])
    monkeypatch.setitem(sys.modules, 'stable_baselines3', None)  # find_spec then answers None
    assert tier.main([SUITE, '--out', str(tmp_path / 'o.json')]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'requirements-bench.txt' in err
    assert not (tmp_path / 'o.json').exists()


def test_what_the_sb3_side_cannot_stand_for_is_refused_in_one_line(tmp_path, capsys):
    """A row scored otherwise than final_ma, a results file of another suite, and stored runs
    shorter than the row's budget are refused before anything trains; --seeds bounds the
    comparison; SB3 trains the env the lab trains (the row's env.name edit)."""
    row = {'id': 'sac_hop', 'env': 'Hopper-v5', 'spec_file': 'spec/benchmark/sac/sac_halfcheetah_zoo.json',
           'spec_name': 'sac_halfcheetah_zoo', 'max_frame': 1000, 'set': {'env.name': 'Hopper-v5'}}
    out = tmp_path / 'o.json'
    suite = write_suite(tmp_path, [{**row, 'score': 'slm_ma'}])
    assert tier.main([suite, '--out', str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'scored slm_ma' in err and 'final_ma' in err
    suite = write_suite(tmp_path, [row])
    runs = [{'row': 'sac_hop', 'seed': s, 'frames': 500, 'score': 1.0} for s in range(2)]
    out.write_text(json.dumps({'meta': {'suite': 'x/other.json', 'max_frame_cap': None}, 'runs': runs}))
    assert tier.main([suite, '--out', str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'suite other, not tiny' in err
    out.write_text(json.dumps({'meta': {'suite': suite, 'suite_name': 'tiny', 'max_frame_cap': None}, 'runs': runs}))
    before = out.read_text()
    assert tier.main([suite, '--out', str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'seeds 0, 1' in err and 'shorter than its 1,000 frames' in err
    assert out.read_text() == before
    assert tier.main([suite, '--out', str(out), '--lab', str(tmp_path)]) == 2  # nor compared
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'shorter than its 1,000 frames' in err
    full = [{'row': 'sac_hop', 'seed': s, 'frames': 1000, 'score': float(s)} for s in range(4)]
    out.write_text(json.dumps({'meta': {'suite_name': 'tiny'}, 'runs': full}))
    lab = tmp_path / 'run' / 'benchmark'
    lab.mkdir(parents=True)
    (lab / 'scores.csv').write_text('row,seed,trial,frame,finished,score\n'
                                    + ''.join(f'sac_hop,{s},{s},1000,True,{s}\n' for s in range(3)))
    assert tier.main([suite, '--out', str(out), '--lab', str(tmp_path / 'run'), '--seeds', '3']) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith('| sac_hop'))
    assert line.split('|')[2].strip().endswith('(n=3)')  # SB3's seed 3 left out, as --seeds says
    rows = tier.read_suite(write_suite(tmp_path, [{**row, 'env': 'HalfCheetah-v5'}])).rows
    assert tier.env_of(rows[0]) == 'Hopper-v5'


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec('stable_baselines3') is None, reason='SB3 is a bench-only dependency')
def test_sb3_trains_each_seed_once_and_a_second_command_continues(tmp_path, capsys):
    suite = write_suite(tmp_path, [{'id': 'sac_hop', 'env': 'Hopper-v5',
                                    'spec_file': 'spec/benchmark/sac/sac_halfcheetah_zoo.json',
                                    'spec_name': 'sac_halfcheetah_zoo', 'max_frame': 400, 'seeds': 2,
                                    'set': {'env.name': 'Hopper-v5'}}])
    out = tmp_path / 'sb3.json'
    assert tier.main([suite, '--out', str(out), '--seeds', '1']) == 0
    first = json.loads(out.read_text())
    assert [(r['row'], r['seed'], r['frames']) for r in first['runs']] == [('sac_hop', 0, 400)]
    assert first['runs'][0]['episodes'] > 0 and first['runs'][0]['score'] == first['runs'][0]['score']  # not NaN
    capsys.readouterr()
    assert tier.main([suite, '--out', str(out)]) == 0  # the row's 2 seeds: only seed 1 trains
    printed = capsys.readouterr().out
    assert 'sac_hop seed 1:' in printed and 'sac_hop seed 0:' not in printed
    runs = json.loads(out.read_text())['runs']
    assert runs[0] == first['runs'][0] and [r['seed'] for r in runs] == [0, 1]
