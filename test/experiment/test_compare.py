"""`slm-lab plot` (experiment/compare.py) on real runs, and the graphs a run and a search draw:
trial graphs from the train rows with a colour per session, log axes for log-uniform values."""
from __future__ import annotations

import base64
import copy
import json
import os
import re
import shutil

import numpy as np
import pandas as pd
import plotly
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
    out.parent.mkdir(exist_ok=True)  # -o writes in an existing directory (a missing one is refused)
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


# --- bad input, a full disk, signals (issue 27): one line, a clear exit code, nothing left behind ---

def write_run(root, name: str = 'rec', sessions: int = 1, rows: int = 4):
    """A run directory with `sessions` train CSVs in the lab's own layout and columns, as a short
    run writes them (one row per log point of 100 frames)."""
    from slm_lab.agent.body import COLUMNS
    info = root / name / 'info'
    info.mkdir(parents=True)
    for s in range(sessions):
        df = pd.DataFrame({c: np.arange(rows, dtype=float) + s for c in COLUMNS})
        df['frame'] = (np.arange(rows) + 1) * 100
        df.to_csv(info / f'{name}_t0_s{s}_session_df_train.csv', index=False)
    return root / name


def plot(args, capsys):
    """plot_main's exit code and its stdout and stderr lines."""
    try:
        code = plot_main(args)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def listing(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob('*'))


@pytest.mark.parametrize('damage, what', [
    ('binary', 'not UTF-8 text'), ('empty', 'is empty'), ('directory', 'is a directory')])
def test_unreadable_records_are_refused_in_one_line_naming_the_file(damage, what, tmp_path, capsys, no_png):
    """Before: UnicodeDecodeError, EmptyDataError, IsADirectoryError tracebacks."""
    run = write_run(tmp_path)
    csv = run / 'info' / 'rec_t0_s0_session_df_train.csv'
    if damage == 'binary':
        csv.write_bytes(bytes(np.random.default_rng(0).integers(128, 256, 300, dtype=np.uint8)))
    elif damage == 'empty':
        csv.write_bytes(b'')
    else:
        csv.unlink()
        csv.mkdir()
    before = listing(tmp_path)
    code, out, err = plot(['-f', str(run), '-o', str(tmp_path / 'g.html')], capsys)
    assert code == 2 and out == [] and len(err) == 1, err
    assert err[0].startswith(f'error: {csv} ') and what in err[0] and 'leave that run out of -f' in err[0]
    assert listing(tmp_path) == before


@pytest.mark.parametrize('records, why', [
    ('header only', 'only the header, no row yet'),
    ('non-numeric total_reward_ma', 'no row with a numeric frame and total_reward_ma'),
    ('no total_reward_ma column', 'no total_reward_ma column')])
def test_a_run_without_a_curve_is_named_and_left_out(records, why, tmp_path, capsys, no_png):
    """Before: exit 0 and an empty curve, said nowhere."""
    good, bad = write_run(tmp_path, 'good'), write_run(tmp_path, 'bad', sessions=2)
    for s in range(2):
        csv = bad / 'info' / f'bad_t0_s{s}_session_df_train.csv'
        df = pd.read_csv(csv)
        if records == 'header only':
            df = df.iloc[:0]
        elif records == 'non-numeric total_reward_ma':
            df['total_reward_ma'] = 'n/a'
        else:
            df = df.drop(columns='total_reward_ma')
        df.to_csv(csv, index=False)
    out_html = tmp_path / 'g.html'
    code, out, err = plot(['-f', f'{good},{bad}', '-o', str(out_html)], capsys)
    assert code == 0 and out == [f'wrote {out_html}'], (out, err)
    assert err == [f'warning: bad has no curve and is left out of the graph '
                   f'({bad}/info/bad_t0_s0_session_df_train.csv: {why}; and 1 more session(s))']
    assert [t['name'] for t in traces(out_html) if t.get('line', {}).get('width') == 3] == ['good (1 session)']
    # one session without points: the run's curve is of its other sessions, said
    write_run(tmp_path, 'half', sessions=2)
    (tmp_path / 'half' / 'info' / 'half_t0_s1_session_df_train.csv').write_text(','.join(pd.read_csv(
        good / 'info' / 'good_t0_s0_session_df_train.csv').columns) + '\n')
    code, out, err = plot(['-f', str(tmp_path / 'half'), '-o', str(out_html)], capsys)
    assert code == 0 and len(err) == 1 and 'half: a session is left out of its curve' in err[0]
    assert [t['name'] for t in traces(out_html) if t.get('line', {}).get('width') == 3] == ['half (1 session)']
    # no run with a curve: that is the error, and nothing is written
    out_html.unlink()
    (tmp_path / f'plotly-{plotly.__version__}.min.js').unlink()
    before = listing(tmp_path)
    code, out, err = plot(['-f', str(bad), '-o', str(out_html)], capsys)
    assert code == 2 and out == [] and len(err) == 1
    assert err[0].startswith('error: no run has a curve to draw: bad (') and why in err[0]
    assert listing(tmp_path) == before


def test_the_graph_goes_exactly_where_o_says(tmp_path, capsys, monkeypatch, no_png):
    """Before: -o data (a directory) wrote ./data.html, and -o /nonexistent/dir/x.html made the
    directories."""
    run = write_run(tmp_path / 'runs')
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'data').mkdir()
    code, out, err = plot(['-f', str(run), '-o', 'data'], capsys)
    assert code == 0 and err == [] and len(out) == 1
    assert re.fullmatch(r'wrote data/compare_\d{4}_\d{2}_\d{2}_\d{6}\.html', out[0]), out
    assert (tmp_path / out[0][len('wrote '):]).is_file() and not (tmp_path / 'data.html').exists()
    before = listing(tmp_path)
    for missing in (str(tmp_path / 'nonexistent' / 'dir' / 'x.html'), 'nowhere/'):
        code, out, err = plot(['-f', str(run), '-o', missing], capsys)
        assert code == 2 and out == [] and len(err) == 1 and err[0].startswith(f'error: -o {missing}: '), err
        assert 'create it first' in err[0]
    (tmp_path / 'afile').write_text('x')
    code, out, err = plot(['-f', str(run), '-o', 'afile/x.html'], capsys)
    assert code == 2 and 'the directory afile is not a directory' in err[0]
    assert listing(tmp_path) == sorted(before + ['afile'])
    # the default's directory is the lab's own: made, and said
    code, out, err = plot(['-f', str(run), '-d', 'elsewhere'], capsys)
    assert code == 0 and out[0] == 'made directory elsewhere/plots' and out[1].startswith('wrote elsewhere/plots/')
    code, out, err = plot(['-f', str(run), '-d', 'afile'], capsys)
    assert code == 2 and out == [] and err == ['error: cannot make the directory afile/plots, where graphs go by '
                                               'default (Not a directory); give -o a path in an existing directory']


@pytest.mark.subprocess
@pytest.mark.parametrize('space', ['no room for plotly.min.js', 'no room for the page'])
def test_a_full_disk_is_one_line_and_leaves_no_file(space, tmp_path, capsys, no_png):
    """Before: a DiskFullError traceback. A 5 MiB disk (as test_checkpoint's), filled up."""
    from conftest import tmpfs

    from slm_lab.experiment import viz
    run = write_run(tmp_path)
    with tmpfs(tmp_path / 'mnt', '5m') as disk:
        bundle = len(viz._plotly_js())
        if space == 'no room for the page':  # plotly.min.js fits, then less than a page is left
            free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
            (disk / 'filler').write_bytes(b'\0' * (free - bundle - 8192))
        else:
            (disk / 'filler').write_bytes(b'\0' * (1 << 20))
        before = listing(disk)
        code, out, err = plot(['-f', str(run), '-o', str(disk / 'g.html')], capsys)
        assert code == 2 and out == [] and len(err) == 1, err
        target = f'plotly-{plotly.__version__}.min.js' if space == 'no room for plotly.min.js' else 'g.html'
        assert err[0].startswith(f'error: disk full: writing {disk / target} failed')
        assert f'mounted at {disk}' in err[0]
        assert listing(disk) == before, 'the partial files and the plotly.min.js of a page not written must go'


SIGNAL_SCRIPT = '''
import os, signal, sys, time
from slm_lab.experiment import viz
write = viz.atomic_write_text
def interrupted_write(path, text):  # the signal arrives while the page is written
    os.kill(os.getpid(), signal.{signal})
    time.sleep(10)
    write(path, text)
viz.atomic_write_text = interrupted_write
from slm_lab.cli import console_main
sys.argv = ['slm-lab', 'plot', '-f', {run!r}, '-o', {out!r}]
console_main()
'''


@pytest.mark.subprocess
@pytest.mark.parametrize('sig, code, line', [('SIGINT', 130, 'interrupted'), ('SIGTERM', 143, 'stopped by SIGTERM')])
def test_ctrl_c_and_sigterm_stop_the_plot_in_one_line(sig, code, line, tmp_path):
    """Before: a KeyboardInterrupt traceback. The signal lands mid-write, after plotly.min.js."""
    import subprocess
    import sys

    from lab_helpers import lab_env
    run = write_run(tmp_path / 'runs')
    out_dir = tmp_path / 'out'
    out_dir.mkdir()
    script = SIGNAL_SCRIPT.format(signal=sig, run=str(run), out=str(out_dir / 'g.html'))
    done = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=120,
                          env=lab_env(), cwd=slm_lab.__path__[0] + '/..')
    assert done.returncode == code, done.stderr
    assert done.stderr.splitlines() == [line] and done.stdout == ''
    assert list(out_dir.iterdir()) == [], 'no page, no plotly.min.js without its page, no temp file'
