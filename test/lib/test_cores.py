"""The cores a search, a benchmark and a trial's session pool use: the process's affinity set."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from slm_lab.experiment.search.driver import trial_resources
from slm_lab.lib.cores import usable_cores
from slm_lab.resources import session_pool_width


@pytest.mark.skipif(not hasattr(os, 'sched_getaffinity'), reason='affinity is Linux-only')
def test_a_process_pinned_to_one_core_counts_one():
    code = 'from slm_lab.lib.cores import usable_cores; print(usable_cores())'
    pinned = subprocess.run(['taskset', '-c', '0', sys.executable, '-c', code], capture_output=True, text=True,
                            check=True)
    assert pinned.stdout.strip() == '1'
    assert usable_cores() == len(os.sched_getaffinity(0)) == session_pool_width()


def test_a_trial_asking_for_more_cores_than_the_pinned_set_gets_the_set(monkeypatch):
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: {1}, raising=False)
    assert trial_resources({'search_resources': {'cpu': 2}}, local=True)['cpu'] == 1
    assert trial_resources({'search_resources': {'cpu': 2}}, local=False)['cpu'] == 2
