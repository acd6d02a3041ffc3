"""`slm-lab plot`: one graph comparing runs, or a search's trials, by their sessions' train rows.

A RUN_DIR given to -f is a run directory (a `train` run: its trial 0; a search: each of its
trials, one curve each) or `RUN_DIR/t{i}` (trial i of a search). Each curve is the mean
total_reward_ma across the trial's sessions against frame, with a band from their minimum to
their maximum (viz.plot_compare).

Bad input is one line and exit code 2, before anything is written: a run directory that is not
one, records that cannot be read (not a file, not UTF-8 text, empty), an output path whose
directory does not exist. A run whose records hold no point to draw (only the header, no
numeric total_reward_ma) is named in a warning and left out; when no run has a curve, that is
the error. A full disk is one line (the partial files removed), Ctrl-C exits with 130 and
SIGTERM with 143, each with one line and no traceback, leaving no partial file behind."""
from __future__ import annotations

import argparse
import math
import re
import signal
import sys
import time
from pathlib import Path

from slm_lab.lib.errors import LabError, Terminated, begin_writing, catch_stops, clear_stops

SESSION_CSV = re.compile(r'^(?P<name>.+)_t(?P<trial>\d+)_s(?P<session>\d+)_session_df_train\.csv$')
TRIAL_ARG = re.compile(r'^t(\d+)$')
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as the run command and shells report
LEAVE_OUT = 'restore it from a copy, or leave that run out of -f'


class PlotError(LabError):
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
    import pandas as pd  # noqa: PLC0415 only plotting needs it
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


def read_records(path: Path):
    """A session's train rows as a dataframe; PlotError naming the file and what is wrong with it
    when it cannot be read as the CSV a run writes (a header, then a row per log point)."""
    import pandas as pd  # noqa: PLC0415 only plotting needs it
    try:
        return pd.read_csv(path)
    except IsADirectoryError:
        raise PlotError(f'{path} is a directory, not the CSV of train rows a run writes; {LEAVE_OUT}') from None
    except UnicodeDecodeError:
        raise PlotError(f'{path} is not a CSV of train rows (not UTF-8 text: damaged); {LEAVE_OUT}') from None
    except pd.errors.EmptyDataError:
        raise PlotError(f'{path} is empty (a run writes at least its header): damaged; {LEAVE_OUT}') from None
    except pd.errors.ParserError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PlotError(f'{path} is not a valid CSV ({first}); {LEAVE_OUT}') from None
    except OSError as e:
        raise PlotError(f'{path} cannot be read ({e.strerror or e}); {LEAVE_OUT}') from None


def no_points(df) -> str | None:
    """Why a session's train rows hold no point of the curve (a numeric frame and total_reward_ma),
    or None when they hold one."""
    import pandas as pd  # noqa: PLC0415 only plotting needs it
    for column in ('frame', 'total_reward_ma'):
        if column not in df.columns:
            return f'no {column} column'
    if df.empty:
        return 'only the header, no row yet'
    frame = pd.to_numeric(df['frame'], errors='coerce')
    value = pd.to_numeric(df['total_reward_ma'], errors='coerce')
    finite = [math.isfinite(f) and math.isfinite(v) for f, v in zip(frame, value)]
    if not any(finite):
        return 'no row with a numeric frame and total_reward_ma'
    return None


def output_prefix(out: str | None, data_dir: str) -> tuple[str, Path | None]:
    """(path prefix of the graph, the directory to make first or None) for -o `out`: an existing
    directory holds the graph as compare_{timestamp}.html; otherwise the HTML file itself (.html
    added when missing), in a directory that must exist. PlotError before anything is written."""
    name = f'compare_{time.strftime("%Y_%m_%d_%H%M%S")}'
    if out is None:  # the default's directory is the lab's own: made, and said
        folder = Path(data_dir) / 'plots'
        if folder.exists() and not folder.is_dir():
            raise PlotError(f'{folder} is not a directory, where graphs go by default; move it away or give -o OUT')
        return str(folder / name), None if folder.is_dir() else folder
    path = Path(out)
    if path.is_dir():
        return str(path / name), None
    if out.endswith(('/', '\\')):
        raise PlotError(f'-o {out}: no such directory; create it first (mkdir -p {out}) or give an existing one')
    parent = path.parent
    if not parent.is_dir():
        what = 'is not a directory' if parent.exists() else 'does not exist'
        raise PlotError(f'-o {out}: the directory {parent} {what}; create it first (mkdir -p {parent}) or give a '
                        'path in an existing directory')
    return (out[:-len('.html')] if out.endswith('.html') else out), None


def _identity(path: Path) -> tuple[int, int] | None:
    """(inode, modification time) of a file, None when there is none: tells a file written since."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def plot_runs(folders: list[str], labels: list[str] | None = None, title: str | None = None,
              out: str | None = None, data_dir: str = 'data', warn=None) -> list[str]:
    """Draw the runs (or trials) `folders` on one graph; returns the files written (HTML, and PNG
    when kaleido works here). Raises PlotError for bad input, before anything is written; a run
    with no point to draw is left out, with a line to `warn` (default: stderr), and PlotError when
    no run has one. A failed or interrupted write leaves no partial file behind."""
    from slm_lab.experiment import viz  # noqa: PLC0415 pandas and plotly: only plotting needs them
    warn = warn or (lambda line: print(f'warning: {line}', file=sys.stderr))
    curves = [curve for arg in folders for curve in resolve(arg, data_dir)]
    if labels is not None and len(labels) != len(curves):
        raise PlotError(f'-l gives {len(labels)} label(s) for {len(curves)} curve(s) '
                        f'({", ".join(c[0] for c in curves)}); give one label per curve')
    prefix, make_dir = output_prefix(out, data_dir)
    # the default graph loads the data directory's one plotly.js copy, as its runs' graphs do; one
    # written where -o says has its copy beside it
    js_dir = str(Path(data_dir) / viz.JS_DIR) if out is None else None
    # a search's trials are named by the values they searched, and those ASHA stopped are marked
    searched = {}
    for arg in folders:
        path = Path(arg.rstrip('/'))
        path = path.parent if TRIAL_ARG.match(path.name) and not path.is_dir() else path
        if not path.is_dir() and not path.is_absolute() and (Path(data_dir) / path).is_dir():
            path = Path(data_dir) / path
        for trial, (label, frame) in search_trial_labels(path).items():
            searched[f'{path.name}/t{trial}'] = (label + (f' (stopped at frame {frame})' if frame else ''), frame)
    default = [searched.get(c[0], (c[0], None))[0] for c in curves]
    stopped_labels = {searched[c[0]][0] if labels is None else labels[i]
                      for i, c in enumerate(curves) if searched.get(c[0], (None, None))[1]}
    runs, missing = [], []
    for label, (_, csvs) in zip(labels or default, curves):
        dfs, empty = [], []
        for path in csvs:
            df = read_records(path)
            why = no_points(df)
            if why is None:
                dfs.append(df)
            else:
                empty.append(f'{path}: {why}')
        if dfs:
            runs.append((label, dfs))
            for line in empty:
                warn(f'{label}: a session is left out of its curve ({line})')
        else:
            more = f'; and {len(empty) - 1} more session(s)' if len(empty) > 1 else ''
            missing.append((label, f'{empty[0]}{more}'))
    if not runs:
        raise PlotError('no run has a curve to draw: ' + '; '.join(f'{label} ({why})' for label, why in missing))
    for label, why in missing:
        warn(f'{label} has no curve and is left out of the graph ({why})')
    title = title or default_title([label for label, _ in runs])
    stopped = {i for i, (label, _) in enumerate(runs) if label in stopped_labels}
    begin_writing()  # a stop signal lost in C code while reading: stop before writing
    if make_dir is not None:
        try:
            make_dir.mkdir(parents=True)
        except OSError as e:  # a file on its way (data/ a file), a read-only place
            raise PlotError(f'cannot make the directory {make_dir}, where graphs go by default ({e.strerror or e}); '
                            'give -o a path in an existing directory') from None
        print(f'made directory {make_dir}')
    html = Path(f'{prefix}.html')
    js = Path(viz.bundle_path(js_dir or str(html.parent)))
    html_before, had_js = _identity(html), js.exists()
    try:
        return viz.plot_compare(runs, title, prefix, js_dir=js_dir, dashed=stopped)
    except BaseException as e:
        # what this call wrote stays only as a complete graph: a plotly.js copy it wrote for a page it
        # did not write goes (the writes themselves are atomic: no partial file is left)
        if not had_js and _identity(html) in (None, html_before):
            js.unlink(missing_ok=True)
        if make_dir is not None and not any(make_dir.iterdir()):
            make_dir.rmdir()
        if isinstance(e, OSError):
            raise PlotError(f'cannot write the graph {html} ({e.strerror or e}); give -o a path in a writable '
                            'directory') from None
        raise


class CommandParser(argparse.ArgumentParser):
    """The parser of an `slm-lab` command: a usage mistake is one line, exit code 2."""

    def error(self, message: str):
        self.exit(2, f'error: {message} (see {self.prog} --help)\n')


def run_command(fn, on_done=None) -> int:
    """Run an `slm-lab` command's work `fn()` as the run command ends: a LabError (bad input, a
    full disk) is its one `error:` line and exit code; Ctrl-C is `interrupted` (130) and SIGTERM
    `stopped by SIGTERM` (143), with no traceback (the writes are atomic: no partial file is
    left). `on_done(result)` prints what it wrote; returns the exit code."""
    previous = catch_stops(at_once=False)  # a stop raises: what is half written is removed on the way out
    try:
        result = fn()
    except LabError as e:
        print(f'error: {e}', file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print('interrupted', file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated as e:
        print('stopped by SIGTERM', file=sys.stderr)
        return e.exit_code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        clear_stops()
    if on_done is not None:
        on_done(result)
    return 0


def plot_main(argv: list[str]) -> int:
    """`slm-lab plot ...`: its exit code (2 and one line on stderr for bad input)."""
    parser = CommandParser(prog='slm-lab plot', description=(
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
                        help='the HTML file to write, in an existing directory (an existing directory: '
             'compare_{timestamp}.html in it; default: DATA_FOLDER/plots/compare_{timestamp}.html, the '
             'directory made when missing); a PNG beside it')
    parser.add_argument('-d', '--data-folder', default='data', help='where run directories named by -f are looked '
                                                                     'for when not found as given (default: data)')
    args = parser.parse_args(argv)
    folders = [f.strip() for f in args.folders.split(',') if f.strip()]
    if not folders:
        parser.error('-f: give at least one run directory')
    labels = [x.strip() for x in args.labels.split(',')] if args.labels else None
    return run_command(lambda: plot_runs(folders, labels, args.title, args.output, args.data_folder),
                       lambda paths: [print(f'wrote {path}') for path in paths])
