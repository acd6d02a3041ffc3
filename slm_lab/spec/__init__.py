"""Specs: read a spec file, apply command-line overrides, fill defaults, validate, and diff two specs.

A spec file is JSON (or YAML) mapping spec names to specs (SLM-Lab's form):
`{"ppo_cartpole": {"agent": {...}, "env": {...}, "meta": {...}, "search": {...}}}`.
Validation happens before anything runs and names the offending key path.

    read.py       spec files: JSON with trailing commas, YAML, plain values, depth; spec names
    overrides.py  -s KEY=VALUE: ${KEY} placeholders and dotted key paths
    validate.py   the top-level, meta and agent schemas; validate_spec
    load.py       read + overrides + validate (load_spec), merge_specs for resumes
    diff.py       diff_specs
    search_block.py  the paths a search block draws (the defaults a search's spec leaves to its trials)
    frames.py     session_max_frame: a session's share of env.max_frame; check_frames_reached
    compat/       SLM-Lab's v4 layout and renamed env ids
The env section's schema is slm_lab.env.schema (ENV_SCHEMA is handed on here).
"""
from slm_lab.env.schema import ENV_PLANNED_KEYS, ENV_SCHEMA
from slm_lab.spec.diff import diff_specs
from slm_lab.spec.frames import check_frames_reached, session_max_frame
from slm_lab.spec.load import load_raw_spec, load_run_spec, load_spec, merge_specs, settles_kernels
from slm_lab.spec.overrides import apply_overrides, parse_override, set_by_path
from slm_lab.spec.read import (MAX_SPEC_DEPTH, MAX_SPEC_VALUES, YAML_EXTS, check_spec_name, get_raw_spec,
                               read_spec_file, spec_depth_error, strip_trailing_commas)
from slm_lab.spec.validate import (AGENT_SCHEMA, MAX_SEED, MAX_SESSIONS, MAX_THREADS, MAX_TRIALS, META_SCHEMA,
                                   RUNTIME_META, TOP_SCHEMA, validate_spec)

__all__ = [
    'AGENT_SCHEMA', 'ENV_PLANNED_KEYS', 'ENV_SCHEMA', 'MAX_SEED', 'MAX_SESSIONS', 'MAX_SPEC_DEPTH', 'MAX_SPEC_VALUES',
    'MAX_THREADS', 'MAX_TRIALS', 'META_SCHEMA', 'RUNTIME_META', 'TOP_SCHEMA', 'YAML_EXTS', 'apply_overrides',
    'check_spec_name', 'diff_specs', 'get_raw_spec', 'load_raw_spec', 'load_run_spec', 'load_spec', 'merge_specs',
    'parse_override', 'settles_kernels',
    'read_spec_file', 'session_max_frame', 'check_frames_reached', 'set_by_path', 'spec_depth_error',
    'strip_trailing_commas',
    'validate_spec',
]
