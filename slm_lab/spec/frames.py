"""The frames a session runs, from a validated spec: with meta.distributed the sessions of a trial
share env.max_frame."""
from __future__ import annotations

from slm_lab.lib.errors import ResumeError


def session_max_frame(spec: dict, n_sessions: int | None = None) -> int:
    """The frames each session of a trial runs: env.max_frame, or with meta.distributed (and more
    than one session) its share int(env.max_frame / n_sessions), as in SLM-Lab. `n_sessions`: the
    sessions the trial runs (default meta.max_session; a dev run runs one)."""
    n = spec['meta']['max_session'] if n_sessions is None else n_sessions
    max_frame = spec['env']['max_frame']
    return int(max_frame / n) if spec['meta'].get('distributed') and n > 1 else int(max_frame)


def check_frames_reached(spec: dict, reached: int, where: str) -> None:
    """A run continued under `spec` (train@, a fork) must leave each session frames to run past
    `reached`, the furthest frame a session of it (`where`: the run or snapshot, for the message)
    already reached: ResumeError naming the env.max_frame that would, else nothing."""
    n_sessions = spec['meta']['max_session']
    share = session_max_frame(spec)
    if share >= reached:
        return
    split = bool(spec['meta'].get('distributed')) and n_sessions > 1
    shared = f' ({share} frames for each of its {n_sessions} distributed sessions)' if split else ''
    total = reached * n_sessions if split else reached  # the env.max_frame that frame `reached` stands for
    raise ResumeError(f"env.max_frame {spec['env']['max_frame']}{shared} is below frame {reached} that a session "
                      f'of {where} already reached; use env.max_frame >= {total}')
