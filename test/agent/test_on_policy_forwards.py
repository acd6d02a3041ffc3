"""PPO's and A2C's update forward each state once: one forward over the batch gives PPO's old
log-probabilities and V(s), V(s'_t) is V(s_{t+1}) wherever the next state is, byte for byte, the
following state, and an image batch is divided by 255 once. Each case compares what the update
trains on with the computation it replaced (lab commit 2b790b8: V(s), V(s') and log pi_old each a
forward over the whole batch, each dividing the frames by 255), on batches of real envs with
terminations and time-limit truncations in the middle of the batch."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn

from slm_lab.agent import Agent
from slm_lab.agent.algorithm.maths import episode_returns, gae, nstep_returns
from slm_lab.agent.memory.onpolicy import RolloutBatch
from slm_lab.agent.net.net_util import forwards_per_sample
from slm_lab.env import Clock, make_env
from slm_lab.spec import validate_spec

# the algorithm's float32 maths on the same numbers, summed in other orders at most
TIGHT = {'rtol': 1e-6, 'atol': 1e-6}


def cartpole_spec(algorithm: dict, net: dict | None = None, memory: str = 'OnPolicyBatchReplay') -> dict:
    """CartPole cut at 15 steps (a truncation every so often beside the terminations of a random
    policy), 3 sub-envs, batches of 40 vector steps."""
    episodes = memory == 'OnPolicyReplay'  # 6 episodes a batch, else 40 vector steps
    algorithm = {'gamma': 0.9, 'lam': 0.8, 'training_frequency': 6 if episodes else 40, **algorithm}
    if algorithm['name'] == 'PPO':
        algorithm['time_horizon'] = 40
    net = {'type': 'MLPNet', 'hid_layers': [16], **(net or {})}
    if net['type'] == 'RecurrentNet':
        del net['hid_layers']
    return {'agent': {'name': 'agent', 'algorithm': algorithm, 'memory': {'name': memory},
                      'net': {'hid_layers_activation': 'tanh', 'shared': False,
                              'optim_spec': {'name': 'Adam', 'lr': 1e-3}, **net}},
            'env': {'name': 'CartPole-v1', 'num_envs': 3, 'max_t': 15, 'max_frame': 10000},
            'meta': {'random_seed': 0}}


def collect(spec: dict):
    """(algorithm, the first batch it would train on) from a run of its agent in the spec's env,
    stepped as a session steps it (the true next observation at each episode's end)."""
    spec = validate_spec(spec)
    env = make_env(spec['env'])
    num_envs = spec['env']['num_envs']
    torch.manual_seed(0)
    agent = Agent(spec, env.single_observation_space, env.single_action_space, num_envs,
                  Clock(spec['env']['max_frame'], num_envs), seed=0)
    batches = []
    agent.algorithm.train_batch = batches.append  # keep the batch instead of training on it
    obs, _ = env.reset(seed=1)
    try:
        while not batches:
            action = agent.act(obs)
            next_obs, reward, terminated, truncated, info = env.step(action)
            true_next_obs = next_obs.copy()
            if (terminated | truncated).any():
                mask = info['_final_obs']
                true_next_obs[mask] = np.stack(info['final_obs'][mask])
            agent.update(obs, action, reward, true_next_obs, terminated, truncated)
            obs = next_obs
    finally:
        env.close()
    return agent.algorithm, batches[0]


def flat(batch):
    """states, next states (B, ...), terminateds, dones (T, N) of either batch type."""
    if isinstance(batch, RolloutBatch):
        return (batch.flat('states'), batch.flat('next_states'), batch.terminateds,
                np.maximum(batch.terminateds, batch.truncateds))
    return batch.states, batch.next_states, batch.terminateds[:, None], batch.dones[:, None]


@torch.no_grad()
def whole_batch_forwards(algo, batch, actions: torch.Tensor):
    """What the update trained on before (2b790b8): states and next states as float tensors (the
    net dividing frames by 255 in each forward), V(s) over the states, V(s') over every next state,
    then log pi_old(a|s) over the states. Returns (log-probs (B,), V(s) (T, N), V(s') (T, N))."""
    states, next_states, terminateds, _ = flat(batch)
    model = algo.model
    values = model.value(algo.tensor(states)).reshape(terminateds.shape)
    next_values = model.value(algo.tensor(next_states)).reshape(terminateds.shape)
    log_probs = model.head.log_prob(model.pd_out(algo.tensor(states)), actions)
    return log_probs, values, next_values


def expected_kept(batch) -> int:
    """Next states the update forwards: each episode end before the batch's last step (CartPole's
    first observation of an episode never repeats the last one's bytes), and the last step's."""
    _, _, _, dones = flat(batch)
    return int(dones[:-1].sum()) + dones.shape[1]


class RowCounter:
    """Rows through each output layer of the model's nets: the samples each net forwarded."""

    def __init__(self, model):
        nets = {'body': model.body} if model.shared else {'actor': model.actor, 'critic': model.critic}
        self.rows = dict.fromkeys(nets, 0)
        for name, net in nets.items():  # the nets call their heads' forward directly (net_util.run_layers)
            net.apply_heads = self._counting(name, net.apply_heads)

    def _counting(self, name, apply_heads):
        def count(h):
            self.rows[name] += len(h)
            return apply_heads(h)
        return count


def assert_targets_of_whole_batch_values(algo, batch, advs, returns, old_values, next_values) -> None:
    """PPO's advantages and returns (B,) are GAE's over the whole-batch values V(s), V(s') (T, N)."""
    _, _, terminateds, dones = flat(batch)
    rewards = algo.tensor(batch.rewards.reshape(terminateds.shape))
    old_advs = gae(rewards, old_values, next_values, algo.tensor(terminateds), algo.tensor(dones), algo.gamma,
                   algo.lam)
    torch.testing.assert_close(advs, old_advs.reshape(-1), **TIGHT)
    torch.testing.assert_close(returns, (old_advs + old_values).reshape(-1), **TIGHT)


def assert_ppo_matches_whole_batch_forwards(algo, batch) -> dict:
    """PPO's update inputs equal the whole-batch ones (log pi_old and V(s) exactly: the same
    forward on the same batch); returns the rows each net forwarded."""
    rollout = algo.rollout(batch)
    before = copy.deepcopy(algo.model.state_dict())
    counter = RowCounter(algo.model)
    log_probs, advs, returns, values = algo.old_policy_and_advantages(rollout)
    rows = dict(counter.rows)
    new_state = copy.deepcopy(algo.model.state_dict())
    algo.model.load_state_dict(before)
    old_log_probs, old_values, next_values = whole_batch_forwards(algo, batch, rollout.actions)
    for key, value in algo.model.state_dict().items():  # running statistics moved alike, if any
        torch.testing.assert_close(new_state[key], value, rtol=0, atol=0, msg=key)
    assert torch.equal(log_probs, old_log_probs)
    assert torch.equal(values, old_values.reshape(-1))
    assert_targets_of_whole_batch_values(algo, batch, advs, returns, old_values, next_values)
    return rows


# --- PPO on CartPole ------------------------------------------------------------------------------------

@pytest.mark.parametrize('memory', ['OnPolicyBatchReplay', 'OnPolicyReplay'])
@pytest.mark.parametrize('shared', [False, True])
def test_ppo_forwards_the_batch_once_and_only_the_next_states_after_episode_ends(memory, shared):
    # keep_acting_outputs false: the update's own forward over the batch (a shared net on
    # OnPolicyBatchReplay takes the acting forwards' outputs otherwise, tested below)
    algo, batch = collect(cartpole_spec({'name': 'PPO', 'keep_acting_outputs': False}, {'shared': shared}, memory))
    _, _, terminateds, dones = flat(batch)
    truncateds = dones - terminateds
    assert terminateds[:-1].any() and truncateds[:-1].any(), 'both kinds of episode end inside the batch'
    B, K = dones.size, expected_kept(batch)
    assert int(algo.rollout(batch).next_kept.sum()) == K < B
    rows = assert_ppo_matches_whole_batch_forwards(algo, batch)
    # before: 3B rows through a shared net; B through the actor and 2B through the critic
    assert rows == ({'body': B + K} if shared else {'actor': B, 'critic': B + K})


@pytest.mark.parametrize('shared', [False, True])
def test_ppo_takes_log_pi_old_and_v_from_the_acting_forwards_of_a_shared_net(shared):
    # keep_acting_outputs (the default): a shared net's update forwards only the next states that
    # are not the following states; log pi_old(a|s) and V(s) are the acting forwards' (3 rows each),
    # the same numbers as a forward over the batch up to rounding. Separate nets keep the batch forward.
    algo, batch = collect(cartpole_spec({'name': 'PPO'}, {'shared': shared}))
    assert (algo.acting_outputs is not None) == shared
    if not shared:
        assert assert_ppo_matches_whole_batch_forwards(algo, batch) == {
            'actor': batch.rewards.size, 'critic': batch.rewards.size + expected_kept(batch)}
        return
    assert algo.acting_outputs.steps == batch.rewards.shape[0]
    rollout = algo.rollout(batch)
    counter = RowCounter(algo.model)
    log_probs, advs, returns, values = algo.old_policy_and_advantages(rollout)
    assert counter.rows == {'body': expected_kept(batch)}
    assert algo.acting_outputs.steps == 0  # the next batch's record starts afresh
    old_log_probs, old_values, next_values = whole_batch_forwards(algo, batch, rollout.actions)
    torch.testing.assert_close(log_probs, old_log_probs, **TIGHT)
    torch.testing.assert_close(values, old_values.reshape(-1), **TIGHT)
    assert_targets_of_whole_batch_values(algo, batch, advs, returns, old_values, next_values)
    # a record that does not cover the batch step for step (here: none) is not used
    counter.rows['body'] = 0
    log_probs2 = algo.old_policy_and_advantages(rollout)[0]
    assert counter.rows == {'body': batch.rewards.size + expected_kept(batch)}
    torch.testing.assert_close(log_probs2, old_log_probs, rtol=0, atol=0)


@pytest.mark.parametrize('min_rows, kept', [(8, False), (3, True)])
def test_a_bf16_net_keeps_acting_outputs_only_where_it_acts_in_bf16(min_rows, kept):
    # 3 envs: below bf16_min_rows the net acts in float32, and its minibatches would compare bf16
    # log-probabilities with float32 ones
    net = {'shared': True, 'precision': 'bf16', 'bf16_min_rows': min_rows}
    algo, _ = collect(cartpole_spec({'name': 'PPO'}, net))
    assert (algo.acting_outputs is not None) is kept


def test_a_first_observation_with_the_bytes_of_the_last_one_stands_for_it():
    # a reset whose first observation repeats the final one's bytes: V(s'_t) is V(s_{t+1}) there too,
    # which is the same number, since the net sees the same input
    algo, batch = collect(cartpole_spec({'name': 'PPO'}))
    t, n = map(int, np.argwhere(batch.terminateds[:-1] + batch.truncateds[:-1])[0])
    batch.states[t + 1, n] = batch.next_states[t, n]
    assert int(algo.rollout(batch).next_kept.sum()) == expected_kept(batch) - 1
    assert_ppo_matches_whole_batch_forwards(algo, batch)


def test_ppo_on_a_recurrent_net_takes_next_contexts_from_the_following_ones():
    # a recurrent net reads contexts (its last seq_len observations and the hidden state before
    # them): the next step's context within an episode has the same bytes as the next context
    net = {'type': 'RecurrentNet', 'fc_hid_layers': [8], 'rnn_hidden_size': 8, 'seq_len': 4}
    algo, batch = collect(cartpole_spec({'name': 'PPO'}, net))
    K = expected_kept(batch)
    assert int(algo.rollout(batch).next_kept.sum()) == K
    assert assert_ppo_matches_whole_batch_forwards(algo, batch) == {'actor': batch.rewards.size,
                                                                      'critic': batch.rewards.size + K}


@pytest.mark.parametrize('net', [{'batch_norm': True}, {'batch_norm': True, 'shared': True}])
def test_ppo_with_batch_norm_in_training_mode_keeps_its_three_forwards(net):
    # a batch norm in training mode normalises by the batch's statistics and moves its running ones
    # with each forward: the update forwards the whole batch three times, as before, exactly
    algo, batch = collect(cartpole_spec({'name': 'PPO'}, net))
    assert not algo.model.forwards_per_sample()
    assert bool(algo.rollout(batch).next_kept.all())
    rows = assert_ppo_matches_whole_batch_forwards(algo, batch)
    B = batch.rewards.size
    assert rows == ({'body': 3 * B} if net.get('shared') else {'actor': B, 'critic': 2 * B})


# --- A2C on CartPole ------------------------------------------------------------------------------------

@pytest.mark.parametrize('returns', ['gae', 'nstep', 'plain'])
@pytest.mark.parametrize('memory', ['OnPolicyBatchReplay', 'OnPolicyReplay'])
def test_a2c_takes_next_values_from_its_values_of_the_following_states(returns, memory):
    # n-step A2C trains every n steps (or n episodes)
    n = 20 if memory == 'OnPolicyBatchReplay' else 4
    algorithm = {'name': 'ActorCritic', 'lam': 0.8 if returns == 'gae' else None,
                 'num_step_returns': n if returns == 'nstep' else None}
    algo, batch = collect(cartpole_spec(algorithm, memory=memory))
    rollout = algo.rollout(batch)
    assert int(rollout.next_kept.sum()) == expected_kept(batch)
    counter = RowCounter(algo.model)
    values = algo.model.pd_out_and_value(rollout.states, prepared=True)[1].detach().reshape(rollout.rewards.shape)
    advs, targets = algo.advantages_and_targets(rollout, values)
    assert counter.rows['critic'] == batch.rewards.size + expected_kept(batch)  # not 2B
    _, old_values, next_values = whole_batch_forwards(algo, batch, rollout.actions)
    assert torch.equal(values, old_values)
    args = rollout.rewards, next_values, rollout.terminateds, rollout.dones, algo.gamma
    if returns == 'gae':
        old_targets = gae(rollout.rewards, old_values, next_values, *args[2:], algo.lam) + old_values
    elif returns == 'nstep':
        old_targets = nstep_returns(*args, algo.num_step_returns)
    else:
        old_targets = episode_returns(*args)
    torch.testing.assert_close(targets, old_targets.reshape(-1), **TIGHT)
    torch.testing.assert_close(advs, (old_targets - old_values).reshape(-1), **TIGHT)


# --- images ---------------------------------------------------------------------------------------------

def pong_spec(algorithm: dict, batch_norm: bool) -> dict:
    """ALE/Pong-v5 (4 stacked 84x84 uint8 frames) cut at 6 agent steps, 2 sub-envs, 16 vector steps
    a batch, a small ConvNet dividing by 255."""
    steps = {'time_horizon': 16} if algorithm['name'] == 'PPO' else {'training_frequency': 16}
    return {'agent': {'name': 'agent', 'algorithm': {'gamma': 0.9, 'lam': 0.8, **steps, **algorithm},
                      'memory': {'name': 'OnPolicyBatchReplay'},
                      'net': {'type': 'ConvNet', 'shared': True, 'normalize': True, 'batch_norm': batch_norm,
                              'conv_hid_layers': [[8, 8, 4, 0, 1], [16, 4, 2, 0, 1]], 'fc_hid_layers': [32],
                              'optim_spec': {'name': 'Adam', 'lr': 1e-3}}},
            'env': {'name': 'ALE/Pong-v5', 'num_envs': 2, 'max_t': 6, 'max_frame': 10000,
                    'vector_backend': 'gymnasium'},
            'meta': {'random_seed': 0}}


@pytest.mark.parametrize('batch_norm', [False, True])
def test_ppo_on_frames_divides_them_by_255_once_with_the_same_bits(batch_norm):
    pytest.importorskip('ale_py', reason='the Atari extra is not installed')
    pytest.importorskip('cv2', reason='the Atari extra is not installed')
    algo, batch = collect(pong_spec({'name': 'PPO', 'keep_acting_outputs': False}, batch_norm))
    assert batch.states.dtype == np.uint8 and batch.truncateds[:-1].any()
    rollout = algo.rollout(batch)
    # prepared once: the very floats each forward made from the frames before
    assert torch.equal(rollout.states, algo.tensor(batch.flat('states')).float() / 255.0)
    net = algo.model.body
    frames = algo.tensor(batch.flat('states')[:5])
    for got, want in zip(net.forward_prepared(net.prepare(frames)), net(frames)):
        assert torch.equal(got, want)
    B = batch.rewards.size
    K = B if batch_norm else expected_kept(batch)
    assert int(rollout.next_kept.sum()) == K and len(rollout.next_states) == K
    assert assert_ppo_matches_whole_batch_forwards(algo, batch) == {'body': 3 * B if batch_norm else B + K}


@pytest.mark.parametrize('batch_norm', [False, True])
def test_ppo_on_frames_takes_the_acting_forwards_outputs_unless_its_net_reads_the_batch(batch_norm):
    # keep_acting_outputs: the frames' log pi_old and V(s) from acting (the net dividing them by 255
    # there as it does for a batch), only the kept next states forwarded; a batch norm in training
    # mode keeps the three forwards over the batch (acting's numbers came from other batches)
    pytest.importorskip('ale_py', reason='the Atari extra is not installed')
    pytest.importorskip('cv2', reason='the Atari extra is not installed')
    algo, batch = collect(pong_spec({'name': 'PPO'}, batch_norm))
    B = batch.rewards.size
    if batch_norm:
        assert assert_ppo_matches_whole_batch_forwards(algo, batch) == {'body': 3 * B}
        return
    rollout = algo.rollout(batch)
    counter = RowCounter(algo.model)
    log_probs, _, _, values = algo.old_policy_and_advantages(rollout)
    assert counter.rows == {'body': expected_kept(batch)}
    old_log_probs, old_values, _ = whole_batch_forwards(algo, batch, rollout.actions)
    torch.testing.assert_close(log_probs, old_log_probs, **TIGHT)
    torch.testing.assert_close(values, old_values.reshape(-1), **TIGHT)


def test_a2c_on_frames_takes_next_values_from_the_following_frames():
    pytest.importorskip('ale_py', reason='the Atari extra is not installed')
    pytest.importorskip('cv2', reason='the Atari extra is not installed')
    algo, batch = collect(pong_spec({'name': 'ActorCritic'}, batch_norm=False))
    rollout = algo.rollout(batch)
    values = algo.model.value(rollout.states, prepared=True).reshape(rollout.rewards.shape)
    _, old_values, next_values = whole_batch_forwards(algo, batch, rollout.actions)
    assert torch.equal(values, old_values)
    torch.testing.assert_close(algo.next_values(rollout, values), next_values, **TIGHT)


# --- which nets forward per sample ---------------------------------------------------------------------

@pytest.mark.parametrize('layer, per_sample', [
    (nn.LayerNorm(4), True), (nn.InstanceNorm1d(4), True), (nn.BatchNorm1d(4), False),
    (nn.InstanceNorm1d(4, track_running_stats=True), False), (nn.Dropout(0.1), False),
    (nn.AlphaDropout(0.1), False), (nn.RReLU(), False),
])
def test_nets_forward_per_sample_unless_a_layer_reads_the_batch_moves_state_or_draws_in_training(layer, per_sample):
    net = nn.Sequential(nn.Linear(4, 4), layer)
    assert forwards_per_sample(net) is per_sample
    assert forwards_per_sample(net.eval())  # in evaluation mode all of them are per sample
    assert forwards_per_sample(net.train()) is per_sample  # the modes are read at each call (the modules kept)
    assert forwards_per_sample(nn.Sequential(nn.Linear(4, 4), copy.deepcopy(layer))) is per_sample  # a net of its own
