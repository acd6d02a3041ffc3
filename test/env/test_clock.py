"""The Clock counts a session's frames, episodes and optimizer steps (schedules: test/lib/test_schedules.py)."""
from __future__ import annotations

import time

import pytest

from slm_lab.env import Clock


def test_tick_counts_frames_by_num_envs():
    clock = Clock(max_frame=100, num_envs=4)
    assert (clock.frame, clock.t, clock.epi, clock.opt_step) == (0, 0, 0, 0)
    clock.tick()
    clock.tick(episodes_done=2)
    clock.tick(episodes_done=1)
    assert clock.t == 3 and clock.frame == 12 and clock.epi == 3


def test_opt_steps_are_counted_separately():
    clock = Clock(max_frame=10)
    clock.tick_opt_step()
    clock.tick_opt_step(4)
    assert clock.opt_step == 5 and clock.frame == 0


@pytest.mark.parametrize('num_envs, ticks', [(1, 10), (4, 3), (3, 4)])
def test_done_at_max_frame(num_envs, ticks):
    clock = Clock(max_frame=10, num_envs=num_envs)
    for _ in range(ticks - 1):
        clock.tick()
        assert not clock.done()
    clock.tick()
    assert clock.done() and clock.frame >= 10


def test_wall_t_grows():
    clock = Clock(max_frame=10)
    first = clock.wall_t
    time.sleep(0.01)
    assert clock.wall_t > first >= 0


def test_state_dict_round_trip_continues_wall_time():
    clock = Clock(max_frame=1000, num_envs=2)
    for i in range(7):
        clock.tick(episodes_done=i % 2)
    clock.tick_opt_step(3)
    state = clock.state_dict()
    assert state['frame'] == 14 and state['t'] == 7 and state['epi'] == 3 and state['opt_step'] == 3
    assert all(isinstance(v, (int, float)) for v in state.values()), 'state must be plain numbers'

    state['wall_t'] = 100.0  # as if the saved run had trained for 100 s
    resumed = Clock(max_frame=1000, num_envs=2)
    resumed.load_state_dict(state)
    assert (resumed.frame, resumed.t, resumed.epi, resumed.opt_step) == (14, 7, 3, 3)
    assert 100.0 <= resumed.wall_t < 101.0
    resumed.tick()
    assert resumed.frame == 16 and resumed.t == 8
