"""SLM-Lab v4's spec layout, read as v5's flat one: one-element `agent` and `env` lists, and the
`body` block that paired agents with envs."""
from __future__ import annotations

import json

from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import suggest

V4_BODY_PRODUCTS = ('outer', 'inner', 'custom')
# Algorithm keys whose default is SLM-Lab v5's where v4's class of the same name learned otherwise:
# a spec in v4's layout that leaves one out gets v4's value, so it learns as it did in v4.2.4.
V4_ALGORITHM_KEYS = {
    'DQN': {'double_q': False},  # v4's DQNBase picks and values the next action with the target net
}


def raw_section(spec, key: str):
    """A raw spec's `agent` or `env` section in either layout (v4's one-element list unwrapped);
    None when the spec or section is not an object (the validator says why, where it matters)."""
    section = spec.get(key) if isinstance(spec, dict) else None
    section = section[0] if isinstance(section, list) and section else section
    return section if isinstance(section, dict) else None


def is_v4_layout(spec: dict) -> bool:
    """Whether a raw spec is in SLM-Lab v4's layout: `agent` or `env` a list, or a `body` block
    (v5's specs, and the lab's own, are flat)."""
    return isinstance(spec.get('agent'), list) or isinstance(spec.get('env'), list) or 'body' in spec


def flatten_v4_layout(spec: dict) -> None:
    """SLM-Lab v4's layout made flat (v5's), in place: `agent` and `env` given as one-element lists
    are unwrapped, and the `body` block is checked and removed. `body` is SLM-Lab's multi-agent
    pairing of agents with envs (`product` of the agent and env lists, `num` bodies), which
    SLM-Lab v4 checks but no longer reads: with one agent in one env every product is that one
    pair. Several agents, envs or bodies are refused, naming the key. The algorithm keys of
    V4_ALGORITHM_KEYS that a v4 spec leaves out are set to v4's values: once flat, a spec no longer
    says which generation it was written for."""
    v4 = is_v4_layout(spec)
    for key in ('agent', 'env'):
        value = spec.get(key)
        if isinstance(value, list):
            if len(value) != 1:
                raise SpecError(f'{key}: a list of {len(value)} {key}s is SLM-Lab\'s multi-agent layout, which this '
                                f'lab does not have (one agent in one env); give one {key} object')
            spec[key] = value[0]
    if v4:
        _set_v4_algorithm_keys(spec)
    if 'body' not in spec:
        return
    body = spec.pop('body')
    if not isinstance(body, dict):
        raise SpecError(f'body: expected an object such as {{"product": "outer", "num": 1}}, got '
                        f'{type(body).__name__} {body!r}')
    for key in body:
        if key not in ('product', 'num'):
            raise SpecError(f'body.{key}: unknown key{suggest(key, ("product", "num"))}; valid keys: product, num')
    product = body.get('product', 'outer')
    if product not in V4_BODY_PRODUCTS:
        raise SpecError(f'body.product: {product!r} is not valid{suggest(product, V4_BODY_PRODUCTS)}; valid values: '
                        f'{", ".join(V4_BODY_PRODUCTS)} (all mean the one agent-env pair here)')
    num = body.get('num', 1)
    if num not in (1, [1]) or isinstance(num, bool):
        raise SpecError(f'body.num: {json.dumps(num)} bodies is SLM-Lab\'s multi-agent layout, which this lab does '
                        'not have (one agent in one env); use "num": 1 or remove body')


def _set_v4_algorithm_keys(spec: dict) -> None:
    agent = spec.get('agent')
    algorithm = agent.get('algorithm') if isinstance(agent, dict) else None
    name = algorithm.get('name') if isinstance(algorithm, dict) else None
    if isinstance(name, str):
        for key, value in V4_ALGORITHM_KEYS.get(name, {}).items():
            algorithm.setdefault(key, value)
