"""Session: one agent in one (vector) env, the RL loop (act, step, update, tick) and its records
at log / eval points, its snapshots, and continuing from one (resume_from)."""
from __future__ import annotations

import copy
import math
import time
from typing import Any, NamedTuple

import numpy as np
import torch

from slm_lab.agent import Agent
from slm_lab.agent.body import Body
from slm_lab.env import Clock, agent_action_space, make_env, normalize_obs_fn, obs_norm_state
from slm_lab.env.atari import approximate_resume_note
from slm_lab.env.wrappers import finished_returns
from slm_lab.experiment import viz
from slm_lab.experiment.greedy_eval import GreedyEval
from slm_lab.experiment.benchmark.suite import is_benchmark_run
from slm_lab.experiment.diverged import diverged_error, nonfinite_cause, nonfinite_metrics
from slm_lab.experiment.results import fmt_metric, rows_to_csv, rows_to_df, write_session_results
from slm_lab.experiment.seeds import global_rng_state, load_global_rng_state, session_seed, set_global_seeds
from slm_lab.experiment.signals import StopSignal
from slm_lab.experiment.tensorboard import SessionBoard
from slm_lab.experiment.wandb_board import WandbBoard
from slm_lab.lib import gc_pause, logger as lab_logger, malloc
from slm_lab.lib.errors import Preempted, TrainingDiverged
from slm_lab.lib.io import append_json_list, atomic_write_text
from slm_lab.persistence import snapshots as snapshot_parts
from slm_lab.lib.arrays import verify_arrays_async
from slm_lab.persistence.env_state import load_vector_env_state_dict, vector_env_state_dict
from slm_lab.persistence.lineage import load_warm_start
from slm_lab.persistence.model_file import reconcile_best_model, save_model_file
from slm_lab.persistence.run_dir import RunDir
from slm_lab.persistence.background import BackgroundWriter
from slm_lab.persistence.snapshot import PreparedSnapshot, prepare_snapshot, write_snapshot
from slm_lab.persistence.resume import append_run_record
from slm_lab.persistence.snapshots import DamagedSnapshot, prune_snapshots
from slm_lab.persistence.snapshots import Snapshot
from slm_lab.resources import replay_in_snapshots

logger = lab_logger.get_logger('slm_lab.session')
GRAPH_INTERVAL_S = 60.0  # redraw graphs during a session at most this often (and always at the end)


class Start(NamedTuple):
    """How Session.run starts: fresh (`snapshot` None) or continuing from a snapshot, and what the
    trial around the session gives it."""

    snapshot: Snapshot | None = None
    # why the continuation is approximate, when the lab loaded the snapshot into this very session
    # already (load_state_dict, quietly); None: run loads it
    approximate: list[str] | None = None
    skipped: tuple[dict, ...] = ()  # damaged snapshots passed over (and set aside) to reach it
    t0: float | None = None  # perf_counter when reading it began: the resume record's load_s counts from it
    resuming: bool = False  # a resume; without a snapshot: the session had recorded nothing, it starts fresh
    global_nets: Any = None  # meta.distributed: the trial's shared nets, which the session trains
    # train@'s record of the run's resume, which this session appends to the run's resume log at its
    # first write (a try that fails before is no resume); None: none to record
    run_record: dict | None = None
    # (queue, session index) of a session in its own process whose trial records a resume: the
    # session puts ('first_write', index, None) on the queue at its first write, and the lab's
    # process records the resume once (pool.run_in_processes)
    report_to: tuple[Any, int] | None = None


def continue_mode(spec: dict, run_dir: RunDir | None = None) -> str:
    """The mode that continues this run: 'benchmark' for a benchmark's trial (its directory has
    benchmark/), 'search' for a search's trial, else 'train'."""
    if run_dir is not None and is_benchmark_run(run_dir.root):
        return 'benchmark'
    return 'search' if str(spec['meta'].get('mode')).startswith('search') else 'train'


class Session:
    """One agent in one (vector) env: act, step, update, tick; at log / eval frequency record a
    row and save. `run()` returns the session metrics."""

    def __init__(self, spec: dict, run_dir: RunDir, mode: str = 'train', trial: int = 0, session: int = 0,
                 stop: StopSignal | None = None):
        self.spec = spec
        self.stop = stop or StopSignal()
        self.run_dir, self.mode = run_dir, mode
        self.trial, self.index = trial, session
        self.prename = run_dir.prename(trial, session)
        meta, env_spec = spec['meta'], spec['env']
        self.seed = session_seed(spec, trial, session)
        torch.set_num_threads(meta['torch_num_threads'])
        self.flush_denormal = meta.get('flush_denormal', False)  # absent: a spec saved before the key
        torch.set_flush_denormal(self.flush_denormal)
        malloc.keep_freed_memory()
        set_global_seeds(self.seed)
        self.env = make_env(env_spec, gamma=spec['agent']['algorithm']['gamma'])
        self.num_envs = self.env.num_envs
        self.whole_games = bool(env_spec.get('life_loss_info'))  # an episode is a life; records count games
        self.clock = Clock(env_spec['max_frame'], self.num_envs)
        self.agent = Agent(spec, self.env.single_observation_space, agent_action_space(self.env), self.num_envs,
                           self.clock, self.seed)
        self.body = Body()
        # the boards mirror the records' scalars: TensorBoard (meta.tensorboard) and W&B (meta.wandb)
        self.boards = (SessionBoard(run_dir.tb_dir(trial, session), enabled=meta.get('tensorboard', True)),
                       WandbBoard(spec, run_dir, trial, session))
        self.log_frequency = meta['log_frequency']
        self.eval_frequency = meta['eval_frequency'] or meta['log_frequency']
        self.greedy_eval = GreedyEval(env_spec, meta['rigorous_eval'], self.seed)
        # the first mid-run graph a minute in: a shorter session draws its graphs at the end only
        self._last_graph_t = time.monotonic()
        self.checkpoint_frequency = meta['checkpoint_frequency'] or self.log_frequency
        self.keep_checkpoints = meta['keep_checkpoints']
        self.ckpt_dir = run_dir.ckpt_dir(trial, session)
        self.obs = None
        self.resume_record: dict = {}
        self.best_model: dict | None = None  # what model_best.pt holds, kept for snapshots
        self.last_snapshot_frame: int | None = None
        self._verifier = None  # background checksum of a resumed snapshot's arrays
        self.writer = BackgroundWriter()  # the loop's periodic writes, off the training thread
        # at the session's first write, once: the run's resume record to append, the queue to report to (Start)
        self._run_record: dict | None = None
        self._report_to: tuple[Any, int] | None = None
        self.global_nets = None  # meta.distributed: the trial's shared nets (attach_global_nets)

    # --- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything that shapes what happens next, as plain data: each component's state_dict.
        A session of a distributed trial adds the global nets as it reads them ('global')."""
        state = {
            'clock': self.clock.state_dict(),
            'agent': self.agent.state_dict(),
            'body': self.body.state_dict(),
            'env': vector_env_state_dict(self.env),
            'obs': np.array(self.obs),
            'eval_env': self.greedy_eval.state_dict(),
            'best_model': self.best_model,
            'rng': global_rng_state(),
        }
        if self.global_nets is not None:
            state['global'] = self.global_nets.state_dict()
        return state

    def load_state_dict(self, state: dict, quiet: bool = False) -> list[str]:
        """Restore a snapshot's state. Returns why the continuation is approximate (empty when it
        is exact): fresh episodes for an env that cannot be snapshotted mid-episode, a replay
        memory that refills because it was not in the snapshot. Each reason is logged unless quiet."""
        saved_envs = np.shape(state['obs'])[0] if np.ndim(state['obs']) else None
        if saved_envs != self.num_envs:
            raise ValueError(f'the snapshot holds {saved_envs} envs, the spec asks for env.num_envs {self.num_envs}')
        self.clock.load_state_dict(state['clock'])
        self.agent.load_state_dict(state['agent'])
        self.body.load_state_dict(state['body'])
        load_global_rng_state(state['rng'])
        self.greedy_eval.load_state_dict(state['eval_env'])
        self.best_model = snapshot_parts.best_model(state)
        approximate = []
        if load_vector_env_state_dict(self.env, state['env']):
            self.obs = np.array(state['obs'])
        else:
            approximate.append(f'{self.spec["env"]["name"]} cannot be snapshotted mid-episode'
                               f'{approximate_resume_note(self.spec["env"])}: '
                               'fresh episodes start now')
            self.obs, _ = self.env.reset(seed=self.seed + self.clock.frame)
            self.agent.start_fresh_episodes()
        # the agent's replay memory, or a replay an algorithm keeps in its own state (SIL's)
        replay_states = self.agent.replay_states(snapshot_parts.agent_state(state))
        global_state = snapshot_parts.global_state(state)
        if global_state is not None and self.spec['meta'].get('distributed'):  # restored by the trial
            approximate.append(f"meta.distributed '{global_state['mode']}': the sessions update the global "
                               'weights asynchronously, which no snapshot can replay; the global weights come from '
                               "the sessions' newest snapshot")
        if any(isinstance(s, dict) and s.get('persisted') is False for s in replay_states):
            start = self.spec['agent']['algorithm'].get('training_start_step')
            waits = f', and training waits for {start} transitions again' if start else ''
            now = ('from now on it goes into snapshots' if replay_in_snapshots(self.spec['meta']) else
                   'it stays out of snapshots (meta.snapshot_replay: true puts it in)')
            approximate.append('the replay memory was not in the snapshot (meta.snapshot_replay false, or null and '
                               f'left out by the lab: see docs/resume.md): it refills from empty{waits}; {now}')
        if not quiet:
            for reason in approximate:
                logger.warning(f'{self.prename}: {reason}, so this continuation is approximate')
        return approximate

    def attach_global_nets(self, global_nets) -> None:
        """meta.distributed: train the trial's global nets (after any snapshot was loaded)."""
        global_nets.attach(self.agent.algorithm, self.index)
        self.global_nets = global_nets

    def save_snapshot(self, background: bool = False) -> None:
        """Snapshot the whole session state at the current frame and keep the newest few. With
        `background`, a state that holds no live arrays (a replay's) is copied now and written by
        the session's writer thread while training goes on (persistence/background.py)."""
        self.before_write()
        prepared = prepare_snapshot(self.clock.frame, self.state_dict())
        if background and prepared.detached:
            self.writer.submit(self._write_snapshot, prepared)
        else:
            self.writer.wait()
            self._write_snapshot(prepared)

    def _write_snapshot(self, prepared: PreparedSnapshot) -> None:
        path = write_snapshot(self.ckpt_dir, prepared, self.spec)
        # once it is on disk (here, on the writer thread for a queued one): the frame a message may
        # name as the snapshot to continue from (durable_snapshot_frame)
        self.last_snapshot_frame = prepared.frame
        prune_snapshots(self.ckpt_dir, self.keep_checkpoints)
        logger.debug(f'{self.prename}: snapshot {path}')

    def durable_snapshot_frame(self) -> int | None:
        """The frame of the newest snapshot on disk, after the queued writes: the one a message
        tells the user to continue from. A queued write that failed leaves the snapshot before it
        (its error is logged here; the session stops for the reason it was already stopping)."""
        try:
            self.writer.wait()
        except Exception as e:  # noqa: BLE001 (any write error: the message names what is on disk)
            logger.error(f'{self.prename}: a background write failed (the snapshot named is the last one on disk): {e}')
        return self.last_snapshot_frame

    # --- resuming -------------------------------------------------------------------------------
    def resume_from(self, snapshot: Snapshot, approximate: list[str] | None = None, t0: float | None = None) -> None:
        """Continue from a snapshot: load its state (unless the caller loaded it already into this
        session, quietly, and passes the `approximate` reasons load_state_dict returned) and check
        its memory-mapped arrays in the background while the first steps run; the resume is
        recorded (and model_best.pt made consistent with it) only once they are verified, at the
        first write (see before_write). `t0`: perf_counter when reading the snapshot began."""
        self._resume_t0 = time.perf_counter() if t0 is None else t0
        state, manifest, path = snapshot
        if approximate is None:
            approximate = self.load_state_dict(state)
        else:
            for reason in approximate:
                logger.warning(f'{self.prename}: {reason}, so this continuation is approximate')
        self.approximate = approximate
        self.last_snapshot_frame = manifest['frame']
        self.resume_record = {'when': time.strftime('%Y-%m-%dT%H:%M:%S'),
                              'snapshot': str(path.relative_to(self.run_dir.root)), 'frame': manifest['frame'],
                              'load_s': round(time.perf_counter() - self._resume_t0, 3),
                              'lab_version': manifest.get('lab_version'),
                              'exact': not self.approximate, 'approximate': self.approximate}
        self._resume_path = path
        self._verifier = verify_arrays_async(path, manifest)
        logger.info(f'{self.prename}: resumed at frame {self.clock.frame}/{self.clock.max_frame} from snapshot '
                    f'{self.resume_record["snapshot"]} (loaded in {self.resume_record["load_s"]:.2f}s)')

    def before_write(self) -> None:
        """Called before anything is written to the run: after a resume, wait for the snapshot's
        arrays to pass their checksums (DamagedSnapshot when they do not: nothing was written, so
        the session can start again from an older snapshot), then record the resume."""
        if self._verifier is not None:
            verifier, self._verifier = self._verifier, None
            error = verifier.result()
            if error is not None:
                raise DamagedSnapshot(self._resume_path, str(error))
            self.resume_record['verified_s'] = round(time.perf_counter() - self._resume_t0, 3)
            append_json_list(self.run_dir.session_resume_log_path(self.trial, self.index), self.resume_record)
            reconcile_best_model(self.run_dir.model_path(self.trial, self.index, 'best'), self.best_model,
                                 self.clock.frame, bool(self.approximate), self.prename)
        if self._run_record is not None:
            record, self._run_record = self._run_record, None
            append_run_record(self.run_dir, record)
        if self._report_to is not None:
            (queue, index), self._report_to = self._report_to, None
            queue.put(('first_write', index, None))

    # --- the RL loop ----------------------------------------------------------------------------
    def run(self, start: Start = Start()) -> dict:
        """Train until max_frame, fresh or from `start.snapshot` (Start); write the records,
        models, snapshots and graphs. Returns session metrics. On SIGTERM/SIGINT: finish the step,
        save a snapshot and the records, raise Preempted. A loss or gradient that becomes
        non-finite raises TrainingDiverged, with nothing of that step saved. DamagedSnapshot when
        the snapshot's arrays fail their checksums before anything was written (the caller may
        continue from an older one: persistence.snapshots.IntactSnapshots)."""
        self._run_record, self._report_to = start.run_record, start.report_to
        if start.snapshot is None:
            if start.resuming:
                logger.info(f'{self.prename}: no snapshot to resume from (nothing recorded yet); starting fresh')
            if (self.spec['meta'].get('lineage') or {}).get('kind') == 'warm_start':  # the parent's weights
                path = self.run_dir.model_path(self.trial, self.index, 'warm_start')
                load_warm_start(path, self.agent.algorithm.nets())
                logger.info(f'{self.prename}: nets warm-started from {path.name}')
            if start.global_nets is not None:
                self.attach_global_nets(start.global_nets)
            return self._train(resumed=False)
        self.resume_from(start.snapshot, start.approximate, start.t0)
        if start.global_nets is not None:
            self.attach_global_nets(start.global_nets)
            if start.global_nets.restored_from is not None:
                self.resume_record['global_nets_from'] = start.global_nets.restored_from
        if start.skipped:  # damaged snapshots passed over (set aside): which, and what was wrong with each
            self.resume_record['fell_back_from'] = [d['snapshot'] for d in start.skipped]
            self.resume_record['damaged_skipped'] = list(start.skipped)
        return self._train(resumed=True)

    def _train(self, resumed: bool) -> dict:
        """The RL loop of run(), from the state resume_from loaded when `resumed`."""
        clock, agent, body = self.clock, self.agent, self.body
        torch.set_flush_denormal(self.flush_denormal)  # again: another session may have run in this thread
        if not resumed:
            logger.info(f'{self.prename}: start {self.spec["agent"]["algorithm"]["name"]} on '
                        f'{self.spec["env"]["name"]} x{self.num_envs}, max_frame {clock.max_frame}, seed {self.seed}')
            if note := approximate_resume_note(self.spec['env']):
                logger.info(f'{self.prename}: a resume of this run will be approximate{note}')
            self.obs, _ = self.env.reset(seed=self.seed)
            # a snapshot before the first step: a session that recorded anything always has one to
            # continue from, so train@ can tell a crash early in a run from damage
            self.save_snapshot()
        for board in self.boards:
            board.begin(clock.frame)
        env = self.env
        obs = self.obs
        next_log = (clock.frame // self.log_frequency + 1) * self.log_frequency
        next_eval = (clock.frame // self.eval_frequency + 1) * self.eval_frequency
        next_ckpt = (clock.frame // self.checkpoint_frequency + 1) * self.checkpoint_frequency
        dev_params = agent.parameters_snapshot() if self.mode == 'dev' else None
        # a value past float32 (a huge env.reward_scale) is caught as a divergence, not warned about
        numpy_errors = np.seterr(over='ignore')
        try:
            with gc_pause.frozen_heap():  # the objects alive now: not the collector's to walk each time
                while clock.frame < clock.max_frame:
                    try:
                        action = agent.act(obs)
                    except (ValueError, RuntimeError) as e:
                        raise self._diverged_or(e, obs) from None
                    next_obs, reward, terminated, truncated, info = env.step(action)
                    done = np.logical_or(terminated, truncated)
                    n_done = np.count_nonzero(done)  # one count (done.any() and done.sum() were two reductions)
                    true_next_obs = next_obs
                    if n_done:
                        if '_final_obs' in info:  # reset in this step (env.autoreset "same_step")
                            true_next_obs = next_obs.copy()
                            mask = info['_final_obs']
                            true_next_obs[mask] = np.stack(info['final_obs'][mask])
                        body.track_episodes(finished_returns(info, self.whole_games))
                    try:
                        metrics = agent.update(obs, action, reward, true_next_obs, terminated, truncated)
                    except (ValueError, RuntimeError) as e:
                        raise self._diverged_or(e, obs, reward) from None
                    if metrics is not None:
                        if not all(math.isfinite(metrics.get(k, 0.0)) for k in ('loss', 'grad_norm')):
                            raise self._diverged(metrics, inputs=(obs, reward))
                        body.track_update(metrics)
                        if dev_params is not None:
                            self._dev_check_learning(dev_params)
                            dev_params = None
                    clock.tick(n_done)
                    obs = self.obs = next_obs
                    at_end = clock.frame >= clock.max_frame
                    if clock.frame >= next_log or at_end:
                        self.log_row(background=True)
                        next_log = (clock.frame // self.log_frequency + 1) * self.log_frequency
                    if clock.frame >= next_eval or at_end:
                        self.eval_row(background=True)
                        next_eval = (clock.frame // self.eval_frequency + 1) * self.eval_frequency
                    if clock.frame >= next_ckpt or at_end or self.stop.requested:
                        # in line at the end and at a stop: the run's last snapshot is on disk when it ends
                        self.save_snapshot(background=not (at_end or self.stop.requested))
                        next_ckpt = (clock.frame // self.checkpoint_frequency + 1) * self.checkpoint_frequency
                    if self.stop.requested:
                        self.save_records()
                        again = continue_mode(self.spec, self.run_dir)
                        logger.warning(f'{self.prename}: stopped at frame {clock.frame} with a snapshot; '
                                       f'continue with {again}@{self.run_dir.root}')
                        raise Preempted(self.stop.signum, clock.frame)
        finally:
            np.seterr(**numpy_errors)
            self.close()
        return self.finish()

    def _diverged_or(self, error: Exception, *inputs) -> Exception:
        """A torch error met while acting or training (on `inputs`: observations, rewards):
        TrainingDiverged when non-finite values caused it, else the error itself (a bug)."""
        what = nonfinite_cause(self.agent.nonfinite_nets(), inputs, error)
        return error if what is None else self._diverged({}, what)

    def _diverged(self, metrics: dict, what: str | None = None, inputs: tuple = ()) -> TrainingDiverged:
        """The one-line error for a loss, gradient norm (or, given as `what`, any other value
        met in training) that became NaN or infinite; `inputs`: the step's observations and rewards."""
        return diverged_error(self.prename, self.run_dir, self.clock.frame, self.clock.opt_step,
                              self.durable_snapshot_frame(), what or nonfinite_metrics(metrics, inputs))

    def _dev_check_learning(self, before: list[torch.Tensor]) -> None:
        """dev mode: after the first training update some parameter must have changed."""
        after = self.agent.parameters_snapshot()
        if before and all(torch.equal(a, b) for a, b in zip(before, after)):
            raise RuntimeError(f'{self.prename}: dev check failed: no network parameter changed in the first '
                               'training update (is the loss detached from the net, or the learning rate 0?)')
        logger.debug(f'{self.prename}: dev check passed: parameters change in training')

    # --- records --------------------------------------------------------------------------------
    def log_row(self, background: bool = False) -> None:
        row = self.body.train_row(self.clock, self.agent.algorithm)
        self.write_csv('train', background)
        clock = self.clock
        left = (clock.max_frame - clock.frame) / row['fps'] if row['fps'] and row['fps'] > 0 else math.nan
        loss = '-' if math.isnan(row['loss']) else f'{row["loss"]:.4g}'  # '-': no update yet, not a NaN loss
        # persistence/resume.py (LOGGED_ROW) reads '| frame N/M |' back: a run's records deleted, its log still tells
        logger.info(
            f'trial {self.trial} session {self.index} | frame {clock.frame}/{clock.max_frame} | '
            f'fps {row["fps"]:.0f} | epi {clock.epi} | total_reward_ma {row["total_reward_ma"]:.2f} | '
            f'loss {loss} | lr {row["lr"]:.3g} | left {_duration(left)}')

    def eval_row(self, background: bool = False) -> None:
        rows = self.body.train_rows
        if rows and rows[-1]['frame'] == self.clock.frame:  # a train row was just made: same numbers
            row = dict(rows[-1])
        else:
            row = self.body.current_row(self.clock, self.agent.algorithm)
        returns = (self.greedy_eval.returns(self.agent, normalize_obs_fn(self.env), self._stop_during_eval)
                   if self.greedy_eval.episodes else None)
        row = self.body.eval_row(row, returns)
        self.write_csv('eval', background)
        if returns is not None:
            logger.info(f'trial {self.trial} session {self.index} | eval at frame {self.clock.frame}: '
                        f'mean return {row["total_reward"]:.2f} over {len(returns)} episodes, '
                        f'ma {row["total_reward_ma"]:.2f}')
        ma = row['total_reward_ma']
        if not math.isnan(ma) and ma > self.body.best_total_reward_ma:
            self.body.best_total_reward_ma = ma
            self.save_model('best', background)
        self.save_model('latest', background)
        if time.monotonic() - self._last_graph_t > GRAPH_INTERVAL_S:
            self.plot(png=False)

    def _stop_during_eval(self) -> None:
        """A stop signal during an evaluation (rigorous_eval episodes can take minutes) ends the
        session at once, without a snapshot at this frame: one now would record an evaluation
        cut short. The newest snapshot is intact, and train@latest continues from it exactly,
        as after a kill."""
        if self.stop.requested:
            frame = self.durable_snapshot_frame()
            logger.warning(f'{self.prename}: stopped during the evaluation at frame {self.clock.frame}; continue '
                           f'with {continue_mode(self.spec, self.run_dir)}@{self.run_dir.root} from the snapshot at '
                           f'frame {frame}')
            raise Preempted(self.stop.signum, frame, f'during an evaluation at frame {self.clock.frame}; the snapshot '
                                                     f'at frame {frame} is kept')

    def write_csv(self, df_mode: str, background: bool = False) -> None:
        """Rewrite the train or eval CSV; with `background`, by the writer thread (the text is made now)."""
        self.before_write()
        rows = self.body.train_rows if df_mode == 'train' else self.body.eval_rows
        self._write(background, atomic_write_text, self.run_dir.session_df_path(self.trial, self.index, df_mode),
                    rows_to_csv(rows))
        self.sync_boards()  # the boards mirror the records at the same points

    def save_model(self, which: str, background: bool = False) -> None:
        """Weights, optimizer and LR scheduler state to model/{prename}_model_{which}.pt; with
        `background`, a copy of them, by the writer thread."""
        self.before_write()
        state = {**self.agent.model_state_dict(), 'frame': self.clock.frame,
                 'total_reward_ma': self.body.best_total_reward_ma if which == 'best' else self.body.total_reward_ma,
                 'obs_norm': obs_norm_state(self.env)}
        if which == 'best' or background:  # a copy: the live tensors go on training
            state = _clone_state(state)
        if which == 'best':
            self.best_model = state
        self._write(background, save_model_file, self.run_dir.model_path(self.trial, self.index, which), state)

    def _write(self, background: bool, fn, *args) -> None:
        """fn(*args) by the writer thread, or now, after the writes queued before it (the same file
        may be among them: its queued write must not land after this one)."""
        if background:
            self.writer.submit(fn, *args)
        else:
            self.writer.wait()
            fn(*args)

    def plot(self, png: bool) -> None:
        title = f'{self.prename} {self.spec["agent"]["algorithm"]["name"]} {self.spec["env"]["name"]}'
        viz.plot_session(rows_to_df(self.body.train_rows), title,
                         self.run_dir.graph_prefix(self.trial, self.index), png=png)
        self._last_graph_t = time.monotonic()

    def save_records(self) -> None:
        """Rewrite the CSVs, latest weights and the session graph (HTML only)."""
        self.write_csv('train')
        self.write_csv('eval')
        self.save_model('latest')
        self.plot(png=False)

    def finish(self) -> dict:
        """Write session metrics and final graphs; return the metrics. A stop signal during this
        raises Preempted: the final snapshot is saved, and train@ completes what is missing."""
        self.before_write()  # a session resumed at its max_frame records (and verifies) its resume too
        self.sync_boards()
        self.close_boards()
        metrics = write_session_results(self.spec, self.run_dir, self.trial, self.index,
                                        rows_to_df(self.body.train_rows), rows_to_df(self.body.eval_rows),
                                        png=True, stop=self.stop, frame=self.clock.frame)
        s = metrics['eval']['scalar']
        logger.info(f'{self.prename}: done at frame {self.clock.frame} | final_return_ma '
                    f'{fmt_metric(s["final_return_ma"])} | strength {fmt_metric(s["strength"])} | '
                    f'stability {fmt_metric(s["stability"])}')
        return metrics

    def sync_boards(self) -> None:
        """Log the record rows TensorBoard and W&B do not have yet."""
        for board in self.boards:
            board.sync(self.body, self.clock)

    def close_boards(self) -> None:
        """Close the TensorBoard event file and finish the W&B run (again is harmless)."""
        for board in self.boards:
            board.close()

    def close(self) -> None:
        """Finish the queued writes, close the envs, the TensorBoard event file and the W&B run
        (again is harmless)."""
        self.writer.close()
        self.env.close()
        self.close_boards()
        self.greedy_eval.close()


def _clone_state(obj):
    """A deep copy of a state dict whose tensors no longer share storage with live ones."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone_state(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone_state(v) for v in obj)
    return copy.deepcopy(obj)


def _duration(seconds: float) -> str:
    if seconds is None or math.isnan(seconds) or math.isinf(seconds):
        return '?'
    seconds = int(seconds)
    return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'
