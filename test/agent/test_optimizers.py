"""SLM-Lab's optimizers that torch lacks (GlobalAdam, GlobalRMSprop, Lookahead): what they compute,
that a saved and reloaded one continues exactly, and how a spec names them."""
from __future__ import annotations

import copy
import io
import json

import pandas as pd
import pytest
import torch
from lab_helpers import ROOT

from slm_lab.agent.net import net_util
from slm_lab.agent.net.optimizers import GlobalAdam, GlobalRMSprop, Lookahead
from slm_lab.lib.errors import SpecError


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


def _train(model, opt, steps: int, start: int = 0) -> None:
    """`steps` steps on fixed batches (batch i is the same whichever run takes it)."""
    for i in range(start, start + steps):
        g = torch.Generator().manual_seed(100 + i)
        x, y = torch.randn(5, 3, generator=g), torch.randn(5, 2, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def _weights(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize('global_cls, torch_cls, kwargs', [
    (GlobalAdam, torch.optim.Adam, {'lr': 0.01, 'betas': (0.8, 0.99), 'weight_decay': 0.01}),
    (GlobalRMSprop, torch.optim.RMSprop, {'lr': 0.01, 'alpha': 0.9, 'eps': 1e-6}),
])
def test_global_optimizers_train_exactly_as_their_torch_class(global_cls, torch_cls, kwargs):
    a, b = _model(), _model()
    _train(a, global_cls(a.parameters(), **kwargs), 7)
    _train(b, torch_cls(b.parameters(), **kwargs), 7)
    for wa, wb in zip(_weights(a), _weights(b)):
        assert torch.equal(wa, wb)


@pytest.mark.parametrize('cls', [GlobalAdam, GlobalRMSprop])
def test_global_optimizers_have_their_state_before_the_first_step_and_share_it(cls):
    model = _model()
    opt = cls(model.parameters())
    for p in model.parameters():
        assert opt.state[p]['step'] == 0  # there to share before any worker steps
    opt.share_memory()
    assert all(t.is_shared() for s in opt.state.values() for t in s.values())


def test_lookahead_moves_slow_weights_every_k_steps_hand_computed():
    """SGD lr 0.1 on loss = x (gradient 1), k 2, alpha 0.5, x0 = 1:
    fast 0.9, 0.8 -> slow 1 + 0.5 (0.8 - 1) = 0.9, x = 0.9; fast 0.8, 0.7 -> slow 0.8, x = 0.8."""
    x = torch.nn.Parameter(torch.tensor([1.0]))
    frozen = torch.nn.Parameter(torch.tensor([5.0]))  # never gets a gradient: Lookahead leaves it alone
    opt = Lookahead([x, frozen], optimizer='SGD', lr=0.1, k=2, alpha=0.5)
    seen = []
    for _ in range(4):
        opt.zero_grad()
        x.sum().backward()
        opt.step()
        seen.append(round(float(x.detach()), 6))
    assert seen == [0.9, 0.9, 0.8, 0.8]
    assert float(frozen.detach()) == 5.0


def test_lookahead_groups_are_its_inner_optimizers_so_lr_schedules_reach_the_inner_steps():
    model = _model()
    opt = Lookahead(model.parameters(), optimizer='Adam', lr=0.01)
    assert opt.param_groups is opt.optimizer.param_groups
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    _train(model, opt, 1)
    sched.step()
    assert opt.optimizer.param_groups[0]['lr'] == 0.005


@pytest.mark.parametrize('name, kwargs', [
    ('GlobalAdam', {'lr': 0.01}),
    ('GlobalRMSprop', {'lr': 0.01}),
    ('Lookahead', {'optimizer': 'RAdam', 'lr': 0.01, 'k': 3}),  # a slow update before and after the save
    ('Lookahead', {'optimizer': 'GlobalAdam', 'lr': 0.01, 'k': 2, 'alpha': 0.3}),
])
def test_saved_and_loaded_optimizer_continues_exactly(name, kwargs):
    """N steps, save (through torch.save as a snapshot does), load into a fresh model and
    optimizer, M steps == N + M steps without the save."""
    spec = {'name': name, **kwargs}
    straight = _model()
    _train(straight, net_util.make_optimizer(straight.parameters(), spec), 8)

    first = _model()
    opt = net_util.make_optimizer(first.parameters(), spec)
    _train(first, opt, 4)
    buf = io.BytesIO()
    torch.save({'model': first.state_dict(), 'optim': opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    resumed = _model(seed=1)  # other initial weights: everything must come from the save
    resumed.load_state_dict(saved['model'])
    opt2 = net_util.make_optimizer(resumed.parameters(), spec)
    opt2.load_state_dict(saved['optim'])
    _train(resumed, opt2, 4, start=4)
    for wa, wb in zip(_weights(straight), _weights(resumed)):
        assert torch.equal(wa, wb)


def test_lookahead_resume_needs_its_slow_weights():
    """The slow weights are state: a load that dropped them would continue differently."""
    spec = {'name': 'Lookahead', 'optimizer': 'SGD', 'lr': 0.1, 'k': 3}
    straight = _model()
    _train(straight, net_util.make_optimizer(straight.parameters(), spec), 5)
    first = _model()
    opt = net_util.make_optimizer(first.parameters(), spec)
    _train(first, opt, 2)
    state = copy.deepcopy(opt.state_dict())
    resumed = copy.deepcopy(first)
    opt2 = net_util.make_optimizer(resumed.parameters(), spec)  # slow weights = the weights at step 2
    state['slow_weights'] = [[p.detach().clone() for p in resumed.parameters()]]
    opt2.load_state_dict(state)
    _train(resumed, opt2, 3, start=2)
    assert not all(torch.equal(a, b) for a, b in zip(_weights(straight), _weights(resumed)))


@pytest.mark.parametrize('optim_spec, message', [
    ({'name': 'GlobalAdam', 'momentum': 0.9}, 'agent.net.optim_spec.momentum: not an argument of'),
    ({'name': 'Lookahead', 'optimizer': 'RAdamm'}, "agent.net.optim_spec.optimizer: 'RAdamm' is not an optimizer "
                                                   "Lookahead can wrap (did you mean 'RAdam'?)"),
    ({'name': 'Lookahead', 'optimizer': 'Lookahead'}, 'agent.net.optim_spec.optimizer:'),
    ({'name': 'Lookahead', 'k': 0}, 'agent.net.optim_spec.k: expected an integer >= 1'),
    ({'name': 'Lookahead', 'alpha': 2}, 'agent.net.optim_spec.alpha: expected a number in [0, 1]'),
    ({'name': 'Lookahead', 'optimizer': 'SGD', 'betas': [0.9, 0.9]}, 'agent.net.optim_spec.betas: not an argument'),
])
def test_bad_optimizer_keys_are_named(optim_spec, message):
    with pytest.raises(SpecError) as e:
        net_util._check_optim_spec(optim_spec, 'agent.net.optim_spec')
    assert message in str(e.value)


@pytest.mark.slow
def test_slm_lab_optimizers_validate_and_train_through_the_lab(tmp_path):
    """A PPO spec as SLM-Lab v4 writes them (Lookahead over RAdam, GlobalAdam) resumes exactly."""
    from lab_helpers import check_resume_after_max_frame

    from conftest import build_spec
    spec = build_spec('PPO', max_frame=256)
    spec['agent']['net'].update({
        'actor_optim_spec': {'name': 'Lookahead', 'optimizer': 'RAdam', 'lr': 3e-4, 'k': 3},
        'critic_optim_spec': {'name': 'GlobalAdam', 'lr': 1e-3},
    })
    check_resume_after_max_frame(tmp_path, 'ppo_slm_optims', spec)


def _two_nets(seed: int = 0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


@pytest.mark.parametrize('fused', [True, False])
def test_step_optimizer_is_adam_step_number_for_number(fused):
    # the direct fused-Adam path must leave the weights and the optimizer state exactly as
    # opt.step() does, from the first step (which creates the state) on
    from slm_lab.agent.net.optim_steps import step_optimizer
    nets = [_two_nets(), _two_nets()]
    opts = [torch.optim.Adam(n.parameters(), lr=1e-2, eps=1e-5, fused=fused) for n in nets]
    torch.manual_seed(1)
    batches = [torch.randn(32, 4) for _ in range(5)]
    for x in batches:
        for i, (net, opt) in enumerate(zip(nets, opts)):
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            (opt.step() if i == 0 else step_optimizer(opt))
    for a, b in zip(nets[0].parameters(), nets[1].parameters()):
        assert torch.equal(a, b)
    state_a, state_b = opts[0].state_dict()['state'], opts[1].state_dict()['state']
    for k in state_a:
        for key in ('step', 'exp_avg', 'exp_avg_sq'):
            assert torch.equal(state_a[k][key], state_b[k][key])


def test_step_optimizer_without_torchs_fused_kernel_takes_adam_step(monkeypatch):
    # the direct path calls a private torch kernel, looked up once in kernels.py; a torch without
    # it (None there) must train the same, through Adam.step (calling None would raise)
    from slm_lab.agent.net import kernels, optim_steps
    monkeypatch.setattr(kernels, 'FUSED_ADAM_', None)
    nets = [_two_nets(), _two_nets()]
    opts = [torch.optim.Adam(n.parameters(), lr=1e-2, fused=True) for n in nets]
    for x in [torch.randn(32, 4) for _ in range(3)]:
        for i, (net, opt) in enumerate(zip(nets, opts)):
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            (opt.step() if i == 0 else optim_steps.step_optimizer(opt))
    for a, b in zip(nets[0].parameters(), nets[1].parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize('optim_spec, fused', [
    ({'name': 'Adam', 'lr': 0.01}, True),
    ({'name': 'AdamW', 'lr': 0.01}, True),
    ({'name': 'Adam', 'lr': 0.01, 'fused': False}, False),
    ({'name': 'Adam', 'lr': 0.01, 'foreach': True}, None),  # the spec chose how it steps
    ({'name': 'RMSprop', 'lr': 0.01}, None),
    ({'name': 'GlobalAdam', 'lr': 0.01}, None),
])
def test_adam_is_fused_by_default_unless_the_spec_says_how_it_steps(optim_spec, fused):
    from slm_lab.agent.net import net_util
    from slm_lab.spec import load_spec
    spec = load_spec('spec/benchmark/ppo/ppo_cartpole.json', 'ppo_cartpole',
                     [f'agent.net.optim_spec={json.dumps(optim_spec)}'])
    optim = spec['agent']['net']['optim_spec']
    assert optim.get('fused') == fused
    opt = net_util.make_optimizer(_two_nets().parameters(), optim)
    assert bool(opt.defaults.get('fused')) == bool(fused)


def test_group_grad_norms_are_get_total_norm():
    from slm_lab.agent.algorithm.base import _group_grad_norms
    torch.manual_seed(0)
    groups = [[torch.randn(16, 4), torch.randn(16)], [torch.randn(2, 16)], []]
    expected = [torch.nn.utils.get_total_norm(g) for g in groups]
    assert all(torch.equal(a, b) for a, b in zip(_group_grad_norms(groups), expected))


def _odd_net(seed: int = 0):
    torch.manual_seed(seed)  # sizes that are not multiples of a vector width, and an A2C net's 64-wide layers
    return torch.nn.Sequential(torch.nn.Linear(5, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 33), torch.nn.Tanh(), torch.nn.Linear(33, 7), torch.nn.Tanh(),
                               torch.nn.Linear(7, 3))


def _rmsprop_pair(kwargs: dict, steps: int, load_at: int | None = None):
    """The same net trained by RMSprop.step and by step_optimizer (the flat path), the second's
    optimizer state saved and loaded into a new optimizer at step `load_at` (a resume)."""
    from slm_lab.agent.net.optim_steps import step_optimizer
    nets = [_odd_net(), _odd_net()]
    opts = [torch.optim.RMSprop(n.parameters(), **kwargs) for n in nets]
    torch.manual_seed(1)
    for t in range(steps):
        x = torch.randn(40, 5) * 10 ** (t % 3 - 1)
        if t == load_at:
            saved = copy.deepcopy(opts[1].state_dict())
            opts[1] = torch.optim.RMSprop(nets[1].parameters(), **kwargs)
            opts[1].load_state_dict(saved)
        for i, (net, opt) in enumerate(zip(nets, opts)):
            for p in net.parameters():
                p.grad = None
            net(x).pow(2).mean().backward()
            (opt.step() if i == 0 else step_optimizer(opt))
    return nets, opts


@pytest.mark.parametrize('kwargs', [
    {'lr': 7e-4, 'alpha': 0.99, 'eps': 1e-5},  # the A2C zoo spec's
    {'lr': 1e-2, 'alpha': 0.9, 'eps': 1e-8, 'weight_decay': 0.01},
    {'lr': 1e-3, 'foreach': True},
], ids=['a2c zoo', 'weight decay', 'foreach'])
@pytest.mark.parametrize('load_at', [None, 7])
def test_step_optimizer_is_rmsprop_step_number_for_number(kwargs, load_at):
    # the flat path leaves the weights and the state exactly as RMSprop.step does, from the first
    # step (torch's, which creates the state) on, and after a loaded state (its tensors copied in)
    nets, opts = _rmsprop_pair(kwargs, steps=25, load_at=load_at)
    assert getattr(opts[1], '_slm_lab_flat', None) is not None, 'the flat path was not taken'
    for a, b in zip(nets[0].parameters(), nets[1].parameters()):
        assert torch.equal(a, b)
    state_a, state_b = opts[0].state_dict()['state'], opts[1].state_dict()['state']
    for k in state_a:
        for key in ('step', 'square_avg'):
            assert torch.equal(state_a[k][key], state_b[k][key])


def test_flat_rmsprop_params_are_views_of_one_buffer_and_autograd_sees_their_updates():
    from slm_lab.agent.net.optim_steps import step_optimizer
    nets, opts = _rmsprop_pair({'lr': 1e-3}, steps=3)
    net, opt = nets[1], opts[1]
    flat_p = opt._slm_lab_flat.param
    assert all(p.untyped_storage().data_ptr() == flat_p.untyped_storage().data_ptr() for p in net.parameters())
    # a graph built before the step and used after it: torch's in-place check must still fire
    loss = net(torch.randn(8, 5)).pow(2).mean()
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    step_optimizer(opt)
    with pytest.raises(RuntimeError, match='modified by an inplace operation'):
        loss.backward()


@pytest.mark.parametrize('cls,kwargs', [
    (torch.optim.RMSprop, {'lr': 1e-3, 'momentum': 0.9}),
    (torch.optim.RMSprop, {'lr': 1e-3, 'centered': True}),
    (GlobalRMSprop, {'lr': 1e-3}),  # its state is shared between processes: stays where it is
])
def test_flat_rmsprop_leaves_other_rmsprops_to_torch(cls, kwargs):
    from slm_lab.agent.net.optim_steps import step_optimizer
    nets = [_odd_net(), _odd_net()]
    opts = [cls(n.parameters(), **kwargs) for n in nets]
    for x in [torch.randn(16, 5) for _ in range(4)]:
        for i, (net, opt) in enumerate(zip(nets, opts)):
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            (opt.step() if i == 0 else step_optimizer(opt))
    assert getattr(opts[1], '_slm_lab_flat', None) is None
    for a, b in zip(nets[0].parameters(), nets[1].parameters()):
        assert torch.equal(a, b)


def test_a_run_with_the_flat_rmsprop_step_is_the_run_with_torchs_step(tmp_path, no_png, monkeypatch):
    # through the whole lab (the nets' products read the parameters from the flat buffer): the
    # A2C zoo spec's nets and optimizer, the same records and weights as torch's own step gives
    from lab_helpers import final_weights, run_dirs, train_csv
    from slm_lab import lab
    from slm_lab.agent.net import optim_steps
    spec = json.loads((ROOT / 'spec' / 'benchmark' / 'a2c' / 'a2c_cartpole_zoo.json').read_text())
    runs = []
    for flat in (True, False):
        if not flat:
            monkeypatch.setattr(optim_steps, '_plain_rmsprop', lambda opt: False)
        data = tmp_path / str(flat)
        lab.run(str(ROOT / 'spec' / 'benchmark' / 'a2c' / 'a2c_cartpole_zoo.json'), 'a2c_cartpole_zoo', 'train',
                ['env.max_frame=4000', 'meta.log_frequency=1000', 'meta.random_seed=3'], data_dir=str(data))
        (run,) = run_dirs(data, 'a2c_cartpole_zoo')
        runs.append(run)
    assert spec['a2c_cartpole_zoo']['agent']['net']['optim_spec']['name'] == 'RMSprop'
    cols = ['frame', 'loss', 'grad_norm', 'total_reward_ma', 'entropy']
    pd.testing.assert_frame_equal(train_csv(runs[0], 'a2c_cartpole_zoo')[cols],
                                  train_csv(runs[1], 'a2c_cartpole_zoo')[cols], check_exact=True)
    a, b = (final_weights(run, 'a2c_cartpole_zoo') for run in runs)
    assert a.keys() == b.keys()
    for net in a:
        assert a[net].keys() == b[net].keys() and all(torch.equal(a[net][k], b[net][k]) for k in a[net])


def test_fused_adams_flat_step_counts_survive_a_state_dict_round_trip_and_a_partial_step():
    # step_optimizer counts every parameter's step with one add on a flat buffer whose elements
    # the states' 'step' tensors view; a loaded state_dict (copies) is re-flattened from its counts,
    # and a step where a parameter has no gradient counts the others only, as Adam.step does
    import copy
    from slm_lab.agent.net.optim_steps import step_optimizer
    nets = [_two_nets(), _two_nets()]
    opts = [torch.optim.Adam(n.parameters(), lr=1e-2, fused=True) for n in nets]
    torch.manual_seed(1)
    for t, x in enumerate(torch.randn(8, 32, 4)):
        if t == 4:  # the lab's side resumes from a copy of its state (what a snapshot reloads)
            state = copy.deepcopy(opts[1].state_dict())
            opts[1] = torch.optim.Adam(nets[1].parameters(), lr=1e-2, fused=True)
            opts[1].load_state_dict(state)
        for i, (net, opt) in enumerate(zip(nets, opts)):
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            if t == 6:  # the first layer's bias without a gradient this step
                net[0].bias.grad = None
            (opt.step() if i == 0 else step_optimizer(opt))
    for a, b in zip(nets[0].parameters(), nets[1].parameters()):
        assert torch.equal(a, b)
    state_a, state_b = opts[0].state_dict()['state'], opts[1].state_dict()['state']
    assert [float(state_b[k]['step']) for k in sorted(state_b)] == [8.0, 7.0, 8.0, 8.0]
    for k in state_a:
        for key in ('step', 'exp_avg', 'exp_avg_sq'):
            assert torch.equal(state_a[k][key], state_b[k][key])
