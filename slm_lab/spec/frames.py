"""The frames a session runs, from a validated spec: with meta.distributed the sessions of a trial
share env.max_frame."""
from __future__ import annotations


def session_max_frame(spec: dict, n_sessions: int | None = None) -> int:
    """The frames each session of a trial runs: env.max_frame, or with meta.distributed (and more
    than one session) its share int(env.max_frame / n_sessions), as in SLM-Lab. `n_sessions`: the
    sessions the trial runs (default meta.max_session; a dev run runs one)."""
    n = spec['meta']['max_session'] if n_sessions is None else n_sessions
    max_frame = spec['env']['max_frame']
    return int(max_frame / n) if spec['meta'].get('distributed') and n > 1 else int(max_frame)
