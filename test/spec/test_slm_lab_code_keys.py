"""Keys SLM-Lab's code reads that its published specs do not show, with the meaning they have in
SLM-Lab v5: env.clip_obs and env.clip_reward (and their defaults with normalisation), net.layer_norm,
net.actor_init_std / critic_init_std, net.cuda_id, PPO's symlog and normalize_advantages.
(test_spec_vocabulary.py checks that each is accepted or refused as waiting for its component.)
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import build_spec
from slm_lab.lib.errors import SpecError
from slm_lab.spec import validate_spec


def _env_spec(**keys) -> dict:
    spec = build_spec('PPO', num_envs=2)
    spec['env'].update(keys)
    return validate_spec(spec)['env']


def _run(env, steps: int):
    """(observations, rewards, final observations, recorded episode returns) of `steps` steps
    of action 0 in every sub-env."""
    obs_seen, rewards, finals, returns = [], [], [], []
    obs, _ = env.reset(seed=0)
    obs_seen.append(obs)
    for _ in range(steps):
        obs, reward, _, _, info = env.step(np.zeros(env.num_envs, dtype=np.int64))
        obs_seen.append(obs)
        rewards.append(reward)
        if '_final_obs' in info:
            finals += [o for o, done in zip(info['final_obs'], info['_final_obs']) if done]
        if '_episode' in info:
            returns += info['episode']['r'][info['_episode']].tolist()
    return np.concatenate(obs_seen), np.concatenate(rewards), finals, returns


def test_clip_defaults_follow_normalisation_and_an_explicit_null_turns_clipping_off():
    env = _env_spec()
    assert env['clip_obs'] is None and env['clip_reward'] is None
    env = _env_spec(normalize_obs=True, normalize_reward=True)
    assert env['clip_obs'] == 10.0 and env['clip_reward'] == 10.0  # SLM-Lab v5's defaults, saved as such
    env = _env_spec(normalize_obs=True, clip_obs=None)
    assert env['clip_obs'] is None
    assert validate_spec({**build_spec('PPO'), 'env': env})['env']['clip_obs'] is None  # a saved spec repeats it


def test_clip_obs_clips_raw_observations_and_final_observations():
    from slm_lab.env import make_env, make_single_env
    env_spec = _env_spec(clip_obs=0.02)
    env = make_env(env_spec)
    obs, _, finals, _ = _run(env, 60)  # CartPole falls within 60 steps of pushing left
    env.close()
    assert finals, 'no episode ended'
    assert np.abs(obs).max() <= 0.02 and np.abs(np.stack(finals)).max() <= 0.02
    assert np.isclose(np.abs(obs).max(), 0.02)  # the pole angle velocity grows past the bound
    single = make_single_env(env_spec)  # evaluation clips the same way
    single.reset(seed=0)
    done = False
    while not done:
        obs, _, terminated, truncated, _ = single.step(0)
        assert np.abs(obs).max() <= 0.02
        done = terminated or truncated
    single.close()


def test_clip_obs_with_normalize_obs_clips_the_normalised_observations_and_evaluation_too():
    from slm_lab.env import make_env, normalize_obs_fn
    env = make_env(_env_spec(normalize_obs=True, clip_obs=0.5))
    obs, _, finals, _ = _run(env, 60)
    assert np.abs(obs).max() == pytest.approx(0.5) and np.abs(np.stack(finals)).max() <= 0.5
    normalize = normalize_obs_fn(env)
    assert np.abs(normalize(np.full((1, 4), 100.0))).max() == pytest.approx(0.5)
    env.close()


@pytest.mark.parametrize('clip, expected', [(0.5, 0.5), ([-1.0, 0.25], 0.25)])
def test_clip_reward_clips_training_rewards_but_not_the_recorded_returns(clip, expected):
    from slm_lab.env import make_env
    env = make_env(_env_spec(clip_reward=clip))
    _, rewards, _, returns = _run(env, 60)
    env.close()
    assert set(rewards.tolist()) == {expected}  # CartPole's reward is 1 per step
    assert returns and all(r >= 8 for r in returns)  # whole episodes of reward 1


@pytest.mark.parametrize('value, message', [
    ([1.0, -1.0], 'min < max'), ([1.0], 'min < max'), (0, 'must be > 0'), ('big', 'expected number or list'),
])
def test_a_bad_clip_reward_is_one_line_naming_the_key(value, message):
    spec = build_spec('PPO')
    spec['env']['clip_reward'] = value
    with pytest.raises(SpecError) as e:
        validate_spec(spec)
    assert str(e.value).startswith('env.clip_reward:') and message in str(e.value) and '\n' not in str(e.value)


def test_layer_norm_puts_a_layer_norm_after_each_hidden_layer_and_in_the_snapshot_state():
    from slm_lab.agent.algorithm.policy_util import PolicyHead
    from slm_lab.agent.net.actor_critic import ActorCriticNet
    spec = build_spec('PPO')
    spec['agent']['net'].update(layer_norm=True, hid_layers=[8, 6])
    net = ActorCriticNet(validate_spec(spec)['agent']['net'], 4, 2, PolicyHead('Categorical', 2))
    kinds = [type(m).__name__ for m in net.actor.body]
    assert kinds[:3] == ['Linear', 'LayerNorm', kinds[2]] and kinds.count('LayerNorm') == 2
    assert 'actor.body.1.weight' in net.state_dict()  # its learned scale is saved with the weights
    hidden = net.actor.body[:2](torch.randn(5, 4))
    assert torch.allclose(hidden.mean(-1), torch.zeros(5), atol=1e-5)


@pytest.mark.parametrize('shared', [False, True])
def test_actor_and_critic_init_std_set_the_output_layers_orthogonal_gain(shared):
    from slm_lab.agent.algorithm.policy_util import PolicyHead
    from slm_lab.agent.net.actor_critic import ActorCriticNet
    spec = build_spec('PPO')
    spec['agent']['net'].update(shared=shared, actor_init_std=0.3, critic_init_std=2.0, hid_layers=[16])
    net = ActorCriticNet(validate_spec(spec)['agent']['net'], 4, 3, PolicyHead('Categorical', 3))
    actor = net.body.heads[0] if shared else net.actor.heads[0]
    critic = net.body.heads[1] if shared else net.critic.heads[0]
    for head, gain in ((actor, 0.3), (critic, 2.0)):
        w = head.weight.detach()  # (out, 16) with orthonormal rows scaled by the gain
        assert torch.allclose(w @ w.T, gain ** 2 * torch.eye(w.shape[0]), atol=1e-5)
        assert torch.count_nonzero(head.bias) == 0


def _gram_is(w: torch.Tensor, gain: float) -> bool:
    """w (out, in) with out <= in is orthogonal_ with this gain: W W^T = gain^2 I."""
    return torch.allclose(w @ w.T, gain ** 2 * torch.eye(w.shape[0]), atol=1e-4)


@pytest.mark.parametrize('shared', [False, True])
@pytest.mark.parametrize('activation', ['tanh', 'relu'])
def test_without_init_std_keys_the_output_layers_take_the_activation_gain_as_in_slm_lab(shared, activation):
    """SLM-Lab's init_layers gives every Linear, the policy and value outputs included, the hidden
    activation's gain (5/3 for tanh, sqrt 2 for relu); a fixed 0.01 / 1 here would fail."""
    from slm_lab.agent.algorithm.policy_util import PolicyHead
    from slm_lab.agent.net.actor_critic import ActorCriticNet
    spec = build_spec('PPO')
    spec['agent']['net'].update(shared=shared, hid_layers=[16], hid_layers_activation=activation,
                                init_fn='orthogonal_')
    net = ActorCriticNet(validate_spec(spec)['agent']['net'], 4, 3, PolicyHead('Categorical', 3))
    gain = torch.nn.init.calculate_gain(activation)
    heads = list(net.body.heads) if shared else [net.actor.heads[0], net.critic.heads[0]]
    assert len(heads) == 2 and all(_gram_is(head.weight.detach(), gain) for head in heads)


def test_reinforce_and_dueling_output_layers_take_the_activation_gain():
    from conftest import make_agent
    from slm_lab.agent.net import build_net
    spec = build_spec('Reinforce')
    spec['agent']['net'].update(hid_layers=[16], hid_layers_activation='relu', init_fn='orthogonal_')
    agent, _ = make_agent(spec)
    assert _gram_is(agent.algorithm.net.heads[0].weight.detach(), 2 ** 0.5)
    net_spec = validate_spec(spec)['agent']['net']
    dueling = build_net({**net_spec, 'type': 'DuelingMLPNet'}, 4, 3)
    assert all(_gram_is(head.weight.detach(), 2 ** 0.5) for head in dueling.heads)


def test_cuda_id_picks_the_gpu_index(monkeypatch):
    from slm_lab.agent.net import net_util
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    assert net_util.get_device(True, 1) == torch.device('cuda:1')
    with pytest.raises(SpecError, match=r'^agent\.net\.cuda_id: 2 is out of range.*use 0 to 1'):
        net_util.get_device(True, 2)
    assert net_util.get_device('auto', None) == torch.device('cuda')
    assert net_util.get_device(False, 1) == torch.device('cpu')


def test_symlog():
    from slm_lab.agent.algorithm.ppo import symlog
    x = torch.tensor([-(np.e - 1), -0.5, 0.0, 0.5, np.e ** 2 - 1], dtype=torch.float64)
    expected = torch.tensor([-1.0, -np.log(1.5), 0.0, np.log(1.5), 2.0], dtype=torch.float64)
    assert torch.allclose(symlog(x), expected, atol=1e-6)


def _ppo(**algo):
    """A PPO algorithm on 4-dim observations and 2 actions, 2 envs, time_horizon 3, minibatches of 4, 4 epochs."""
    import gymnasium as gym
    from slm_lab.agent import Agent
    from slm_lab.env import Clock
    spec = build_spec('PPO', num_envs=2)
    spec['agent']['algorithm'].update(time_horizon=3, minibatch_size=4, training_epoch=4, **algo)
    spec = validate_spec(spec)
    return Agent(spec, gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2), 2,
                 Clock(1000, 2), seed=0).algorithm


@pytest.mark.parametrize('clip_vloss', [False, True])
def test_ppo_with_symlog_fits_values_in_symlog_space(clip_vloss, monkeypatch):
    from slm_lab.agent.algorithm import ppo
    made, fitted = [], []

    def spy_symlog(x):
        made.append(ppo_symlog(x))
        return made[-1]

    def spy_value_loss(values, old_values, returns, clip_eps, sample_loss):
        fitted.append((values, old_values, returns))
        return real_value_loss(values, old_values, returns, clip_eps, sample_loss)

    ppo_symlog, real_value_loss = ppo.symlog, ppo.ppo_value_loss
    monkeypatch.setattr(ppo, 'symlog', spy_symlog)
    monkeypatch.setattr(ppo, 'ppo_value_loss', spy_value_loss)
    algo = _ppo(symlog=True, clip_vloss=clip_vloss)
    real_loss = algo.loss_fn
    algo.loss_fn = lambda values, returns: fitted.append((values, returns)) or real_loss(values, returns)
    rng = np.random.default_rng(0)
    for _ in range(3):
        algo.update(rng.normal(size=(2, 4)).astype(np.float32), np.array([0, 1]), np.full(2, 50.0, np.float32),
                    rng.normal(size=(2, 4)).astype(np.float32), np.zeros(2, bool), np.zeros(2, bool))
    assert len(fitted) == 2 * 4  # minibatches of 4 and 2, 4 epochs
    for args in fitted:  # every value-loss input is a symlog output: V, R (and V_old with clip_vloss)
        assert len(args) == (3 if clip_vloss else 2)
        assert all(any(a is m for m in made) for a in args)
    assert max(float(a.detach().abs().max()) for args in fitted for a in args) < np.log1p(200)


def test_normalize_advantages_standardize_is_normalize_advantage_and_percentile_is_accepted():
    spec = build_spec('PPO')
    spec['agent']['algorithm']['normalize_advantages'] = 'standardize'
    algo = validate_spec(spec)['agent']['algorithm']
    assert algo['normalize_advantages'] == 'standardize' and algo['normalize_advantage'] is True
    spec['agent']['algorithm']['normalize_advantage'] = False
    with pytest.raises(SpecError, match='contradicts normalize_advantage'):
        validate_spec(spec)
    spec['agent']['algorithm'].update(normalize_advantage=True, normalize_advantages='percentile')
    assert validate_spec(spec)['agent']['algorithm']['normalize_advantages'] == 'percentile'
    spec['agent']['algorithm']['normalize_advantages'] = 'standardise'
    with pytest.raises(SpecError, match="did you mean 'standardize'"):
        validate_spec(spec)


@pytest.mark.slow
def test_resume_with_these_keys_is_exact(tmp_path):
    """Layer norm weights, clipped observations and rewards and the symlog value loss continue
    exactly across a resume (the same check as test_resume's, on a spec using every one)."""
    import copy
    from pathlib import Path
    from slm_lab import lab
    from lab_helpers import PENDULUM, assert_same_run, run_dirs, write_spec
    spec = copy.deepcopy(PENDULUM)
    spec['agent']['net'].update(layer_norm=True, actor_init_std=0.01, critic_init_std=1.0)
    spec['agent']['algorithm'].update(symlog=True, clip_vloss=True, normalize_advantages='standardize')
    spec['env'].update(max_frame=1024, clip_obs=3.0, clip_reward=[-0.5, 0.5])
    spec['meta'].update(log_frequency=256, eval_frequency=512)
    name = 'code_keys'
    spec_file = write_spec(tmp_path, name, spec)
    data_a, data_b = str(tmp_path / 'a'), str(tmp_path / 'b')
    lab.run(spec_file, name, 'train', data_dir=data_a)
    lab.run(spec_file, name, 'train@latest', ['env.max_frame=2048'], data_dir=data_a)
    lab.run(spec_file, name, 'train', ['env.max_frame=2048'], data_dir=data_b)
    (run_a,), (run_b,) = run_dirs(Path(data_a), name), run_dirs(Path(data_b), name)
    assert_same_run(run_a, run_b, name)


def test_a_mujoco_playground_env_is_one_line_naming_its_package():
    spec = build_spec('PPO', env='playground/CartpoleBalance')
    spec['env']['device'] = 'auto'  # SLM-Lab v5 reads it for these envs only
    with pytest.raises(SpecError) as e:
        validate_spec(spec)
    message = str(e.value)
    assert message.startswith('env.name:') and 'mujoco_playground' in message and '\n' not in message
