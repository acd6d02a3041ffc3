"""slm_lab.run's arguments (issue 27): what the command line refuses in one line, the Python API
raises as the lab's own error with the same message, before anything runs or is written; numpy's
numbers are numbers; a spec dict is a tree of JSON values; a data directory must be able to hold
runs (on the command line too)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from lab_helpers import PPO, cli, lab_env

import slm_lab
from slm_lab.lib.errors import DataDirError, LabError, ModeError, SpecError


def spec_body() -> dict:
    spec = copy.deepcopy(PPO)
    spec['env']['max_frame'] = 128
    spec['meta'].update(log_frequency=64, eval_frequency=128)
    return spec


def refused(tmp_path: Path, error: type, **kwargs) -> str:
    """The one-line `error` slm_lab.run raises for these arguments (spec: a PPO body named 'api'
    unless given, data_dir under tmp_path); nothing is written anywhere in tmp_path."""
    args = {'spec': spec_body(), 'spec_name': 'api', 'data_dir': str(tmp_path / 'data'), **kwargs}
    before = sorted(tmp_path.rglob('*'))
    with pytest.raises(error) as info:
        slm_lab.run(**args)
    assert sorted(tmp_path.rglob('*')) == before, 'nothing may be written'
    message = str(info.value)
    assert '\n' not in message and message, message
    return message


ARGUMENTS = {  # case: (arguments, the error, the message's start)
    'mode=None': ({'mode': None}, ModeError, 'unknown mode None; give the mode as a string'),
    'mode=5': ({'mode': 5}, ModeError, 'unknown mode 5'),
    'overrides=5': ({'overrides': 5}, SpecError, 'overrides: give a list of "KEY=VALUE" strings'),
    'overrides a string': ({'overrides': 'env.max_frame=64'}, SpecError, 'overrides: give a list'),
    'overrides=[5]': ({'overrides': [5]}, SpecError, 'overrides[0]: 5 is not a string'),
    'overrides key 5': ({'overrides': {5: 1}}, SpecError, 'overrides: key 5 is not a string'),
    'overrides value a set': ({'overrides': {'env.max_frame': {1}}}, SpecError,
                              'overrides: env.max_frame: set {1} is not a spec value'),
    'data_dir=5': ({'data_dir': 5}, DataDirError, 'data_dir 5: give the path of a directory'),
    'fork=5': ({'fork': 5}, ModeError, '--fork 5: give the path of a run directory'),
    'warm_start=5': ({'warm_start': 5}, ModeError, '--warm-start 5: give the path of a run directory'),
    "frame='abc'": ({'fork': 'parent', 'frame': 'abc'}, ModeError, "--frame 'abc': give the frame of a snapshot"),
    'frame=True': ({'fork': 'parent', 'frame': True}, ModeError, '--frame True: give the frame of a snapshot'),
    "keep='a'": ({'mode': 'search', 'keep': 'a'}, ModeError, "--keep 'a': give the number of best trials"),
    'keep=-1': ({'mode': 'search', 'keep': -1}, ModeError, '--keep -1: give the number of best trials'),
    'ray_address=5': ({'mode': 'search', 'ray_address': 5}, ModeError, '--ray-address 5: give the address'),
    "force='yes'": ({'force': 'yes'}, ModeError, "--force 'yes': give True or False"),
    'ckpt=5': ({'warm_start': 'parent', 'ckpt': 5}, ModeError, '--ckpt 5: use best or latest'),
    'keep with train': ({'keep': 2}, ModeError, "--keep only applies to search and search@ modes, not to 'train'"),
    'ray_address with train': ({'ray_address': 'localhost:6379'}, ModeError, '--ray-address only applies to search'),
    'force with fork': ({'fork': 'parent', 'force': True}, ModeError, '--force applies to train@ only'),
    'frame without fork': ({'frame': 100}, ModeError, '--frame picks the snapshot a fork continues from'),
    'fork and warm start': ({'fork': 'a', 'warm_start': 'b'}, ModeError, '--fork and --warm-start: give one'),
    'fork with dev': ({'fork': 'a', 'mode': 'dev'}, ModeError,
                      "--fork makes a new train run: use mode train, not 'dev'"),
}


@pytest.mark.parametrize('case', list(ARGUMENTS))
def test_a_wrong_argument_raises_the_labs_error_before_anything_runs(case, tmp_path):
    """Before: AttributeError (mode=None), TypeError (overrides=5, fork=5, frame='abc' in
    branch.py), and keep='a', ray_address=5, force='yes' accepted silently."""
    kwargs, error, start = ARGUMENTS[case]
    message = refused(tmp_path, error, **kwargs)
    assert message.startswith(start), message


@pytest.mark.subprocess
@pytest.mark.parametrize('case, args', [
    ('keep with train', ['--keep', '2']), ('force with fork', ['--fork', 'parent', '--force']),
    ('frame without fork', ['--frame', '100']), ('fork with dev', ['--fork', 'a'])])
def test_the_command_line_says_the_same_line(case, args, tmp_path):
    spec_file = tmp_path / 'api.json'
    spec_file.write_text(json.dumps({'api': spec_body()}))
    mode = 'dev' if case == 'fork with dev' else 'train'
    out = cli([str(spec_file), 'api', mode, *args], tmp_path, env=lab_env())
    kwargs, error, _ = ARGUMENTS[case]
    message = refused(tmp_path, error, **kwargs)
    assert out.returncode == 2 and out.stderr.strip() == f'error: {message} (see python run_lab.py --help)'


@pytest.mark.slow
def test_numpy_scalars_and_arrays_are_numbers_in_a_spec_dict_and_overrides(tmp_path, no_png):
    """Before: `Object of type float32 is not JSON serializable`."""
    spec = spec_body()
    spec['env'].update(max_frame=np.int64(128), num_envs=np.int32(2), normalize_obs=np.bool_(False))
    spec['agent']['algorithm']['gamma'] = np.array(0.9)  # a 0-d array
    spec['agent']['net']['hid_layers'] = np.array([16, 8])
    result = slm_lab.run(spec, 'api_np', data_dir=str(tmp_path / 'data'),
                         overrides={'agent.net.optim_spec.lr': np.float32(0.5), 'agent.algorithm.lam': np.float64(0.9),
                                    'meta.random_seed': np.uint8(3)})
    saved = json.loads((result.run_dir / 'api_np_spec.json').read_text())
    assert saved['env']['max_frame'] == 128 and saved['env']['num_envs'] == 2
    assert saved['env']['normalize_obs'] is False and saved['agent']['algorithm']['gamma'] == 0.9
    assert saved['agent']['net']['hid_layers'] == [16, 8] and saved['agent']['net']['optim_spec']['lr'] == 0.5
    assert saved['meta']['random_seed'] == 3
    rows = (result.run_dir / 'info' / 'api_np_t0_s0_session_df_train.csv').read_text().splitlines()
    assert rows[-1].split(',')[4] == '128'  # frame
    # np.bool_ stays a bool: never a number
    assert refused(tmp_path, SpecError, overrides={'agent.algorithm.gamma': np.bool_(True)}).startswith(
        'agent.algorithm.gamma: expected number, got bool True')


def deep_spec(depth: int) -> dict:
    spec = spec_body()
    node = spec['env']['make_kwargs'] = {}
    for _ in range(depth):
        node['a'] = {}
        node = node['a']
    return spec


def test_a_spec_dict_that_is_not_a_tree_of_json_values_is_refused(tmp_path):
    """Before: ValueError (Circular reference detected), RecursionError."""
    cyclic = spec_body()
    cyclic['agent']['net']['self'] = cyclic
    assert refused(tmp_path, SpecError, spec=cyclic) == (
        'spec: agent.net.self contains itself (an object that refers to one holding it); a spec must be a tree of '
        'JSON values')
    listed = spec_body()
    listed['agent']['net']['hid_layers'] = [16]
    listed['agent']['net']['hid_layers'].append(listed['agent']['net']['hid_layers'])
    assert refused(tmp_path, SpecError, spec=listed).startswith('spec: agent.net.hid_layers[1] contains itself')
    for depth in (100, 10_000):
        assert refused(tmp_path, SpecError, spec=deep_spec(depth)) == (
            'spec: env.make_kwargs.a.a... nests objects or lists more than 64 deep, which no spec does; flatten it')
    bad_key = spec_body()
    bad_key['env'][3] = 1
    assert refused(tmp_path, SpecError, spec=bad_key) == 'spec: env.3: keys must be strings, got int'
    odd = spec_body()
    odd['meta']['when'] = object()
    assert refused(tmp_path, SpecError, spec=odd).startswith('spec: meta.when: object <object object at')


def test_a_spec_as_deep_as_the_reader_allows_still_runs_its_checks(tmp_path):
    # 60 deep in a free-form object: no depth refusal; the env refuses the argument as it would from a file
    message = refused(tmp_path, SpecError, spec=deep_spec(60))
    assert 'nests' not in message and 'make_kwargs' in message


@pytest.mark.parametrize('where', ['/proc', 'a file', 'under a file'])
def test_a_data_dir_that_cannot_hold_runs_is_refused_in_one_line(where, tmp_path):
    """Before: FileNotFoundError (/proc), NotADirectoryError (a file) after the checks had run."""
    (tmp_path / 'afile').write_text('x')
    data_dir = {'/proc': '/proc', 'a file': str(tmp_path / 'afile'),
                'under a file': str(tmp_path / 'afile' / 'd')}[where]
    message = refused(tmp_path, DataDirError, data_dir=data_dir)
    assert message.startswith(f'data directory {data_dir}')
    assert 'move it away or use another data directory' in message
    # the same for a fork's and a warm start's new run, before the parent is even looked for
    assert refused(tmp_path, DataDirError, data_dir=data_dir, fork=str(tmp_path / 'nope')) == message
    assert refused(tmp_path, DataDirError, data_dir=data_dir, warm_start=str(tmp_path / 'nope')) == message


def test_a_missing_data_dir_is_made_where_its_parent_is_writable(tmp_path, monkeypatch):
    from slm_lab import lab
    monkeypatch.chdir(tmp_path)
    assert lab.check_data_dir('new/deeper/data') == 'new/deeper/data'
    assert list(tmp_path.iterdir()) == [], 'the check leaves nothing behind'


@pytest.mark.subprocess
def test_the_command_line_refuses_a_data_dir_that_is_a_file(tmp_path):
    spec_file = tmp_path / 'api.json'
    spec_file.write_text(json.dumps({'api': spec_body()}))
    cwd = tmp_path / 'cwd'
    cwd.mkdir()
    (cwd / 'data').write_text('not a directory\n')
    out = cli([str(spec_file), 'api', 'train'], cwd, env=lab_env())
    assert out.returncode == 2 and out.stderr.splitlines() == [
        'error: data directory data is not a directory, so no run directory can be made in it; move it away or use '
        "another data directory (slm_lab.run's data_dir; the command line makes runs in ./data: run it from another "
        'directory)'], out.stderr
    assert sorted(p.name for p in cwd.iterdir()) == ['data'] and (cwd / 'data').read_text() == 'not a directory\n'


def test_every_refusal_is_a_lab_error():
    assert all(issubclass(error, LabError) for _, error, _ in ARGUMENTS.values())
    assert issubclass(DataDirError, LabError) and DataDirError.exit_code == 2
