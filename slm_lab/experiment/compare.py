"""`slm-lab plot`: one graph comparing runs, or a search's trials, by their sessions' train rows.

A RUN_DIR given to -f is a run directory (a `train` run: its trial 0; a search: each of its
trials, one curve each) or `RUN_DIR/t{i}` (trial i of a search). Each curve is the mean
total_reward_ma across the trial's sessions against frame, with a band from their minimum to
their maximum (viz.plot_compare)."""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

SESSION_CSV = re.compile(r'^(?P<name>.+)_t(?P<trial>\d+)_s(?P<session>\d+)_session_df_train\.csv$')
TRIAL_ARG = re.compile(r'^t(\d+)$')


class PlotError(Exception):
    """A mistake in `slm-lab plot`'s input: one line, exit code 2."""


def session_csvs(run_dir: Path) -> dict[int, list[Path]]:
    """{trial: its sessions' train CSVs, in session order} of a run directory."""
    trials: dict[int, dict[int, Path]] = {}
    for path in (run_dir / 'info').glob('*_session_df_train.csv'):
        m = SESSION_CSV.match(path.name)
        if m:
            trials.setdefault(int(m['trial']), {})[int(m['session'])] = path
    return {t: [s[k] for k in sorted(s)] for t, s in sorted(trials.items())}


def resolve(arg: str, data_dir: str) -> list[tuple[str, list[Path]]]:
    """The curves one -f entry stands for: [(default label, its sessions' train CSVs)]."""
    path = Path(arg.rstrip('/'))
    trial = None
    m = TRIAL_ARG.match(path.name)
    if m and not path.is_dir():
        trial, path = int(m[1]), path.parent
    if not path.is_dir() and not path.is_absolute() and (Path(data_dir) / path).is_dir():
        path = Path(data_dir) / path  # a run named by its directory under data/, as SLM-Lab's -f takes it
    if not path.is_dir():
        raise PlotError(f'-f {arg}: no such run directory (give data/{{spec_name}}_{{timestamp}}, or '
                        f'RUN_DIR/t3 for trial 3 of a search)')
    trials = session_csvs(path)
    if not trials:
        raise PlotError(f'-f {arg}: {path / "info"} holds no *_session_df_train.csv: not a run directory, or a '
                        'run stopped before its first log point')
    if trial is not None:
        if trial not in trials:
            raise PlotError(f'-f {arg}: {path.name} has no trial {trial}; its trials: '
                            + ', '.join(f't{t}' for t in trials))
        return [(f'{path.name}/t{trial}', trials[trial])]
    if len(trials) == 1:
        return [(path.name, next(iter(trials.values())))]
    return [(f'{path.name}/t{t}', csvs) for t, csvs in trials.items()]


def search_trial_labels(run_dir: Path) -> dict[int, tuple[str, int | None]]:
    """{trial: (a label naming the values it searched, the frame ASHA stopped it at or None)} of a
    search's run directory, from its info/{name}_experiment_df.csv ({} before the search wrote it:
    the curves keep their directory names)."""
    import pandas as pd  # only plotting needs it
    found = sorted((run_dir / 'info').glob('*_experiment_df.csv'))
    if not found:
        return {}
    try:
        df = pd.read_csv(found[0])
        columns = list(df.columns)
        keys = columns[columns.index('trial') + 1:columns.index('frame')]
    except (OSError, ValueError, pd.errors.ParserError, pd.errors.EmptyDataError):
        return {}
    labels = {}
    for row in df.to_dict('records'):
        values = ', '.join(f'{key.rsplit(".", 1)[-1]}={_short(row[key])}' for key in keys)
        stopped = str(row.get('status', '')).startswith('stopped early')
        frame = int(row['frame']) if stopped and row.get('frame') == row.get('frame') else None
        labels[int(row['trial'])] = (f't{int(row["trial"])}: {values}' if values else f't{int(row["trial"])}', frame)
    return labels


def _short(value) -> str:
    """A searched value as a legend shows it: 3 significant digits for a number."""
    if isinstance(value, float) and value == value and not value.is_integer():
        return f'{value:.3g}'
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def default_title(labels: list[str]) -> str:
    """The graph's title when none is given: the labels, or their count when they would not fit."""
    joined = ' vs '.join(labels)
    return joined if len(joined) <= 70 else f'{len(labels)} runs'


def plot_runs(folders: list[str], labels: list[str] | None = None, title: str | None = None,
              out: str | None = None, data_dir: str = 'data') -> list[str]:
    """Draw the runs (or trials) `folders` on one graph; returns the files written (HTML, and PNG
    when kaleido works here). Raises PlotError for bad input, before anything is written."""
    import pandas as pd  # with plotly: only plotting needs them

    from slm_lab.experiment import viz
    curves = [curve for arg in folders for curve in resolve(arg, data_dir)]
    if labels is not None and len(labels) != len(curves):
        raise PlotError(f'-l gives {len(labels)} label(s) for {len(curves)} curve(s) '
                        f'({", ".join(c[0] for c in curves)}); give one label per curve')
    # a search's trials are named by the values they searched, and those ASHA stopped are marked
    searched, stopped = {}, set()
    for arg in folders:
        path = Path(arg.rstrip('/'))
        path = path.parent if TRIAL_ARG.match(path.name) and not path.is_dir() else path
        if not path.is_dir() and not path.is_absolute() and (Path(data_dir) / path).is_dir():
            path = Path(data_dir) / path
        for trial, (label, frame) in search_trial_labels(path).items():
            searched[f'{path.name}/t{trial}'] = (label + (f' (stopped at frame {frame})' if frame else ''), frame)
    default = [searched.get(c[0], (c[0], None))[0] for c in curves]
    stopped = {i for i, c in enumerate(curves) if searched.get(c[0], (None, None))[1]}
    runs = [(label, [pd.read_csv(p) for p in csvs])
            for label, (_, csvs) in zip(labels or default, curves)]
    title = title or default_title([label for label, _ in runs])
    js_dir = None  # beside the graph
    if out is None:
        out = str(Path(data_dir) / 'plots' / f'compare_{time.strftime("%Y_%m_%d_%H%M%S")}.html')
        js_dir = str(Path(data_dir) / viz.JS_DIR)  # the data directory's one copy, as its runs' graphs
    prefix = out[:-len('.html')] if out.endswith('.html') else out
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    return viz.plot_compare(runs, title, prefix, js_dir=js_dir, dashed=stopped)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f'error: {message} (see slm-lab plot --help)\n')


def plot_main(argv: list[str]) -> int:
    """`slm-lab plot ...`: its exit code (2 and one line on stderr for bad input)."""
    parser = _Parser(prog='slm-lab plot', description=(
        "One graph of runs' total_reward_ma over frames: each curve the mean across the run's sessions, "
        'with a band from their minimum to their maximum, a colour per run. HTML always (it loads '
        'plotly.js from the data directory\'s .plotly/, or beside it with -o); a PNG too where kaleido and a '
        'browser work (the png extra).'),
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog="""\
examples:
  slm-lab plot -f data/ppo_cartpole_2026_01_01_120000,data/a2c_cartpole_2026_01_01_130000 -l PPO,A2C
  slm-lab plot -f data/ppo_search_2026_01_01_120000          (every trial of a search, one curve each)
  slm-lab plot -f data/ppo_search_2026_01_01_120000/t3,data/ppo_search_2026_01_01_120000/t5 -o best.html
""")
    parser.add_argument('-f', '--folders', required=True, metavar='RUN_DIR,RUN_DIR',
                        help='comma-separated run directories (under --data-folder when not found as given); '
                             'RUN_DIR/t3: trial 3 of a search; a search run directory: all its trials')
    parser.add_argument('-l', '--labels', metavar='LABEL,LABEL', help='comma-separated legend labels, one per curve')
    parser.add_argument('-t', '--title', help="the graph's title (default: the labels)")
    parser.add_argument('-o', '--output', metavar='OUT',
                        help='the HTML file to write (default: DATA_FOLDER/plots/compare_{timestamp}.html); a PNG beside it')
    parser.add_argument('-d', '--data-folder', default='data', help='where run directories named by -f are looked '
                                                                     'for when not found as given (default: data)')
    args = parser.parse_args(argv)
    folders = [f.strip() for f in args.folders.split(',') if f.strip()]
    if not folders:
        parser.error('-f: give at least one run directory')
    labels = [x.strip() for x in args.labels.split(',')] if args.labels else None
    try:
        paths = plot_runs(folders, labels, args.title, args.output, args.data_folder)
    except PlotError as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    for path in paths:
        print(f'wrote {path}')
    return 0
