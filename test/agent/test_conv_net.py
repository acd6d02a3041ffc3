"""ConvNet and DuelingConvNet on image observations, and the Atari envs they are for."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from lab_helpers import assert_same_steps, assert_truncated_at

from slm_lab.agent.net import build_net
from slm_lab.agent.net.conv import NATURE_CONV
from slm_lab.lib.errors import SpecError
from slm_lab.spec import validate_spec

pytest.importorskip('ale_py', reason='the Atari extra is not installed')
pytest.importorskip('cv2', reason='the Atari extra is not installed')


def net_spec(net_type: str = 'ConvNet', **keys) -> dict:
    """A validated net spec of `net_type` (through a whole spec, as a user's file is read)."""
    spec = {'agent': {'name': 'DQN', 'algorithm': {'name': 'DQN'}, 'memory': {'name': 'Replay'},
                      'net': {'type': net_type, **keys}},
            'env': {'name': 'ALE/Pong-v5', 'max_frame': 100}, 'meta': {}}
    return validate_spec(spec)['agent']['net']


def test_convnet_has_slm_labs_layers_in_order():
    net = build_net(net_spec(conv_hid_layers=NATURE_CONV, fc_hid_layers=[512], batch_norm=True), (4, 84, 84), 6)
    kinds = [type(m).__name__ for m in net.conv]
    # BatchNorm2d after the activation of every conv layer but the first, as SLM-Lab's ConvNet
    assert kinds == ['Conv2d', 'ReLU', 'Conv2d', 'ReLU', 'BatchNorm2d', 'Conv2d', 'ReLU', 'BatchNorm2d']
    assert [m.out_features for m in net.fc if isinstance(m, torch.nn.Linear)] == [512]
    assert net.fc[0].in_features == 64 * 7 * 7  # 84 -> 20 -> 9 -> 7
    assert net(torch.zeros(3, 4, 84, 84, dtype=torch.uint8)).shape == (3, 6)


def test_normalize_scales_uint8_frames_by_255_and_a_missing_channel_axis_is_one_channel():
    torch.manual_seed(0)
    raw = build_net(net_spec(conv_hid_layers=[[8, 4, 2]], fc_hid_layers=[16], batch_norm=False), (1, 20, 20), 3)
    scaled = build_net(net_spec(conv_hid_layers=[[8, 4, 2]], fc_hid_layers=[16], batch_norm=False, normalize=True),
                       (1, 20, 20), 3)
    scaled.load_state_dict(raw.state_dict())
    frames = torch.randint(0, 256, (5, 1, 20, 20), dtype=torch.uint8)
    torch.testing.assert_close(scaled(frames), raw(frames.float() / 255.0))
    assert torch.equal(raw(frames[:, 0]), raw(frames))  # (B, H, W) is one channel


def test_dueling_convnet_is_value_plus_centred_advantage():
    net = build_net(net_spec('DuelingConvNet', conv_hid_layers=[[4, 3, 1]], fc_hid_layers=[8]), (2, 6, 6), 4)
    x = torch.rand(7, 2, 6, 6)
    h = net.features(net.prepare(x))
    value, advantage = net.heads[0](h), net.heads[1](h)
    torch.testing.assert_close(net(x), value + advantage - advantage.mean(dim=1, keepdim=True))


def test_dueling_convnet_heads_take_the_activation_gain_under_init_fn():
    """As SLM-Lab's init_layers: every Linear, V and A included, orthogonal with relu's gain sqrt 2."""
    net = build_net(net_spec('DuelingConvNet', conv_hid_layers=[[4, 3, 1]], fc_hid_layers=[8],
                             hid_layers_activation='relu', init_fn='orthogonal_'), (2, 6, 6), 4)
    for head in net.heads:  # (1, 8) and (4, 8): orthonormal rows scaled by the gain
        w = head.weight.detach()
        assert torch.allclose(w @ w.T, 2 * torch.eye(w.shape[0]), atol=1e-4)


@pytest.mark.parametrize('layers, message', [
    ([[32]], r'conv_hid_layers\[0\]: \[32\] is not a conv layer'),
    ([[0, 3]], r'conv_hid_layers\[0\]\[0\]: out_channels 0'),
    ([[16, 3, 0]], r'conv_hid_layers\[0\]\[2\]: stride 0 must be an int >= 1'),
    ([[16, [3, 'x']]], r'conv_hid_layers\[0\]\[1\]: kernel_size'),
])
def test_a_bad_conv_layer_is_one_line_naming_it(layers, message):
    with pytest.raises(SpecError, match=message):
        net_spec(conv_hid_layers=layers)


def test_layers_that_do_not_fit_the_observation_and_vector_observations_are_one_line():
    with pytest.raises(SpecError,
                       match=r'conv_hid_layers: these layers do not fit an observation of shape \(4, 10, 10\)'):
        build_net(net_spec(conv_hid_layers=NATURE_CONV), (4, 10, 10), 2)
    with pytest.raises(SpecError, match=r'ConvNet takes image observations .* shape \(4,\); use MLPNet'):
        build_net(net_spec(), (4,), 2)


def atari_spec(algorithm: str, net: dict, env: dict, **meta) -> dict:
    algos = {
        'PPO': ({'name': 'PPO', 'time_horizon': 32, 'minibatch_size': 32, 'training_epoch': 1},
                {'name': 'OnPolicyBatchReplay'}),
        'DoubleDQN': ({'name': 'DoubleDQN', 'training_frequency': 4, 'training_start_step': 32,
                       'explore_var_spec': {'name': 'linear_decay', 'start_val': 1.0, 'end_val': 0.1,
                                            'start_step': 0, 'end_step': 200}},
                      {'name': 'Replay', 'batch_size': 16, 'max_size': 1000}),
        'SoftActorCritic': ({'name': 'SoftActorCritic', 'action_pdtype': 'GumbelSoftmax', 'training_frequency': 4,
                             'training_start_step': 32},
                            {'name': 'Replay', 'batch_size': 16, 'max_size': 1000}),
    }
    algo, memory = algos[algorithm]
    return {'agent': {'name': algorithm, 'algorithm': algo, 'memory': memory,
                      'net': {'conv_hid_layers': [[8, 8, 4, 0, 1], [16, 4, 2, 0, 1]], 'fc_hid_layers': [32],
                              'batch_norm': False, 'normalize': True, **net}},
            'env': {'num_envs': 2, 'max_frame': 256, **env},
            'meta': {'log_frequency': 128, 'random_seed': 3, **meta}}


@pytest.mark.slow
def test_ppo_with_a_shared_convnet_on_pong_resumes_exactly(tmp_path):
    """ALE/Pong-v5 as SLM-Lab v5 runs it (4 stacked 84x84 greyscale uint8 frames, sticky actions,
    rewards clipped for training) in gymnasium's vector env (env.vector_backend "gymnasium"; ALE's
    own cannot save its games, test/env/test_ale_vector.py): stopped at F by max_frame and resumed
    to 2F, mid-episode, gives the CSV cells and weights of a run of 2F that never stopped."""
    from lab_helpers import check_resume_after_max_frame
    spec = atari_spec('PPO', {'type': 'ConvNet', 'shared': True},
                      {'name': 'ALE/Pong-v5', 'vector_backend': 'gymnasium'})
    check_resume_after_max_frame(tmp_path, 'ppo_pong', spec)


@pytest.mark.slow
@pytest.mark.parametrize('name, extra, exact', [
    ('ALE/Breakout-v5', {'repeat_action_probability': 0.5}, True),  # the lab's StickyAction: in the snapshot
    ('PongNoFrameskip-v4', {'frame_op': 'concat', 'frame_op_len': 4}, True),
    ('ALE/Breakout-v5', {'life_loss_info': True}, True),  # the lives and the game's return so far too
    ('ALE/Qbert-v5', {}, True),  # leaves pixels of its frame buffer undrawn: restored after a reset
    ('Pong-v0', {}, False),  # ALE's own sticky actions and frame skip: fresh episodes on resume
])
def test_an_atari_game_continues_from_its_snapshot_exactly_unless_ale_makes_its_actions_sticky(name, extra, exact):
    import pickle

    from slm_lab.env import make_env
    from slm_lab.persistence.env_state import load_vector_env_state_dict, vector_env_state_dict
    spec = {'name': name, 'num_envs': 2, 'max_frame': 1000, **extra}
    a, b = make_env(spec), make_env(spec)
    try:
        a.reset(seed=5)  # b is restored never reset, as a resumed session's env
        actions = np.random.default_rng(0).integers(0, a.single_action_space.n, size=(400, 2))
        for action in actions[:100]:
            a.step(action)
        assert load_vector_env_state_dict(b, pickle.loads(pickle.dumps(vector_env_state_dict(a)))) is exact
        if exact:
            assert_same_steps(a, b, actions[100:])
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize('layout', ['channels_last', 'contiguous'])
def test_a_replay_of_frames_stacks_them_in_the_layout_of_the_conv_net(layout):
    pytest.importorskip('ale_py', reason='the Atari extra is not installed')
    from slm_lab.agent import Agent
    from slm_lab.env import Clock, make_env
    spec = validate_spec(atari_spec('DoubleDQN', {'type': 'ConvNet', 'memory_format': layout},
                                    {'name': 'ALE/Pong-v5'}))
    env = make_env(spec['env'])
    try:
        agent = Agent(spec, env.single_observation_space, env.single_action_space, 2, Clock(256, 2), seed=0)
    finally:
        env.close()
    assert agent.memory.frame_store.channels_last is (layout == 'channels_last')


@pytest.mark.slow
def test_dueling_double_dqn_on_a_v4_atari_id_stores_uint8_frames(lab_run):
    """SLM-Lab v4's Atari layout: PongNoFrameskip-v4 with frame_op concat of 4 frames (frame skip
    by the preprocessing) and rewards by their sign; the replay holds the frames as uint8."""
    from slm_lab.env import make_env
    env_spec = {'name': 'PongNoFrameskip-v4', 'frame_op': 'concat', 'frame_op_len': 4, 'reward_scale': 'sign'}
    spec = atari_spec('DoubleDQN', {'type': 'DuelingConvNet'}, env_spec)
    _, run = lab_run(spec, 'ddqn_pong')
    rows = __import__('pandas').read_csv(run / 'info' / 'ddqn_pong_t0_s0_session_df_train.csv')
    assert rows['frame'].iloc[-1] == 256 and rows['opt_step'].iloc[-1] > 0
    env = make_env(validate_spec(spec)['env'])
    try:
        assert env.single_observation_space.shape == (4, 84, 84) and env.single_observation_space.dtype == np.uint8
    finally:
        env.close()


def test_image_downsize_sets_the_frame_size_and_a_bad_one_is_one_line():
    from slm_lab.env import make_env
    spec = atari_spec('PPO', {'type': 'ConvNet'}, {'name': 'ALE/Breakout-v5', 'image_downsize': [64, 48]})
    env = make_env(validate_spec(spec)['env'])
    try:
        obs, _ = env.reset(seed=0)
        assert obs.shape == (2, 4, 48, 64) and obs.dtype == np.uint8  # [width, height], as SLM-Lab v4
    finally:
        env.close()
    spec['env']['image_downsize'] = [64]
    with pytest.raises(SpecError, match=r'^env\.image_downsize: \[64\] is not a frame size'):
        validate_spec(spec)


@pytest.mark.slow
def test_life_loss_info_ends_an_episode_per_life_and_records_whole_games():
    """SLM-Lab v5's life_loss_info on Breakout (5 lives): every lost life is a terminated episode
    for the agent, the game goes on, and the records get one return per whole game (the sum of
    its lives' rewards, unclipped)."""
    from slm_lab.env import make_env
    from slm_lab.env.wrappers import finished_returns
    spec = validate_spec(atari_spec('PPO', {'type': 'ConvNet'}, {'name': 'ALE/Breakout-v5', 'life_loss_info': True}))
    env = make_env(spec['env'])
    try:
        env.reset(seed=1)
        rng = np.random.default_rng(0)
        lives, games, life_rewards = 0, [], 0.0
        for _ in range(1500):
            _, reward, terminated, truncated, info = env.step(rng.integers(0, 4, size=2))
            life_rewards += float(np.abs(reward).sum())
            lives += int((terminated | truncated).sum())
            games += list(finished_returns(info, whole_games=True))
    finally:
        env.close()
    assert len(games) >= 2 and lives >= 5 * len(games)
    assert not finished_returns({'final_info': {}}, whole_games=True).size
    for bad in ('CartPole-v1', 'Pong-v0'):
        bad_spec = atari_spec('PPO', {'type': 'ConvNet'}, {'name': bad, 'life_loss_info': True})
        with pytest.raises(SpecError, match=r"^env\.life_loss_info: true is for Atari games .* not '" + bad):
            validate_spec(bad_spec)
    ram = atari_spec('PPO', {'type': 'MLPNet'}, {'name': 'ALE/Pong-v5', 'life_loss_info': True,
                                                 'make_kwargs': {'obs_type': 'ram'}})
    with pytest.raises(SpecError, match=r"^env\.life_loss_info: .* not obs_type 'ram'"):
        validate_spec(ram)


@pytest.mark.slow
def test_v4_discrete_sac_joins_the_action_to_the_conv_features_of_its_critics(lab_run):
    """SLM-Lab v4's SAC on Pong (GumbelSoftmax, critics of (s, one_hot(a))): a ConvNet critic
    takes the image and joins the action to its convolutions' features, as v4's QConvNet."""
    spec = atari_spec('SoftActorCritic', {'type': 'ConvNet'},
                      {'name': 'PongNoFrameskip-v4', 'frame_op': 'concat', 'frame_op_len': 4, 'reward_scale': 'sign'})
    _, run = lab_run(spec, 'sac_pong')
    rows = __import__('pandas').read_csv(run / 'info' / 'sac_pong_t0_s0_session_df_train.csv')
    assert rows['frame'].iloc[-1] == 256 and rows['opt_step'].iloc[-1] > 0 and np.isfinite(rows['loss']).all()
    critic = build_net(net_spec(conv_hid_layers=[[4, 8, 4]], fc_hid_layers=[8]), (4, 84, 84), 1, extra_dim=6)
    frames, actions = torch.zeros(3, 4, 84, 84), torch.eye(6)[:3]
    assert critic.fc[0].in_features == 4 * 20 * 20 + 6 and critic(frames, actions).shape == (3, 1)


def test_ale_rewards_are_clipped_by_default_and_the_older_ids_keep_their_own():
    spec = atari_spec('PPO', {'type': 'ConvNet'}, {'name': 'ALE/SpaceInvaders-v5'})
    assert validate_spec(spec)['env']['clip_reward'] == 1.0  # SLM-Lab v5; recorded in the saved spec
    spec['env']['clip_reward'] = None  # an explicit null turns it off
    assert validate_spec(spec)['env']['clip_reward'] is None
    old = atari_spec('PPO', {'type': 'ConvNet'}, {'name': 'SpaceInvadersNoFrameskip-v4', 'reward_scale': 'sign'})
    assert validate_spec(old)['env']['clip_reward'] is None


@pytest.mark.slow
def test_fire_starts_the_game_max_t_counts_agent_steps_and_a_lost_life_continues_the_game():
    """Breakout needs FIRE to launch the ball: with FIRE pressed at reset, a policy that never
    presses it still loses lives; max_t counts the agent's steps (4 frames each); with
    life_loss_info (and always for the older ids, as SLM-Lab v4 trained them) a lost life ends
    the episode and the reset that follows returns the frames as they were, the game going on."""
    from slm_lab.env import make_env, make_single_env
    env = make_single_env({'name': 'ALE/Breakout-v5'})
    try:
        env.reset(seed=0)
        lives = [env.step(0)[4]['lives'] for _ in range(400)]
        assert min(lives) < 5
    finally:
        env.close()
    # the gymnasium wrappers' path (test_ale_vector.py checks the same on ALE's vector env)
    assert_truncated_at(make_env(validate_spec(atari_spec('PPO', {'type': 'ConvNet'}, {
        'name': 'ALE/Breakout-v5', 'max_t': 50, 'vector_backend': 'gymnasium'}))['env']), [49, 99])
    env = make_env(validate_spec(atari_spec('PPO', {'type': 'ConvNet'}, {'name': 'BreakoutNoFrameskip-v4'}))['env'])
    try:
        env.reset(seed=0)
        for _ in range(400):
            obs, _, terminated, truncated, info = env.step(np.zeros(2, dtype=int))
            if terminated[0]:
                break
        assert terminated[0] and info['final_info']['lives'][0] == 4  # a life, not the game
        np.testing.assert_array_equal(obs[0], info['final_obs'][0])  # the game goes on from where it was
    finally:
        env.close()


def test_a_convnet_on_channels_last_images_is_not_available_yet():
    with pytest.raises(SpecError,
                       match=r'^agent\.net\.type: ConvNet on channels-last images \(96, 96, 3\).*not available yet'):
        build_net(net_spec(), (96, 96, 3), 5)


# SLM-Lab v5's Atari arc specs (benchmark_arc/*/..._atari_arc.yaml, crossq_atari.yaml): a TorchArcNet
# whose arc starts with LazyConv2d takes the frames in their shape
CONV_ARC = {'modules': {'body': {'Sequential': [
    {'LazyConv2d': {'out_channels': 8, 'kernel_size': 8, 'stride': 4}}, {'ReLU': None},
    {'LazyConv2d': {'out_channels': 16, 'kernel_size': 4, 'stride': 2}}, {'ReLU': None},
    {'Flatten': None}, {'LazyLinear': {'out_features': 32}}, {'ReLU': None}]}},
    'graph': {'input': 'x', 'modules': {'body': ['x']}, 'output': 'body'}}


def test_a_torcharcnet_with_convolutions_takes_frames_in_their_shape():
    net = build_net(net_spec('TorchArcNet', arc=CONV_ARC, normalize=True), (4, 84, 84), [6, 1])
    conv = next(m for m in net.modules() if isinstance(m, torch.nn.Conv2d))
    assert isinstance(conv, torch.nn.Conv2d) and conv.in_channels == 4
    logits, value = net(torch.full((3, 4, 84, 84), 255, dtype=torch.uint8).float())
    assert logits.shape == (3, 6) and value.shape == (3, 1)
    flat = build_net(net_spec('TorchArcNet', arc=CONV_ARC, normalize=False), (4, 84, 84), 6)
    flat.load_state_dict(net.state_dict(), strict=False)  # heads differ in number: only the body is compared
    x = torch.randint(0, 256, (2, 4, 84, 84)).float()
    assert torch.allclose(net.body(x / 255.0), flat.body(x / 255.0))
    with pytest.raises(SpecError, match='TorchArcNet critic on image observations cannot take the action'):
        build_net(net_spec('TorchArcNet', arc=CONV_ARC), (4, 84, 84), 1, extra_dim=2)



def test_conv_nets_lay_out_weights_and_images_channels_last_by_default_with_the_same_outputs():
    """memory_format "channels_last" (the default) is torch's fast CPU path; the net's state_dict
    keys and shapes are the same in both layouts, and so are its outputs up to rounding."""
    spec = dict(conv_hid_layers=[[8, 4, 2], [8, 3, 1]], fc_hid_layers=[16], batch_norm=True, normalize=True)
    assert net_spec(**spec)['memory_format'] == 'channels_last'
    torch.manual_seed(0)
    fast = build_net(net_spec(**spec), (4, 20, 20), 3)
    plain = build_net(net_spec(**spec, memory_format='contiguous'), (4, 20, 20), 3)
    plain.load_state_dict(fast.state_dict())
    conv = fast.conv[0].weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    assert plain.conv[0].weight.is_contiguous()
    frames = torch.randint(0, 256, (5, 4, 20, 20), dtype=torch.uint8)
    assert fast.prepare(frames).is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(fast(frames), plain(frames))
    for layout in ('channels_last', 'contiguous'):  # a checkpoint of either loads into the other
        other = build_net(net_spec(**spec, memory_format=layout), (4, 20, 20), 3)
        other.load_state_dict(plain.state_dict() if layout == 'channels_last' else fast.state_dict())


def test_a_conv_net_saved_before_memory_format_resumes_contiguous():
    """A run's saved spec from before the key (a validated conv net spec without memory_format)
    gets "contiguous", the layout it trained in; a spec that says a layout keeps it; other nets
    get nothing."""
    from slm_lab.persistence.edits import fill_keys_added_later
    saved = {'agent': {'algorithm': {'name': 'PPO'}, 'net': {'type': 'ConvNet', 'conv_hid_layers': NATURE_CONV},
                       'critic_net': {'type': 'MLPNet', 'hid_layers': [8]}}, 'env': {}, 'meta': {}}
    filled = fill_keys_added_later(saved)
    assert filled['agent']['net']['memory_format'] == 'contiguous'
    assert 'memory_format' not in filled['agent']['critic_net']
    said = {'agent': {'net': {'type': 'ConvNet', 'conv_hid_layers': NATURE_CONV, 'memory_format': 'channels_last'}}}
    assert fill_keys_added_later(said)['agent']['net']['memory_format'] == 'channels_last'
    # a spec read as written (an old search's trial spec, which its trials do not fill) builds NCHW,
    # as it ran; a validated spec holds the key (channels_last for a new run)
    old = {k: v for k, v in net_spec(conv_hid_layers=[[4, 4, 2, 0, 1]], fc_hid_layers=[8]).items()
           if k != 'memory_format'}
    assert not build_net(old, (4, 20, 20), 3).channels_last


@pytest.mark.slow
def test_a_ppo_pong_run_saved_before_memory_format_resumes_in_its_layout(tmp_path):
    """A contiguous run whose saved specs lack the key (as a lab before it saved them), resumed to
    2F with the user's spec file (no memory_format), equals the contiguous run of 2F."""
    from lab_helpers import assert_same_run, drop_saved_key, saved_values, spec_file_in, train_one
    spec = atari_spec('PPO', {'type': 'ConvNet', 'shared': True, 'memory_format': 'contiguous'},
                      {'name': 'ALE/Pong-v5', 'vector_backend': 'gymnasium'})
    old_file = spec_file_in(tmp_path / 'old_spec', 'ppo_nchw', spec)
    old = train_one(old_file, 'ppo_nchw', 'train', [], tmp_path / 'old')
    drop_saved_key(old, 'ppo_nchw', 'agent.net.memory_format')
    straight = train_one(old_file, 'ppo_nchw', 'train', ['env.max_frame=512'], tmp_path / 'straight')
    del spec['agent']['net']['memory_format']
    users_file = spec_file_in(tmp_path, 'ppo_nchw', spec)
    assert train_one(users_file, 'ppo_nchw', 'train@latest', ['env.max_frame=512'], tmp_path / 'old') == old
    record = json.loads((old / 'ppo_nchw_resumes.json').read_text())[-1]
    assert record['spec_diff'] == [{'key': 'env.max_frame', 'old': 256, 'new': 512}]  # not an edit
    assert saved_values(old, 'ppo_nchw', 'agent.net.memory_format') == ['contiguous'] * 3
    assert_same_run(old, straight, 'ppo_nchw')
