"""Classic-control sub-envs stepped together: CartPole-v0/v1 and Acrobot-v1 as one vector env each,
where gymnasium's sync vector env steps each env through its wrappers in turn (for CartPole about
12 us a sub-env a step, most of it calls, not arithmetic; for Acrobot about 28 us, numpy's calls on
arrays of five numbers in its Runge-Kutta step). env.vector_backend "numpy" (the default where it
applies: schema.numpy_backend_misfit).

Each computes what gymnasium's sync vector env of its env computes, bit for bit (tested): each
sub-env's state in float64 with the env's operations in its order, on Python floats (math.cos and
math.sin give numpy's float64 results), each sub-env's own random generator seeded as the sync env
seeds its sub-envs (seed + i) and drawn as the env's reset draws, the same time limit,
observations, rewards and infos (same-step autoreset). So a run learns as it does on gymnasium's
env, step for step. gymnasium's own CartPoleVectorEnv is not that: it resets a sub-env in the step
after its episode ends (a step whose action is ignored, with reward 0) from one generator for all
sub-envs.

Their state is plain lists and generators (persistence/env_state.py snapshots it): a resumed run
continues its episodes exactly."""
from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import AcrobotEnv, CartPoleEnv
from gymnasium.utils import seeding
from gymnasium.vector.utils import batch_space

# CartPoleEnv's constants, as gymnasium 1.x defines them (tested against a CartPoleEnv)
GRAVITY, MASSCART, MASSPOLE, LENGTH, FORCE_MAG, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
TOTAL_MASS = MASSPOLE + MASSCART
POLEMASS_LENGTH = MASSPOLE * LENGTH
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4

# AcrobotEnv's constants ("book" dynamics, no torque noise; tested against an AcrobotEnv)
ACROBOT_DT = 0.2
M1 = M2 = L1 = I1 = I2 = 1.0
LC1 = LC2 = 0.5
MAX_VEL_1, MAX_VEL_2 = 4 * math.pi, 9 * math.pi
TORQUES = (-1.0, 0.0, 1.0)


class FloatVectorEnv(gym.vector.VectorEnv):
    """num_envs copies of one classic-control env as a gymnasium vector env (same-step autoreset;
    the final observation of an ended episode in info['final_obs'], as gymnasium's sync vector env
    gives it). A subclass gives the env (`single`), its reset draw (`_first_state`), its step on
    one sub-env's state (`_advance`) and its observations.

    State: `state`, each sub-env's state as a tuple of Python floats; `elapsed`, each sub-env's
    steps in its episode; `rngs`, each sub-env's generator."""

    metadata = {'render_modes': [], 'autoreset_mode': gym.vector.AutoresetMode.SAME_STEP}
    single: type[gym.Env]
    state_size: int

    def __init__(self, num_envs: int, max_episode_steps: int = 500):
        self.num_envs = num_envs
        self.max_episode_steps = max_episode_steps
        single = self.single()  # its spaces, as gymnasium's vector env of these envs has them
        self.single_observation_space, self.single_action_space = single.observation_space, single.action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.state = [(0.0,) * self.state_size] * num_envs
        self.elapsed = [0] * num_envs
        self.rngs: list[np.random.Generator] | None = None  # made at the first reset

    def _first_state(self, rng: np.random.Generator) -> tuple:
        """A new episode's state, drawn from the sub-env's generator as the env's reset draws it."""
        raise NotImplementedError

    def _advance(self, state: tuple, action: int) -> tuple[tuple, float, bool]:
        """One step of one sub-env: (its next state, the reward, whether the episode terminated)."""
        raise NotImplementedError

    def _observations(self, states: list[tuple]) -> np.ndarray:
        """The float32 observations of the sub-envs' states (as the env's step returns them)."""
        return np.array(states, dtype=np.float32)

    def _first_observation(self, state: tuple) -> np.ndarray:
        """A new episode's observation (as the env's reset returns it)."""
        return np.array(state, dtype=np.float32)

    def reset(self, *, seed: int | list | None = None, options: dict | None = None):
        if options:
            raise ValueError(f'{type(self).__name__}.reset: options {options!r} are not supported; '
                             'use env.vector_backend "gymnasium"')
        if seed is None:
            seeds = [None] * self.num_envs
        elif isinstance(seed, (int, np.integer)):
            seeds = [int(seed) + i for i in range(self.num_envs)]  # as gymnasium's sync vector env seeds its sub-envs
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f'{type(self).__name__}.reset: {len(seeds)} seeds for {self.num_envs} sub-envs; give '
                                 'one per sub-env, an int (seed + i for sub-env i) or None')
        old = self.rngs or [None] * self.num_envs
        self.rngs = [seeding.np_random(s)[0] if s is not None or rng is None else rng for s, rng in zip(seeds, old)]
        self.state = [self._first_state(rng) for rng in self.rngs]
        self.elapsed = [0] * self.num_envs
        return np.stack([self._first_observation(s) for s in self.state]), {}

    def step(self, actions):
        if self.rngs is None:
            raise gym.error.ResetNeeded(f'{type(self).__name__}.step before its first reset: call reset() first')
        actions = np.asarray(actions)
        n_actions = int(self.single_action_space.n)
        if actions.shape != (self.num_envs,) or actions.dtype.kind not in 'iu':
            raise ValueError(f'{type(self).__name__} actions must be {self.num_envs} integers, each 0 to '
                             f'{n_actions - 1}; got {actions!r}')
        states, elapsed, limit, advance = self.state, self.elapsed, self.max_episode_steps, self._advance
        rewards, terminated, truncated, ended = [], [], [], []
        for i, a in enumerate(actions.tolist()):
            if not 0 <= a < n_actions:
                raise ValueError(f'{type(self).__name__} actions must be 0 to {n_actions - 1}; got {a} for sub-env {i}')
            states[i], reward, term = advance(states[i], a)
            elapsed[i] += 1
            trunc = elapsed[i] >= limit
            rewards.append(reward)
            terminated.append(term)
            truncated.append(trunc)
            if term or trunc:
                ended.append(i)
        obs = self._observations(states)
        infos = {}
        if ended:
            final_obs = np.full(self.num_envs, None, dtype=object)
            mask = np.zeros(self.num_envs, dtype=np.bool_)
            for i in ended:
                final_obs[i] = obs[i].copy()
                mask[i] = True
                states[i] = self._first_state(self.rngs[i])
                elapsed[i] = 0
                obs[i] = self._first_observation(states[i])
            infos = {'final_obs': final_obs, '_final_obs': mask, 'final_info': {}, '_final_info': mask.copy()}
        return (obs, np.array(rewards, dtype=np.float64), np.array(terminated, dtype=np.bool_),
                np.array(truncated, dtype=np.bool_), infos)


class CartPoleVector(FloatVectorEnv):
    """CartPole-v0/v1's sub-envs (CartPoleEnv's arithmetic, about 1 us a sub-env a step)."""

    single = CartPoleEnv
    state_size = 4

    def _first_state(self, rng: np.random.Generator) -> tuple:
        return tuple(rng.uniform(low=-0.05, high=0.05, size=(4,)).tolist())

    def _advance(self, state: tuple, action: int) -> tuple[tuple, float, bool]:
        x, x_dot, theta, theta_dot = state
        force = FORCE_MAG if action == 1 else -FORCE_MAG
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
        terminated = x < -X_THRESHOLD or x > X_THRESHOLD or theta < -THETA_THRESHOLD or theta > THETA_THRESHOLD
        return (x, x_dot, theta, theta_dot), 1.0, terminated


def _acrobot_derivs(theta1: float, theta2: float, dtheta1: float, dtheta2: float, a: float) -> tuple:
    """AcrobotEnv._dsdt ("book"), in its operations and order, on Python floats."""
    d1 = M1 * LC1**2 + M2 * (L1**2 + LC2**2 + 2 * L1 * LC2 * math.cos(theta2)) + I1 + I2
    d2 = M2 * (LC2**2 + L1 * LC2 * math.cos(theta2)) + I2
    phi2 = M2 * LC2 * 9.8 * math.cos(theta1 + theta2 - math.pi / 2.0)
    phi1 = (-M2 * L1 * LC2 * dtheta2**2 * math.sin(theta2)
            - 2 * M2 * L1 * LC2 * dtheta2 * dtheta1 * math.sin(theta2)
            + (M1 * LC1 + M2 * L1) * 9.8 * math.cos(theta1 - math.pi / 2)
            + phi2)
    ddtheta2 = (a + d2 / d1 * phi1 - M2 * L1 * LC2 * dtheta1**2 * math.sin(theta2) - phi2) / (
        M2 * LC2**2 + I2 - d2**2 / d1)
    ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
    return dtheta1, dtheta2, ddtheta1, ddtheta2


def _wrap(x: float, m: float, big_m: float) -> float:
    diff = big_m - m
    while x > big_m:
        x = x - diff
    while x < m:
        x = x + diff
    return x


class AcrobotVector(FloatVectorEnv):
    """Acrobot-v1's sub-envs (AcrobotEnv's Runge-Kutta step on Python floats, about 8 us a sub-env a
    step). A new episode's state is float32 (AcrobotEnv draws it so), and so is the arithmetic of
    its first observation; every later state is float64."""

    single = AcrobotEnv
    state_size = 4

    def _first_state(self, rng: np.random.Generator) -> tuple:
        return tuple(rng.uniform(low=-0.1, high=0.1, size=(4,)).astype(np.float32).tolist())

    def _first_observation(self, state: tuple) -> np.ndarray:
        s = np.array(state, dtype=np.float32)  # AcrobotEnv._get_ob on its float32 reset state
        return np.array([np.cos(s[0]), np.sin(s[0]), np.cos(s[1]), np.sin(s[1]), s[2], s[3]], dtype=np.float32)

    def _observations(self, states: list[tuple]) -> np.ndarray:
        return np.array([(math.cos(t1), math.sin(t1), math.cos(t2), math.sin(t2), d1, d2)
                         for t1, t2, d1, d2 in states], dtype=np.float32)

    def _advance(self, state: tuple, action: int) -> tuple[tuple, float, bool]:
        # rk4(self._dsdt, s_augmented, [0, dt]): one step of four evaluations, elementwise as numpy
        # computes it on the augmented state (its torque component has derivative 0)
        a = TORQUES[action]
        dt, dt2, dt6 = ACROBOT_DT, ACROBOT_DT / 2.0, ACROBOT_DT / 6.0
        y = state
        k1 = _acrobot_derivs(*y, a)
        k2 = _acrobot_derivs(*(y[j] + dt2 * k1[j] for j in range(4)), a)
        k3 = _acrobot_derivs(*(y[j] + dt2 * k2[j] for j in range(4)), a)
        k4 = _acrobot_derivs(*(y[j] + dt * k3[j] for j in range(4)), a)
        ns = [y[j] + dt6 * (k1[j] + 2 * k2[j] + 2 * k3[j] + k4[j]) for j in range(4)]
        theta1 = _wrap(ns[0], -math.pi, math.pi)
        theta2 = _wrap(ns[1], -math.pi, math.pi)
        dtheta1 = min(max(ns[2], -MAX_VEL_1), MAX_VEL_1)
        dtheta2 = min(max(ns[3], -MAX_VEL_2), MAX_VEL_2)
        terminated = -math.cos(theta1) - math.cos(theta2 + theta1) > 1.0
        return (theta1, theta2, dtheta1, dtheta2), (0.0 if terminated else -1.0), terminated


# the ids env.vector_backend "numpy" steps: (its vector env, the id's registered time limit)
IDS = {'CartPole-v0': (CartPoleVector, 200), 'CartPole-v1': (CartPoleVector, 500), 'Acrobot-v1': (AcrobotVector, 500)}
