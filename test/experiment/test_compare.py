"""`slm-lab plot` (experiment/compare.py) on real runs, and the graphs a run and a search draw:
trial graphs from the train rows with a colour per session, log axes for log-uniform values."""
from __future__ import annotations

import base64
import copy
import json
import re
import shutil

import numpy as np
import pandas as pd
import pytest
from lab_helpers import PPO

import slm_lab
from slm_lab.experiment import viz
from slm_lab.experiment.compare import plot_main


def traces(html_path) -> list[dict]:
    """The plotly traces of a written page, their x and y as arrays (plotly writes typed arrays
    as base64)."""
    html = open(html_path, encoding='utf-8').read()
    data = json.loads(re.search(r'Plotly\.newPlot\(\s*"[^"]+",\s*(\[.*?\]),\s*\{', html, re.S).group(1))
    for trace in data:
        trace.setdefault('name', '')
        for axis in ('x', 'y'):
            value = trace.get(axis)
            if isinstance(value, dict) and 'bdata' in value:
                trace[axis] = np.frombuffer(base64.b64decode(value['bdata']), dtype=np.dtype(value['dtype']))
    return data


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    """Two short PPO runs: one of two sessions, one of one (different learning rates)."""
    data = tmp_path_factory.mktemp('compare') / 'data'
    spec = copy.deepcopy(PPO)
    spec['env']['max_frame'] = 512
    spec['meta'].update(log_frequency=64, eval_frequency=256, max_session=2)
    two = slm_lab.run(spec, 'cmp_a', data_dir=str(data)).run_dir
    spec['meta']['max_session'] = 1
    spec['agent']['net']['optim_spec']['lr'] = 3e-3
    one = slm_lab.run(spec, 'cmp_b', data_dir=str(data)).run_dir
    return data, two, one


@pytest.mark.slow
def test_plot_draws_each_run_with_a_band_and_a_colour_of_its_own(runs, capsys, monkeypatch):
    data, two, one = runs
    monkeypatch.chdir(data.parent)
    out = data.parent / 'cmp' / 'ab.html'
    # a run named relative to data/ as SLM-Lab's -f takes it, and one given as a path
    assert plot_main(['-f', f'{two.name},{one}', '-l', 'A,B', '-t', 'two runs', '-o', str(out)]) == 0
    assert f'wrote {out}' in capsys.readouterr().out
    drawn = traces(out)
    means = [t for t in drawn if t.get('line', {}).get('width') == 3]
    assert [t['name'] for t in means] == ['A (2 sessions)', 'B (1 session)']
    assert means[0]['line']['color'] != means[1]['line']['color']
    bands = [t for t in drawn if t.get('fill') == 'tonexty']
    assert len(bands) == 2
    # the mean is over the sessions' train rows (one per log point), the band their min and max
    dfs = [pd.read_csv(two / 'info' / f'cmp_a_t0_s{s}_session_df_train.csv') for s in range(2)]
    assert len(means[0]['x']) == len(dfs[0]) == 512 // 64
    last = [df['total_reward_ma'].iloc[-1] for df in dfs]
    assert means[0]['y'][-1] == pytest.approx(sum(last) / 2)
    assert bands[0]['y'][-1] == pytest.approx(min(last))


@pytest.mark.slow
def test_plot_takes_a_searchs_trials_one_by_one_or_all_at_once(runs, tmp_path, capsys):
    data, two, one = runs
    # a search's directory holds trials t0, t1, ...: made here from a real run's records
    search = tmp_path / 'data' / 'cmp_search_2026_01_01_000000'
    (search / 'info').mkdir(parents=True)
    for t, source in enumerate((two, one)):
        for csv in (source / 'info').glob('*_session_df_train.csv'):
            name = re.sub(r'^cmp_[ab]_t0_', f'cmp_search_t{t}_', csv.name)
            shutil.copy(csv, search / 'info' / name)
    out = tmp_path / 'all.html'
    assert plot_main(['-f', str(search), '-o', str(out)]) == 0
    names = [t['name'] for t in traces(out) if t.get('line', {}).get('width') == 3]
    assert names == [f'{search.name}/t0 (2 sessions)', f'{search.name}/t1 (1 session)']
    assert plot_main(['-f', f'{search}/t1', '-o', str(tmp_path / 't1.html')]) == 0
    assert [t['name'] for t in traces(tmp_path / 't1.html') if t.get('line', {}).get('width') == 3] == \
        [f'{search.name}/t1 (1 session)']
    capsys.readouterr()
    assert plot_main(['-f', f'{search}/t7', '-o', str(tmp_path / 'x.html')]) == 2
    assert capsys.readouterr().err.strip() == f'error: -f {search}/t7: {search.name} has no trial 7; its trials: t0, t1'


@pytest.mark.slow
def test_bad_plot_input_is_one_line_exit_2_and_writes_nothing(runs, tmp_path, capsys):
    data, two, one = runs
    (tmp_path / 'empty' / 'info').mkdir(parents=True)
    cases = {
        'no such dir': (['-f', str(tmp_path / 'nope')], 'no such run directory'),
        'no train CSVs': (['-f', str(tmp_path / 'empty')], 'holds no *_session_df_train.csv'),
        'label count': (['-f', f'{two},{one}', '-l', 'only_one'], '-l gives 1 label(s) for 2 curve(s)'),
        'no -f': ([], 'the following arguments are required: -f/--folders'),
    }
    for case, (args, message) in cases.items():
        try:
            code = plot_main(args + ['-o', str(tmp_path / 'o.html')])
        except SystemExit as e:  # argparse's own refusal (a missing -f): one line too
            code = e.code
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2, case
        assert len(err) == 1 and err[0].startswith('error: ') and message in err[0], (case, err)
    assert not (tmp_path / 'o.html').exists()


@pytest.mark.slow
def test_a_trial_graph_draws_the_train_rows_each_session_in_its_colour(runs):
    data, two, one = runs
    drawn = traces(two / 'graph' / 'cmp_a_t0_trial_graph.html')
    sessions = [t for t in drawn if t['name'].startswith('session ')]
    assert len(sessions) == 2 and sessions[0]['line']['color'] != sessions[1]['line']['color']
    train = pd.read_csv(two / 'info' / 'cmp_a_t0_s0_session_df_train.csv')
    eval_rows = pd.read_csv(two / 'info' / 'cmp_a_t0_s0_session_df_eval.csv')
    assert len(sessions[0]['x']) == len(train) > len(eval_rows)


def test_the_search_graph_draws_log_uniform_values_on_a_log_axis(tmp_path, no_png):
    df = pd.DataFrame({'trial': [0, 1, 2], 'status': ['completed'] * 3, 'strength': [1.0, 2.0, 3.0],
                       'total_reward_ma': [10.0, 20.0, 30.0], 'lr': [1e-4, 1e-3, 1e-2], 'gamma': [0.9, 0.95, 0.99]})
    (path,) = viz.plot_experiment(df, ['lr', 'gamma'], str(tmp_path / 'search'), log_keys={'lr'})
    layout = json.loads(re.search(r'Plotly\.newPlot\(\s*"[^"]+",\s*\[.*?\],\s*(\{.*?\}),\s*\{"displaylogo',
                                  open(path, encoding='utf-8').read(), re.S).group(1))
    # lr is in column 1 (x axes 1 and 3: both rows), gamma in column 2 (x axes 2 and 4)
    assert layout['xaxis']['type'] == layout['xaxis3']['type'] == 'log'
    assert layout['xaxis2'].get('type') != 'log' and layout['xaxis4'].get('type') != 'log'


@pytest.mark.slow
def test_a_searchs_trials_are_labelled_by_their_values_and_stopped_ones_marked(runs, tmp_path, capsys):
    data, two, one = runs
    search = tmp_path / 'data' / 'cmp_search_2026_01_01_000000'
    (search / 'info').mkdir(parents=True)
    for t, source in enumerate((two, one)):
        for csv in (source / 'info').glob('*_session_df_train.csv'):
            shutil.copy(csv, search / 'info' / re.sub(r'^cmp_[ab]_t0_', f'cmp_search_t{t}_', csv.name))
    # as the search writes it when it ends: the searched keys between `trial` and `frame`
    pd.DataFrame([{'trial': 0, 'agent.net.optim_spec.lr': 0.001234567, 'agent.algorithm.gamma': 0.99, 'frame': 512,
                   'total_reward_ma': 20.0, 'status': 'completed'},
                  {'trial': 1, 'agent.net.optim_spec.lr': 0.003, 'agent.algorithm.gamma': 0.9, 'frame': 256,
                   'total_reward_ma': 15.0, 'status': 'stopped early (ASHA)'}]).to_csv(
        search / 'info' / 'cmp_search_experiment_df.csv', index=False)
    out = tmp_path / 'all.html'
    assert plot_main(['-f', str(search), '-o', str(out)]) == 0
    means = [t for t in traces(out) if t.get('line', {}).get('width') == 3]
    assert [t['name'] for t in means] == ['t0: lr=0.00123, gamma=0.99 (2 sessions)',
                                          't1: lr=0.003, gamma=0.9 (stopped at frame 256) (1 session)']
    assert [t['line'].get('dash') for t in means] == ['solid', 'dash']
    # a title that would run off the image is the count of runs; a long one given is wrapped
    assert '"title":{"font":{"size":16},"text":"2 runs"}' in out.read_text()
    assert plot_main(['-f', str(search), '-o', str(tmp_path / 'long.html'), '-t', 'word ' * 30]) == 0
    assert 'word\\u003cbr\\u003eword' in (tmp_path / 'long.html').read_text()  # plotly escapes < and >
