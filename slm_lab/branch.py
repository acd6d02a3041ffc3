"""New runs made from a trained one (docs/fork.md):

    train --fork RUN_DIR [--frame N]          every session continues from the parent's snapshot
    train --warm-start RUN_DIR [--ckpt best|latest]   a fresh run whose nets start from its weights

Each is a new run directory whose spec records where it came from (meta.lineage). Everything is
checked before that directory exists, and the parent run is only read."""
from __future__ import annotations

import copy
import logging
import os
import shutil
import time
from pathlib import Path

from slm_lab.agent import Agent
from slm_lab.env import Clock, agent_action_space, make_env
from slm_lab.experiment.trial import Trial
from slm_lab.lab import check_data_dir, logger
from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import ModeError, Preempted
from slm_lab.persistence import edits, lineage
from slm_lab.persistence import resume as resume_lib
from slm_lab.persistence.run_dir import RunDir, create_run_dir, new_experiment_ts, write_specs
from slm_lab.runs import preflight, prepare_spec, run_new
from slm_lab.spec import check_spec_name, load_raw_spec


def run(spec_file: str, spec_name: str, mode: str, overrides: list[str] | None = None, data_dir: str = 'data', *,
        fork_from: str | None = None, frame: int | None = None, warm_start_from: str | None = None,
        ckpt: str | None = None, on_run_dir=None) -> dict | None:
    """`train --fork RUN_DIR [--frame N]` or `train --warm-start RUN_DIR [--ckpt best|latest]`
    (exactly one of fork_from, warm_start_from); the checks of the command line, as ModeError."""
    if fork_from is not None and warm_start_from is not None:
        raise ModeError('--fork and --warm-start: give one (a fork continues the parent\'s training; a warm start '
                        'begins a new one from its weights)')
    if frame is not None and fork_from is None:
        raise ModeError('--frame picks the snapshot a fork continues from: use it with --fork RUN_DIR')
    if ckpt is not None and warm_start_from is None:
        raise ModeError('--ckpt picks the weights of a warm start (or of enjoy@): use it with --warm-start RUN_DIR; '
                        'a fork continues from a snapshot (--frame N)')
    if fork_from is None and warm_start_from is None:
        raise ModeError('give --fork RUN_DIR or --warm-start RUN_DIR')
    option = '--fork' if fork_from is not None else '--warm-start'
    if mode != 'train':
        raise ModeError(f"{option} makes a new train run: use mode train, not '{mode}'")
    if ckpt is not None and ckpt not in ('best', 'latest'):
        raise ModeError(f"--ckpt {ckpt}: use best or latest")
    check_spec_name(spec_name)
    data_dir = check_data_dir(data_dir)  # the new run's directory goes there
    lab_logger.setup_console(logging.INFO)
    if fork_from is not None:
        return fork(spec_file, spec_name, fork_from, frame, overrides, data_dir, on_run_dir)
    return warm_start(spec_file, spec_name, warm_start_from, ckpt or 'best', overrides, data_dir, on_run_dir)


def _spec_nets(spec: dict) -> dict:
    """The nets a spec builds ({name: torch module}), from a throwaway agent."""
    env = make_env({**spec['env'], 'num_envs': 1, 'vectorization_mode': 'sync'})
    try:
        agent = Agent(spec, env.single_observation_space, agent_action_space(env), spec['env']['num_envs'],
                      Clock(spec['env']['max_frame'], spec['env']['num_envs']), seed=0)
    finally:
        env.close()
    return agent.algorithm.nets()


def _parent(target: str, spec_name: str, data_dir: str, option: str):
    """The parent run directory and its saved spec (a train run of spec_name, not a search)."""
    parent = resume_lib.resolve_run_dir(target, spec_name, data_dir, label=f'{option} {target}')
    return parent, resume_lib.read_run_spec(parent)


def _new_run_dir(spec: dict, spec_name: str, data_dir: str) -> RunDir:
    ts = new_experiment_ts(data_dir, spec_name)
    spec['meta']['experiment_ts'] = ts
    return RunDir.for_spec(data_dir, spec_name, ts)


def fork(spec_file: str, spec_name: str, target: str, frame: int | None, overrides: list[str] | None,
         data_dir: str, on_run_dir=None) -> dict | None:
    """A new run whose sessions continue from the parent's snapshots (at `frame`, or each its
    newest intact one), with the parent's CSV rows up to there, under the given spec: the spec
    file with the parent's -s overrides, then these (the seed is the parent's unless given)."""
    if frame is not None and frame < 0:
        raise ModeError(f'--frame {frame}: give the frame of a snapshot (>= 0)')
    parent, parent_spec = _parent(target, spec_name, data_dir, '--fork')
    spec, _ = edits.continuation_spec(spec_file, spec_name, overrides, parent_spec, 'train', fork=True)
    n_sessions, parent_sessions = spec['meta']['max_session'], parent_spec['meta']['max_session']
    if n_sessions > parent_sessions:
        raise lineage.LineageError(f'meta.max_session {n_sessions}: {parent.root} has {parent_sessions} session(s) '
                                   f'to fork from; use meta.max_session <= {parent_sessions}')
    snapshots = lineage.fork_snapshots(parent, n_sessions, frame)
    for s, snap in snapshots.items():
        _say_passed_over('--fork', parent, s, lineage.snapshot_record(parent, snap))
    frames = {s: snap.frame for s, snap in snapshots.items()}
    reached = max(frames.values())
    if spec['env']['max_frame'] <= reached:
        raise lineage.LineageError(f"env.max_frame {spec['env']['max_frame']} leaves nothing to train after frame "
                                   f'{reached} of the snapshot forked from; use env.max_frame > {reached}')
    nets = _spec_nets(spec)
    for s, snap in snapshots.items():
        lineage.check_nets_fit(snap.nets, nets, f'snapshot {snap.path}')
    del nets
    meta = spec['meta']
    meta['lineage'] = {'kind': 'fork', 'parent': os.path.abspath(parent.root), 'frame': frame,
                       'sessions': {str(s): lineage.snapshot_record(parent, snap) for s, snap in snapshots.items()},
                       'forked': time.strftime('%Y-%m-%dT%H:%M:%S')}
    if 'lineage' in parent_spec['meta']:
        meta['lineage']['parent_lineage'] = parent_spec['meta']['lineage']
    # as train@ says it: where the fork's spec moves a frame-driven schedule (an lr under
    # LinearToZero follows env.max_frame) from the value the parent had at that frame
    changes = edits.schedule_changes(parent_spec, spec, frames)
    if changes:
        meta['lineage']['schedule_changes'] = changes
    preflight(spec, data_dir)
    run_dir = _new_run_dir(spec, spec_name, data_dir)
    # every snapshot loads into a session of this spec (env count, memory, ...) before anything is written
    checking = Trial(spec, run_dir, 'train', trial=0, resume=True)
    try:
        checking.check_resume(snapshots, advice='a fork continues its parent\'s state: keep the env count and the '
                                                'net shapes the parent trained with (--warm-start takes the weights '
                                                'alone, for another env count)')
    finally:
        checking.release()
    del snapshots, checking

    def write_fork(staging: RunDir, trial) -> None:
        write_specs(staging, trial)
        for s in range(n_sessions):
            src = parent.root / meta['lineage']['sessions'][str(s)]['snapshot']
            lineage.copy_snapshot(src, staging.ckpt_dir(0, s))
            for df_mode in ('train', 'eval'):
                lineage.copy_rows(parent.session_df_path(0, s, df_mode), staging.session_df_path(0, s, df_mode),
                                  frames[s])

    trial = Trial(spec, run_dir, 'train', trial=0, resume=True)
    lock, run_dir = create_run_dir(run_dir, trial, write=write_fork)
    if on_run_dir is not None:
        on_run_dir(run_dir)
    logger.info(f'run directory {run_dir.root}: forked from {parent.root} at frame(s) {frames}')
    for change in changes:
        logger.warning(f'schedule change on fork: {edits.describe_schedule_change(change)}')
    try:
        seconds: dict[int, float] = {}
        trial.check_resume(resume_lib.load_sessions(run_dir, n_sessions, seconds), seconds)  # the copies
        metrics = trial.run()
    except BaseException as e:
        trial.release()
        lock.close()
        # a fork that fails before any of its sessions wrote is no run: its directory goes, so that
        # train@latest does not take it for one. Stopped by a signal (Preempted, a second Ctrl-C), it
        # stays: its copied snapshots continue with train@latest as the stop's message says
        # a session of the fork that wrote (from then on it is a run of its own) recorded its resume first
        trained = any(run_dir.session_resume_log_path(0, s).exists() for s in range(n_sessions))
        if not trained and not isinstance(e, (Preempted, KeyboardInterrupt)) and run_dir.root != parent.root:
            shutil.rmtree(run_dir.root, ignore_errors=True)
            logger.info(f'removed {run_dir.root}: the fork failed before it trained')
        raise
    trial.release()
    lock.close()
    logger.info(f'done: {run_dir.root}')
    return metrics


def _say_passed_over(option: str, parent: RunDir, session: int, record: dict) -> None:
    """Warn of each damaged snapshot of the parent's session passed over to reach the one taken
    (`record`: lineage.snapshot_record, which the new run's lineage keeps); the parent is left as
    it is."""
    for skipped in record.get('passed_over', ()):
        logger.warning(f'{option} {parent.root}: session {session}: skipped damaged snapshot '
                       f'{Path(skipped["snapshot"]).name} ({skipped["problem"]}); taking '
                       f'{Path(record["snapshot"]).name} (frame {record["frame"]}); the parent run is left as it is')


def _keep_parent_targets(spec: dict, raw: dict, parent_spec: dict) -> None:
    """A warm start of DQN from a DQN run, its spec (`raw`, before defaults) leaving
    `agent.algorithm.double_q` out: the parent's value (false for a run saved before the key
    existed), so the weights go on learning from the targets they were trained with; said when
    that is not what the spec alone would give."""
    algorithm = spec['agent']['algorithm']
    parent = edits.fill_keys_added_later(copy.deepcopy(parent_spec))['agent']['algorithm']
    if algorithm['name'] != 'DQN' or parent.get('name') != 'DQN' or 'double_q' in raw['agent']['algorithm']:
        return
    if parent['double_q'] != algorithm['double_q']:
        logger.warning(f"--warm-start: agent.algorithm.double_q {str(parent['double_q']).lower()}, the parent's "
                       '(the spec leaves it out); give -s agent.algorithm.double_q=... to choose')
    algorithm['double_q'] = parent['double_q']


def warm_start(spec_file: str, spec_name: str, target: str, ckpt: str, overrides: list[str] | None,
               data_dir: str, on_run_dir=None) -> dict:
    """A fresh run of the spec from frame 0 whose nets start from the parent's weights (`ckpt`
    'best': each session's model_best.pt; 'latest': its newest intact snapshot); optimizer state,
    the env and the replay start fresh. Session s takes the weights of the parent's session
    s mod (its sessions). A DQN spec that leaves double_q out keeps the parent's targets
    (_keep_parent_targets)."""
    if target == 'latest':  # the newest train run of this spec
        (parent, parent_spec), parent_trial = _parent(target, spec_name, data_dir, '--warm-start'), 0
    else:  # any run whose nets fit, of any spec name: a teacher for a student, a search's best trial
        parent, parent_trial, parent_spec = resume_lib.resolve_trial(target, f'--warm-start {target}')
    spec = prepare_spec(spec_file, spec_name, 'train', overrides, data_dir)
    _keep_parent_targets(spec, load_raw_spec(spec_file, spec_name, overrides), parent_spec)
    meta = spec['meta']
    if meta.get('distributed') and meta['max_session'] > 1:
        raise ModeError('--warm-start: meta.distributed runs train global nets that a warm start does not load '
                        'yet; warm-start a run with meta.distributed false')
    parent_sessions = parent_spec['meta']['max_session']
    weights, records = {}, {}
    for s in range(meta['max_session']):
        weights[s], records[str(s)] = lineage.warm_start_weights(parent, s % parent_sessions, ckpt, parent_trial)
        _say_passed_over('--warm-start', parent, s % parent_sessions, records[str(s)])
    nets = _spec_nets(spec)
    for s, saved in weights.items():
        record = records[str(s)]
        lineage.check_nets_fit(saved, nets, str(parent.root / record.get('file', record.get('snapshot'))))
    del nets
    meta['lineage'] = {'kind': 'warm_start', 'parent': os.path.abspath(parent.root),
                       'parent_spec_name': parent.spec_name, 'parent_trial': parent_trial, 'ckpt': ckpt,
                       'sessions': records, 'warm_started': time.strftime('%Y-%m-%dT%H:%M:%S')}
    if 'lineage' in parent_spec['meta']:
        meta['lineage']['parent_lineage'] = parent_spec['meta']['lineage']
    run_dir = _new_run_dir(spec, spec_name, data_dir)

    def write_warm(staging: RunDir, trial) -> None:
        write_specs(staging, trial)
        for s, saved in weights.items():
            lineage.write_warm_start(staging.model_path(0, s, 'warm_start'), saved, records[str(s)])

    return run_new(run_dir, Trial(spec, run_dir, 'train', trial=0), on_run_dir, write_warm,
                   f': nets warm-started from {parent.root} ({ckpt})')
