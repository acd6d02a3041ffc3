import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from slm_lab.experiment import viz


def session_df(n: int = 300, seed: int = 0, frame_offset: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    total_reward = np.cumsum(rng.normal(1.0, 3.0, n))
    total_reward[:2] = np.nan  # no episode finished yet
    return pd.DataFrame({
        'frame': np.arange(n) * 100 + frame_offset,
        'total_reward': total_reward,
        'total_reward_ma': pd.Series(total_reward).rolling(10, min_periods=1).mean(),
        'loss': rng.random(n),
    })


def assert_offline_html(path: str) -> str:
    """The page is small and loads one script, a local plotly.js copy by a relative path (so it
    opens offline); returns the bundle's path."""
    html = open(path, encoding='utf-8').read()
    assert len(html) < 100_000, 'plotly.js must not be embedded in every page'
    (src,) = re.findall(r'<script[^>]*\bsrc="([^"]*)"', html)
    assert not os.path.isabs(src) and '://' not in src
    bundle = os.path.normpath(os.path.join(os.path.dirname(path), src))
    assert os.path.isfile(bundle), f'the page loads {src}, which is not there'
    with open(bundle, encoding='utf-8') as f:
        assert re.search(r'plotly\.js v\d', f.read(300)), 'the plotly.js bundle banner is missing'
    return bundle


@pytest.fixture
def no_png(monkeypatch):
    monkeypatch.setattr(viz, 'png_available', lambda: False)


def test_session_graph_is_standalone_html(tmp_path, no_png):
    paths = viz.plot_session(session_df(), 'CartPole-v1 s0', str(tmp_path / 'graph' / 'run_t0_s0'))
    assert paths == [str(tmp_path / 'graph' / 'run_t0_s0_session_graph.html')]
    assert_offline_html(paths[0])
    html = open(paths[0], encoding='utf-8').read()
    assert 'CartPole-v1 s0' in html and 'total_reward_ma' in html and 'loss' in html


def test_trial_graph_is_standalone_html(tmp_path, no_png):
    dfs = [session_df(seed=s, frame_offset=7 * s) for s in range(3)]
    paths = viz.plot_trial(dfs, 'CartPole-v1 t0', str(tmp_path / 'run_t0'))
    assert paths == [str(tmp_path / 'run_t0_trial_graph.html')]
    assert_offline_html(paths[0])
    assert 'min-max across 3 sessions' in open(paths[0], encoding='utf-8').read()


def test_graphs_survive_empty_and_all_nan_data(tmp_path, no_png):
    all_nan = pd.DataFrame({'frame': [0, 100], 'total_reward': [np.nan] * 2,
                            'total_reward_ma': [np.nan] * 2, 'loss': [np.nan] * 2})
    for i, df in enumerate([pd.DataFrame(), all_nan, session_df(0)]):
        assert_offline_html(viz.plot_session(df, 'empty', str(tmp_path / f's{i}'))[0])
    assert_offline_html(viz.plot_trial([pd.DataFrame(), all_nan], 'empty', str(tmp_path / 't0'))[0])
    assert_offline_html(viz.plot_trial([], 'none', str(tmp_path / 't1'))[0])


def test_trial_sessions_are_aligned_on_the_first_sessions_frames():
    first = pd.DataFrame({'frame': [0, 100, 200, 300], 'total_reward_ma': [0.0, 1.0, 2.0, 3.0]})
    shifted = pd.DataFrame({'frame': [50, 150, 250], 'total_reward_ma': [10.0, 20.0, 30.0]})
    frame, aligned = viz._align_return_ma([first, shifted])
    assert frame.tolist() == [0, 100, 200, 300]
    assert aligned[0].tolist() == [0.0, 1.0, 2.0, 3.0]
    # interpolated inside the shifted session's range, never extrapolated outside it
    assert np.isnan(aligned[1, 0]) and np.isnan(aligned[1, 3])
    assert aligned[1, 1:3].tolist() == [15.0, 25.0]


def test_graphs_of_a_data_directory_share_one_plotly_js(tmp_path, no_png):
    data = tmp_path / 'data'
    paths = []
    for run in ('run_a', 'run_b'):  # two runs of one data directory
        graph_dir = data / run / 'graph'
        paths += [viz.plot_session(session_df(seed=s), f's{s}', str(graph_dir / f'run_t0_s{s}'))[0] for s in range(2)]
        paths += viz.plot_trial([session_df(seed=s) for s in range(2)], 't0', str(graph_dir / 'run_t0'))
        paths += viz.plot_session(session_df(), 's0', str(graph_dir / 'run_t0_s0'))  # rewritten at a log point
        assert sorted(p.name for p in graph_dir.iterdir()) == [
            'run_t0_s0_session_graph.html', 'run_t0_s1_session_graph.html', 'run_t0_trial_graph.html']
    bundles = {assert_offline_html(path) for path in paths}
    assert bundles == {str(data / '.plotly' / f'plotly-{viz.plotly.__version__}.min.js')}
    assert os.path.getsize(bundles.pop()) > 1_000_000
    # a graph written outside a run directory gets a copy beside it, or in the js_dir asked for
    other = viz.plot_trial([session_df()], 't0', str(tmp_path / 'elsewhere' / 'run_t0'))[0]
    assert os.path.dirname(assert_offline_html(other)) == str(tmp_path / 'elsewhere')
    asked = viz.plot_compare([('a', [session_df()])], 'a', str(tmp_path / 'plots' / 'c'), js_dir=str(data / '.plotly'))
    assert os.path.dirname(assert_offline_html(asked[0])) == str(data / '.plotly')


def test_a_damaged_plotly_js_is_replaced(tmp_path, no_png):
    bundle = tmp_path / f'plotly-{viz.plotly.__version__}.min.js'
    bundle.write_text('/* plotly.js v1.0.0 */')  # e.g. torn by a full disk
    path = viz.plot_session(session_df(), 's0', str(tmp_path / 'run_t0_s0'))[0]
    assert assert_offline_html(path) == str(bundle)
    assert bundle.read_bytes() == viz._plotly_js()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith('.tmp')]


def test_png_is_decided_once_per_command_and_said_once(monkeypatch, caplog):
    """kaleido without a browser: one line for the command, and its session processes (which
    inherit SLM_LAB_PNG) neither check again nor say it again."""
    calls = []

    def no_browser():
        calls.append(1)
        viz.logger.warning('PNG graphs are off: ...')
        return False
    monkeypatch.delenv(viz.PNG_ENV, raising=False)
    monkeypatch.setattr(viz, '_png_works', no_browser)
    viz.png_available.cache_clear()
    try:
        assert viz.png_available() is False and viz.png_available() is False
        assert calls == [1] and os.environ[viz.PNG_ENV] == '0'
        child = subprocess.run([sys.executable, '-c', 'from slm_lab.experiment import viz\n'
                                'viz._png_works = lambda: 1 / 0\nprint(viz.png_available())'],
                               capture_output=True, text=True, check=True)
        assert child.stdout.strip() == 'False' and 'PNG' not in child.stderr
    finally:
        viz.png_available.cache_clear()


def test_png_is_written_when_export_works(tmp_path, monkeypatch):
    monkeypatch.setattr(viz, 'png_available', lambda: True)
    monkeypatch.setattr(viz, '_kaleido_png', lambda fig: b'\x89PNG\r\n\x1a\nfake')
    paths = viz.plot_session(session_df(), 's0', str(tmp_path / 'r'))
    assert paths[1] == str(tmp_path / 'r_session_graph.png')
    assert open(paths[1], 'rb').read().startswith(b'\x89PNG')
    assert viz.plot_session(session_df(), 's0', str(tmp_path / 'q'), png=False) == [
        str(tmp_path / 'q_session_graph.html')]


def test_a_failing_png_export_never_fails_the_run(tmp_path, monkeypatch):
    def broken(fig):
        raise RuntimeError('browser crashed')
    monkeypatch.setattr(viz, 'png_available', lambda: True)
    monkeypatch.setattr(viz, '_kaleido_png', broken)
    paths = viz.plot_trial([session_df()], 't0', str(tmp_path / 'r'))
    assert paths == [str(tmp_path / 'r_trial_graph.html')]
    assert not (tmp_path / 'r_trial_graph.png').exists()


def test_png_available_answers_with_a_real_render():
    pytest.importorskip('kaleido', reason='PNG export is optional: kaleido is not installed')
    # True only if kaleido really rendered a PNG with the local browser; False is fine too,
    # but it must answer rather than raise, and answer the same when asked again
    available = viz.png_available()
    assert isinstance(available, bool)
    assert viz.png_available() is available
