"""net.linear_kernel "onednn": the same layer maths as nn.Linear (forward and every gradient,
to rounding), the same parameters and state_dict, only wide layers switched, deterministic, and a
seeded off-policy run that resumes exactly on it."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from lab_helpers import check_resume_after_max_frame, resume_spec

from slm_lab.agent.net import build_net
from slm_lab.agent.net.onednn_linear import MIN_WIDTH, OneDNNLinear, use_linear_kernel
from slm_lab.lib.errors import SpecError
from slm_lab.spec import validate_spec
from test_td3 import td3_spec

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason='torch without oneDNN')


def mlp_spec(kernel: str) -> dict:
    return {'type': 'MLPNet', 'hid_layers': [256, 64], 'hid_layers_activation': 'relu', 'out_layer_activation': None,
            'init_fn': None, 'batch_norm': False, 'layer_norm': False, 'linear_kernel': kernel}


def test_onednn_layers_compute_what_nn_linear_computes_forward_and_backward():
    torch.manual_seed(0)
    plain = build_net(mlp_spec('default'), 8, 3)
    fast = use_linear_kernel(copy.deepcopy(plain), 'onednn')
    assert list(fast.state_dict()) == list(plain.state_dict())
    x = torch.randn(128, 8, requires_grad=True)
    x_fast = x.detach().clone().requires_grad_(True)
    y, y_fast = plain(x), fast(x_fast)
    torch.testing.assert_close(y_fast, y, rtol=1e-5, atol=1e-5)
    (y ** 2).sum().backward()
    (y_fast ** 2).sum().backward()
    torch.testing.assert_close(x_fast.grad, x.grad, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(plain.named_parameters(), fast.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-4, msg=name)


def test_only_layers_wide_on_both_sides_switch_and_keep_their_parameters():
    net = build_net(mlp_spec('default'), 4, 2)
    params = list(net.parameters())
    use_linear_kernel(net, 'onednn')
    kinds = [(m.in_features, m.out_features, type(m)) for m in net.modules() if isinstance(m, nn.Linear)]
    # 4 -> 256 (input layer) and 64 -> 2 (head) stay nn.Linear; 256 -> 64 is wide enough
    assert kinds == [(4, 256, nn.Linear), (256, 64, OneDNNLinear), (64, 2, nn.Linear)]
    assert MIN_WIDTH <= 64
    assert all(a is b for a, b in zip(net.parameters(), params))


def test_onednn_results_are_the_same_every_time():
    torch.manual_seed(1)
    layer = use_linear_kernel(nn.Sequential(nn.Linear(300, 400)), 'onednn')[0]
    x = torch.randn(256, 300)
    outs = []
    for _ in range(2):
        layer.zero_grad(set_to_none=True)
        y = layer(x)
        y.square().sum().backward()
        outs.append((y.detach(), layer.weight.grad.clone(), layer.bias.grad.clone()))
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_no_grad_and_other_inputs_fall_back_to_the_same_maths():
    torch.manual_seed(2)
    layer = use_linear_kernel(nn.Sequential(nn.Linear(64, 64)), 'onednn')[0]
    x = torch.randn(5, 64)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), nn.functional.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    x3 = torch.randn(2, 5, 64)  # not 2-D: torch's own linear
    assert torch.equal(layer(x3), nn.functional.linear(x3, layer.weight, layer.bias))


def test_an_unknown_kernel_is_refused_by_name():
    spec = resume_spec(td3_spec)
    spec['agent']['net']['linear_kernel'] = 'blas'
    with pytest.raises(SpecError, match='agent.net.linear_kernel'):
        validate_spec(spec)


def test_a_torch_without_the_onednn_op_trains_on_the_default_kernel_with_one_warning(monkeypatch):
    from conftest import LabWarnings

    from slm_lab.agent.net import onednn_linear
    from slm_lab.lib import logger as lab_logger
    monkeypatch.setattr(onednn_linear, '_LINEAR', None)
    lab_logger.warn_once.cache_clear()
    with LabWarnings() as warned:
        net = build_net(mlp_spec('onednn'), (8,), 2)
    assert not any(isinstance(m, OneDNNLinear) for m in net.modules())
    assert [line for line in warned.lines if 'default kernel' in line and 'linear_kernel' in line]
    x = torch.randn(4, 8)
    net(x).sum().backward()  # trains as nn.Linear does


def test_td3_on_onednn_resumes_exactly_after_max_frame(tmp_path):
    spec = resume_spec(td3_spec, policy_delay=2)
    spec['agent']['net'].update(linear_kernel='onednn', hid_layers=[64, 64])
    check_resume_after_max_frame(tmp_path, 'td3_onednn', spec)


@pytest.mark.parametrize('pays, widths, given, settled', [
    (True, [256, 256], None, 'onednn'),  # the default on an AMD CPU with AVX-512, a wide net
    (True, [400, 300], 'auto', 'onednn'),
    (True, [256, 64], None, 'default'),  # a layer under 128 wide: oneDNN measured slower there
    (True, [256, 256], 'default', 'default'),  # what the spec says stays
    (False, [256, 256], None, 'default'),  # an Intel CPU (MKL takes AVX-512 itself), no AVX-512, no op
    (False, [64, 64], 'onednn', 'onednn'),
])
def test_auto_settles_at_validation_and_the_saved_spec_holds_the_kernel(monkeypatch, pays, widths, given, settled):
    from slm_lab.agent.net import onednn_linear
    monkeypatch.setattr(onednn_linear, 'onednn_pays', lambda: pays)
    spec = resume_spec(td3_spec)
    spec['agent']['net']['hid_layers'] = widths
    spec['agent']['net'].pop('linear_kernel', None)
    if given is not None:
        spec['agent']['net']['linear_kernel'] = given
    saved = validate_spec(spec)
    assert saved['agent']['net']['linear_kernel'] == settled
    monkeypatch.setattr(onednn_linear, 'onednn_pays', lambda: not pays)  # another machine validates it again
    assert validate_spec(copy.deepcopy(saved))['agent']['net']['linear_kernel'] == settled


@pytest.mark.parametrize('pays, body, settled', [
    (True, [{'LazyLinear': {'out_features': 256}}, {'ReLU': None}, {'LazyLinear': {'out_features': 256}}], 'onednn'),
    (True, [{'LazyLinear': {'out_features': 256}}, {'LazyLinear': {'out_features': 64}}], 'default'),  # one narrow
    (True, [{'Linear': {'in_features': 3, 'out_features': 256}}, {'Tanh': None}], 'onednn'),
    (True, [{'LazyLinear': [256]}], 'default'),  # widths not named: the default kernel
    (True, [{'ReLU': None}], 'default'),  # no linear layer
    (True, [{'Sequential': [{'LazyLinear': {'out_features': 256}}]}, {'LazyLinear': {'out_features': 128}}],
     'onednn'),  # nested
    (False, [{'LazyLinear': {'out_features': 256}}], 'default'),
])
def test_auto_settles_a_torcharc_net_by_the_widths_of_its_arcs_linear_layers(monkeypatch, pays, body, settled):
    """SLM-Lab v5's TorchArcNet specs (CrossQ's critics) name their layers in an arc, not in
    hid_layers: "auto" reads the Linear / LazyLinear out_features there."""
    from slm_lab.agent.net import onednn_linear
    monkeypatch.setattr(onednn_linear, 'onednn_pays', lambda: pays)
    net = {'type': 'TorchArcNet', 'arc': {'modules': {'body': {'Sequential': body}},
                                          'graph': {'input': 'x', 'modules': {'body': ['x']}, 'output': 'body'}}}
    assert onednn_linear.resolve_linear_kernel({**net, 'linear_kernel': 'auto'}) == settled
    assert onednn_linear.resolve_linear_kernel({**net, 'linear_kernel': 'default'}) == 'default'


def test_auto_reads_an_arc_file_as_the_net_will(monkeypatch, tmp_path):
    """A TorchArcNet critic given as arc_file (SLM-Lab's YAML arcs) settles "auto" by the file's
    Linear widths when the spec is validated, and the saved spec holds the choice."""
    import json
    from pathlib import Path

    from slm_lab.agent.net import onednn_linear
    from slm_lab.spec import load_raw_spec
    monkeypatch.setattr(onednn_linear, 'onednn_pays', lambda: True)
    monkeypatch.chdir(tmp_path)
    root = Path(__file__).resolve().parents[2]
    spec = load_raw_spec(str(root / 'spec/benchmark/crossq/crossq_slm_lab_v5.json'), 'crossq_pendulum', [])
    critic = spec['agent']['critic_net']
    Path('critic_arc.json').write_text(json.dumps(critic.pop('arc')))
    critic['arc_file'] = 'critic_arc.json'
    assert validate_spec(copy.deepcopy(spec))['agent']['critic_net']['linear_kernel'] == 'onednn'
    narrow = json.loads(Path('critic_arc.json').read_text().replace('256', '64'))
    Path('critic_arc.json').write_text(json.dumps(narrow))
    assert validate_spec(copy.deepcopy(spec))['agent']['critic_net']['linear_kernel'] == 'default'


def test_a_module_named_like_a_class_is_read_by_its_class():
    from slm_lab.agent.net.onednn_linear import arc_linear_widths
    arc = {'modules': {'Linear': {'LazyLinear': {'out_features': 256}}, 'head': {'Tanh': None}}}
    assert arc_linear_widths(arc) == [256]
    assert arc_linear_widths({'modules': {'body': {'Linear': [4, 256]}}}) is None  # positional arguments
    assert arc_linear_widths({'modules': 'not an arc'}) is None


def test_a_run_saved_before_the_key_resumes_on_the_default_kernel(monkeypatch):
    """A saved spec without linear_kernel ran on torch's kernel: resumed where "auto" would pick
    oneDNN, it keeps the default (edits.fill_keys_added_later)."""
    from slm_lab.agent.net import onednn_linear
    from slm_lab.persistence.edits import fill_keys_added_later
    monkeypatch.setattr(onednn_linear, 'onednn_pays', lambda: True)
    spec = validate_spec(resume_spec(td3_spec))
    spec['agent']['net']['hid_layers'] = [256, 256]
    del spec['agent']['net']['linear_kernel']
    assert validate_spec(copy.deepcopy(spec))['agent']['net']['linear_kernel'] == 'onednn'  # a new run's
    assert validate_spec(fill_keys_added_later(spec))['agent']['net']['linear_kernel'] == 'default'


def test_onednn_pays_on_an_amd_cpu_with_avx512_only(monkeypatch, tmp_path):
    from slm_lab.agent.net import onednn_linear
    for text, pays in (('vendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 avx512f avx512_bf16\n', True),
                       ('vendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 fma\n', False),
                       ('vendor_id\t: GenuineIntel\nflags\t\t: fpu avx2 avx512f amx_bf16\n', False)):
        (tmp_path / 'cpuinfo').write_text(text)
        monkeypatch.setattr(onednn_linear, 'Path', lambda _: tmp_path / 'cpuinfo')
        onednn_linear.onednn_pays.cache_clear()
        assert onednn_linear.onednn_pays() is pays
    onednn_linear.onednn_pays.cache_clear()


def test_a_product_over_fewer_rows_than_onednn_min_rows_takes_the_default_kernel(monkeypatch):
    """Acting in one env (a few rows) takes MKL's product, a training batch oneDNN's: a rule of the
    input's shape alone. A net built from a spec without the key (saved before it) puts every
    product on oneDNN, and resuming such a run fills 1."""
    from slm_lab.agent.net import onednn_linear
    from slm_lab.persistence.edits import fill_keys_added_later
    calls = []
    real = onednn_linear._LINEAR
    monkeypatch.setattr(onednn_linear, '_LINEAR', lambda *a: calls.append(a[0].shape[0]) or real(*a))
    spec = {**mlp_spec('onednn'), 'hid_layers': [256, 256], 'onednn_min_rows': 16}
    net = build_net(spec, 64, 2)
    layers = [m for m in net.modules() if isinstance(m, OneDNNLinear)]
    assert layers and all(m.min_rows == 16 for m in layers)
    plain = copy.deepcopy(net)
    for m in plain.modules():
        if isinstance(m, OneDNNLinear):
            m.__class__ = nn.Linear
    x = torch.randn(1, 64)
    with torch.no_grad():
        assert torch.equal(net(x), plain(x))  # batch 1: the default kernel's very numbers
        assert calls == []
        net(torch.randn(16, 64))
    assert calls and set(calls) == {16}
    old = {k: v for k, v in spec.items() if k != 'onednn_min_rows'}
    assert all(m.min_rows == 1 for m in build_net(old, 64, 2).modules() if isinstance(m, OneDNNLinear))
    saved = validate_spec(resume_spec(td3_spec))
    saved['agent']['net'].update(linear_kernel='onednn', hid_layers=[256, 256])
    del saved['agent']['net']['onednn_min_rows']
    assert fill_keys_added_later(saved)['agent']['net']['onednn_min_rows'] == 1
    assert validate_spec(resume_spec(td3_spec))['agent']['net']['onednn_min_rows'] == 16  # a new run's


def test_a_product_of_fewer_multiply_adds_than_onednn_min_macs_takes_the_default_kernel(monkeypatch):
    """A small batch through a narrow layer takes MKL's product (faster there), a large one
    oneDNN's, layer by layer; a spec saved before the key (a run on oneDNN) resumes with 0."""
    from slm_lab.agent.net import onednn_linear
    from slm_lab.persistence.edits import fill_keys_added_later
    calls = []
    real = onednn_linear._LINEAR
    monkeypatch.setattr(onednn_linear, '_LINEAR', lambda *a: calls.append(tuple(a[1].shape)) or real(*a))
    spec = validate_spec(resume_spec(td3_spec))['agent']['net']
    spec.update(linear_kernel='onednn', hid_layers=[256, 128])
    assert spec['onednn_min_macs'] == onednn_linear.ONEDNN_MIN_MACS  # a new run's default
    net = build_net(spec, 32, 4)
    assert {m.min_macs for m in net.modules() if isinstance(m, OneDNNLinear)} == {onednn_linear.ONEDNN_MIN_MACS}
    plain = copy.deepcopy(net)
    for m in plain.modules():
        if isinstance(m, OneDNNLinear):
            m.__class__ = nn.Linear
    x = torch.randn(32, 32)  # 32 x 32 x 256 and 32 x 256 x 128 multiply-adds: both under 4M
    with torch.no_grad():
        assert torch.equal(net(x), plain(x)) and calls == []
        net(torch.randn(128, 32))  # 128 x 256 x 128 = 4.2M: oneDNN; 128 x 32 x 256 = 1M: not
    assert calls == [(128, 256)]
    saved = validate_spec(resume_spec(td3_spec))
    saved['agent']['net'].update(linear_kernel='onednn', hid_layers=[256, 256])
    del saved['agent']['net']['onednn_min_macs']
    assert fill_keys_added_later(saved)['agent']['net']['onednn_min_macs'] == 0


def test_a_run_keeps_its_settled_kernel_when_resumed_on_a_machine_that_settles_auto_otherwise(monkeypatch, tmp_path):
    """Started where "auto" is oneDNN (a wide net on an AMD CPU), continued where it is not, with
    the spec file saying nothing or "auto": the continuation keeps oneDNN and is no edit; a
    kernel the user names is theirs (an edit, refused without --force)."""
    import json

    from slm_lab.agent.net import onednn_linear
    from slm_lab.lib.errors import ResumeError
    from slm_lab.persistence.edits import check_edits, continuation_spec
    from slm_lab.spec import load_spec
    raw = resume_spec(td3_spec)
    raw['agent']['net']['hid_layers'] = [256, 256]
    raw['agent']['net'].pop('linear_kernel', None)
    spec_file = tmp_path / 'spec.json'
    spec_file.write_text(json.dumps({'td3_wide': raw}))
    monkeypatch.setattr(onednn_linear, 'onednn_pays', lambda: True)
    old = load_spec(str(spec_file), 'td3_wide')
    old['meta']['experiment_ts'] = '2026_01_01_000000'
    assert old['agent']['net']['linear_kernel'] == 'onednn'
    monkeypatch.setattr(onednn_linear, 'onednn_pays', lambda: False)  # another machine
    for overrides in ([], ['agent.net.linear_kernel=auto']):
        spec, filled = continuation_spec(str(spec_file), 'td3_wide', overrides, copy.deepcopy(old), 'train@latest')
        assert spec['agent']['net']['linear_kernel'] == 'onednn', overrides
        check_edits(filled, spec, force=False)  # no edit
    spec, filled = continuation_spec(str(spec_file), 'td3_wide', ['agent.net.linear_kernel=default'],
                                     copy.deepcopy(old), 'train@latest')
    with pytest.raises(ResumeError, match='linear_kernel'):
        check_edits(filled, spec, force=False)


def test_a_search_over_hid_layers_settles_auto_per_trial_for_the_layers_it_draws(monkeypatch, tmp_path):
    """A search spec leaves linear_kernel "auto" to its trials: each trial settles it for the
    hid_layers it drew (oneDNN for the wide draw, the default for the narrow one), not for the
    spec's own layers; a resumed search keeps "auto" (no edit), and one started before this keeps
    the kernel its saved spec settled."""
    import json

    from slm_lab.agent.net import onednn_linear
    from slm_lab.experiment.search.specs import trial_spec
    from slm_lab.persistence.edits import continuation_spec
    from slm_lab.spec import diff_specs, load_run_spec
    monkeypatch.setattr(onednn_linear, 'onednn_pays', lambda: True)  # an AMD CPU with AVX-512
    raw = resume_spec(td3_spec)
    raw['agent']['net']['hid_layers'] = [256, 256]
    raw['agent']['net'].pop('linear_kernel', None)
    raw['search'] = {'agent.net.hid_layers__grid_search': [[64, 64], [256, 256]]}
    spec_file = tmp_path / 'spec.json'
    spec_file.write_text(json.dumps({'td3_search': raw}))
    search = load_run_spec(str(spec_file), 'td3_search', 'search', [])
    assert search['agent']['net']['linear_kernel'] == 'auto'
    kernels = {tuple(w): trial_spec(search, {'agent.net.hid_layers': w}, i)['agent']['net']['linear_kernel']
               for i, w in enumerate([[64, 64], [256, 256]])}
    assert kernels == {(64, 64): 'default', (256, 256): 'onednn'}
    assert load_run_spec(str(spec_file), 'td3_search', 'train', [])['agent']['net']['linear_kernel'] == 'onednn'
    search['meta']['experiment_ts'] = '2026_01_01_000000'
    spec, filled = continuation_spec(str(spec_file), 'td3_search', [], copy.deepcopy(search), 'search@latest')
    assert spec['agent']['net']['linear_kernel'] == 'auto'
    assert not [d for d in diff_specs(filled, spec) if 'linear_kernel' in d[0]]
    old = copy.deepcopy(search)
    old['agent']['net']['linear_kernel'] = 'onednn'  # saved by a search before this change
    spec, _ = continuation_spec(str(spec_file), 'td3_search', [], old, 'search@latest')
    assert trial_spec(spec, {'agent.net.hid_layers': [64, 64]}, 0)['agent']['net']['linear_kernel'] == 'onednn'
