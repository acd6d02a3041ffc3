"""benchmark / benchmark@latest / benchmark@<dir>: the mode that runs a suite file
(slm_lab.experiment.benchmark) with the lab's checks and run directories (lab.py), called by the
command line (cli.py) and the Python API (slm_lab.benchmark)."""
from __future__ import annotations

import dataclasses
import logging
import os

from slm_lab.experiment.benchmark import SuiteError, read_suite, select
from slm_lab.experiment.benchmark import report as bench_report
from slm_lab.experiment.benchmark.publish import published_pairs, spec_digest
from slm_lab.experiment.benchmark import run as bench_run
from slm_lab.experiment.search import specs as search_specs
from slm_lab.lab import DATA_DIR, check_data_dir, logger
from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import ModeError, ResumeError, SpecError
from slm_lab.options import check_run_options, is_benchmark_mode
from slm_lab.persistence.run_dir import RunDir, create_run_dir, locked_to_continue, new_experiment_ts
from slm_lab.runs import prepare_spec
from slm_lab.spec import load_spec


def benchmark(suite_file: str, mode: str = 'benchmark', rows: list[str] | None = None, seeds: int | None = None,
              data_dir: str = DATA_DIR, ray_address: str | None = None, on_run_dir=None,
              graphs: bool = True, missing_from: str | None = None) -> dict:
    """benchmark / benchmark@latest / benchmark@<dir>: every row x seed of a suite file as a trial
    on Ray Tune (slm_lab.experiment.benchmark), then its report. A new benchmark checks every row
    (its spec loaded at its budget and preflighted) before its directory is made; a continued one
    runs the row-seeds not finished, each from its newest snapshot. Returns {'run_dir', 'report'
    (the Markdown), 'files'}; LabError naming the row-seeds that failed, after the report."""
    check_run_options(mode, ray_address=ray_address, rows=rows, seeds=seeds, missing_from=missing_from)
    if not is_benchmark_mode(mode):
        raise ModeError(f"unknown mode '{mode}' for a suite file; use benchmark, benchmark@latest or "
                        'benchmark@<benchmark dir>')
    search_specs.check_installed('benchmark')
    if ray_address is None:
        ray_address = os.environ.get('RAY_ADDRESS') or None
    if ray_address:
        search_specs.check_ray_address(ray_address)
    suite = read_suite(suite_file)
    data_dir = check_data_dir(data_dir, new_run=mode == 'benchmark')
    lab_logger.setup_console(logging.INFO)
    if mode == 'benchmark':
        suite = select(suite, rows, seeds)
        skip = set()
        if missing_from is not None:
            skip = published_pairs(missing_from, suite)
        plan = bench_run.plan_trials(suite, skip)
        if not plan:
            print(f'every row-seed of the suite{" (these rows)" if rows else ""} is published in {missing_from}: '
                  'nothing to run', flush=True)
            return {'run_dir': None, 'report': '', 'files': []}
        left_out = len(bench_run.plan_trials(suite)) - len(plan)
        # a row whose seeds are all published has nothing to run here, nor to report
        suite = dataclasses.replace(suite, rows=tuple(r for r in suite.rows if any(e['row'] == r.id for e in plan)))
        ts = new_experiment_ts(data_dir, suite.name)
        specs, labelled = {}, []
        for row in suite.rows:
            try:
                row_spec = prepare_spec(row.spec_file, row.spec_name, 'train', row.overrides(0), data_dir)
                digest = spec_digest(row)  # the spec as written: publish refuses seeds of an edited one
                # the report's labels, where the row gives none: the spec's env and algorithm
                labelled.append(dataclasses.replace(row, env=row.env or row_spec['env']['name'],
                                                    algorithm=row.algorithm or row_spec['agent']['name']))
                for entry in (e for e in plan if e['row'] == row.id):
                    loaded = load_spec(row.spec_file, row.spec_name, row.overrides(entry['seed']))
                    specs[entry['trial']] = bench_run.seed_spec(row_spec, loaded, entry['trial'], ts)
                    entry['spec_digest'] = digest
            except SpecError as e:
                raise SuiteError(f'suite file {suite.path}: row {row.id} ({row.spec_file} {row.spec_name}): {e}') \
                    from None
        suite = dataclasses.replace(suite, rows=tuple(labelled))
        stamp = {'meta': {'experiment_ts': ts}}

        def write(staging, _):
            for spec in specs.values():  # the name create_run_dir settled on
                spec['meta']['experiment_ts'] = stamp['meta']['experiment_ts']
            bench_run.write_benchmark(staging, suite, plan, specs)
        lock, run_dir = create_run_dir(RunDir.for_spec(data_dir, suite.name, ts), None, write=write, spec=stamp)
        logger.info(f'run directory {run_dir.root}: benchmark of {len(suite.rows)} row(s), {len(plan)} row-seed(s)'
                    + (f' ({left_out} published in {missing_from} left out)' if left_out else ''))
    else:
        target = mode[len('benchmark@'):]
        run_dir = bench_run.resolve_benchmark(target, suite.name, data_dir)
        if run_dir.spec_name != suite.name:
            raise ResumeError(f"{mode}: {run_dir.root} is a benchmark of suite '{run_dir.spec_name}', not of "
                              f"{suite_file}'s '{suite.name}'")
        with locked_to_continue(run_dir) as lock:
            suite, plan = bench_run.read_benchmark(run_dir)
            for e in plan:  # the row-seeds left to run read their specs as their trials will: refused here, not in Ray
                if not bench_run.finished(run_dir, e['trial']):
                    search_specs.read_trial_spec(run_dir, e['trial'])
        logger.info(f'continuing the benchmark in {run_dir.root}')
    if on_run_dir is not None:
        on_run_dir(run_dir)
    try:
        failed = bench_run.run_trials(run_dir, suite, plan, ray_address)
        text, files = bench_report.write_report(run_dir, suite, plan, graphs=graphs)
    finally:
        lock.close()
    print(text, flush=True)
    for path in files:
        logger.info(f'wrote {path}')
    bench_run.check_failed(run_dir, plan, failed)
    logger.info(f'done: {run_dir.root}')
    return {'run_dir': run_dir.root, 'report': text, 'files': files}
