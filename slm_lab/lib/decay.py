"""Value schedules for exploration, entropy and clipping coefficients, as SLM-Lab computes them.

A schedule maps the frame count to a value with SLM-Lab's `VarScheduler` rules and its
`no_decay` / `linear_decay` / `rate_decay` / `periodic_decay` formulas (v4.2.4 and v5 agree):
a spec written for SLM-Lab gives the same coefficient at the same frame here.

SLM-Lab sets the coefficient to `start_val` when the algorithm is built and recomputes it after
every env step from the frame count (env steps summed over sub-envs); a step taken with `frame`
frames already done therefore uses the value computed at `frame`, and the first step (frame 0)
uses `start_val`. `value(frame)` returns exactly that. A schedule holds no state of its own: the
value is a pure function of the frame, so restoring the Clock restores every schedule exactly.
"""
from __future__ import annotations

import math

from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import MAX_FRAME, Field, ignored_field

DECAY_NAMES = ('no_decay', 'linear_decay', 'rate_decay', 'periodic_decay')
# SLM-Lab's fixed shape parameters: its scheduler never passes decay_rate or frequency from the spec
RATE_DECAY_RATE, RATE_DECAY_PERIODS = 0.9, 20
PERIODIC_DECAY_PERIODS = 60

SCHEDULE_SCHEMA = {
    'name': Field((str,), 'no_decay', choices=DECAY_NAMES, doc='decay function'),
    'start_val': Field((float,), 0.0, doc='value at frame 0 and before start_step'),
    'end_val': Field((float,), None, nullable=True,
                     doc='value the decay goes to; null or 0 (as in SLM-Lab) means start_val: a constant'),
    'start_step': Field((int,), 0, min=0, max=MAX_FRAME, doc='frame at which decay starts'),
    'end_step': Field((int,), 0, min=0, max=MAX_FRAME, doc='frame at which decay ends'),
    'decay_rate': ignored_field('ignored, as in SLM-Lab: rate_decay always uses 0.9'),
    'frequency': ignored_field('ignored, as in SLM-Lab: rate_decay always uses 20 periods, periodic_decay 60'),
}


def _check_schedule(spec: dict, path: str) -> None:
    if spec['name'] != 'no_decay' and spec['end_step'] < spec['start_step']:
        raise SpecError(f"{path}.end_step: {spec['end_step']} is before start_step {spec['start_step']}; "
                        'end_step must be >= start_step')
    if spec['name'] == 'linear_decay' and spec['end_step'] == spec['start_step']:
        # SLM-Lab's slope divides by end_step - start_step (a ZeroDivisionError there)
        raise SpecError(f"{path}.end_step: linear_decay needs end_step > start_step (both are "
                        f"{spec['start_step']}); set end_step to the frame where the decay ends, or use no_decay")


def schedule_field(doc: str, default: dict | None = None) -> Field:
    """A spec Field for a schedule object such as explore_var_spec (nullable when default is None)."""
    return Field((dict,), default, nullable=default is None, schema=SCHEDULE_SCHEMA, check=_check_schedule,
                 doc=doc)


class Schedule:
    """Value of a schedule spec at a frame, as SLM-Lab's VarScheduler gives it.
    `Schedule(None)` (no spec) is the constant `default`."""

    def __init__(self, spec: dict | None, default: float = float('nan')):
        self.spec = spec
        if spec is None:
            self.name, self.start_val, self.end_val = 'no_decay', default, default
            self.start_step = self.end_step = 0
            return
        self.name = spec['name']
        self.start_val = float(spec['start_val'])
        # SLM-Lab: `if not end_val: end_val = start_val`, so an end_val of 0 means "constant" too
        end_val = spec.get('end_val')
        self.end_val = float(end_val) if end_val else self.start_val
        self.start_step, self.end_step = int(spec['start_step']), int(spec['end_step'])

    def value(self, frame: int) -> float:
        """The value in effect for an env step taken with `frame` frames already done."""
        if frame <= 0:  # SLM-Lab's initial value, before its first update
            return self.start_val
        if self.name == 'no_decay':  # SLM-Lab's update returns end_val for no_decay
            return self.end_val
        v0, v1, s, e = self.start_val, self.end_val, self.start_step, self.end_step
        if frame < s:
            return v0
        if self.name == 'linear_decay':
            # no clamp at end_step: max() keeps a falling schedule at v1; a rising one is v1 until
            # the line passes it after end_step, then keeps rising (SLM-Lab's formula)
            slope = (v1 - v0) / (e - s)
            return max(slope * (frame - s) + v0, v1)
        if frame >= e:
            return v1
        if self.name == 'rate_decay':
            # continuous compounding: decay_rate per 1/20 of the span
            decays = (frame - s) / ((e - s) / RATE_DECAY_PERIODS)
            return max(RATE_DECAY_RATE ** decays * v0, v1)
        if self.name == 'periodic_decay':
            # SLM-Lab's formula as it is: a cosine of x radians, x going 0 -> 60 over the span, scaled
            # by end_val * (start_val - end_val) / 2 and floored at end_val
            x = (frame - s) / ((e - s) / PERIODIC_DECAY_PERIODS)
            unit = v0 - v1
            return max(v1 * 0.5 * unit * (1 + math.cos(x) * (1 - x / PERIODIC_DECAY_PERIODS)), v1)
        raise ValueError(f'unknown decay {self.name}')


# --- LinearToZero: the learning-rate schedule of agent.net.lr_scheduler_spec ---------------------
# Its one home: the nets' scheduler (agent/net/net_util.py), moving its end on resume
# (agent/algorithm/base.py) and the schedule changes a resume reports (persistence/edits.py).
def linear_to_zero_end(lr_scheduler_spec: dict, max_frame: int) -> float:
    """The frame at which LinearToZero reaches 0: its `frame` (SLM-Lab's key), else env.max_frame."""
    frame = lr_scheduler_spec.get('frame')
    return float(frame) if frame is not None else float(max_frame)


def linear_to_zero_factor(frame: float, end: float) -> float:
    """LinearToZero's factor on the base learning rate at `frame`: 1 - frame / end, down to 0."""
    return max(0.0, 1.0 - frame / end)


def linear_to_zero_frame(lr: float, base: float, end: float) -> float:
    """The frame at which LinearToZero with this `end` set `lr` from `base` (the factor's inverse)."""
    return end * (1.0 - lr / base)
