"""The local Ray of a search, started by a process of its own in a session of its own, so that
Ray's processes (GCS, raylet, workers) are outside the process group of the search's driver. A
signal to that group (a shell's Ctrl-C, a scheduler's SIGTERM to the job) then reaches the driver
alone, which stops the trials with snapshots and then this Ray. Started by the driver itself, Ray's
processes got the group's SIGTERM too: the GCS died under the running search, whose driver then
stalled (`Failed to connect to GCS within 60 seconds`) and exited 1.

python -m slm_lab.experiment.search.ray_head TEMP_DIR NUM_CPUS PARENT_PID: starts Ray (ray.init,
its head on this machine, as the driver started it before), prints its GCS address on stdout and
holds it until the driver kills this process's group (RayHead.stop) or dies (then the kernel kills
this process, and Ray's processes with it).

A local Ray listens on loopback only. Ray turns a node address of 127.0.0.1 into the machine's
network address (services.resolve_ip_for_localhost), and its servers (GCS, raylets, workers) then
listen on every interface: a laptop's search would take connections from its network. Ray keeps a
node on loopback where multi-node clusters are off (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, read once as
Ray is imported): the head's process and Ray's processes, which inherit its environment, run so,
and the driver's side connects to it so (driver_on_loopback)."""
from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

from slm_lab.experiment.signals import die_with_parent
from slm_lab.lib.cores import keep_nice_in_own_session


LOOPBACK_VAR = 'RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER'  # '0': Ray's nodes stay on 127.0.0.1 (see above)


@contextlib.contextmanager
def driver_on_loopback() -> Iterator[None]:
    """This process, as the driver of a local Ray, on loopback: Ray in this process reads the
    setting once, as it is imported, so one imported before (a second search in a notebook, a test
    process) is set for the block and restored after it; a Ray without the setting is left as it is."""
    import ray._private.ray_constants as constants  # noqa: PLC0415 the search extra, found by check_installed
    before = getattr(constants, 'ENABLE_RAY_CLUSTER', None)
    if before is not None:
        constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if before is not None:
            constants.ENABLE_RAY_CLUSTER = before


class RayHead:
    """The driver's side: the process holding the search's local Ray, and its GCS address."""

    def __init__(self, proc: subprocess.Popen, log: Path):
        self.proc, self.log = proc, log

    @classmethod
    def start(cls, temp_dir: str, num_cpus: int, log: Path) -> 'RayHead':
        """Start it (Ray starts meanwhile, while the driver imports Ray and Tune); its stderr goes
        to `log`. It inherits the driver's environment: the search's marker (search/reaper.py), Ray's
        token, the lab on PYTHONPATH, which Ray's processes get from it; and Ray on loopback, with
        its workers at the driver's nice (Ray adds 15 by default, and the trial processes a worker
        starts would train at nice 15 where the driver's own first trial trains at the driver's)."""
        env = {'RAY_worker_niceness': '0', **os.environ, LOOPBACK_VAR: '0'}  # a niceness the user set stays
        with open(log, 'ab') as err:
            proc = subprocess.Popen([sys.executable, '-m', 'slm_lab.experiment.search.ray_head', temp_dir,
                                     str(num_cpus), str(os.getpid())], env=env,
                                    stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        return cls(proc, log)

    def address(self, stopping: Callable[[], bool]) -> str | None:
        """The GCS address once Ray is up, or None if `stopping()` turns true first (a stop signal:
        the search does not wait for Ray to finish starting)."""
        line = b''
        while not stopping():
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                line += chunk
                if line.endswith(b'\n'):
                    return line.decode().strip()
                if chunk:
                    continue
            if self.proc.poll() is not None:
                raise RuntimeError(f'the local Ray did not start (its process ended with exit code '
                                   f'{self.proc.returncode}); see {self.log}')
        return None

    def stop(self) -> None:
        """Kill Ray's head processes at once (the trials have stopped by then; what they hold is in
        the run directory). Ray's workers, in process groups of their own, end with their raylet,
        and the search's sweep (search/reaper.py) kills whatever is left."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.proc.stdout.close()


def main(temp_dir: str, num_cpus: int, parent: int) -> None:
    """Start Ray (its session files in temp_dir), print its GCS address and hold it; `parent` is the
    search's driver."""
    die_with_parent()  # the kernel kills this process when the driver dies; Ray's own die with it
    if os.getppid() != parent:  # the driver died before that was in place
        return
    keep_nice_in_own_session()  # Ray's processes, in this process's session, keep a niced search's nice
    answer = os.fdopen(os.dup(1), 'w')  # the driver reads the address alone there: Ray's output goes to the log
    os.dup2(2, 1)
    import ray  # noqa: PLC0415 the search extra, found by the driver's check_installed
    context = ray.init(num_cpus=num_cpus, _temp_dir=temp_dir, _node_ip_address='127.0.0.1', include_dashboard=False,
                       log_to_driver=False, logging_level='WARNING', configure_logging=True)
    print(context.address_info['gcs_address'], file=answer, flush=True)
    while True:
        time.sleep(3600)


if __name__ == '__main__':
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
