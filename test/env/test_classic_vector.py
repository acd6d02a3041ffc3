"""env.vector_backend "numpy" (env/classic.py): CartPole's and Acrobot's sub-envs stepped together
give what gymnasium's sync vector env of them gives, bit for bit; the lab picks it where it fits; a
run on it is the run on gymnasium's; its snapshot restores exactly; a run started on gymnasium's env
continues on it."""
from __future__ import annotations

import copy
import json
import shutil

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.classic_control import AcrobotEnv, CartPoleEnv
from lab_helpers import PPO, ROOT, assert_same_run, drop_saved_key, saved_values, spec_file_in, train_one

from slm_lab.env import classic, make_env
from slm_lab.env.classic import AcrobotVector, CartPoleVector
from slm_lab.env.schema import check_env
from slm_lab.experiment.search.specs import search_params, trial_spec
from slm_lab.lib.errors import SpecError
from slm_lab.persistence.env_state import load_vector_env_state_dict, vector_env_state_dict
from slm_lab.spec import validate_spec

NAME = 'ppo_cartpole_backend'


def gymnasiums(name: str, n: int, max_t: int | None = None) -> gym.vector.VectorEnv:
    kwargs = {'max_episode_steps': max_t} if max_t else {}
    return gym.make_vec(name, num_envs=n, vectorization_mode='sync',
                        vector_kwargs={'autoreset_mode': gym.vector.AutoresetMode.SAME_STEP}, **kwargs)


def policy_actions(obs: np.ndarray, rng: np.random.Generator, t: int) -> np.ndarray:
    """Random actions, and stretches of a policy that reaches both ends of an episode: for CartPole
    (4 numbers) one that balances the pole for a few hundred steps and now and then to the time
    limit; for Acrobot (6) one that swings it up within about 100 steps, then one that keeps it
    down to the time limit."""
    if obs.shape[1] == 4:
        if (t // 600) % 2:
            return (0.3 * obs[:, 2] + obs[:, 3] > 0).astype(np.int64)
        return rng.integers(0, 2, len(obs))
    stretch = (t // 600) % 3
    if stretch == 1:
        return np.where(obs[:, 5] > 0, 2, 0)
    if stretch == 2:
        return np.where(obs[:, 4] > 0, 2, 0)
    return rng.integers(0, 3, len(obs))


def assert_same_step(a, b) -> None:
    for x, y in zip(a[:4], b[:4]):
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)
    info_a, info_b = a[4], b[4]
    assert info_a.keys() == info_b.keys()
    if '_final_obs' in info_a:
        assert np.array_equal(info_a['_final_obs'], info_b['_final_obs'])
        assert np.array_equal(info_a['_final_info'], info_b['_final_info'])
        assert info_a['final_info'] == info_b['final_info']
        for i in np.flatnonzero(info_a['_final_obs']):
            assert info_a['final_obs'][i].dtype == info_b['final_obs'][i].dtype
            assert np.array_equal(info_a['final_obs'][i], info_b['final_obs'][i])


@pytest.mark.parametrize('name,n,max_t', [('CartPole-v1', 8, None), ('CartPole-v0', 3, None), ('CartPole-v1', 5, 60),
                                          ('Acrobot-v1', 6, None), ('Acrobot-v1', 2, 90)])
def test_it_steps_as_gymnasiums_sync_vector_env_bit_for_bit(name, n, max_t):
    vector_env, limit = classic.IDS[name]
    theirs, ours = gymnasiums(name, n, max_t), vector_env(n, max_t or limit)
    assert (ours.single_observation_space, ours.single_action_space) == \
        (theirs.single_observation_space, theirs.single_action_space)
    assert (ours.observation_space, ours.action_space) == (theirs.observation_space, theirs.action_space)
    assert ours.metadata['autoreset_mode'] == theirs.metadata['autoreset_mode']
    rng = np.random.default_rng(0)
    ends = {'terminated': 0, 'truncated': 0}
    for seed in (7, None, [3] * n):  # seeded, then on from each sub-env's generator, then seeded per sub-env
        obs_a, info_a = theirs.reset(seed=seed)
        obs_b, info_b = ours.reset(seed=seed)
        assert obs_a.dtype == obs_b.dtype and np.array_equal(obs_a, obs_b) and info_a == info_b
        for t in range(1800):
            actions = policy_actions(obs_a, rng, t)
            step_a, step_b = theirs.step(actions), ours.step(actions)
            assert_same_step(step_a, step_b)
            ends['terminated'] += int(step_a[2].sum())
            ends['truncated'] += int(step_a[3].sum())
            obs_a = step_a[0]
    assert ends['terminated'] > 10 and ends['truncated'] > 0, ends


def test_its_constants_are_the_envs():
    env = CartPoleEnv()
    assert (env.gravity, env.masscart, env.masspole, env.length, env.force_mag, env.tau) == \
        (classic.GRAVITY, classic.MASSCART, classic.MASSPOLE, classic.LENGTH, classic.FORCE_MAG, classic.TAU)
    assert (env.total_mass, env.polemass_length) == (classic.TOTAL_MASS, classic.POLEMASS_LENGTH)
    assert (env.theta_threshold_radians, env.x_threshold) == (classic.THETA_THRESHOLD, classic.X_THRESHOLD)
    assert env.kinematics_integrator == 'euler'
    acrobot = AcrobotEnv()
    assert (acrobot.dt, acrobot.LINK_LENGTH_1, acrobot.LINK_MASS_1, acrobot.LINK_MASS_2, acrobot.LINK_MOI) == \
        (classic.ACROBOT_DT, classic.L1, classic.M1, classic.M2, classic.I1)
    assert (acrobot.LINK_COM_POS_1, acrobot.LINK_COM_POS_2) == (classic.LC1, classic.LC2)
    assert (acrobot.MAX_VEL_1, acrobot.MAX_VEL_2, tuple(acrobot.AVAIL_TORQUE)) == \
        (classic.MAX_VEL_1, classic.MAX_VEL_2, classic.TORQUES)
    assert (acrobot.book_or_nips, acrobot.torque_noise_max) == ('book', 0.0)
    for name, (_, limit) in classic.IDS.items():
        assert gym.spec(name).max_episode_steps == limit


def test_actions_that_are_not_the_envs_are_refused():
    for env, bad_actions in ((CartPoleVector(2), ([0, 2], [-1, 0], [0.0, 1.0], [0, 1, 1])),
                             (AcrobotVector(2), ([0, 3], [-1, 0], [0.0, 1.0], [0, 1, 1]))):
        env.reset(seed=0)
        for bad in bad_actions:
            with pytest.raises(ValueError, match=f'0 to {env.single_action_space.n - 1}'):
                env.step(np.array(bad))


def backend(**env) -> str:
    return check_env({'name': 'CartPole-v1', 'max_frame': 1000, 'num_envs': 4, **env})['vector_backend']


def test_the_lab_picks_it_for_a_cartpole_it_can_step():
    assert backend() == 'numpy'
    assert backend(num_envs=1, name='CartPole-v0', max_t=100, normalize_obs=True, normalize_reward=True,
                   reward_scale=0.5) == 'numpy'
    assert backend(normalize_obs=True, clip_obs=5.0) == 'numpy'  # normalize_obs clips, after the vector env
    # what needs each sub-env as a gymnasium env, or another vector env
    for env in ({'vectorization_mode': 'async'}, {'autoreset': 'next_step'}, {'frame_op': 'concat', 'frame_op_len': 2},
                {'clip_obs': 1.0}, {'sutton_barto_reward': True}, {'make_kwargs': {'sutton_barto_reward': True}},
                {'vector_backend': 'gymnasium'}):
        assert backend(**env) == 'gymnasium', env
    assert backend(name='Acrobot-v1') == 'numpy'
    assert backend(name='Pendulum-v1') == 'gymnasium'
    # asked for where it cannot step the env: one line naming why
    for env, why in (({'name': 'Pendulum-v1'}, "it steps CartPole-v0, CartPole-v1, Acrobot-v1 only, not 'Pendulum-v1'"),
                     ({'sutton_barto_reward': True}, 'the spec passes sutton_barto_reward'),
                     ({'make_kwargs': {'sutton_barto_reward': True}}, 'passes make_kwargs.sutton_barto_reward'),
                     ({'autoreset': 'next_step'}, 'env.autoreset is "next_step"'),
                     ({'vectorization_mode': 'async'}, 'env.vectorization_mode is "async"'),
                     ({'clip_obs': 1.0}, 'env.clip_obs without normalize_obs')):
        with pytest.raises(SpecError) as e:
            backend(vector_backend='numpy', **env)
        assert str(e.value).startswith('env.vector_backend: "numpy" cannot step this env: ') and why in str(e.value)
        assert str(e.value).endswith('use "gymnasium" or null') and '\n' not in str(e.value)


def test_a_searchs_spec_leaves_it_to_each_trial():
    """A search's spec (validated without settling) leaves the backend null, to each trial's spec,
    which settles it for the env keys the trial drew."""
    raw = json.loads((ROOT / 'spec' / 'search' / 'ppo_cartpole_search.json').read_text())['ppo_cartpole_search']
    raw['search'] = {'env.name__choice': ['CartPole-v1', 'Pendulum-v1'],
                     'env.vectorization_mode__choice': ['sync', 'async'],
                     'env.autoreset__choice': ['same_step', 'next_step']}
    spec = {**validate_spec(raw, 'ppo_cartpole_search', settle=False), 'name': 'ppo_cartpole_search'}
    assert spec['env']['vector_backend'] is None
    assert [p.path for p in search_params(spec)] == ['env.name', 'env.vectorization_mode', 'env.autoreset']
    drawn = [(name, mode, reset) for name in ('CartPole-v1', 'Pendulum-v1') for mode in ('sync', 'async')
             for reset in ('same_step', 'next_step')]
    settled = {k: trial_spec(spec, dict(zip(('env.name', 'env.vectorization_mode', 'env.autoreset'), k)), 0)['env']
               for k in drawn}
    assert {k: v['vector_backend'] for k, v in settled.items()} == {
        k: 'numpy' if k == ('CartPole-v1', 'sync', 'same_step') else 'gymnasium' for k in drawn}


def test_a_restored_env_does_not_change_the_snapshot_it_was_read_from():
    env = CartPoleVector(2)
    env.reset(seed=0)
    state = vector_env_state_dict(env)
    restored = CartPoleVector(2)
    assert load_vector_env_state_dict(restored, state)
    before = copy.deepcopy(state)
    for _ in range(30):
        restored.step(np.array([1, 1]))
    assert repr(state) == repr(before)


def test_it_asks_for_a_reset_first_and_one_seed_per_sub_env():
    env = CartPoleVector(3)
    with pytest.raises(gym.error.ResetNeeded):
        env.step(np.array([0, 1, 0]))
    for seeds in ([1, 2], [1, 2, 3, 4]):
        with pytest.raises(ValueError, match=f'{len(seeds)} seeds for 3 sub-envs'):
            env.reset(seed=seeds)
    obs, _ = env.reset(seed=[5, 6, 7])
    assert obs.shape == (3, 4) and len(env.rngs) == 3


@pytest.mark.parametrize('name', ['CartPole-v1', 'Acrobot-v1'])
def test_its_snapshot_restores_the_episodes_exactly(name):
    env_spec = check_env({'name': name, 'max_frame': 1000, 'num_envs': 4, 'normalize_obs': True,
                          'normalize_reward': True})
    env = make_env(env_spec)
    vector_env = classic.IDS[name][0]
    assert type(env.unwrapped) is vector_env
    obs, _ = env.reset(seed=5)
    raw_obs = env.unwrapped._observations(env.unwrapped.state)  # the policy reads the env's own numbers
    rng = np.random.default_rng(1)
    for t in range(700):
        env.step(policy_actions(raw_obs, rng, t))
        raw_obs = env.unwrapped._observations(env.unwrapped.state)
    state = vector_env_state_dict(env)
    assert state['exact'] and state['layer_types'][-1] == vector_env.__name__
    restored = make_env(env_spec)
    assert load_vector_env_state_dict(restored, copy.deepcopy(state))
    for t in range(700, 1500):
        actions = policy_actions(raw_obs, rng, t)
        step = env.step(actions)
        assert_same_step(step, restored.step(actions))
        raw_obs = env.unwrapped._observations(env.unwrapped.state)
    # a snapshot of another number of sub-envs is not theirs: fresh episodes, statistics kept
    assert not load_vector_env_state_dict(make_env({**env_spec, 'num_envs': 3}), copy.deepcopy(state))


def small_ppo(**env) -> dict:
    spec = copy.deepcopy(PPO)
    spec['env'].update({'max_frame': 800, **env})
    spec['meta'].update({'log_frequency': 200, 'eval_frequency': 400})
    return spec


@pytest.mark.slow
def test_a_run_on_it_is_the_run_on_gymnasiums_and_one_started_there_continues_there(tmp_path):
    numpy_run = train_one(spec_file_in(tmp_path / 'n', NAME, small_ppo()), NAME, 'train', [], tmp_path / 'a')
    assert saved_values(numpy_run, NAME, 'env.vector_backend') == ['numpy'] * 3
    gym_file = spec_file_in(tmp_path / 'g', NAME, small_ppo(vector_backend='gymnasium'))
    gym_run = train_one(gym_file, NAME, 'train', [], tmp_path / 'b')
    assert_same_run(numpy_run, gym_run, NAME)
    acrobot = [train_one(spec_file_in(tmp_path / f'acrobot_{backend}', NAME, small_ppo(
        name='Acrobot-v1', max_frame=400, vector_backend=backend)), NAME, 'train', [], tmp_path / f'a_{backend}')
               for backend in ('numpy', 'gymnasium')]
    assert_same_run(*acrobot, NAME)
    # a run the lab started on gymnasium's env (before "numpy" existed, or asked for) continues on
    # it when the spec file says nothing: its sub-envs' states are gymnasium's
    old = tmp_path / 'c' / gym_run.name
    shutil.copytree(gym_run, old)
    plain_file = spec_file_in(tmp_path / 'p', NAME, small_ppo())
    train_one(plain_file, NAME, 'train@latest', ['env.max_frame=1600'], tmp_path / 'c')
    assert saved_values(old, NAME, 'env.vector_backend') == ['gymnasium'] * 3
    straight = train_one(gym_file, NAME, 'train', ['env.max_frame=1600'], tmp_path / 'd')
    assert_same_run(old, straight, NAME)
    # and a run saved before the key existed at all continues on gymnasium's env too
    older = tmp_path / 'e' / gym_run.name
    shutil.copytree(gym_run, older)
    drop_saved_key(older, NAME, 'env.vector_backend')
    train_one(plain_file, NAME, 'train@latest', ['env.max_frame=1600'], tmp_path / 'e')
    assert saved_values(older, NAME, 'env.vector_backend') == ['gymnasium'] * 3
    assert_same_run(older, straight, NAME)


def test_a_resumed_run_keeps_its_backend_unless_an_edit_leaves_it_unable_to_run(tmp_path):
    """train@ with a spec file that leaves vector_backend to the lab (absent or null): a run on
    gymnasium's CartPoles continues on them, no edit; a --force edit that "numpy" cannot run
    (async sub-envs) moves the run to the backend the lab picks for it, and the edit names the
    change; a backend the file names is the user's (an edit)."""
    from slm_lab.lib.errors import ResumeError
    from slm_lab.persistence.edits import check_edits, continuation_spec
    from slm_lab.spec import load_spec

    def saved(**env) -> dict:
        spec_file = spec_file_in(tmp_path / 'saved', NAME, small_ppo(**env))
        spec = load_spec(spec_file, NAME)
        spec['meta'].update(random_seed=7, experiment_ts='2026_01_01_000000')
        return spec

    def resume(old: dict, overrides: list[str], **env) -> tuple[dict, dict]:
        spec_file = spec_file_in(tmp_path / 'now', NAME, small_ppo(**env))
        return continuation_spec(spec_file, NAME, overrides, copy.deepcopy(old), 'train@latest')

    on_gymnasium = saved(vector_backend='gymnasium')
    for env in ({}, {'vector_backend': None}):
        spec, filled = resume(on_gymnasium, [], **env)
        assert spec['env']['vector_backend'] == 'gymnasium', env
        assert check_edits(filled, spec, force=False) == []
    spec, filled = resume(on_gymnasium, [], vector_backend='numpy')  # the user's own choice: an edit
    with pytest.raises(ResumeError, match='env.vector_backend'):
        check_edits(filled, spec, force=False)
    on_numpy = saved()
    assert on_numpy['env']['vector_backend'] == 'numpy'
    spec, filled = resume(on_numpy, [])
    assert spec['env']['vector_backend'] == 'numpy' and check_edits(filled, spec, force=False) == []
    spec, filled = resume(on_numpy, ['env.vectorization_mode=async'])
    assert spec['env']['vector_backend'] == 'gymnasium'
    edits = {key: (old, new) for key, old, new in check_edits(filled, spec, force=True)}
    assert edits['env.vector_backend'] == ('numpy', 'gymnasium')
