"""Session (one agent in one env: the RL loop), Trial (sessions with different seeds)."""
from __future__ import annotations

import copy
import logging
import math
import multiprocessing as mp
import os
import random
import signal
import time

import numpy as np
import pandas as pd
import torch

from slm_lab import checkpoint
from slm_lab.agent import Agent
from slm_lab.agent.body import COLUMNS, Body
from slm_lab.env import Clock, agent_action_space, make_env, make_single_env, normalize_obs_fn, obs_norm_state
from slm_lab.env.snapshot import (env_state_dict, load_env_state_dict, load_vector_env_state_dict,
                                  vector_env_state_dict)
from slm_lab.experiment import analysis, viz
from slm_lab.experiment.run_dir import RunDir
from slm_lab.experiment.signals import STOP_SIGNALS, StopSignal, die_with_parent
from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import LabError, Preempted, ResumeError, TrainingDiverged
from slm_lab.lib.io import append_json_list, atomic_write_text, write_json
from slm_lab.model_file import DamagedModelFile, load_model_file, save_model_file

logger = lab_logger.get_logger('slm_lab.session')
GRAPH_INTERVAL_S = 60.0  # redraw graphs during a session at most this often (and always at the end)



def session_seed(spec: dict, trial: int, session: int) -> int:
    """The seed of session s in trial t: random_seed + 1000 * t + s of the trial's spec. A
    session's own spec (Trial.session_spec, meta.session set) records that seed as its
    random_seed, so it is read from there as it is."""
    meta = spec['meta']
    if meta.get('session') is not None:
        return int(meta['random_seed'])
    return int(meta['random_seed']) + 1000 * trial + session


def set_global_seeds(seed: int) -> None:
    """Seed python, numpy and torch global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _fmt(value) -> str:
    if isinstance(value, float):
        return '' if math.isnan(value) else repr(value)
    return str(value)


def finished_returns(info: dict, whole_games: bool = False) -> np.ndarray:
    """The returns of the episodes that ended in a vector step, from its info: the vector
    RecordEpisodeStatistics' ('episode'), or with env.life_loss_info, where an episode is a life,
    those of the games that ended (LifeLossTermination's 'game_return', in the final step's info)."""
    if not whole_games:
        return info['episode']['r'][info['_episode']]
    final = info.get('final_info') or {}
    if '_game_return' not in final:
        return np.zeros(0)
    return np.asarray(final['game_return'])[final['_game_return']]


def rows_to_csv(rows: list[dict]) -> str:
    """CSV text of record rows (NaN as empty), fast enough to rewrite at every log point."""
    lines = [','.join(COLUMNS)]
    lines += [','.join(_fmt(row[c]) for c in COLUMNS) for row in rows]
    return '\n'.join(lines) + '\n'


def rows_to_df(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(COLUMNS))


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
        set_global_seeds(self.seed)
        self.env = make_env(env_spec, gamma=spec['agent']['algorithm']['gamma'])
        self.num_envs = self.env.num_envs
        self.whole_games = bool(env_spec.get('life_loss_info'))  # an episode is a life; records count games
        self.clock = Clock(env_spec['max_frame'], self.num_envs)
        self.agent = Agent(spec, self.env.single_observation_space, agent_action_space(self.env), self.num_envs,
                           self.clock, self.seed)
        self.body = Body()
        self.log_frequency = meta['log_frequency']
        self.eval_frequency = meta['eval_frequency'] or meta['log_frequency']
        self.rigorous_eval = meta['rigorous_eval']
        self.eval_env = make_single_env(env_spec) if self.rigorous_eval else None
        self._eval_seeded = False
        self._last_graph_t = -math.inf
        self.checkpoint_frequency = meta['checkpoint_frequency'] or self.log_frequency
        self.keep_checkpoints = meta['keep_checkpoints']
        self.ckpt_dir = run_dir.ckpt_dir(trial, session)
        self.obs = None
        self.resume_record: dict = {}
        self.resume_t0 = time.perf_counter()
        self.best_model: dict | None = None  # what model_best.pt holds, kept for snapshots
        self.last_snapshot_frame: int | None = None
        self._verifier = None  # background checksum of a resumed snapshot's arrays
        self._resume_state: dict | None = None
        # called once, at the session's first write: a resumed trial records its resume only then
        self.on_first_write = None
        self.global_nets = None  # meta.distributed: the trial's shared nets (attach_global_nets)

    # --- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything that shapes what happens next, as plain data (see STYLE: state_dict). A
        session of a distributed trial adds the global nets as it reads them ('global')."""
        state = {
            'clock': self.clock.state_dict(),
            'agent': self.agent.state_dict(),
            'body': self.body.state_dict(),
            'env': vector_env_state_dict(self.env),
            'obs': np.array(self.obs),
            'eval_env': {'seeded': self._eval_seeded,
                         'env': env_state_dict(self.eval_env) if self.eval_env is not None else None},
            'best_model': self.best_model,
            'rng': {'python': random.getstate(), 'numpy': np.random.get_state(),
                    'torch': torch.get_rng_state(),
                    'cuda': torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
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
        rng = state['rng']
        random.setstate(_as_tuple(rng['python']))
        np.random.set_state(_as_tuple(rng['numpy']))
        torch.set_rng_state(torch.as_tensor(rng['torch']))
        if rng['cuda'] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng['cuda'])
        self._eval_seeded = state['eval_env']['seeded']
        if self.eval_env is not None and state['eval_env']['env'] is not None:
            load_env_state_dict(self.eval_env, state['eval_env']['env'])
        self.best_model = state.get('best_model')  # absent in snapshots of older lab versions
        approximate = []
        if load_vector_env_state_dict(self.env, state['env']):
            self.obs = np.array(state['obs'])
        else:
            approximate.append(f'{self.spec["env"]["name"]} cannot be snapshotted mid-episode: fresh episodes start '
                               'now')
            self.obs, _ = self.env.reset(seed=self.seed + self.clock.frame)
            self.agent.start_fresh_episodes()
        # the agent's replay memory, or a replay an algorithm keeps in its own state (SIL's)
        replay_states = [state['agent'].get('memory'), *state['agent']['algorithm'].get('extra', {}).values()]
        if state.get('global') is not None and self.spec['meta'].get('distributed'):  # restored by the trial
            approximate.append(f"meta.distributed '{state['global']['mode']}': the sessions update the global "
                               'weights asynchronously, which no snapshot can replay; the global weights come from '
                               "the sessions' newest snapshot")
        if any(isinstance(s, dict) and s.get('persisted') is False for s in replay_states):
            start = self.spec['agent']['algorithm'].get('training_start_step')
            approximate.append('the replay memory was not in the snapshot (meta.snapshot_replay is false): it '
                               f'refills from empty, and training waits for {start} transitions again'
                               if start else 'the replay memory was not in the snapshot (meta.snapshot_replay is '
                               'false): it refills from empty')
        if not quiet:
            for reason in approximate:
                logger.warning(f'{self.prename}: {reason}, so this continuation is approximate')
        return approximate

    def attach_global_nets(self, global_nets) -> None:
        """meta.distributed: train the trial's global nets (after any snapshot was loaded)."""
        global_nets.attach(self.agent.algorithm, self.index)
        self.global_nets = global_nets

    def save_snapshot(self) -> None:
        """Snapshot the whole session state at the current frame and keep the newest few."""
        self.before_write()
        path = checkpoint.save_snapshot(self.ckpt_dir, self.clock.frame, self.state_dict(), self.spec)
        self.last_snapshot_frame = self.clock.frame
        checkpoint.prune_snapshots(self.ckpt_dir, self.keep_checkpoints)
        logger.debug(f'{self.prename}: snapshot {path}')

    # --- resuming -------------------------------------------------------------------------------
    def resume_from(self, state: dict, manifest: dict, path) -> None:
        """Load a snapshot and check its memory-mapped arrays in the background while the first
        steps run; the resume is recorded (and model_best.pt made consistent with it) only once
        they are verified, at the first write (see before_write)."""
        self.approximate = self.load_state_dict(state)
        self.last_snapshot_frame = manifest['frame']
        self.resume_record = {'when': time.strftime('%Y-%m-%dT%H:%M:%S'),
                              'snapshot': str(path.relative_to(self.run_dir.root)), 'frame': manifest['frame'],
                              'load_s': round(time.perf_counter() - self.resume_t0, 3),
                              'lab_version': manifest.get('lab_version'),
                              'exact': not self.approximate, 'approximate': self.approximate}
        self._resume_path = path
        self._verifier = checkpoint.verify_arrays_async(path, manifest)
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
            self.resume_record['verified_s'] = round(time.perf_counter() - self.resume_t0, 3)
            append_json_list(self.run_dir.session_resume_log_path(self.trial, self.index), self.resume_record)
            self._restore_best_model()
        if self.on_first_write is not None:
            callback, self.on_first_write = self.on_first_write, None
            callback()

    def _restore_best_model(self) -> None:
        """Make model_best.pt the best weights as of the snapshot. After a crash, the file may come
        from frames past the snapshot (a future that the resume discards); an exact resume will
        write the same again, an approximate one may never, so that file is kept aside."""
        path = self.run_dir.model_path(self.trial, self.index, 'best')
        if self.best_model is None and not path.exists():
            return
        try:
            disk_frame = load_model_file(path)[0].get('frame') if path.exists() else None
        except DamagedModelFile as e:  # torn, or its bytes changed: replaced from the snapshot, or kept aside
            disk_frame = -1
            if self.best_model is None:
                aside = path.with_name(f'{path.stem}_damaged.pt')
                os.replace(path, aside)
                logger.warning(f'{self.prename}: {e}; kept aside as {aside.name} (the snapshot holds no best weights '
                               'yet, so the next evaluation writes new ones)')
                return
            logger.warning(f'{self.prename}: {e}; written again from the best weights in the snapshot')
        best_frame = self.best_model['frame'] if self.best_model is not None else None
        if disk_frame == best_frame:
            return
        if disk_frame is not None and disk_frame > self.clock.frame and self.approximate:
            aside = path.with_name(f'{path.stem}_discarded_f{disk_frame}.pt')
            os.replace(path, aside)
            logger.warning(f'{self.prename}: {path.name} came from frame {disk_frame}, past the snapshot this resume '
                           f'continues from (frame {self.clock.frame}); kept aside as {aside.name}')
        if self.best_model is not None:
            save_model_file(path, self.best_model)
        elif path.exists() and disk_frame is not None and disk_frame > self.clock.frame:
            os.replace(path, path.with_name(f'{path.stem}_discarded_f{disk_frame}.pt'))

    # --- the RL loop ----------------------------------------------------------------------------
    def run(self, resumed: bool = False) -> dict:
        """Train until max_frame (continuing the state resume_from loaded when `resumed`); write
        the records, models, snapshots and graphs. Returns session metrics. On SIGTERM/SIGINT:
        finish the step, save a snapshot and the records, raise Preempted. A loss or gradient that
        becomes non-finite raises TrainingDiverged, with nothing of that step saved."""
        clock, agent, body = self.clock, self.agent, self.body
        if not resumed:
            logger.info(f'{self.prename}: start {self.spec["agent"]["algorithm"]["name"]} on '
                        f'{self.spec["env"]["name"]} x{self.num_envs}, max_frame {clock.max_frame}, seed {self.seed}')
            self.obs, _ = self.env.reset(seed=self.seed)
            # a snapshot before the first step: a session that recorded anything always has one to
            # continue from, so train@ can tell a crash early in a run from damage
            self.save_snapshot()
        env = self.env
        obs = self.obs
        next_log = (clock.frame // self.log_frequency + 1) * self.log_frequency
        next_eval = (clock.frame // self.eval_frequency + 1) * self.eval_frequency
        next_ckpt = (clock.frame // self.checkpoint_frequency + 1) * self.checkpoint_frequency
        dev_params = agent.parameters_snapshot() if self.mode == 'dev' else None
        try:
            while clock.frame < clock.max_frame:
                try:
                    action = agent.act(obs)
                except (ValueError, RuntimeError) as e:
                    raise self._diverged_or(e, obs) from None
                next_obs, reward, terminated, truncated, info = env.step(action)
                done = np.logical_or(terminated, truncated)
                true_next_obs = next_obs
                if done.any():
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
                        raise self._diverged(metrics)
                    body.track_update(metrics)
                    if dev_params is not None:
                        self._dev_check_learning(dev_params)
                        dev_params = None
                clock.tick(int(done.sum()))
                obs = self.obs = next_obs
                at_end = clock.frame >= clock.max_frame
                if clock.frame >= next_log or at_end:
                    self.log_row()
                    next_log = (clock.frame // self.log_frequency + 1) * self.log_frequency
                if clock.frame >= next_eval or at_end:
                    self.eval_row()
                    next_eval = (clock.frame // self.eval_frequency + 1) * self.eval_frequency
                if clock.frame >= next_ckpt or at_end or self.stop.requested:
                    self.save_snapshot()
                    next_ckpt = (clock.frame // self.checkpoint_frequency + 1) * self.checkpoint_frequency
                if self.stop.requested:
                    self.save_records()
                    logger.warning(f'{self.prename}: stopped at frame {clock.frame} with a snapshot; '
                                   'continue with train@latest')
                    raise Preempted(self.stop.signum, clock.frame)
        finally:
            self.close()
        return self.finish()

    def _diverged_or(self, error: Exception, *inputs) -> Exception:
        """A torch error met while acting or training: TrainingDiverged when non-finite values
        caused it (a net's weights, or the observations or rewards, hold NaN or infinity: e.g.
        a Categorical's logits become NaN after a NaN update, or a huge env.reward_scale makes
        the returns infinite), else the error itself (a bug)."""
        nets = self.agent.nonfinite_nets()
        bad_inputs = [name for name, x in zip(('observations', 'rewards'), inputs) if not _finite_in_float32(x)]
        if not (nets or bad_inputs):
            return error
        what = f'non-finite weights in net(s) {", ".join(nets)}' if nets else \
            f'non-finite {" and ".join(bad_inputs)} from the env (as float32, which training uses)'
        return self._diverged({}, f'{what} (torch refused them with a {type(error).__name__})')

    def _diverged(self, metrics: dict, what: str | None = None) -> TrainingDiverged:
        """The one-line error for a loss, gradient norm (or, given as `what`, any other value
        met in training) that became NaN or infinite."""
        what = what or ', '.join(f'{k} {metrics[k]}' for k in ('loss', 'grad_norm') if k in metrics
                                 and not math.isfinite(metrics[k]))
        run = self.run_dir.root
        if self.last_snapshot_frame is None:
            fix = ('no snapshot was saved before it; start a new run with a changed spec (e.g. a lower '
                   'agent.net.optim_spec.lr or a clip_grad_val)')
        else:
            fix = (f'the snapshot at frame {self.last_snapshot_frame} is intact: continue from it with a changed spec, '
                   f'e.g. python run_lab.py SPEC_FILE {self.run_dir.spec_name} train@{run} '
                   '-s agent.net.optim_spec.lr=<lower> --force')
        return TrainingDiverged(f'{self.prename}: training diverged at frame {self.clock.frame} (opt_step '
                                f'{self.clock.opt_step}): {what}; this step was not saved; {fix}')

    def _dev_check_learning(self, before: list[torch.Tensor]) -> None:
        """dev mode: after the first training update some parameter must have changed."""
        after = self.agent.parameters_snapshot()
        if before and all(torch.equal(a, b) for a, b in zip(before, after)):
            raise RuntimeError(f'{self.prename}: dev check failed: no network parameter changed in the first '
                               'training update (is the loss detached from the net, or the learning rate 0?)')
        logger.debug(f'{self.prename}: dev check passed: parameters change in training')

    # --- records --------------------------------------------------------------------------------
    def log_row(self) -> None:
        row = self.body.train_row(self.clock, self.agent.algorithm)
        self.write_csv('train')
        clock = self.clock
        left = (clock.max_frame - clock.frame) / row['fps'] if row['fps'] and row['fps'] > 0 else math.nan
        logger.info(
            f'trial {self.trial} session {self.index} | frame {clock.frame}/{clock.max_frame} | '
            f'fps {row["fps"]:.0f} | epi {clock.epi} | total_reward_ma {row["total_reward_ma"]:.2f} | '
            f'loss {row["loss"]:.4g} | lr {row["lr"]:.3g} | left {_duration(left)}')

    def eval_row(self) -> None:
        rows = self.body.train_rows
        if rows and rows[-1]['frame'] == self.clock.frame:  # a train row was just made: same numbers
            row = dict(rows[-1])
        else:
            row = self.body.current_row(self.clock, self.agent.algorithm)
        returns = self.run_eval() if self.rigorous_eval else None
        row = self.body.eval_row(row, returns)
        self.write_csv('eval')
        if returns is not None:
            logger.info(f'trial {self.trial} session {self.index} | eval at frame {self.clock.frame}: '
                        f'mean return {row["total_reward"]:.2f} over {len(returns)} episodes, '
                        f'ma {row["total_reward_ma"]:.2f}')
        ma = row['total_reward_ma']
        if not math.isnan(ma) and ma > self.body.best_total_reward_ma:
            self.body.best_total_reward_ma = ma
            self.save_model('best')
        self.save_model('latest')
        if time.monotonic() - self._last_graph_t > GRAPH_INTERVAL_S:
            self.plot(png=False)

    def run_eval(self) -> list[float]:
        """rigorous_eval episodes of greedy play on the eval env; their returns."""
        normalize = normalize_obs_fn(self.env)
        returns = []
        for _ in range(self.rigorous_eval):
            if not self._eval_seeded:
                obs, _ = self.eval_env.reset(seed=self.seed + 10**6)
                self._eval_seeded = True
            else:
                obs, _ = self.eval_env.reset()
            total, done = 0.0, False
            self.agent.start_greedy_episode()
            while not done:
                o = obs[None].astype(np.float32)
                action = self.agent.act_greedy(normalize(o) if normalize else o)[0]
                obs, reward, terminated, truncated, _ = self.eval_env.step(action)
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
        return returns

    def write_csv(self, df_mode: str) -> None:
        self.before_write()
        rows = self.body.train_rows if df_mode == 'train' else self.body.eval_rows
        atomic_write_text(self.run_dir.session_df_path(self.trial, self.index, df_mode), rows_to_csv(rows))

    def save_model(self, which: str) -> None:
        """Weights, optimizer and LR scheduler state to model/{prename}_model_{which}.pt."""
        self.before_write()
        state = {**self.agent.model_state_dict(), 'frame': self.clock.frame,
                 'total_reward_ma': self.body.best_total_reward_ma if which == 'best' else self.body.total_reward_ma,
                 'obs_norm': obs_norm_state(self.env)}
        if which == 'best':  # a copy: the live tensors go on training
            state = _clone_state(state)
            self.best_model = state
        save_model_file(self.run_dir.model_path(self.trial, self.index, which), state)

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
        metrics = write_session_results(self.spec, self.run_dir, self.trial, self.index,
                                        rows_to_df(self.body.train_rows), rows_to_df(self.body.eval_rows),
                                        png=True, stop=self.stop, frame=self.clock.frame)
        s = metrics['eval']['scalar']
        logger.info(f'{self.prename}: done at frame {self.clock.frame} | final_return_ma {_num(s["final_return_ma"])}'
                    f' | strength {_num(s["strength"])} | stability {_num(s["stability"])}')
        return metrics

    def close(self) -> None:
        """Close the envs (again is harmless)."""
        self.env.close()
        if self.eval_env is not None:
            self.eval_env.close()


class DamagedSnapshot(Exception):
    """A resumed snapshot's memory-mapped arrays failed their checksum before anything was written."""

    def __init__(self, path, message: str):
        super().__init__(message)
        self.path = path


def _clone_state(obj):
    """A deep copy of a state dict whose tensors no longer share storage with live ones."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone_state(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone_state(v) for v in obj)
    return copy.deepcopy(obj)


def _check_stop(stop: StopSignal | None, frame: int | None) -> None:
    if stop is not None and stop.requested:
        raise Preempted(stop.signum, frame)


def write_session_results(spec: dict, run_dir: RunDir, trial: int, session: int, train_df: pd.DataFrame,
                          eval_df: pd.DataFrame, png: bool, stop: StopSignal | None = None,
                          frame: int | None = None) -> dict:
    """The final files of a session: metrics JSON and graph. Raises Preempted between writes when
    a stop signal arrived (each file is atomic, so what is written is whole)."""
    rand_return = analysis.random_baseline(spec['env'])
    metrics = {
        'eval': analysis.calc_session_metrics(eval_df, rand_return),
        'train': analysis.calc_session_metrics(train_df, rand_return),
        'random_baseline': rand_return,
    }
    _check_stop(stop, frame)
    write_json(run_dir.session_metrics_path(trial, session), metrics)
    _check_stop(stop, frame)
    title = f'{run_dir.prename(trial, session)} {spec["agent"]["algorithm"]["name"]} {spec["env"]["name"]}'
    viz.plot_session(train_df, title, run_dir.graph_prefix(trial, session), png=png)
    _check_stop(stop, frame)
    return metrics


def write_trial_results(spec: dict, run_dir: RunDir, trial: int, max_session: int, session_metrics: list[dict],
                        stop: StopSignal | None = None, frame: int | None = None) -> dict:
    """The final files of a trial: metrics JSON and graph, from its sessions' metrics and records."""
    metrics = analysis.calc_trial_metrics([m['eval'] for m in session_metrics])
    _check_stop(stop, frame)
    write_json(run_dir.trial_metrics_path(trial), metrics)
    _check_stop(stop, frame)
    dfs = [pd.read_csv(run_dir.session_df_path(trial, s, 'eval')) for s in range(max_session)]
    viz.plot_trial(dfs, f'{run_dir.prename(trial)} {spec["agent"]["algorithm"]["name"]} {spec["env"]["name"]}',
                   run_dir.graph_prefix(trial), png=True)
    _check_stop(stop, frame)
    return metrics


def complete_finished_run(spec: dict, run_dir: RunDir, trial: int = 0) -> list[str]:
    """Write the final files a finished run lacks (a stop signal arrived while they were written),
    from its records. Returns the names of the files written."""
    from slm_lab.lib.io import read_json
    written, session_metrics = [], []
    n = spec['meta']['max_session']
    for s in range(n):
        metrics_path = run_dir.session_metrics_path(trial, s)
        graph_path = f'{run_dir.graph_prefix(trial, s)}_session_graph.html'
        try:
            metrics = read_json(metrics_path) if os.path.exists(graph_path) else None
        except (OSError, ValueError):
            metrics = None
        if not isinstance(metrics, dict) or 'eval' not in metrics:
            dfs = {m: pd.read_csv(run_dir.session_df_path(trial, s, m)) for m in ('train', 'eval')}
            metrics = write_session_results(spec, run_dir, trial, s, dfs['train'], dfs['eval'], png=True)
            written += [metrics_path.name, os.path.basename(graph_path)]
        session_metrics.append(metrics)
    trial_graph = f'{run_dir.graph_prefix(trial)}_trial_graph.html'
    if not (run_dir.trial_metrics_path(trial).exists() and os.path.exists(trial_graph)):
        write_trial_results(spec, run_dir, trial, n, session_metrics)
        written += [run_dir.trial_metrics_path(trial).name, os.path.basename(trial_graph)]
    return written


def _finite_in_float32(x) -> bool:
    """Whether every number of `x` is finite once in float32 (1e300 is not: it becomes inf)."""
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
        return True
    with np.errstate(over='ignore'):
        return bool(np.isfinite(x.astype(np.float32)).all())


def _as_tuple(x):
    """Random-state tuples come back from a snapshot as lists or tuples; make them tuples."""
    return tuple(_as_tuple(v) if isinstance(v, list) else v for v in x)


def _num(x) -> str:
    return 'n/a' if x is None else f'{x:.2f}'


def _duration(seconds: float) -> str:
    if seconds is None or math.isnan(seconds) or math.isinf(seconds):
        return '?'
    seconds = int(seconds)
    return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'


def run_session(spec: dict, run_dir: RunDir, mode: str, trial: int, session: int, log_level: int,
                resume: bool = False, stop: StopSignal | None = None, global_nets=None,
                on_first_write=None) -> dict:
    """Run one session with its own log file (in-process, or as a child process). With `resume`,
    continue from the session's newest intact snapshot (a session without one starts fresh: the
    lab has checked that it recorded nothing). When a snapshot's arrays turn out damaged before
    anything was written, the session starts again from the next older intact snapshot.
    `global_nets`: the trial's shared nets of meta.distributed, which the session trains.
    `on_first_write`: called once, just before the session first writes to the run (a resumed
    session's snapshot has then passed its checks)."""
    lab_logger.setup_console(log_level)
    handler = lab_logger.add_file_handler(str(run_dir.log_path(trial, session)), level=log_level)
    own_stop = stop is None
    stop = (stop or StopSignal()).install() if own_stop else stop
    damaged: list = []  # snapshots whose arrays failed their checksums, not yet set aside
    try:
        while True:
            t0 = time.perf_counter()
            sess = Session(spec, run_dir, mode, trial, session, stop=stop)
            sess.on_first_write = on_first_write
            loaded = checkpoint.load_latest_snapshot(sess.ckpt_dir, skip=damaged) if resume else None
            if loaded is None:
                if damaged:  # each failed before anything was written, and none is deleted
                    raise ResumeError(f'{sess.prename}: the arrays of snapshot {damaged[-1]} are damaged and no older '
                                      'intact snapshot is left; nothing of this session was written or deleted: '
                                      'start a new run (SPEC_FILE SPEC_NAME train)')
                if resume:
                    logger.info(f'{sess.prename}: no snapshot to resume from (nothing recorded yet); starting fresh')
                try:
                    if global_nets is not None:
                        sess.attach_global_nets(global_nets)
                    return sess.run()
                finally:
                    sess.close()
            sess.resume_t0 = t0
            fell_back_from = []
            while damaged:  # an older intact snapshot was found: now the damaged ones can go aside
                fell_back_from.append(damaged[-1].name)
                aside = checkpoint.set_aside_damaged(damaged.pop())
                logger.warning(f'{sess.prename}: the damaged snapshot is kept as {aside.name}')
            try:
                sess.resume_from(*loaded)
                if global_nets is not None:
                    sess.attach_global_nets(global_nets)
                    if global_nets.restored_from is not None:
                        sess.resume_record['global_nets_from'] = global_nets.restored_from
                if fell_back_from:
                    sess.resume_record['fell_back_from'] = fell_back_from  # snapshots with damaged arrays
                return sess.run(resumed=True)
            except DamagedSnapshot as e:
                logger.warning(f'{sess.prename}: {e}; nothing was written: starting again from the previous '
                               'snapshot')
                damaged.append(e.path)
            finally:
                sess.close()
    finally:
        if own_stop:
            stop.uninstall()
        lab_logger.remove_handler(handler)


def _session_worker(args, queue, lab_pid: int, global_nets=None, report_first_write: bool = False) -> None:
    # own process group: a terminal's Ctrl-C reaches only the lab process, which asks each
    # session to stop exactly once
    os.setpgrp()
    die_with_parent()
    if os.getppid() != lab_pid:  # the lab died while this process started: the death signal missed it
        os._exit(1)
    session = args[4]
    stop = StopSignal().install()
    # the lab started this process with stop signals blocked (so a Ctrl-C to the terminal's
    # process group during start-up cannot kill it half-made); a pending one is handled now
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    queue.put(('started', session, None))  # from now on a SIGTERM from the lab is handled
    try:
        first_write = (lambda: queue.put(('first_write', session, None))) if report_first_write else None
        queue.put(('ok', session, run_session(*args, stop=stop, global_nets=global_nets,
                                              on_first_write=first_write)))
    except Preempted as e:
        queue.put(('preempted', session, (e.signum, e.frame)))
    except LabError as e:  # a user-facing error (diverged, disk full, ...): the lab prints its line
        queue.put(('lab_error', session, (type(e).__name__, str(e))))
    except BaseException as e:  # report to the parent, which re-raises
        import traceback
        queue.put(('error', session, f'{type(e).__name__}: {e}\n{traceback.format_exc()}'))


class Trial:
    """max_session sessions of one spec with seeds random_seed + 1000*trial + s; sessions run in
    parallel processes when there are several. Aggregates their metrics and graphs. With
    meta.distributed and several sessions, the sessions train one set of global nets together
    (experiment/distributed.py), each for its share of env.max_frame."""

    def __init__(self, spec: dict, run_dir: RunDir, mode: str = 'train', trial: int = 0, resume: bool = False,
                 on_resumed=None):
        """`on_resumed`: with `resume`, called once when the first session is about to write to the
        run (its snapshot loaded and verified, or its fresh start made): the resume has happened,
        so the lab records it then, not when a try that fails earlier began."""
        self.spec, self.run_dir, self.mode, self.index = spec, run_dir, mode, trial
        self.resume = resume
        self._on_resumed = on_resumed
        self.max_session = 1 if mode == 'dev' else spec['meta']['max_session']
        self.log_level = logging.DEBUG if mode == 'dev' else logging.INFO
        # one session alone trains exactly as without meta.distributed: it runs in-process as one
        self.distributed = (spec['meta'].get('distributed') or False) if self.max_session > 1 else False

    def session_spec(self, session: int | None) -> dict:
        """The spec of the trial (session None) or of one of its sessions, as the run directory
        saves it. As in SLM-Lab, a session's spec records the seed that session used as
        meta.random_seed; with meta.max_session 1 it is a spec that repeats that session alone
        (the first session of a run uses random_seed itself). The trial's spec keeps the base seed."""
        spec = copy.deepcopy(self.spec)
        meta = spec['meta']
        meta['trial'], meta['session'] = self.index, session
        if session is not None:
            meta['random_seed'] = session_seed(self.spec, self.index, session)
            meta['max_session'] = 1
            if meta.get('distributed'):
                # as SLM-Lab: each session runs its share of the frames (the records count each
                # session's own); the global nets are in CPU shared memory, so the nets are on the CPU
                from slm_lab.spec import session_max_frame
                spec['env']['max_frame'] = session_max_frame(self.spec, self.max_session)
                if self.distributed and spec['agent'].get('net'):
                    spec['agent']['net']['gpu'] = False
        return spec

    def run(self) -> dict:
        """Run every session, then write the trial metrics and graph. Returns trial metrics.
        Raises Preempted when stopped by a signal (after every session saved a snapshot)."""
        specs = [self.session_spec(s) for s in range(self.max_session)]
        stop = StopSignal().install()
        try:
            if self.max_session == 1:
                session_metrics = [run_session(specs[0], self.run_dir, self.mode, self.index, 0, self.log_level,
                                               self.resume, stop, on_first_write=self._first_write)]
            else:
                global_nets = self.global_nets(specs[0]) if self.distributed else None
                session_metrics = self._run_parallel(specs, stop, global_nets)
            return self.finish(session_metrics, stop)  # a stop signal here ends the run resumable
        finally:
            stop.uninstall()

    def _first_write(self) -> None:
        """A session is about to write to the run: report a resume once (see __init__)."""
        if self._on_resumed is not None:
            callback, self._on_resumed = self._on_resumed, None
            callback()

    def global_nets(self, spec: dict):
        """meta.distributed: the global nets, built from session 0's spec in this process and
        put in shared memory; when resuming, with the global state of the sessions' newest snapshot."""
        from slm_lab.experiment.distributed import GlobalNets, newest_global_state
        mode = self.spec['meta']['distributed']
        restored = None
        if self.resume:
            restored = newest_global_state([self.run_dir.ckpt_dir(self.index, s) for s in range(self.max_session)])
            if restored:  # named as the session's resume record names its own snapshot
                restored[1]['snapshot'] = os.path.relpath(restored[1]['snapshot'], self.run_dir.root)
        sess = Session(spec, self.run_dir, self.mode, self.index, 0)
        try:
            global_nets = GlobalNets.build(mode, sess.agent.algorithm, *(restored or (None, None)),
                                           n_sessions=self.max_session)
        finally:
            sess.close()
        if restored:
            logger.info(f'trial {self.index}: global nets ({mode}) restored from {restored[1]["snapshot"]} '
                        f'({restored[1]["updates"]} updates)')
        else:
            logger.info(f'trial {self.index}: global nets ({mode}) {", ".join(global_nets.nets) or "(none)"} for '
                        f'{self.max_session} sessions of {spec["env"]["max_frame"]} frames each')
        return global_nets

    def _run_parallel(self, specs: list[dict], stop: StopSignal, global_nets=None) -> list[dict]:
        """Run each session in its own process, at most `resources.session_pool_width()` (the CPU
        cores) alive at once; the next starts when one ends. SLM-Lab starts them all together,
        which with more sessions than cores only makes each slower while all of them hold their
        memory at once (1000 sessions: 1000 processes). The sessions of a distributed trial
        (`global_nets`) do start all together, as SLM-Lab's: they are the workers of one training.
        On a stop signal the started sessions are asked to stop once (each saves a snapshot) and
        the ones not started yet count as stopped; a failing session stops the others. Returns the
        session metrics in session order."""
        from queue import Empty

        from slm_lab import resources
        ctx = mp.get_context('spawn')
        queue = ctx.Queue()
        width = len(specs) if global_nets is not None else min(len(specs), resources.session_pool_width())
        if width < len(specs):
            logger.info(f'trial {self.index}: {len(specs)} sessions, {width} at a time (one per CPU core)')
        waiting = list(range(len(specs)))  # not started yet, in session order
        procs: dict[int, mp.process.BaseProcess] = {}
        results: dict[int, dict] = {}
        preempted, errors, lab_errors, killed = [], [], [], []
        started, signalled, ended = set(), set(), set()  # ended: its outcome is known

        def launch(s: int) -> None:
            # not a daemon: a daemon may not start processes, and an async vector env is made of
            # them; the session still dies with the lab (PR_SET_PDEATHSIG) and is joined below
            proc = ctx.Process(target=_session_worker,
                               args=((specs[s], self.run_dir, self.mode, self.index, s, self.log_level, self.resume),
                                     queue, os.getpid(), global_nets, self._on_resumed is not None))
            previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # inherited by the child
            try:
                proc.start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)
            procs[s] = proc

        def stopped_before_starting(s: int) -> None:  # nothing to save: stopped, not failed
            preempted.append((stop.signum, None))
            ended.add(s)

        try:
            while len(ended) < len(specs):
                if stop.requested:
                    for s in waiting:
                        stopped_before_starting(s)
                    waiting.clear()
                    for s, p in procs.items():
                        if s in signalled or s in ended or not p.is_alive():
                            continue
                        if s in started:  # it saves a snapshot and reports 'preempted'
                            os.kill(p.pid, stop.signum)  # the signal the lab got, so its log names it
                        else:  # still starting up: nothing to save yet
                            p.kill()
                            stopped_before_starting(s)
                        signalled.add(s)
                    if len(ended) >= len(specs):
                        break
                while waiting and not stop.requested and sum(p.is_alive() for p in procs.values()) < width:
                    launch(waiting.pop(0))
                try:
                    status, s, payload = queue.get(timeout=0.2)
                except Empty:
                    for s, p in procs.items():
                        # dead first, then nothing queued: a report is in the pipe before its sender exits
                        if s not in ended and not p.is_alive() and queue.empty():
                            if stop.requested:
                                stopped_before_starting(s)
                                continue
                            if p.exitcode is not None and p.exitcode < 0:  # killed by a signal it cannot catch
                                killed.append((s, -p.exitcode))
                            else:
                                errors.append(f'session {s} process died without reporting (exit code {p.exitcode})')
                            ended.add(s)
                            stop.signum = stop.signum or signal.SIGTERM  # stop the others cleanly
                    continue
                if status == 'started':
                    started.add(s)
                    continue
                if status == 'first_write':
                    self._first_write()
                    continue
                if s in ended:  # killed while starting up and already counted as stopped
                    continue
                ended.add(s)
                if status == 'ok':
                    results[s] = payload
                elif status == 'preempted':
                    preempted.append(payload)
                elif status == 'lab_error':
                    lab_errors.append(payload)
                    stop.signum = stop.signum or signal.SIGTERM  # stop the others cleanly
                else:
                    errors.append(f'session {s} failed: {payload}')
                    stop.signum = stop.signum or signal.SIGTERM  # stop the others cleanly
        finally:
            for p in procs.values():
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
        if errors:
            raise RuntimeError('; '.join(errors))
        if killed:
            from slm_lab.lib.errors import SessionKilled
            s, signum = killed[0]
            try:
                name = signal.Signals(signum).name
            except ValueError:
                name = f'signal {signum}'
            why = ' (kill -9, or the out-of-memory killer: see `dmesg`)' if signum == signal.SIGKILL else ''
            raise SessionKilled(f'session {s} was killed by {name}{why} at some frame after its last snapshot; '
                                'the other sessions stopped with snapshots; continue with train@latest', signum)
        if lab_errors:
            from slm_lab.lib import errors as lab_errors_module
            name, message = lab_errors[0]
            cls = getattr(lab_errors_module, name, LabError)
            raise (cls if isinstance(cls, type) and issubclass(cls, LabError) else LabError)(message)
        if preempted:
            frames = [f for _, f in preempted if f is not None]
            if frames:
                raise Preempted(stop.signum or preempted[0][0], min(frames))
            raise Preempted(stop.signum or preempted[0][0], None,
                            f'with {len(results)} session(s) finished and {len(preempted)} not started yet '
                            '(they start with train@latest)' if results else None)
        return [results[s] for s in range(len(specs))]

    def finish(self, session_metrics: list[dict], stop: StopSignal | None = None) -> dict:
        """Write the trial metrics and graph; Preempted when a stop signal arrives meanwhile."""
        metrics = write_trial_results(self.spec, self.run_dir, self.index, len(session_metrics), session_metrics,
                                      stop, self.spec['env']['max_frame'])
        s = metrics['scalar']
        logger.info(f'trial {self.index}: {len(session_metrics)} session(s) | final_return_ma '
                    f'{_num(s.get("final_return_ma"))} | strength {_num(s.get("strength"))} | '
                    f'consistency {_num(s.get("consistency"))}')
        return metrics
