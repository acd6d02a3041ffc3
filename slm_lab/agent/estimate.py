"""What a session of a validated spec needs of the machine, item by item (resources.py's module
docstring says what is counted): its nets, counted from the algorithm built once with 1-wide
layers, its memories (what each declares: Memory.storage_needs, Algorithm.owned_replay_needs), its
envs and its process. Here, above the algorithms and memories it builds and asks, so that
resources.py, which they import, imports none of them."""
from __future__ import annotations

import copy

import gymnasium as gym

from slm_lab.agent.algorithm import ALGORITHMS
from slm_lab.agent.memory import MEMORIES
from slm_lab.agent.net import MLPNet, recurrent
from slm_lab.env import Clock
from slm_lab.resources import (ASYNC_ENV_BYTES, FROZEN_PARAM_BYTES, PROCESS_BYTES, SYNC_ENV_BYTES,
                               TRAINED_PARAM_BYTES, Need, mlp_param_count)


def net_needs(spec: dict, obs_space: gym.Space, action_space: gym.Space) -> tuple[list[Need], int]:
    """The nets' memory, and the units (summed layer widths) a sample passes through in one
    forward pass of all of them. The algorithm is built once with every hidden layer 1 wide,
    which costs nothing and shows which MLPs it makes (a policy and a value net, a target net)
    and which of them an optimizer trains; their real sizes then follow from the widths."""
    net_spec = spec['agent']['net']
    if net_spec is None:
        return [], 0
    widths = list(net_spec.get('hid_layers', []))  # a TorchArcNet has none: its arc is built, and counted, as is
    tiny = copy.deepcopy(spec)
    if 'hid_layers' in net_spec:
        tiny['agent']['net']['hid_layers'] = [1] * len(widths)
    tiny['agent']['net']['gpu'] = False
    algo_cls = ALGORITHMS[spec['agent']['algorithm']['name']]
    algorithm = algo_cls(tiny['agent'], tiny['env'], obs_space, action_space, 1, Clock(1, 1), None, seed=0)
    trained = {id(p) for opt in algorithm.optimizers.values() for group in opt.param_groups for p in group['params']}
    nbytes, units, seen, in_mlps = 0, 0, set(), set()
    for net in algorithm.nets().values():
        for module in net.modules():
            if not isinstance(module, MLPNet) or id(module) in seen:
                continue
            seen.add(id(module))
            params = list(module.parameters())
            in_mlps.update(id(p) for p in params)
            per_param = TRAINED_PARAM_BYTES if any(id(p) in trained for p in params) else FROZEN_PARAM_BYTES
            nbytes += mlp_param_count(module.in_dim, widths, module.out_dims) * per_param
            units += module.in_dim + sum(widths) + sum(module.out_dims)
        for p in net.parameters():  # parameters outside the MLPs (a Normal policy's log_std) as built
            if id(p) not in in_mlps:
                in_mlps.add(id(p))
                nbytes += p.numel() * (TRAINED_PARAM_BYTES if id(p) in trained else FROZEN_PARAM_BYTES)
    return [Need('nets', 'agent.net.hid_layers', nbytes)], units


def memory_needs(spec: dict, obs_space: gym.Space, action_space: gym.Space, units: int) -> list[Need]:
    """What the replays an algorithm keeps itself need (SIL's, beside its on-policy memory:
    Algorithm.owned_replay_needs), then the memory agent.memory names (Memory.storage_needs)."""
    if spec['agent']['memory'] is None:
        return []
    algo_cls = ALGORITHMS[spec['agent']['algorithm']['name']]
    memory_cls = MEMORIES[spec['agent']['memory']['name']]
    return (algo_cls.owned_replay_needs(spec, obs_space, action_space)
            + memory_cls.storage_needs(spec, obs_space, action_space, units))


def estimate_session(spec: dict, obs_space: gym.Space, action_space: gym.Space) -> list[Need]:
    """What one session of a validated spec needs, item by item (see the module docstring).
    Observations other than a Box with a shape get no estimate: the Agent refuses them."""
    env_spec = spec['env']
    per_env = ASYNC_ENV_BYTES if env_spec['vectorization_mode'] == 'async' else SYNC_ENV_BYTES
    needs = [Need('session process', 'meta.max_session', PROCESS_BYTES),
             Need('envs', 'env.num_envs', env_spec['num_envs'] * per_env)]
    if not (isinstance(obs_space, gym.spaces.Box) and obs_space.shape):
        return needs
    nets, units = net_needs(spec, obs_space, action_space)
    net_spec = spec['agent'].get('net') or {}
    slots = ALGORITHMS[spec['agent']['algorithm']['name']].recurrent_slots(spec['agent'])
    if net_spec.get('type') == 'RecurrentNet' and slots and len(obs_space.shape) == 1:
        # its memory stores a context per step (net/recurrent.py), not the observation
            _, obs_space = recurrent.context_layout(spec['agent'], obs_space.shape[0], slots)
    return needs + nets + memory_needs(spec, obs_space, action_space, units)
