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
    """For fixed weights, each net's output on the context of a step, and on the context peeked for
    its next observation (the final one where the episode ends), equals the output of that net's
    cell stepped from zero at the episode's start through every observation up to it: deep in an
    episode (longer than seq_len), right after a reset, with sub-envs ending at different steps,
    for two nets with their own slots (an actor's and a critic's)."""
    torch.manual_seed(0)
    spec = {**NET, 'cell_type': cell, 'rnn_num_layers': layers}
    layout = recurrent.SeqLayout(spec['seq_len'], 4, recurrent.state_size(spec), 2)
    with recurrent.building(layout):
        nets = [recurrent.RecurrentNet(spec, layout.width, [2, 1]), recurrent.RecurrentNet(spec, layout.width, 1)]
    n_envs = 2
    seq = recurrent.SeqContext(layout, nets, n_envs, torch.device('cpu'))
    rng = np.random.default_rng(1)
    episode_obs = [[] for _ in range(n_envs)]

    def reference(net, observations):  # the whole episode so far, from a zero state
        x = net.fc(torch.as_tensor(np.stack(observations))[None])
        _, h = net.rnn(x)
        out = net.apply_heads(net._top(h))
        return out if isinstance(out, list) else [out]

    def check(ctx, histories):
        for net in nets:
            with torch.no_grad():
                out = net(torch.as_tensor(ctx))
                out = out if isinstance(out, list) else [out]
                for e in range(n_envs):
                    for got, ref in zip(out, reference(net, histories[e])):
                        torch.testing.assert_close(got[e], ref[0], rtol=1e-5, atol=1e-6)

    ends = {0: {4, 9}, 1: {1}}  # env 0 ends episodes after steps 4 and 9; env 1 after step 1 only
    obs = rng.normal(size=(n_envs, 4)).astype(np.float32)
    for step in range(14):
        ctx = seq.observe(obs)
        seq.advance()
        for e in range(n_envs):
            episode_obs[e].append(obs[e])
        check(ctx, episode_obs)
        next_obs = rng.normal(size=(n_envs, 4)).astype(np.float32)  # the final one where an episode ends
        check(seq.peek(next_obs), [episode_obs[e] + [next_obs[e]] for e in range(n_envs)])
        done = np.array([step in ends[e] for e in range(n_envs)])
        seq.end_episodes(done)
        for e in np.flatnonzero(done):
            episode_obs[e] = []
        obs = np.where(done[:, None], rng.normal(size=(n_envs, 4)).astype(np.float32), next_obs)


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


@pytest.mark.slow
@pytest.mark.parametrize('algorithm, shared, memory', [
    ('PPO', False, 'OnPolicyBatchReplay'),
    ('DoubleDQN', None, 'Replay'),
])
def test_recurrent_runs_resume_exactly(tmp_path, make_spec, algorithm, shared, memory):
    """Recurrent PPO (separate actor and critic) and DRQN on CartPole: stopped at F by max_frame
    (mid-episode, with hidden states carried) and resumed to 2F give the CSV cells and weights of a
    run of 2F that never stopped."""
    from lab_helpers import check_resume_after_max_frame
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
    with pytest.raises(SpecError, match='agent.net.type: SoftActorCritic does not take a RecurrentNet'):
        validate_spec(spec)


def test_the_memory_guard_counts_the_stored_contexts(make_spec):
    """A recurrent agent's replay stores contexts (seq_len observations, a mask and hidden states),
    and the memory estimate counts those, not bare observations."""
    import gymnasium as gym

    from slm_lab.agent.estimate import estimate_session
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


def test_each_greedy_episode_starts_from_a_zero_hidden_state():
    from conftest import build_spec, make_agent
    spec = build_spec('PPO')
    spec['agent']['net'] = {**NET, 'shared': True, 'optim_spec': {'name': 'Adam', 'lr': 0.01}}
    agent, _ = make_agent(spec)
    observations = np.random.default_rng(0).normal(size=(5, 1, 4)).astype(np.float32)
    hidden = []
    for _ in range(2):
        agent.start_greedy_episode()
        for o in observations:
            agent.act_greedy(o)
        hidden.append(agent.greedy_seq.hidden.copy())
    assert np.abs(hidden[0]).sum() > 0
    np.testing.assert_array_equal(hidden[0], hidden[1])


def test_abandoned_episodes_end_truncated_and_contexts_start_again(make_spec):
    """When a resume restarts the env's episodes (an env that cannot be snapshotted mid-episode),
    the recurrent contexts empty, the on-policy memories end what they hold of the old episodes
    as truncated (no return runs on into the new ones), and SARSA's held-back step too."""
    from conftest import make_agent
    for algorithm, memory in (('PPO', 'OnPolicyBatchReplay'), ('Reinforce', 'OnPolicyReplay'),
                              ('SARSA', 'OnPolicyBatchReplay')):
        spec = make_spec('PPO' if algorithm == 'SARSA' else algorithm, num_envs=2)
        if algorithm == 'SARSA':
            spec['agent']['algorithm'] = {
                'name': 'SARSA', 'action_pdtype': 'Argmax', 'action_policy': 'epsilon_greedy', 'training_frequency': 2,
                'explore_var_spec': {'name': 'linear_decay', 'start_val': 1.0, 'end_val': 0.1, 'start_step': 0,
                                     'end_step': 100}}
        spec['agent']['memory'] = {'name': memory}
        spec['agent']['net'] = {**NET, 'optim_spec': {'name': 'Adam', 'lr': 0.01}}
        if algorithm == 'PPO':
            spec['agent']['net']['shared'] = True
        agent, _ = make_agent(spec)
        obs = np.ones((2, 4), np.float32)
        no = np.zeros(2, bool)
        for _ in range(3):
            action = agent.act(obs)
            agent.update(obs, action, np.ones(2), obs, no, no)
        if algorithm == 'SARSA':  # SARSA holds back the last step of each batch
            while agent.algorithm.held is None:
                action = agent.act(obs)
                agent.update(obs, action, np.ones(2), obs, no, no)
        agent.start_fresh_episodes()
        assert not agent.seq.mask.any() and not agent.seq.hidden.any()
        memory = agent.memory
        if memory.__class__.__name__ == 'OnPolicyReplay':
            assert memory.num_finished == 2 and all(e['truncateds'][-1] for e in memory.finished)
            assert not any(e['rewards'] for e in memory.running)
        elif memory.size:
            assert memory.buffers['truncateds'][memory.size - 1].all()
            assert not memory.buffers['truncateds'][:memory.size - 1].any()
        if algorithm == 'SARSA':
            assert agent.algorithm.held.truncateds.all()


def test_a_resume_with_fresh_episodes_tells_the_agent(tmp_path, make_spec, monkeypatch):
    """LunarLander cannot be snapshotted mid-episode: its resume starts fresh episodes, and the
    agent hears of it (so a recurrent agent does not carry the old episodes' hidden states on)."""
    pytest.importorskip('Box2D', reason='LunarLander needs the box2d extra')
    from lab_helpers import run_dirs, write_spec

    from slm_lab import lab
    from slm_lab.agent import Agent
    spec = make_spec('PPO', env='LunarLander-v3', max_frame=64, num_envs=2, log_frequency=32)
    spec['agent']['net'] = {**NET, 'shared': True, 'optim_spec': {'name': 'Adam', 'lr': 0.01}}
    spec_file = write_spec(tmp_path, 'rnn_lander', spec)
    lab.run(spec_file, 'rnn_lander', 'train', data_dir=str(tmp_path))
    calls = []
    original = Agent.start_fresh_episodes
    monkeypatch.setattr(Agent, 'start_fresh_episodes',
                        lambda self: (calls.append(self.seq.mask.copy()), original(self)))
    lab.run(spec_file, 'rnn_lander', 'train@latest', ['env.max_frame=128'], data_dir=str(tmp_path))
    assert calls and all(mask.all() for mask in calls)  # the old episodes' windows were full, and are dropped
    assert len(run_dirs(tmp_path, 'rnn_lander')) == 1
