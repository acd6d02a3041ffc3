"""MuJoCo envs continue from a snapshot exactly: mjSTATE_INTEGRATION and the derived quantities
the envs read between steps (Ant's and Humanoid's rewards read body positions before stepping)."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

pytest.importorskip('mujoco', reason='the MuJoCo extra is not installed')


@pytest.mark.parametrize('name', ['Hopper-v5', 'Ant-v5', 'Humanoid-v5'])
def test_a_mujoco_env_continues_from_its_snapshot_exactly(name):
    from slm_lab.env import make_env
    from slm_lab.persistence.env_state import load_vector_env_state_dict, vector_env_state_dict
    spec = {'name': name, 'num_envs': 2, 'max_frame': 1000}
    a, b = make_env(spec), make_env(spec)
    try:
        a.reset(seed=5)
        b.reset(seed=6)
        rng = np.random.default_rng(0)
        actions = rng.uniform(-0.4, 0.4, size=(300, 2) + a.single_action_space.shape).astype(np.float32)
        for action in actions[:100]:
            a.step(action)
        assert load_vector_env_state_dict(b, pickle.loads(pickle.dumps(vector_env_state_dict(a))))
        for action in actions[100:]:
            for x, y in zip(a.step(action)[:4], b.step(action)[:4]):
                np.testing.assert_array_equal(x, y)
    finally:
        a.close()
        b.close()

