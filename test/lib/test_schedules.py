"""Schedules (explore_var_spec, entropy_coef_spec, clip_eps_spec) give SLM-Lab's values.

Each expected value below is worked out by hand from SLM-Lab's VarScheduler and its decay
formulas (slm_lab/agent/algorithm/policy_util.py and slm_lab/lib/math_util.py, v4.2.4 and v5):
the value at frame 0 is start_val; after that it is the formula at the frame; a falsy end_val
(0 or null) means start_val.
"""
from __future__ import annotations

import pandas as pd
import pytest

from slm_lab.lib.decay import Schedule
from slm_lab.lib.errors import SpecError
from slm_lab.spec import load_spec


def schedule(name: str, start_val: float, end_val, start_step: int, end_step: int, **extra) -> Schedule:
    return Schedule({'name': name, 'start_val': start_val, 'end_val': end_val, 'start_step': start_step,
                     'end_step': end_step, **extra})


def values(s: Schedule, frames) -> list[float]:
    return [s.value(f) for f in frames]


def test_linear_decay_falls_to_end_val_and_stays():
    # slope = (0.1 - 1.0) / (1100 - 100) = -0.0009
    s = schedule('linear_decay', 1.0, 0.1, 100, 1100)
    assert values(s, [0, 50, 100]) == [1.0, 1.0, 1.0]  # before and at start_step
    assert s.value(600) == pytest.approx(1.0 - 0.0009 * 500)  # 0.55
    assert s.value(1100) == pytest.approx(0.1)
    assert s.value(5000) == 0.1  # max(1.0 - 0.0009 * 4900, 0.1)


def test_linear_decay_that_rises_is_end_val_at_once_then_keeps_rising():
    # slope = 0.004; max(0.1 + 0.004 * f, 0.5): 0.5 until f = 100, the line after that
    s = schedule('linear_decay', 0.1, 0.5, 0, 100)
    assert s.value(0) == 0.1  # the initial value, before SLM-Lab's first update
    assert s.value(4) == 0.5 and s.value(50) == 0.5
    assert s.value(200) == pytest.approx(0.9)


@pytest.mark.parametrize('end_val', [0, 0.0, None, 'absent'])
def test_a_zero_or_null_end_val_means_start_val(end_val):
    spec = {'name': 'linear_decay', 'start_val': 0.2, 'end_val': end_val, 'start_step': 0, 'end_step': 1000}
    if end_val == 'absent':
        del spec['end_val']
    assert values(Schedule(spec), [0, 8, 500, 1000, 10**6]) == [0.2] * 5


def test_no_decay_is_start_val_at_frame_0_and_end_val_after():
    s = schedule('no_decay', 0.01, 0.001, 0, 0)
    assert s.value(0) == 0.01
    assert values(s, [1, 8, 10**6]) == [0.001] * 3
    assert values(schedule('no_decay', 0.3, 0.0, 0, 0), [0, 8, 10**6]) == [0.3] * 3  # falsy end_val


def test_rate_decay_compounds_0_9_over_20_periods_and_jumps_to_end_val_at_end_step():
    # step_per_decay = 2000 / 20 = 100: 0.9 ** (f / 100), floored at end_val; end_val from end_step on
    s = schedule('rate_decay', 1.0, 0.01, 0, 2000)
    assert s.value(100) == pytest.approx(0.9)
    assert s.value(250) == pytest.approx(0.7684334714)  # 0.9 ** 2.5
    assert s.value(1900) == pytest.approx(0.1350851718)  # 0.9 ** 19
    assert s.value(2000) == 0.01
    floored = schedule('rate_decay', 1.0, 0.5, 0, 2000)
    assert floored.value(500) == pytest.approx(0.59049)  # 0.9 ** 5
    assert floored.value(1000) == 0.5  # 0.9 ** 10 = 0.349 < 0.5


def test_rate_decay_ignores_decay_rate_and_frequency_as_slm_lab_does():
    plain = schedule('rate_decay', 1.0, 0.01, 0, 2000)
    given = schedule('rate_decay', 1.0, 0.01, 0, 2000, decay_rate=0.5, frequency=10)
    assert values(given, range(0, 2100, 50)) == values(plain, range(0, 2100, 50))


def test_periodic_decay_is_slm_labs_formula():
    # x = f / (600 / 60) = f / 10; 1.0 * 0.5 * 9 * (1 + cos(x) * (1 - x / 60)), floored at 1.0
    s = schedule('periodic_decay', 10.0, 1.0, 0, 600, frequency=5)
    assert s.value(0) == 10.0
    assert s.value(1) == pytest.approx(8.9700562125)  # x = 0.1
    assert s.value(300) == pytest.approx(4.8470657622)  # x = 30
    assert s.value(31) == 1.0  # x = 3.1: 0.236 is below end_val
    assert s.value(600) == 1.0
    # SLM-Lab's own docstring example (1.0 -> 0.2): end_val * 0.5 * 0.8 * (...) <= 0.16, so 0.2 after frame 0
    assert values(schedule('periodic_decay', 1.0, 0.2, 0, 600), [0, 1, 300, 599]) == [1.0, 0.2, 0.2, 0.2]


def test_missing_schedule_is_the_default_constant():
    s = Schedule(None, default=0.5)
    assert values(s, [0, 123, 10**6]) == [0.5] * 3


def test_linear_decay_without_a_span_is_a_spec_error(make_spec, spec_file):
    # SLM-Lab divides by end_step - start_step
    spec = make_spec('DQN')
    spec['agent']['algorithm']['explore_var_spec'] = {'name': 'linear_decay', 'start_val': 1.0, 'end_val': 0.1}
    with pytest.raises(SpecError) as info:
        load_spec(spec_file({'s': spec}), 's')
    assert 'agent.algorithm.explore_var_spec.end_step' in str(info.value) and 'no_decay' in str(info.value)


def test_decay_rate_and_frequency_are_accepted_and_saved_only_when_given(make_spec, spec_file):
    spec = make_spec('DQN')
    spec['agent']['algorithm']['explore_var_spec'] = {'name': 'rate_decay', 'start_val': 1.0, 'end_val': 0.1,
                                                      'start_step': 0, 'end_step': 100, 'decay_rate': 0.5,
                                                      'frequency': 10}
    loaded = load_spec(spec_file({'s': spec}), 's')['agent']['algorithm']['explore_var_spec']
    assert loaded['decay_rate'] == 0.5 and loaded['frequency'] == 10
    del spec['agent']['algorithm']['explore_var_spec']['decay_rate']
    loaded = load_spec(spec_file({'s': spec}), 's')['agent']['algorithm']['explore_var_spec']
    assert 'decay_rate' not in loaded


def test_a_session_records_no_decay_at_end_val_after_frame_0(lab_run, make_spec):
    # the value SLM-Lab's update gives from the first env step on; the records are taken at frames > 0
    spec = make_spec('DQN', max_frame=64, log_frequency=16)
    spec['agent']['algorithm']['explore_var_spec'] = {'name': 'no_decay', 'start_val': 1.0, 'end_val': 0.05,
                                                      'start_step': 0, 'end_step': 0}
    _, run_dir = lab_run(spec, 'eps')
    explore = pd.read_csv(run_dir / 'info' / 'eps_t0_s0_session_df_train.csv')['explore_var']
    assert len(explore) and (explore == 0.05).all(), list(explore)


def _ppo_spec(clip_eps_spec: dict, max_frame: int) -> dict:
    return {'agent': {'algorithm': {'name': 'PPO', 'clip_eps_spec': clip_eps_spec}, 'net': {}},
            'env': {'max_frame': max_frame}}


def test_extending_past_the_end_of_a_falling_schedule_says_it_stays_at_end_val():
    from slm_lab.persistence.edits import schedule_changes
    piece = {'name': 'linear_decay', 'start_val': 0.2, 'end_val': 0.02, 'start_step': 0, 'end_step': 1000}
    (change,) = schedule_changes(_ppo_spec(piece, 1000), _ppo_spec(piece, 2000), {0: 1000})
    assert 'stays at end_val 0.02' in change['why']


def test_extending_past_the_end_of_a_rising_schedule_says_it_goes_on_rising():
    # SLM-Lab's linear_decay 0.1 -> 0.3 over 1000 frames: max(0.1 + 0.0002 f, 0.3) is 0.5 at frame 2000
    from slm_lab.persistence.edits import schedule_changes
    piece = {'name': 'linear_decay', 'start_val': 0.1, 'end_val': 0.3, 'start_step': 0, 'end_step': 1000}
    (change,) = schedule_changes(_ppo_spec(piece, 1000), _ppo_spec(piece, 2000), {0: 1000})
    assert 'goes on from 0.3 to 0.5 to env.max_frame 2000' in change['why'], change['why']
    assert 'stays' not in change['why']


def test_a_zero_end_val_schedule_is_constant_so_extending_warns_of_nothing():
    from slm_lab.persistence.edits import schedule_changes
    piece = {'name': 'linear_decay', 'start_val': 0.2, 'end_val': 0.0, 'start_step': 0, 'end_step': 1000}
    assert schedule_changes(_ppo_spec(piece, 1000), _ppo_spec(piece, 2000), {0: 1000}) == []
