"""gymnasium's sync vector env with a shorter step for the same-step autoreset the lab's vector envs
use: the same observations, rewards, terminations, truncations and end-of-episode infos, without
gathering each sub-env's per-step info into the vector info (numpy arrays made and filled key by
key at every step: about 8 us a step of one MuJoCo env, whose info has six keys) and without
iterating the actions through gymnasium's space dispatch. The lab reads only what ends an episode
(final_obs, final_info) and the records' 'episode'; a sub-env's info at the step that ends its
episode is still in final_info, and the reset's info as gymnasium gives it.

Its name and attributes are gymnasium's SyncVectorEnv's, so a snapshot of either restores into
the other (persistence/env_state.py pairs layers by type name)."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import concatenate


class SyncVectorEnv(gym.vector.SyncVectorEnv):
    """gymnasium.vector.SyncVectorEnv; in same-step autoreset mode with array observations and
    Box or Discrete actions, the step described in the module docstring. Other modes and spaces
    take gymnasium's step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lean = (self.autoreset_mode == gym.vector.AutoresetMode.SAME_STEP
                      and isinstance(self.single_observation_space, gym.spaces.Box)
                      and isinstance(self.single_action_space, (gym.spaces.Box, gym.spaces.Discrete)))

    def step(self, actions):
        if not self._lean:
            return super().step(actions)
        infos = {}
        rewards, terminations, truncations = self._rewards, self._terminations, self._truncations
        env_obs = self._env_obs
        for i, env in enumerate(self.envs):
            # actions[i]: the item gymnasium's iterate gives for a batched Box (a row) or Discrete (a number)
            obs, rewards[i], terminations[i], truncations[i], info = env.step(actions[i])
            if terminations[i] or truncations[i]:
                infos = self._add_info(infos, {'final_obs': obs, 'final_info': info}, i)
                obs, info = env.reset()
                infos = self._add_info(infos, info, i)
            env_obs[i] = obs
        self._observations = concatenate(self.single_observation_space, env_obs, self._observations)
        self._autoreset_envs = np.logical_or(terminations, truncations)
        observations = self._observations.copy() if self.copy else self._observations
        return observations, rewards.copy(), terminations.copy(), truncations.copy(), infos
