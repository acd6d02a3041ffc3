"""slm_lab.run, the Python API: a spec file or a spec dict in, the run directory and metrics out;
the command line's checks as the lab's own exceptions; `import slm_lab` stays cheap."""
from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from lab_helpers import PPO, ROOT, cli, lab_env

import slm_lab
from slm_lab.api import RunResult
from slm_lab.lib.errors import ModeError, ResumeError, SpecError



def spec_body() -> dict:
    spec = copy.deepcopy(PPO)
    spec['env']['max_frame'] = 256
    spec['meta'].update(log_frequency=64, eval_frequency=128)
    return spec


def test_import_slm_lab_loads_no_torch():
    code = 'import sys, slm_lab; assert callable(slm_lab.run); print(sorted(m for m in ("torch", "gymnasium", ' \
           '"pandas", "ray") if m in sys.modules))'
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == '[]'


@pytest.mark.slow
def test_run_takes_a_spec_dict_or_a_file_and_returns_the_run_dir_and_metrics(tmp_path, no_png, caplog):
    data = str(tmp_path / 'data')
    body = slm_lab.run(spec_body(), 'api_ppo', data_dir=data)  # one spec's body, named by spec_name
    assert isinstance(body, RunResult) and body.run_dir.parent == tmp_path / 'data'
    assert body.run_dir.name.startswith('api_ppo_')
    saved = json.loads((body.run_dir / 'info' / 'api_ppo_t0_trial_metrics.json').read_text())
    assert body.metrics['scalar'] == saved['scalar']
    rows = (body.run_dir / 'info' / 'api_ppo_t0_s0_session_df_train.csv').read_text().splitlines()
    assert rows[-1].split(',')[4] == '256'  # frame
    # train@latest of a dict: its run's spec file was a temporary one, which names no file to match
    with caplog.at_level('WARNING'):
        longer = slm_lab.run(spec_body(), 'api_ppo', mode='train@latest', overrides=['env.max_frame=320'],
                             data_dir=data)
    assert longer.run_dir == body.run_dir and not [r for r in caplog.records if 'made from' in r.getMessage()]
    with pytest.raises(ResumeError) as refused:
        slm_lab.run(spec_body(), 'api_ppo', mode='train@latest', overrides=['agent.algorithm.gamma=0.5'], data_dir=data)
    assert 'made from' not in str(refused.value) and '--force' in str(refused.value)

    # a file's content ({name: spec}) with its one spec, and -s style overrides as a dict
    content = slm_lab.run({'api_file': spec_body()}, overrides={'env.max_frame': 128}, data_dir=data, mode='dev')
    assert content.run_dir.name.startswith('api_file_')
    saved_spec = json.loads((content.run_dir / 'api_file_spec.json').read_text())
    assert saved_spec['env']['max_frame'] == 128 and saved_spec['meta']['mode'] == 'dev'

    # a file path whose file holds one spec; then train@ of that run, as the command line continues it
    path = tmp_path / 'one.json'
    path.write_text(json.dumps({'api_path': spec_body()}))
    first = slm_lab.run(str(path), data_dir=data)
    more = slm_lab.run(path, 'api_path', mode=f'train@{first.run_dir}', overrides=['env.max_frame=384'],
                       data_dir=data)
    assert more.run_dir == first.run_dir
    rows = (first.run_dir / 'info' / 'api_path_t0_s0_session_df_train.csv').read_text().splitlines()
    assert rows[-1].split(',')[4] == '384'


def test_errors_are_the_labs_own_exceptions_with_the_command_lines_message(tmp_path):
    data = tmp_path / 'data'
    path = tmp_path / 'two.json'
    path.write_text(json.dumps({'a': spec_body(), 'b': spec_body()}))
    with pytest.raises(SpecError, match='agent.algorithm.gama') as bad_key:
        slm_lab.run(str(path), 'a', overrides={'agent.algorithm.gama': 0.9}, data_dir=str(data))
    command_line = cli([str(path), 'a', 'train', '-s', 'agent.algorithm.gama=0.9'], tmp_path, env=lab_env())
    assert command_line.stderr.strip() == f'error: {bad_key.value}'
    with pytest.raises(ModeError, match='unknown mode'):
        slm_lab.run(str(path), 'a', mode='trian', data_dir=str(data))
    with pytest.raises(SpecError, match='holds 2 specs'):
        slm_lab.run(str(path), data_dir=str(data))
    with pytest.raises(SpecError, match='give spec_name'):
        slm_lab.run(spec_body(), data_dir=str(data))
    assert not data.exists() and not (tmp_path / 'data').exists()  # nothing written


def docs_example() -> str:
    """The code of docs/python-api.md's "Example" section, as a user copies it."""
    text = (ROOT / 'docs' / 'python-api.md').read_text()
    section = text.split('## Example', 1)[1]
    block = [line for line in section.splitlines() if line.startswith('    ') or not line.strip()]
    start = next(i for i, line in enumerate(block) if line.strip())
    end = start
    while end < len(block) and (block[end].startswith('    ') or not block[end].strip()):
        end += 1
    return textwrap.dedent('\n'.join(block[start:end])).strip() + '\n'


def example_dir(tmp_path: Path) -> Path:
    """A working directory as the user's: the repository's spec/demo.json, data/ made by the run."""
    (tmp_path / 'spec').mkdir()
    shutil.copy(ROOT / 'spec' / 'demo.json', tmp_path / 'spec' / 'demo.json')
    return tmp_path


def assert_example_ran(cwd: Path, out: str) -> None:
    """One run directory (no session process ran the caller's code again), continued to the
    example's second max_frame by both of its 2 sessions, and the misspelt key named."""
    runs = sorted((cwd / 'data').glob('my_ppo_*'))
    assert len(runs) == 1, (runs, out[-3000:])
    for s in (0, 1):
        rows = (runs[0] / 'info' / f'my_ppo_t0_s{s}_session_df_train.csv').read_text().splitlines()
        assert rows[-1].split(',')[4] == '4000', out[-3000:]
    assert 'agent.algorithm.gama' in out, out[-3000:]
    assert 'Traceback' not in out, out[-3000:]


def example_env(cwd: Path) -> dict:
    return {**lab_env(), 'PYTHONPATH': os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')])}


@pytest.mark.slow
@pytest.mark.subprocess
def test_docs_example_runs_two_sessions_without_a_main_guard(tmp_path):
    """The docs' example, verbatim, has no `if __name__ == '__main__':` guard and runs 2 sessions:
    spawned session processes must not run the script again (multiprocessing's spawn would).
    Run as a script here and in a Jupyter kernel below: the two ways a spawned process could run
    the caller's code again (a main file to re-import; a kernel's __main__). `python -c` is left
    out: it has no main file for spawn to re-run, the least risky case, and costs a whole run."""
    cwd = example_dir(tmp_path)
    code = docs_example()
    assert '__main__' not in code and "'max_session': 2" in code
    (cwd / 'example.py').write_text(code)
    out = subprocess.run([sys.executable, 'example.py'], cwd=cwd, capture_output=True, text=True, timeout=300,
                         env=example_env(cwd))
    assert out.returncode == 0, out.stderr[-3000:]
    assert_example_ran(cwd, out.stdout + out.stderr)


@pytest.mark.slow
@pytest.mark.subprocess
def test_docs_example_runs_in_a_jupyter_kernel(tmp_path):
    nbformat = pytest.importorskip('nbformat')
    nbclient = pytest.importorskip('nbclient')
    cwd = example_dir(tmp_path)
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(docs_example())])
    env = example_env(cwd)
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name='python3',
                                     resources={'metadata': {'path': str(cwd)}})
    old = dict(os.environ)
    os.environ.update(env)  # the kernel's process inherits it
    try:
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    outputs = notebook.cells[0].outputs
    text = ''.join(o.get('text', '') for o in outputs if o.get('output_type') == 'stream')
    assert not [o for o in outputs if o.get('output_type') == 'error'], outputs
    assert_example_ran(cwd, text)
