"""enjoy@ refuses, in one line naming the file and the fix, every input it cannot replay: a session
spec that does not describe the saved weights, damaged or missing weights, a directory. It never
changes the run it reads."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import build_spec, flip_weight_bytes, write_spec_file
from slm_lab import lab
from slm_lab.persistence import snapshot as checkpoint
from slm_lab.experiment import viz
from slm_lab.experiment.enjoy import enjoy
from slm_lab.lib.errors import LabError, ResumeError, SpecError


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """{'dqn': run dir, 'ppo': run dir}: tiny finished runs (two snapshots each), trained once;
    tests copy them before changing anything."""
    root = tmp_path_factory.mktemp('trained')
    runs = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(viz, 'png_available', lambda: False)
        for name, algorithm in (('dqn', 'DQN'), ('ppo', 'PPO')):
            spec_file = write_spec_file(root / f'{name}.json', {name: build_spec(algorithm, max_frame=256)})
            lab.run(spec_file, name, 'train', data_dir=str(root / 'data'))
            (runs[name],) = (root / 'data').glob(f'{name}_*')
    return runs


@pytest.fixture
def run_copy(trained, tmp_path):
    """run_copy(name) -> a copy of that trained run in tmp_path (its session spec: run/{name}_t0_s0_spec.json)."""
    def copy(name: str) -> Path:
        return Path(shutil.copytree(trained[name], tmp_path / 'data' / trained[name].name))
    return copy


def digest(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(root.rglob('*'))
            if p.is_file()}


def refusal(error_type: type[LabError], session_spec: Path, **kwargs) -> str:
    """enjoy's error message, checked to be of `error_type`, one line, and to leave the run as it was."""
    before = digest(session_spec.parent)
    with pytest.raises(error_type) as info:
        enjoy(str(session_spec), episodes=1, **kwargs)
    message = str(info.value)
    assert '\n' not in message, message
    assert digest(session_spec.parent) == before, 'enjoy@ must not change the run'
    return message


def test_an_intact_run_replays(run_copy):
    run = run_copy('dqn')
    assert len(enjoy(str(run / 'dqn_t0_s0_spec.json'), episodes=2)) == 2
    assert len(enjoy(str(run / 'dqn_t0_s0_spec.json'), episodes=1, ckpt='latest')) == 1


@pytest.mark.parametrize('ckpt', ['best', 'latest'])
def test_a_session_spec_of_another_run_is_refused(run_copy, ckpt):
    dqn, ppo = run_copy('dqn'), run_copy('ppo')
    session_spec = dqn / 'dqn_t0_s0_spec.json'
    session_spec.write_text((ppo / 'ppo_t0_s0_spec.json').read_text())  # a PPO spec beside DQN weights
    message = refusal(SpecError, session_spec, ckpt=ckpt)
    weights = 'model/dqn_t0_s0_model_best.pt' if ckpt == 'best' else 'ckpt/dqn_t0_s0/f000000000256'
    assert f'{session_spec} does not match the weights in {dqn / weights}' in message
    assert "a PPO agent has nets ['model'], the weights hold ['net', 'target_net']" in message
    assert 'the session spec the run wrote' in message


def test_an_edited_session_spec_that_no_longer_fits_is_refused(run_copy):
    run = run_copy('ppo')
    session_spec = run / 'ppo_t0_s0_spec.json'
    spec = json.loads(session_spec.read_text())
    spec['agent']['net']['hid_layers'] = [64]
    session_spec.write_text(json.dumps(spec))
    message = refusal(SpecError, session_spec)
    assert 'does not match the weights' in message and 'size mismatch' in message and '[64, 4]' in message


@pytest.mark.parametrize('damage', ['truncated', 'not torch', 'not a model', 'flipped weights', 'a directory'])
def test_a_damaged_best_model_is_refused_naming_it(run_copy, damage):
    run = run_copy('dqn')
    model = run / 'model' / 'dqn_t0_s0_model_best.pt'
    if damage == 'truncated':
        model.write_bytes(model.read_bytes()[:1000])
    elif damage == 'not torch':
        model.write_text('garbage')
    elif damage == 'not a model':
        torch.save([1, 2], model)
    elif damage == 'flipped weights':
        torch.load(model, weights_only=True)  # still loads: only the checksum tells
        flip_weight_bytes(model)
        torch.load(model, weights_only=True)
    else:
        model.unlink()
        model.mkdir()
    message = refusal(ResumeError, run / 'dqn_t0_s0_spec.json')
    assert message.startswith(f'{model} is ') and message.endswith('replay the newest snapshot with --ckpt latest')
    assert 'not found' not in message
    if damage == 'flipped weights':
        assert 'checksum' in message
    elif damage == 'a directory':
        assert 'is a directory' in message
    # and the advice works: the snapshots are intact
    assert len(enjoy(str(run / 'dqn_t0_s0_spec.json'), episodes=1, ckpt='latest')) == 1


def test_latest_skips_a_damaged_snapshot_and_refuses_when_none_is_intact(run_copy):
    run = run_copy('dqn')
    snaps = checkpoint.list_snapshots(run / 'ckpt' / 'dqn_t0_s0')
    assert [s.name for s in snaps] == ['f000000000256', 'f000000000192']
    state = snaps[0] / checkpoint.STATE_FILE
    state.write_bytes(state.read_bytes()[:-10])
    assert len(enjoy(str(run / 'dqn_t0_s0_spec.json'), episodes=1, ckpt='latest')) == 1  # replays f192
    (snaps[1] / checkpoint.STATE_FILE).write_text('x')
    message = refusal(ResumeError, run / 'dqn_t0_s0_spec.json', ckpt='latest')
    assert message == (f'{run / "ckpt" / "dqn_t0_s0"}: no intact snapshot to replay (2 damaged; newest '
                       'f000000000256: state.pt is missing or has the wrong size); replay the best weights with '
                       '--ckpt best')


def test_missing_weights_point_to_what_exists(run_copy):
    run = run_copy('dqn')
    session_spec = run / 'dqn_t0_s0_spec.json'
    shutil.rmtree(run / 'ckpt')
    assert refusal(ResumeError, session_spec, ckpt='latest').endswith(
        'no snapshot to replay; replay the best weights with --ckpt best')
    shutil.rmtree(run / 'model')
    for ckpt in ('best', 'latest'):
        assert 'session t0 s0 has no saved weights (no model/dqn_t0_s0_model_best.pt, no snapshot in ' \
               'ckpt/dqn_t0_s0/)' in refusal(ResumeError, session_spec, ckpt=ckpt)


def test_a_run_directory_is_refused_with_its_session_spec_as_the_example(run_copy):
    run = run_copy('ppo')
    with pytest.raises(SpecError, match=f'is a directory; give one of its session specs, e.g. '
                                        f'enjoy@{run / "ppo_t0_s0_spec.json"}$'):
        enjoy(str(run))


def test_a_session_spec_that_is_not_a_spec_names_the_file(run_copy):
    run = run_copy('ppo')
    session_spec = run / 'ppo_t0_s0_spec.json'
    session_spec.write_text('[]')
    assert refusal(SpecError, session_spec).startswith(f'{session_spec}: ')


def test_a_snapshot_of_an_unknown_format_is_refused_not_skipped(run_copy):
    run = run_copy('ppo')
    manifest_path = checkpoint.list_snapshots(run / 'ckpt' / 'ppo_t0_s0')[0] / checkpoint.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest['format_version'] = 99
    manifest_path.write_text(json.dumps(manifest))
    assert 'unknown snapshot format version 99' in refusal(ResumeError, run / 'ppo_t0_s0_spec.json', ckpt='latest')
