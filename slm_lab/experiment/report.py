"""`slm-lab report`: each run's (or search trial's) final score per session, with its mean and
95% bootstrap interval over the sessions (the seeds), as a table printed and written (Markdown
and CSV).

The score is a session's `final_return_ma` as the trial metrics take it: the last
`total_reward_ma` of its eval records (info/*_session_df_eval.csv; with meta.rigorous_eval, the
mean return of greedy episodes). A run still training, or stopped, is reported at the frame its
records reached, marked unfinished."""
from __future__ import annotations

import argparse
import csv
import io
import json
import math
import time
from pathlib import Path

from slm_lab.experiment.analysis import score_summary
from slm_lab.experiment.benchmark.suite import read_saved
from slm_lab.experiment.compare import TRIAL_ARG, CommandParser, run_command, search_trial_labels, session_csvs
from slm_lab.lib.errors import LabError
from slm_lab.lib.io import atomic_write_text
from slm_lab.persistence.run_dir import RunDir, is_search_run
from slm_lab.spec import session_max_frame

COLUMNS = ('run', 'trial', 'spec_name', 'frames', 'trained', 'sessions', 'scores', 'mean', 'ci95_low', 'ci95_high',
           'lineage')


class ReportError(LabError):
    """A mistake in `slm-lab report`'s input: one line, exit code 2."""


def _last_score(path: Path) -> tuple[float | None, int | None]:
    """(the last total_reward_ma that is a number, the last frame) of an eval CSV; (None, None)
    when it has no row."""
    try:
        with open(path, newline='', encoding='utf-8') as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ReportError(f'{path}: cannot be read ({type(e).__name__}: {e}); the run\'s records are damaged') from None
    score = frame = None
    for row in rows:
        try:
            frame = int(float(row['frame']))
            value = float(row['total_reward_ma'])
        except (KeyError, TypeError, ValueError):
            continue
        if math.isfinite(value):
            score = value
    return score, frame


def _spec(run_dir: Path, trial: int) -> dict:
    """The trial's saved spec ({} when it cannot be read: the table then leaves its cells empty)."""
    for path in sorted(run_dir.glob(f'*_t{trial}_spec.json')):
        try:
            spec = json.loads(path.read_text(encoding='utf-8'))
        except (OSError, ValueError):
            continue
        if isinstance(spec, dict) and isinstance(spec.get('meta'), dict):
            return spec
    return {}


def describe_lineage(lineage: dict | None) -> str:
    """A lineage record (meta.lineage) in a few words: 'fork of RUN at frame N' or 'warm start
    from RUN (best)'; '' for a run made from scratch."""
    if not isinstance(lineage, dict):
        return ''
    parent = Path(str(lineage.get('parent', '?'))).name
    if lineage.get('kind') == 'fork':
        frames = sorted({s.get('frame') for s in (lineage.get('sessions') or {}).values() if isinstance(s, dict)}
                        - {None})
        return f'fork of {parent} at frame {", ".join(map(str, frames)) or "?"}'
    if lineage.get('kind') == 'warm_start':
        trial = lineage.get('parent_trial')
        return f'warm start from {parent}{f"/t{trial}" if trial else ""} ({lineage.get("ckpt", "best")})'
    return str(lineage.get('kind', ''))


def trial_row(run_dir: Path, trial: int, label: str) -> dict:
    """One row of the table: a trial's per-session scores, their summary, frames and lineage."""
    spec = _spec(run_dir, trial)
    scores, frames, reached = [], [], []
    for train_csv in session_csvs(run_dir)[trial]:
        eval_csv = train_csv.with_name(train_csv.name.replace('_session_df_train.csv', '_session_df_eval.csv'))
        score, frame = _last_score(eval_csv) if eval_csv.exists() else (None, None)
        _, trained = _last_score(train_csv)
        scores.append(score)
        frames.append(trained if frame is None else frame)
        reached.append(trained or 0)
    summary = score_summary(scores)
    shown = sorted({f for f in frames if f is not None})
    return {'run': label, 'trial': trial, 'spec_name': spec.get('meta', {}).get('spec_name', ''),
            'frames': _span(shown), 'trained': _trained(run_dir, trial, spec, reached),
            'sessions': len(scores), 'scores': scores,
            'mean': summary['mean'], 'ci95_low': summary['low'], 'ci95_high': summary['high'],
            'lineage': describe_lineage(spec.get('meta', {}).get('lineage'))}


def _span(frames: list[int]) -> str:
    return '-'.join(map(str, [frames[0], frames[-1]] if len(frames) > 1 else frames))


def _trained(run_dir: Path, trial: int, spec: dict, reached: list[int]) -> str:
    """'finished' when the trial wrote its metrics (every session ended); a search's trial that
    ASHA stopped early says so; else how far its sessions trained ('4500-9504 of 40000,
    unfinished', a session with no records yet counting 0): a stopped or running trial's scores
    are not its final ones."""
    if RunDir(run_dir, _spec_name(spec)).trial_metrics_path(trial).exists():
        return 'finished'
    meta = spec.get('meta') or {}
    try:
        budget = session_max_frame(spec)
        sessions = int(meta.get('max_session') or len(reached))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):  # a spec too damaged to say
        budget, sessions = None, len(reached)
    reached = reached + [0] * (sessions - len(reached))
    frames = _span(sorted(set(reached)))
    if is_search_run(run_dir) and search_trial_labels(run_dir).get(trial, (None, None))[1] is not None:
        return f'stopped early by ASHA at {frames}'  # the experiment's records give the frame it stopped at
    return f'{frames} of {budget}, unfinished' if budget is not None else f'{frames}, unfinished'


def _spec_name(spec: dict) -> str:
    return str((spec.get('meta') or {}).get('spec_name') or '')


def resolve(arg: str) -> list[tuple[Path, int, str]]:
    """The trials one entry stands for: [(run directory, trial, label)]."""
    path = Path(arg.rstrip('/') or '/')
    trial = None
    m = TRIAL_ARG.match(path.name)
    if m and not path.is_dir():
        trial, path = int(m[1]), path.parent
    if not path.is_dir():
        raise ReportError(f'{arg}: no such run directory (give a run directory, or RUN_DIR/t3 for trial 3 of a '
                          'search)')
    trials = session_csvs(path)
    if not trials:
        raise ReportError(f'{arg}: {path / "info"} holds no *_session_df_train.csv: not a run directory, or a run '
                          'stopped before its first log point')
    if trial is not None:
        if trial not in trials:
            raise ReportError(f'{arg}: {path.name} has no trial {trial}; its trials: '
                              + ', '.join(f't{t}' for t in trials))
        return [(path, trial, f'{path.name}/t{trial}')]
    if len(trials) == 1:
        return [(path, next(iter(trials)), path.name)]
    return [(path, t, f'{path.name}/t{t}') for t in trials]


def _fmt(value) -> str:
    if value is None:
        return 'n/a'
    if isinstance(value, float):
        return f'{value:.2f}'
    if isinstance(value, list):
        return ' '.join(_fmt(v) for v in value)
    return str(value)


def markdown(rows: list[dict]) -> str:
    """The table in Markdown: one row per trial."""
    head = ['run', 'spec', 'frames', 'trained', 'seeds', 'final_return_ma per seed', 'mean', '95% CI', 'lineage']
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for r in rows:
        ci = 'n/a (one seed)' if r['ci95_low'] is None else f'[{r["ci95_low"]:.2f}, {r["ci95_high"]:.2f}]'
        lines.append('| ' + ' | '.join([r['run'], r['spec_name'], r['frames'], r['trained'], str(r['sessions']),
                                       _fmt(r['scores']),
                                       _fmt(r['mean']), ci, r['lineage'] or '']) + ' |')
    return '\n'.join(lines) + '\n'


def to_csv(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator='\n')
    writer.writeheader()
    for r in rows:
        writer.writerow({**r, 'scores': ' '.join('' if s is None else repr(s) for s in r['scores'])})
    return out.getvalue()


def benchmark_report(root: Path, out: str | None, data_dir: str) -> tuple[str, list[Path]]:
    """The suite report of a benchmark directory as it stands, the same as the benchmark writes at
    its end (finished seeds scored, the others counted unfinished; no graphs), written to `out`
    (.md, the rows' .csv and a _scores.csv beside it), not into the benchmark's directory, which a
    running benchmark owns."""
    from slm_lab.experiment.benchmark import report as suite_report  # noqa: PLC0415 (plotly: a benchmark's report only)
    try:
        suite, plan = read_saved(root)
    except (OSError, ValueError, LabError) as e:
        raise ReportError(f'{root}: its benchmark/ files cannot be read ({e}); the benchmark directory is '
                          'damaged') from None
    text, rows_text, seeds_text, _, _ = suite_report.report_texts(RunDir(root, suite.name), suite, plan)
    md = output_path(out, data_dir)
    scores = md.with_name(md.stem + '_scores.csv')
    atomic_write_text(md, text)
    atomic_write_text(md.with_suffix('.csv'), rows_text)
    atomic_write_text(scores, seeds_text)
    return text, [md, md.with_suffix('.csv'), scores]


def output_path(out: str | None, data_dir: str) -> Path:
    """The Markdown file a report goes to: `out` (a file, or a directory to hold one), default
    DATA_DIR/reports/report_{timestamp}.md."""
    stamp = f'report_{time.strftime("%Y_%m_%d_%H%M%S")}.md'
    if out is None:
        md = Path(data_dir) / 'reports' / stamp
        md.parent.mkdir(parents=True, exist_ok=True)
    else:
        md = Path(out) / stamp if Path(out).is_dir() else Path(out)  # a directory: a file inside it
        if md.suffix != '.md':
            md = md.with_name(md.name + '.md')
        if not md.parent.is_dir():
            raise ReportError(f'-o {out}: the directory {md.parent} does not exist; create it or write elsewhere')
    return md


def report(entries: list[str], out: str | None = None, data_dir: str = 'data') -> tuple[list[dict], list[Path]]:
    """The table of `entries` (run directories, RUN_DIR/tN) and the files it was written to:
    `out` (.md, with a .csv beside it), default DATA_DIR/reports/report_{timestamp}.md."""
    rows = [trial_row(path, trial, label) for arg in entries for path, trial, label in resolve(arg)]
    md = output_path(out, data_dir)
    atomic_write_text(md, markdown(rows))
    atomic_write_text(md.with_suffix('.csv'), to_csv(rows))
    return rows, [md, md.with_suffix('.csv')]


def report_main(argv: list[str]) -> int:
    """`slm-lab report RUN_DIR[,RUN_DIR...]`: its exit code (2 and one line on stderr for bad input)."""
    parser = CommandParser(prog='slm-lab report', description=(
        "A table of runs' results across seeds: per run (or search trial), each session's final_return_ma "
        '(the last total_reward_ma of its eval records), their mean and 95% bootstrap interval, the frames '
        'of the scores, whether training finished (or how far it got), the spec name and lineage. Printed, '
        'and written as Markdown and CSV.'),
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog="""\
examples:
  slm-lab report data/ppo_cartpole_2026_01_01_120000,data/a2c_cartpole_2026_01_01_130000
  slm-lab report data/ppo_search_2026_01_01_120000          (every trial of a search)
  slm-lab report data/ppo_search_2026_01_01_120000/t3 -o reports/best.md
  slm-lab report data/slm_lab_v5_cpu_2026_01_01_120000       (a benchmark, running or not: its suite
                                                              report so far, written beside -o)
""")
    parser.add_argument('runs', metavar='RUN_DIR[,RUN_DIR...]',
                        help='comma-separated run directories; RUN_DIR/t3: trial 3 of a search; or one '
                             'benchmark directory (its suite report as it stands)')
    parser.add_argument('-o', '--output', metavar='OUT.md',
                        help='the Markdown file to write, a CSV beside it '
                             '(default: data/reports/report_{timestamp}.md)')
    args = parser.parse_args(argv)
    entries = [e.strip() for e in args.runs.split(',') if e.strip()]
    if not entries:
        parser.error('give at least one run directory')

    def done(result) -> None:
        text, paths = result
        print(text, end='')
        for path in paths:
            print(f'wrote {path}')

    def make():
        if len(entries) == 1 and (Path(entries[0]) / 'benchmark' / 'plan.json').is_file():
            return benchmark_report(Path(entries[0]), args.output, 'data')  # a benchmark: its suite report
        rows, paths = report(entries, args.output)
        return markdown(rows), paths
    return run_command(make, done)
