"""Every key path and named value of SLM-Lab's published specs (v4.2.4 and v5.3) is accepted by the
validator with SLM-Lab's meaning, or refused with the one "not available yet" line naming the
component it waits for. The list is test/fixtures/slm_lab_spec_vocabulary.md (key paths counted
over SLM-Lab's JSON specs); the values set here are ones those specs use.
"""
from __future__ import annotations

import copy
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import build_spec, make_agent
from slm_lab.lib.errors import SpecError
from slm_lab.spec import validate_spec

VOCABULARY = Path(__file__).resolve().parents[1] / 'fixtures' / 'slm_lab_spec_vocabulary.md'
LATER = 'not available yet'

SCHEDULE = {'name': 'linear_decay', 'start_val': 1.0, 'end_val': 0.1, 'start_step': 0, 'end_step': 1000}
OPTIM = {'name': 'RMSprop', 'lr': 0.001, 'alpha': 0.99, 'eps': 1e-5}
LOOKAHEAD = {'name': 'Lookahead', 'optimizer': 'RAdam', 'lr': 0.001}
# key paths whose value (in VALUES) is their whole parent object: set at the parent
SET_PARENT = ('.optimizer', 'lr_scheduler_spec.gamma', 'lr_scheduler_spec.milestones', 'lr_scheduler_spec.step_size')

# key path -> (base spec, value). Base specs are the lab's algorithms (conftest) or, for keys that
# only a later component reads, a lab spec holding the key (the key itself is then refused).
VALUES = {
    'agent.algorithm.action_pdtype': ('DQN', 'Argmax'),
    'agent.algorithm.action_policy': ('DQN', 'epsilon_greedy'),
    'agent.algorithm.center_return': ('Reinforce', True),
    'agent.algorithm.clip_eps_spec': ('PPO', SCHEDULE),
    'agent.algorithm.clip_val_loss': ('PPO', False),
    'agent.algorithm.clip_vloss': ('PPO', True),
    'agent.algorithm.entropy_coef_spec': ('PPO', SCHEDULE),
    'agent.algorithm.explore_var_spec': ('DQN', SCHEDULE),
    'agent.algorithm.gamma': ('PPO', 0.99),
    'agent.algorithm.lam': ('PPO', 0.95),
    'agent.algorithm.minibatch_size': ('PPO', 64),
    'agent.algorithm.name': ('PPO', 'PPO'),
    'agent.algorithm.normalize_state': ('DQN', True),
    'agent.algorithm.normalize_v_targets': ('PPO', False),
    'agent.algorithm.num_step_returns': ('ActorCritic', 5),
    'agent.algorithm.policy_loss_coef': ('ActorCritic', 1.0),
    'agent.algorithm.sil_policy_loss_coef': ('PPOSIL', 1.0),
    'agent.algorithm.sil_val_loss_coef': ('PPOSIL', 0.01),
    'agent.algorithm.time_horizon': ('PPO', 128),
    'agent.algorithm.training_batch_iter': ('DQN', 4),
    'agent.algorithm.training_epoch': ('PPO', 4),
    'agent.algorithm.training_frequency': ('PPO', 1),
    'agent.algorithm.training_iter': ('DQN', 8),
    'agent.algorithm.training_start_step': ('DQN', 32),
    'agent.algorithm.val_loss_coef': ('PPO', 0.5),
    'agent.memory.alpha': ('DQN', 0.6),
    'agent.memory.batch_size': ('DQN', 32),
    'agent.memory.cross_entropy': ('SARSA', 1.0),
    'agent.memory.epsilon': ('DQN', 0.0001),
    'agent.memory.max_size': ('DQN', 10000),
    'agent.memory.name': ('DQN', 'Replay'),
    'agent.memory.sil_replay_name': ('SIL', 'Replay'),
    'agent.memory.use_cer': ('DQN', True),
    'agent.name': ('PPO', 'A2C'),
    'agent.net.actor_optim_spec': ('PPO', OPTIM),
    'agent.net.actor_optim_spec.optimizer': ('PPO', LOOKAHEAD),
    'agent.net.batch_norm': ('PPO', False),
    'agent.net.cell_type': ('PPO', 'GRU'),
    'agent.net.clip_grad_val': ('PPO', 0.5),
    'agent.net.conv_hid_layers': ('PPO', [[32, 8, 4, 0, 1]]),
    'agent.net.critic_optim_spec': ('PPO', OPTIM),
    'agent.net.critic_optim_spec.optimizer': ('PPO', LOOKAHEAD),
    'agent.net.fc_hid_layers': ('PPO', [512]),
    'agent.net.gpu': ('PPO', 'auto'),
    'agent.net.hid_layers': ('PPO', [64, 64]),
    'agent.net.hid_layers_activation': ('PPO', 'tanh'),
    'agent.net.init_fn': ('PPO', 'orthogonal_'),
    'agent.net.log_std_init': ('PPO', 0.0),
    'agent.net.loss_spec': ('PPO', {'name': 'SmoothL1Loss'}),
    'agent.net.lr_scheduler_spec': ('PPO', {'name': 'LinearToZero', 'frame': 1e7}),
    'agent.net.lr_scheduler_spec.gamma': ('PPO', {'name': 'StepLR', 'step_size': 1000, 'gamma': 0.9}),
    'agent.net.lr_scheduler_spec.milestones': ('PPO', {'name': 'MultiStepLR', 'milestones': [1000, 2000],
                                                        'gamma': 0.5}),
    'agent.net.lr_scheduler_spec.step_size': ('PPO', {'name': 'StepLR', 'step_size': 1000, 'gamma': 0.9}),
    'agent.net.normalize': ('PPO', True),
    'agent.net.optim_spec': ('DQN', {'name': 'AdamW', 'lr': 0.001, 'eps': 1e-5}),
    'agent.net.optim_spec.optimizer': ('DQN', LOOKAHEAD),
    'agent.net.polyak_coef': ('DQN', 0.995),
    'agent.net.rnn_hidden_size': ('PPO', 64),
    'agent.net.rnn_num_layers': ('PPO', 1),
    'agent.net.seq_len': ('PPO', 4),
    'agent.net.shared': ('PPO', True),
    'agent.net.type': ('PPO', 'MLPNet'),
    'agent.net.update_frequency': ('DQN', 100),
    'agent.net.update_type': ('DQN', 'polyak'),
    'agent.net.use_same_optim': ('PPO', True),
    'env.continuous': ('PPO', True),  # with LunarLander-v3, below
    'env.frame_op': ('DQN', 'concat'),
    'env.frame_op_len': ('DQN', 4),
    'env.image_downsize': ('DQN', [64, 64]),
    'env.life_loss_info': ('DQN', True),
    'env.max_frame': ('PPO', 1e7),
    'env.max_t': ('PPO', None),
    'env.name': ('PPO', 'CartPole-v1'),
    'env.normalize_obs': ('PPO', True),
    'env.normalize_reward': ('PPO', True),
    'env.normalize_state': ('PPO', False),
    'env.num_envs': ('PPO', 4),
    'env.repeat_action_probability': ('DQN', 0.0),  # with an ALE game, below
    'env.reward_scale': ('DQN', 'sign'),
    'env.unity': ('DQN', {'gridSize': 6, 'numGoals': 1, 'numObstacles': 0}),
    'meta.distributed': ('PPO', False),
    'meta.eval_frequency': ('PPO', 1000),
    'meta.log_frequency': ('PPO', 1000),
    'meta.max_session': ('PPO', 4),
    'meta.max_trial': ('PPO', 1),
    'meta.num_gpus': ('PPO', 1),
    'meta.rigorous_eval': ('PPO', 0),
    'meta.search': ('PPO', 'RandomSearch'),
    'meta.search_resources': ('PPO', {'cpu': 1, 'gpu': 0.125}),
    'meta.search_scheduler': ('PPO', {'grace_period': 200000.0, 'reduction_factor': 3}),
    'meta.train_mode': ('PPO', True),
    'spec_params': ('PPO', {'env': ['CartPole-v1', 'Acrobot-v1']}),
    'body': ('PPO', {'product': 'outer', 'num': 1}),
}
# key paths a later component reads -> a name the refusal must contain
WAITS_FOR = {
    'env.unity': 'Unity',
}
CONV_KEYS = ('agent.net.conv_hid_layers', 'agent.net.fc_hid_layers')
RECURRENT_KEYS = ('agent.net.cell_type', 'agent.net.rnn_hidden_size', 'agent.net.rnn_num_layers', 'agent.net.seq_len',
                  'agent.net.bidirectional')
# key paths whose value is an object the spec gives whole: its own rows are covered by it
OBJECT_KEYS = ('agent.algorithm.clip_eps_spec', 'agent.algorithm.entropy_coef_spec', 'agent.algorithm.explore_var_spec',
               'agent.net.actor_optim_spec', 'agent.net.critic_optim_spec', 'agent.net.optim_spec',
               'agent.net.loss_spec', 'agent.net.lr_scheduler_spec', 'agent.net.lr_scheduler_spec.gamma',
               'meta.search_resources', 'meta.search_scheduler', 'env.unity', 'body', 'spec_params')
CANONICAL = {'agent.algorithm.clip_val_loss': 'agent.algorithm.clip_vloss'}  # SLM-Lab's renamed keys
SECTIONS = ('agent', 'agent.algorithm', 'agent.memory', 'agent.net', 'env', 'meta')
NAMED_VALUE_KEYS = {  # named-value key path -> the key path of VALUES that sets the same key
    'agent.net.actor_optim_spec.name': 'agent.net.actor_optim_spec',
    'agent.net.critic_optim_spec.name': 'agent.net.critic_optim_spec',
    'agent.net.optim_spec.name': 'agent.net.optim_spec',
    'agent.net.loss_spec.name': 'agent.net.loss_spec',
    'agent.net.lr_scheduler_spec.name': 'agent.net.lr_scheduler_spec',
    'agent.algorithm.clip_eps_spec.name': 'agent.algorithm.clip_eps_spec',
    'agent.algorithm.entropy_coef_spec.name': 'agent.algorithm.entropy_coef_spec',
    'agent.algorithm.explore_var_spec.name': 'agent.algorithm.explore_var_spec',
}
LATER_NAMES = {  # named values that wait for a later component (the refusal names the value)
    'agent.algorithm.action_policy': {'multi_boltzmann', 'multi_epsilon_greedy'},
    'agent.algorithm.name': {'HydraDQN'},
    'agent.net.type': {'HydraMLPNet'},
}


def vocabulary() -> tuple[list[str], dict[str, list[str]]]:
    """(key paths, {key path: named values}) of the vocabulary file."""
    text = VOCABULARY.read_text(encoding='utf-8')
    paths = re.findall(r'^\| `([^`]+)` \| \d+ \| \d+ \|$', text, re.M)
    named = {m.group(1): re.findall(r'([A-Za-z_]\w*) \(\d+/\d+\)', m.group(2))
             for m in re.finditer(r'^- `([^`]+)`: (.*)$', text, re.M)}
    return paths, named


PATHS, NAMED = vocabulary()


# the memory a memory key belongs to (the base spec's memory is switched to it)
MEMORY_OF = {'agent.memory.alpha': 'PrioritizedReplay', 'agent.memory.epsilon': 'PrioritizedReplay',
             'agent.memory.cross_entropy': 'OnPolicyCrossEntropy'}
SARSA = {'algorithm': {'name': 'SARSA', 'action_pdtype': 'Argmax', 'action_policy': 'epsilon_greedy',
                       'explore_var_spec': SCHEDULE, 'training_frequency': 8},
         'memory': {'name': 'OnPolicyReplay'}}


def base_spec(base: str) -> dict:
    """conftest's spec for `base`, or SARSA (with conftest's net) for 'SARSA'."""
    if base == 'SoftActorCritic':  # conftest's DQN spec (a Replay memory) run by SAC
        spec = build_spec('DQN')
        spec['agent']['name'] = spec['agent']['algorithm']['name'] = base
        return spec
    if base != 'SARSA':
        return build_spec(base)
    spec = build_spec('Reinforce')
    spec['agent'].update(copy.deepcopy(SARSA), name='SARSA')
    return spec


def spec_with(path: str, value, base: str) -> dict:
    """A runnable lab spec (conftest's, for `base`) with the key at `path` set to `value`."""
    spec = base_spec(base)
    if path in MEMORY_OF:
        spec['agent']['memory']['name'] = MEMORY_OF[path]
    if path.startswith('env.continuous'):
        spec['env']['name'] = 'LunarLander-v3'
    if path.startswith(('env.repeat_action_probability', 'env.life_loss_info', 'env.image_downsize')):
        spec['env']['name'] = 'ALE/Pong-v5'
    if path == 'env.frame_op':  # SLM-Lab's specs give both
        spec['env']['frame_op_len'] = 4
    if path in CONV_KEYS:  # keys of ConvNet, which SLM-Lab's specs give with it
        spec['agent']['net'] = {'type': 'ConvNet', 'conv_hid_layers': [[8, 8, 4]]}
    if path in RECURRENT_KEYS:  # keys of RecurrentNet
        spec['agent']['net'] = {'type': 'RecurrentNet', 'shared': True}
    if path in ('body', 'spec_params'):
        spec[path] = copy.deepcopy(value)
        return spec
    if path.endswith(SET_PARENT):
        path = path.rsplit('.', 1)[0]
    *parents, key = path.split('.')
    node = spec
    for part in parents:
        node = node.setdefault(part, {})
    node[key] = copy.deepcopy(value)
    return spec


def outcome(spec: dict) -> str | dict:
    """The validated spec, or the error line."""
    try:
        return validate_spec(spec)
    except SpecError as e:
        return str(e)


def leaf_of(path: str) -> str | None:
    """The VALUES entry that covers a key path: itself, or the object key it is part of."""
    if path in VALUES:
        return path
    for key in sorted(VALUES, key=len, reverse=True):
        if key in OBJECT_KEYS and path.startswith(key + '.'):
            return key
    return None


def test_the_vocabulary_file_is_read():
    assert len(PATHS) > 120 and 'agent.algorithm.clip_val_loss' in PATHS and 'meta.search_scheduler' in PATHS
    assert 'Argmax' in NAMED['agent.algorithm.action_pdtype']


@pytest.mark.parametrize('path', PATHS)
def test_every_slm_lab_key_path_is_accepted_or_waits_for_its_component(path):
    if path in SECTIONS:
        assert any(p.startswith(path + '.') for p in PATHS)
        return
    key = leaf_of(path)
    assert key is not None, f'{path}: no value to test it with; add one to VALUES'
    if path == 'env.continuous':
        pytest.importorskip('Box2D', reason='LunarLander needs the box2d extra')
    if path in ('env.repeat_action_probability', 'env.life_loss_info', 'env.image_downsize'):
        pytest.importorskip('ale_py', reason='ALE games need the atari extra')
    base, value = VALUES[key]
    result = outcome(spec_with(key, value, base))
    waits_for = WAITS_FOR.get(path) or WAITS_FOR.get(key)
    if waits_for:
        assert isinstance(result, str) and LATER in result and waits_for in result, result
        assert result.startswith(key.split('.')[0]) and '\n' not in result
        return
    assert isinstance(result, dict), f'{path}: refused: {result}'
    if path in ('body', 'spec_params') or path.startswith('body.'):
        return
    node = result
    for part in CANONICAL.get(key, key).split('.')[:-1 if key.endswith(SET_PARENT) else None]:
        node = node[part]  # kept in the validated (saved) spec, an alias under its canonical name


def test_alias_is_saved_under_its_canonical_name():
    result = outcome(spec_with('agent.algorithm.clip_val_loss', True, 'PPO'))
    assert result['agent']['algorithm']['clip_vloss'] is True
    assert 'clip_val_loss' not in result['agent']['algorithm']


def test_alias_and_canonical_name_may_repeat_one_value_but_not_differ():
    spec = spec_with('agent.algorithm.clip_val_loss', True, 'PPO')
    spec['agent']['algorithm']['clip_vloss'] = True
    assert outcome(spec)['agent']['algorithm']['clip_vloss'] is True
    spec['agent']['algorithm']['clip_vloss'] = False
    message = outcome(spec)
    assert message.startswith('agent.algorithm.clip_val_loss:') and 'clip_vloss' in message


@pytest.mark.parametrize('path, value', [(p, v) for p, values in NAMED.items() for v in values])
def test_every_named_value_is_accepted_or_waits_for_its_component(path, value):
    key = NAMED_VALUE_KEYS.get(path, path)
    base, sample = VALUES[key]
    if key != path:  # a name inside an object such as optim_spec
        sample = {'name': value, 'lr': 0.001} if 'optim' in path else {**sample, 'name': value}
        if path.endswith('lr_scheduler_spec.name') and value != 'LinearToZero':
            sample = {'name': value, 'step_size': 100} if value == 'StepLR' else {'name': value, 'milestones': [100]}
        if path.endswith('_spec.name') and 'decay' in value:
            sample = {**SCHEDULE, 'name': value}
        value_to_set = sample
    else:
        value_to_set = value
    if path == 'agent.memory.name' and value.startswith('OnPolicy'):
        base = 'SARSA' if value == 'OnPolicyCrossEntropy' else 'Reinforce'
    if path == 'agent.algorithm.name':
        base = {'Random': 'Random', 'Reinforce': 'Reinforce', 'PPO': 'PPO', 'ActorCritic': 'ActorCritic',
                'SARSA': 'SARSA'}.get(value, 'DQN')
    if path == 'agent.algorithm.name' and value in ('SIL', 'PPOSIL'):
        base = value
    if path == 'agent.algorithm.action_pdtype' and value in ('Categorical', 'Normal'):
        base = 'Reinforce'
    if path == 'agent.algorithm.action_policy' and value == 'default':
        base = 'Reinforce'
    spec = spec_with(key, value_to_set, base)
    if path == 'agent.net.type' and ('Conv' in value or value == 'RecurrentNet'):  # fc_hid_layers, not hid_layers
        spec['agent']['net'].pop('hid_layers', None)
    if value == 'Normal':
        spec['env']['name'] = 'Pendulum-v1'
    result = outcome(spec)
    if value in LATER_NAMES.get(path, ()):
        assert isinstance(result, str) and LATER in result and value in result, result
    else:
        assert isinstance(result, dict), f'{path} = {value}: refused: {result}'


def test_unknown_keys_slm_lab_does_not_read_are_still_named_with_a_suggestion():
    spec = build_spec('PPO')
    spec['agent']['algorithm']['time_horizn'] = 64
    message = outcome(spec)
    assert message.startswith('agent.algorithm.time_horizn: unknown key') and "did you mean 'time_horizon'" in message


def test_env_key_typo_is_named_with_the_lab_key_or_the_env_argument():
    spec = build_spec('PPO')
    spec['env']['max_frme'] = 100
    message = outcome(spec)
    assert message.startswith('env.max_frme:') and "did you mean 'max_frame'" in message
    spec = build_spec('PPO')
    spec['env']['sutton_barto_rewad'] = True
    message = outcome(spec)
    assert message.startswith('env.sutton_barto_rewad:') and "did you mean 'sutton_barto_reward'" in message
    assert 'CartPole-v1 arguments: sutton_barto_reward' in message


def test_env_keys_outside_the_lab_s_own_reach_the_env_constructor():
    from slm_lab.env import make_env, make_single_env
    spec = build_spec('PPO')
    spec['env']['sutton_barto_reward'] = True  # CartPole: reward 0 per step, -1 when the pole falls
    env_spec = validate_spec(spec)['env']
    assert env_spec['sutton_barto_reward'] is True
    env = make_env(env_spec)
    env.reset(seed=0)
    _, reward, *_ = env.step(np.zeros(1, dtype=np.int64))
    assert reward.tolist() == [0.0]
    assert make_single_env(env_spec).unwrapped._sutton_barto_reward is True
    env.close()


@pytest.mark.parametrize('scale, expected', [(2.5, 2.5), ('sign', 1.0)])
def test_reward_scale_scales_training_rewards_but_not_the_recorded_returns(scale, expected):
    from slm_lab.env import make_env
    spec = build_spec('PPO')
    spec['env']['reward_scale'] = scale
    env = make_env(validate_spec(spec)['env'])
    env.reset(seed=0)
    done, total = False, 0.0
    while not done:
        _, reward, terminated, truncated, info = env.step(np.zeros(1, dtype=np.int64))
        assert reward.tolist() == [expected]  # CartPole's reward is 1 per step
        total += 1.0
        done = bool(terminated[0] or truncated[0])
    assert info['episode']['r'].tolist() == [total]
    env.close()


def test_linear_to_zero_frame_sets_where_the_learning_rate_reaches_zero():
    import torch
    from slm_lab.agent.net import net_util
    from slm_lab.env import Clock
    clock = Clock(max_frame=1000)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = net_util.make_lr_scheduler(opt, {'name': 'LinearToZero', 'frame': 100}, clock)
    clock.frame = 50
    opt.step()
    sched.step()
    assert opt.param_groups[0]['lr'] == pytest.approx(0.5)  # half of the way to frame 100, not to max_frame


def test_log_std_init_sets_the_initial_standard_deviation(lab_run):
    spec = build_spec('PPO', env='Pendulum-v1', max_frame=64)
    spec['agent']['net']['log_std_init'] = -0.5
    spec['agent']['algorithm']['time_horizon'] = 32
    agent, _ = make_agent(spec)
    assert agent.algorithm.model.head.log_std.tolist() == [-0.5]
    lab_run(spec, 'log_std')  # trains with it


# Keys SLM-Lab's code reads that none of its published specs holds (so the vocabulary file lacks
# them), which users' own specs may: key path -> (base spec, value, where SLM-Lab reads it (file at
# the tag or HEAD), the component the refusal names, or None when the key is accepted).
_SAC = 'slm_lab/agent/algorithm/sac.py (HEAD, SoftActorCritic.init_algorithm_params)'
CODE_READ = {
    'env.clip_obs': ('PPO', 5.0, 'slm_lab/env/__init__.py (HEAD, make_env)', None),
    'env.clip_reward': ('PPO', [-1.0, 1.0], 'slm_lab/env/__init__.py (HEAD, make_env)', None),
    'env.device': ('PPO', 'auto', 'slm_lab/env/__init__.py (HEAD, make_env: MuJoCo Playground only)', None),
    'agent.net.layer_norm': ('PPO', True, 'slm_lab/agent/net/mlp.py (HEAD, MLPNet)', None),
    'agent.net.actor_init_std': ('PPO', 0.01, 'slm_lab/agent/net/mlp.py (HEAD, MLPNet)', None),
    'agent.net.critic_init_std': ('PPO', 1.0, 'slm_lab/agent/net/mlp.py (HEAD, MLPNet)', None),
    'agent.net.cuda_id': ('DQN', 0, 'slm_lab/agent/net/base.py (v4.2.4 and HEAD, Net)', None),
    'agent.net.bidirectional': ('PPO', False, 'slm_lab/agent/net/recurrent.py (v4.2.4 and HEAD)', None),
    # agent.net.arc and arc_file: TorchArcNet's own keys (test/agent/test_torcharc_net.py)
    'agent.algorithm.symlog': ('PPO', True, 'slm_lab/agent/algorithm/ppo.py (HEAD, PPO)', None),
    'agent.algorithm.normalize_advantages': ('PPO', 'standardize', 'slm_lab/agent/algorithm/ppo.py (HEAD, PPO)', None),
    'agent.algorithm.policy_delay': ('SoftActorCritic', 2, _SAC, None),
    'agent.algorithm.entropy_penalty_coef': ('SoftActorCritic', 0.1, _SAC, None),
    'agent.algorithm.log_alpha_min': ('SoftActorCritic', -5.0, _SAC, None),
    'agent.algorithm.log_alpha_max': ('SoftActorCritic', 2.0, _SAC, None),
    'agent.algorithm.alpha_lr': ('SoftActorCritic', 3e-4, _SAC, None),
    'agent.algorithm.fixed_alpha': ('SoftActorCritic', 0.2, _SAC, None),
    'agent.algorithm.alpha_anneal_frames': ('SoftActorCritic', 1000, _SAC, None),
    'agent.algorithm.target_entropy': ('SoftActorCritic', 'auto', _SAC, None),
    'agent.algorithm.entropy_anneal': ('SoftActorCritic', {'start_ratio': 0.8, 'end_ratio': 0.3, 'frames': 1000},
                                       _SAC, None),
    'agent.algorithm.spectral_norm': ('SoftActorCritic', True, _SAC, 'spectral normalisation'),
    **{f'meta.{key}': ('PPO', value, 'slm_lab/spec/spec_util.py (v4.2.4 and HEAD, extend_meta_spec and tick)', None)
       for key, value in (('experiment', 0), ('resume', False), ('cuda_offset', 0),
                          ('prepath', 'data/ppo_cartpole_2020_01_01_000000/ppo_cartpole_t0_s0'),
                          ('predir', 'data/ppo_cartpole_2020_01_01_000000'),
                          ('graph_prepath', 'data/x/graph/ppo_cartpole_t0_s0'),
                          ('info_prepath', 'data/x/info/ppo_cartpole_t0_s0'),
                          ('log_prepath', 'data/x/log/ppo_cartpole_t0_s0'),
                          ('model_prepath', 'data/x/model/ppo_cartpole_t0_s0'))},
}


def test_code_read_keys_are_not_in_the_vocabulary_file():
    assert not set(CODE_READ) & set(PATHS)  # else they belong to VALUES


@pytest.mark.parametrize('path', sorted(CODE_READ))
def test_every_key_slm_lab_s_code_reads_is_accepted_or_waits_for_its_component(path):
    base, value, _where, waits_for = CODE_READ[path]
    result = outcome(spec_with(path, value, base))
    if waits_for:
        assert isinstance(result, str) and LATER in result and waits_for in result, result
        assert result.startswith(path) and '\n' not in result
        return
    assert isinstance(result, dict), f'{path}: refused: {result}'
    node = result
    for part in path.split('.')[:-1]:
        node = node[part]
    if not path.startswith('meta.'):  # SLM-Lab's run records are ignored, the rest kept as given
        assert node[path.split('.')[-1]] == value
