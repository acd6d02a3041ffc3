"""Seeds and the global random generators: the seed of each session of a trial, seeding python,
numpy and torch, and their state as a snapshot holds it (Session.state_dict's 'rng')."""
from __future__ import annotations

import random

import numpy as np
import torch


def session_seed(spec: dict, trial: int, session: int) -> int:
    """The seed of session s in trial t: random_seed + 1000 * t + s of the trial's spec. A
    session's own spec (Trial.session_spec, meta.session set) records that seed as its
    random_seed, so it is read from there as it is."""
    meta = spec['meta']
    if meta.get('session') is not None:
        return int(meta['random_seed'])
    return int(meta['random_seed']) + 1000 * trial + session


def set_global_seeds(seed: int) -> None:
    """Seed python, numpy and torch global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def global_rng_state() -> dict:
    """The state of python's, numpy's and torch's global generators (CUDA's too where present)."""
    return {'python': random.getstate(), 'numpy': np.random.get_state(), 'torch': torch.get_rng_state(),
            'cuda': torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def load_global_rng_state(rng: dict) -> None:
    """Restore what global_rng_state returned (its tuples may come back from a snapshot as lists)."""
    random.setstate(_as_tuple(rng['python']))
    np.random.set_state(_as_tuple(rng['numpy']))
    torch.set_rng_state(torch.as_tensor(rng['torch']))
    if rng['cuda'] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng['cuda'])


def _as_tuple(x):
    return tuple(_as_tuple(v) if isinstance(v, list) else v for v in x)
