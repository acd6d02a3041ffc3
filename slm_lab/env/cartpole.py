"""CartPole's sub-envs stepped together: one set of numpy array operations for all of them, where
gymnasium's sync vector env steps each CartPoleEnv through its wrappers in turn (about 12 us a
sub-env a step, most of it calls, not arithmetic). env.vector_backend "numpy" (the default for
CartPole-v0/v1 where it applies: schema.numpy_backend_misfit).

It computes what gymnasium's sync vector env of CartPole-v0/v1 computes, bit for bit (tested):
each sub-env's state in float64 with the same operations in the same order, each sub-env's own
random generator seeded as the sync env seeds its sub-envs (seed + i) and drawn as CartPoleEnv's
reset draws, the same time limit, observations, rewards and infos (same-step autoreset). So a run
learns as it does on gymnasium's env, step for step. gymnasium's own CartPoleVectorEnv is not
that: it resets a sub-env in the step after its episode ends (a step whose action is ignored, with
reward 0) from one generator for all sub-envs.

Its state is plain arrays and generators (persistence/env_state.py snapshots it): a resumed run
continues its episodes exactly."""
from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv
from gymnasium.utils import seeding
from gymnasium.vector.utils import batch_space

# CartPoleEnv's constants, as gymnasium 1.x defines them (tested against a CartPoleEnv)
GRAVITY, MASSCART, MASSPOLE, LENGTH, FORCE_MAG, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
TOTAL_MASS = MASSPOLE + MASSCART
POLEMASS_LENGTH = MASSPOLE * LENGTH
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4
RESET_LOW, RESET_HIGH = -0.05, 0.05
IDS = {'CartPole-v0': 200, 'CartPole-v1': 500}  # the ids it steps, with their registered time limits


class CartPoleVector(gym.vector.VectorEnv):
    """num_envs CartPoles as one gymnasium vector env (same-step autoreset; the final observation of
    an ended episode in info['final_obs'], as gymnasium's sync vector env gives it).

    A step runs CartPoleEnv's arithmetic on Python floats, sub-env by sub-env (about 1 us each),
    where numpy's per-call cost over arrays of a few sub-envs is larger than the arithmetic (about
    45 us for 8 sub-envs, and as much for 64).

    State: `state`, each sub-env's (x, x_dot, theta, theta_dot) as Python floats (float64);
    `elapsed`, each sub-env's steps in its episode; `rngs`, each sub-env's generator."""

    metadata = {'render_modes': [], 'autoreset_mode': gym.vector.AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int, max_episode_steps: int = 500):
        self.num_envs = num_envs
        self.max_episode_steps = max_episode_steps
        single = CartPoleEnv()  # its spaces, as gymnasium's vector env of CartPoles has them
        self.single_observation_space, self.single_action_space = single.observation_space, single.action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.state = [(0.0, 0.0, 0.0, 0.0)] * num_envs
        self.elapsed = [0] * num_envs
        self.rngs: list[np.random.Generator] | None = None  # made at the first reset

    def _first_state(self, i: int) -> tuple:
        """A new episode's state for sub-env i, drawn as CartPoleEnv.reset draws it."""
        return tuple(self.rngs[i].uniform(low=RESET_LOW, high=RESET_HIGH, size=(4,)).tolist())

    def reset(self, *, seed: int | list | None = None, options: dict | None = None):
        if options:
            raise ValueError(f'CartPoleVector.reset: options {options!r} are not supported; '
                             'use env.vector_backend "gymnasium"')
        if seed is None:
            seeds = [None] * self.num_envs
        elif isinstance(seed, (int, np.integer)):
            seeds = [int(seed) + i for i in range(self.num_envs)]  # as gymnasium's sync vector env seeds its sub-envs
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f'CartPoleVector.reset: {len(seeds)} seeds for {self.num_envs} sub-envs; give one per '
                                 'sub-env, an int (seed + i for sub-env i) or None')
        old = self.rngs or [None] * self.num_envs
        self.rngs = [seeding.np_random(s)[0] if s is not None or rng is None else rng for s, rng in zip(seeds, old)]
        self.state = [self._first_state(i) for i in range(self.num_envs)]
        self.elapsed = [0] * self.num_envs
        return np.array(self.state, dtype=np.float32), {}

    def step(self, actions):
        if self.rngs is None:
            raise gym.error.ResetNeeded('CartPoleVector.step before its first reset: call reset() first')
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs,) or actions.dtype.kind not in 'iu':
            raise ValueError(f'CartPole actions must be {self.num_envs} integers, each 0 or 1; got {actions!r}')
        states, elapsed, limit = self.state, self.elapsed, self.max_episode_steps
        terminated, truncated, ended = [], [], []
        for i, a in enumerate(actions.tolist()):
            x, x_dot, theta, theta_dot = states[i]
            if a == 1:
                force = FORCE_MAG
            elif a == 0:
                force = -FORCE_MAG
            else:
                raise ValueError(f'CartPole actions must be 0 or 1; got {a} for sub-env {i}')
            # CartPoleEnv.step's operations, in its order (the same float64 results)
            costheta = math.cos(theta)
            sintheta = math.sin(theta)
            temp = (force + POLEMASS_LENGTH * (theta_dot * theta_dot) * sintheta) / TOTAL_MASS
            thetaacc = (GRAVITY * sintheta - costheta * temp) / (
                LENGTH * (4.0 / 3.0 - MASSPOLE * (costheta * costheta) / TOTAL_MASS))
            xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS
            x = x + TAU * x_dot
            x_dot = x_dot + TAU * xacc
            theta = theta + TAU * theta_dot
            theta_dot = theta_dot + TAU * thetaacc
            states[i] = (x, x_dot, theta, theta_dot)
            term = x < -X_THRESHOLD or x > X_THRESHOLD or theta < -THETA_THRESHOLD or theta > THETA_THRESHOLD
            elapsed[i] += 1
            trunc = elapsed[i] >= limit
            terminated.append(term)
            truncated.append(trunc)
            if term or trunc:
                ended.append(i)
        obs = np.array(states, dtype=np.float32)
        infos = {}
        if ended:
            final_obs = np.full(self.num_envs, None, dtype=object)
            mask = np.zeros(self.num_envs, dtype=np.bool_)
            for i in ended:
                final_obs[i] = obs[i].copy()
                mask[i] = True
                states[i] = self._first_state(i)
                elapsed[i] = 0
                obs[i] = states[i]
            infos = {'final_obs': final_obs, '_final_obs': mask, 'final_info': {}, '_final_info': mask.copy()}
        return (obs, np.ones(self.num_envs, dtype=np.float64), np.array(terminated, dtype=np.bool_),
                np.array(truncated, dtype=np.bool_), infos)
