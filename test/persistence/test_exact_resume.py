"""Exact resume for every registered algorithm: stopped at max_frame and resumed to a larger one,
a run equals the run that never stopped (train and eval rows cell for cell, final weights bit for
bit). test/fixtures/exact_resume.json is a spec file with one small spec per algorithm; a new
algorithm is not registered without one (the coverage test). Variants (PER, normalisation,
recurrent and conv nets, SIGTERM stops) are tested beside their components. Where it matters the
stop falls at an awkward point: TD3's, SAC's and CrossQ's 126 critic steps before it are not a
multiple of policy_delay 4 (a resume that lost the count would step the policy at other times),
and CrossQ stops mid-warmup of its batch renormalisation."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from lab_helpers import check_resume_after_max_frame

from slm_lab.agent.algorithm import ALGORITHMS

SPECS = json.loads((Path(__file__).resolve().parents[1] / 'fixtures' / 'exact_resume.json').read_text())


def test_every_registered_algorithm_has_an_exact_resume_spec():
    covered = sorted(spec['agent']['algorithm']['name'] for spec in SPECS.values())
    assert covered == sorted(ALGORITHMS), 'add a spec for the algorithm to test/fixtures/exact_resume.json'


@pytest.mark.slow
@pytest.mark.parametrize('spec_name', sorted(SPECS))
def test_a_run_resumed_after_max_frame_is_the_run_that_never_stopped(tmp_path, spec_name):
    check_resume_after_max_frame(tmp_path, spec_name, SPECS[spec_name])
