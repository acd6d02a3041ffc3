"""meta.flush_denormal: a new run's sessions flush float denormals to zero on the CPU (Adam's
moments of dead units decay into them, and arithmetic on them is up to 8x slower); a run saved
before the key resumes with IEEE denormals, as it ran, and a resume cannot switch it silently."""
from __future__ import annotations

import copy

import pytest
import torch
from lab_helpers import DQN, drop_saved_key, saved_values, spec_file_in, train_one

from slm_lab.experiment.enjoy import enjoy
from slm_lab.experiment.session import Session
from slm_lab.experiment.trial import Trial
from slm_lab.lib.errors import ResumeError
from slm_lab.persistence.run_dir import RunDir
from slm_lab.spec import validate_spec

NAME = 'denormal'
DENORMAL = 1e-39  # below float32's smallest normal number, 1.18e-38


def flushed() -> bool:
    """Whether this thread's CPU arithmetic flushes denormals (a denormal input counts as 0)."""
    return float(torch.tensor([DENORMAL]) * 1.0) == 0.0


def small_dqn() -> dict:
    spec = copy.deepcopy(DQN)
    spec['env']['max_frame'] = 300
    spec['meta'].update(log_frequency=100, eval_frequency=300)
    return spec


@pytest.fixture
def ieee_after():
    yield
    torch.set_flush_denormal(False)  # the rest of this test process computes as before


@pytest.mark.parametrize('value', [True, False])
def test_a_session_computes_as_its_spec_says(tmp_path, value, ieee_after):
    raw = small_dqn()
    if value is False:
        raw['meta']['flush_denormal'] = False
    spec = validate_spec(raw)
    assert spec['meta']['flush_denormal'] is value  # true by default
    torch.set_flush_denormal(not value)
    run_dir = RunDir(tmp_path, NAME)
    run_dir.create()
    session = Session(Trial(spec, run_dir, 'train').session_spec(0), run_dir, 'train', 0, 0)
    try:
        assert flushed() is value
    finally:
        session.close()


def test_a_run_saved_before_the_key_resumes_with_denormals(tmp_path, ieee_after):
    spec_file = spec_file_in(tmp_path / 'spec', NAME, small_dqn())
    run = train_one(spec_file, NAME, 'train', [], tmp_path / 'data')
    assert set(saved_values(run, NAME, 'meta.flush_denormal')) == {True}
    torch.set_flush_denormal(False)
    enjoy(str(run / f'{NAME}_t0_s0_spec.json'), episodes=1)  # a replay computes as the run trained
    assert flushed() is True
    drop_saved_key(run, NAME, 'meta.flush_denormal')  # as a lab before the key saved it
    resumed = train_one(spec_file, NAME, f'train@{run}', ['env.max_frame=600'], tmp_path / 'data')
    assert resumed == run
    assert flushed() is False  # the resumed session's thread: IEEE arithmetic, as the run began
    assert set(saved_values(run, NAME, 'meta.flush_denormal')) == {False}
    torch.set_flush_denormal(True)
    enjoy(str(run / f'{NAME}_t0_s0_spec.json'), episodes=1)
    assert flushed() is False
    with pytest.raises(ResumeError, match=r'meta\.flush_denormal: False -> True'):
        train_one(spec_file, NAME, f'train@{run}', ['env.max_frame=900', 'meta.flush_denormal=true'],
                  tmp_path / 'data')
