"""Command line of the lab: python run_lab.py [SPEC_FILE SPEC_NAME MODE] [-s KEY=VALUE ...]

The same command as `slm-lab run` (installed by pip install .); both are slm_lab/cli.py."""
from __future__ import annotations

import sys

from slm_lab.cli import exit_process, run_main


def main(argv: list[str] | None = None) -> int:
    """Run the lab with `argv` (default: the command line); its exit code."""
    code, _ = run_main(sys.argv[1:] if argv is None else argv, own_process=argv is None)
    return code


if __name__ == '__main__':
    code, mode = run_main(sys.argv[1:])
    exit_process(code, mode)
