"""Random: uniformly random actions; a baseline and a check of the plumbing. Never trains."""
from __future__ import annotations

import numpy as np

from slm_lab.agent.algorithm.base import BASE_SCHEMA, Algorithm
from slm_lab.lib.schema import ignored_field


class Random(Algorithm):
    """Samples each sub-env's action uniformly from the action space."""

    spec_schema = {
        **BASE_SCHEMA,
        'training_frequency': ignored_field('ignored, as in SLM-Lab: Random never trains'),
    }
    requires = ()
    continuous_ok = True

    @classmethod
    def recurrent_slots(cls, agent_spec: dict) -> int:
        """No nets: a net spec, RecurrentNet too, is ignored."""
        return 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.action_space.seed(int(self.rng.integers(2**31)))

    def act(self, obs: np.ndarray) -> np.ndarray:
        return np.stack([self.action_space.sample() for _ in range(len(obs))])

    act_greedy = act

    def update(self, obs, action, reward, next_obs, terminated, truncated) -> None:
        return None

    def extra_state(self) -> dict:
        return {'action_space_rng': self.action_space.np_random.bit_generator.state}

    def load_extra_state(self, state: dict) -> None:
        self.action_space.np_random.bit_generator.state = state['action_space_rng']
