"""The Clock counts a session's frames, episodes and optimizer steps; schedules are functions of
the frame."""
from __future__ import annotations

import time

import pytest

from slm_lab.env import Clock
from slm_lab.lib.decay import Schedule


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


# --- schedules -----------------------------------------------------------------------------------

def schedule(name: str, start_val=1.0, end_val=0.1, start_step=100, end_step=1100, **kw) -> Schedule:
    return Schedule({'name': name, 'start_val': start_val, 'end_val': end_val, 'start_step': start_step,
                     'end_step': end_step, **kw})


def test_linear_decay_endpoints_and_midpoint():
    s = schedule('linear_decay')
    assert s.value(0) == 1.0 and s.value(100) == 1.0
    assert s.value(600) == pytest.approx(0.55)
    assert s.value(1100) == pytest.approx(0.1) and s.value(10**6) == pytest.approx(0.1)
    values = [s.value(f) for f in range(0, 1300, 50)]
    assert all(a >= b for a, b in zip(values, values[1:])), 'linear decay never rises'


def test_linear_decay_can_rise():
    s = schedule('linear_decay', start_val=0.0, end_val=1.0, start_step=0, end_step=10)
    assert s.value(5) == pytest.approx(0.5) and s.value(10) == 1.0


def test_no_decay_is_constant():
    s = schedule('no_decay', start_val=0.3, end_val=0.0)
    assert {s.value(f) for f in (0, 100, 600, 1100, 10**6)} == {0.3}


def test_missing_schedule_is_the_default_constant():
    assert Schedule(None, default=0.5).value(123) == 0.5


def test_end_val_defaults_to_start_val():
    s = Schedule({'name': 'linear_decay', 'start_val': 0.7, 'end_val': None, 'start_step': 0, 'end_step': 10})
    assert s.value(0) == s.value(5) == s.value(100) == 0.7


def test_rate_decay_steps_down_by_the_rate_and_stops_at_end_val():
    s = schedule('rate_decay', start_val=1.0, end_val=0.1, start_step=0, end_step=1000, decay_rate=0.5,
                 frequency=10)
    assert s.value(0) == 1.0
    assert s.value(99) == 1.0  # still in the first period
    assert s.value(100) == pytest.approx(0.5)
    assert s.value(250) == pytest.approx(0.25)
    assert s.value(900) == pytest.approx(0.1)  # 0.5**9 is below end_val: clipped
    assert s.value(5000) == pytest.approx(0.1)


def test_periodic_decay_stays_between_end_and_start_and_ends_at_end_val():
    s = schedule('periodic_decay', start_val=1.0, end_val=0.1, start_step=0, end_step=1000, frequency=5)
    values = [s.value(f) for f in range(0, 1001, 7)]
    assert all(0.1 <= v <= 1.0 for v in values)
    assert s.value(0) == 1.0 and s.value(1000) == pytest.approx(0.1)
    # it restarts: somewhere it goes up again
    assert any(b > a + 1e-9 for a, b in zip(values, values[1:]))
