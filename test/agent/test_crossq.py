"""CrossQ and batch renormalisation: the renorm maths by hand, the joint critic forward of
(s, a) and (s', a'), agent.critic_net, and exact resume of the renorm statistics and warmup."""
from __future__ import annotations

import pytest
import torch
from conftest import make_agent
from lab_helpers import check_resume_after_max_frame, fill_replay, resume_spec

from slm_lab.agent.net.batch_renorm import BatchRenorm1d, LazyBatchRenorm1d, batch_renorm, renorm_limits
from slm_lab.lib.errors import SpecError
from slm_lab.spec import validate_spec


def crossq_spec(env: str = 'Pendulum-v1', max_frame: int = 400, num_envs: int = 2, critic_net: dict | None = None,
                **algo) -> dict:
    spec = {
        'agent': {'name': 'CrossQ',
                  'algorithm': {'name': 'CrossQ', 'training_iter': 1, 'training_start_step': 64,
                                'critic_batch_renorm': {'warmup_steps': 200}, **algo},
                  'memory': {'name': 'Replay', 'batch_size': 32, 'max_size': 2000},
                  'net': {'type': 'MLPNet', 'hid_layers': [32], 'optim_spec': {'name': 'Adam', 'lr': 0.003}}},
        'env': {'name': env, 'num_envs': num_envs, 'max_frame': max_frame},
        'meta': {'log_frequency': 100, 'eval_frequency': 100, 'random_seed': 5},
    }
    if critic_net is not None:
        spec['agent']['critic_net'] = critic_net
    return spec


# --- batch renormalisation, by hand ----------------------------------------------------------------
def test_renorm_limits_warm_up_linearly():
    assert renorm_limits(0, 10, 3.0, 5.0) == (1.0, 0.0)
    assert renorm_limits(5, 10, 3.0, 5.0) == (2.0, 2.5)
    assert renorm_limits(50, 10, 3.0, 5.0) == (3.0, 5.0)
    assert renorm_limits(0, 0, 3.0, 5.0) == (3.0, 5.0)


def test_batch_renorm_corrects_batch_statistics_towards_running_ones():
    x = torch.tensor([[0.0], [2.0]])  # batch mean 1, biased variance 1
    running_mean, running_var = torch.tensor([0.0]), torch.tensor([4.0])  # running std 2
    # r = clip(1 / 2, 1/3, 3) = 0.5, d = clip((1 - 0) / 2, -5, 5) = 0.5: x_hat = (x - 1) * 0.5 + 0.5
    x_hat, mean, var = batch_renorm(x, running_mean, running_var, 0.0, 3.0, 5.0)
    assert x_hat.ravel().tolist() == [0.0, 1.0] and mean.item() == 1.0 and var.item() == 1.0
    # clipped: r_max 1.5 keeps r at 1/1.5, d_max 0.25 keeps d at 0.25
    x_hat, _, _ = batch_renorm(x, running_mean, running_var, 0.0, 1.5, 0.25)
    assert torch.allclose(x_hat.ravel(), torch.tensor([-1 / 1.5 + 0.25, 1 / 1.5 + 0.25]))
    # at the start of warmup (r_max 1, d_max 0) it is plain batch norm
    x_hat, _, _ = batch_renorm(x, running_mean, running_var, 0.0, 1.0, 0.0)
    assert x_hat.ravel().tolist() == [-1.0, 1.0]


def test_batch_renorm_module_moves_running_statistics_and_counts_its_steps():
    layer = BatchRenorm1d(1, eps=0.0, momentum=0.1, warmup_steps=4)
    out = layer(torch.tensor([[0.0], [2.0]]))
    assert out.ravel().tolist() == [-1.0, 1.0]  # step 0: plain batch norm
    assert layer.running_mean.item() == pytest.approx(0.1)  # 0.9 * 0 + 0.1 * 1
    assert layer.running_var.item() == pytest.approx(1.0)  # 0.9 * 1 + 0.1 * 1
    assert int(layer.step) == 1 and set(layer.state_dict()) >= {'running_mean', 'running_var', 'step'}
    layer.eval()
    assert layer(torch.tensor([[1.1]])).item() == pytest.approx(1.0)  # (1.1 - 0.1) / 1
    assert int(layer.step) == 1  # evaluation moves nothing


def test_lazy_batch_renorm_takes_its_width_from_the_first_input_and_loads_state():
    layer = LazyBatchRenorm1d(eps=0.001, momentum=0.01, warmup_steps=5)
    layer(torch.randn(8, 3))
    assert type(layer) is BatchRenorm1d and layer.running_mean.shape == (3,)
    fresh = LazyBatchRenorm1d(eps=0.001, momentum=0.01, warmup_steps=5)
    fresh.load_state_dict(layer.state_dict())
    assert torch.equal(fresh.running_var, layer.running_var) and int(fresh.step) == 1


# --- CrossQ -----------------------------------------------------------------------------------------
def test_crossq_has_no_target_nets_and_renormalises_each_hidden_layer_of_an_mlp_critic():
    agent, _ = make_agent(crossq_spec(critic_net={'type': 'MLPNet', 'hid_layers': [16, 8],
                                                  'optim_spec': {'name': 'Adam', 'lr': 0.001}}))
    alg = agent.algorithm
    assert set(alg.nets()) == {'net', 'q1_net', 'q2_net', 'temperature'}
    layers = [m for m in alg.q1_net.modules() if isinstance(m, BatchRenorm1d)]
    assert [m.num_features for m in layers] == [16, 8]
    optimized = {id(p) for g in alg.optimizers['critic'].param_groups for p in g['params']}
    assert all(id(p) in optimized for m in layers for p in m.parameters())
    assert alg.optimizers['critic'].param_groups[0]['lr'] == 0.001  # critic_net's optim_spec
    assert not any(isinstance(m, BatchRenorm1d) for m in alg.net.modules())


@pytest.mark.slow
def test_renormalised_critics_train_under_an_optimizer_that_copies_its_parameters(lab_run):
    # Lookahead keeps slow copies of the parameters it is given when made: the renorm layers must
    # exist by then, or its copies pair with the wrong tensors (a shape error at its first sync)
    spec = crossq_spec(max_frame=300, critic_net={
        'type': 'MLPNet', 'hid_layers': [16, 8],
        'optim_spec': {'name': 'Lookahead', 'optimizer': 'Adam', 'lr': 0.003, 'k': 2}})
    agent, _ = make_agent(spec)
    params = [p for g in agent.algorithm.optimizers['critic'].param_groups for p in g['params']]
    assert len(params) == len(list(agent.algorithm.q1_net.parameters())) * 2
    lab_run(spec, 'crossq_lookahead')


def test_without_critic_batch_renorm_an_mlp_critic_is_as_its_spec_builds_it():
    spec = crossq_spec()
    spec['agent']['algorithm']['critic_batch_renorm'] = None
    agent, _ = make_agent(spec)
    assert not any(isinstance(m, BatchRenorm1d) for m in agent.algorithm.q1_net.modules())


@pytest.mark.parametrize('env', ['Pendulum-v1', 'CartPole-v1'])
def test_each_critic_runs_once_on_current_and_next_rows_together(env):
    agent, clock = make_agent(crossq_spec(env))
    alg = agent.algorithm
    fill_replay(agent, clock, 40)
    rows = []
    alg.q1_net.register_forward_hook(lambda m, args, out: rows.append((len(args[0]), m.training)))
    alg.train()
    # the critic step: 2B rows in training mode; continuous actions add the policy's forward in eval mode
    expected = [(64, True)] + ([] if env == 'CartPole-v1' else [(32, False)])
    assert rows == expected
    brn = [m for m in alg.q1_net.modules() if isinstance(m, BatchRenorm1d)]
    assert all(int(m.step) == 1 for m in brn)  # the policy's evaluation forward moved no statistics


def test_targets_carry_no_gradient_and_bootstrap_unless_terminated():
    agent, clock = make_agent(crossq_spec())
    alg = agent.algorithm
    fill_replay(agent, clock, 40)
    batch = alg.memory.sample()
    s, ns, a = alg.tensor(batch.states), alg.tensor(batch.next_states), alg.tensor(batch.actions)
    rewards = torch.zeros(32)
    torch.manual_seed(0)
    *_, y_live, _, _ = alg.critic_values(s, a, ns, rewards, torch.zeros(32), alg.alpha())
    torch.manual_seed(0)
    *_, y_end, _, _ = alg.critic_values(s, a, ns, rewards, torch.ones(32), alg.alpha())
    assert not y_live.requires_grad
    assert torch.equal(y_end, torch.zeros(32)) and not torch.equal(y_live, torch.zeros(32))


def test_critic_net_is_validated_with_its_net_schema():
    spec = crossq_spec(critic_net={'type': 'MLPNet', 'hid_layer': [8]})
    with pytest.raises(SpecError, match=r'agent.critic_net.hid_layer: unknown key'):
        validate_spec(spec)
    spec = crossq_spec(critic_net={'type': 'MLPNet'})
    assert validate_spec(spec)['agent']['critic_net']['hid_layers'] == [64, 64]  # the net defaults filled in
    assert 'critic_net' not in validate_spec(crossq_spec())['agent']  # not written into specs that omit it


def test_crossq_takes_no_gumbel_softmax():
    with pytest.raises(SpecError, match="agent.algorithm.action_pdtype: 'GumbelSoftmax' does not fit CrossQ"):
        validate_spec(crossq_spec('CartPole-v1', action_pdtype='GumbelSoftmax'))


def test_critic_batch_renorm_needs_linear_layers_to_normalise():
    agent_spec = crossq_spec(critic_net={'type': 'MLPNet', 'hid_layers': []})
    with pytest.raises(SpecError, match='critic_batch_renorm'):
        make_agent(agent_spec)


# --- exact resume -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_discrete_crossq_resumes_exactly_after_max_frame(tmp_path):
    check_resume_after_max_frame(tmp_path, 'crossq_cartpole', resume_spec(crossq_spec, 'CartPole-v1'))

