"""Run directories of runs started together (issue 27): `train`s, or `train --fork`s of one run,
started in the same second each get a directory of their own, named as every run is
(data/{spec_name}_{YYYY_MM_DD_HHMMSS}), with meta.experiment_ts saying that name."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import build_spec, write_spec_file
from lab_helpers import RUN_LAB, lab_env, run_dirs, train_csv, tree_digest

from slm_lab import lab, runs
from slm_lab.persistence import resume as resume_lib
from slm_lab.persistence.run_dir import TS_FORMAT, new_experiment_ts, next_second

NAME = 'together'
# a child that imports the lab, says it is ready and waits for the others, then runs the command
# line; with a timestamp given, each child's first pick is that one (as when every run read the
# clock in the same second before any had made its directory), so the renames are sure to collide
DRIVER = """
import os, sys, time
from slm_lab import branch, runs
from slm_lab.persistence import run_dir
import run_lab
barrier, count, ts, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
if ts != '-':
    def same_second(data_dir, spec_name, after=None):
        return ts if after is None else run_dir.new_experiment_ts(data_dir, spec_name, after=after)
    runs.new_experiment_ts = branch.new_experiment_ts = same_second
open(os.path.join(barrier, str(os.getpid())), 'w').close()
deadline = time.time() + 240
while len(os.listdir(barrier)) < count and time.time() < deadline:
    time.sleep(0.002)
sys.exit(run_lab.main(argv))
"""


def start_together(cwd: Path, commands: list[list[str]], ts: str | None) -> list[subprocess.CompletedProcess]:
    """Run each command line in its own process, all released at the same instant (their imports
    done); their results once all have ended."""
    driver = cwd / 'driver.py'
    driver.write_text(DRIVER)
    barrier = Path(tempfile.mkdtemp(dir=cwd, prefix='barrier'))
    env = {**lab_env(), 'PYTHONPATH': os.pathsep.join([str(Path(RUN_LAB).parent), os.environ.get('PYTHONPATH', '')])}
    procs = [subprocess.Popen([sys.executable, str(driver), str(barrier), str(len(commands)), ts or '-', *argv],
                              cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for argv in commands]
    done = []
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, '', err))
    return done


def check_runs(data: Path, runs: list[Path], frame: int) -> None:
    """Each run is whole (its records reach `frame`), its specs name its directory, and nothing
    half-made is left in data/."""
    for run in runs:
        ts = run.name[len(NAME) + 1:]
        time.strptime(ts, TS_FORMAT)
        for spec in (f'{NAME}_spec.json', f'{NAME}_t0_spec.json', f'{NAME}_t0_s0_spec.json'):
            assert json.loads((run / spec).read_text())['meta']['experiment_ts'] == ts, (run, spec)
        assert train_csv(run, NAME)['frame'].iloc[-1] == frame
    assert not [p.name for p in data.iterdir() if '.tmp-' in p.name], list(data.iterdir())  # nothing half-made
    # train@latest takes the newest of them, by name
    assert resume_lib.resolve_run_dir('latest', NAME, str(data)).root == max(runs, key=lambda p: p.name)


def test_the_next_free_second_is_taken_and_names_keep_sorting(tmp_path):
    (tmp_path / f'{NAME}_2026_12_31_235959').mkdir()
    (tmp_path / f'{NAME}_2027_01_01_000000').write_text('')  # anything at a name takes it
    assert new_experiment_ts(str(tmp_path), NAME, after='2026_12_31_235958') == '2027_01_01_000001'
    assert next_second('2026_03_29_015959') == '2026_03_29_020000'  # by the name, not the clock: no DST jump


@pytest.mark.slow
@pytest.mark.subprocess
def test_trains_started_together_each_get_their_own_directory(tmp_path):
    """Three `train`s released at once, twice: all succeed, each in its own directory. First every
    run picks the same name (the same second), so two of the three renames collide; then three more
    read the clock as they come (a collision when two land in one second, or on a name the first
    three took), with data/ holding the first three runs."""
    spec_file = write_spec_file(tmp_path / 'spec.json', {NAME: build_spec('PPO', max_frame=256)})
    data = tmp_path / 'data'
    for round_, same_second in enumerate([True, False]):
        ts = time.strftime(TS_FORMAT) if same_second else None
        done = start_together(tmp_path, [[spec_file, NAME, 'train']] * 3, ts)
        for proc in done:
            assert proc.returncode == 0, proc.stderr
        runs = run_dirs(data, NAME)
        assert len(runs) == 3 * (round_ + 1), runs
        if same_second:
            assert f'{NAME}_{ts}' in [r.name for r in runs]
            said = [p.stderr for p in done if 'was taken by a run started at the same time' in p.stderr]
            assert len(said) == 2, [p.stderr for p in done]
    check_runs(data, run_dirs(data, NAME), 256)


@pytest.mark.slow
@pytest.mark.subprocess
def test_forks_of_one_run_started_together_each_get_their_own_directory(tmp_path, no_png):
    """Forks name their directories as trains do (create_run_dir): the forced collision only; the
    clock-read case is the trains' test's. Two forks released at once, each first picking the
    parent's own name: both find it taken by a run that exists (the parent), then pick the same
    next second, where one takes it and the other moves on."""
    spec_file = write_spec_file(tmp_path / 'spec.json', {NAME: build_spec('PPO', max_frame=256)})
    data = tmp_path / 'data'
    lab.run(spec_file, NAME, 'train', data_dir=str(data))
    (parent,) = run_dirs(data, NAME)
    before = tree_digest(parent)
    ts = parent.name[len(NAME) + 1:]
    done = start_together(tmp_path, [[spec_file, NAME, 'train', '--fork', str(parent),
                                      '-s', 'env.max_frame=320']] * 2, ts)
    for proc in done:
        assert proc.returncode == 0, proc.stderr
    forks = [r for r in run_dirs(data, NAME) if r != parent]
    assert len(forks) == 2, forks
    assert sorted(r.name for r in forks) == [f'{NAME}_{next_second(ts)}', f'{NAME}_{next_second(next_second(ts))}']
    for fork in forks:
        lineage = json.loads((fork / f'{NAME}_spec.json').read_text())['meta']['lineage']
        assert Path(lineage['parent']) == parent.resolve()
    check_runs(data, forks, 320)
    assert tree_digest(parent) == before


def test_an_empty_directory_at_the_name_is_not_taken_over(tmp_path, monkeypatch, no_png):
    """A rename onto an empty directory would succeed in silence: the run takes the next name,
    and the directory stays as it was."""
    spec_file = write_spec_file(tmp_path / 'spec.json', {NAME: build_spec('PPO', max_frame=64)})
    data = tmp_path / 'data'
    ts = time.strftime(TS_FORMAT)
    (data / f'{NAME}_{ts}').mkdir(parents=True)
    monkeypatch.setattr(runs, 'new_experiment_ts',
                        lambda d, n, after=None: ts if after is None else new_experiment_ts(d, n, after=after))
    lab.run(spec_file, NAME, 'train', data_dir=str(data))
    empty, run = run_dirs(data, NAME)
    assert empty.name == f'{NAME}_{ts}' and not list(empty.iterdir())
    assert run.name == f'{NAME}_{next_second(ts)}'
    assert json.loads((run / f'{NAME}_t0_s0_spec.json').read_text())['meta']['experiment_ts'] == next_second(ts)
