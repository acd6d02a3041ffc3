"""SLM-Lab v4's spec layout, read as v5's flat one: one-element `agent` and `env` lists, and the
`body` block that paired agents with envs."""
from __future__ import annotations

import json

from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import suggest

V4_BODY_PRODUCTS = ('outer', 'inner', 'custom')


def flatten_v4_layout(spec: dict) -> None:
    """SLM-Lab v4's layout made flat (v5's), in place: `agent` and `env` given as one-element lists
    are unwrapped, and the `body` block is checked and removed. `body` is SLM-Lab's multi-agent
    pairing of agents with envs (`product` of the agent and env lists, `num` bodies), which
    SLM-Lab v4 checks but no longer reads: with one agent in one env every product is that one
    pair. Several agents, envs or bodies are refused, naming the key."""
    for key in ('agent', 'env'):
        value = spec.get(key)
        if isinstance(value, list):
            if len(value) != 1:
                raise SpecError(f'{key}: a list of {len(value)} {key}s is SLM-Lab\'s multi-agent layout, which this '
                                f'lab does not have (one agent in one env); give one {key} object')
            spec[key] = value[0]
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
