"""Session (one agent in one env: the RL loop), Trial (sessions with different seeds)."""
from __future__ import annotations

import copy
import logging
import math
import multiprocessing as mp
import random
import time

import numpy as np
import pandas as pd
import torch

from slm_lab.agent import Agent
from slm_lab.agent.body import COLUMNS, Body
from slm_lab.env import Clock, make_env, make_single_env, normalize_obs_fn
from slm_lab.experiment import analysis, viz
from slm_lab.experiment.run_dir import RunDir
from slm_lab.lib import logger as lab_logger
from slm_lab.lib.io import atomic_write_text, atomic_write_with, write_json

logger = lab_logger.get_logger('slm_lab.session')
GRAPH_INTERVAL_S = 60.0  # redraw graphs during a session at most this often (and always at the end)


def session_seed(spec: dict, trial: int, session: int) -> int:
    """The seed of session s in trial t: random_seed + 1000 * t + s."""
    return int(spec['meta']['random_seed']) + 1000 * trial + session


def set_global_seeds(seed: int) -> None:
    """Seed python, numpy and torch global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _fmt(value) -> str:
    if isinstance(value, float):
        return '' if math.isnan(value) else repr(value)
    return str(value)


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

    def __init__(self, spec: dict, run_dir: RunDir, mode: str = 'train', trial: int = 0, session: int = 0):
        self.spec = spec
        self.run_dir, self.mode = run_dir, mode
        self.trial, self.index = trial, session
        self.prename = run_dir.prename(trial, session)
        meta, env_spec = spec['meta'], spec['env']
        self.seed = session_seed(spec, trial, session)
        torch.set_num_threads(meta['torch_num_threads'])
        set_global_seeds(self.seed)
        self.env = make_env(env_spec)
        self.num_envs = self.env.num_envs
        self.clock = Clock(env_spec['max_frame'], self.num_envs)
        self.agent = Agent(spec, self.env.single_observation_space, self.env.single_action_space, self.num_envs,
                           self.clock, self.seed)
        self.body = Body()
        self.log_frequency = meta['log_frequency']
        self.eval_frequency = meta['eval_frequency'] or meta['log_frequency']
        self.rigorous_eval = meta['rigorous_eval']
        self.eval_env = make_single_env(env_spec) if self.rigorous_eval else None
        self._eval_seeded = False
        self._last_graph_t = -math.inf

    # --- the RL loop ----------------------------------------------------------------------------
    def run(self) -> dict:
        """Train until max_frame; write the records, models and graphs. Returns session metrics."""
        clock, agent, body, env = self.clock, self.agent, self.body, self.env
        logger.info(f'{self.prename}: start {self.spec["agent"]["algorithm"]["name"]} on {self.spec["env"]["name"]}'
                    f' x{self.num_envs}, max_frame {clock.max_frame}, seed {self.seed}')
        obs, _ = env.reset(seed=self.seed)
        normalize = normalize_obs_fn(env)
        next_log = (clock.frame // self.log_frequency + 1) * self.log_frequency
        next_eval = (clock.frame // self.eval_frequency + 1) * self.eval_frequency
        dev_params = agent.parameters_snapshot() if self.mode == 'dev' else None
        try:
            while clock.frame < clock.max_frame:
                action = agent.act(obs)
                next_obs, reward, terminated, truncated, info = env.step(action)
                done = np.logical_or(terminated, truncated)
                true_next_obs = next_obs
                if done.any():
                    true_next_obs = next_obs.copy()
                    mask = info['_final_obs']
                    final = np.stack(info['final_obs'][mask])
                    true_next_obs[mask] = normalize(final) if normalize else final
                    body.track_episodes(info['episode']['r'][info['_episode']])
                metrics = agent.update(obs, action, reward, true_next_obs, terminated, truncated)
                if metrics is not None:
                    body.track_update(metrics)
                    if dev_params is not None:
                        self._dev_check_learning(dev_params)
                        dev_params = None
                clock.tick(int(done.sum()))
                obs = next_obs
                if clock.frame >= next_log or clock.frame >= clock.max_frame:
                    self.log_row()
                    next_log = (clock.frame // self.log_frequency + 1) * self.log_frequency
                if clock.frame >= next_eval or clock.frame >= clock.max_frame:
                    self.eval_row()
                    next_eval = (clock.frame // self.eval_frequency + 1) * self.eval_frequency
        except KeyboardInterrupt:
            logger.warning(f'{self.prename}: interrupted at frame {clock.frame}; saving records')
            self.save_records(final=True)
            raise
        finally:
            self.close()
        return self.finish()

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
            while not done:
                o = obs[None].astype(np.float32)
                action = self.agent.act_greedy(normalize(o) if normalize else o)[0]
                obs, reward, terminated, truncated, _ = self.eval_env.step(action)
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
        return returns

    def write_csv(self, df_mode: str) -> None:
        rows = self.body.train_rows if df_mode == 'train' else self.body.eval_rows
        atomic_write_text(self.run_dir.session_df_path(self.trial, self.index, df_mode), rows_to_csv(rows))

    def save_model(self, which: str) -> None:
        """Weights, optimizer and LR scheduler state to model/{prename}_model_{which}.pt."""
        state = {**self.agent.model_state_dict(), 'frame': self.clock.frame,
                 'total_reward_ma': self.body.best_total_reward_ma if which == 'best' else self.body.total_reward_ma}
        atomic_write_with(self.run_dir.model_path(self.trial, self.index, which), lambda tmp: torch.save(state, tmp))

    def plot(self, png: bool) -> None:
        title = f'{self.prename} {self.spec["agent"]["algorithm"]["name"]} {self.spec["env"]["name"]}'
        viz.plot_session(rows_to_df(self.body.train_rows), title,
                         self.run_dir.graph_prefix(self.trial, self.index), png=png)
        self._last_graph_t = time.monotonic()

    def save_records(self, final: bool = False) -> None:
        self.write_csv('train')
        self.write_csv('eval')
        self.save_model('latest')
        if final:
            self.plot(png=False)

    def finish(self) -> dict:
        """Write session metrics and final graphs; return the metrics."""
        rand_return = analysis.random_baseline(self.spec['env']['name'])
        metrics = {
            'eval': analysis.calc_session_metrics(rows_to_df(self.body.eval_rows), rand_return),
            'train': analysis.calc_session_metrics(rows_to_df(self.body.train_rows), rand_return),
            'random_baseline': rand_return,
        }
        write_json(self.run_dir.session_metrics_path(self.trial, self.index), metrics)
        self.plot(png=True)
        s = metrics['eval']['scalar']
        logger.info(f'{self.prename}: done at frame {self.clock.frame} | final_return_ma {_num(s["final_return_ma"])}'
                    f' | strength {_num(s["strength"])} | stability {_num(s["stability"])}')
        return metrics

    def close(self) -> None:
        self.env.close()
        if self.eval_env is not None:
            self.eval_env.close()


def _num(x) -> str:
    return 'n/a' if x is None else f'{x:.2f}'


def _duration(seconds: float) -> str:
    if seconds is None or math.isnan(seconds) or math.isinf(seconds):
        return '?'
    seconds = int(seconds)
    return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'


def run_session(spec: dict, run_dir: RunDir, mode: str, trial: int, session: int, log_level: int) -> dict:
    """Run one session with its own log file (used in-process and as a child process)."""
    lab_logger.setup_console(log_level)
    handler = lab_logger.add_file_handler(str(run_dir.log_path(trial, session)), level=log_level)
    try:
        return Session(spec, run_dir, mode, trial, session).run()
    finally:
        lab_logger.remove_handler(handler)


def _session_worker(args, queue) -> None:
    try:
        queue.put(('ok', args[4], run_session(*args)))
    except KeyboardInterrupt:
        queue.put(('interrupted', args[4], None))
    except BaseException as e:  # report to the parent, which re-raises
        import traceback
        queue.put(('error', args[4], f'{type(e).__name__}: {e}\n{traceback.format_exc()}'))


class Trial:
    """max_session sessions of one spec with seeds random_seed + 1000*trial + s; sessions run in
    parallel processes when there are several. Aggregates their metrics and graphs."""

    def __init__(self, spec: dict, run_dir: RunDir, mode: str = 'train', trial: int = 0):
        self.spec, self.run_dir, self.mode, self.index = spec, run_dir, mode, trial
        self.max_session = 1 if mode == 'dev' else spec['meta']['max_session']
        self.log_level = logging.DEBUG if mode == 'dev' else logging.INFO

    def session_spec(self, session: int) -> dict:
        spec = copy.deepcopy(self.spec)
        spec['meta']['trial'], spec['meta']['session'] = self.index, session
        return spec

    def run(self) -> dict:
        """Run every session, then write the trial metrics and graph. Returns trial metrics."""
        specs = [self.session_spec(s) for s in range(self.max_session)]
        if self.max_session == 1:
            session_metrics = [run_session(specs[0], self.run_dir, self.mode, self.index, 0, self.log_level)]
        else:
            session_metrics = self._run_parallel(specs)
        return self.finish(session_metrics)

    def _run_parallel(self, specs: list[dict]) -> list[dict]:
        ctx = mp.get_context('spawn')
        queue = ctx.Queue()
        procs = [ctx.Process(target=_session_worker, daemon=True,
                             args=((spec, self.run_dir, self.mode, self.index, s, self.log_level), queue))
                 for s, spec in enumerate(specs)]
        for p in procs:
            p.start()
        results: dict[int, dict] = {}
        try:
            for _ in procs:
                status, s, payload = queue.get()
                if status == 'error':
                    raise RuntimeError(f'session {s} failed: {payload}')
                if status == 'interrupted':
                    raise KeyboardInterrupt
                results[s] = payload
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.terminate()
        return [results[s] for s in range(len(specs))]

    def finish(self, session_metrics: list[dict]) -> dict:
        metrics = analysis.calc_trial_metrics([m['eval'] for m in session_metrics])
        write_json(self.run_dir.trial_metrics_path(self.index), metrics)
        dfs = [pd.read_csv(self.run_dir.session_df_path(self.index, s, 'eval')) for s in range(len(session_metrics))]
        viz.plot_trial(dfs, f'{self.run_dir.prename(self.index)} {self.spec["agent"]["algorithm"]["name"]} '
                       f'{self.spec["env"]["name"]}', self.run_dir.graph_prefix(self.index), png=True)
        s = metrics['scalar']
        logger.info(f'trial {self.index}: {len(session_metrics)} session(s) | final_return_ma '
                    f'{_num(s.get("final_return_ma"))} | strength {_num(s.get("strength"))} | '
                    f'consistency {_num(s.get("consistency"))}')
        return metrics
