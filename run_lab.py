"""Command line of the lab: python run_lab.py [SPEC_FILE SPEC_NAME MODE] [-s KEY=VALUE ...]

The same command as `slm-lab run` (installed by pip install .); both are slm_lab/cli.py."""
import sys  # no `from __future__` import: it imports a module, which Ctrl-C could interrupt with a traceback


def main(argv: list[str] | None = None) -> int:
    """Run the lab with `argv` (default: the command line); its exit code."""
    from slm_lab.cli import run_main
    code, _ = run_main(sys.argv[1:] if argv is None else argv, own_process=argv is None)
    return code


if __name__ == '__main__':
    try:  # first: Ctrl-C or SIGTERM during the lab's imports is one line and its exit code, no traceback
        from slm_lab.lib.errors import catch_stops
        catch_stops(at_once=True)
    except KeyboardInterrupt:  # Python's own handler, in place until then (its imports are pure Python)
        print('interrupted', file=sys.stderr)
        sys.exit(130)
    from slm_lab.cli import exit_process, run_main
    code, mode = run_main(sys.argv[1:])
    exit_process(code, mode)
