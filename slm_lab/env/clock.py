"""The Clock: counts frames, episodes, optimizer steps and wall time of a session."""
from __future__ import annotations

import time


class Clock:
    """Counters of one session.

    frame: env steps summed over all vector sub-envs (the unit of max_frame and of every frequency)
    t: vector-env steps (frame / num_envs)
    epi: episodes finished, over all sub-envs
    opt_step: optimizer steps (gradient updates)
    wall_t: seconds of wall time spent in the session (continues across resumes)
    """

    def __init__(self, max_frame: int, num_envs: int = 1):
        self.max_frame = int(max_frame)
        self.num_envs = int(num_envs)
        self.frame = 0
        self.t = 0
        self.epi = 0
        self.opt_step = 0
        self._wall_offset = 0.0
        self._start = time.perf_counter()

    @property
    def wall_t(self) -> float:
        """Wall seconds so far, including the time before a resume."""
        return self._wall_offset + time.perf_counter() - self._start

    def tick(self, episodes_done: int = 0) -> None:
        """Advance one vector step: num_envs frames, and count finished episodes."""
        self.t += 1
        self.frame += self.num_envs
        self.epi += episodes_done

    def tick_opt_step(self, n: int = 1) -> None:
        """Count n optimizer steps."""
        self.opt_step += n

    def done(self) -> bool:
        """Whether the session has reached max_frame."""
        return self.frame >= self.max_frame

    def state_dict(self) -> dict:
        """Plain counters; wall_t is saved as its current value."""
        return {'frame': self.frame, 't': self.t, 'epi': self.epi, 'opt_step': self.opt_step,
                'wall_t': self.wall_t}

    def load_state_dict(self, state: dict) -> None:
        """Restore the counters; wall time continues from the saved value."""
        self.frame, self.t, self.epi, self.opt_step = state['frame'], state['t'], state['epi'], state['opt_step']
        self._wall_offset = float(state['wall_t'])
        self._start = time.perf_counter()
