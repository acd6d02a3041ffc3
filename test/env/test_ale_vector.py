"""Atari games in ALE's own vector env (env.vector_backend "ale"): the same observations, spaces
and episode semantics as gymnasium's vector env of the lab's wrappers, the default it is, and a
resume that is recorded as approximate."""
from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from lab_helpers import assert_same_steps, assert_truncated_at

from slm_lab.lib.errors import SpecError
from slm_lab.spec import validate_spec

pytest.importorskip('ale_py', reason='the Atari extra is not installed')
pytest.importorskip('cv2', reason='the Atari extra is not installed')


def ppo_spec(env: dict, **meta) -> dict:
    """A small PPO on a small ConvNet, for an Atari env section."""
    return {'agent': {'name': 'PPO', 'algorithm': {'name': 'PPO', 'time_horizon': 32, 'minibatch_size': 32,
                                                   'training_epoch': 1},
                      'memory': {'name': 'OnPolicyBatchReplay'},
                      'net': {'type': 'ConvNet', 'shared': True, 'conv_hid_layers': [[8, 8, 4, 0, 1], [16, 4, 2, 0, 1]],
                              'fc_hid_layers': [32], 'batch_norm': False, 'normalize': True}},
            'env': {'num_envs': 2, 'max_frame': 256, **env},
            'meta': {'log_frequency': 128, 'random_seed': 3, **meta}}


def backend(env: dict) -> str:
    return validate_spec(ppo_spec(env))['env']['vector_backend']


def test_ale_is_the_default_for_atari_games_in_several_envs_and_is_written_into_the_spec():
    assert backend({'name': 'ALE/Pong-v5'}) == 'ale'
    assert backend({'name': 'PongNoFrameskip-v4', 'frame_op': 'concat', 'frame_op_len': 4}) == 'ale'
    assert backend({'name': 'ALE/Pong-v5', 'num_envs': 1}) == 'gymnasium'  # nothing to step in parallel
    assert backend({'name': 'ALE/Pong-v5', 'vector_backend': 'gymnasium'}) == 'gymnasium'
    assert backend({'name': 'Pong-v0'}) == 'gymnasium'  # ALE draws its frame skip at random
    assert backend({'name': 'ALE/Pong-v5', 'mode': 0}) == 'gymnasium'  # a game mode ALE's vector env cannot set
    assert backend({'name': 'ALE/Pong-v5', 'num_envs': 1, 'vector_backend': 'ale'}) == 'ale'
    assert backend({'name': 'ALE/Pong-v5', 'vector_backend': None}) == 'ale'
    cartpole = validate_spec({**ppo_spec({'name': 'CartPole-v1'}),
                              'agent': {'name': 'PPO', 'algorithm': {'name': 'PPO'},
                                        'memory': {'name': 'OnPolicyBatchReplay'}, 'net': {'type': 'MLPNet'}}})
    assert cartpole['env']['vector_backend'] == 'numpy'  # not an Atari game: the lab's CartPole (env/cartpole.py)


@pytest.mark.parametrize('env, message', [
    ({'name': 'CartPole-v1'}, r"'CartPole-v1' is not an Atari game"),
    ({'name': 'Pong-v0'}, r"'Pong-v0' has RAM observations or a frame skip that ALE draws at random"),
    ({'name': 'ALE/Pong-v5', 'mode': 0}, r"ALE's vector env takes no constructor argument mode"),
    ({'name': 'ALE/Pong-v5', 'make_kwargs': {'obs_type': 'grayscale'}}, r"ALE's vector env takes obs_type 'rgb' only"),
])
def test_ale_for_a_game_it_cannot_run_is_one_line_naming_the_key_and_the_fix(env, message):
    spec = ppo_spec({**env, 'vector_backend': 'ale'})
    if env['name'] == 'CartPole-v1':
        spec['agent']['net'] = {'type': 'MLPNet'}
    with pytest.raises(SpecError, match=r'^env\.vector_backend: "ale" cannot run this env: ' + message +
                       r'.*; use "gymnasium" or null$'):
        validate_spec(spec)


def test_an_unknown_backend_is_one_line_listing_the_valid_ones():
    with pytest.raises(SpecError, match=r"^env\.vector_backend: .*numba.*ale.*gymnasium"):
        validate_spec(ppo_spec({'name': 'ALE/Pong-v5', 'vector_backend': 'numba'}))


def test_a_run_made_before_the_key_existed_resumes_in_gymnasiums_vector_env():
    from slm_lab.persistence.edits import fill_keys_added_later
    filled = fill_keys_added_later({'env': {'name': 'ALE/Pong-v5', 'num_envs': 16}})
    assert filled['env']['vector_backend'] == 'gymnasium'


def make_both(env: dict):
    from slm_lab.env import make_env
    env = validate_spec(ppo_spec(env))['env']
    return make_env({**env, 'vector_backend': 'ale'}), make_env({**env, 'vector_backend': 'gymnasium'})


@pytest.mark.parametrize('env', [
    {'name': 'ALE/Breakout-v5'},
    {'name': 'ALE/Breakout-v5', 'image_downsize': [64, 48]},
    {'name': 'PongNoFrameskip-v4'},  # SLM-Lab v4's layout without frame_op: one frame
    {'name': 'PongNoFrameskip-v4', 'frame_op': 'concat', 'frame_op_len': 4},
])
def test_both_backends_give_the_same_spaces_and_frames_of_a_game_start(env):
    ale, gymnasium = make_both(env)
    try:
        assert ale.single_observation_space == gymnasium.single_observation_space
        assert ale.single_action_space == gymnasium.single_action_space
        obs_a, _ = ale.reset(seed=1)
        obs_g, _ = gymnasium.reset(seed=1)
        assert obs_a.shape == obs_g.shape and obs_a.dtype == obs_g.dtype == np.uint8
        # zeros before a game's first frame, in both
        if obs_a.shape[1] > 1:
            assert not obs_a[:, :-1].any() and not obs_g[:, :-1].any()
        assert obs_a[:, -1].any() and obs_g[:, -1].any()
    finally:
        ale.close()
        gymnasium.close()


def test_ales_preprocessing_gives_gymnasiums_frames_and_rewards_for_the_same_emulator_frames():
    """With no no-ops and no FIRE at reset (the two paths start games differently) and no sticky
    actions, ALE's vector env and gymnasium's AtariPreprocessing (the lab's wrappers' frame skip,
    max-pooling, grey, resize) give identical stacked frames and rewards over a whole game."""
    from ale_py.vector_env import AtariVectorEnv
    ale = AtariVectorEnv('breakout', 1, autoreset_mode='SameStep', repeat_action_probability=0.0, noop_max=1,
                         use_fire_reset=False, reward_clipping=False)
    game = gym.make('ALE/Breakout-v5', frameskip=1, repeat_action_probability=0.0)
    game = gym.wrappers.AtariPreprocessing(game, noop_max=0, frame_skip=4, grayscale_obs=True, scale_obs=False)
    game = gym.wrappers.FrameStackObservation(game, 4, padding_type='zero')
    try:
        np.testing.assert_array_equal(ale.reset(seed=0)[0][0], game.reset(seed=0)[0])
        actions = np.random.default_rng(0).integers(0, 4, size=3000)
        for action in actions:
            obs, reward, terminated, truncated, info = ale.step(np.array([action]))
            obs_g, reward_g, terminated_g, truncated_g, _ = game.step(action)
            assert reward[0] == reward_g and terminated[0] == terminated_g
            if terminated_g:  # the game's last frames: ALE's final_obs (it reset the game)
                np.testing.assert_array_equal(info['final_obs'][0], obs_g)
                break
            np.testing.assert_array_equal(obs[0], obs_g)
        assert terminated_g
    finally:
        ale.close()
        game.close()


@pytest.mark.slow
def test_a_lost_life_ends_the_episode_the_game_goes_on_and_games_are_recorded_whole():
    """life_loss_info: a lost life is terminated with the game going on (the next observation
    continues the frames, final_obs is the episode's last), a game's return (the env's own
    rewards, unclipped) is given when the game ends; max_t counts agent steps."""
    from slm_lab.env import make_env
    from slm_lab.env.wrappers import finished_returns
    env = make_env(validate_spec(ppo_spec({'name': 'ALE/Breakout-v5', 'life_loss_info': True}))['env'])
    try:
        env.reset(seed=0)
        rng, lives_lost, games = np.random.default_rng(0), 0, []
        for _ in range(3000):
            obs, reward, terminated, truncated, info = env.step(rng.integers(0, 4, 2))
            returns = finished_returns(info, whole_games=True)
            if terminated.any():
                final = info['final_info']
                lost = terminated & ~final['_game_return']
                if lost.any():
                    lives_lost += int(lost.sum())
                    np.testing.assert_array_equal(obs[lost], info['final_obs'][lost])
                    assert (final['lives'][lost] >= 1).all()
                    assert (obs[lost][:, :-1].any(axis=(1, 2, 3))).all()  # a stack of the game's frames, not a reset
            games += list(returns)
            if len(games) >= 2:
                break
        assert lives_lost >= 8 and len(games) >= 2
        assert all(g >= 0 for g in games)
    finally:
        env.close()
    assert_truncated_at(make_env(validate_spec(ppo_spec({'name': 'ALE/Breakout-v5', 'max_t': 50}))['env']), [49, 99])


@pytest.mark.parametrize('seed', [0, 10**18])  # the lab's seeds go up to 10**18; ALE's are C ints
def test_ales_games_are_the_same_for_the_same_seed_with_sticky_actions(seed):
    from slm_lab.env import make_env
    env_spec = validate_spec(ppo_spec({'name': 'ALE/Breakout-v5', 'num_envs': 3}))['env']
    a, b = make_env(env_spec), make_env(env_spec)
    try:
        for x, y in zip(a.reset(seed=seed), b.reset(seed=seed)):
            if isinstance(x, np.ndarray):
                np.testing.assert_array_equal(x, y)
        assert_same_steps(a, b, np.random.default_rng(0).integers(0, 4, size=(200, 3)))
    finally:
        a.close()
        b.close()


@pytest.mark.slow
def test_a_resumed_run_on_ale_starts_fresh_episodes_and_records_that_it_is_approximate(tmp_path, caplog):
    """ALE's vector env cannot save its games: train@ continues the agent exactly (weights,
    optimizer, clock) and starts fresh games, and the session's resume record says so, naming
    env.vector_backend "gymnasium" for an exact resume."""
    from lab_helpers import run_dirs, train_csv, write_spec

    from slm_lab import lab
    spec = ppo_spec({'name': 'ALE/Pong-v5', 'life_loss_info': True})
    spec_file = write_spec(tmp_path, 'ppo_pong_ale', spec)
    data = str(tmp_path / 'data')
    lab.run(spec_file, 'ppo_pong_ale', 'train', data_dir=data)
    lab.run(spec_file, 'ppo_pong_ale', 'train@latest', ['env.max_frame=512'], data_dir=data)
    (run,) = run_dirs(Path(data), 'ppo_pong_ale')
    assert json.loads((run / 'ppo_pong_ale_t0_s0_spec.json').read_text())['env']['vector_backend'] == 'ale'
    assert train_csv(run, 'ppo_pong_ale')['frame'].iloc[-1] == 512
    (record,) = json.loads((run / 'info' / 'ppo_pong_ale_t0_s0_resumes.json').read_text())
    assert record['exact'] is False
    (reason,) = record['approximate']
    assert "env.vector_backend 'ale'" in reason and "'gymnasium'" in reason and 'fresh episodes' in reason
