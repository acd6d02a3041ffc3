"""A suite's published results: a small folder of plain files (docs/benchmarks/{suite}/) that holds
the finished row-seeds of one or more benchmark directories, so that a suite longer than one
machine's life (a preemptible node, a machine wiped between jobs) runs piece by piece and loses at
most the row-seeds that were running:

    slm-lab publish data/{suite}_{timestamp} --to docs/benchmarks/{suite}     after each piece
    slm-lab benchmark SUITE_FILE --missing-from docs/benchmarks/{suite}       the next piece

The folder (each file written atomically; small enough to commit):

    suite.json              the suite's rows as published (labels, references)
    seeds.csv               one line per published row-seed: row, seed, frames reached, score, where
                            it ran (benchmark directory, trial, the lab's git commit) and the digest
                            of its spec as written (spec_digest)
    curves/{row}_s{seed}_train.csv    the seed's learning curve: frame, total_reward_ma per log row
    curves/{row}_s{seed}_eval.csv     its eval records, when it has any
    random.json             per row, a random policy's score and where it comes from (the aggregate)
    report.md, report.csv   the report over every published seed (report.py's tables;
                            tools/benchmark_table.py draws docs/BENCHMARKS.md's table from report.csv)

A row-seed is published once, from the first benchmark that finished it; another benchmark's run
of the same row-seed is left out (and said). A row published before must be defined the same way
(spec file, spec name, frame budget, score, overrides, and the spec file's entry itself: its
spec_digest): results of another definition go to another folder."""
from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import io
import json
from pathlib import Path

from slm_lab.experiment.analysis import baseline_cache_dir, random_baseline
from slm_lab.experiment.benchmark import report as bench_report
from slm_lab.experiment.benchmark import stats
from slm_lab.experiment.benchmark.scores import read_rows, score_rows
from slm_lab.experiment.benchmark.suite import (Row, Suite, SuiteError, is_benchmark_run, parse_suite, read_saved,
                                               suite_to_dict)
from slm_lab.experiment.compare import CommandParser, run_command
from slm_lab.lib.errors import LabError, SpecError
from slm_lab.lib.io import atomic_write_text
from slm_lab.persistence.run_dir import RunDir
from slm_lab.spec import load_spec
from slm_lab.spec.compat import raw_section
from slm_lab.spec.read import read_spec_file

SEEDS_FILE = 'seeds.csv'
SEED_COLUMNS = ('row', 'seed', 'frame', 'score', 'benchmark', 'trial', 'lab_commit', 'spec_digest', 'linear_kernel')
CURVES = 'curves'


class PublishError(LabError):
    """A publish or --missing-from that cannot be done: one line, exit code 2."""
    exit_code = 2


def defining(row: Row) -> dict:
    """What a row's result depends on, as the suite says it: two rows that agree here (and whose
    spec_digest agrees) measure the same thing."""
    return {'spec_file': row.spec_file, 'spec_name': row.spec_name, 'max_frame': row.max_frame, 'score': row.score,
            'set': dict(sorted(row.set.items()))}


def spec_digest(row: Row) -> str:
    """A digest of what the user wrote for the row: its spec as its spec file holds it (before the
    lab fills defaults, so a lab that adds a key does not change it) with the row's set, budget and
    score. A benchmark records it per row-seed (plan.json), publish per seed (seeds.csv); a row
    whose spec was edited between two pieces is refused. SpecError when the file cannot be read."""
    entry = read_spec_file(row.spec_file).get(row.spec_name)
    body = {'spec': entry, **{k: v for k, v in defining(row).items() if k not in ('spec_file', 'spec_name')}}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_published(dest: Path) -> tuple[Suite | None, list[dict], dict]:
    """(the published suite or None, its seeds as seeds.csv holds them, random.json's scores) of
    the folder `dest`; PublishError when it is not one."""
    if not dest.is_dir():
        raise PublishError(f'{dest}: no such directory; give the folder results are published in (slm-lab publish '
                           'BENCHMARK_DIR --to FOLDER makes it, in a parent folder that exists)')
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
                  'trial': int(r['trial']), 'lab_commit': r['lab_commit'], 'spec_digest': r.get('spec_digest') or '',
                  'linear_kernel': r.get('linear_kernel') or ''}
                 for r in csv.DictReader(io.StringIO(text))]
        saved = json.loads((dest / 'random.json').read_text(encoding='utf-8')) \
            if (dest / 'random.json').is_file() else {}
        randoms = {str(k): (float(v[0]), str(v[1])) for k, v in saved.items()}
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, SuiteError) as e:
        raise PublishError(f'{dest}: its published files cannot be read ({type(e).__name__}: {e}); restore them '
                           'from version control') from None
    return suite, seeds, randoms


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


def _check_digest(row_id: str, digest: str, seeds: list[dict], dest: Path, what: str) -> None:
    """PublishError when seeds of the row published in `dest` ran a spec whose digest differs from
    `digest` (a digest unknown on either side, '', is not checked)."""
    other = next((s for s in seeds if s['row'] == row_id and s['spec_digest'] and digest
                  and s['spec_digest'] != digest), None)
    if other is not None:
        raise PublishError(f'row {row_id}: {what} ran its spec as written otherwise than the seeds published in {dest} '
                           f'(their spec_digest {other["spec_digest"]}, here {digest}: the spec file\'s entry was '
                           'edited); seeds of two specs are not one row: give the row another id, or publish to '
                           'another folder')


def published_pairs(dest: str | Path, suite: Suite) -> set[tuple[str, int]]:
    """The (row, seed) pairs of `suite` published in `dest` (benchmark --missing-from), after
    checking the folder publishes the same suite with the same row definitions and spec files
    (spec_digest). A folder not made yet (its parent there) publishes nothing."""
    dest = Path(dest)
    if not dest.exists() and dest.parent.is_dir():
        return set()
    published, seeds, _ = read_published(dest)
    check_same_rows(published, suite, dest, f'the suite file {suite.path}')
    for row in suite.rows:
        try:
            digest = spec_digest(row)
        except SpecError:  # the benchmark's own checks name the spec file's problem
            continue
        _check_digest(row.id, digest, seeds, dest, f'the suite file {suite.path}')
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
    """The published rows in their order, then rows new in `suites` (oldest benchmark first); each
    row's labels, references and notes as the newest benchmark gives them (the suite file as it
    was last run), its seeds the most any asked for (a piece run with --seeds 2 does not make a
    row of 4 seeds complete at 2)."""
    rows: dict[str, Row] = {r.id: r for r in published.rows} if published is not None else {}
    for suite in suites:
        for row in suite.rows:
            before = rows.get(row.id)
            rows[row.id] = row if before is None else dataclasses.replace(row, seeds=max(before.seeds, row.seeds))
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


def _load(bench_dirs: list[str | Path], published: Suite | None, dest: Path) -> list[tuple[Suite, list, RunDir]]:
    """Each benchmark directory's (suite, plan, RunDir), oldest first (by the timestamp in its
    name), each checked against the published suite and the others."""
    if not bench_dirs:
        raise PublishError('give one or more benchmark directories to publish')
    loaded = []
    for bench in bench_dirs:
        root = Path(bench)
        if root.is_dir() and not is_benchmark_run(root):
            raise PublishError(f'{root}: not a benchmark directory (it has no benchmark/plan.json); give the '
                               'directory a benchmark wrote, data/{suite}_{timestamp}')
        try:
            suite, plan = read_saved(root)
        except (OSError, ValueError, SuiteError) as e:
            raise PublishError(f'{root}: not a benchmark directory whose benchmark/ files can be read '
                               f'({type(e).__name__}: {e}); give data/{{suite}}_{{timestamp}}') from None
        check_same_rows(published, suite, dest, str(root))
        for other, _, rd in loaded:
            check_same_rows(other, suite, rd.root, str(root))
        loaded.append((suite, plan, RunDir(root, suite.name)))
    return sorted(loaded, key=lambda t: t[2].root.name[-17:])


def publish(bench_dirs: list[str | Path], dest: str | Path,
            data_dir: str = 'data') -> tuple[str, list[Path], list[str]]:
    """Publish the finished row-seeds of the benchmark directories `bench_dirs` into the folder
    `dest` (made when absent; its parent must exist) and write its report over every published
    seed. Everything is read, checked and computed before the first write; suite.json is written
    first, so a publish stopped half-way leaves a folder the next publish completes. Returns (the
    report's Markdown, the files written, what was left out and why)."""
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise PublishError(f'--to {dest}: a file is there; give a folder (made when absent)')
    if dest.is_dir():
        published, seeds, randoms = read_published(dest)
    elif not dest.parent.is_dir():
        raise PublishError(f'--to {dest}: its parent directory {dest.parent} does not exist; create it or publish '
                           'elsewhere')
    else:
        published, seeds, randoms = None, [], {}
    loaded = _load(bench_dirs, published, dest)
    merged = _merged_suite(published, [s for s, _, _ in loaded])
    have = {(s['row'], s['seed']): s for s in seeds}
    notes, curves = [], {}
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
            digest = str(entry.get('spec_digest') or '')
            _check_digest(row.id, digest, list(have.values()), dest, f'{run_dir.root} t{i}')
            try:
                saved = json.loads(run_dir.spec_path(i).read_text(encoding='utf-8'))
                sha = saved['meta'].get('git_sha') or ''
            except (OSError, ValueError, KeyError, AttributeError):
                saved, sha = {}, ''
            rows = {kind: read_rows(run_dir.session_df_path(i, 0, kind)) for kind in ('train', 'eval')}
            for kind, kept in rows.items():
                if kept:
                    curves[dest / CURVES / f'{row.id}_s{seed}_{kind}.csv'] = _curve_text(kept)
            have[(row.id, seed)] = {
                'row': row.id, 'seed': seed, 'frame': int(rows['train'][-1]['frame']) if rows['train'] else 0,
                'score': score_rows(row.score, lambda: rows['train'], lambda: rows['eval']),
                'benchmark': run_dir.root.name, 'trial': i, 'lab_commit': str(sha)[:12], 'spec_digest': digest,
                'linear_kernel': settled_kernel(saved)}
    if not have:  # a folder of empty reports helps no one: nothing is written
        raise PublishError(f'nothing to publish: no row-seed of {", ".join(str(rd.root) for _, _, rd in loaded)} has '
                           'finished yet; publish once one has (benchmark@DIR continues a stopped benchmark)')
    for row in merged.rows:
        if row.random_score is not None:  # the suite's own figure, as the suite file says it now
            randoms[row.id] = (row.random_score, 'the suite')
        elif row.id not in randoms:
            where = next(((rd, plan) for s, plan, rd in reversed(loaded) if any(r.id == row.id for r in s.rows)),
                         (None, []))
            try:
                value = random_baseline(_row_env(where[0], where[1], row), cache_dir=baseline_cache_dir(data_dir))
            except (OSError, ValueError, KeyError, LabError) as e:
                raise PublishError(f"row {row.id}: its random baseline cannot be played ({type(e).__name__}: {e}); "
                                   'give the row a random_score in the suite file') from None
            randoms[row.id] = (value, "the lab's random baseline (20 episodes)")
    order = {r.id: k for k, r in enumerate(merged.rows)}
    ordered = sorted(have.values(), key=lambda s: (order.get(s['row'], len(order)), s['seed']))
    text, rows_text = report_texts(merged, ordered, randoms)
    files = {dest / 'suite.json': json.dumps(suite_to_dict(merged), indent=2) + '\n', **curves,
             dest / 'random.json': json.dumps({k: list(v) for k, v in randoms.items()}, indent=2) + '\n',
             dest / SEEDS_FILE: seeds_text(ordered), dest / 'report.md': text, dest / 'report.csv': rows_text}
    (dest / CURVES).mkdir(parents=True, exist_ok=True)  # every input read, checked and computed: now the folder
    for path, content in files.items():
        atomic_write_text(path, content)
    return text, list(files), notes


def settled_kernel(spec: dict) -> str:
    """The matrix-product kernel a trial's nets ran on, as its saved spec settled it (agent.net's
    linear_kernel "auto" becomes "onednn" or "default" by the machine: the same row can run on
    either, rounding differently), "net/critic" where the critic net's differs; '' when the spec
    does not say (a run saved before the key)."""
    agent = raw_section(spec, 'agent')  # either layout
    if agent is None:
        return ''
    kernels = [str(net.get('linear_kernel') or '') for net in (agent.get('net'), agent.get('critic_net'))
               if isinstance(net, dict)]
    kernels = [k for k in kernels if k]
    return '/'.join(dict.fromkeys(kernels))


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
             f'({", ".join(sources)}); each seed\'s source, frames and score: {SEEDS_FILE}; the learning curves of '
             f'the seeds published with theirs: {CURVES}/. Intervals: {stats.CONFIDENCE:.0%} percentile bootstrap.\n')
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
