"""A benchmark's report, written into its directory and printed: per row the mean and 95% bootstrap
interval of the score over its seeds, each seed's score, the references with their source, budget
and definition, and a verdict per reference; a learning-curve graph per row; the aggregate over
rows as rliable computes it (stats.py).

    benchmark/report.md    the tables (the row table is what tools/benchmark_table.py puts in docs)
    benchmark/report.csv   one line per row and reference (the row table's data)
    benchmark/scores.csv   one line per row-seed: its trial, seed, frames reached, score
    graph/{suite}_{row}_benchmark_graph.html   the row's curve over its seeds"""
from __future__ import annotations

import warnings
import json
import csv
import io
import math
from pathlib import Path

import numpy as np

from slm_lab.experiment import viz
from slm_lab.experiment.analysis import baseline_cache_dir, random_baseline
from slm_lab.experiment.benchmark import stats
from slm_lab.experiment.benchmark.scores import read_rows, score
from slm_lab.experiment.benchmark.suite import SCORES, Row, Suite
from slm_lab.lib.io import atomic_write_text
from slm_lab.persistence.run_dir import RunDir

ROW_COLUMNS = ('row', 'env', 'algorithm', 'spec_name', 'max_frame', 'score', 'seeds', 'unfinished', 'seed_scores',
               'mean', 'ci95_low', 'ci95_high', 'note', 'reference', 'reference_source', 'reference_max_frame',
               'reference_score', 'reference_seeds', 'reference_note', 'verdict')
SEED_COLUMNS = ('row', 'seed', 'trial', 'frame', 'finished', 'score')


def seed_results(run_dir: RunDir, suite: Suite, plan: list[dict]) -> list[dict]:
    """Per row-seed: its trial, the frame its records reached, whether it finished, its score
    under its row's definition (None before the first log row)."""
    out = []
    for entry in plan:
        row, i = suite.row(entry['row']), entry['trial']
        train = run_dir.session_df_path(i, 0, 'train')
        rows = read_rows(train)
        out.append({'row': row.id, 'seed': entry['seed'], 'trial': i,
                    'frame': int(rows[-1]['frame']) if rows else 0,
                    'finished': run_dir.trial_metrics_path(i).exists(),
                    'score': score(row.score, train, run_dir.session_df_path(i, 0, 'eval'))})
    return out


def row_results(suite: Suite, seeds: list[dict]) -> list[dict]:
    """Per row: its seeds' scores (finished seeds only), their summary, and per reference the
    verdict."""
    out = []
    for row in suite.rows:
        mine = [s for s in seeds if s['row'] == row.id]
        scores = [s['score'] if s['finished'] else None for s in mine]
        summary = stats.row_summary(scores)
        out.append({'row': row, 'scores': scores, 'unfinished': sum(not s['finished'] for s in mine), **summary,
                    'verdicts': [stats.verdict(ref.value, summary['low'], summary['high'])
                                 for ref in row.references]})
    return out


def random_scores(run_dir: RunDir, suite: Suite, plan: list[dict]) -> dict[str, tuple[float, str]]:
    """Per row: (a random policy's score, where it comes from): the row's random_score, else the
    lab's random baseline of the row's env (analysis.random_baseline: 20 episodes of uniformly random
    actions, as the lab's strength metric uses; cached under data/.cache)."""

    out = {}
    for row in suite.rows:
        if row.random_score is not None:
            out[row.id] = (row.random_score, 'the suite')
            continue
        first = next(e['trial'] for e in plan if e['row'] == row.id)
        env = json.loads(run_dir.spec_path(first).read_text())['env']
        out[row.id] = (random_baseline(env, cache_dir=baseline_cache_dir(run_dir.root.parent)),
                       'the lab\'s random baseline (20 episodes)')
    return out


def aggregate(results: list[dict], randoms: dict[str, tuple[float, str]]) -> dict | None:
    """The IQM of the normalised per-seed scores (stats.normalise: 0 at the row's random score, 1
    at its first reference published at the row's budget under the row's score definition,
    Row.same_terms_reference) of the rows that can be normalised (such a reference, differing from
    the random score, and two or more finished seeds) with its stratified bootstrap interval; None
    when no row can. A row whose references all differ in budget or definition (rl-zoo3's greedy
    episodes beside a training average) is left out: scaled by them, its score would mean another
    thing than the other rows'."""
    used, normalised = [], []
    for r in results:
        row: Row = r['row']
        kept = [v for v in r['scores'] if v is not None and math.isfinite(v)]
        random = randoms.get(row.id, (None, ''))[0]
        ref = row.same_terms_reference()
        if random is None or ref is None or ref.value == random or len(kept) < 2:
            continue
        used.append(row.id)
        normalised.append([stats.normalise(v, random, ref.value) for v in kept])
    if not used:
        return None
    low, high = stats.stratified_bootstrap_interval(normalised)
    return {'rows': used, 'iqm': stats.iqm(np.concatenate([np.asarray(n) for n in normalised])), 'low': low,
            'high': high, 'runs': sum(len(n) for n in normalised),
            'random': {row_id: randoms[row_id] for row_id in used}}


def _f(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return 'n/a'
    return f'{value:,.{digits}f}'


def _frames(n: int | None) -> str:
    if n is None:
        return 'n/a'
    if n >= 1_000_000 and n % 100_000 == 0:
        return f'{n / 1e6:g}M'
    if n >= 1000 and n % 1000 == 0:
        return f'{n // 1000}k'
    return f'{n:,}'


VERDICT_WORDS = {stats.ABOVE: 'reference above the interval', stats.INSIDE: 'reference inside the interval',
                 stats.BELOW: 'reference below the interval'}


def row_records(results: list[dict]) -> list[dict]:
    """The rows of the report as flat records (ROW_COLUMNS): one per row and reference, or one for
    a row without references. report.csv holds them, and the row table is drawn from them alone,
    so that tools/benchmark_table.py draws the same table from a report.csv."""
    out = []
    for r in results:
        row: Row = r['row']
        base = {'row': row.id, 'env': row.env, 'algorithm': row.algorithm, 'spec_name': row.spec_name,
                'max_frame': row.max_frame, 'score': row.score, 'seeds': len(r['scores']),
                'unfinished': r['unfinished'],
                'seed_scores': ' '.join('-' if v is None else repr(v) for v in r['scores']),
                'mean': r['mean'], 'ci95_low': r['low'], 'ci95_high': r['high'], 'note': row.note}
        refs = list(zip(row.references, r['verdicts'])) or [(None, None)]
        for ref, verdict in refs:
            reference = {key: None for key in ROW_COLUMNS if key.startswith('reference')} if ref is None else {
                'reference': ref.value, 'reference_source': ref.source, 'reference_max_frame': ref.max_frame,
                'reference_score': ref.score, 'reference_seeds': ref.seeds, 'reference_note': ref.note}
            out.append({**base, **reference, 'verdict': verdict})
    return out


def _num(value) -> float | None:
    """A record's number: None for None, '' or NaN (a CSV cell read back is a string)."""
    if value is None or value == '':
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def row_table(records: list[dict]) -> str:
    """The Markdown table of the rows (from row_records, or report.csv's rows read back): one line
    per row and reference; a row's cells are left empty on its second reference's line."""
    head = ['env', 'algorithm', 'row', 'frames', 'score', 'per seed', 'mean', '95% CI', 'reference', 'source',
            'ref. frames', 'ref. score', 'verdict']
    lines = ['| ' + ' | '.join(head) + ' |',
             '|' + '|'.join(['---'] * 3 + ['---:'] + ['---'] * 2 + ['---:'] * 3 + ['---', '---:', '---', '---']) + '|']
    previous = None
    for rec in records:
        scores = [None if v == '-' else float(v) for v in str(rec['seed_scores'] or '').split()]
        per_seed = ', '.join(_f(v) if v is not None else '-' for v in scores)
        if int(rec.get('unfinished') or 0):
            per_seed += f" ({rec['unfinished']} unfinished)"
        low, high = _num(rec['ci95_low']), _num(rec['ci95_high'])
        ci = f'[{_f(low)}, {_f(high)}]' if low is not None else 'n/a'
        base = [rec['env'], rec['algorithm'], f"`{rec['row']}`", _frames(int(float(rec['max_frame']))), rec['score'],
                per_seed, _f(_num(rec['mean'])), ci]
        if rec['row'] == previous:
            base = [''] * len(base)
        previous = rec['row']
        value = _num(rec.get('reference'))
        if value is None:
            lines.append('| ' + ' | '.join(base + ['none', rec.get('note') or '', '', '', 'n/a']) + ' |')
            continue
        ref_frames = _num(rec.get('reference_max_frame'))
        ref_score = rec.get('reference_score') or None
        same = ref_frames in (None, float(rec['max_frame'])) and ref_score in (None, rec['score'])
        word = VERDICT_WORDS.get(rec.get('verdict') or None, 'n/a (fewer than 2 seeds)')
        seeds = _num(rec.get('reference_seeds'))
        note = rec.get('reference_note') or ''
        lines.append('| ' + ' | '.join(base + [
            _f(value), rec['reference_source'] + (f' ({note})' if note else ''),
            _frames(None if ref_frames is None else int(ref_frames)),
            (ref_score or 'not stated') + (f', {int(seeds)} seed{"s" if seeds > 1 else ""}' if seeds else ''),
            word + ('' if same or word.startswith('n/a') else ' (a different budget or definition)')]) + ' |')
    return '\n'.join(lines) + '\n'


def markdown(suite: Suite, results: list[dict], agg: dict | None, run_dir: RunDir | None = None) -> str:
    """The whole report in Markdown."""
    parts = [f'# Benchmark {suite.name}\n']
    if suite.description:
        parts.append(suite.description.strip() + '\n')
    if run_dir is not None:
        parts.append(f'Directory: `{run_dir.root}`\n')
    parts.append(row_table(row_records(results)))
    parts.append('A row\'s interval is the 95% percentile bootstrap interval of the mean over its seeds (10,000 '
                 'resamples); a verdict says where the reference lies against it.\n')
    used = sorted({r['row'].score for r in results})
    parts.append('Scores:\n' + ''.join(f'- `{name}`: {SCORES[name]}\n' for name in used))
    if agg is None:
        parts.append('Aggregate: none (no row has a reference at its budget and definition and two finished seeds).\n')
    else:
        parts.append(f"Aggregate over {len(agg['rows'])} row(s), {agg['runs']} runs: interquartile mean of the "
                     f"normalised scores (score - random) / (reference - random), as rliable computes it: "
                     f"**{_f(agg['iqm'], 3)}** (95% stratified bootstrap interval [{_f(agg['low'], 3)}, "
                     f"{_f(agg['high'], 3)}]); 1 is the references' level, 0 a random policy's. Rows: "
                     f"{', '.join(agg['rows'])}. Random scores: "
                     + '; '.join(f'{row} {_f(value)} ({source})' for row, (value, source) in agg['random'].items())
                     + '.\n')
    return '\n'.join(parts)


def rows_csv(records: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=ROW_COLUMNS, lineterminator='\n')
    writer.writeheader()
    for rec in records:
        writer.writerow(rec)
    return out.getvalue()


def seeds_csv(seeds: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=SEED_COLUMNS, lineterminator='\n')
    writer.writeheader()
    for s in seeds:
        writer.writerow({**s, 'score': '' if s['score'] is None else repr(s['score'])})
    return out.getvalue()


def curve_band(aligned: np.ndarray, confidence: float = stats.CONFIDENCE, resamples: int = 1000,
               seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per frame, the mean over seeds (rows of `aligned`, NaN where a seed has no value) and the
    percentile bootstrap interval of that mean (one seed: the band is the line)."""
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', RuntimeWarning)  # an all-NaN column gives NaN, as wanted
        mean = np.nanmean(aligned, axis=0)
        if aligned.shape[0] < 2:
            return mean, mean, mean
        rng = np.random.default_rng(seed)
        idx = rng.integers(0, aligned.shape[0], size=(resamples, aligned.shape[0]))
        means = np.nanmean(aligned[idx], axis=1)  # (resamples, frames)
        low, high = np.nanquantile(means, [(1 - confidence) / 2, (1 + confidence) / 2], axis=0)
    return mean, low, high


def plot_row(run_dir: RunDir, result: dict, seeds: list[dict]) -> list[str]:
    """graph/{suite}_{row}_benchmark_graph.html: each seed's total_reward_ma, their mean with its 95%
    bootstrap band (curve_band), each reference as a horizontal line."""
    import pandas as pd  # noqa: PLC0415 (only the graphs need it)

    row: Row = result['row']
    mine = [s for s in seeds if s['row'] == row.id]
    dfs = [pd.DataFrame(read_rows(run_dir.session_df_path(s['trial'], 0, 'train'))) for s in mine]
    return viz.plot_seeds_band(
        dfs, [f"seed {s['seed']}" for s in mine], curve_band, [(ref.source, ref.value) for ref in row.references],
        f'{row.id}: {row.env or row.spec_name} ({row.algorithm or row.spec_name})',
        str(run_dir.root / 'graph' / f'{run_dir.spec_name}_{row.id}_benchmark_graph'),
        f'95% bootstrap interval of the mean ({len(mine)} seeds)')


def report_texts(run_dir: RunDir, suite: Suite, plan: list[dict]) -> tuple[str, str, str, list[dict], list[dict]]:
    """The report of a benchmark directory as it stands (finished seeds scored, the others counted
    unfinished): (Markdown, report.csv's text, scores.csv's text, the row results, the seeds)."""
    seeds = seed_results(run_dir, suite, plan)
    results = row_results(suite, seeds)
    agg = aggregate(results, random_scores(run_dir, suite, plan))
    return markdown(suite, results, agg, run_dir), rows_csv(row_records(results)), seeds_csv(seeds), results, seeds


def write_report(run_dir: RunDir, suite: Suite, plan: list[dict], graphs: bool = True) -> tuple[str, list[Path]]:
    """Compute the report of a benchmark directory and write it there; (its Markdown, the files)."""
    text, rows_text, seeds_text, results, seeds = report_texts(run_dir, suite, plan)
    folder = run_dir.root / 'benchmark'
    files = [folder / 'report.md', folder / 'report.csv', folder / 'scores.csv']
    atomic_write_text(files[0], text)
    atomic_write_text(files[1], rows_text)
    atomic_write_text(files[2], seeds_text)
    if graphs:
        (run_dir.root / 'graph').mkdir(exist_ok=True)
        for r in results:
            files += [Path(p) for p in plot_row(run_dir, r, seeds)]
    return text, files
