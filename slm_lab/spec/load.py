"""Load a spec: read it from its file, apply the -s overrides, fill what it leaves out (from a
run's saved spec when resuming, then from the defaults) and validate it."""
from __future__ import annotations

import copy
import os
import secrets

from slm_lab.lib.version import __version__, git_sha
from slm_lab.spec.compat import flatten_v4_layout
from slm_lab.spec.overrides import apply_overrides
from slm_lab.spec.read import get_raw_spec
from slm_lab.spec.validate import RUNTIME_META, validate_spec


def load_raw_spec(spec_file: str, spec_name: str, overrides: list[str] | None = None) -> dict:
    """The named spec with overrides applied, before defaults and validation."""
    raw = get_raw_spec(spec_file, spec_name)
    flatten_v4_layout(raw)  # so that -s agent.x / env.x paths work on SLM-Lab v4 list specs too
    if isinstance(raw.get('meta'), dict):
        # a spec the lab saved in a run directory records that run (its timestamp, session index,
        # overrides...); run again, it starts a new run, which records its own
        raw['meta'] = {k: v for k, v in raw['meta'].items() if k not in RUNTIME_META}
    return apply_overrides(raw, overrides or [])


def merge_specs(base: dict, over: dict) -> dict:
    """`base` with every key that `over` gives replaced by `over`'s value (objects merged key by
    key). Resuming fills what the spec file leaves out from the run's saved spec, so a default
    that changed in a newer lab does not change an older run."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_specs(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_spec(spec_file: str, spec_name: str, overrides: list[str] | None = None,
              base: dict | None = None, settle: bool = True) -> dict:
    """Read, override and validate a spec (keys it omits filled from `base` when given, then
    from the defaults); record its origin in meta. `settle`: as validate_spec's."""
    raw = load_raw_spec(spec_file, spec_name, overrides)
    if base is not None:
        base = {k: v for k, v in base.items() if k != 'name'}
        base['meta'] = {k: v for k, v in base.get('meta', {}).items() if k not in RUNTIME_META}
        raw = merge_specs(base, raw)
    spec = validate_spec(raw, spec_name, settle)
    spec['name'] = spec_name
    spec['meta']['spec_file'] = os.path.abspath(spec_file)
    spec['meta']['spec_name'] = spec_name
    spec['meta']['overrides'] = list(overrides or [])
    return spec


def settles_kernels(mode: str) -> bool:
    """Whether a spec loaded for `mode` settles linear_kernel "auto" (validate_spec's `settle`): a
    search's spec leaves it to each trial's, which knows the trial's layers."""
    return not mode.startswith('search')


def load_run_spec(spec_file: str, spec_name: str, mode: str, overrides: list[str] | None) -> dict:
    """Load and validate a spec for a run in `mode`, and fill the run's meta (seed, versions)."""
    spec = load_spec(spec_file, spec_name, overrides, settle=settles_kernels(mode))
    meta = spec['meta']
    if meta['random_seed'] is None:
        meta['random_seed'] = secrets.randbelow(2**31 - 10**7)
    meta['lab_version'] = __version__
    meta['git_sha'] = git_sha()
    meta['mode'] = mode
    if mode == 'dev':  # dev runs one session; the saved specs say so
        meta['max_session'] = 1
    return spec
