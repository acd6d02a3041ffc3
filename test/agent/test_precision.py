"""net.precision "bf16": the net's forward under bfloat16 autocast with float32 outputs, its
parameters, state_dict and gradients float32, target copies alike, runs that resume exactly, and
the refusals."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from lab_helpers import PPO, check_resume_after_max_frame, resume_spec, run_dirs, train_csv, write_spec
from test_td3 import td3_spec

from slm_lab import lab
from slm_lab.agent.net import build_net
from slm_lab.agent.net.precision import while_acting
from slm_lab.lib.errors import SpecError
from slm_lab.spec import validate_spec


def mlp_spec(precision: str) -> dict:
    return {'type': 'MLPNet', 'hid_layers': [64, 64], 'hid_layers_activation': 'relu', 'out_layer_activation': None,
            'init_fn': None, 'batch_norm': False, 'layer_norm': False, 'precision': precision}


def test_a_bf16_net_computes_in_bf16_and_hands_out_float32():
    torch.manual_seed(0)
    fp32 = build_net(mlp_spec('fp32'), (8,), [3, 1])
    bf16 = build_net(mlp_spec('bf16'), (8,), [3, 1])
    bf16.load_state_dict(fp32.state_dict())  # the same keys: only forward changed
    assert list(bf16.state_dict()) == list(fp32.state_dict())
    x = torch.randn(32, 8)
    outs, refs = bf16(x), fp32(x)
    for out, ref in zip(outs, refs):
        assert out.dtype == torch.float32
        assert not torch.equal(out, ref)  # rounded to bf16 inside
        torch.testing.assert_close(out, ref, rtol=0.05, atol=0.05)
    sum(o.sum() for o in outs).backward()
    assert all(p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32
               for p in bf16.parameters())
    target = copy.deepcopy(bf16)  # a target net computes as its online net
    assert type(target) is type(bf16) and torch.equal(target(x)[0], bf16(x)[0])


def test_a_bf16_conv_net_takes_uint8_frames_forward_and_prepared():
    def conv(precision: str):
        spec = {'type': 'ConvNet', 'conv_hid_layers': [[8, 8, 4, 0, 1], [16, 4, 2, 0, 1]], 'fc_hid_layers': [32],
                'hid_layers_activation': 'relu', 'normalize': True, 'batch_norm': False, 'precision': precision}
        spec = validate_spec({'agent': {'name': 'PPO', 'algorithm': {'name': 'PPO'},
                                        'memory': {'name': 'OnPolicyBatchReplay'}, 'net': spec},
                              'env': {'name': 'CartPole-v1', 'max_frame': 100}})['agent']['net']
        return build_net(spec, (4, 84, 84), 6)
    net, fp32 = conv('bf16'), conv('fp32')
    fp32.load_state_dict(net.state_dict())
    frames = torch.from_numpy(np.random.default_rng(0).integers(0, 255, (8, 4, 84, 84), dtype=np.uint8))
    out = net(frames)
    assert out.shape == (8, 6) and out.dtype == torch.float32 and torch.isfinite(out).all()
    assert not torch.equal(out, fp32(frames))
    torch.testing.assert_close(out, fp32(frames), rtol=0.05, atol=0.05)
    # PPO's minibatches run the prepared batch (net_util.HeadedNet.forward_prepared): in bf16 too
    assert torch.equal(net.forward_prepared(net.prepare(frames)), out)


def test_a_bf16_net_acts_on_fewer_rows_than_bf16_min_rows_in_float32():
    """Acting (precision.while_acting, as Agent.act does) over fewer rows than bf16_min_rows
    computes in float32, the very numbers of the float32 net; acting on that many rows, and every
    training forward whatever its rows (an update's old policy and its minibatches in one
    precision), in bf16; a spec without the key (written before it) acts in bf16 too. A target
    copy keeps the setting."""
    torch.manual_seed(0)
    fp32 = build_net(mlp_spec('fp32'), (8,), [3])
    bf16 = build_net({**mlp_spec('bf16'), 'bf16_min_rows': 8}, (8,), [3])
    before_key = build_net(mlp_spec('bf16'), (8,), [3])
    for net in (bf16, before_key):
        net.load_state_dict(fp32.state_dict())
    few, many = torch.randn(7, 8), torch.randn(8, 8)
    assert torch.equal(while_acting(bf16, few), fp32(few))
    assert torch.equal(while_acting(copy.deepcopy(bf16), few), fp32(few))
    assert not torch.equal(while_acting(bf16, many), fp32(many))
    assert not torch.equal(bf16(few), fp32(few)) and torch.equal(bf16(few), before_key(few))  # training: bf16
    assert torch.equal(while_acting(before_key, few), bf16(few))


def test_acting_in_one_thread_leaves_another_threads_forwards_in_bf16():
    """The acting flag is per thread: while one thread's agent acts (inside while_acting), a forward
    of the same few rows in another thread, as an agent training there runs it, stays in bf16."""
    import threading
    torch.manual_seed(0)
    fp32 = build_net(mlp_spec('fp32'), (8,), [3])
    bf16 = build_net({**mlp_spec('bf16'), 'bf16_min_rows': 8}, (8,), [3])
    bf16.load_state_dict(fp32.state_dict())
    few = torch.randn(7, 8)
    acting, trained = threading.Event(), threading.Event()
    seen = {}

    def act(x):
        acting.set()
        assert trained.wait(30)
        return bf16(x)

    def train():
        assert acting.wait(30)
        seen['train'] = bf16(few)
        trained.set()

    other = threading.Thread(target=train)
    other.start()
    seen['act'] = while_acting(act, few)
    other.join(30)
    assert torch.equal(seen['act'], fp32(few))  # the acting thread: float32
    assert torch.equal(seen['train'], bf16(few)) and not torch.equal(seen['train'], fp32(few))  # the other: bf16


def test_a_bf16_net_saved_before_bf16_min_rows_resumes_with_every_forward_in_bf16():
    from slm_lab.persistence.edits import fill_keys_added_later
    saved = {'agent': {'algorithm': {'name': 'SAC'}, 'net': {**mlp_spec('bf16')}, 'critic_net': mlp_spec('fp32')},
             'env': {}, 'meta': {}}
    filled = fill_keys_added_later(saved)['agent']
    assert filled['net']['bf16_min_rows'] == 1 and 'bf16_min_rows' not in filled['critic_net']
    said = {'agent': {'net': {**mlp_spec('bf16'), 'bf16_min_rows': 8}}}
    assert fill_keys_added_later(said)['agent']['net']['bf16_min_rows'] == 8
    assert validate_spec(copy.deepcopy(PPO))['agent']['net']['bf16_min_rows'] == 8


def test_enjoy_reads_a_bf16_run_saved_before_bf16_min_rows_as_it_acted(tmp_path):
    """enjoy@ replays a run as it computed: its saved session spec filled with the keys added
    since (here bf16_min_rows 1, acting in bf16) before validation gives them today's defaults."""
    import json

    from slm_lab.experiment.enjoy import read_session_spec
    spec = copy.deepcopy(PPO)
    spec['agent']['net']['precision'] = 'bf16'
    saved = validate_spec(spec)
    assert saved['agent']['net']['bf16_min_rows'] == 8
    del saved['agent']['net']['bf16_min_rows']
    path = tmp_path / 'ppo_t0_s0_spec.json'
    path.write_text(json.dumps(saved))
    assert read_session_spec(str(path), 'ppo')['agent']['net']['bf16_min_rows'] == 1


def test_an_unknown_precision_and_bf16_with_distributed_are_refused():
    spec = copy.deepcopy(PPO)
    spec['agent']['net']['precision'] = 'fp16'
    with pytest.raises(SpecError, match='agent.net.precision'):
        validate_spec(spec)
    spec['agent']['net']['precision'] = 'bf16'
    spec['meta'].update(distributed='shared', max_session=2)
    with pytest.raises(SpecError, match='agent.net.precision.*meta.distributed'):
        validate_spec(spec)


@pytest.mark.slow
def test_ppo_in_bf16_resumes_exactly(tmp_path):
    spec = copy.deepcopy(PPO)
    spec['agent']['net']['precision'] = 'bf16'
    spec['env']['max_frame'] = 512
    spec['meta'].update(log_frequency=128, eval_frequency=256)
    check_resume_after_max_frame(tmp_path, 'ppo_bf16', spec)


@pytest.mark.slow
def test_td3_in_bf16_resumes_exactly_and_differs_from_fp32(tmp_path):
    spec = resume_spec(td3_spec)
    spec['agent']['net']['precision'] = 'bf16'
    check_resume_after_max_frame(tmp_path, 'td3_bf16', spec)
    fp32 = write_spec(tmp_path, 'td3_fp32', resume_spec(td3_spec))
    lab.run(fp32, 'td3_fp32', 'train', data_dir=str(tmp_path / 'c'))
    (bf16_run,), (fp32_run,) = run_dirs(tmp_path / 'b', 'td3_bf16'), run_dirs(tmp_path / 'c', 'td3_fp32')
    losses = [train_csv(r, n)['loss'].dropna().tolist() for r, n in ((bf16_run, 'td3_bf16'), (fp32_run, 'td3_fp32'))]
    assert losses[1] and losses[0][:len(losses[1])] != losses[1]  # bf16 is not fp32 under another name


@pytest.mark.slow
def test_a_td3_bf16_run_saved_before_bf16_min_rows_resumes_acting_in_bf16(tmp_path):
    """A bf16 run from before the key (it acted in bf16 too; here bf16_min_rows 1, then the key
    dropped from its saved specs), resumed to 2F with the user's spec (no key), equals the run of
    2F with every forward in bf16, and differs from a run with the new default (acting in float32)."""
    from lab_helpers import assert_same_run, drop_saved_key, spec_file_in, train_one
    spec = resume_spec(td3_spec)
    spec['agent']['net'].update(precision='bf16', bf16_min_rows=1)
    old_file = spec_file_in(tmp_path / 'old_spec', 'td3_bf16', spec)
    old = train_one(old_file, 'td3_bf16', 'train', [], tmp_path / 'old')
    drop_saved_key(old, 'td3_bf16', 'agent.net.bf16_min_rows')
    end = f"env.max_frame={2 * spec['env']['max_frame']}"
    straight = train_one(old_file, 'td3_bf16', 'train', [end], tmp_path / 'straight')
    del spec['agent']['net']['bf16_min_rows']
    users_file = spec_file_in(tmp_path, 'td3_bf16', spec)
    assert train_one(users_file, 'td3_bf16', 'train@latest', [end], tmp_path / 'old') == old
    assert_same_run(old, straight, 'td3_bf16')
    new = train_one(users_file, 'td3_bf16', 'train', [end], tmp_path / 'new')
    assert train_csv(new, 'td3_bf16')['loss'].tolist() != train_csv(straight, 'td3_bf16')['loss'].tolist()
