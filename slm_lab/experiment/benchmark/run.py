"""A benchmark's directory and its row-seeds run as Ray Tune trials, on the engine search mode uses
(search/driver.run_on_ray, search/tune: each trial an ordinary Trial in a search/trial.py process, with
its snapshots; a stop signal saves them; search/trial.py continues a trial from them).

    data/{suite}_{timestamp}/
      benchmark/suite.json          the suite as it runs (rows narrowed by --rows, seeds by --seeds)
      benchmark/plan.json           trial i = (row, seed, max_frame, the spec_digest of its row), in row order
                                    then seed order
      {suite}_t{i}_spec.json        trial i's spec: the row's spec at its budget, one session whose
      {suite}_t{i}_s0_spec.json     random_seed is the seed (meta.session 0 keeps it as it is)
      info/ model/ ckpt/ log/ graph/ tb/   the trials' files, as train writes them
      search/                       Ray's and Tune's files, the stop files (as a search's)
      benchmark/report.md, report.csv, graph/   the report (report.py)

A trial is finished when its trial metrics exist; a continued benchmark runs only the others, each
from its newest snapshot."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

from slm_lab.experiment.benchmark.suite import FOLDER, Suite, SuiteError, is_benchmark_run, read_saved, suite_to_dict
from slm_lab.experiment.search.driver import run_on_ray, trial_resources, tune_trials
from slm_lab.experiment.search.tune import make_queue_searcher
from slm_lab.experiment.search.watch import SearchWatch
from slm_lab.experiment.trial import Trial
from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import LabError, ResumeError
from slm_lab.lib.io import read_json, write_json
from slm_lab.persistence.run_dir import RunDir

logger = lab_logger.get_logger('slm_lab.benchmark')


def plan_trials(suite: Suite, skip: set[tuple[str, int]] = frozenset()) -> list[dict]:
    """Trial i of the benchmark: {'trial', 'row', 'seed', 'max_frame'}, rows in suite order, each
    row's seeds 0..seeds-1 (a seed is the session's random_seed), less the (row, seed) pairs in
    `skip` (those published already: --missing-from)."""
    plan = []
    for row in suite.rows:
        for seed in range(row.seeds):
            if (row.id, seed) in skip:
                continue
            plan.append({'trial': len(plan), 'row': row.id, 'seed': seed, 'max_frame': row.max_frame})
    return plan


def seed_spec(row_spec: dict, seed_spec_loaded: dict, trial: int, experiment_ts: str) -> dict:
    """Trial `trial`'s spec: the seed's spec as loaded (its overrides recorded) with the run's meta
    from the row's prepared spec (versions, the replay decision), one session, meta.session 0 so
    that the session's seed is random_seed itself rather than random_seed + 1000 * trial."""
    spec = copy.deepcopy(seed_spec_loaded)
    for key in ('lab_version', 'git_sha', 'mode', 'snapshot_replay_auto'):
        if key in row_spec['meta']:
            spec['meta'][key] = copy.deepcopy(row_spec['meta'][key])
    spec['meta'].update(trial=trial, session=0, experiment_ts=experiment_ts, max_session=1)
    return spec


def write_benchmark(staging: RunDir, suite: Suite, plan: list[dict], specs: dict[int, dict]) -> None:
    """The benchmark's files in its (staging) directory: the suite, the plan, each trial's specs."""
    (staging.root / FOLDER).mkdir()
    (staging.root / 'search').mkdir()
    write_json(staging.root / FOLDER / 'suite.json', suite_to_dict(suite))
    write_json(staging.root / FOLDER / 'plan.json', plan)
    for entry in plan:
        i = entry['trial']
        trial = Trial(specs[i], staging, 'train', trial=i)
        write_json(staging.spec_path(i, 0), trial.session_spec(0))
        write_json(staging.spec_path(i), specs[i])


def resolve_benchmark(target: str, suite_name: str, data_dir: str) -> RunDir:
    """The benchmark directory named by benchmark@<target>: 'latest' (the newest of this suite
    under data_dir, by the timestamp in its name) or a path."""
    said = f'benchmark@{target}'
    if target == 'latest':
        pattern = re.compile(re.escape(suite_name) + r'_\d{4}_\d{2}_\d{2}_\d{6}$')
        root = Path(data_dir)
        runs = sorted((p for p in root.iterdir() if pattern.match(p.name) and is_benchmark_run(p)),
                      key=lambda p: p.name[-17:]) if root.is_dir() else []
        if not runs:
            raise ResumeError(f"{said}: no benchmark of suite '{suite_name}' in {data_dir}/; start one with: "
                              'python run_lab.py SUITE_FILE benchmark')
        return RunDir(runs[-1], suite_name)
    root = Path(target.rstrip('/') or '/')
    if not root.is_dir():
        raise ResumeError(f'{said}: no such directory; give a benchmark directory (data/{{suite}}_{{timestamp}}) '
                          'or latest')
    if not is_benchmark_run(root):
        raise ResumeError(f'{said}: {root} is not a benchmark directory (no {FOLDER}/plan.json); a train run '
                          'continues with train@, a search with search@')
    saved = read_json(root / FOLDER / 'suite.json')
    return RunDir(root, saved['name'])


def read_benchmark(run_dir: RunDir) -> tuple[Suite, list[dict]]:
    """The suite and plan a benchmark directory holds."""
    try:
        suite, plan = read_saved(run_dir.root)
    except (OSError, ValueError) as e:
        raise ResumeError(f'{run_dir.root}: its {FOLDER}/ files cannot be read ({type(e).__name__}: {e}); the '
                          'benchmark directory is damaged') from None
    except SuiteError as e:
        raise ResumeError(f'{run_dir.root}: {e}') from None
    return suite, plan


def finished(run_dir: RunDir, trial: int) -> bool:
    return run_dir.trial_metrics_path(trial).exists()


def run_trials(run_dir: RunDir, suite: Suite, plan: list[dict], ray_address: str | None) -> list[int]:
    """Run every unfinished trial of the plan on Ray Tune (local, or the cluster at ray_address),
    in plan order; Preempted on a stop signal, once the running trials saved snapshots. Returns
    the trials that ended unfinished (an error: their logs under log/)."""
    todo = [e for e in plan if not finished(run_dir, e['trial'])]
    kept = len(plan) - len(todo)
    if kept:
        logger.info(f'{kept} of {len(plan)} row-seeds finished before (kept); {len(todo)} to run')
    if not todo:
        return []
    local = not ray_address
    per_row = {r.id: trial_resources({'search_resources': r.resources}, local) for r in suite.rows}

    def resources(config: dict):
        from ray.tune import PlacementGroupFactory  # noqa: PLC0415 the search extra, found by check_installed
        asked = per_row[config['values']['row']]
        bundle = {'CPU': asked['cpu'], **({'GPU': asked['gpu']} if asked['gpu'] else {})}
        return PlacementGroupFactory([bundle])

    configs = [{'trial': e['trial'], 'values': {'row': e['row'], 'seed': e['seed']}, 'replay': False, 'until': None,
                'max_frame': e['max_frame'], 'max_session': 1} for e in todo]
    log_frequency = min(json.loads(run_dir.spec_path(e['trial']).read_text())['meta']['log_frequency'] for e in todo)

    def fit(stop):
        watch = SearchWatch(len(todo), max(e['max_frame'] for e in todo), log_frequency,
                            stopping=lambda: stop.requested, label='benchmark',
                            finished=lambda index: finished(run_dir, index))
        tune_trials(run_dir, make_queue_searcher(configs, stopping=lambda: stop.requested), watch,
                    num_samples=len(todo), resources=resources)
    run_on_ray(run_dir, ray_address, fit)
    return [e['trial'] for e in todo if not finished(run_dir, e['trial'])]


def check_failed(run_dir: RunDir, plan: list[dict], failed: list[int]) -> None:
    """LabError naming the row-seeds that ended with an error (the report has been written without them)."""
    if failed:
        names = ', '.join(f"t{e['trial']} ({e['row']} seed {e['seed']})" for e in plan if e['trial'] in failed)
        raise LabError(f'{len(failed)} row-seed(s) ended with an error: {names}; see '
                       f'{run_dir.root / "log"}/{run_dir.spec_name}_t{{i}}_process.log; benchmark@{run_dir.root} runs '
                       'them again (from their snapshots)')
