"""A small declarative schema for spec sections.

Each component (algorithm, memory, net) declares the keys it accepts as a dict of `Field`s; the
spec validator walks the spec against these and reports the first problem by its key path, e.g.
`agent.algorithm.gama: unknown key (did you mean 'gamma'?); valid keys: ...`.
"""
from __future__ import annotations

import json
import copy
import difflib
import inspect
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

from slm_lab.lib.errors import SpecError

MISSING = object()
# default of a key that stays out of the validated spec when the spec leaves it out: SLM-Lab keys
# the lab accepts but does not use (see ignored_field), so saved specs do not grow keys nobody wrote
OMIT = object()
# every JSON type, for keys whose value is not used
ANY_JSON = (bool, int, float, str, list, dict)

TYPE_NAMES = {bool: 'bool', int: 'int', float: 'number', str: 'string', list: 'list', dict: 'object'}

# Upper bounds of a spec's counts, far above any real run's (SLM-Lab's specs: at most 20 epochs or
# batches per training, frequencies of 10**5 frames, 4-layer recurrent nets): past them a value is a
# typo or a fuzzed number, refused naming its key, where it would make a run that never logs a row.
# Sizes that take memory (a replay's max_size and batch_size, time_horizon, hid_layers) are bounded
# by the memory estimate instead (slm_lab/resources.py), which names the key too.
MAX_FRAME = 10**15  # frames and steps: a thousand years at 30,000 frames/s; exact as a float (< 2**53)
MAX_REPEATS = 10_000  # passes, batches or gradient steps per training; a policy update's delay
MAX_BATCH = 10**8  # samples per gradient step (PPO's minibatch_size)
MAX_KEPT = 10_000  # snapshots kept per session
MAX_DEVICES = 1024  # GPUs or CPUs of a trial, a GPU's index
MAX_HISTORY = 1024  # observations joined into one input (frame_op_len) or one training sequence (seq_len)
MAX_RNN_WIDTH = 4096  # a recurrent net's hidden state
MAX_RNN_LAYERS = 64


@dataclass
class Field:
    """One spec key: its type(s), default, and constraints.

    types: accepted Python types (int is accepted where float is; bool never counts as a number).
    default: value filled in when the key is absent; MISSING makes the key required.
    default OMIT: the key is optional and left out of the validated spec when absent.
    nullable: whether JSON null is accepted.
    choices: the valid values (strings usually).
    min / max: inclusive numeric bounds; min_exclusive makes the lower bound strict.
    schema: for an object, the Fields of its keys (validated recursively).
    check: an extra validator `check(value, path)` that raises SpecError.
    doc: one line for docs/spec.md.
    aliases: other names accepted for this key (SLM-Lab's renamed keys); the validated spec holds
      the value under this key's name only.
    planned: values SLM-Lab accepts that need something this lab does not have yet, mapped to
      what that is; such a value is refused with the "not available yet" line.
    """

    types: tuple
    default: Any = MISSING
    nullable: bool = False
    choices: tuple | None = None
    min: float | None = None
    max: float | None = None
    min_exclusive: bool = False
    schema: dict | None = None
    check: Callable[[Any, str], None] | None = None
    doc: str = ''
    item_type: type | None = None
    aliases: tuple = ()
    planned: dict | None = None


def accepts(note: str) -> Callable:
    """Decorate a Field check function with what it accepts, in the words docs/spec.md shows in
    the key's "valid" column (so a component's own module describes its own checks)."""
    def decorate(check: Callable) -> Callable:
        check.accepts = note
        return check
    return decorate


def _offered(fld: Field) -> bool:
    """Whether an unknown key's error lists this key among the valid ones: not a key the lab (or
    SLM-Lab) sets in the specs it saves, nor one SLM-Lab's files carry that nothing reads."""
    return not fld.doc.startswith('(set by') and not (fld.types == ANY_JSON and fld.default is OMIT)


def ignored_field(doc: str) -> Field:
    """A key SLM-Lab specs carry that the component accepts and does not use (SLM-Lab itself
    ignores it there too): any JSON value, kept in the saved spec only when the spec gives it."""
    return Field(ANY_JSON, OMIT, nullable=True, doc=doc)


def not_available(path: str, what: str, hint: str = '') -> SpecError:
    """The one-line error for something SLM-Lab has that this lab does not have yet: a component,
    a key that only such a component reads, or a value of a key."""
    return SpecError(f'{path}: {what} is not available yet (not implemented in this version){hint}')


def suggest(name: str, valid) -> str:
    """' (did you mean 'x'?)' when `name` is close to one of `valid`, else ''."""
    close = difflib.get_close_matches(str(name), [str(v) for v in valid], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ''


def check_finite(value: Any, path: str = '') -> None:
    """SpecError at the first NaN or infinite number in `value` (objects and lists walked too):
    JSON readers accept NaN, Infinity and overflowing literals such as 1e400, and no spec value
    means any of them."""
    if isinstance(value, float) and not math.isfinite(value):
        written = 'NaN' if math.isnan(value) else ('Infinity' if value > 0 else '-Infinity')
        raise SpecError(f'{path or "value"}: {written} is not allowed; give a finite number')
    if isinstance(value, dict):
        for key, item in value.items():
            check_finite(item, f'{path}.{key}' if path else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_finite(item, f'{path}[{i}]')


def _integral(value: Any, types: tuple) -> Any:
    """`value` as an int when the key takes ints but not other numbers and the value is a float
    with no fractional part: SLM-Lab specs write frame counts as `1e7` or `500000.0`, and a JSON
    or YAML reader gives those as floats. Any other value is returned as it is."""
    if type(value) is float and int in types and float not in types and math.isfinite(value) \
            and value.is_integer():
        return int(value)
    return value


def _type_ok(value: Any, types: tuple) -> bool:
    if isinstance(value, bool):
        return bool in types
    if isinstance(value, int) and (int in types or float in types):
        return True
    return any(isinstance(value, t) for t in types if t not in (bool, int))


def check_value(value: Any, fld: Field, path: str) -> Any:
    """Validate one value against its Field; return the value (objects get defaults filled)."""
    if value is None:
        if fld.nullable:
            return None
        raise SpecError(f'{path}: null is not allowed; expected {_expect(fld)}')
    written, value = value, _integral(value, fld.types)  # errors quote the value as written
    for planned, what in (fld.planned or {}).items():
        if type(value) is type(planned) and value == planned:  # true is not 1 here
            raise not_available(path, f'{_json(value)} ({what})')
    if not _type_ok(value, fld.types):
        raise SpecError(f'{path}: expected {_expect(fld)}, got {type(value).__name__} {value!r}')
    check_finite(value, path)
    if fld.item_type is not None:
        value = [_integral(item, (fld.item_type,)) for item in value]
        for i, item in enumerate(value):
            if not _type_ok(item, (fld.item_type,)):
                raise SpecError(f'{path}[{i}]: expected {TYPE_NAMES.get(fld.item_type)}, got {item!r}')
    if fld.choices is not None and value not in fld.choices:
        raise SpecError(f'{path}: {_json(value)} is not valid{suggest(value, fld.choices)}; '
                        f'valid values: {", ".join(_json(c) for c in fld.choices)}')
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if fld.min is not None and (value < fld.min or (fld.min_exclusive and value == fld.min)):
            op = '>' if fld.min_exclusive else '>='
            raise SpecError(f'{path}: {_short(written)} is out of range; it must be {op} {fld.min}')
        if fld.max is not None and value > fld.max:
            raise SpecError(f'{path}: {_short(written)} is out of range; it must be <= {fld.max}')
    if fld.schema is not None:
        value = check_object(value, fld.schema, path)
    if fld.check is not None:
        fld.check(value, path)
    return value


def _short(value) -> str:
    """repr of a value as an error quotes it: an integer of hundreds of digits by its length."""
    text = repr(value)
    return f'{text[:12]}... ({len(text)} digits)' if isinstance(value, int) and len(text) > 40 else text


def _json(value) -> str:
    """A value as it is written in JSON (true, null, "name")."""
    try:
        return json.dumps(value)
    except TypeError:
        return repr(value)


def _expect(fld: Field) -> str:
    names = [TYPE_NAMES.get(t, t.__name__) for t in fld.types]
    if fld.nullable:
        names.append('null')
    return ' or '.join(names)


def _canonical_keys(obj: dict, schema: dict, path: str) -> dict:
    """`obj` with every alias key renamed to its canonical key. An alias given together with its
    canonical key is accepted only when both hold the same value."""
    out = dict(obj)
    for key, fld in schema.items():
        for alias in fld.aliases:
            if alias not in out:
                continue
            value = out.pop(alias)
            if key in out and out[key] != value:
                raise SpecError(f'{path}.{alias}: another name for {path}.{key}, which the spec also gives with a '
                                f'different value ({_json(value)} vs {_json(out[key])}); keep only {key}')
            out.setdefault(key, value)
    return out


def check_object(obj: Any, schema: dict, path: str, extra_ok: Callable[[str], bool] | None = None,
                 planned_keys: dict[str, str] | None = None) -> dict:
    """Validate a dict against `schema`: aliases, unknown keys, missing required keys, each value.
    Returns a new dict with defaults filled in, keys in schema order (aliases under their
    canonical names).

    planned_keys: keys this schema does not have that SLM-Lab reads for a component the lab does
    not have yet, mapped to what that is (e.g. 'the n-step returns of ActorCritic and SIL'); such
    a key is refused with the "not available yet" line instead of "unknown key"."""
    if not isinstance(obj, dict):
        raise SpecError(f'{path}: expected an object, got {type(obj).__name__} {obj!r}')
    obj = _canonical_keys(obj, schema, path)
    for key in obj:
        if key not in schema and not (extra_ok and extra_ok(key)):
            if planned_keys and key in planned_keys:
                raise not_available(f'{path}.{key}', planned_keys[key], '; remove the key')
            raise SpecError(f'{path}.{key}: unknown key{suggest(key, schema)}; '
                            f'valid keys: {", ".join(k for k, f in schema.items() if _offered(f))}')
    out = {}
    for key, fld in schema.items():
        if key in obj:
            out[key] = check_value(obj[key], fld, f'{path}.{key}')
        elif fld.default is OMIT:
            continue
        elif fld.default is MISSING:
            raise SpecError(f'{path}.{key}: required key is missing ({fld.doc or _expect(fld)})')
        elif fld.schema is not None and fld.default is not None:
            out[key] = check_value(_copy_default(fld.default), fld, f'{path}.{key}')
        else:
            out[key] = _copy_default(fld.default)
    for key in obj:
        if key not in schema:
            out[key] = obj[key]
    return out


def _copy_default(value):
    if isinstance(value, (dict, list)):
        return copy.deepcopy(value)
    return value


def check_torch_kwargs(cls: type, kwargs: dict, path: str, skip: tuple = ()) -> None:
    """Check that every key of `kwargs` is a keyword argument of `cls.__init__`, and that its
    value is of the kind the argument takes (torch_kind): a bool is not a number (Python's bool is
    an int, so torch would take `lr: true` as a learning rate of 1.0), a number is not a bool,
    null only where the argument's default is null."""
    params = inspect.signature(cls.__init__).parameters
    valid = [p for p in params if p not in ('self',) + skip and params[p].kind not in
             (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    for key, value in kwargs.items():
        if key not in valid:
            raise SpecError(f'{path}.{key}: not an argument of {cls.__module__}.{cls.__name__}'
                            f'{suggest(key, valid)}; valid arguments: {", ".join(valid)}')
        if isinstance(value, (dict,)):
            raise SpecError(f'{path}.{key}: expected a number, string, bool or list, got an object')
        check_torch_value(value, params[key], f'{path}.{key}', cls.__name__)
        check_float32(value, f'{path}.{key}')


def torch_kind(param: inspect.Parameter) -> tuple[str | None, bool]:
    """(kind, nullable) of a torch class's argument, from its default and type annotation: kind
    'number' (int or float), 'bool', or None when neither says (anything is passed on as given);
    nullable: whether null (None) is a value it takes."""
    default = param.default
    annotation = '' if param.annotation is inspect.Parameter.empty else str(param.annotation)
    words = set(re.findall(r'[A-Za-z_]+', annotation))
    has_default = default is not inspect.Parameter.empty
    nullable = (has_default and default is None) or bool(words & {'None', 'Optional'}) or (not has_default
                                                                                          and not annotation)
    if 'bool' in words and not words & {'int', 'float'} or (isinstance(default, bool) and not annotation):
        return 'bool', nullable
    if words & {'int', 'float'} and not words & {'bool', 'str'} or (
            type(default) in (int, float) and not annotation):
        return 'number', nullable
    return None, nullable


def check_torch_value(value: Any, param: inspect.Parameter, path: str, owner: str) -> None:
    """SpecError when `value` is not of the kind torch's argument `param` of class `owner` takes
    (see torch_kind); a list's items are checked as numbers where the argument takes numbers
    (betas, milestones)."""
    kind, nullable = torch_kind(param)
    has_default = param.default is not inspect.Parameter.empty
    default = f"; {owner}'s default: {_json(param.default)}" if has_default else ''
    if value is None:
        if kind is not None and not nullable:
            out = f" ({owner}'s default {_json(param.default)}: leave the key out for it)" if has_default else ''
            raise SpecError(f'{path}: null is not allowed; expected {_KIND_WORDS[kind]}{out}')
        return
    if kind == 'number':
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            if isinstance(item, bool) or not isinstance(item, (int, float, list)):
                where = f'{path}[{i}]' if items is value else path
                why = ' (a bool is not a number)' if isinstance(item, bool) else ''
                raise SpecError(f'{where}: expected a number, got {_json(item)}{why}{default}')
    elif kind == 'bool' and not isinstance(value, bool):
        raise SpecError(f'{path}: expected true or false, got {_json(value)}{default}')


_KIND_WORDS = {'number': 'a number', 'bool': 'true or false'}


FLOAT32_MAX = 3.4028234663852886e38


def check_float32(value: Any, path: str) -> None:
    """SpecError for a float (or a float in a list) beyond float32's range: torch's arguments
    (a learning rate, a momentum, a loss's delta) meet float32 tensors, where such a value fails
    at the first step with a RuntimeError, after the run directory exists."""
    items = value if isinstance(value, (list, tuple)) else [value]
    for i, item in enumerate(items):
        if isinstance(item, float) and math.isfinite(item) and abs(item) > FLOAT32_MAX:
            where = f'{path}[{i}]' if items is value else path
            raise SpecError(f'{where}: {item!r} is beyond float32, the precision torch trains in '
                            f'(at most {FLOAT32_MAX:.4g}); give a smaller value')
