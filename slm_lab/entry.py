"""The lab's command as a process of its own: `python run_lab.py ...` and the installed `slm-lab`
script start here, so that SIGINT and SIGTERM are the lab's before the command line's imports
(slm_lab/cli.py, then torch and the envs): a stop at any instant of them ends the command with one
line and its exit code, never a traceback (errors.catch_stops). Nothing heavy is imported here."""
import sys


def catch_stops_first() -> None:
    """The lab's stop handler, in place before anything else is imported. Until then Python's own
    handler raises KeyboardInterrupt on Ctrl-C: that is the same one line (the imports here are
    pure Python, which the exception leaves intact)."""
    try:
        from slm_lab.lib.errors import catch_stops  # noqa: PLC0415 (the stop handler first: nothing else imported before it)
        catch_stops(at_once=True)
    except KeyboardInterrupt:
        print('interrupted', file=sys.stderr)
        sys.exit(130)


def console_main() -> None:
    """`slm-lab COMMAND ...`, the script pip installs (pyproject [project.scripts])."""
    if sys.argv[1:2] == ['run']:  # the lab's run; `slm-lab plot` keeps Python's handling
        catch_stops_first()
    from slm_lab.cli import console_main as cli_main  # noqa: PLC0415 (the command line after the stop handler is in place)
    cli_main()


if __name__ == '__main__':  # python -m slm_lab.entry COMMAND ...: as the installed script
    console_main()
