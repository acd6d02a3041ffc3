"""The lab's command line, one implementation for both spellings:

    slm-lab run [SPEC_FILE SPEC_NAME MODE] [--set KEY=VALUE ...]   (installed by pip install .)
    slm-lab plot -f RUN_DIR,RUN_DIR[,...] [-l LABEL,...] [-t TITLE] [-o OUT]
    python run_lab.py [SPEC_FILE SPEC_NAME MODE] [-s KEY=VALUE ...]  (the same as slm-lab run)

Parsing only: the lab itself (torch, gymnasium) is imported once a command is known to be valid."""
from __future__ import annotations

import logging
import argparse
import os
import signal
import sys

from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import (LabError, ModeError, Preempted, Terminated, begin_writing, catch_stops,
                                clear_stops, set_stop_mode, stopped_line)
from slm_lab.options import check_run_options, is_benchmark_mode

DEMO = ('spec/demo.json', 'ppo_cartpole', 'train')
EXIT_INTERRUPTED = 130
ENJOY_DEFAULTS = {'episodes': 5, 'ckpt': 'best', 'render': False, 'record': False}

MODES_HELP = """\
modes:
  train             train a spec; writes data/{spec_name}_{timestamp}/
  dev               one session, debug logs, and a check that training changes the network
  train@latest      resume the newest run of this spec (data/{spec_name}_*) made from this
                    spec file (of any file, said, when none was), possibly with a larger
                    env.max_frame; continues in the same run directory
  train@<run dir>   resume that run (e.g. train@data/ppo_cartpole_2026_01_01_120000)
  train --run-dir DIR
                    for job schedulers: the same command starts the run in DIR, continues it
                    after any stop, and exits 0 at once once it is finished (docs/schedulers.md)
  train --fork <run dir> [--frame N]
                    a new run continuing from that run's snapshots (newest, or at frame N)
                    under this spec, as far as the saved state fits it (docs/fork.md)
  train --warm-start <run dir> [--ckpt best|latest]
                    a new run from frame 0 whose nets start from that run's weights
  enjoy@<run dir>/<spec_name>_t0_s0_spec.json
                    replay that session's best weights (--ckpt latest: newest snapshot),
                    --episodes N, --render, --record; never trains or writes records; the only
                    argument: the session spec is the run's own (no SPEC_FILE SPEC_NAME, -s, --force)
  search            hyperparameter search of the spec's search block on Ray Tune:
                    meta.max_trial trials (x grid points), each meta.max_session sessions;
                    --ray-address HOST:PORT runs them on a Ray cluster, --keep N keeps the
                    model files of the N best trials only (needs the search extra)
  search@latest     continue the newest search of this spec (data/{spec_name}_*): finished
  search@<run dir>  trials are kept, running ones continue from their snapshots

SUITE_FILE benchmark [--rows ID,...] [--seeds N] [--ray-address HOST:PORT]
                    every row x seed of a suite file as a trial on Ray Tune, then a report
                    (mean, 95% interval, verdict against published references, curves);
                    writes data/{suite}_{timestamp}/ (docs/benchmark.md); --missing-from FOLDER:
                    only the row-seeds not yet published there (slm-lab publish)
SUITE_FILE benchmark@latest | benchmark@<dir>
                    continue a stopped benchmark: finished row-seeds are kept, the others
                    continue from their snapshots; a finished one writes its report again
"""

EXIT_HELP = """\
exit codes: 0 done (or already finished), 2 bad input (one line on stderr, nothing written),
3 training diverged (NaN or infinite loss), 130 stopped by SIGINT / 143 by SIGTERM after saving a
snapshot (continue with train@latest; a search: search@latest), 137 a session killed by SIGKILL
(the others stopped with snapshots; continue with train@latest), 1 a bug (traceback).
"""


def run_help(cmd: str) -> str:
    """The help of the run command, its examples spelled as `cmd` (`python run_lab.py` or `slm-lab run`)."""
    s = '--set' if cmd.startswith('slm-lab') else '-s'
    return f"""\
Train, resume, replay and search deep RL agents from JSON or YAML specs (SLM-Lab v4 and v5 files too).

With no arguments, runs the demo: spec/demo.json ppo_cartpole train (PPO on CartPole, one session
of 100k frames).

{MODES_HELP}
examples:
  {cmd} spec/demo.json ppo_cartpole train
  {cmd} spec/benchmark/dqn/dqn_cartpole.json dqn_cartpole dev {s} env.max_frame=2000
  {cmd} my_spec.json my_ppo train {s} agent.net.optim_spec.lr=3e-4 {s} lr=3e-4
  {cmd} spec/demo.json ppo_cartpole train@latest {s} env.max_frame=200000
  {cmd} spec/slm_lab/cartpole_v5.yaml ppo_yaml train {s} env=CartPole-v1 {s} max_frame=1e5
  {cmd} data/ppo_cartpole_2026_01_01_120000/ppo_cartpole_t0_s1_spec.json ppo_cartpole train
                    (repeats session 1 of that run alone: its spec records its seed)
  {cmd} enjoy@data/ppo_cartpole_2026_01_01_120000/ppo_cartpole_t0_s0_spec.json --episodes 3

{EXIT_HELP}"""


BENCHMARK_HELP = f"""\
Run every row x seed of a suite file as a trial on Ray Tune (locally, or on a Ray cluster with
--ray-address), then report per row each seed's score, the mean and its 95% bootstrap interval,
where each published reference lies against it, a learning-curve graph, and the interquartile
mean over rows. The same as python run_lab.py SUITE_FILE MODE (docs/benchmark.md).

usage: slm-lab benchmark SUITE_FILE [benchmark | benchmark@latest | benchmark@<dir>] [--rows ID,...]
                         [--seeds N] [--missing-from FOLDER] [--ray-address HOST:PORT]

examples:
  slm-lab benchmark spec/benchmark/suites/slm_lab_v5_cpu.json --rows ppo_acrobot,sac_pendulum --seeds 4
  slm-lab benchmark spec/benchmark/suites/slm_lab_v5_cpu.json benchmark@latest      (after a stop)
  slm-lab benchmark spec/benchmark/suites/slm_lab_v5_cpu.json --missing-from docs/benchmarks/slm_lab_v5_cpu
                    (the row-seeds not published yet; then slm-lab publish data/... --to the same folder)

{EXIT_HELP}"""


class OneLineParser(argparse.ArgumentParser):
    """Command-line mistakes are user errors too: one line, exit code 2."""

    def error(self, message: str):
        cmd = f'python {self.prog}' if self.prog.endswith('.py') else self.prog
        self.exit(2, f'error: {message} (see {cmd} --help)\n')


def parse_run_args(argv: list[str], prog: str = 'run_lab.py') -> argparse.Namespace:
    """The arguments of a run (`python run_lab.py ...` or `slm-lab run ...`), checked: a usage
    mistake exits with one line and code 2."""
    cmd = 'python run_lab.py' if prog == 'run_lab.py' else prog
    description = BENCHMARK_HELP if prog == 'slm-lab benchmark' else run_help(cmd)
    parser = OneLineParser(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('spec_file', nargs='?',
                        help='path of a JSON or YAML (.yaml, .yml) spec file, or of a spec a run saved')
    parser.add_argument('spec_name', nargs='?', help='name of a spec in that file')
    parser.add_argument('mode', nargs='?', help='dev | train | train@latest | train@<run dir> | '
                        'enjoy@<session spec> | search | search@latest | search@<run dir> (see modes above); '
                        'after a suite file: benchmark | benchmark@latest | benchmark@<dir>')
    parser.add_argument('-s', '--set', dest='overrides', action='append', default=[], metavar='KEY=VALUE',
                        help='override a spec value by dotted path (env.max_frame=20000), or fill a ${KEY} '
                             'placeholder of the spec; repeatable; recorded in the saved spec')
    parser.add_argument('--track', action='store_true',
                        help="log to Weights & Biases too: the same as -s meta.wandb=true, recorded in the saved spec "
                             "(needs pip install '.[wandb]'; offline without an API key)")
    parser.add_argument('--force', action='store_true',
                        help='train@: resume even though the spec changed in ways that break continuity '
                             '(the changes are recorded in the run)')
    parser.add_argument('--run-dir', metavar='DIR',
                        help='train: the run\'s own directory, for a job a scheduler may start again: a new run in '
                             'DIR the first time, DIR\'s run continued after any stop, exit 0 at once when it is '
                             'finished (docs/schedulers.md)')
    branch = parser.add_argument_group('a new run from a trained one (mode train; docs/fork.md)')
    branch.add_argument('--fork', metavar='RUN_DIR',
                        help="a new run whose sessions continue from that run's snapshots (--frame N: the one at "
                             'frame N; default: the newest), under this spec')
    branch.add_argument('--frame', type=int, metavar='N', help='with --fork: the frame of the snapshot to fork from')
    branch.add_argument('--warm-start', metavar='RUN_DIR',
                        help="a fresh run whose nets start from that run's weights (--ckpt best, the default, or "
                             'latest: its newest snapshot); optimizer state is not carried')
    search = parser.add_argument_group('search')
    search.add_argument('--ray-address', metavar='HOST:PORT',
                        help='run the trials on this Ray cluster (default: RAY_ADDRESS, else a local Ray)')
    search.add_argument('--keep', type=int, metavar='N', help='keep the model files of the N best trials only')
    bench = parser.add_argument_group('benchmark (SUITE_FILE benchmark; --ray-address too)')
    bench.add_argument('--rows', metavar='ID[,ID...]',
                       help="run these rows of the suite only (row ids, or env / algorithm labels)")
    bench.add_argument('--seeds', type=int, metavar='N', help="seeds per row (default: each row's, 4 unless it says)")
    bench.add_argument('--missing-from', metavar='FOLDER',
                       help='run only the row-seeds not published in FOLDER yet (slm-lab publish --to FOLDER)')
    # enjoy@'s options default to None so that giving one to another mode can be refused
    enjoy = parser.add_argument_group('enjoy@ (replay)')
    enjoy.add_argument('--episodes', type=int, help=f'episodes to play (default {ENJOY_DEFAULTS["episodes"]})')
    enjoy.add_argument('--ckpt', choices=('best', 'latest'),
                       help='best weights (default) or the newest snapshot (enjoy@ and --warm-start)')
    enjoy.add_argument('--render', action='store_const', const=True,
                       help='show the env in a window (needs a display)')
    enjoy.add_argument('--record', action='store_const', const=True,
                       help="write videos under the run's video/ (needs moviepy: pip install '.[video]')")
    args = parser.parse_args(argv)
    given = [a for a in (args.spec_file, args.spec_name, args.mode) if a is not None]
    enjoy_target = next((a for a in given if a.startswith('enjoy@')), None)
    if prog == 'slm-lab benchmark' and len(given) == 1:
        given.append('benchmark')  # slm-lab benchmark SUITE_FILE: a new benchmark
    if len(given) == 2 and given[1].startswith('benchmark'):  # SUITE_FILE MODE: no spec name
        args.spec_file, args.spec_name, args.mode = given[0], None, given[1]
        rows = [r.strip() for r in args.rows.split(',') if r.strip()] if args.rows is not None else None
        try:
            check_run_options(args.mode, force=args.force, fork=args.fork, frame=args.frame,
                              warm_start=args.warm_start, ray_address=args.ray_address, keep=args.keep,
                              run_dir=args.run_dir, rows=rows, seeds=args.seeds, ckpt=args.ckpt,
                              missing_from=args.missing_from)
        except ModeError as e:
            parser.error(str(e))
        if not is_benchmark_mode(args.mode):
            parser.error(f"unknown mode '{args.mode}' after a suite file; use benchmark, benchmark@latest or "
                         'benchmark@<benchmark dir>')
        for option, value in (('-s/--set', args.overrides), ('--track', args.track)):
            if value:
                parser.error(f"{option} does not apply to {args.mode}: a row's overrides go in the suite file "
                             "(rows[].set)")
        extra = [f'--{key}' for key in ENJOY_DEFAULTS if key != 'ckpt' and getattr(args, key) is not None]
        if extra:
            parser.error(f'{", ".join(extra)} only apply to enjoy@<session spec>, not to mode {args.mode!r}')
        args.rows = rows
        return args
    if prog == 'slm-lab benchmark':
        parser.error('give SUITE_FILE [benchmark | benchmark@latest | benchmark@<dir>]')
    if not given:
        args.spec_file, args.spec_name, args.mode = DEMO
    elif enjoy_target is not None:
        if len(given) > 1:  # the spec is the session's own; a spec file and name would be ignored
            parser.error(f'enjoy@ takes the session spec as its only argument and reads the spec from the run, '
                         f'so drop the spec file and name: {cmd} {enjoy_target}')
        args.spec_file, args.spec_name, args.mode = None, None, enjoy_target
    elif len(given) < 3:
        parser.error('give SPEC_FILE SPEC_NAME MODE, or enjoy@<session spec>, or SUITE_FILE benchmark, or no arguments '
                     'for the demo')
    if args.mode.startswith('enjoy@'):
        for option, value in (('-s/--set', args.overrides), ('--force', args.force), ('--track', args.track)):
            if value:
                parser.error(f'{option} does not apply to enjoy@, which replays the session as its run saved it; '
                             'to change the spec, continue the run with train@ and -s')
        for key, default in ENJOY_DEFAULTS.items():
            if getattr(args, key) is None:
                setattr(args, key, default)
        if args.episodes < 1:
            parser.error('--episodes must be at least 1')
    try:  # the rules between options, shared with the Python API (slm_lab/options.py)
        check_run_options(args.mode, force=args.force, fork=args.fork, frame=args.frame, warm_start=args.warm_start,
                          ray_address=args.ray_address, keep=args.keep, run_dir=args.run_dir,
                          rows=None if args.rows is None else [args.rows], seeds=args.seeds,
                          missing_from=args.missing_from)
    except ModeError as e:
        parser.error(str(e))
    if not args.mode.startswith('enjoy@'):
        extra = [f'--{key}' for key in ENJOY_DEFAULTS if key != 'ckpt' and getattr(args, key) is not None]
        if args.ckpt is not None and args.warm_start is None:  # --ckpt also picks a warm start's weights
            given = '--fork' if args.fork is not None else f'mode {args.mode!r}'
            also = f'{", ".join(extra)} only apply to enjoy@<session spec>, and ' if extra else ''
            fork = '; a fork continues from a snapshot: pick it with --frame N' if args.fork is not None else ''
            parser.error(f'{also}--ckpt picks the weights that --warm-start RUN_DIR or enjoy@<session spec> load: '
                         f'use it with one of them, not with {given}{fork}')
        if extra:
            parser.error(f'{", ".join(extra)} only apply to enjoy@<session spec>, not to mode {args.mode!r}')
    if args.track:  # an override like any other: the saved spec records it, and train@latest keeps it
        args.overrides.append('meta.wandb=true')
    return args


def continuation(args: argparse.Namespace | None, run_dir=None) -> str:
    """What continues a stopped command: the same command for --run-dir (train@latest does not
    look there); a train or dev run by its directory (`run_dir`, where the command knows it:
    train@latest would skip a dev run, or take a newer run of the spec); else the run the command
    named (search@DIR, benchmark@DIR), or {mode}@latest."""
    mode = (args.mode if args is not None else None) or 'train'
    if args is not None and args.run_dir is not None:
        return f'the same command (train --run-dir {args.run_dir})'
    kind, _, target = mode.partition('@')
    kind = kind if kind in ('search', 'benchmark') else 'train'
    if run_dir is not None and kind == 'train':
        return f'train@{run_dir.root}'
    return f'{kind}@{target or "latest"}'


def report(error: BaseException, mode: str | None, args: argparse.Namespace | None = None, run_dir=None) -> int:
    """Print how a command that did not finish ended (one line on stderr); its exit code."""
    if isinstance(error, LabError):
        print(f'error: {error}', file=sys.stderr)
        return error.exit_code
    if isinstance(error, Preempted):
        print(f'stopped: {error}; continue with {continuation(args, run_dir)}', file=sys.stderr)
        return error.exit_code
    if isinstance(error, Terminated):
        print(stopped_line(signal.SIGTERM, mode), file=sys.stderr)
        return error.exit_code
    print(stopped_line(signal.SIGINT, mode), file=sys.stderr)  # KeyboardInterrupt
    return EXIT_INTERRUPTED


def run_main(argv: list[str], prog: str = 'run_lab.py', own_process: bool = True) -> tuple[int, str | None]:
    """A run from the command line: (exit code, mode or None when the arguments were refused).
    `own_process`: this process ends with the command, so a stop signal before anything is written
    ends it at once with one line (errors.AT_ONCE), and once the command is done SIGINT and SIGTERM
    are left ignored; otherwise a stop raises and the caller's handlers are put back."""
    # SIGINT and SIGTERM are the lab's until a trial or a search takes them over to save snapshots
    previous = catch_stops(at_once=own_process)
    try:
        try:
            args = parse_run_args(argv, prog)
        except (KeyboardInterrupt, Terminated) as e:  # only when not own_process (AT_ONCE exits in the handler)
            return report(e, None), None
        set_stop_mode(args.mode)
        made: list = []  # the run's directory, once the lab knows it: what a stop's line names
        try:
            from slm_lab import lab  # noqa: PLC0415 imports the lab's modules: after the arguments are known to be valid
            if args.mode.startswith('enjoy@'):
                lab.check_mode(args.mode)
                lab_logger.setup_console()  # its warnings (a damaged snapshot skipped) read as the lab's log lines
                from slm_lab.experiment.enjoy import enjoy  # noqa: PLC0415 imports torch
                if args.record:
                    begin_writing()  # a stop closes the video being written on the way out
                enjoy(args.mode[len('enjoy@'):], args.episodes, args.ckpt, args.render, args.record)
            elif is_benchmark_mode(args.mode):
                from slm_lab import benchmark_mode  # noqa: PLC0415 imports lab: only once the arguments are valid
                benchmark_mode.benchmark(args.spec_file, args.mode, args.rows, args.seeds, ray_address=args.ray_address,
                                         missing_from=args.missing_from)
            elif args.fork is not None or args.warm_start is not None:
                from slm_lab import branch  # noqa: PLC0415 imports lab (gymnasium): only once the arguments are valid
                branch.run(args.spec_file, args.spec_name, args.mode, args.overrides, fork_from=args.fork,
                           frame=args.frame, warm_start_from=args.warm_start, ckpt=args.ckpt, on_run_dir=made.append)
            else:
                lab.run(args.spec_file, args.spec_name, args.mode, args.overrides, force=args.force,
                        ray_address=args.ray_address, keep=args.keep, run_dir=args.run_dir, on_run_dir=made.append)
        except (LabError, Preempted, KeyboardInterrupt, Terminated) as e:
            _ended(own_process)
            return report(e, args.mode, args, made[-1] if made else None), args.mode
        _ended(own_process)
        return 0, args.mode
    finally:
        clear_stops()  # a stop is this command's: the next one starts without it
        if not own_process:  # a caller of main() gets its own handlers back
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _ended(own_process: bool) -> None:
    """The command has ended: a stop signal now must not change how (its process exits next, which
    takes torch's teardown, about a second)."""
    if own_process:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)


def exit_process(code: int, mode: str | None) -> None:
    """End this process with `code`. A search's driver is done with Ray, torch and its files (each
    written atomically, closed): the interpreter's teardown of those modules (about 0.8 s) is skipped."""
    if mode is not None and mode.startswith(('search', 'benchmark')):
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


MAIN_HELP = f"""\
usage: slm-lab COMMAND ...

A spec-driven deep reinforcement learning lab.

commands:
  run [SPEC_FILE SPEC_NAME MODE] [--set KEY=VALUE ...]
                    train, resume, replay or search a spec (slm-lab run --help);
                    the same as python run_lab.py; no arguments: the demo
  plot -f RUN_DIR,RUN_DIR[,...] [-l LABEL,...] [-t TITLE] [-o OUT]
                    one graph comparing runs (or a search's trials) (slm-lab plot --help)
  report RUN_DIR[,RUN_DIR...] [-o OUT.md]
                    a table of each run's final score per seed, mean and 95% interval
                    (slm-lab report --help)
  benchmark SUITE_FILE [benchmark@latest | benchmark@<dir>] [--rows ID,...] [--seeds N]
                    every row x seed of a suite file on Ray Tune, then its report against
                    published references (slm-lab benchmark --help; docs/benchmark.md)
  publish BENCHMARK_DIR [...] --to FOLDER
                    put a benchmark's finished row-seeds (scores, curves) into a folder of
                    small files with the report over all of them (slm-lab publish --help)

{MODES_HELP}
examples:
  slm-lab run spec/demo.json ppo_cartpole train --set env.max_frame=20000
  slm-lab run spec/demo.json ppo_cartpole train@latest --set env.max_frame=200000
  slm-lab plot -f data/ppo_cartpole_2026_01_01_120000,data/dqn_cartpole_2026_01_01_130000 -l PPO,DQN
  slm-lab report data/ppo_cartpole_2026_01_01_120000,data/dqn_cartpole_2026_01_01_130000
  slm-lab benchmark spec/benchmark/suites/slm_lab_v5_cpu.json --rows ppo_acrobot --seeds 4
  slm-lab benchmark spec/benchmark/suites/slm_lab_v5_cpu.json benchmark@latest
"""


def main(argv: list[str] | None = None) -> int:
    """`slm-lab COMMAND ...`: the console command pip installs (pyproject [project.scripts])."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ('-h', '--help'):
        print(MAIN_HELP, end='', file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == 'run':
        code, mode = run_main(rest, prog='slm-lab run')
        exit_process(code, mode)
    if command == 'benchmark':
        code, mode = run_main(rest, prog='slm-lab benchmark')
        exit_process(code, mode)
    if command == 'plot':
        from slm_lab.experiment.compare import plot_main  # noqa: PLC0415 pandas and plotly: only plot needs them
        return plot_main(rest)
    if command == 'report':
        from slm_lab.experiment.report import report_main  # noqa: PLC0415 numpy: only a report needs it
        return report_main(rest)
    if command == 'publish':
        from slm_lab.experiment.benchmark.publish import publish_main  # noqa: PLC0415 numpy: only a publish needs it
        return publish_main(rest)
    print(f"error: unknown command {command!r}; the commands are run, plot, report, benchmark and publish (see "
          "slm-lab --help)",
          file=sys.stderr)
    return 2


def console_main() -> None:
    """The installed `slm-lab` script's entry point."""
    sys.exit(main())


if __name__ == '__main__':
    console_main()
