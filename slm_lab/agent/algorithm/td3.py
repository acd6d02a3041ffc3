"""Twin Delayed DDPG (TD3; Fujimoto, van Hoof and Meger 2018) for continuous actions, with
Stable-Baselines3's defaults.

Nets: a deterministic policy mu(s) = tanh(net(s)) in [-1, 1]^act_dim, twin critics Q1, Q2, and
polyak targets mu', Q1', Q2'. For a sampled batch (B transitions, terminated = 1 where the episode
truly ended; a truncated one still bootstraps from its final observation):

  target policy smoothing:  a~' = clip(mu'(s') + clip(eps, -noise_clip, noise_clip), -1, 1),
                            eps ~ N(0, policy_noise^2) per action dimension
  clipped double-Q target:  y = r + gamma * (1 - terminated) * min(Q1'(s', a~'), Q2'(s', a~'))
  critic loss:              J_Q = loss_fn(Q1(s, a), y) + loss_fn(Q2(s, a), y)
  delayed policy update:    every policy_delay-th critic step, J_mu = -mean Q1(s, mu(s)), then
                            every target moves (polyak: target <- polyak_coef * online +
                            (1 - polyak_coef) * target)

Acting: a = clip(mu(s) + N(0, sigma^2), -1, 1), sigma = explore_var_spec's value at the frame
(Gaussian exploration noise), scaled to the env's bounds; uniformly random actions before
training_start_step frames. Noise and actions are in the unit range [-1, 1], as in
Stable-Baselines3 (which scales actions so): for Pendulum's [-2, 2] a sigma of 0.1 is 0.2 torque.
Every training_frequency frames once training_start_step transitions are stored, training_iter
batches (gradient steps of the critics).
"""
from __future__ import annotations

import copy

import gymnasium as gym
import torch
import torch.nn as nn

from slm_lab.agent.algorithm.base import BASE_SCHEMA
from slm_lab.agent.algorithm.off_policy import state_action_value
from slm_lab.agent.algorithm.twin_critic import Critique, TwinCriticAlgorithm
from slm_lab.agent.net import build_net
from slm_lab.lib.decay import schedule_field
from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import MAX_FRAME, MAX_REPEATS, Field


# --- maths --------------------------------------------------------------------------------------
def smoothed_target_actions(target_actions: torch.Tensor, noise: torch.Tensor, noise_clip: float) -> torch.Tensor:
    """Target policy smoothing, (B, act_dim) each: clip(mu'(s') + clip(noise, -noise_clip,
    noise_clip), -1, 1) with noise ~ N(0, policy_noise^2) drawn by the caller."""
    return (target_actions + noise.clamp(-noise_clip, noise_clip)).clamp(-1.0, 1.0)


def clipped_double_q_targets(rewards: torch.Tensor, terminateds: torch.Tensor, next_q1: torch.Tensor,
                             next_q2: torch.Tensor, gamma: float) -> torch.Tensor:
    """y = r + gamma * (1 - terminated) * min(Q1'(s', a~'), Q2'(s', a~')), all (B,). Only a
    termination drops the bootstrap: a truncated transition's s' (its final observation) still
    has a value."""
    return rewards + gamma * (1.0 - terminateds) * torch.min(next_q1, next_q2)


def deterministic_policy_loss(q1: torch.Tensor) -> torch.Tensor:
    """J_mu = -mean Q1(s, mu(s)), q1 (B,): descending it moves mu towards actions Q1 rates higher."""
    return -q1.mean()


# --- the algorithm ------------------------------------------------------------------------------
TD3_SCHEMA = {
    **BASE_SCHEMA,
    'action_pdtype': Field((str,), 'default', choices=('default',),
                           doc='only "default": the policy is deterministic, exploration adds Gaussian noise'),
    'action_policy': Field((str,), 'default', choices=('default',),
                           doc='only "default": mu(s) plus Gaussian noise of explore_var_spec'),
    'explore_var_spec': schedule_field(
        'schedule of the standard deviation of the Gaussian exploration noise, in the unit action range [-1, 1] '
        "(Stable-Baselines3's action_noise NormalActionNoise)",
        default={'name': 'no_decay', 'start_val': 0.1, 'end_val': 0.1, 'start_step': 0, 'end_step': 0}),
    'policy_delay': Field((int,), 2, min=1, max=MAX_REPEATS, doc='critic steps per policy step and target update'),
    'policy_noise': Field((float,), 0.2, min=0,
                          doc='standard deviation of the target policy smoothing noise (unit action range)'),
    'noise_clip': Field((float,), 0.5, min=0, doc='the smoothing noise is clipped to [-noise_clip, noise_clip]'),
    'training_iter': Field((int,), 1, min=1, max=MAX_REPEATS,
                           doc='batches (gradient steps of the critics) per training'),
    'training_frequency': Field((int,), 1, min=1, max=MAX_FRAME, doc='frames between trainings'),
    'training_start_step': Field((int,), 1000, min=1, max=MAX_FRAME,
                                 doc='frames of uniformly random actions, and transitions in memory, before training '
                                     'starts'),
}


class TD3(TwinCriticAlgorithm):
    """Twin critics, clipped double-Q targets, delayed policy updates and target policy smoothing,
    on a Replay memory; continuous (Box) actions only."""

    spec_schema = TD3_SCHEMA
    memory_names = ('Replay',)
    continuous_ok = True
    nets_doc = """a deterministic policy net (tanh of its output) and twin Q nets of
        (state, action), each with a target copy that follows it by `polyak_coef` after every policy step
        (`update_type` "polyak"; "replace" copies every `update_frequency` frames); the actor's and the
        critics' optimizers are both `optim_spec`, the critic loss is `loss_spec`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(self.action_space, gym.spaces.Box):
            raise SpecError(f'agent.algorithm.name: TD3 needs continuous (Box) actions and {self.env_spec["name"]} '
                            'has Discrete ones; use SoftActorCritic or DQN, or a continuous env')
        if self.net_spec['type'] == 'RecurrentNet':
            raise SpecError('agent.net.type: TD3 does not take a RecurrentNet; use MLPNet')
        self.init_unit_actions()
        self.net = build_net(self.net_spec, self.in_shape, self.act_dim).to(self.device)
        self.build_critics(1, self.act_dim)
        self.target_net = copy.deepcopy(self.net).requires_grad_(False)
        self.build_optimizers()
        self.policy_noise, self.noise_clip = self.algorithm_spec['policy_noise'], self.algorithm_spec['noise_clip']

    def nets(self) -> dict[str, nn.Module]:
        critics = self.critic_nets()
        return {'net': self.net, 'q1_net': critics['q1_net'], 'q2_net': critics['q2_net'],
                'target_net': self.target_net,
                'target_q1_net': critics['target_q1_net'], 'target_q2_net': critics['target_q2_net']}

    def target_pairs(self):
        return [(self.target_net, self.net), *super().target_pairs()]

    # --- acting ---------------------------------------------------------------------------------
    def policy(self, net: nn.Module, states: torch.Tensor) -> torch.Tensor:
        """mu(s) = tanh(net(s)), (B, act_dim) in [-1, 1]."""
        return torch.tanh(net(states))

    def policy_actions(self, obs):
        """clip(mu(s) + N(0, sigma^2), -1, 1), sigma explore_var_spec's at this frame, to the env's bounds."""
        actions = self.policy(self.net, self.tensor(obs)).cpu().numpy()
        sigma = self.explore_var.value(self.clock.frame)
        noisy = actions + self.rng.normal(0.0, sigma, size=actions.shape)
        return self.to_env(noisy.clip(-1.0, 1.0))

    @torch.no_grad()
    def act_greedy(self, obs):
        return self.to_env(self.policy(self.net, self.tensor(obs)).cpu().numpy())

    # --- training -------------------------------------------------------------------------------
    @torch.no_grad()
    def critic_targets(self, rewards: torch.Tensor, next_states: torch.Tensor,
                       terminateds: torch.Tensor) -> torch.Tensor:
        """y (B,) from the target nets, with smoothing noise drawn from torch's generator."""
        target_actions = self.policy(self.target_net, next_states)
        noise = torch.randn_like(target_actions) * self.policy_noise
        next_actions = smoothed_target_actions(target_actions, noise, self.noise_clip)
        return clipped_double_q_targets(rewards, terminateds,
                                        state_action_value(self.target_q1_net, next_states, next_actions),
                                        state_action_value(self.target_q2_net, next_states, next_actions), self.gamma)

    def critique(self, batch) -> Critique:
        targets = self.critic_targets(batch.rewards, batch.next_states, batch.terminateds)
        return Critique(state_action_value(self.q1_net, batch.states, batch.actions),
                        state_action_value(self.q2_net, batch.states, batch.actions), targets)

    def policy_loss(self, batch, critique):
        """(J_mu = -mean Q1(s, mu(s)), no entropy)."""
        return deterministic_policy_loss(
            state_action_value(self.q1_net, batch.states, self.policy(self.net, batch.states))), None
