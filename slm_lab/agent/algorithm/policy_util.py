"""Action distributions and action policies: from a net's output to actions.

action_pdtype names the distribution over actions (`default`: Categorical for Discrete, Normal
for Box); action_policy names how an action is drawn from it (`default`: sample;
`epsilon_greedy`: uniform random with probability explore_var, else greedy; `boltzmann`:
sample from softmax(output / explore_var)).
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from torch import distributions as D

from slm_lab.lib.errors import SpecError

DISCRETE_PDTYPES = ('Categorical', 'Argmax')
CONTINUOUS_PDTYPES = ('Normal',)
PDTYPES = ('default',) + DISCRETE_PDTYPES + CONTINUOUS_PDTYPES
PLANNED_PDTYPES = ('GumbelSoftmax', 'Beta', 'Gumbel', 'LogNormal', 'MultivariateNormal', 'MultiCategorical',
                   'NormalTanh')
ACTION_POLICIES = ('default', 'epsilon_greedy', 'boltzmann')
# SLM-Lab v4's action policies for several action heads (its HydraDQN), not available here yet
PLANNED_ACTION_POLICIES = {
    'multi_epsilon_greedy': "an action policy for several action heads (SLM-Lab v4's HydraDQN)",
    'multi_boltzmann': "an action policy for several action heads (SLM-Lab v4's HydraDQN)",
}


def check_action_space(action_space: gym.Space, algo_spec: dict, algo_name: str, continuous_ok: bool) -> str:
    """Resolve action_pdtype for this action space; SpecError when they do not fit."""
    pdtype = algo_spec.get('action_pdtype', 'default')
    if isinstance(action_space, gym.spaces.Discrete):
        pdtype = 'Categorical' if pdtype == 'default' else pdtype
        if pdtype not in DISCRETE_PDTYPES:
            raise SpecError(f"agent.algorithm.action_pdtype: '{pdtype}' does not fit the env's Discrete actions; "
                            f'use one of: default, {", ".join(DISCRETE_PDTYPES)}')
    elif isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        if not continuous_ok:
            raise SpecError(f"agent.algorithm.name: {algo_name} needs Discrete actions but the env's actions are "
                            f'continuous (Box); use PPO or Reinforce, or a Discrete env')
        pdtype = 'Normal' if pdtype == 'default' else pdtype
        policy = algo_spec.get('action_policy', 'default')
        if policy != 'default':
            raise SpecError(f"agent.algorithm.action_policy: '{policy}' needs Discrete actions but the env's are "
                            'continuous (Box); use "default"')
        if pdtype not in CONTINUOUS_PDTYPES:
            raise SpecError(f"agent.algorithm.action_pdtype: '{pdtype}' does not fit the env's continuous (Box) "
                            f'actions; use one of: default, {", ".join(CONTINUOUS_PDTYPES)}')
    else:
        raise SpecError(f"env.name: action space {action_space} is not supported yet; "
                        'use an env with Discrete or 1-D Box actions')
    return pdtype


def action_dim(action_space: gym.Space) -> int:
    """Number of outputs a policy needs: n for Discrete, the action size for Box."""
    if isinstance(action_space, gym.spaces.Discrete):
        return int(action_space.n)
    return int(np.prod(action_space.shape))


def pd_out_dim(pdtype: str, act_dim: int) -> int:
    """Width of the policy net's output for an action distribution over act_dim actions (or
    action dimensions): logits or means, one per action."""
    return act_dim


class PolicyHead(nn.Module):
    """Turns a net's raw output into a torch distribution. For Normal it owns a
    state-independent log standard deviation (one per action dimension)."""

    def __init__(self, pdtype: str, act_dim: int, log_std_init: float = 0.0):
        super().__init__()
        self.pdtype = pdtype
        if pdtype == 'Normal':
            self.log_std = nn.Parameter(torch.full((act_dim,), float(log_std_init)))

    def distribution(self, out: torch.Tensor) -> D.Distribution:
        """out: (B, act_dim) logits or means."""
        if self.pdtype == 'Normal':
            return D.Independent(D.Normal(out, self.log_std.exp().expand_as(out)), 1)
        return D.Categorical(logits=out)

    @staticmethod
    def greedy(out: torch.Tensor, pdtype: str) -> torch.Tensor:
        """The mode: argmax for discrete, the mean for Normal."""
        return out if pdtype == 'Normal' else out.argmax(dim=-1)


def sample_actions(out: torch.Tensor, head: PolicyHead, action_policy: str, explore_var: float,
                   rng: np.random.Generator, n_actions: int | None) -> torch.Tensor:
    """Draw actions (B,) or (B, act_dim) from a net output per the action policy."""
    if head.pdtype == 'Argmax' and action_policy == 'default':
        return out.argmax(dim=-1)
    if action_policy == 'epsilon_greedy':
        greedy = PolicyHead.greedy(out, head.pdtype) if head.pdtype != 'Categorical' else out.argmax(-1)
        explore = rng.random(out.shape[0]) < explore_var
        if explore.any():
            # on the net's device: torch.where refuses operands on different devices
            random_actions = torch.as_tensor(rng.integers(0, n_actions, size=out.shape[0]), device=out.device)
            greedy = torch.where(torch.as_tensor(explore, device=out.device), random_actions, greedy)
        return greedy
    if action_policy == 'boltzmann':
        tau = max(explore_var, 1e-8)
        return D.Categorical(logits=out / tau).sample()
    return head.distribution(out).sample()


def to_env_actions(actions: torch.Tensor, action_space: gym.Space) -> np.ndarray:
    """Tensor actions to numpy. Box actions are not clipped here: the agent learns from the
    action it sampled, and the env (ClipAction, see make_env) clips what it executes."""
    a = actions.cpu().numpy()
    if isinstance(action_space, gym.spaces.Box):
        return a.astype(action_space.dtype)
    return a

