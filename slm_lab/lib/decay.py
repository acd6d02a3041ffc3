"""Value schedules for exploration, entropy and clipping coefficients (SLM-Lab's decay names).

A schedule maps the frame count to a value. It holds no state of its own: the value is a pure
function of the frame, so restoring the Clock restores every schedule exactly.
"""
from __future__ import annotations

import math

from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import Field

DECAY_NAMES = ('no_decay', 'linear_decay', 'rate_decay', 'periodic_decay')

SCHEDULE_SCHEMA = {
    'name': Field((str,), 'no_decay', choices=DECAY_NAMES, doc='decay function'),
    'start_val': Field((float,), 0.0, doc='value at start_step and before'),
    'end_val': Field((float,), None, nullable=True, doc='value at end_step and after (default: start_val)'),
    'start_step': Field((int,), 0, min=0, doc='frame at which decay starts'),
    'end_step': Field((int,), 0, min=0, doc='frame at which decay ends'),
    'decay_rate': Field((float,), 0.9, min=0, max=1, doc='rate_decay: factor per decay period'),
    'frequency': Field((int,), 20, min=1, doc='rate_decay / periodic_decay: number of periods'),
}


def _check_schedule(spec: dict, path: str) -> None:
    if spec['name'] != 'no_decay' and spec['end_step'] < spec['start_step']:
        raise SpecError(f"{path}.end_step: {spec['end_step']} is before start_step {spec['start_step']}; "
                        'end_step must be >= start_step')


def schedule_field(doc: str, default: dict | None = None) -> Field:
    """A spec Field for a schedule object such as explore_var_spec (nullable when default is None)."""
    return Field((dict,), default, nullable=default is None, schema=SCHEDULE_SCHEMA, check=_check_schedule,
                 doc=doc)


class Schedule:
    """Value of a schedule spec at a frame. `Schedule(None)` is a constant `default`."""

    def __init__(self, spec: dict | None, default: float = float('nan')):
        self.spec = spec
        if spec is None:
            self.name, self.start_val, self.end_val = 'no_decay', default, default
            self.start_step = self.end_step = 0
            return
        self.name = spec['name']
        self.start_val = float(spec['start_val'])
        self.end_val = float(spec['start_val'] if spec.get('end_val') is None else spec['end_val'])
        self.start_step, self.end_step = int(spec['start_step']), int(spec['end_step'])
        self.decay_rate, self.frequency = spec.get('decay_rate', 0.9), spec.get('frequency', 20)

    def value(self, frame: int) -> float:
        """The scheduled value at `frame`."""
        if self.name == 'no_decay' or frame <= self.start_step:
            return self.start_val
        if frame >= self.end_step:
            return self.end_val
        span = self.end_step - self.start_step
        progress = (frame - self.start_step) / span  # in (0, 1)
        if self.name == 'linear_decay':
            return self.start_val + progress * (self.end_val - self.start_val)
        if self.name == 'rate_decay':
            # decay_rate applied once per period; `frequency` periods between start and end
            val = self.start_val * self.decay_rate ** math.floor(progress * self.frequency)
            return max(val, self.end_val) if self.start_val >= self.end_val else min(val, self.end_val)
        if self.name == 'periodic_decay':
            # a cosine that restarts `frequency` times, with an envelope shrinking linearly to end_val
            phase = (progress * self.frequency) % 1.0
            envelope = (1.0 - progress) * (self.start_val - self.end_val)
            return self.end_val + envelope * 0.5 * (1.0 + math.cos(math.pi * phase))
        raise ValueError(f'unknown decay {self.name}')
