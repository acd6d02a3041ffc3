"""meta.rigorous_eval: at each eval point, that many episodes of greedy play on an env of the
session's own, apart from the training envs (their episodes and their random state untouched).
Resumable: its state_dict holds whether its env was seeded yet and the env's own state, so a
continued run plays the same evaluation episodes as the run that never stopped."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from slm_lab.env import make_single_env
from slm_lab.persistence.env_state import env_state_dict, load_env_state_dict

EVAL_SEED_OFFSET = 10**6  # the eval env's seed: the session's + this (never a training env's)


class GreedyEval:
    def __init__(self, env_spec: dict, episodes: int, seed: int):
        self.episodes = episodes
        self.env = make_single_env(env_spec) if episodes else None
        self.seed = seed + EVAL_SEED_OFFSET
        self.seeded = False  # the first reset seeds the env; the later ones continue its random state

    def returns(self, agent, normalize: Callable | None, check_stop: Callable[[], None]) -> list[float]:
        """The episodes' returns, the agent acting greedily on observations normalised as the
        training envs' (`normalize`, None: as they come). `check_stop()` is called before each
        episode and after each step: it raises to end the evaluation."""
        returns = []
        for _ in range(self.episodes):
            check_stop()
            if not self.seeded:
                obs, _ = self.env.reset(seed=self.seed)
                self.seeded = True
            else:
                obs, _ = self.env.reset()
            total, done = 0.0, False
            agent.start_greedy_episode()
            while not done:
                o = obs[None].astype(np.float32)
                action = agent.act_greedy(normalize(o) if normalize else o)[0]
                obs, reward, terminated, truncated, _ = self.env.step(action)
                total += float(reward)
                done = terminated or truncated
                check_stop()
            returns.append(total)
        return returns

    def state_dict(self) -> dict:
        return {'seeded': self.seeded, 'env': env_state_dict(self.env) if self.env is not None else None}

    def load_state_dict(self, state: dict) -> None:
        self.seeded = state['seeded']
        if self.env is not None and state['env'] is not None:
            load_env_state_dict(self.env, state['env'])

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
