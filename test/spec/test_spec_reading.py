"""Reading spec files as SLM-Lab writes them: v4 JSON (trailing commas, list-wrapped agent and
env, a body block), v5 JSON (flat, `${var}` placeholders, `1e7` style numbers) and v5 YAML
(anchors, merges, `_` templates); and the seed each session's saved spec records."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from lab_helpers import run_in_process, visible

from slm_lab.lib.errors import SpecError
from slm_lab.spec import load_spec, strip_trailing_commas

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / 'spec' / 'slm_lab'
V4_FILE, V5_FILE, YAML_FILE = (str(EXAMPLES / name) for name in
                               ('cartpole_v4.json', 'cartpole_v5.json', 'cartpole_v5.yaml'))
# short runs of the example specs: a few hundred frames, one log point per 64 frames
SHORT = ['env.max_frame=256', 'meta.log_frequency=64', 'meta.eval_frequency=128', 'meta.max_session=1',
         'meta.random_seed=5', 'env.num_envs=2']
TIMING = ['wall_t', 'fps']  # the only record columns that differ between two runs of one seed


def spec_error(path: str, name: str, overrides: list[str] | None = None) -> str:
    """The one-line SpecError message load_spec raises."""
    with pytest.raises(SpecError) as e:
        load_spec(path, name, overrides)
    message = str(e.value)
    assert '\n' not in message
    return message


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


V4_TEXT = '''{
  "v4": {
    "agent": [{
      "name": "PPO",
      "algorithm": {"name": "PPO", "gamma": 0.99, "time_horizon": 32, "minibatch_size": 32,},
      "memory": {"name": "OnPolicyBatchReplay",},
      "net": {"type": "MLPNet", "hid_layers": [32, 32,], "optim_spec": {"name": "Adam", "lr": 0.001,},},
    }],
    "env": [{"name": "CartPole-v1", "max_t": null, "max_frame": 1e4,}],
    "body": {"product": "outer", "num": 1,},
    "meta": {"distributed": false, "max_session": 1, "max_trial": 1,},
  },
}
'''

V5_FLAT = {'agent': {'name': 'PPO',
                     'algorithm': {'name': 'PPO', 'gamma': 0.99, 'time_horizon': 32, 'minibatch_size': 32},
                     'memory': {'name': 'OnPolicyBatchReplay'},
                     'net': {'type': 'MLPNet', 'hid_layers': [32, 32], 'optim_spec': {'name': 'Adam', 'lr': 0.001}}},
           'env': {'name': 'CartPole-v1', 'max_t': None, 'max_frame': 10000},
           'meta': {'distributed': False, 'max_session': 1, 'max_trial': 1}}


# --- trailing commas -----------------------------------------------------------------------------

def test_v4_trailing_commas_and_lists_read_as_the_flat_spec(tmp_path):
    v4 = load_spec(write(tmp_path, 'v4.json', V4_TEXT), 'v4')
    flat = load_spec(write(tmp_path, 'flat.json', json.dumps({'v4': V5_FLAT})), 'v4')
    for key in ('agent', 'env'):
        assert v4[key] == flat[key]
    assert 'body' not in v4


@pytest.mark.parametrize('text, expected', [
    ('[1, 2,]', '[1, 2 ]'),
    ('{"a": 1 ,\n }', '{"a": 1  \n }'),
    ('{"a": [{"b": "x",},],}', '{"a": [{"b": "x" } ] }'),
    ('["a,]", "b\\",}",]', '["a,]", "b\\",}" ]'),  # commas and brackets inside strings, an escaped quote
    ('["\\\\",]', '["\\\\" ]'),  # a string ending in an escaped backslash
    ('[1, 2]', '[1, 2]'),
])
def test_trailing_commas_become_spaces_outside_strings(text, expected):
    assert strip_trailing_commas(text) == expected
    assert json.loads(expected) is not None


@pytest.mark.parametrize('text', ['[,]', '[1,,]', '{"a":,}', '{,}'])
def test_a_comma_that_follows_no_value_is_still_a_syntax_error(tmp_path, text):
    message = spec_error(write(tmp_path, 'bad.json', text), 's')
    assert 'invalid JSON at line 1 column' in message


def test_a_syntax_error_after_trailing_commas_is_reported_where_it_is_in_the_file(tmp_path):
    # line 4 misses the colon after "max_frame": column 31 is where the value starts
    text = ('{\n  "s": {\n    "agent": [{"name": "PPO",}],\n'
            '    "env": [{"name": "CartPole-v1", "max_frame" 1e4,}],\n  },\n}\n')
    message = spec_error(write(tmp_path, 'bad.json', text), 's')
    column = text.splitlines()[3].index('1e4') + 1
    assert f'line 4 column {column}' in message and "Expecting ':' delimiter" in message


# --- numbers written as floats -------------------------------------------------------------------

def test_integral_floats_are_ints_for_integer_keys(tmp_path):
    spec = dict(V5_FLAT, env={'name': 'CartPole-v1', 'max_frame': 1e7, 'num_envs': 2.0})
    spec['agent'] = json.loads(json.dumps(V5_FLAT['agent']))
    spec['agent']['net']['hid_layers'] = [64.0, 32]
    spec['agent']['algorithm']['time_horizon'] = 5e2
    loaded = load_spec(write(tmp_path, 's.json', json.dumps({'s': spec})), 's')
    assert loaded['env']['max_frame'] == 10_000_000 and type(loaded['env']['max_frame']) is int
    assert type(loaded['env']['num_envs']) is int
    assert loaded['agent']['net']['hid_layers'] == [64, 32]
    assert all(type(width) is int for width in loaded['agent']['net']['hid_layers'])
    assert type(loaded['agent']['algorithm']['time_horizon']) is int
    assert type(loaded['agent']['algorithm']['gamma']) is float  # number keys keep their floats


def test_float_overrides_are_ints_for_integer_keys(tmp_path):
    path = write(tmp_path, 's.json', json.dumps({'s': V5_FLAT}))
    spec = load_spec(path, 's', ['env.max_frame=1e7', 'meta.log_frequency=500.0'])
    assert spec['env']['max_frame'] == 10_000_000 and type(spec['env']['max_frame']) is int
    assert spec['meta']['log_frequency'] == 500 and type(spec['meta']['log_frequency']) is int


@pytest.mark.parametrize('override, named', [
    ('env.max_frame=1.5', 'env.max_frame: expected int, got float 1.5'),
    ('agent.net.hid_layers=[64, 0.5]', 'agent.net.hid_layers[1]'),
    ('meta.max_session=1e3', 'meta.max_session: 1000.0 is out of range; it must be <= 256'),
    ('meta.random_seed=1e30', 'meta.random_seed: 1e+30 is out of range'),
    ('env.max_frame=-1e3', 'env.max_frame: -1000.0 is out of range; it must be >= 1'),
])
def test_non_integral_or_out_of_range_floats_are_refused_naming_the_key(tmp_path, override, named):
    path = write(tmp_path, 's.json', json.dumps({'s': V5_FLAT}))
    assert named in spec_error(path, 's', [override])


# --- placeholders ---------------------------------------------------------------------------------

def test_placeholders_take_the_type_of_their_value(tmp_path):
    spec = json.loads(json.dumps(V5_FLAT))
    spec['env'].update(name='${env}', max_frame='${max_frame}')
    spec['agent']['name'] = 'ppo_${max_frame}_${env}'
    path = write(tmp_path, 's.json', json.dumps({'s': spec}))
    loaded = load_spec(path, 's', ['env=Acrobot-v1', 'max_frame=1e7'])
    assert loaded['env']['name'] == 'Acrobot-v1'
    assert loaded['env']['max_frame'] == 10_000_000 and type(loaded['env']['max_frame']) is int
    assert loaded['agent']['name'] == 'ppo_10000000_Acrobot-v1'  # inside a string: as a number is written


def test_every_unfilled_placeholder_is_named_with_where_it_is_and_its_fix(tmp_path):
    spec = json.loads(json.dumps(V5_FLAT))
    spec['env'].update(name='${env}', max_frame='${max_frame}')
    message = spec_error(write(tmp_path, 's.json', json.dumps({'s': spec})), 's', ['env=CartPole-v1'])
    assert '${max_frame} at env.max_frame' in message and '-s max_frame=VALUE' in message
    message = spec_error(write(tmp_path, 's.json', json.dumps({'s': spec})), 's')
    assert '${env} at env.name' in message and '-s env=VALUE -s max_frame=VALUE' in message


# --- SLM-Lab v4's body block ---------------------------------------------------------------------

@pytest.mark.parametrize('body', [{'product': 'outer', 'num': 1}, {'product': 'inner', 'num': 1},
                                  {'product': 'custom', 'num': [1]}, {}])
def test_a_one_agent_one_env_body_is_accepted(tmp_path, body):
    spec = dict(V5_FLAT, body=body)
    assert 'body' not in load_spec(write(tmp_path, 's.json', json.dumps({'s': spec})), 's')


@pytest.mark.parametrize('body, named', [
    ({'product': 'outer', 'num': 2}, 'body.num: 2 bodies'),
    ({'product': 'custom', 'num': [1, 12]}, 'body.num: [1, 12] bodies'),
    ({'product': 'outr', 'num': 1}, "body.product: 'outr' is not valid (did you mean 'outer'?)"),
    ({'product': 'outer', 'nums': 1}, "body.nums: unknown key (did you mean 'num'?)"),
    (['outer'], 'body: expected an object'),
])
def test_a_multi_agent_or_malformed_body_is_one_line_naming_the_key(tmp_path, body, named):
    spec = dict(V5_FLAT, body=body)
    message = spec_error(write(tmp_path, 's.json', json.dumps({'s': spec})), 's')
    assert message.startswith(named)
    if 'bodies' in message:
        assert 'multi-agent' in message


# --- YAML -----------------------------------------------------------------------------------------

YAML_TEXT = '''
_net: &net
  type: MLPNet
  hid_layers: [32]
  optim_spec: {name: Adam, lr: 1.0e-3}
_algo: &algo
  name: PPO
  gamma: 0.99
  time_horizon: 32
  minibatch_size: 32
ppo_a:
  agent:
    name: PPO
    algorithm:
      <<: *algo
      gamma: 0.9
    memory: {name: OnPolicyBatchReplay}
    net: *net
  env: {name: CartPole-v1, max_frame: 1e4}
ppo_b:
  agent:
    name: PPO
    algorithm: *algo
    memory: {name: OnPolicyBatchReplay}
    net:
      <<: *net
      hid_layers: [16, 16]
  env: {name: '${env}', max_frame: '${max_frame}'}
'''


def test_yaml_anchors_merges_and_exponent_numbers(tmp_path):
    path = write(tmp_path, 'specs.yaml', YAML_TEXT)
    a = load_spec(path, 'ppo_a')
    assert a['agent']['algorithm']['gamma'] == 0.9 and a['agent']['algorithm']['time_horizon'] == 32
    assert a['agent']['net']['hid_layers'] == [32] and a['agent']['net']['optim_spec']['lr'] == 1e-3
    assert a['env']['max_frame'] == 10_000 and type(a['env']['max_frame']) is int  # 1e4, not the string '1e4'
    b = load_spec(path, 'ppo_b', ['env=Acrobot-v1', 'max_frame=5e3'])
    assert b['agent']['algorithm']['gamma'] == 0.99 and b['agent']['net']['hid_layers'] == [16, 16]
    assert b['env'] == load_spec(path, 'ppo_b', ['env=Acrobot-v1', 'max_frame=5000'])['env']
    assert b['env']['name'] == 'Acrobot-v1'
    assert load_spec(write(tmp_path, 'specs.yml', YAML_TEXT), 'ppo_a')['agent'] == a['agent']


def test_yaml_templates_are_not_specs(tmp_path):
    path = write(tmp_path, 'specs.yaml', YAML_TEXT)
    message = spec_error(path, '_algo')
    assert "'_algo'" in message and 'is a template' in message and 'specs in that file: ppo_a, ppo_b' in message
    message = spec_error(path, 'ppo_c')
    assert message.endswith('specs in that file: ppo_a, ppo_b')


@pytest.mark.parametrize('text, expected', [
    ('s:\n  agent: [1, 2\n  env: {}\n', 'invalid YAML at line 3 column 6'),
    ('s:\n  agent: *missing\n', "invalid YAML at line 2 column 10: found undefined alias 'missing'"),
    ('s:\n  env:\n    name: x\n   bad: 1\n', 'invalid YAML at line 4'),
    ('- a\n- b\n', 'expected a YAML object mapping spec names to specs'),
    ('s:\n  meta: {ts: 2024-01-02}\n', 's.meta.ts: datetime.date(2024, 1, 2) is a YAML date'),
    ('s:\n  meta: {1: x}\n', "s.meta.1: keys must be strings, got int"),
    ('s: &a\n  agent: *a\n', 's.agent contains itself (a recursive alias)'),
    ('a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n'
     'c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n'
     'e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n',
     'more than 1000000 values once its aliases are expanded'),
    ('s: !!python/object:os.system {}\n', 'invalid YAML'),  # the safe loader builds no Python objects
])
def test_yaml_problems_are_one_line_naming_the_file_and_place(tmp_path, text, expected):
    path = write(tmp_path, 'bad.yaml', text)
    message = spec_error(path, 's')
    assert message.startswith(f'spec file {path}: ') and expected in message


# --- a spec the lab saved is a spec file --------------------------------------------------------

def test_a_saved_spec_is_read_as_one_spec_under_its_recorded_name(tmp_path):
    saved = json.loads(json.dumps(V5_FLAT))
    saved['name'] = 'mine'
    saved['meta'].update(trial=0, session=3, experiment_ts='2026_01_01_000000', overrides=['x=1'], mode='train')
    path = write(tmp_path, 'mine_t0_s3_spec.json', json.dumps(saved))
    spec = load_spec(path, 'mine', ['env.max_frame=500'])
    assert spec['env']['max_frame'] == 500
    # the records of the run it came from are not inputs of a new run
    assert spec['meta']['session'] is None and spec['meta']['experiment_ts'] is None
    assert spec['meta']['overrides'] == ['env.max_frame=500'] and spec['meta']['spec_file'] == path
    message = spec_error(path, 'other')
    assert "holds one spec, named 'mine', not 'other'" in message and f'run it as: {path} mine MODE' in message


# --- end to end: SLM-Lab style files train on CartPole, shortened only with -s --------------------

@pytest.mark.slow
@pytest.mark.parametrize('spec_path, name, fill', [
    (V4_FILE, 'dqn_cartpole_v4', []),
    (V4_FILE, 'ppo_cartpole_v4', []),
    (V5_FILE, 'ppo_v5', ['env=CartPole-v1', 'max_frame=1e7']),
    (V5_FILE, 'dqn_v5', ['agent.algorithm.training_start_step=32']),
    (YAML_FILE, 'ppo_cartpole_yaml', []),
])
def test_slm_lab_style_spec_files_train_unchanged(tmp_path, no_png, spec_path, name, fill):
    from slm_lab import lab
    metrics = lab.run(spec_path, name, 'train', fill + SHORT, data_dir=str(tmp_path / 'data'))
    assert metrics is not None
    (run_dir,) = visible(tmp_path / 'data')
    df = pd.read_csv(run_dir / 'info' / f'{name}_t0_s0_session_df_train.csv')
    assert df['frame'].iloc[-1] == 256 and df['opt_step'].iloc[-1] > 0
    saved = json.loads((run_dir / f'{name}_spec.json').read_text())
    assert isinstance(saved['agent'], dict) and 'body' not in saved and saved['env']['max_frame'] == 256


@pytest.mark.slow
def test_a_yaml_spec_trains_from_the_command_line(tmp_path, capsys, no_png):
    """A yaml spec file through the command line's code (its -s shorthand keys and values), here in
    this process (run_in_process: the same code after the interpreter's start); its template
    refused in one line."""
    args = [YAML_FILE, 'ppo_yaml', 'train', '-s', 'env=CartPole-v1', '-s', 'max_frame=2.56e2'] + \
        [a for o in SHORT[1:] for a in ('-s', o)]
    code, err = run_in_process(args, tmp_path, capsys)
    assert code == 0, err[-2000:]
    (run_dir,) = visible(tmp_path / 'data')
    saved = json.loads((run_dir / 'ppo_yaml_spec.json').read_text())
    assert saved['env']['max_frame'] == 256 and saved['agent']['net']['hid_layers'] == [32]
    code, err = run_in_process([YAML_FILE, '_meta', 'train'], tmp_path, capsys)
    assert code == 2 and err.count('\n') == 1 and 'is a template' in err, err
    assert len(visible(tmp_path / 'data')) == 1


# --- seeds: each session's spec records the seed it used ----------------------------------------

@pytest.mark.slow
def test_a_session_spec_records_its_seed_and_reruns_that_session(tmp_path, no_png):
    from slm_lab import lab
    path = write(tmp_path, 'two.json', json.dumps({'two': V5_FLAT}))
    lab.run(path, 'two', 'train', ['env.max_frame=128', 'meta.log_frequency=32', 'meta.max_session=2',
                                  'meta.random_seed=7', 'agent.algorithm.time_horizon=16'],
            data_dir=str(tmp_path / 'data'))
    (run_dir,) = visible(tmp_path / 'data')
    run_meta = json.loads((run_dir / 'two_spec.json').read_text())['meta']
    trial_meta = json.loads((run_dir / 'two_t0_spec.json').read_text())['meta']
    assert run_meta['random_seed'] == trial_meta['random_seed'] == 7
    assert run_meta['max_session'] == trial_meta['max_session'] == 2
    for s in (0, 1):
        meta = json.loads((run_dir / f'two_t0_s{s}_spec.json').read_text())['meta']
        assert (meta['random_seed'], meta['max_session'], meta['trial'], meta['session']) == (7 + s, 1, 0, s)
        assert f'seed {7 + s}' in (run_dir / 'log' / f'two_t0_s{s}.log').read_text()

    # session 1 alone, from its own spec file: the same records as in the two-session run
    session_spec = str(run_dir / 'two_t0_s1_spec.json')
    lab.run(session_spec, 'two', 'train', data_dir=str(tmp_path / 'again'))
    (again,) = visible(tmp_path / 'again')
    assert not (again / 'two_t0_s1_spec.json').exists()
    assert json.loads((again / 'two_t0_s0_spec.json').read_text())['meta']['random_seed'] == 8
    for df_mode in ('train', 'eval'):
        original = pd.read_csv(run_dir / 'info' / f'two_t0_s1_session_df_{df_mode}.csv').drop(columns=TIMING)
        rerun = pd.read_csv(again / 'info' / f'two_t0_s0_session_df_{df_mode}.csv').drop(columns=TIMING)
        assert original['opt_step'].iloc[-1] > 0
        pd.testing.assert_frame_equal(original, rerun, check_exact=True)


def test_a_relative_spec_path_not_found_says_where_it_was_looked_for(tmp_path, monkeypatch):
    from slm_lab.lib.errors import SpecError
    from slm_lab.spec.read import read_spec_file
    monkeypatch.chdir(tmp_path)  # outside the repository, as `slm-lab run` with no arguments elsewhere
    with pytest.raises(SpecError, match=f'spec/demo.json not found in {tmp_path} .*run from its root'):
        read_spec_file('spec/demo.json')
