"""Command-line overrides of a spec, `-s KEY=VALUE`: a KEY named by a `${KEY}` placeholder in the
spec fills it; any other KEY is a dotted key path whose value is set."""
from __future__ import annotations

import copy
import json
import re
from typing import Any

from slm_lab.lib.errors import SpecError
from slm_lab.spec.read import MAX_SPEC_DEPTH, spec_depth_error

PLACEHOLDER_RE = re.compile(r'\$\{([A-Za-z0-9_.\-]+)\}')
TOO_DEEP = object()  # a -s value nested deeper than the JSON reader goes


def parse_override(text: str) -> tuple[str, Any]:
    """'a.b=3' -> ('a.b', 3). The value is read as JSON when it parses, else as a string."""
    if '=' not in text:
        raise SpecError(f"-s {text}: expected KEY=VALUE, e.g. -s env.max_frame=20000")
    key, raw = text.split('=', 1)
    key = key.strip()
    if not key:
        raise SpecError(f'-s {text}: the key is empty; expected KEY=VALUE')
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    except ValueError as e:  # a number of more digits than Python converts (4300)
        raise SpecError(f'-s {key}: {e.args[0].split(";")[0]}; no spec value is that long') from None
    except RecursionError:  # deeper than the JSON reader goes
        value = TOO_DEEP
    if value is TOO_DEEP or spec_depth_error(value) is not None:
        raise SpecError(f'-s {key}: the value nests objects or lists more than {MAX_SPEC_DEPTH} deep, '
                        'which no spec does; flatten it')
    return key, value


def _placeholder_paths(obj, path: str = '') -> list[tuple[str, str]]:
    """(name, key path) of every `${name}` placeholder in the string values of `obj`."""
    if isinstance(obj, str):
        return [(name, path) for name in PLACEHOLDER_RE.findall(obj)]
    if isinstance(obj, dict):
        return [found for k, v in obj.items() for found in _placeholder_paths(v, f'{path}.{k}' if path else k)]
    if isinstance(obj, list):
        return [found for i, v in enumerate(obj) for found in _placeholder_paths(v, f'{path}.{i}')]
    return []


def _placeholders(obj) -> set:
    return {name for name, _ in _placeholder_paths(obj)}


def _placeholder_text(value: Any) -> str:
    """A -s value as it reads inside a longer string: `max_frame=1e7` in "run_${max_frame}" gives
    "run_10000000" (an integral number without its float form), true gives "true", as in JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return json.dumps(value)


def _substitute(obj, values: dict):
    """`obj` with each filled placeholder replaced. A string that is one placeholder takes the
    -s value itself, so `"max_frame": "${max_frame}"` with -s max_frame=1e7 holds a number."""
    if isinstance(obj, str):
        whole = PLACEHOLDER_RE.fullmatch(obj)
        if whole and whole.group(1) in values:
            return copy.deepcopy(values[whole.group(1)])
        return PLACEHOLDER_RE.sub(
            lambda m: _placeholder_text(values[m.group(1)]) if m.group(1) in values else m.group(0), obj)
    if isinstance(obj, dict):
        return {k: _substitute(v, values) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_substitute(v, values) for v in obj]
    return obj


def set_by_path(spec: dict, path: str, value: Any) -> None:
    """Set spec[a][b][c] = value for path 'a.b.c'; list elements by index ('hid_layers.0')."""
    parts = path.split('.')
    node = spec
    for i, part in enumerate(parts[:-1]):
        node = _child(node, part, '.'.join(parts[:i + 1]), create=True)
    last = parts[-1]
    if isinstance(node, list):
        idx = _index(node, last, path)
        node[idx] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise SpecError(f'-s {path}: {".".join(parts[:-1])} is not an object')


def _index(node: list, part: str, path: str) -> int:
    if not part.lstrip('-').isdigit() or not -len(node) <= int(part) < len(node):
        raise SpecError(f'-s {path}: {part} is not a valid index of a list of {len(node)}')
    return int(part)


def _child(node, part: str, path: str, create: bool):
    if isinstance(node, list):
        return node[_index(node, part, path)]
    if not isinstance(node, dict):
        raise SpecError(f'-s {path}: cannot descend into a {type(node).__name__}')
    if part not in node or node[part] is None:
        if not create:
            raise SpecError(f'{path}: not in the spec')
        node[part] = {}
    return node[part]


def apply_overrides(spec: dict, overrides: list[str]) -> dict:
    """Apply `-s KEY=VALUE` overrides: a KEY used as a `${KEY}` placeholder in the spec is
    substituted there; any other KEY is a dotted spec path. Unfilled placeholders are an error."""
    spec = copy.deepcopy(spec)
    pairs = [parse_override(o) for o in overrides or []]
    holes = _placeholders(spec)
    values = {k: v for k, v in pairs if k in holes}
    spec = _substitute(spec, values)
    for key, value in pairs:
        if key not in holes:
            set_by_path(spec, key, value)
    missing = {}
    for name, where in _placeholder_paths(spec):
        missing.setdefault(name, where)
    if missing:
        holes_at = ', '.join(f'${{{name}}} at {where}' for name, where in sorted(missing.items()))
        fill = ' '.join(f'-s {name}=VALUE' for name in sorted(missing))
        raise SpecError(f'the spec has unfilled placeholder(s) {holes_at}; fill them with {fill}')
    return spec
