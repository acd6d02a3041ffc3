"""The `slm-lab` console command as a user gets it: `pip install -e .` into a fresh venv, then
`slm-lab run ... --set ...` and `slm-lab plot -f ...` from that venv's bin/. The venv reuses this
interpreter's packages (torch, gymnasium) through a .pth file, so the install is offline and
takes seconds; the lab itself is installed from a copy of the repository (its build files stay
out of the working tree)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from lab_helpers import cli, lab_env, visible

ROOT = Path(__file__).resolve().parents[1]
DEMO = str(ROOT / 'spec' / 'demo.json')


def fresh_venv(tmp_path: Path) -> Path:
    """A venv with `slm-lab` installed by pip install -e from a copy of the repository; its bin/."""
    venv, src = tmp_path / 'venv', tmp_path / 'src'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True)
    (site,) = venv.glob('lib/python*/site-packages')
    (site / '_reuse_test_env.pth').write_text(sysconfig.get_paths()['purelib'] + '\n')
    src.mkdir()
    for name in ('pyproject.toml', 'README.md'):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / 'slm_lab', src / 'slm_lab', ignore=shutil.ignore_patterns('__pycache__'))
    subprocess.run([sys.executable, '-m', 'pip', '--python', str(venv / 'bin' / 'python'), 'install', '-q',
                    '--no-deps', '--no-build-isolation', '--no-index', '-e', str(src)], check=True, timeout=300)
    return venv / 'bin'


@pytest.mark.slow
@pytest.mark.subprocess
def test_slm_lab_run_and_plot_after_pip_install_in_a_fresh_venv(tmp_path):
    pytest.importorskip('setuptools', minversion='68', reason='pip --no-build-isolation builds the lab with this '
                        "environment's setuptools (requirements-test.txt)")
    bin_dir = fresh_venv(tmp_path)
    work = tmp_path / 'work'
    work.mkdir()
    where = subprocess.run([str(bin_dir / 'python'), '-c', 'import slm_lab; print(slm_lab.__file__)'], cwd=work,
                           capture_output=True, text=True, check=True)
    assert where.stdout.strip().startswith(str(tmp_path / 'src')), where.stdout  # the installed lab, not the repo's

    def slm_lab(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([str(bin_dir / 'slm-lab'), *args], cwd=work, capture_output=True, text=True,
                              timeout=timeout, env=lab_env())

    out = slm_lab('--help')
    assert out.returncode == 0
    for word in ('run', 'plot', 'dev', 'train@latest', 'train@<run dir>', 'enjoy@', 'search@latest', '--set'):
        assert word in out.stdout, word
    out = slm_lab('run', '--help')
    assert out.returncode == 0 and 'slm-lab run spec/demo.json ppo_cartpole train' in out.stdout
    assert 'minute' not in out.stdout  # no timing it does not measure

    out = slm_lab('run', DEMO, 'ppo_cartpole', 'dev', '--set', 'env.max_frame=200', '--set', 'meta.log_frequency=100')
    assert out.returncode == 0, out.stderr[-2000:]
    (run,) = visible(work / 'data')
    assert run.name.startswith('ppo_cartpole_') and (run / 'info' / 'ppo_cartpole_t0_s0_session_df_train.csv').exists()

    # the same errors and exit codes as run_lab.py, word for word
    for args in ([DEMO, 'ppo_cartpole', 'trian'], [DEMO, 'ppo_cartpole', 'train', '--set', 'env.max_frame=abc']):
        ours, theirs = slm_lab('run', *args), cli(args, work, env=lab_env())
        assert ours.returncode == theirs.returncode == 2
        assert ours.stderr == theirs.stderr and len(ours.stderr.strip().splitlines()) == 1

    (work / 'plots').mkdir()  # -o writes into a directory that exists
    out = slm_lab('plot', '-f', f'data/{run.name}', '-l', 'dev run', '-t', 'demo', '-o', 'plots/demo.html')
    assert out.returncode == 0, out.stderr
    page = (work / 'plots' / 'demo.html').read_text()
    assert 'dev run (1 session)' in page and list((work / 'plots').glob('plotly-*.min.js'))

    out = slm_lab('plot', '-f', 'data/no_such_run')
    assert out.returncode == 2 and out.stderr.startswith('error: -f data/no_such_run: no such run directory')
    out = slm_lab('unknown')
    assert out.returncode == 2 and 'run, plot, report, benchmark and publish' in out.stderr
    # slm-lab benchmark SUITE_FILE is run_lab.py's SUITE_FILE benchmark (its errors too)
    ours, theirs = slm_lab('benchmark', 'no_suite.json'), cli(['no_suite.json', 'benchmark'], work, env=lab_env())
    assert ours.returncode == theirs.returncode == 2 and ours.stderr == theirs.stderr
    assert ours.stderr.startswith('error: suite file no_suite.json not found'), ours.stderr
