"""The differences between two specs, by key path (what a resume with an edited spec changes)."""
from __future__ import annotations

from typing import Any


def diff_specs(old: Any, new: Any, path: str = '') -> list[tuple[str, Any, Any]]:
    """Key paths whose values differ between two specs: [(path, old, new)]."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in list(old) + [k for k in new if k not in old]:
            sub = f'{path}.{key}' if path else key
            out += diff_specs(old.get(key), new.get(key), sub)
        return out
    return [] if old == new else [(path, old, new)]
