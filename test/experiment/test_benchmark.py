"""benchmark mode: a suite file's rows x seeds run as the lab's trials on Ray Tune, its report (the
interval, verdict and IQM maths against hand-computed values), bad suite files, and a benchmark
stopped by SIGTERM and killed by SIGKILL that continues to the same scores as one never stopped
(which ran on a two-node Ray cluster, with a search there before it)."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from lab_helpers import ROOT, RUN_LAB, TwoNodeRayCluster, cli, lab_processes, run_in_process_with_output

from slm_lab.experiment.benchmark import stats
from slm_lab.experiment.benchmark.suite import SuiteError, parse_suite, read_suite, select

# Ray is not imported here: the lab sets Ray's environment before Ray reads it
needs_ray = pytest.mark.skipif(importlib.util.find_spec('ray') is None, reason='benchmark mode needs the search extra')

SPEC = {
    'agent': {'name': 'PPO',
              'algorithm': {'name': 'PPO', 'gamma': 0.99, 'lam': 0.95, 'time_horizon': 32, 'minibatch_size': 32,
                            'training_epoch': 2},
              'memory': {'name': 'OnPolicyBatchReplay'},
              'net': {'type': 'MLPNet', 'hid_layers': [16], 'optim_spec': {'name': 'Adam', 'lr': 0.001}}},
    'env': {'name': 'CartPole-v1', 'num_envs': 2, 'max_frame': 100000},
    'meta': {'log_frequency': 100, 'eval_frequency': 200, 'checkpoint_frequency': 200},
}


def write_suite(folder: Path, frames: tuple[int, int] = (600, 400), **top) -> str:
    """A suite of 2 rows (one spec, a row of its own gamma), 2 seeds each, in `folder`."""
    spec_file = folder / 'ppo_tiny.json'
    spec_file.write_text(json.dumps({'ppo_tiny': SPEC}))
    suite = {'name': 'tiny', 'seeds': 2, 'rows': [
        {'id': 'ppo_a', 'spec_file': str(spec_file), 'spec_name': 'ppo_tiny', 'max_frame': frames[0],
         'random_score': 20, 'references': [{'value': 1000, 'source': 'a reference far above', 'max_frame': frames[0],
                                             'score': 'slm_ma'}]},
        {'id': 'ppo_b', 'spec_file': str(spec_file), 'spec_name': 'ppo_tiny', 'max_frame': frames[1],
         'set': {'agent.algorithm.gamma': 0.9}, 'random_score': 20,
         'references': [{'value': 0, 'source': 'a reference far below'}]}], **top}
    path = folder / 'suite.json'
    path.write_text(json.dumps(suite))
    return str(path)


# --- the maths, against hand-computed values --------------------------------------------------

def test_two_seeds_give_the_interval_from_one_to_the_other():
    """With 2 seeds a and b the resampled means are a, (a+b)/2, b with chances 1/4, 1/2, 1/4: the
    2.5% and 97.5% percentiles are a and b."""
    summary = stats.row_summary([3.0, 7.0])
    assert (summary['n'], summary['mean'], summary['low'], summary['high']) == (2, 5.0, 3.0, 7.0)
    assert stats.row_summary([3.0, None, float('nan')])['low'] is None  # one seed: no interval


def test_the_verdict_says_where_the_reference_lies_and_the_ends_count_as_inside():
    assert stats.verdict(8.0, 3.0, 7.0) == stats.ABOVE
    assert stats.verdict(7.0, 3.0, 7.0) == stats.INSIDE
    assert stats.verdict(3.0, 3.0, 7.0) == stats.INSIDE
    assert stats.verdict(2.9, 3.0, 7.0) == stats.BELOW
    assert stats.verdict(5.0, None, None) is None


@pytest.mark.parametrize('agent, kernel', [
    ({'net': {'linear_kernel': 'onednn'}}, 'onednn'),
    ({'net': {'linear_kernel': 'default'}, 'critic_net': {'linear_kernel': 'default'}}, 'default'),
    ({'net': {'linear_kernel': 'onednn'}, 'critic_net': {'linear_kernel': 'default'}}, 'onednn/default'),
    ({'net': {'hid_layers': [64]}}, ''),  # saved before the key: not known
    ({'net': None}, ''),  # an agent without a net (Random)
])
def test_a_published_seed_names_the_kernel_its_run_settled(agent, kernel):
    from slm_lab.experiment.benchmark.publish import settled_kernel
    assert settled_kernel({'agent': agent, 'meta': {}}) == kernel


def test_iqm_drops_a_quarter_from_each_end_as_scipy_trim_mean():
    assert stats.iqm([8, 1, 7, 2, 6, 3, 5, 4]) == 4.5  # 3, 4, 5, 6 kept
    assert stats.iqm(list(range(10))) == 4.5  # floor(2.5) = 2 dropped each end: 2..7
    assert stats.iqm([[0, 100], [1, 2]]) == 1.5  # flattened: 0, 1, 2, 100 -> 1, 2
    assert stats.normalise(60, 20, 100) == 0.5


def test_the_stratified_bootstrap_resamples_within_each_row():
    # rows of equal seeds: every resample is the data itself, IQM of (1, 1, 3, 3) = 2
    assert stats.stratified_bootstrap_interval([[1, 1], [3, 3]]) == (2.0, 2.0)
    # one row (0, 1): resamples (0,0), (0,1)/(1,0), (1,1) give IQMs 0, 0.5, 1 with chances 1/4, 1/2, 1/4
    low, high = stats.stratified_bootstrap_interval([[0, 1]])
    assert (low, high) == (0.0, 1.0)
    # a row of one seed never moves, the other's two seeds do; 3 scores: floor(3/4) = 0 dropped, so the
    # IQM is the mean: (5,4,4) -> 13/3, (5,4,6) -> 5, (5,6,6) -> 17/3, with chances 1/4, 1/2, 1/4
    low, high = stats.stratified_bootstrap_interval([[5], [4, 6]])
    assert (low, high) == pytest.approx((13 / 3, 17 / 3))
    # 4 rows of 2 seeds: 8 scores, 2 dropped each end; the data's own IQM lies inside its interval
    data = [[0, 10], [2, 4], [6, 8], [1, 3]]
    assert stats.iqm(data) == 3.75  # 0 1 [2 3 4 6] 8 10
    low, high = stats.stratified_bootstrap_interval(data)
    assert low < 3.75 < high


def test_the_row_table_says_each_reference_verdict_budget_and_unfinished_seeds():
    from slm_lab.experiment.benchmark import report
    suite = parse_suite({'name': 's', 'rows': [
        {'id': 'a', 'env': 'E', 'algorithm': 'A', 'spec_file': 'x.json', 'spec_name': 'x', 'max_frame': 1000,
         'seeds': 3,
         'references': [{'value': 10, 'source': 'one', 'max_frame': 1000, 'score': 'slm_ma', 'seeds': 4},
                        {'value': 0, 'source': 'two', 'max_frame': 5000, 'score': 'greedy episodes', 'note': 'v3'}]},
        {'id': 'b', 'spec_file': 'x.json', 'spec_name': 'x', 'max_frame': 2_000_000, 'seeds': 1,
         'note': 'none published'},
    ]}, 's.json')
    seeds = [{'row': 'a', 'seed': 0, 'trial': 0, 'frame': 1000, 'finished': True, 'score': 2.0},
             {'row': 'a', 'seed': 1, 'trial': 1, 'frame': 1000, 'finished': True, 'score': 4.0},
             {'row': 'a', 'seed': 2, 'trial': 2, 'frame': 500, 'finished': False, 'score': 9.0},
             {'row': 'b', 'seed': 0, 'trial': 3, 'frame': 2_000_000, 'finished': True, 'score': 7.0}]
    results = report.row_results(suite, seeds)
    # the unfinished seed left out
    assert (results[0]['mean'], results[0]['low'], results[0]['high']) == (3.0, 2.0, 4.0)
    assert results[0]['verdicts'] == ['above', 'below'] and results[1]['verdicts'] == []
    lines = report.row_table(report.row_records(results)).splitlines()[2:]
    assert lines[0] == ('| E | A | `a` | 1k | slm_ma | 2.00, 4.00, - (1 unfinished) | 3.00 | [2.00, 4.00] | 10.00 '
                        '| one | 1k | '
                        'slm_ma, 4 seeds | reference above the interval |')
    assert lines[1] == ('|  |  |  |  |  |  |  |  | 0.00 | two (v3) | 5k | greedy episodes | '
                        'reference below the interval '
                        '(a different budget or definition) |')
    assert lines[2] == '|  |  | `b` | 2M | slm_ma | 7.00 | 7.00 | n/a | none | none published |  |  | n/a |'
    assert report.aggregate(results, {'a': (0.0, 'the suite'), 'b': (0.0, 'the suite')})['rows'] == ['a']


def test_the_aggregate_scales_a_row_by_a_reference_of_its_own_budget_and_definition_only():
    """A row whose first reference is another project's figure (greedy episodes, another budget)
    is scaled by a later one in its own terms, or left out when it has none."""
    from slm_lab.experiment.benchmark import report
    other = {'value': 100, 'source': 'zoo', 'max_frame': 5000, 'score': 'greedy episodes'}
    own = {'value': 10, 'source': 'one', 'max_frame': 1000, 'score': 'slm_ma'}
    unstated = {'value': 20, 'source': 'three'}
    suite = parse_suite({'name': 's', 'seeds': 2, 'rows': [
        {'id': r, 'spec_file': 'x.json', 'spec_name': 'x', 'max_frame': 1000, 'references': refs}
        for r, refs in (('a', [other, own]), ('b', [other]), ('c', [unstated]))]}, 's.json')
    seeds = [{'row': r, 'seed': s, 'trial': 0, 'frame': 1000, 'finished': True, 'score': 5.0}
             for r in 'abc' for s in (0, 1)]
    results = report.row_results(suite, seeds)
    assert suite.rows[0].same_terms_reference().source == 'one' and suite.rows[1].same_terms_reference() is None
    agg = report.aggregate(results, {r: (0.0, 'the suite') for r in 'abc'})
    assert agg['rows'] == ['a', 'c']
    # a: 5 / 10 twice, c: 5 / 20 twice (scaled by zoo's 100 the a row would give 0.05)
    assert agg['iqm'] == pytest.approx((0.5 + 0.25) / 2)


# --- suite files ------------------------------------------------------------------------------

@pytest.mark.parametrize('edit, message', [
    (lambda s: s.pop('name'), r"^suite file .*: name: missing"),
    (lambda s: s['rows'][1].update(max_frame='3e5x'), r'^suite file .*: rows\[1\]\.max_frame: expected a positive '
                                                       r'integer, got "3e5x"'),
    (lambda s: s['rows'][0].update(max_fram=1), r"^suite file .*: rows\[0\]\.max_fram: unknown key \(did you mean "
                                                r"'max_frame'\?"),
    (lambda s: s['rows'][1].update(id='ppo_a'), r'^suite file .*: rows\[1\]\.id: "ppo_a" is also rows\[0\]'),
    (lambda s: s['rows'][0]['references'][0].pop('source'), r'^suite file .*: rows\[0\]\.references\[0\]\.source: '
                                                            r'missing'),
    (lambda s: s['rows'][0].update(score='best'), r'^suite file .*: rows\[0\]\.score: unknown score "best"; the '
                                                  r'scores: slm_ma'),
    (lambda s: s['rows'][0].update(set={'env.max_frame': 5}), r'rows\[0\]\.set\.env\.max_frame: set by the '
                                                              r'benchmark itself'),
    (lambda s: s.update(seeds=0), r'^suite file .*: seeds: expected a positive integer, got 0'),
])
def test_a_bad_suite_is_one_line_naming_the_key_path(tmp_path, edit, message):
    import re
    data = json.loads(Path(write_suite(tmp_path)).read_text())
    edit(data)
    with pytest.raises(SuiteError) as e:
        parse_suite(data, 'suite.json')
    assert '\n' not in str(e.value) and re.search(message, str(e.value)), str(e.value)


def test_rows_and_seeds_narrow_a_suite_and_a_yaml_suite_reads_as_json(tmp_path):
    suite = read_suite(write_suite(tmp_path))
    assert [r.id for r in select(suite, ['ppo_b'], 3).rows] == ['ppo_b'] and select(suite, None, 3).rows[0].seeds == 3
    with pytest.raises(SuiteError, match=r'^--rows nope: no row of .* its rows: ppo_a, ppo_b$'):
        select(suite, ['nope'])
    yaml = tmp_path / 'suite.yaml'
    yaml.write_text('name: tiny\nrows:\n  - {spec_file: x.json, spec_name: x, max_frame: 3.0e+5}\n')
    assert read_suite(str(yaml)).rows[0].max_frame == 300000 and read_suite(str(yaml)).rows[0].seeds == 4


@needs_ray
@pytest.mark.subprocess
def test_bad_benchmark_input_exits_2_with_one_line_and_never_touches_a_run(tmp_path, lab_run, make_spec):
    _, run = lab_run(make_spec('PPO', max_frame=64), 'ppo_run', data_dir=tmp_path / 'data')

    def fingerprint(root: Path) -> str:
        h = hashlib.sha256()
        for p in sorted(root.rglob('*')):
            h.update(str(p.relative_to(root)).encode())
            if p.is_file():
                h.update(p.read_bytes())
        return h.hexdigest()
    before = fingerprint(run)
    suite = write_suite(tmp_path)
    bad = tmp_path / 'bad.json'
    bad.write_text(Path(suite).read_text().replace('"max_frame": 600', '"max_frame": -1'))
    missing_spec = tmp_path / 'missing.json'
    missing_spec.write_text(Path(suite).read_text().replace('"spec_name": "ppo_tiny", "max_frame": 400',
                                                            '"spec_name": "ppo_tinny", "max_frame": 400'))
    import re

    import slm_lab
    from slm_lab.lib.errors import LabError
    data = str(tmp_path / 'data')
    # from Python: the same checks, raised (nothing of Ray is imported before they pass)
    for args, kwargs, message in [
        ((str(missing_spec),), {}, r'^suite file .*: row ppo_b \(.*ppo_tiny\.json ppo_tinny\): .*ppo_tinny'),
        ((suite, f'benchmark@{run}'), {}, r'^benchmark@.*: .* is not a benchmark directory'),
        ((suite,), {'rows': ['nope']}, r'^--rows nope: no row of'),
        ((suite, 'benchmark@latest'), {'seeds': 3}, r'^--rows, --seeds and --missing-from choose the'),
        ((str(tmp_path / 'none.json'),), {}, r'^suite file .*none\.json not found'),
    ]:
        with pytest.raises(LabError) as e:
            slm_lab.benchmark(*args, data_dir=data, **kwargs)
        assert '\n' not in str(e.value) and re.search(message, str(e.value)), (args, str(e.value))
    # the command line: one line, exit 2
    for args, message in [
        ([str(bad), 'benchmark'], r'^error: suite file .*bad\.json: rows\[0\]\.max_frame: expected a positive integer, '
                                  r'got -1'),
        ([suite, 'benchmark', '-s', 'env.max_frame=5'], r"^error: -s/--set does not apply to benchmark"),
    ]:
        result = cli(args, tmp_path)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and re.search(message, lines[0]), (args, result.stderr)
    assert sorted(p.name for p in (tmp_path / 'data').iterdir() if not p.name.startswith('.')) == [run.name]
    assert fingerprint(run) == before


# --- running a suite --------------------------------------------------------------------------



@pytest.fixture(scope='module')
def straight(tmp_path_factory):
    """The tiny suite run straight through on a real Ray cluster on this machine: a head and a
    second node (one CPU each) on loopback, started with `ray start` (TwoNodeRayCluster). From
    Python (slm_lab.benchmark with ray_address), in a process of its own: the lab sets Ray's
    environment before Ray is imported, which a test process may have done. First, on the cluster
    as started, a search with --ray-address (its result in `search`, its directory in `searched`):
    one cluster for both (starting one takes seconds), and one run of the suite for every test
    that reads a finished suite; the suite's local runs (stopped and continued, in pieces) are
    checked against it. Every test that reads it is marked slow (it takes a minute or more on a
    loaded machine): the slow tier runs it once for all of them."""
    from test_search import NAME, search_spec, write
    folder = tmp_path_factory.mktemp('straight')
    with TwoNodeRayCluster() as cluster:
        searched = folder / 'search'
        searched.mkdir()
        spec = search_spec(max_trial=2, max_frame=2000)
        spec['meta']['search_resources'] = {'cpu': 1}
        spec['meta'].pop('search_scheduler')
        search = cli([write(searched, spec), NAME, 'search', '--ray-address', cluster.address], searched,
                     timeout=600, env=cluster.env)
        script = ('import json, slm_lab, sys\n'
                  'r = slm_lab.benchmark(sys.argv[1], data_dir=sys.argv[2], ray_address=sys.argv[3])\n'
                  'print(json.dumps({"run_dir": str(r.run_dir), "report": r.report}))\n')
        done = subprocess.run([sys.executable, '-c', script, write_suite(folder), str(folder / 'data'),
                               cluster.address], cwd=folder, capture_output=True, text=True, timeout=600,
                              env={**cluster.env, 'BROWSER_PATH': os.devnull + '/no-browser'})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return SimpleNamespace(run_dir=Path(out['run_dir']), report=out['report'], search=search, searched=searched)


def seed_scores(root: Path) -> pd.DataFrame:
    return pd.read_csv(root / 'benchmark' / 'scores.csv')


@pytest.mark.slow
@pytest.mark.ray
@needs_ray
def test_a_suite_runs_each_row_seed_as_a_trial_and_writes_its_report(straight):
    from slm_lab.experiment.benchmark.scores import read_rows, slm_ma
    root = straight.run_dir
    scores = seed_scores(root)
    assert list(zip(scores['row'], scores['seed'], scores['trial'], scores['frame'])) == [
        ('ppo_a', 0, 0, 600), ('ppo_a', 1, 1, 600), ('ppo_b', 0, 2, 400), ('ppo_b', 1, 3, 400)]
    assert scores['finished'].all()
    for _, s in scores.iterrows():  # the score is slm_ma of the seed's own train CSV; its seed is the session's
        rows = read_rows(root / 'info' / f'tiny_t{s["trial"]}_s0_session_df_train.csv')
        assert s['score'] == pytest.approx(slm_ma(rows))
        session = json.loads((root / f'tiny_t{s["trial"]}_s0_spec.json').read_text())
        assert session['meta']['random_seed'] == s['seed'] and session['env']['max_frame'] == s['frame']
    assert json.loads((root / 'tiny_t2_spec.json').read_text())['agent']['algorithm']['gamma'] == 0.9
    rows = pd.read_csv(root / 'benchmark' / 'report.csv')
    a = rows.set_index('row').loc['ppo_a']
    assert a['mean'] == pytest.approx(scores['score'][:2].mean())
    assert (a['ci95_low'], a['ci95_high']) == pytest.approx(tuple(sorted(scores['score'][:2])))  # 2 seeds: [min, max]
    assert list(rows['verdict']) == ['above', 'below'] and a['env'] == 'CartPole-v1' and a['algorithm'] == 'PPO'
    report = (root / 'benchmark' / 'report.md').read_text()
    assert report == straight.report and 'reference above the interval' in report
    assert 'Aggregate over 2 row(s), 4 runs' in report
    assert (root / 'graph' / 'tiny_ppo_a_benchmark_graph.html').exists()
    assert not lab_processes(root)


@pytest.mark.slow
def test_slm_lab_report_of_a_benchmark_in_progress_is_its_suite_report_so_far(straight, tmp_path, capsys):
    """`slm-lab report DIR` of a benchmark directory: the suite's report as it stands (a seed still
    training counted unfinished, not scored), written where -o says, the benchmark left untouched."""
    import shutil

    from lab_helpers import tree_digest

    from slm_lab.experiment.report import report_main
    root = tmp_path / straight.run_dir.name
    shutil.copytree(straight.run_dir, root)
    (root / 'info' / 'tiny_t3_trial_metrics.json').unlink()  # ppo_b's seed 1 as if still training
    before = tree_digest(root)
    assert report_main([str(root), '-o', str(tmp_path / 'so_far.md')]) == 0
    printed = capsys.readouterr().out
    assert tree_digest(root) == before
    assert printed.startswith('# Benchmark tiny') and '(1 unfinished)' in printed
    assert (tmp_path / 'so_far.md').read_text() in printed
    rows = pd.read_csv(tmp_path / 'so_far.csv').set_index('row')
    whole = pd.read_csv(straight.run_dir / 'benchmark' / 'report.csv').set_index('row')
    assert rows.loc['ppo_a', 'mean'] == pytest.approx(whole.loc['ppo_a', 'mean'])  # both its seeds finished
    assert rows.loc['ppo_b', 'mean'] == pytest.approx(seed_scores(straight.run_dir)['score'][2])  # seed 0 only
    seeds = pd.read_csv(tmp_path / 'so_far_scores.csv')
    assert list(seeds['finished']) == [True, True, True, False]
    (root / 'benchmark' / 'plan.json').write_text('{')
    assert report_main([str(root), '-o', str(tmp_path / 'x.md')]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'damaged' in err


@pytest.mark.slow
@pytest.mark.ray
@needs_ray
@pytest.mark.subprocess
def test_a_finished_benchmark_continued_writes_its_report_again_without_training(straight, tmp_path, capsys):
    """benchmark@ of the finished straight run, by the command line's code in this process
    (run_in_process_with_output): nothing left to run, so nothing trains and no Ray starts."""
    before = seed_scores(straight.run_dir)
    suite = json.loads((straight.run_dir / 'benchmark' / 'suite.json').read_text())
    path = tmp_path / 'suite.json'
    path.write_text(json.dumps({k: suite[k] for k in ('name', 'rows')}))
    code, out, err = run_in_process_with_output([str(path), f'benchmark@{straight.run_dir}'], tmp_path, capsys)
    assert code == 0, err[-2000:]
    assert '4 of 4 row-seeds finished before (kept); 0 to run' in err
    assert '| `ppo_a` |' in out
    pd.testing.assert_frame_equal(seed_scores(straight.run_dir), before)


def wait_for(proc: subprocess.Popen, path_glob: str, cwd: Path, rows: int, timeout: float = 240) -> None:
    """Until the train CSV matching `path_glob` under cwd has `rows` rows (or the process ended)."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        found = list(cwd.glob(path_glob))
        if found and len(found[0].read_text().splitlines()) - 1 >= rows:
            return
        time.sleep(0.05)
    raise AssertionError(f'never got there: {proc.stderr.read()[-3000:] if proc.poll() is not None else ""}')


@pytest.mark.slow
@pytest.mark.ray
@needs_ray
@pytest.mark.subprocess
def test_sigterm_then_sigkill_mid_suite_continue_to_the_scores_of_the_suite_that_never_stopped(straight, tmp_path):
    """The same suite as `straight`, run as a user does: SIGTERM in trial 1 (143, its line names
    benchmark@latest), benchmark@latest SIGKILLed in trial 2, benchmark@latest to the end: every
    seed's score and train records equal the straight run's (the lab's resume is exact)."""
    suite = write_suite(tmp_path)
    proc = subprocess.Popen([sys.executable, RUN_LAB, suite, 'benchmark'], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    wait_for(proc, 'data/tiny_*/info/tiny_t1_s0_session_df_train.csv', tmp_path, rows=2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and err.strip().splitlines()[-1].endswith('continue with benchmark@latest'), err
    (root,) = (tmp_path / 'data').glob('tiny_*')
    assert not (root / 'benchmark' / 'report.md').exists()
    proc = subprocess.Popen([sys.executable, RUN_LAB, suite, 'benchmark@latest'], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(proc, 'data/tiny_*/info/tiny_t2_s0_session_df_train.csv', tmp_path, rows=1)
    proc.kill()
    proc.wait()
    deadline = time.time() + 30
    while lab_processes(root) and time.time() < deadline:
        time.sleep(0.2)
    assert not lab_processes(root), lab_processes(root)
    result = cli([suite, 'benchmark@latest'], tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = list((root / 'info').glob('tiny_t*_s0_resumes.json'))
    assert resumed, 'a trial continued from its snapshot'
    pd.testing.assert_frame_equal(seed_scores(root), seed_scores(straight.run_dir))
    cols = ['frame', 'total_reward_ma', 'loss', 'opt_step']
    for i in range(4):
        a, b = (pd.read_csv(d / 'info' / f'tiny_t{i}_s0_session_df_train.csv')[cols] for d in (root, straight.run_dir))
        pd.testing.assert_frame_equal(a, b)


@pytest.mark.slow
@pytest.mark.ray
@needs_ray
@pytest.mark.subprocess
def test_a_search_and_a_suite_run_on_a_two_node_ray_cluster(straight):
    """`straight` ran on a real two-node Ray cluster (one CPU a node): a search with --ray-address
    first, on the cluster as started, whose trials landed on both nodes; then the suite, whose
    row-seeds landed on both (they score as the suite's local runs do: the tests that continue
    and piece together the suite locally check their scores against it)."""
    from test_search import experiment_df, run_dir

    from slm_lab.cli import parse_run_args
    assert straight.search.returncode == 0, straight.search.stderr[-3000:]
    root = run_dir(straight.searched)
    nodes = {json.loads((root / 'search' / 'nodes' / str(i)).read_text())['node_id'] for i in range(2)}
    assert len(nodes) == 2, nodes  # one CPU per node, one per trial: the two trials ran side by side
    assert list(experiment_df(straight.searched)['status']) == ['completed'] * 2
    root = straight.run_dir
    nodes = {json.loads((root / 'search' / 'nodes' / str(i)).read_text())['node_id'] for i in range(4)}
    assert len(nodes) == 2, nodes
    # the command line's --ray-address is slm_lab.benchmark's ray_address (run_main passes it on)
    args = parse_run_args([str(root / 'benchmark' / 'suite.json'), 'benchmark', '--ray-address', '127.0.0.1:6379'])
    assert (args.mode, args.ray_address) == ('benchmark', '127.0.0.1:6379')


def straight_suite_file(straight, folder: Path) -> str:
    """The straight run's suite as a suite file in `folder` (its rows name the straight run's spec file)."""
    suite = json.loads((straight.run_dir / 'benchmark' / 'suite.json').read_text())
    path = folder / 'suite.json'
    path.write_text(json.dumps({k: suite[k] for k in ('name', 'rows')}))
    return str(path)


@pytest.mark.slow
@pytest.mark.ray
@needs_ray
@pytest.mark.subprocess
def test_a_suite_run_in_pieces_through_a_published_folder_equals_the_straight_suite(straight, tmp_path, capsys):
    """A suite run piece by piece on machines that keep nothing but a folder of small files: the
    straight run's row-seeds published while ppo_b's seed 1 still trained (its trial unfinished),
    then --missing-from runs that one alone in a new benchmark, published into the same folder:
    every seed's score and curve, and the report's rows, equal the straight suite's."""
    import shutil

    from lab_helpers import tree_digest

    from slm_lab.experiment.benchmark.publish import publish_main
    first = tmp_path / straight.run_dir.name
    shutil.copytree(straight.run_dir, first)
    (first / 'info' / 'tiny_t3_trial_metrics.json').unlink()
    folder = tmp_path / 'published'
    assert publish_main([str(first), '--to', str(folder)]) == 0
    assert '(1 unfinished)' in capsys.readouterr().out
    seeds = pd.read_csv(folder / 'seeds.csv')
    assert list(zip(seeds['row'], seeds['seed'], seeds['trial'])) == [('ppo_a', 0, 0), ('ppo_a', 1, 1), ('ppo_b', 0, 2)]
    before = tree_digest(folder)
    assert publish_main([str(first), '--to', str(folder)]) == 0  # again: nothing changes
    assert tree_digest(folder) == before
    suite = straight_suite_file(straight, tmp_path)
    result = cli([suite, 'benchmark', '--missing-from', str(folder)], tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert '1 row-seed(s) (3 published in' in result.stderr
    (second,) = (tmp_path / 'data').glob('tiny_*')
    plan = json.loads((second / 'benchmark' / 'plan.json').read_text())
    assert [(e['trial'], e['row'], e['seed']) for e in plan] == [(0, 'ppo_b', 1)]
    ran = json.loads((second / 'benchmark' / 'suite.json').read_text())  # ppo_a, all published: not in this piece
    assert [r['id'] for r in ran['rows']] == ['ppo_b']
    assert publish_main([str(second), '--to', str(folder)]) == 0
    capsys.readouterr()
    seeds = pd.read_csv(folder / 'seeds.csv')
    whole = seed_scores(straight.run_dir)
    assert list(zip(seeds['row'], seeds['seed'])) == list(zip(whole['row'], whole['seed']))
    assert list(seeds['score']) == list(whole['score']) and list(seeds['frame']) == list(whole['frame'])
    assert list(seeds['benchmark']) == [first.name] * 3 + [second.name]
    digests = dict(zip(seeds['row'] + seeds['seed'].astype(str), seeds['spec_digest']))
    assert digests['ppo_b1'] == digests['ppo_b0'] != digests['ppo_a0'] == digests['ppo_a1']  # ppo_b: its own set
    assert set(seeds['linear_kernel']) == {'default'}  # as each trial's saved spec settled it (64-wide nets)
    for _, s in whole.iterrows():  # the published curve is the seed's train records' total_reward_ma
        mine = pd.read_csv(folder / 'curves' / f'{s["row"]}_s{s["seed"]}_train.csv')
        theirs = pd.read_csv(straight.run_dir / 'info' / f'tiny_t{s["trial"]}_s0_session_df_train.csv')
        pd.testing.assert_frame_equal(mine, theirs[['frame', 'total_reward_ma']], check_dtype=False)
    cols = ['row', 'seeds', 'unfinished', 'seed_scores', 'mean', 'ci95_low', 'ci95_high', 'reference', 'verdict']
    pd.testing.assert_frame_equal(pd.read_csv(folder / 'report.csv')[cols],
                                  pd.read_csv(straight.run_dir / 'benchmark' / 'report.csv')[cols])
    table = [line for line in straight.report.splitlines() if line.startswith(('|', 'Aggregate'))]
    assert [line for line in (folder / 'report.md').read_text().splitlines()
            if line.startswith(('|', 'Aggregate'))] == table
    result = cli([suite, 'benchmark', '--missing-from', str(folder)], tmp_path)  # nothing left to run
    assert result.returncode == 0 and 'nothing to run' in result.stdout, result.stderr[-2000:]
    assert len(list((tmp_path / 'data').glob('tiny_*'))) == 1
    before = tree_digest(folder)  # the straight run again: ppo_b seed 1 was published from the second piece (left
    assert publish_main([str(straight.run_dir), '--to', str(folder)]) == 0  # out, said); the others from its copy
    out = capsys.readouterr().out
    assert out.count('left out: ') == 1 and f'ppo_b seed 1: published before from {second.name} t0' in out
    assert tree_digest(folder) == before


@pytest.mark.slow
@pytest.mark.ray
@needs_ray
def test_publishing_a_benchmark_with_no_finished_seed_writes_nothing(straight, tmp_path, capsys):
    """A stopped benchmark whose seeds have not finished yet: one line saying so, and no folder of
    empty reports."""
    from slm_lab.experiment.benchmark.publish import publish_main
    stopped = tmp_path / straight.run_dir.name
    shutil.copytree(straight.run_dir, stopped)
    for metrics in (stopped / 'info').glob('*_trial_metrics.json'):
        metrics.unlink()
    assert publish_main([str(stopped), '--to', str(tmp_path / 'pub')]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'nothing to publish' in err and str(stopped) in err, err
    assert not (tmp_path / 'pub').exists()


def test_publish_and_missing_from_refuse_bad_input_in_one_line(tmp_path, capsys):
    """Publishing from a directory that is no benchmark, into a folder under a missing directory or
    one holding other files, and --missing-from a folder that is not one, that publishes the suite
    under another name, or that published a row defined otherwise: one line, exit 2, nothing
    written; --missing-from with a continued benchmark is refused."""
    from lab_helpers import tree_digest

    import slm_lab
    from slm_lab.cli import parse_run_args
    from slm_lab.experiment.benchmark.publish import PublishError, publish_main
    suite = write_suite(tmp_path)

    def refused(argv, words):
        assert publish_main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err, err

    refused([str(tmp_path), '--to', str(tmp_path / 'out')], 'not a benchmark directory')
    assert not (tmp_path / 'out').exists()
    refused([str(tmp_path), '--to', str(tmp_path / 'no' / 'out')], 'does not exist')
    other = tmp_path / 'other'
    other.mkdir()
    (other / 'notes.txt').write_text('mine')
    refused([str(tmp_path), '--to', str(other)], 'no suite.json')
    data = tmp_path / 'data'
    data.mkdir()
    for folder, words in ((tmp_path / 'no' / 'absent', 'no such directory'), (other, 'no suite.json')):
        with pytest.raises(PublishError, match=words):
            slm_lab.benchmark(suite, missing_from=folder, data_dir=str(data))
    published = tmp_path / 'published'
    published.mkdir()
    saved = json.loads(Path(suite).read_text())
    saved['rows'][1]['max_frame'] = 999
    (published / 'suite.json').write_text(json.dumps(saved))
    with pytest.raises(PublishError, match=r"row ppo_b: .*\(max_frame 999 there, 400 here\)"):
        slm_lab.benchmark(suite, missing_from=published, data_dir=str(data))
    (published / 'suite.json').write_text(json.dumps({**saved, 'name': 'huge'}))
    with pytest.raises(PublishError, match="holds suite 'huge'"):
        slm_lab.benchmark(suite, missing_from=published, data_dir=str(data))
    (published / 'suite.json').write_text(Path(suite).read_text())  # the same rows, but seeds of an edited spec
    (published / 'seeds.csv').write_text('row,seed,frame,score,benchmark,trial,lab_commit,spec_digest\n'
                                         'ppo_a,0,600,21.5,tiny_2026_01_01_000000,0,,0123456789abcdef\n')
    with pytest.raises(PublishError, match=r"row ppo_a: .*spec_digest 0123456789abcdef, here [0-9a-f]{16}: the spec "
                                           r"file's entry was edited"):
        slm_lab.benchmark(suite, missing_from=published, data_dir=str(data))
    assert tree_digest(data) == {}
    with pytest.raises(SystemExit) as e:
        parse_run_args([suite, 'benchmark@latest', '--missing-from', str(published)])
    assert e.value.code == 2 and '--missing-from choose the row-seeds of a new benchmark' in capsys.readouterr().err


def test_slm_lab_benchmark_spells_the_same_command(tmp_path, capsys):
    from slm_lab.cli import parse_run_args
    suite = write_suite(tmp_path)
    args = parse_run_args([suite, '--rows', 'ppo_a,ppo_b', '--seeds', '3'], prog='slm-lab benchmark')
    assert (args.spec_file, args.mode, args.rows, args.seeds) == (suite, 'benchmark', ['ppo_a', 'ppo_b'], 3)
    args = parse_run_args([suite, 'benchmark@latest'], prog='run_lab.py')
    assert (args.spec_file, args.spec_name, args.mode) == (suite, None, 'benchmark@latest')
    with pytest.raises(SystemExit) as e:
        parse_run_args([suite, 'ppo', 'train', '--seeds', '2'])
    assert e.value.code == 2 and '--seeds only applies to benchmark mode' in capsys.readouterr().err
    os.environ.pop('SLM_LAB_NEVER_SET', None)


@pytest.mark.slow
@pytest.mark.ray
@needs_ray
def test_the_docs_table_is_generated_from_a_report_as_the_report_draws_it(straight, tmp_path):
    from tools import benchmark_table
    table = ''.join(line + '\n' for line in straight.report.splitlines() if line.startswith('|'))
    doc = tmp_path / 'BENCHMARKS.md'
    doc.write_text('before\n<!-- benchmark-table: tiny -->\nold\n<!-- /benchmark-table: tiny -->\nafter\n')
    assert benchmark_table.main([str(straight.run_dir), '--doc', str(doc), '--check']) == 1
    assert benchmark_table.main([str(straight.run_dir), '--doc', str(doc), '--write']) == 0
    assert doc.read_text() == f'before\n<!-- benchmark-table: tiny -->\n{table}<!-- /benchmark-table: tiny -->\nafter\n'
    csv_copy = tmp_path / 'report.csv'  # a copy kept under docs/benchmarks/ gives the same table
    csv_copy.write_text((straight.run_dir / 'benchmark' / 'report.csv').read_text())
    assert benchmark_table.main([str(csv_copy), '--suite', 'tiny', '--doc', str(doc), '--check']) == 0


SUITES = sorted((ROOT / 'spec' / 'benchmark' / 'suites').glob('*.json'))


@pytest.mark.parametrize('path', SUITES, ids=[p.stem for p in SUITES])
def test_every_shipped_suite_reads_and_each_row_loads_at_its_budget(path, monkeypatch):
    from slm_lab.spec import load_spec
    monkeypatch.chdir(ROOT)  # the suites name spec files from the repository root
    suite = read_suite(str(path))
    assert all(row.seeds == 4 for row in suite.rows)
    for row in suite.rows:
        spec = load_spec(row.spec_file, row.spec_name, row.overrides(3))
        assert spec['env']['max_frame'] == row.max_frame and spec['meta']['random_seed'] == 3
        assert not row.env or spec['env']['name'] == row.env or row.env.endswith('Continuous-v3')


def test_ppo_pong_has_the_settings_of_slm_labs_published_pong_figure(monkeypatch):
    """SLM-Lab v5's Pong figure (16.69 at 10M frames) came from its ppo_atari_lam85_arc spec:
    the keys that differ from its ppo_atari_arc, and those that shape learning, key by key."""
    from slm_lab.spec import load_spec
    monkeypatch.chdir(ROOT)
    spec = load_spec('spec/benchmark/atari/atari_slm_lab_v5.json', 'ppo_pong')
    algorithm, net, env = spec['agent']['algorithm'], spec['agent']['net'], spec['env']
    assert (algorithm['lam'], algorithm['gamma'], algorithm['time_horizon'], algorithm['minibatch_size'],
            algorithm['training_epoch'], algorithm['clip_vloss'], algorithm['val_loss_coef']) == \
        (0.85, 0.99, 128, 256, 4, True, 0.5)
    assert algorithm['clip_eps_spec']['start_val'] == algorithm['clip_eps_spec']['end_val'] == 0.1
    assert algorithm['entropy_coef_spec']['start_val'] == algorithm['entropy_coef_spec']['end_val'] == 0.01
    assert net['conv_hid_layers'] == [[32, 8, 4, 0, 1], [64, 4, 2, 0, 1], [64, 3, 1, 0, 1]]
    assert net['fc_hid_layers'] == [512]
    assert (net['shared'], net['use_same_optim'], net['normalize'], net['init_fn'], net['clip_grad_val']) == \
        (True, True, True, 'orthogonal_', 0.5)
    assert (net['optim_spec']['name'], net['optim_spec']['lr'], net['optim_spec']['eps']) == ('AdamW', 2.5e-4, 1e-5)
    assert (net['lr_scheduler_spec']['name'], net['lr_scheduler_spec']['frame']) == ('LinearToZero', 1e7)
    assert (env['name'], env['num_envs'], env['max_frame'], env['life_loss_info']) == ('ALE/Pong-v5', 16, 1e7, True)


def test_a_benchmark_trials_stop_line_names_benchmark_at_its_directory(tmp_path):
    """A benchmark's trial specs say mode train (its rows' specs): the line a stopped session logs
    must still name benchmark@DIR, which continues it (train@ refuses a benchmark's directory)."""
    from slm_lab.experiment.session import continue_mode
    from slm_lab.persistence.run_dir import RunDir
    spec = {'meta': {'mode': 'train'}}
    run = RunDir(tmp_path / 'tiny_2026_01_01_000000', 'tiny')
    (run.root / 'benchmark').mkdir(parents=True)
    (run.root / 'benchmark' / 'plan.json').write_text('[]')
    assert continue_mode(spec, run) == 'benchmark'
    assert continue_mode(spec, RunDir(tmp_path / 'other', 'x')) == 'train'
    assert continue_mode({'meta': {'mode': 'search'}}) == 'search'
