"""ActorCriticNet: a policy and a value function, as one net with two output heads or two nets."""
from __future__ import annotations

import torch
import torch.nn as nn

from slm_lab.agent.net import build_net, net_util


class ActorCriticNet(nn.Module):
    """Policy and state value from the net spec: one net of net.type with a policy head and a
    value head (net.shared), or an actor net and a critic net of that type.

    Input (B, *obs_shape), or with prepared=True a batch `prepare` made. `pd_out` gives the
    policy's raw output (B, pd_dim) (logits, means, ...), `value` gives V(s) (B,). `head` turns
    pd_out into a distribution (a PolicyHead, whose parameters, such as a state-independent log
    std, train with the actor).
    """

    def __init__(self, net_spec: dict, in_dim: int | tuple[int, ...], pd_dim: int, head: nn.Module):
        super().__init__()
        self.shared = net_spec['shared']
        if self.shared:
            self.body = build_net(net_spec, in_dim, [pd_dim, 1])
        else:
            self.actor = build_net(net_spec, in_dim, pd_dim)
            self.critic = build_net(net_spec, in_dim, 1)
        # Under init_fn every layer, the output layers included, takes the hidden activation's gain,
        # as in SLM-Lab's nets. actor_init_std / critic_init_std re-initialise the output layers
        # (orthogonal, bias 0), as SLM-Lab documents them (its ActorCritic drops them unread).
        actor_std, critic_std = net_spec.get('actor_init_std'), net_spec.get('critic_init_std')
        if actor_std is not None:
            (self.body if self.shared else self.actor).init_head(0, actor_std)
        if critic_std is not None:
            if self.shared:
                self.body.init_head(1, critic_std)
            else:
                self.critic.init_head(0, critic_std)
        self.head = head

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """A batch of observations as the nets' first layers take them (an image net's float
        conversion and division by 255; see HeadedNet): for a batch forwarded several times, the
        `prepared=True` forwards below read it as it is. The actor and the critic come from one
        net spec, so they prepare alike."""
        return (self.body if self.shared else self.actor).prepare(x)

    def forwards_per_sample(self) -> bool:
        """Whether each sample's outputs come from it alone, with no state moved and no random
        numbers drawn (net_util.forwards_per_sample): then a value taken in one batch stands for
        the same state's value in another."""
        return net_util.forwards_per_sample(self)

    def pd_out(self, x: torch.Tensor, prepared: bool = False) -> torch.Tensor:
        return self._run(self.body, x, prepared)[0] if self.shared else self._run(self.actor, x, prepared)

    def value(self, x: torch.Tensor, prepared: bool = False) -> torch.Tensor:
        v = self._run(self.body, x, prepared)[1] if self.shared else self._run(self.critic, x, prepared)
        return v.squeeze(-1)

    def pd_out_and_value(self, x: torch.Tensor, prepared: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        if self.shared:
            out, v = self._run(self.body, x, prepared)
            return out, v.squeeze(-1)
        return self._run(self.actor, x, prepared), self._run(self.critic, x, prepared).squeeze(-1)

    @staticmethod
    def _run(net: nn.Module, x: torch.Tensor, prepared: bool):
        return net.forward_prepared(x) if prepared else net(x)

    def actor_parameters(self) -> list[torch.Tensor]:
        """The actor net's and the policy head's parameters (separate nets only)."""
        return list(self.actor.parameters()) + list(self.head.parameters())

    def critic_parameters(self) -> list[torch.Tensor]:
        """The critic net's parameters (separate nets only)."""
        return list(self.critic.parameters())
