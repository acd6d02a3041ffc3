"""A memory describes itself (its build arguments, its storage estimate, the batches it serves),
so adding one touches its own module and the registry only: a small memory defined here, listed
in MEMORIES, is validated, estimated, built and trained from by DQN through the whole lab."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from conftest import build_spec, make_agent
from lab_helpers import train_csv

from slm_lab.agent.memory import MEMORIES, Batch, Memory
from slm_lab.agent.memory.base import transition_bytes
from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import Field
from slm_lab.agent.estimate import estimate_session
from slm_lab.resources import Need
from slm_lab.spec import validate_spec


class TinyReplay(Memory):
    """The newest max_size transitions in a ring of arrays, sampled uniformly: the least a memory
    needs to be trained from by the algorithms that take a Replay."""

    spec_schema = {'name': Field((str,), doc='memory class'),
                   'batch_size': Field((int,), 16, min=1, doc='transitions per sampled batch'),
                   'max_size': Field((int,), 300, min=1, doc='capacity in transitions')}
    serves_as = ('Replay',)
    KEYS = ('states', 'actions', 'rewards', 'next_states', 'terminateds')

    @classmethod
    def build_args(cls, spec: dict, algorithm_cls: type) -> dict:
        return {'algorithm_name': algorithm_cls.__name__}

    @classmethod
    def storage_needs(cls, spec, obs_space, action_space, units) -> list[Need]:
        stored, _, _ = transition_bytes(obs_space, action_space, units)
        return [Need('tiny replay', 'agent.memory.max_size', spec['agent']['memory']['max_size'] * stored)]

    def __init__(self, memory_spec, obs_space, action_space, num_envs, seed=0, algorithm_name: str = ''):
        super().__init__(memory_spec, obs_space, action_space, num_envs, seed)
        self.algorithm_name = algorithm_name
        n = memory_spec['max_size']
        self.arrays = {'states': np.zeros((n, *self.obs_shape), self.obs_dtype),
                       'actions': np.zeros((n, *self.act_shape), self.act_dtype),
                       'rewards': np.zeros(n, np.float32),
                       'next_states': np.zeros((n, *self.obs_shape), self.obs_dtype),
                       'terminateds': np.zeros(n, np.float32)}
        self.head = self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, obs, action, reward, next_obs, terminated, truncated) -> None:
        for i in range(len(reward)):
            for key, value in zip(self.KEYS, (obs, action, reward, next_obs, terminated)):
                self.arrays[key][self.head] = value[i]
            self.head = (self.head + 1) % len(self.arrays['rewards'])
            self.size = min(self.size + 1, len(self.arrays['rewards']))

    def sample(self) -> Batch:
        idx = self.rng.integers(0, self.size, size=self.memory_spec['batch_size'])
        return Batch(*(self.arrays[key][idx] for key in self.KEYS))

    def state_dict(self) -> dict:
        return {'rng': self.rng.bit_generator.state, 'head': self.head, 'size': self.size,
                **{key: self.arrays[key].copy() for key in self.KEYS}}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state['rng']
        self.head, self.size = int(state['head']), int(state['size'])
        for key in self.KEYS:
            self.arrays[key][:] = state[key]


@pytest.fixture
def tiny_replay(monkeypatch):
    monkeypatch.setitem(MEMORIES, 'TinyReplay', TinyReplay)  # the one line a new memory adds to the registry


def tiny_spec(max_frame: int = 400, **algo) -> dict:
    spec = build_spec('DQN', max_frame=max_frame, log_frequency=100)
    spec['agent']['memory'] = {'name': 'TinyReplay', 'batch_size': 16, 'max_size': 300}
    spec['agent']['algorithm'].update(training_start_step=32, **algo)
    return spec


def test_a_memory_in_the_registry_is_validated_estimated_and_built_from_what_it_declares(tiny_replay):
    spec = validate_spec(tiny_spec())
    space = gym.make('CartPole-v1')
    needs = {n.what: n for n in estimate_session(spec, space.observation_space, space.action_space)}
    assert needs['tiny replay'].nbytes == 300 * (2 * 4 * 4 + 8 + 4 * 4)  # two float32 observations, an int64 action
    agent, _ = make_agent(tiny_spec())
    assert isinstance(agent.memory, TinyReplay) and agent.memory.algorithm_name == 'DQN'


def test_an_algorithm_takes_a_memory_that_serves_as_one_of_its_memories_only(tiny_replay, monkeypatch):
    validate_spec(tiny_spec())
    monkeypatch.setattr(TinyReplay, 'serves_as', ())
    with pytest.raises(SpecError, match="DQN cannot use 'TinyReplay'"):
        validate_spec(tiny_spec())


def test_dqn_trains_a_few_hundred_frames_from_a_memory_defined_outside_the_lab(tiny_replay, lab_run):
    _, run = lab_run(tiny_spec(max_frame=400), 'tiny')
    records = train_csv(run, 'tiny')
    assert records['frame'].max() == 400 and records['loss'].notna().any()  # trained on its batches
    agent, clock = make_agent(tiny_spec())
    rng = np.random.default_rng(0)
    for _ in range(64):
        obs = rng.normal(size=(1, 4)).astype(np.float32)
        agent.update(obs, agent.act(obs), np.ones(1), obs, np.zeros(1, bool), np.zeros(1, bool))
        clock.tick()
    assert len(agent.memory) == 64 and np.isfinite(agent.algorithm.train()['loss'])
