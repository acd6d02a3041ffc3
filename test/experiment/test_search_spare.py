"""The first trial's process a search's driver starts before Ray (processes.DriverSpare): one claim
gets it, the claimer sees its exit status as a Popen would, and the driver's close stops one that
no trial took and leaves no pipe behind. (A whole search using it: test_search_watch.py.)"""
from __future__ import annotations

import json
import os
import signal

import pytest

from slm_lab.experiment.search.processes import AdoptedProcess, DriverSpare, stop_process


@pytest.fixture
def spare(tmp_path, monkeypatch):
    monkeypatch.delenv(DriverSpare.SPARE_VAR, raising=False)
    spare = DriverSpare.start(tmp_path / 'spare')
    yield spare
    spare.close()


def test_one_claim_adopts_the_process_and_reads_its_exit_status(spare, tmp_path):
    assert os.environ[DriverSpare.SPARE_VAR] == str(spare.fifo)
    # a trial whose run directory does not exist: the process takes the line and fails on it
    line = (json.dumps([str(tmp_path / 'no_such_run'), 'x', 0]) + '\n').encode()
    proc = DriverSpare.claim(line)
    assert isinstance(proc, AdoptedProcess) and proc.pid == spare.proc.pid
    assert DriverSpare.claim(line) is None  # the pipe is taken: a second trainable starts its own
    code = proc.wait(timeout=120)
    assert code == spare.proc.returncode and code not in (0, None)
    assert proc.poll() == code
    stop_process(proc)  # an ended process: nothing to stop, no error


def test_an_unclaimed_spare_is_stopped_and_its_folder_removed(spare):
    folder = spare.fifo.parent
    assert spare.proc.poll() is None  # waiting for a line
    spare.close()
    assert spare.proc.returncode == -signal.SIGKILL
    assert not folder.exists() and DriverSpare.SPARE_VAR not in os.environ
    assert DriverSpare.claim(b'["a", "b", 0]\n') is None  # nothing to claim any more


def test_a_claimed_process_still_running_at_close_gets_sigterm(spare, tmp_path):
    """close() stops a claimed trial that its trainable did not stop, as stop_process does: SIGTERM
    (a trial saves its snapshots on it), here while it still waits for its imports or line."""
    fifo = spare.fifo
    os.rename(fifo, fifo.with_name('claimed.fifo'))  # claimed, its line never written
    spare.close()
    assert spare.proc.returncode in (-signal.SIGTERM, 143)
    assert not fifo.parent.exists()
