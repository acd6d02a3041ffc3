"""A suite's published results: a small folder of plain files (docs/benchmarks/{suite}/) that holds
the finished row-seeds of one or more benchmark directories, so that a suite longer than one
machine's life (a preemptible node, a machine wiped between jobs) runs piece by piece and loses at
most the row-seeds that were running:

    slm-lab publish data/{suite}_{timestamp} --to docs/benchmarks/{suite}     after each piece
    slm-lab benchmark SUITE_FILE --missing-from docs/benchmarks/{suite}       the next piece

The folder (each file written atomically; small enough to commit):

    suite.json              the suite's rows as published (labels, references)
    seeds.csv               one line per published row-seed: row, seed, frames reached, score, and
                            where it ran: benchmark directory, trial, the lab's git commit
    curves/{row}_s{seed}_train.csv    the seed's learning curve: frame, total_reward_ma per log row
    curves/{row}_s{seed}_eval.csv     its eval records, when it has any
    random.json             per row, a random policy's score and where it comes from (the aggregate)
    report.md, report.csv   the report over every published seed (report.py's tables;
                            tools/benchmark_table.py draws docs/BENCHMARKS.md's table from report.csv)

A row-seed is published once, from the first benchmark that finished it; another benchmark's run
of the same row-seed is left out (and said). A row published before must be defined the same way
(spec file, spec name, frame budget, score, overrides): results of another definition go to
another folder."""
from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path

from slm_lab.experiment.analysis import baseline_cache_dir, random_baseline
from slm_lab.experiment.benchmark import report as bench_report
from slm_lab.experiment.benchmark import stats
from slm_lab.experiment.benchmark.scores import read_rows, score
from slm_lab.experiment.benchmark.suite import Row, Suite, SuiteError, parse_suite, read_saved, suite_to_dict
from slm_lab.experiment.compare import CommandParser, run_command
from slm_lab.lib.errors import LabError
from slm_lab.lib.io import atomic_write_text
from slm_lab.persistence.run_dir import RunDir
from slm_lab.spec import load_spec

SEEDS_FILE = 'seeds.csv'
SEED_COLUMNS = ('row', 'seed', 'frame', 'score', 'benchmark', 'trial', 'lab_commit')
CURVES = 'curves'


class PublishError(LabError):
    """A publish or --missing-from that cannot be done: one line, exit code 2."""
    exit_code = 2


def defining(row: Row) -> dict:
    """What a row's result depends on: two rows that agree here measure the same thing."""
    return {'spec_file': row.spec_file, 'spec_name': row.spec_name, 'max_frame': row.max_frame, 'score': row.score,
            'set': dict(sorted(row.set.items()))}


def read_published(dest: Path) -> tuple[Suite | None, list[dict], dict]:
    """(the published suite or None, its seeds as seeds.csv holds them, random.json's scores) of
    the folder `dest`; PublishError when it is not one."""
    if not dest.is_dir():
        raise PublishError(f'{dest}: no such directory; give the folder results are published in (slm-lab publish '
                           'BENCHMARK_DIR --to FOLDER makes it)')
    suite_path = dest / 'suite.json'
    if not suite_path.is_file():
        if any(dest.iterdir()):
            raise PublishError(f'{dest}: holds files but no suite.json, so it is not a folder of published results; '
                               'publish into an empty or new folder')
        return None, [], {}
    try:
        suite = parse_suite(json.loads(suite_path.read_text(encoding='utf-8')), str(suite_path))
        text = (dest / SEEDS_FILE).read_text(encoding='utf-8') if (dest / SEEDS_FILE).is_file() else ''
        seeds = [{'row': r['row'], 'seed': int(r['seed']), 'frame': int(r['frame']),
                  'score': None if r['score'] == '' else float(r['score']), 'benchmark': r['benchmark'],
                  'trial': int(r['trial']), 'lab_commit': r['lab_commit']}
                 for r in csv.DictReader(io.StringIO(text))]
        randoms = json.loads((dest / 'random.json').read_text(encoding='utf-8')) \
            if (dest / 'random.json').is_file() else {}
    except (OSError, ValueError, KeyError, TypeError, SuiteError) as e:
        raise PublishError(f'{dest}: its published files cannot be read ({type(e).__name__}: {e}); restore them '
                           'from version control') from None
    return suite, seeds, {k: (float(v[0]), str(v[1])) for k, v in randoms.items()}


def check_same_rows(published: Suite | None, suite: Suite, dest: Path, what: str) -> None:
    """PublishError when `published` and `suite` name the same suite differently or share a row
    defined differently."""
    if published is None:
        return
    if published.name != suite.name:
        raise PublishError(f"{dest} holds suite '{published.name}', not {what}'s '{suite.name}'; publish each suite "
                           'to a folder of its own')
    for row in suite.rows:
        old = next((r for r in published.rows if r.id == row.id), None)
        if old is not None and defining(old) != defining(row):
            diff = ', '.join(f'{k} {defining(old)[k]!r} there, {defining(row)[k]!r} here'
                             for k in defining(row) if defining(old)[k] != defining(row)[k])
            raise PublishError(f'row {row.id}: {dest} published it defined otherwise ({diff}); its seeds would not '
                               'measure the same thing: give the row another id, or publish to another folder')


def published_pairs(dest: str | Path, suite: Suite) -> set[tuple[str, int]]:
    """The (row, seed) pairs of `suite` published in `dest` (benchmark --missing-from), after
    checking the folder publishes the same suite with the same row definitions."""
    dest = Path(dest)
    published, seeds, _ = read_published(dest)
    check_same_rows(published, suite, dest, f'the suite file {suite.path}')
    return {(s['row'], s['seed']) for s in seeds}


def _curve_text(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator='\n')
    writer.writerow(('frame', 'total_reward_ma'))
    for r in rows:
        writer.writerow((int(r['frame']), '' if r['total_reward_ma'] != r['total_reward_ma'] else
                         repr(r['total_reward_ma'])))
    return out.getvalue()


def _merged_suite(published: Suite | None, suites: list[Suite]) -> Suite:
    """The published rows in their order, then rows new in `suites`; each row as the newest
    benchmark gives it (its labels, references and notes as the suite file now says)."""
    rows: dict[str, Row] = {r.id: r for r in published.rows} if published is not None else {}
    for suite in suites:
        for row in suite.rows:
            rows[row.id] = row
    base = suites[-1]
    return Suite(name=base.name, path=base.path, rows=tuple(rows.values()), description=base.description,
                 resources=base.resources)


def _row_env(run_dir: RunDir | None, plan: list[dict], row: Row) -> dict:
    """The env spec a row's seeds trained on: its first trial's spec in the benchmark directory,
    else the row's spec file loaded with its overrides."""
    if run_dir is not None:
        first = next((e['trial'] for e in plan if e['row'] == row.id), None)
        if first is not None:
            return json.loads(run_dir.spec_path(first).read_text(encoding='utf-8'))['env']
    return load_spec(row.spec_file, row.spec_name, row.overrides(0))['env']


def publish(bench_dirs: list[str | Path], dest: str | Path,
            data_dir: str = 'data') -> tuple[str, list[Path], list[str]]:
    """Publish the finished row-seeds of the benchmark directories `bench_dirs` into the folder
    `dest` (made when absent; its parent must exist) and write its report over every published
    seed. Returns (the report's Markdown, the files written, what was left out and why)."""
    dest = Path(dest)
    if dest.exists():
        published, seeds, randoms = read_published(dest)
    elif not dest.parent.is_dir():
        raise PublishError(f'--to {dest}: its parent directory {dest.parent} does not exist; create it or publish '
                           'elsewhere')
    else:
        published, seeds, randoms = None, [], {}
    have = {(s['row'], s['seed']): s for s in seeds}
    loaded, notes, written = [], [], []
    for bench in bench_dirs:
        root = Path(bench)
        try:
            suite, plan = read_saved(root)
        except (OSError, ValueError, SuiteError) as e:
            raise PublishError(f'{root}: not a benchmark directory whose benchmark/ files can be read '
                               f'({type(e).__name__}: {e}); give data/{{suite}}_{{timestamp}}') from None
        check_same_rows(published, suite, dest, str(root))
        for other, _, _ in loaded:
            check_same_rows(other, suite, Path(str(other.path)), str(root))
        run_dir = RunDir(root, suite.name)
        loaded.append((suite, plan, run_dir))
    if not loaded:
        raise PublishError('give one or more benchmark directories to publish')
    merged = _merged_suite(published, [s for s, _, _ in loaded])
    (dest / CURVES).mkdir(parents=True, exist_ok=True)  # every input read and checked: now the folder
    for suite, plan, run_dir in loaded:
        for entry in plan:
            row, i, seed = suite.row(entry['row']), entry['trial'], entry['seed']
            if not run_dir.trial_metrics_path(i).exists():
                continue
            old = have.get((row.id, seed))
            if old is not None:
                if (old['benchmark'], old['trial']) != (run_dir.root.name, i):
                    notes.append(f'{row.id} seed {seed}: published before from {old["benchmark"]} t{old["trial"]}; '
                                 f'{run_dir.root.name} t{i} left out')
                continue
            try:
                sha = json.loads(run_dir.spec_path(i).read_text(encoding='utf-8'))['meta'].get('git_sha') or ''
            except (OSError, ValueError, KeyError, AttributeError):
                sha = ''
            curves = {}
            for kind in ('train', 'eval'):
                rows = read_rows(run_dir.session_df_path(i, 0, kind))
                if rows:
                    curves[kind] = dest / CURVES / f'{row.id}_s{seed}_{kind}.csv'
                    atomic_write_text(curves[kind], _curve_text(rows))
                    written.append(curves[kind])
            missing = dest / CURVES / 'none.csv'
            value = score(row.score, curves.get('train', missing), curves.get('eval', missing))
            frames = read_rows(curves['train'])[-1]['frame'] if 'train' in curves else 0
            have[(row.id, seed)] = {'row': row.id, 'seed': seed, 'frame': int(frames), 'score': value,
                                    'benchmark': run_dir.root.name, 'trial': i, 'lab_commit': str(sha)[:12]}
    for row in merged.rows:
        if row.id in randoms:
            continue
        if row.random_score is not None:
            randoms[row.id] = (row.random_score, 'the suite')
            continue
        where = next(((rd, plan) for s, plan, rd in loaded if any(r.id == row.id for r in s.rows)), (None, []))
        randoms[row.id] = (random_baseline(_row_env(where[0], where[1], row),
                                           cache_dir=baseline_cache_dir(data_dir)),
                           "the lab's random baseline (20 episodes)")
    order = {r.id: k for k, r in enumerate(merged.rows)}
    ordered = sorted(have.values(), key=lambda s: (order.get(s['row'], len(order)), s['seed']))
    atomic_write_text(dest / SEEDS_FILE, seeds_text(ordered))
    atomic_write_text(dest / 'random.json', json.dumps({k: list(v) for k, v in randoms.items()}, indent=2) + '\n')
    atomic_write_text(dest / 'suite.json', json.dumps(suite_to_dict(merged), indent=2) + '\n')
    text, rows_text = report_texts(merged, ordered, randoms)
    atomic_write_text(dest / 'report.md', text)
    atomic_write_text(dest / 'report.csv', rows_text)
    written += [dest / SEEDS_FILE, dest / 'random.json', dest / 'suite.json', dest / 'report.md', dest / 'report.csv']
    return text, written, notes


def seeds_text(seeds: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=SEED_COLUMNS, lineterminator='\n')
    writer.writeheader()
    for s in seeds:
        writer.writerow({**{k: s[k] for k in SEED_COLUMNS}, 'score': '' if s['score'] is None else repr(s['score'])})
    return out.getvalue()


def report_texts(suite: Suite, seeds: list[dict], randoms: dict) -> tuple[str, str]:
    """(report.md, report.csv) of published seeds: each row's published seeds scored, its seeds
    not published yet (0..row.seeds-1) counted unfinished."""
    entries = []
    for row in suite.rows:
        mine = {s['seed']: s for s in seeds if s['row'] == row.id}
        for seed in sorted(set(range(row.seeds)) | set(mine)):
            s = mine.get(seed)
            entries.append({'row': row.id, 'seed': seed, 'finished': s is not None,
                            'score': None if s is None else s['score']})
    results = bench_report.row_results(suite, entries)
    agg = bench_report.aggregate(results, randoms)
    text = bench_report.markdown(suite, results, agg)
    sources = sorted({s['benchmark'] for s in seeds})
    text += (f'\nPublished from {len(sources)} benchmark director{"y" if len(sources) == 1 else "ies"} '
             f'({", ".join(sources)}); each seed\'s source, frames and score: {SEEDS_FILE}; its learning curve: '
             f'{CURVES}/. Intervals: {stats.CONFIDENCE:.0%} percentile bootstrap.\n')
    return text, bench_report.rows_csv(bench_report.row_records(results))


def publish_main(argv: list[str]) -> int:
    """`slm-lab publish BENCHMARK_DIR [...] --to FOLDER`: its exit code (2 and one line on stderr
    for bad input)."""
    parser = CommandParser(prog='slm-lab publish', description=(
        'Publish the finished row-seeds of benchmark directories into a folder of small plain files (each '
        "seed's score, source and learning curve; the report over every published seed), so that a suite runs "
        'piece by piece across machines: the next piece is slm-lab benchmark SUITE_FILE --missing-from FOLDER.'),
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog="""\
examples:
  slm-lab publish data/slm_lab_v5_cpu_2026_01_01_120000 --to docs/benchmarks/slm_lab_v5_cpu
  slm-lab benchmark spec/benchmark/suites/slm_lab_v5_cpu.json --missing-from docs/benchmarks/slm_lab_v5_cpu
""")
    parser.add_argument('benchmarks', nargs='+', metavar='BENCHMARK_DIR',
                        help='benchmark directories (data/{suite}_{timestamp}), running or not: their finished '
                             'row-seeds are published')
    parser.add_argument('--to', required=True, metavar='FOLDER',
                        help='the folder of published results (made when absent), e.g. docs/benchmarks/{suite}')
    args = parser.parse_args(argv)

    def done(result) -> None:
        text, paths, notes = result
        print(text, end='')
        for note in notes:
            print(f'left out: {note}')
        print(f'wrote {len(paths)} files under {args.to}')
    return run_command(lambda: publish(args.benchmarks, args.to), done)
