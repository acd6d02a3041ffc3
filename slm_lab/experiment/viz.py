"""Plotly graphs of sessions and trials, written as HTML and, where static export works on this
machine, as PNG.

Each HTML file loads plotly.js from one copy of the installed plotly package's bundle per data
directory, `{data_dir}/.plotly/plotly-{version}.min.js`, by a relative path: a graph still opens
offline, and the 4.8 MB bundle is stored once for all the runs of a data directory instead of once
per run. (A graph written outside a run directory, e.g. by `slm-lab plot -o`, takes `js_dir`:
its own directory by default.)

PNG export is optional: it needs the `kaleido` package (version 1 or later) and a Chrome or
Chromium already installed (found on PATH, or named by the BROWSER_PATH environment variable).
Nothing is downloaded at run time. `png_available()` tells whether it works; when it does not,
only the HTML is written, and one line says how to get PNGs. It is decided once per command: the
answer goes to the command's session processes through the SLM_LAB_PNG environment variable, so
they neither check again (about 2 s each) nor say it again. A PNG takes about 2 s (kaleido starts
a headless browser for each one), so callers that plot at every log point should pass
`png=False` there and ask for PNGs only at the end of a run.
"""
from __future__ import annotations

import functools
import importlib.metadata
import logging
import os
import pkgutil
import warnings

import numpy as np
import pandas as pd
import plotly
import plotly.colors
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from slm_lab.lib.io import atomic_write_bytes, atomic_write_text

logger = logging.getLogger(__name__)

PNG_WIDTH = 900
PNG_HEIGHT = 600
PNG_EXPORT_TIMEOUT_S = 60
PLOTLY_JS = 'plotly.min.js'  # the bundle's name in the plotly package
JS_DIR = '.plotly'  # in a data directory: the one copy of the bundle its runs' graphs load
PNG_ENV = 'SLM_LAB_PNG'  # '1' / '0': whether PNG export works, decided once per command (see above)
_PNG_MAGIC = b'\x89PNG\r\n\x1a\n'

REWARD_COLOR = 'rgb(31, 119, 180)'
REWARD_LIGHT_COLOR = 'rgba(31, 119, 180, 0.3)'
# a trial's sessions, each its own colour (plotly's qualitative palette without its first blue,
# which is the mean's); a comparison's runs, each its own colour (the whole palette)
SESSION_COLORS = plotly.colors.qualitative.Plotly[1:]
RUN_COLORS = plotly.colors.qualitative.Plotly
LOSS_COLOR = 'rgb(214, 39, 40)'


def _column(df: pd.DataFrame, name: str) -> np.ndarray:
    """Column `name` as float64, or all-NaN when the column is absent."""
    if df is None or name not in df.columns:
        return np.full(0 if df is None else len(df), np.nan)
    return pd.to_numeric(df[name], errors='coerce').to_numpy(dtype=np.float64, na_value=np.nan)


def _kaleido_png(fig: go.Figure) -> bytes:
    """Render `fig` to PNG bytes with kaleido>=1. MathJax is disabled so the headless page
    loads nothing from the network; plotly.js comes from the installed plotly package."""
    import kaleido  # noqa: PLC0415 (the PNG extra: only PNG export needs it)

    return kaleido.calc_fig_sync(
        fig,
        opts={'format': 'png', 'width': PNG_WIDTH, 'height': PNG_HEIGHT, 'scale': 1},
        kopts={'mathjax': False, 'timeout': PNG_EXPORT_TIMEOUT_S},
    )


@functools.cache
def png_available() -> bool:
    """Whether PNG export works here: kaleido>=1 is installed and a test render with the local
    Chrome/Chromium succeeds. Decided once per command (the check takes about 2 s when kaleido is
    installed, and no time when it is not), its answer left in SLM_LAB_PNG for the processes the
    command starts after it; when kaleido is installed but cannot render, one line says why and
    how to get PNGs."""
    decided = os.environ.get(PNG_ENV)
    if decided in ('0', '1'):
        return decided == '1'
    works = _png_works()
    os.environ[PNG_ENV] = '1' if works else '0'
    return works


def _png_works() -> bool:
    try:
        version = importlib.metadata.version('kaleido')
    except importlib.metadata.PackageNotFoundError:
        return False  # PNGs were not asked for: the png extra is not installed
    # kaleido and choreographer log every render at INFO; keep the lab's INFO log readable
    for name in ('kaleido', 'choreographer'):
        logging.getLogger(name).setLevel(logging.WARNING)
    if int(version.split('.')[0]) < 1:
        logger.warning(f'PNG graphs are off: kaleido {version} is installed, plotly needs kaleido>=1 '
                       "(pip install '.[png]'); HTML graphs are written")
        return False
    try:
        png = _kaleido_png(go.Figure(go.Scatter(x=[0, 1], y=[0, 1])))
    except Exception as e:  # no browser, browser crash, timeout: all mean "no PNG here"
        logger.warning(f'PNG graphs are off: kaleido could not render ({type(e).__name__}); HTML graphs are '
                       'written. For PNGs, install Chrome or Chromium (on PATH, or named by BROWSER_PATH), e.g. '
                       'with `plotly_get_chrome` once on a machine with network')
        return False
    return isinstance(png, bytes) and png.startswith(_PNG_MAGIC)


@functools.cache
def _plotly_js() -> bytes:
    """The plotly.js bundle of the installed plotly package (the one its HTML is written for)."""
    return pkgutil.get_data('plotly', f'package_data/{PLOTLY_JS}')


def js_dir_of(html_path: str) -> str:
    """Where the bundle a graph loads lives: for a graph in a run directory (RUN/graph/x.html), the
    data directory holding the run (DATA/.plotly); else beside the graph."""
    graph_dir = os.path.dirname(os.path.abspath(html_path))
    if os.path.basename(graph_dir) == 'graph':
        return os.path.join(os.path.dirname(os.path.dirname(graph_dir)), JS_DIR)
    return graph_dir


def bundle_path(js_dir: str) -> str:
    """Where the installed plotly's bundle is kept in `js_dir`: plotly-{version}.min.js."""
    return os.path.join(js_dir, f'plotly-{plotly.__version__}.min.js')


def ensure_plotly_js(js_dir: str) -> str:
    """Path of the installed plotly's bundle in `js_dir` (bundle_path), written (atomically) when
    it is missing or not whole. Concurrent writers (the sessions of a trial, other runs) each
    rename a complete copy into place."""
    os.makedirs(js_dir, exist_ok=True)
    path = bundle_path(js_dir)
    bundle = _plotly_js()
    try:
        current_size = os.path.getsize(path)
    except OSError:
        current_size = -1
    if current_size != len(bundle):
        atomic_write_bytes(path, bundle)
    return path


def _write_fig(fig: go.Figure, path_prefix: str, png: bool, js_dir: str | None = None) -> list[str]:
    """Write `fig` to `{path_prefix}.html` (and `.png` if asked and available); return paths.
    The shared bundle the HTML loads (in `js_dir`, default js_dir_of the HTML) is written first,
    so the page never points at a missing script."""
    html_path = f'{path_prefix}.html'
    js = ensure_plotly_js(js_dir or js_dir_of(html_path))
    src = os.path.relpath(js, os.path.dirname(os.path.abspath(html_path)))
    atomic_write_text(html_path, pio.to_html(fig, include_plotlyjs=src, full_html=True,
                                             config={'displaylogo': False}))
    paths = [html_path]
    if png and png_available():
        png_path = f'{path_prefix}.png'
        try:
            atomic_write_bytes(png_path, _kaleido_png(fig))
            paths.append(png_path)
        except Exception as e:  # a graph is never worth failing a run for
            logger.warning('could not write %s (%s: %s)', png_path, type(e).__name__, e)
    return paths


def _session_figure(session_df: pd.DataFrame | None, title: str) -> go.Figure:
    df = session_df if session_df is not None else pd.DataFrame()
    frame = _column(df, 'frame')
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        row_heights=[0.65, 0.35])
    fig.add_trace(go.Scatter(x=frame, y=_column(df, 'total_reward'), name='total_reward',
                             mode='lines', line={'color': REWARD_LIGHT_COLOR, 'width': 1}), row=1, col=1)
    fig.add_trace(go.Scatter(x=frame, y=_column(df, 'total_reward_ma'), name='total_reward_ma',
                             mode='lines', line={'color': REWARD_COLOR, 'width': 3}), row=1, col=1)
    fig.add_trace(go.Scatter(x=frame, y=_column(df, 'loss'), name='loss',
                             mode='lines', line={'color': LOSS_COLOR, 'width': 1.5}), row=2, col=1)
    fig.update_yaxes(title_text='total_reward', row=1, col=1)
    fig.update_yaxes(title_text='loss', row=2, col=1)
    fig.update_xaxes(title_text='frame', row=2, col=1)
    fig.update_layout(title={'text': title}, template='plotly_white', hovermode='x unified',
                      legend={'orientation': 'h', 'y': -0.12})
    return fig


def warm_up() -> None:
    """Pay plotly's first-graph costs (its lazily loaded validators, the plotly.js bundle) now, in a
    process started ahead of its work (a search's next trial), rather than at its first graph."""
    _plotly_js()
    pio.to_html(_session_figure(pd.DataFrame({'frame': [0.0], 'total_reward': [0.0], 'total_reward_ma': [0.0],
                                              'loss': [0.0]}), 'warm-up'), include_plotlyjs=False)


def plot_session(session_df: pd.DataFrame, title: str, path_prefix: str, *, png: bool = True) -> list[str]:
    """Plot one session: top, total_reward (thin) and total_reward_ma (bold) vs frame; bottom,
    loss vs frame (shared x axis). Writes `{path_prefix}_session_graph.html`, plus `.png` when
    `png` is true and png_available(). Returns the paths written. Empty or all-NaN data gives
    empty axes."""
    fig = _session_figure(session_df, title)
    return _write_fig(fig, f'{path_prefix}_session_graph', png)


def _align_return_ma(session_dfs: list[pd.DataFrame]) -> tuple[np.ndarray, np.ndarray]:
    """total_reward_ma of every session linearly interpolated onto the frames of the first
    session that has data. Returns (frames, values of shape (sessions, frames)); a session has
    NaN outside its own frame range, so it never extrapolates."""
    series = []
    for df in session_dfs:
        frame, return_ma = _column(df, 'frame'), _column(df, 'total_reward_ma')
        ok = np.isfinite(frame) & np.isfinite(return_ma)
        order = np.argsort(frame[ok], kind='stable')
        series.append((frame[ok][order], return_ma[ok][order]))
    base = next((frame for frame, _ in series if len(frame)), np.zeros(0))
    aligned = np.full((len(series), len(base)), np.nan)
    for i, (frame, return_ma) in enumerate(series):
        if len(frame):
            inside = (base >= frame[0]) & (base <= frame[-1])
            aligned[i, inside] = np.interp(base[inside], frame, return_ma)
    return base, aligned


def _mean_min_max(aligned: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Column-wise nan-mean, nan-min, nan-max of (sessions, frames); NaN where a column is all NaN."""
    if aligned.shape[0] == 0:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', RuntimeWarning)  # an all-NaN column gives NaN, as wanted
        return np.nanmean(aligned, axis=0), np.nanmin(aligned, axis=0), np.nanmax(aligned, axis=0)


def _rgba(color: str, alpha: float) -> str:
    """A plotly colour ('#rrggbb' or 'rgb(r, g, b)') with transparency `alpha`."""
    r, g, b = plotly.colors.hex_to_rgb(color) if color.startswith('#') else plotly.colors.unlabel_rgb(color)
    return f'rgba({int(r)}, {int(g)}, {int(b)}, {alpha})'


def _add_band(fig: go.Figure, frame: np.ndarray, aligned: np.ndarray, name: str, color: str, group: str,
              mean_name: str, dash: str = 'solid') -> None:
    """The mean across sessions (bold, `color`) with a shaded band from their min to their max."""
    mean, low, high = _mean_min_max(aligned)
    # the band is two traces: the max line (invisible), then the min line filled up to it
    fig.add_trace(go.Scatter(x=frame, y=high, mode='lines', line={'width': 0}, hoverinfo='skip',
                             legendgroup=group, showlegend=False))
    fig.add_trace(go.Scatter(x=frame, y=low, mode='lines', line={'width': 0}, fill='tonexty',
                             fillcolor=_rgba(color, 0.2), legendgroup=group, hoverinfo='skip', name=name,
                             showlegend=bool(name)))
    fig.add_trace(go.Scatter(x=frame, y=mean, mode='lines', name=mean_name, legendgroup=group,
                             line={'color': color, 'width': 3, 'dash': dash}))


def plot_trial(session_dfs: list[pd.DataFrame], title: str, path_prefix: str, *, png: bool = True) -> list[str]:
    """Plot a trial from its sessions' train rows: total_reward_ma mean across sessions vs frame
    (bold), a shaded band from the min to the max across sessions, and each session's thin line in
    a colour of its own. Sessions are aligned by interpolating onto the first session's frames.
    Writes `{path_prefix}_trial_graph.html`, plus `.png` when `png` is true and png_available().
    Returns the paths written."""
    session_dfs = [df if df is not None else pd.DataFrame() for df in session_dfs]
    frame, aligned = _align_return_ma(session_dfs)
    n_sessions = len(session_dfs)
    fig = go.Figure()
    for i in range(n_sessions):
        fig.add_trace(go.Scatter(x=frame, y=aligned[i], name=f'session {i}', mode='lines',
                                 line={'color': SESSION_COLORS[i % len(SESSION_COLORS)], 'width': 1}))
    _add_band(fig, frame, aligned, f'min-max across {n_sessions} sessions', REWARD_COLOR, 'band',
              'total_reward_ma mean')
    fig.update_layout(title={'text': title}, template='plotly_white', hovermode='x unified',
                      xaxis_title='frame', yaxis_title='total_reward_ma',
                      legend={'orientation': 'h', 'y': -0.15})
    return _write_fig(fig, f'{path_prefix}_trial_graph', png)


def plot_seeds_band(session_dfs: list[pd.DataFrame], labels: list[str], band, references: list[tuple[str, float]],
                    title: str, path_prefix: str, band_name: str) -> list[str]:
    """One row of a benchmark: each seed's total_reward_ma (thin, labelled), their mean (bold) with
    the band `band(aligned)` returns ((mean, low, high) per frame from the seeds aligned as
    plot_trial aligns sessions), and each reference as a dashed horizontal line with its label.
    Writes `{path_prefix}.html`; returns the paths written."""
    frame, aligned = _align_return_ma([df if df is not None else pd.DataFrame() for df in session_dfs])
    mean, low, high = band(aligned) if len(frame) else (frame, frame, frame)
    fig = go.Figure()
    for i, (label, values) in enumerate(zip(labels, aligned)):
        fig.add_trace(go.Scatter(x=frame, y=values, mode='lines', name=label,
                                 line={'width': 1, 'color': SESSION_COLORS[i % len(SESSION_COLORS)]}))
    fig.add_trace(go.Scatter(x=frame, y=high, mode='lines', line={'width': 0}, hoverinfo='skip', showlegend=False))
    fig.add_trace(go.Scatter(x=frame, y=low, mode='lines', line={'width': 0}, fill='tonexty',
                             fillcolor=_rgba(REWARD_COLOR, 0.2), hoverinfo='skip', name=band_name))
    fig.add_trace(go.Scatter(x=frame, y=mean, mode='lines', name='mean over seeds',
                             line={'color': REWARD_COLOR, 'width': 3}))
    for label, value in references:
        fig.add_hline(y=value, line_dash='dash', annotation_text=f'{label}: {value:g}', annotation_position='top left')
    fig.update_layout(title={'text': title}, template='plotly_white', xaxis_title='frame',
                      yaxis_title='total_reward_ma', legend={'orientation': 'h', 'y': -0.15})
    return _write_fig(fig, path_prefix, False)


def _wrap(text: str, width: int = 80) -> str:
    """A title broken into lines of at most about `width` characters, so it fits the image."""
    lines, line = [], ''
    for word in text.split(' '):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f'{line} {word}' if line else word
    return '<br>'.join(lines + [line])


def plot_compare(runs: list[tuple[str, list[pd.DataFrame]]], title: str, path_prefix: str, *,
                 png: bool = True, js_dir: str | None = None, dashed: set[int] = frozenset()) -> list[str]:
    """One graph comparing runs: for each (label, its sessions' train dataframes), the mean
    total_reward_ma across its sessions vs frame (bold; dashed for the runs in `dashed`, e.g. a
    search's trials stopped early) with a band from their min to their max, a colour per run.
    Writes `{path_prefix}.html`, plus `.png` when `png` is true and png_available(). Returns the
    paths written."""
    fig = go.Figure()
    for i, (label, session_dfs) in enumerate(runs):
        frame, aligned = _align_return_ma(session_dfs)
        color = RUN_COLORS[i % len(RUN_COLORS)]
        sessions = f'{len(session_dfs)} session' + ('s' if len(session_dfs) != 1 else '')
        _add_band(fig, frame, aligned, '', color, f'run{i}', f'{label} ({sessions})',
                  dash='dash' if i in dashed else 'solid')
    fig.update_layout(title={'text': _wrap(title), 'font': {'size': 16}}, template='plotly_white',
                      hovermode='x unified', xaxis_title='frame',
                      yaxis_title='total_reward_ma (mean; band: min-max across sessions)',
                      legend={'orientation': 'h', 'y': -0.15})
    return _write_fig(fig, path_prefix, png, js_dir)


def plot_experiment(experiment_df: pd.DataFrame, keys: list[str], path_prefix: str, *, png: bool = False,
                    log_keys: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """A search's graph: one column per searched key, each trial a point at the value it drew;
    top row its strength (the trial metric), bottom row its final total_reward_ma. Keys in
    `log_keys` (drawn uniformly in log space) get a log x axis. Writes
    `{path_prefix}_experiment_graph.html` (and `.png` when asked and available)."""
    df = experiment_df
    cols = max(1, len(keys))
    fig = make_subplots(rows=2, cols=cols, shared_yaxes=True, horizontal_spacing=0.03, vertical_spacing=0.12,
                        subplot_titles=keys or None)
    labels = [f'trial {int(t)}: {s}' for t, s in zip(df.get('trial', []), df.get('status', [''] * len(df)))]
    for c, key in enumerate(keys, start=1):
        x = df[key].astype(str) if df[key].dtype == object else df[key]
        for r, metric in enumerate(('strength', 'total_reward_ma'), start=1):
            fig.add_trace(go.Scatter(x=x, y=_column(df, metric), mode='markers', text=labels, showlegend=False,
                                     marker={'color': REWARD_COLOR if r == 2 else LOSS_COLOR, 'size': 9}),
                          row=r, col=c)
            if key in log_keys:
                fig.update_xaxes(type='log', row=r, col=c)
    fig.update_yaxes(title_text='strength', row=1, col=1)
    fig.update_yaxes(title_text='total_reward_ma', row=2, col=1)
    fig.update_layout(title={'text': os.path.basename(path_prefix) + ' search'}, template='plotly_white')
    return _write_fig(fig, f'{path_prefix}_experiment_graph', png)
