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


@pytest.mark.skipif(not os.path.exists('/proc/self/autogroup'), reason='autogroup scheduling is Linux-only')
@pytest.mark.parametrize('search_nice, expected', [('4', 4), (None, 0), ('0', 0)])
def test_a_session_of_a_local_search_takes_the_search_drivers_nice(search_nice, expected):
    """A process in a session of its own (as the lab's Ray head, trials and reaper run) takes the nice
    the search's driver gave in SLM_LAB_SEARCH_NICE for its session; without it (a trial on a user's
    cluster, started by that cluster's Ray at its own nice) the session is left as it is."""
    from slm_lab.lib.cores import NICE_VAR
    code = ('from slm_lab.lib.cores import keep_nice_in_own_session; import time; keep_nice_in_own_session(); '
            'time.sleep(0.3); print(open("/proc/self/autogroup").read().split()[-1])')
    env = {k: v for k, v in os.environ.items() if k != NICE_VAR}
    if search_nice is not None:
        env[NICE_VAR] = search_nice
    # nice 15 of its own (a Ray worker's), its own session (a new autogroup at nice 0)
    done = subprocess.run(['nice', '-n', '15', sys.executable, '-c', code], capture_output=True, text=True, env=env,
                          start_new_session=True, check=True)
    assert int(done.stdout.strip()) == expected, done.stderr
