"""The keys a spec's `search` block draws, read without checking their arguments (the spaces'
own checks are the search's, slm_lab.experiment.search.space): what validating a search's spec
needs to know of its block."""
from __future__ import annotations

from typing import Any

from slm_lab.lib.errors import SpecError

SPACES = ('uniform', 'quniform', 'loguniform', 'qloguniform', 'randint', 'qrandint', 'lograndint', 'qlograndint',
          'randn', 'normal', 'qrandn', 'choice', 'grid_search')


def search_leaves(block: dict, prefix: str = '') -> list[tuple[str, Any]]:
    """(key as written, arguments) of each leaf of a search block."""
    leaves = []
    for k, v in block.items():
        key = f'{prefix}.{k}' if prefix else str(k)
        if '__' in str(k):
            leaves.append((key, v))
        elif isinstance(v, list) and len(v) == 1 and isinstance(v[0], dict) and not prefix and k in ('agent', 'env'):
            leaves += search_leaves(v[0], key)  # SLM-Lab v4's one-element agent / env lists
        elif isinstance(v, dict):
            leaves += search_leaves(v, key)
        else:
            raise SpecError(f'search.{key}: expected "<key>__<space>": [...] or an object of them; '
                            f'spaces: {", ".join(SPACES)}')
    return leaves


def searched_paths(block) -> set[str]:
    """The dotted spec paths a search block draws; none for a block that is not one (its error is
    the search's to give, when it parses the block)."""
    try:
        return {key.rsplit('__', 1)[0] for key, _ in search_leaves(block)} if isinstance(block, dict) else set()
    except SpecError:
        return set()
