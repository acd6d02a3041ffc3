"""Command line of the lab: python run_lab.py [SPEC_FILE SPEC_NAME MODE] [-s KEY=VALUE ...]

The same command as `slm-lab run` (installed by pip install .); both are slm_lab/cli.py."""
import sys  # no `from __future__` import: it imports a module, which Ctrl-C could interrupt with a traceback


def main(argv: list[str] | None = None) -> int:
    """Run the lab with `argv` (default: the command line); its exit code."""
    from slm_lab.cli import run_main  # noqa: PLC0415 (after the stop handler: see slm_lab/entry.py)
    code, _ = run_main(sys.argv[1:] if argv is None else argv, own_process=argv is None)
    return code


if __name__ == '__main__':
    from slm_lab.entry import catch_stops_first
    catch_stops_first()  # first: Ctrl-C or SIGTERM during the lab's imports is one line, no traceback
    from slm_lab.cli import exit_process, run_main
    code, mode = run_main(sys.argv[1:])
    exit_process(code, mode)
