"""One trial of a search, run by its Ray trainable as a child process:
python -m slm_lab.experiment.search.trial, then one line on stdin: ["RUN_DIR", "SPEC_NAME", TRIAL]
(or, started by the search's driver before Ray, `--fd N`: the line comes through that pipe)

The process imports the lab first and then waits for its trial, so a trainable can start it
ahead of time (while the trial before trains). Given its trial, it writes its output to
log/{name}_t{i}_process.log, reads the trial's spec from the run directory and runs it as train
does, continuing from the sessions' snapshots when they have some. It stops as on SIGTERM (each
session saves a snapshot) when search/stop/all or search/stop/{i} appears: the search's stop, or
ASHA's for this trial, which reach it that way on whichever node it runs. Exit codes: 0 done, 2 a
LabError (its line printed), 130/143 stopped by SIGINT/SIGTERM after saving snapshots."""
from __future__ import annotations

import time
import threading
import signal
import json
import os
import sys
from pathlib import Path

# pure Python, no more of the lab: the stop handler is in place before the lab loads (see main)
from slm_lab.lib.cores import keep_nice_in_own_session
from slm_lab.lib.errors import LabError, Preempted, catch_stops


def watch_stop_files(run_dir, index: int, interval: float = 0.2) -> None:
    """A daemon thread that sends this process the signal a stop file names (SIGINT for a search
    stopped by Ctrl-C, so the trial's log says so; else SIGTERM) once a stop file for it exists."""
    stops = [run_dir.root / 'search' / 'stop' / 'all', run_dir.root / 'search' / 'stop' / str(index)]

    def watch():
        while not (found := [p for p in stops if p.exists()]):
            time.sleep(interval)
        try:
            said = found[0].read_text()
        except OSError:
            said = ''
        # SIGINT only where this process handles it: one started with it ignored (a background job's)
        # would not stop by it
        heard = callable(signal.getsignal(signal.SIGINT))
        os.kill(os.getpid(), signal.SIGINT if said.startswith('SIGINT') and heard else signal.SIGTERM)

    threading.Thread(target=watch, daemon=True, name='stop-files').start()


def warm_up() -> None:
    """What a trial pays once per process beyond the imports, paid while this process waits for its
    trial: plotly loads its validators at the first graph. (Not torch's compiler, which torch would
    import at the first optimizer: the lab trains without it where no step hooks are set,
    agent/net/compiler_import.py.)"""
    from slm_lab.experiment import viz  # noqa: PLC0415 (plotly: after the Ray worker started this process (see main))
    viz.warm_up()


def driver_pipe(argv: list[str]) -> int | None:
    """`--fd N` (a process the search's driver starts before Ray, search/processes.DriverSpare): the descriptor
    of the pipe its line comes through, which the driver opened (read and write) and passed on."""
    if len(argv) >= 2 and argv[0] == '--fd':
        return int(argv[1])
    return None


def read_line(fd: int) -> str:
    data = b''
    while not data.endswith(b'\n'):
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    os.close(fd)
    return data.decode()


def main(pipe: int | None = None) -> int:
    # a stop (the search's stop file, or its Ray worker's SIGTERM) before the trial takes the signal
    # over ends this process at once with 143, which the trainable reads as a trial stopped with the
    # search: nothing is written until then (killed by SIGTERM meanwhile, it was an error)
    catch_stops(at_once=True)
    keep_nice_in_own_session()  # a niced search's trials stay niced (lib/cores.py), from their first import on
    # torch and the lab load after the Ray worker has started this process (see warm_up)
    from slm_lab.experiment.trial import Trial  # noqa: PLC0415 (torch: after the Ray worker started this process)
    from slm_lab.experiment.signals import die_with_parent  # noqa: PLC0415 (the lab loads only once the stop handler is in place)
    from slm_lab.persistence.run_dir import RunDir  # noqa: PLC0415 (the lab loads only once the stop handler is in place)
    from slm_lab.experiment.search.specs import read_trial_spec  # noqa: PLC0415 (the same)
    die_with_parent()  # a trial never outlives its Ray worker
    try:
        warm_up()
    except Exception:  # noqa: BLE001  (its error, if real, comes again in the trial, into the trial's log)
        pass
    line = read_line(pipe) if pipe is not None else sys.stdin.readline()
    if not line:  # started ahead for a trial that never came
        return 0
    root, spec_name, index = json.loads(line)
    run_dir = RunDir(Path(root), spec_name)
    log = os.open(run_dir.root / 'log' / f'{run_dir.prename(index)}_process.log',
                  os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    watch_stop_files(run_dir, index)
    print(f'trial {index}: process {os.getpid()}, started ahead by '
          f'{"the search driver, before Ray" if pipe is not None else "its Ray worker"}', file=sys.stderr, flush=True)
    try:
        spec = read_trial_spec(run_dir, index)
        resume = any(run_dir.ckpt_dir(index, s).exists() for s in range(spec['meta']['max_session']))
        Trial(spec, run_dir, 'train', trial=index, resume=resume).run()
    except LabError as e:
        print(f'error: {e}', file=sys.stderr)
        return e.exit_code
    except Preempted as e:
        print(f'stopped: {e}', file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == '__main__':
    code = main(driver_pipe(sys.argv[1:]))
    # the trial's files are written (each atomically) and its logs are flushed here: skip the
    # interpreter's teardown (torch's, about 0.6 s), which the search would wait for
    import logging
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
