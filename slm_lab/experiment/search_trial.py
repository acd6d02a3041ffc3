"""One trial of a search, run by its Ray trainable as a child process:
python -m slm_lab.experiment.search_trial RUN_DIR SPEC_NAME TRIAL

It reads the trial's spec from the run directory and runs it as train does, continuing from the
sessions' snapshots when they have some. Exit codes: 0 done, 2 a LabError (its line printed),
130/143 stopped by SIGINT/SIGTERM after saving snapshots."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from slm_lab.experiment.control import Trial, _die_with_parent
    from slm_lab.experiment.run_dir import RunDir
    from slm_lab.lib.errors import LabError, Preempted
    _die_with_parent()  # a trial never outlives its Ray worker
    root, spec_name, index = argv[0], argv[1], int(argv[2])
    run_dir = RunDir(Path(root), spec_name)
    spec = json.loads(run_dir.spec_path(index).read_text())
    resume = any(run_dir.ckpt_dir(index, s).exists() for s in range(spec['meta']['max_session']))
    try:
        Trial(spec, run_dir, 'train', trial=index, resume=resume).run()
    except LabError as e:
        print(f'error: {e}', file=sys.stderr)
        return e.exit_code
    except Preempted as e:
        print(f'stopped: {e}', file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
