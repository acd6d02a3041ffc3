"""run_lab.py end to end, as a user runs it: a subprocess in a scratch directory (so data/ lands
in tmp_path). User errors are one line on stderr, a non-zero exit, and no run directory."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
from lab_helpers import cli, lab_env, run_in_process, visible

REPO_ROOT = Path(__file__).resolve().parent.parent
RUN_LAB = str(REPO_ROOT / 'run_lab.py')
DEMO = str(REPO_ROOT / 'spec' / 'demo.json')
DQN_ZOO = str(REPO_ROOT / 'spec' / 'benchmark' / 'dqn' / 'dqn_cartpole_zoo.json')
SHORT = ['-s', 'env.max_frame=256', '-s', 'meta.log_frequency=64', '-s', 'meta.eval_frequency=128',
         '-s', 'meta.random_seed=3']


def run_lab(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return cli(args, cwd, timeout=timeout, env=lab_env())


@pytest.mark.slow
@pytest.mark.subprocess
def test_train_from_the_command_line(tmp_path):
    out = run_lab([DEMO, 'ppo_cartpole', 'train', *SHORT], tmp_path)
    assert out.returncode == 0, out.stderr
    assert 'Traceback' not in out.stderr
    run_dirs = visible(tmp_path / 'data')
    assert len(run_dirs) == 1 and run_dirs[0].name.startswith('ppo_cartpole_')
    run_dir = run_dirs[0]
    df = pd.read_csv(run_dir / 'info' / 'ppo_cartpole_t0_s0_session_df_train.csv')
    assert df['frame'].iloc[-1] == 256
    assert (run_dir / 'info' / 'ppo_cartpole_t0_trial_metrics.json').exists()
    # every graph loads the data directory's one shared copy of plotly.js, so it opens offline and stays small
    graphs = sorted((run_dir / 'graph').glob('*.html'))
    assert [g.name for g in graphs] == ['ppo_cartpole_t0_s0_session_graph.html', 'ppo_cartpole_t0_trial_graph.html']
    (bundle,) = (run_dir.parent / '.plotly').glob('plotly-*.min.js')
    assert bundle.stat().st_size > 1_000_000 and not list(run_dir.rglob('*.js'))
    for graph in graphs:
        assert graph.stat().st_size < 100_000
        assert f'<script charset="utf-8" src="../../.plotly/{bundle.name}">' in graph.read_text()
    meta = json.loads((run_dir / 'ppo_cartpole_spec.json').read_text())['meta']
    assert meta['overrides'] == [a for a in SHORT if a != '-s']
    assert meta['mode'] == 'train'
    assert run_dir.name in out.stderr, 'the log names the run directory'


@pytest.mark.subprocess
def test_help_lists_modes_and_overrides(tmp_path):
    out = run_lab(['--help'], tmp_path, timeout=30)
    assert out.returncode == 0
    for word in ('train', 'dev', 'train@latest', 'enjoy@', 'search', '-s', 'KEY=VALUE'):
        assert word in out.stdout
    assert not (tmp_path / 'data').exists()


@pytest.mark.subprocess
def test_too_few_arguments_is_a_usage_error(tmp_path):
    out = run_lab([DEMO, 'ppo_cartpole'], tmp_path, timeout=30)
    assert out.returncode == 2
    assert 'Traceback' not in out.stderr and 'SPEC_FILE SPEC_NAME MODE' in out.stderr
    assert not (tmp_path / 'data').exists()


# runs run_lab.py as __main__ and prints, at exit, which heavy modules the process imported
IMPORTS_AT_EXIT = """
import atexit, runpy, sys
heavy = ('torch', 'ray', 'pandas', 'plotly')
atexit.register(lambda: print('IMPORTED', *[m for m in heavy if m in sys.modules], file=sys.stderr))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
"""


@pytest.mark.subprocess
@pytest.mark.parametrize('args,expected', [
    ([DEMO, 'ppo_cartpol', 'train'], "spec name 'ppo_cartpol'"),
    ([DEMO, 'ppo_cartpole', 'trian'], "unknown mode 'trian'"),
    ([DEMO, 'ppo_cartpole', 'train', '-s', 'env.max_frme=100'], 'env.max_frme'),
    ([DEMO, 'ppo_cartpole', 'train', '-s', 'meta.max_sesion=2'], 'meta.max_sesion'),
    ([DEMO, 'ppo_cartpole', 'train', '-s', 'env.name=CartPol-v1'], 'CartPole-v1'),
], ids=['spec name', 'mode', 'env key', 'meta key', 'env name'])
def test_a_typo_fails_without_importing_torch(tmp_path, args, expected):
    # a typo's line comes in a fraction of a second: torch (1-2 s to import), Ray, pandas and
    # plotly wait until a spec is known to be good (the agent's keys, checked against its
    # classes' schemas, still import torch)
    out = subprocess.run([sys.executable, '-c', IMPORTS_AT_EXIT, RUN_LAB, *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, env={**lab_env(), 'PYTHONPATH': str(REPO_ROOT)})
    assert out.returncode == 2, out.stderr
    error, imported = out.stderr.strip().splitlines()
    assert error.startswith('error: ') and expected in error
    assert imported == 'IMPORTED', f'a typo imported {imported.split()[1:]}'
    assert not (tmp_path / 'data').exists()


def write_bad_json(tmp_path: Path) -> str:
    path = tmp_path / 'bad.json'
    path.write_text('{"s": {"agent": {"name": "PPO"},,}}')
    return str(path)


USER_ERRORS = {
    'misspelled key': ([DEMO, 'ppo_cartpole', 'train', '-s', 'agent.algorithm.gama=0.9'], 'agent.algorithm.gama'),
    'unknown algorithm': ([DEMO, 'ppo_cartpole', 'train', '-s', 'agent.algorithm.name=PPOO'], 'Reinforce'),
    'unknown env': ([DEMO, 'ppo_cartpole', 'train', '-s', 'env.name=CartPol-v1'], 'CartPole-v1'),
    'wrong type': ([DEMO, 'ppo_cartpole', 'train', '-s', 'env.max_frame=abc'], 'env.max_frame'),
    'negative max_frame': ([DEMO, 'ppo_cartpole', 'train', '-s', 'env.max_frame=-5'], 'env.max_frame'),
    'override without =': ([DEMO, 'ppo_cartpole', 'train', '-s', 'env.max_frame'], 'KEY=VALUE'),
    'malformed JSON': ([write_bad_json, 's', 'train'], 'line 1 column'),
    'spec name not in file': ([DEMO, 'ppo_cartpol', 'train'], 'ppo_cartpole'),
    'missing file': (['nope.json', 'ppo_cartpole', 'train'], 'nope.json'),
    'algorithm does not fit env': ([DQN_ZOO, 'dqn_cartpole_zoo', 'train', '-s', 'env.name=Pendulum-v1'],
                                   'continuous'),
    'unknown mode': ([DEMO, 'ppo_cartpole', 'trian'], 'dev, train'),
    # resume and replay of runs that do not exist
    'resume latest without a run': ([DEMO, 'ppo_cartpole', 'train@latest'], 'train@latest'),
    'resume a missing run dir': ([DEMO, 'ppo_cartpole', 'train@data/ppo_cartpole_2020_01_01_000000'],
                                 'ppo_cartpole_2020_01_01_000000'),
    'enjoy a missing session': (['enjoy@data/x_2020_01_01_000000/x_t0_s0_spec.json'], 'x_t0_s0_spec.json'),
    'enjoy a file that is not a session spec': (['enjoy@' + DEMO], 'demo.json'),
    'enjoy a directory': (['enjoy@' + str(REPO_ROOT / 'spec')], 'is a directory'),
    # enjoy@ replays the session's own spec: anything that would change it is refused, not ignored
    'enjoy with a spec file and name': ([DEMO, 'ppo_cartpole', 'enjoy@data/x_2020_01_01_000000/x_t0_s0_spec.json'],
                                        'only argument'),
    'enjoy with -s': (['enjoy@data/x_2020_01_01_000000/x_t0_s0_spec.json', '-s', 'env.max_frame=5'], '-s/--set'),
    'enjoy with --force': (['enjoy@data/x_2020_01_01_000000/x_t0_s0_spec.json', '--force'], '--force'),
    'enjoy options with train': ([DEMO, 'ppo_cartpole', 'train', '--episodes', '3', '--ckpt', 'latest'],
                                 '--episodes only apply to enjoy@<session spec>, and --ckpt picks the weights that '
                                 '--warm-start RUN_DIR or enjoy@<session spec> load'),
    'search': ([DEMO, 'ppo_cartpole', 'search'], 'has no search block'),
}


# the cases also run as real commands (the rest run in this process, through the same code after
# the interpreter's start: cli.run_main): a spec key, a file that is not JSON, a path that is a folder
IN_A_PROCESS_OF_THEIR_OWN = ('misspelled key', 'malformed JSON', 'enjoy a directory')


def assert_one_line_error(code: int, stderr: str, expected: str, cwd: Path) -> None:
    assert code not in (0, None)
    assert 'Traceback' not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f'stderr must be one line, got:\n{stderr}'
    assert lines[0].startswith('error: ') and expected in lines[0]
    assert not (cwd / 'data').exists(), 'a user error must not create a run directory'


@pytest.fixture(scope='module')
def user_error_runs(tmp_path_factory):
    """The IN_A_PROCESS_OF_THEIR_OWN cases run as subprocesses, each in its own scratch directory;
    started together (one per core) since each pays the lab's ~2 s import time. {case: (result, cwd)}."""
    def run_case(case: str):
        cwd = tmp_path_factory.mktemp(re.sub(r'\W+', '_', case))
        args = [a(cwd) if callable(a) else a for a in USER_ERRORS[case][0]]
        return run_lab(args, cwd, timeout=120), cwd
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        futures = {case: pool.submit(run_case, case) for case in IN_A_PROCESS_OF_THEIR_OWN}
        yield {case: future.result() for case, future in futures.items()}


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize('case', IN_A_PROCESS_OF_THEIR_OWN)
def test_user_error_is_one_line_and_creates_nothing(user_error_runs, case):
    out, cwd = user_error_runs[case]
    assert_one_line_error(out.returncode, out.stderr, USER_ERRORS[case][1], cwd)


@pytest.mark.parametrize('case', list(USER_ERRORS))
def test_user_error_in_process_is_one_line_and_creates_nothing(tmp_path, capsys, case):
    args = [a(tmp_path) if callable(a) else a for a in USER_ERRORS[case][0]]
    code, stderr = run_in_process(args, tmp_path, capsys)
    assert_one_line_error(code, stderr, USER_ERRORS[case][1], tmp_path)


ENDLESS_DEMO = [sys.executable, RUN_LAB, DEMO, 'ppo_cartpole', 'train', '-s', 'env.max_frame=100000000',
                '-s', 'meta.log_frequency=256']


def train_csv_of(proc: subprocess.Popen, cwd: Path, deadline: float) -> Path:
    """The train CSV of the run `proc` makes in `cwd`, once it appears (before `deadline`)."""
    csvs = []
    while not csvs and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
        csvs = list(cwd.glob('data/*/info/*_session_df_train.csv'))
    assert csvs, 'the train CSV never appeared'
    return csvs[0]


@pytest.mark.slow
@pytest.mark.subprocess
def test_ctrl_c_stops_promptly_and_keeps_the_records(tmp_path):
    proc = subprocess.Popen(ENDLESS_DEMO, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=lab_env())
    try:
        csvs = [train_csv_of(proc, tmp_path, time.monotonic() + 90)]
        time.sleep(0.5)  # a few more rows
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        # a few seconds on a quiet machine (the step, a snapshot, the records); loose for a loaded one
        assert time.monotonic() - sent < 30, 'Ctrl-C must stop the run promptly'
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr  # 128 + SIGINT, as documented in --help
    assert 'Traceback' not in stderr
    df = pd.read_csv(csvs[0])
    assert len(df) >= 1 and 0 < df['frame'].iloc[-1] < 100000000
    assert df['frame'].is_monotonic_increasing
    run_dir = csvs[0].parents[1]
    assert list(run_dir.glob('model/*_model_latest.pt')), 'the latest model is saved on Ctrl-C'


@pytest.mark.slow
@pytest.mark.subprocess
def test_an_ignored_sigint_stays_ignored_while_training_and_sigterm_stops_the_run(tmp_path):
    """A background job of a shell (`python run_lab.py ... &` in a script) starts with SIGINT
    ignored: a terminal's Ctrl-C is not for it. The lab keeps it so in training too, as it does
    before training, and SIGTERM stops the run with its snapshot."""
    background = ['sh', '-c', 'trap "" INT; exec "$@"', 'sh']  # as a script's `cmd &` starts it
    proc = subprocess.Popen(background + ENDLESS_DEMO, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=lab_env())
    try:
        deadline = time.monotonic() + 90
        csvs = [train_csv_of(proc, tmp_path, deadline)]
        rows = len(pd.read_csv(csvs[0]))
        proc.send_signal(signal.SIGINT)
        while len(pd.read_csv(csvs[0])) < rows + 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)  # it trains on: more rows come
        assert proc.poll() is None, 'an ignored SIGINT must not stop the run'
        assert len(pd.read_csv(csvs[0])) >= rows + 2, 'the run stopped training after an ignored SIGINT'
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, stderr
    assert 'SIGINT' not in stderr and 'Traceback' not in stderr, stderr
    assert list(csvs[0].parents[1].glob('ckpt/**/MANIFEST.json')), 'SIGTERM saves a snapshot'
