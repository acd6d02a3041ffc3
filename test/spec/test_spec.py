"""Spec reading, validation, overrides and defaults: a bad spec fails before anything runs, with
one line that names the key path and the valid choices."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import gymnasium as gym
import pytest

from slm_lab import lab
from slm_lab.lib.errors import LabError, SpecError
from slm_lab.spec import diff_specs, load_spec

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO = str(REPO_ROOT / 'spec' / 'demo.json')
DQN_ZOO = str(REPO_ROOT / 'spec' / 'benchmark' / 'dqn' / 'dqn_cartpole_zoo.json')


def spec_error(spec_path: str, spec_name: str, overrides: list[str] | None = None) -> str:
    """The SpecError message load_spec raises; it must be a single line."""
    with pytest.raises(SpecError) as info:
        load_spec(spec_path, spec_name, overrides)
    message = str(info.value)
    assert '\n' not in message, f'the message must be one line: {message!r}'
    return message


def preflight_error(spec_path: str, spec_name: str, tmp_path: Path, overrides: list[str] | None = None) -> str:
    """The SpecError lab.run raises before it creates anything under data_dir."""
    data_dir = tmp_path / 'data'
    with pytest.raises(SpecError) as info:
        lab.run(spec_path, spec_name, 'train', overrides, data_dir=str(data_dir))
    assert not data_dir.exists(), 'no run directory may be created for a bad spec'
    message = str(info.value)
    assert '\n' not in message, f'the message must be one line: {message!r}'
    return message


@pytest.fixture
def ppo(make_spec):
    return make_spec('PPO')


@pytest.fixture
def dqn(make_spec):
    return make_spec('DQN')


# --- shipped specs -------------------------------------------------------------------------------

@pytest.mark.parametrize('path, name', [(DEMO, 'ppo_cartpole'), (DQN_ZOO, 'dqn_cartpole_zoo')])
def test_shipped_specs_validate(path, name):
    spec = load_spec(path, name)
    assert spec['name'] == name
    assert spec['meta']['spec_name'] == name
    assert spec['meta']['spec_file'] == str(Path(path).resolve())


def test_spec_error_is_a_lab_error():
    assert issubclass(SpecError, LabError)


# --- key names -----------------------------------------------------------------------------------

def test_misspelled_key_names_its_path_and_suggests_the_right_one(ppo, spec_file):
    ppo['agent']['algorithm']['gama'] = 0.9
    message = spec_error(spec_file({'s': ppo}), 's')
    assert 'agent.algorithm.gama' in message
    assert "did you mean 'gamma'" in message


def test_misspelled_env_key_via_override(ppo, spec_file):
    message = spec_error(spec_file({'s': ppo}), 's', ['env.max_fram=100'])
    assert 'env.max_fram' in message and "did you mean 'max_frame'" in message


def test_unknown_algorithm_lists_the_valid_ones(ppo, spec_file):
    ppo['agent']['algorithm']['name'] = 'PPOO'
    message = spec_error(spec_file({'s': ppo}), 's')
    assert 'agent.algorithm.name' in message and 'PPOO' in message
    for valid in ('Random', 'Reinforce', 'VanillaDQN', 'DQN', 'DoubleDQN', 'PPO'):
        assert valid in message


def test_unknown_memory_lists_the_valid_ones(dqn, spec_file):
    dqn['agent']['memory']['name'] = 'Replayy'
    message = spec_error(spec_file({'s': dqn}), 's')
    assert 'agent.memory.name' in message and 'Replayy' in message
    for valid in ('OnPolicyReplay', 'OnPolicyBatchReplay', 'Replay'):
        assert valid in message


def test_unknown_net_type_lists_the_valid_ones(dqn, spec_file):
    dqn['agent']['net']['type'] = 'MLP'
    message = spec_error(spec_file({'s': dqn}), 's')
    assert 'agent.net.type' in message and "'MLP'" in message and 'MLPNet' in message


@pytest.mark.parametrize('section, key, name', [
    ('algorithm', 'name', 'HydraDQN'),
    ('net', 'type', 'HydraMLPNet'),
])
def test_slm_lab_names_not_implemented_yet_say_so(dqn, spec_file, section, key, name):
    dqn['agent'][section][key] = name
    message = spec_error(spec_file({'s': dqn}), 's')
    assert f'agent.{section}.{key}' in message
    assert name in message and 'not implemented' in message


def test_planned_action_pdtype_says_not_implemented(ppo, spec_file):
    ppo['agent']['algorithm']['action_pdtype'] = 'Beta'
    message = spec_error(spec_file({'s': ppo}), 's')
    assert 'agent.algorithm.action_pdtype' in message and 'not implemented' in message


def test_unknown_env_id(ppo, spec_file):
    ppo['env']['name'] = 'CartPol-v1'
    message = spec_error(spec_file({'s': ppo}), 's')
    assert 'env.name' in message and 'CartPol-v1' in message
    assert "did you mean 'CartPole-v1'" in message


class UnmakeableEnv(gym.Env):
    """A registered env whose constructor fails, as one needing a missing licence or device does."""

    def __init__(self):
        raise RuntimeError('no licence server reachable')


def test_env_that_cannot_be_made_is_a_spec_error(ppo, spec_file, tmp_path):
    if 'Unmakeable-v0' not in gym.envs.registry:
        gym.register('Unmakeable-v0', entry_point=UnmakeableEnv)
    ppo['env']['name'] = 'Unmakeable-v0'
    message = preflight_error(spec_file({'s': ppo}), 's', tmp_path)
    assert 'env.name' in message and 'Unmakeable-v0' in message and 'no licence server reachable' in message


# --- values --------------------------------------------------------------------------------------

def test_wrong_type(ppo, spec_file):
    ppo['env']['max_frame'] = 'abc'
    message = spec_error(spec_file({'s': ppo}), 's')
    assert 'env.max_frame' in message and 'int' in message and "'abc'" in message


def test_wrong_type_via_override(ppo, spec_file):
    message = spec_error(spec_file({'s': ppo}), 's', ['env.max_frame=abc'])
    assert 'env.max_frame' in message and 'int' in message


@pytest.mark.parametrize('value', [-5, 0])
def test_max_frame_must_be_positive(ppo, spec_file, value):
    ppo['env']['max_frame'] = value
    message = spec_error(spec_file({'s': ppo}), 's')
    assert 'env.max_frame' in message and str(value) in message and '>= 1' in message


def test_value_not_among_choices_lists_them(ppo, spec_file):
    ppo['agent']['net']['hid_layers_activation'] = 'rellu'
    message = spec_error(spec_file({'s': ppo}), 's')
    assert 'agent.net.hid_layers_activation' in message and "did you mean 'relu'" in message
    assert 'tanh' in message


def test_bad_optimizer_name(ppo, spec_file):
    ppo['agent']['net']['optim_spec']['name'] = 'Adamm'
    message = spec_error(spec_file({'s': ppo}), 's')
    assert 'agent.net.optim_spec.name' in message and "did you mean 'Adam'" in message
    assert 'SGD' in message and 'RMSprop' in message


def test_bad_optimizer_kwarg(ppo, spec_file):
    ppo['agent']['net']['optim_spec']['lrr'] = 0.01
    message = spec_error(spec_file({'s': ppo}), 's')
    assert 'agent.net.optim_spec.lrr' in message and "did you mean 'lr'" in message
    assert 'weight_decay' in message


def test_bad_loss_name(dqn, spec_file):
    dqn['agent']['net']['loss_spec'] = {'name': 'SmoothL1Los'}
    message = spec_error(spec_file({'s': dqn}), 's')
    assert 'agent.net.loss_spec.name' in message and "did you mean 'SmoothL1Loss'" in message


def test_schedule_end_before_start(ppo, spec_file):
    ppo['agent']['algorithm']['entropy_coef_spec'] = {
        'name': 'linear_decay', 'start_val': 0.1, 'end_val': 0.0, 'start_step': 100, 'end_step': 10}
    message = spec_error(spec_file({'s': ppo}), 's')
    assert 'agent.algorithm.entropy_coef_spec.end_step' in message


# --- algorithm, memory and env fit ---------------------------------------------------------------

def test_memory_that_does_not_fit_the_algorithm(dqn, spec_file):
    dqn['agent']['memory'] = {'name': 'OnPolicyBatchReplay'}
    message = spec_error(spec_file({'s': dqn}), 's')
    assert 'agent.memory.name' in message and 'OnPolicyBatchReplay' in message
    assert 'Replay' in message.split('OnPolicyBatchReplay', 1)[1]


def test_missing_memory_for_an_algorithm_that_needs_one(dqn, spec_file):
    del dqn['agent']['memory']
    message = spec_error(spec_file({'s': dqn}), 's')
    assert 'agent.memory' in message and 'Replay' in message


def test_dqn_on_a_continuous_env_fails_in_preflight(dqn, spec_file, tmp_path):
    dqn['env']['name'] = 'Pendulum-v1'
    message = preflight_error(spec_file({'s': dqn}), 's', tmp_path)
    assert 'continuous' in message and 'DQN' in message


# --- the spec file -------------------------------------------------------------------------------

def test_malformed_json_gives_line_and_column(tmp_path):
    path = tmp_path / 'bad.json'
    path.write_text('{\n  "s": {\n    "agent": {"name": "PPO" "net": {}}\n  }\n}\n')  # a missing comma
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(path.read_text())
    message = spec_error(str(path), 's')
    assert str(path) in message
    assert f'line {expected.value.lineno}' in message and f'column {expected.value.colno}' in message
    assert expected.value.lineno == 3


def test_spec_name_not_in_file_lists_the_names_that_are(ppo, dqn, spec_file):
    path = spec_file({'ppo_cartpole': ppo, 'dqn_cartpole': dqn})
    message = spec_error(path, 'ppo_cartpol')
    assert "'ppo_cartpol'" in message
    assert 'ppo_cartpole' in message and 'dqn_cartpole' in message


def test_missing_file(tmp_path):
    message = spec_error(str(tmp_path / 'nope.json'), 's')
    assert 'nope.json' in message and 'not found' in message


def test_a_directory_is_not_a_spec_file(tmp_path):
    message = spec_error(str(tmp_path), 's')
    assert 'directory' in message


# --- overrides -----------------------------------------------------------------------------------

def test_override_sets_an_int(ppo, spec_file):
    spec = load_spec(spec_file({'s': ppo}), 's', ['env.max_frame=20000'])
    assert spec['env']['max_frame'] == 20000 and type(spec['env']['max_frame']) is int
    assert spec['meta']['overrides'] == ['env.max_frame=20000']


def test_override_sets_a_nested_float(ppo, spec_file):
    spec = load_spec(spec_file({'s': ppo}), 's', ['agent.net.optim_spec.lr=3e-4'])
    assert spec['agent']['net']['optim_spec'] == {'name': 'Adam', 'lr': 3e-4, 'fused': True}


def test_override_sets_strings_lists_and_list_items(ppo, spec_file):
    path = spec_file({'s': ppo})
    spec = load_spec(path, 's', ['env.name=Acrobot-v1', 'agent.net.hid_layers=[16,8]',
                                 'agent.net.hid_layers.1=4'])
    assert spec['env']['name'] == 'Acrobot-v1'
    assert spec['agent']['net']['hid_layers'] == [16, 4]


def test_override_without_equals_sign(ppo, spec_file):
    message = spec_error(spec_file({'s': ppo}), 's', ['env.max_frame'])
    assert 'KEY=VALUE' in message


def test_override_does_not_change_the_spec_file(ppo, spec_file):
    path = spec_file({'s': ppo})
    before = Path(path).read_text()
    load_spec(path, 's', ['env.max_frame=20000'])
    assert Path(path).read_text() == before


def test_placeholder_substitution(ppo, spec_file):
    ppo['env']['max_frame'] = '${MAX_FRAME}'
    ppo['env']['name'] = '${ENV}'
    ppo['agent']['net']['optim_spec']['lr'] = '${lr}'
    ppo['agent']['name'] = 'ppo_${ENV}'
    spec = load_spec(spec_file({'s': ppo}), 's', ['MAX_FRAME=5000', 'ENV=Acrobot-v1', 'lr=3e-4'])
    assert spec['env']['max_frame'] == 5000 and type(spec['env']['max_frame']) is int
    assert spec['env']['name'] == 'Acrobot-v1'
    assert spec['agent']['net']['optim_spec']['lr'] == 3e-4
    assert spec['agent']['name'] == 'ppo_Acrobot-v1'


def test_unfilled_placeholder_names_it(ppo, spec_file):
    ppo['env']['max_frame'] = '${MAX_FRAME}'
    message = spec_error(spec_file({'s': ppo}), 's')
    assert '${MAX_FRAME}' in message and '-s MAX_FRAME=' in message


# --- defaults and SLM-Lab's forms ----------------------------------------------------------------

def test_defaults_are_filled(spec_file):
    raw = {'agent': {'algorithm': {'name': 'PPO'}, 'memory': {'name': 'OnPolicyBatchReplay'},
                     'net': {'type': 'MLPNet'}},
           'env': {'name': 'CartPole-v1', 'max_frame': 1000}}
    spec = load_spec(spec_file({'s': raw}), 's')
    algo = spec['agent']['algorithm']
    assert algo['minibatch_size'] == 4 and algo['time_horizon'] == 128 and algo['training_epoch'] == 4
    assert algo['val_loss_coef'] == 1.0  # SLM-Lab's defaults where SLM-Lab has one
    assert algo['gamma'] == 0.99 and algo['lam'] == 0.95
    assert algo['clip_eps_spec']['start_val'] == 0.2
    assert spec['agent']['name'] == 'PPO'
    assert spec['agent']['net']['optim_spec'] == {'name': 'Adam', 'lr': 1e-3, 'fused': True}
    assert spec['agent']['net']['hid_layers'] == [64, 64]
    assert spec['env']['num_envs'] == 1
    assert spec['meta']['log_frequency'] == 1000 and spec['meta']['max_session'] == 1


def test_dqn_defaults_explore_with_epsilon_greedy(spec_file):
    raw = {'agent': {'algorithm': {'name': 'DQN'}, 'memory': {'name': 'Replay'}, 'net': {'type': 'MLPNet'}},
           'env': {'name': 'CartPole-v1', 'max_frame': 1000}}
    algo = load_spec(spec_file({'s': raw}), 's')['agent']['algorithm']
    assert algo['action_policy'] == 'epsilon_greedy'
    assert algo['explore_var_spec']['name'] == 'linear_decay'


def v4_form(spec: dict) -> dict:
    """SLM-Lab v4's layout: agent and env in one-element lists, plus a body section."""
    v4 = copy.deepcopy(spec)
    v4['agent'] = [v4['agent']]
    v4['env'] = [v4['env']]
    v4['body'] = {'product': 'outer', 'num': 1}
    v4['name'] = 'ignored'
    return v4


def test_slm_lab_v4_list_form_is_accepted(ppo, spec_file):
    spec = load_spec(spec_file({'s': v4_form(ppo)}), 's')
    plain = load_spec(spec_file({'s': ppo}, 'plain.json'), 's')
    assert spec['agent'] == plain['agent'] and spec['env'] == plain['env']


def test_slm_lab_v4_list_form_takes_the_same_overrides(ppo, spec_file):
    # a user copies an SLM-Lab v4 spec and shortens it as usual: -s env.max_frame=300
    spec = load_spec(spec_file({'s': v4_form(ppo)}), 's', ['env.max_frame=300', 'agent.net.optim_spec.lr=3e-4'])
    assert spec['env']['max_frame'] == 300
    assert spec['agent']['net']['optim_spec']['lr'] == 3e-4


def test_v4_list_form_with_two_agents_is_refused(ppo, spec_file):
    ppo['agent'] = [ppo['agent'], ppo['agent']]
    message = spec_error(spec_file({'s': ppo}), 's')
    assert 'agent' in message and '2' in message


def test_validation_is_idempotent(ppo, spec_file):
    from slm_lab.spec import validate_spec
    spec = load_spec(spec_file({'s': ppo}), 's')
    again = validate_spec(copy.deepcopy(spec), 's')
    again['name'] = spec['name']
    assert diff_specs(spec, again) == []


# --- diff ----------------------------------------------------------------------------------------

def test_diff_specs_lists_changed_added_and_removed_paths(ppo, spec_file):
    path = spec_file({'s': ppo})
    old = load_spec(path, 's')
    new = load_spec(path, 's', ['env.max_frame=999', 'agent.net.optim_spec.lr=0.01',
                                'agent.net.optim_spec.eps=1e-5'])
    diff = {p: (a, b) for p, a, b in diff_specs(old, new)}
    assert diff['env.max_frame'] == (256, 999)
    assert diff['agent.net.optim_spec.lr'] == (0.001, 0.01)
    assert diff['agent.net.optim_spec.eps'] == (None, 1e-5)
    assert 'meta.overrides' in diff
    assert set(diff) == {'env.max_frame', 'agent.net.optim_spec.lr', 'agent.net.optim_spec.eps', 'meta.overrides'}
    assert diff_specs(old, copy.deepcopy(old)) == []
    removed = dict((p, (a, b)) for p, a, b in diff_specs({'a': {'b': 1, 'c': 2}}, {'a': {'b': 1}}))
    assert removed == {'a.c': (2, None)}


@pytest.mark.parametrize('override,key', [
    ('agent.net.lr_scheduler_spec={"name": "StepLR", "step_size": "x"}', 'agent.net.lr_scheduler_spec'),
    ('agent.net.loss_spec={"name": "MSELoss", "reduction": "foo"}', 'agent.net.loss_spec'),
])
def test_torch_arguments_checked_only_on_use_fail_before_the_run(override, key, tmp_path):
    """Arguments torch accepts at construction but rejects when used are found by preflight."""
    from slm_lab import lab
    from slm_lab.lib.errors import SpecError
    spec_file = str(REPO_ROOT / 'spec' / 'demo.json')
    with pytest.raises(SpecError, match=key):
        lab.run(spec_file, 'ppo_cartpole', 'train', ['env.max_frame=1000', override], data_dir=str(tmp_path / 'data'))
    assert not (tmp_path / 'data').exists() or not any((tmp_path / 'data').iterdir())


def test_slm_labs_defaults_are_the_defaults(spec_file):
    """A key a SLM-Lab file leaves out means what SLM-Lab's default makes it (values from its
    init_algorithm_params / net defaults, v4.2.4 and v5)."""
    env = {'name': 'CartPole-v1', 'max_frame': 1000}
    reinforce = load_spec(spec_file({'r': {'agent': {'algorithm': {'name': 'Reinforce'}, 'memory': {
        'name': 'OnPolicyReplay'}, 'net': {'type': 'MLPNet'}}, 'env': env}}), 'r')
    assert reinforce['agent']['algorithm']['center_return'] is False
    dqn = load_spec(spec_file({'d': {'agent': {'algorithm': {'name': 'DQN'}, 'memory': {
        'name': 'Replay', 'batch_size': 48}, 'net': {'type': 'MLPNet', 'update_type': 'polyak'}}, 'env': env}}), 'd')
    assert dqn['agent']['algorithm']['training_start_step'] == 48  # the memory's batch_size
    assert dqn['agent']['algorithm']['action_pdtype'] == 'Argmax'
    assert dqn['agent']['algorithm']['action_policy'] == 'epsilon_greedy'
    assert dqn['agent']['net']['polyak_coef'] == 0.0 and dqn['agent']['net']['update_frequency'] == 1
