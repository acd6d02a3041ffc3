"""Put a benchmark report's row table into a Markdown document (docs/BENCHMARKS.md), so that the
table there is generated from the report, never typed.

    python -m tools.benchmark_table REPORT               print the table
    python -m tools.benchmark_table REPORT --write       replace the suite's table in docs/BENCHMARKS.md
    python -m tools.benchmark_table REPORT --check       exit 1 when the document's table differs

REPORT is a benchmark directory (data/{suite}_{timestamp}: its benchmark/report.csv) or a
report.csv itself (a copy kept under docs/benchmarks/). The table is report.row_table of the CSV's
records: the very table benchmark/report.md holds. In the document it sits between two markers
naming the suite (the suite name is the benchmark directory's, or --suite):

    <!-- benchmark-table: slm_lab_v5_cpu -->
    ...
    <!-- /benchmark-table: slm_lab_v5_cpu -->

Run from the repository root. Not part of the lab: nothing under slm_lab/ imports it."""
from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

from slm_lab.experiment.benchmark.report import row_table
from slm_lab.lib.io import atomic_write_text

DOC_PATH = Path(__file__).resolve().parent.parent / 'docs' / 'BENCHMARKS.md'


def read_report(path: Path) -> tuple[list[dict], str | None]:
    """(the records of a report.csv, the suite's name when the path is a benchmark directory)."""
    name = None
    if path.is_dir():
        suite = path / 'benchmark' / 'suite.json'
        name = json.loads(suite.read_text())['name'] if suite.is_file() else None
        path = path / 'benchmark' / 'report.csv'
    with open(path, newline='', encoding='utf-8') as f:
        return list(csv.DictReader(f)), name


def markers(suite: str) -> tuple[str, str]:
    return f'<!-- benchmark-table: {suite} -->', f'<!-- /benchmark-table: {suite} -->'


def replace_table(doc: str, suite: str, table: str) -> str:
    """`doc` with the text between the suite's markers replaced by `table`; ValueError when the
    markers are not there."""
    begin, end = markers(suite)
    pattern = re.compile(re.escape(begin) + r'\n.*?' + re.escape(end), re.S)
    if not pattern.search(doc):
        raise ValueError(f'no {begin} ... {end} block in the document: add the two lines where the table goes')
    return pattern.sub(lambda _: f'{begin}\n{table}{end}', doc, count=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog='python -m tools.benchmark_table', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('report', help='a benchmark directory or its benchmark/report.csv')
    parser.add_argument('--suite', help="the suite's name in the markers (default: the benchmark directory's)")
    parser.add_argument('--doc', default=str(DOC_PATH), help='the document (default docs/BENCHMARKS.md)')
    group = parser.add_mutually_exclusive_group()
    group.add_argument('--write', action='store_true', help="replace the suite's table in the document")
    group.add_argument('--check', action='store_true', help="exit 1 when the document's table differs")
    args = parser.parse_args(argv)
    try:
        records, name = read_report(Path(args.report))
    except (OSError, ValueError, KeyError) as e:
        print(f'error: {args.report}: no readable report ({type(e).__name__}: {e}); give a benchmark directory or '
              'its benchmark/report.csv', file=sys.stderr)
        return 2
    table = row_table(records)
    if not (args.write or args.check):
        print(table, end='')
        return 0
    suite = args.suite or name
    if suite is None:
        print('error: name the suite with --suite (a report.csv alone does not say it)', file=sys.stderr)
        return 2
    doc_path = Path(args.doc)
    doc = doc_path.read_text(encoding='utf-8')
    try:
        new = replace_table(doc, suite, table)
    except ValueError as e:
        print(f'error: {doc_path}: {e}', file=sys.stderr)
        return 2
    if args.check:
        if new != doc:
            print(f'{doc_path}: the {suite} table differs from {args.report}; run with --write', file=sys.stderr)
            return 1
        return 0
    atomic_write_text(doc_path, new)
    print(f'wrote the {suite} table into {doc_path}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
