"""slm_lab.run, the Python API: a spec file or a spec dict in, the run directory and metrics out;
the command line's checks as the lab's own exceptions; `import slm_lab` stays cheap."""
from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
from lab_helpers import PPO, cli, lab_env

import slm_lab
from slm_lab.api import RunResult
from slm_lab.lib.errors import ModeError, SpecError



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
def test_run_takes_a_spec_dict_or_a_file_and_returns_the_run_dir_and_metrics(tmp_path, no_png):
    data = str(tmp_path / 'data')
    body = slm_lab.run(spec_body(), 'api_ppo', data_dir=data)  # one spec's body, named by spec_name
    assert isinstance(body, RunResult) and body.run_dir.parent == tmp_path / 'data'
    assert body.run_dir.name.startswith('api_ppo_')
    saved = json.loads((body.run_dir / 'info' / 'api_ppo_t0_trial_metrics.json').read_text())
    assert body.metrics['scalar'] == saved['scalar']
    rows = (body.run_dir / 'info' / 'api_ppo_t0_s0_session_df_train.csv').read_text().splitlines()
    assert rows[-1].split(',')[4] == '256'  # frame

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
