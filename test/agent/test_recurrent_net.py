"""RecurrentNet: the context a memory stores gives the output of the hidden state carried through
the episode; hidden states reset at episode ends; recurrent runs resume exactly; bad specs are refused."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from slm_lab.agent.net import recurrent
from slm_lab.lib.errors import SpecError

NET = {'type': 'RecurrentNet', 'cell_type': 'GRU', 'fc_hid_layers': [8], 'hid_layers_activation': 'tanh',
       'rnn_hidden_size': 6, 'rnn_num_layers': 1, 'bidirectional': False, 'seq_len': 3, 'init_fn': None,
       'out_layer_activation': None}


@pytest.mark.parametrize('cell, layers', [('GRU', 1), ('LSTM', 2), ('RNN', 2)])
def test_a_context_gives_what_the_hidden_state_carried_through_the_episode_gives(cell, layers):
    """For fixed weights, the net's output on the stored context of a step equals the output of
    the cell stepped from zero at the episode's start through every observation up to that step,
    for steps deep in an episode (longer than seq_len) and right after a reset."""
    torch.manual_seed(0)
    spec = {**NET, 'cell_type': cell, 'rnn_num_layers': layers}
    layout = recurrent.SeqLayout(spec['seq_len'], 4, recurrent.state_size(spec), 1)
    with recurrent.building(layout):
        net = recurrent.RecurrentNet(spec, layout.width, [2, 1])
    n_envs = 2
    seq = recurrent.SeqContext(layout, [net], n_envs, torch.device('cpu'))
    rng = np.random.default_rng(1)
    episode_obs = [[] for _ in range(n_envs)]
    # env 0 ends episodes after steps 4 and 9; env 1 after step 1 only
    ends = {0: {4, 9}, 1: {1}}
    for step in range(14):
        obs = rng.normal(size=(n_envs, 4)).astype(np.float32)
        ctx = seq.observe(obs)
        seq.advance()
        with torch.no_grad():
            out = net(torch.as_tensor(ctx))
        for e in range(n_envs):
            episode_obs[e].append(obs[e])
            with torch.no_grad():  # the reference: the whole episode so far, from a zero state
                x = net.fc(torch.as_tensor(np.stack(episode_obs[e]))[None])
                _, h = net.rnn(x)
                want = net.apply_heads(net._top(h))
            for got, ref in zip(out, want):
                torch.testing.assert_close(got[e], ref[0], rtol=1e-5, atol=1e-6)
        done = np.array([step in ends[e] for e in range(n_envs)])
        seq.end_episodes(done)
        for e in np.flatnonzero(done):
            episode_obs[e] = []


def test_the_window_trains_through_seq_len_steps_and_a_target_copy_reads_the_same_slot():
    """Gradients reach the observations of the last seq_len steps only, and a deep copy (a target
    net) keeps the slot of the net it copies; separate actor and critic nets get slots 0 and 1."""
    from conftest import build_spec, make_agent
    spec = build_spec('PPO')
    spec['agent']['net'] = {**NET, 'shared': False, 'optim_spec': {'name': 'Adam', 'lr': 0.01}}
    agent, _ = make_agent(spec)
    assert [net.slot for net in agent.seq_nets] == [0, 1]
    assert agent.seq_nets[0] is agent.algorithm.model.actor and agent.seq_nets[1] is agent.algorithm.model.critic
    assert copy.deepcopy(agent.seq_nets[1]).slot == 1
    layout = agent.seq.layout
    ctx = torch.zeros(1, layout.width)
    ctx[0, :layout.seq_len * layout.obs_dim] = torch.randn(layout.seq_len * layout.obs_dim)
    ctx[0, layout.seq_len * layout.obs_dim:layout.seq_len * (layout.obs_dim + 1)] = torch.tensor([0., 1., 1.])
    ctx.requires_grad_(True)
    agent.seq_nets[0](ctx).sum().backward()
    grad = ctx.grad[0, :layout.seq_len * layout.obs_dim].reshape(layout.seq_len, -1)
    assert grad[0].abs().sum() == 0  # the empty position before the episode's start
    assert grad[1].abs().sum() > 0 and grad[2].abs().sum() > 0


def test_hidden_states_are_carried_and_reset_at_episode_ends():
    from conftest import build_spec, make_agent
    spec = build_spec('DQN', num_envs=2)
    spec['agent']['net'] = {**NET, 'optim_spec': {'name': 'Adam', 'lr': 0.01}}
    agent, _ = make_agent(spec)
    obs = np.ones((2, 4), np.float32)
    agent.act(obs)
    first = agent.seq.hidden.copy()
    assert np.abs(first).sum() > 0
    agent.update(obs, np.array([0, 1]), np.ones(2), obs, np.array([True, False]), np.array([False, False]))
    assert np.all(agent.seq.hidden[:, 0] == 0) and np.all(agent.seq.mask[0] == 0)
    np.testing.assert_array_equal(agent.seq.hidden[:, 1], first[:, 1])
    agent.act(obs)  # env 1's state moves on from its carried one; env 0 starts again from zero
    np.testing.assert_array_equal(agent.seq.hidden[:, 0], first[:, 0])
    assert not np.array_equal(agent.seq.hidden[:, 1], first[:, 1])


@pytest.mark.parametrize('algorithm, shared, memory', [
    ('PPO', False, 'OnPolicyBatchReplay'),
    ('DoubleDQN', None, 'Replay'),
])
def test_recurrent_runs_resume_exactly(tmp_path, make_spec, algorithm, shared, memory):
    """Recurrent PPO (separate actor and critic) and DRQN on CartPole: stopped at F by max_frame
    (mid-episode, with hidden states carried) and resumed to 2F give the CSV cells and weights of a
    run of 2F that never stopped."""
    from test_resume import check_resume_after_max_frame
    spec = make_spec(algorithm, max_frame=300, num_envs=2, log_frequency=100)
    net = {**NET, 'optim_spec': {'name': 'Adam', 'lr': 0.01}}
    if shared is not None:
        net['shared'] = shared
    spec['agent']['net'] = {**spec['agent']['net'], **net}
    spec['agent']['net'].pop('hid_layers', None)
    spec['meta']['snapshot_replay'] = True
    check_resume_after_max_frame(tmp_path, f'rnn_{algorithm.lower()}', spec)


@pytest.mark.parametrize('edit, message', [
    ({'bidirectional': True}, 'agent.net.bidirectional: true does not fit'),
    ({'cell_type': 'GRUCell'}, 'agent.net.cell_type: "GRUCell" is not valid'),
    ({'seq_len': 0}, 'agent.net.seq_len'),
])
def test_bad_recurrent_keys_are_refused_in_one_line(make_spec, edit, message):
    from slm_lab.spec import validate_spec
    spec = make_spec('PPO')
    spec['agent']['net'] = {**NET, 'shared': True, **edit}
    with pytest.raises(SpecError, match=message.replace('(', r'\(')):
        validate_spec(spec)


def test_sac_refuses_a_recurrent_net(make_spec):
    from slm_lab.spec import validate_spec
    spec = make_spec('PPO', env='Pendulum-v1')
    spec['agent'].update(algorithm={'name': 'SoftActorCritic'}, memory={'name': 'Replay'}, net={**NET})
    with pytest.raises(SpecError, match='agent.net.type: RecurrentNet for SoftActorCritic is not available'):
        validate_spec(spec)


def test_the_memory_guard_counts_the_stored_contexts(make_spec):
    """A recurrent agent's replay stores contexts (seq_len observations, a mask and hidden states),
    and the memory estimate counts those, not bare observations."""
    import gymnasium as gym

    from slm_lab.resources import estimate_session
    from slm_lab.spec import validate_spec
    spec = make_spec('DQN')
    spec['agent']['memory']['max_size'] = 100000
    mlp = {n.what: n.nbytes for n in estimate_session(validate_spec(spec), *_spaces(gym))}
    spec['agent']['net'] = {**NET, 'optim_spec': {'name': 'Adam', 'lr': 0.01}}
    rnn = {n.what: n.nbytes for n in estimate_session(validate_spec(spec), *_spaces(gym))}
    width = 3 * (4 + 1) + 6  # CartPole: 3 observations of 4, their mask, one GRU state of 6
    assert rnn['replay memory'] - mlp['replay memory'] == 100000 * 2 * (width - 4) * 4


def _spaces(gym):
    env = gym.make('CartPole-v1')
    env.close()
    return env.observation_space, env.action_space
