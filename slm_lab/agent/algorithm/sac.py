"""Soft Actor-Critic (Haarnoja et al. 2018); SLM-Lab v5's keys, defaults and variants. This module
holds SAC for continuous actions and what every action type shares (the temperature, the keys);
sac_discrete.py holds it for discrete actions (as TorchRL keeps SACLoss and DiscreteSACLoss apart).
The registered SoftActorCritic builds the one that fits the env's actions.

Nets: a policy pi, twin critics Q1, Q2 and their polyak targets Q1', Q2' (twin_critic.py), and the
temperature alpha = exp(log_alpha), learned so that the policy's entropy tracks target_entropy.
For a sampled batch (B transitions, terminated = 1 where the episode truly ended), with continuous
actions (a tanh-squashed Gaussian, a = tanh(u), u ~ N(mu(s), sigma(s))):

  y         = r + gamma * (1 - terminated) * (min(Q1', Q2')(s', a') - alpha * log pi(a'|s')),  a' ~ pi(s')
  J_pi      = mean(alpha * log pi(a~|s) - min(Q1, Q2)(s, a~)),   a~ ~ pi(s) reparameterised
  J_Q       = loss_fn(Q1(s, a), y) + loss_fn(Q2(s, a), y)    (importance-weighted under PrioritizedReplay)
  J_alpha   = -alpha * (target_entropy - H),  H = -mean log pi(a~|s) (continuous) or the exact mean
              entropy (discrete), held fixed; log_alpha is then clamped to [log_alpha_min, log_alpha_max]

Every training_frequency frames once training_start_step transitions are stored, training_iter
batches: each steps the critics; every policy_delay-th also steps the policy and the
temperature, then moves the targets (polyak: target <- polyak_coef * online + (1 - polyak_coef) *
target; replace: a copy every update_frequency frames). Before training_start_step frames the
agent acts uniformly at random, as SLM-Lab does. Continuous actions are tanh(u) in [-1, 1],
stored so in memory and scaled to the env's bounds when executed.
"""
from __future__ import annotations

import gymnasium as gym
import torch
import torch.nn as nn

from slm_lab.agent.algorithm.base import BASE_SCHEMA
from slm_lab.agent.algorithm.maths import symlog
from slm_lab.agent.algorithm.off_policy import state_action_value
from slm_lab.agent.algorithm.twin_critic import Critique, TwinCriticAlgorithm
from slm_lab.agent.net import net_util
from slm_lab.agent.net.optim_steps import step_optimizer
from slm_lab.agent.net.squashed_gaussian import GaussianPolicy
from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import MAX_FRAME, MAX_REPEATS, Field, accepts


# --- maths --------------------------------------------------------------------------------------
def soft_q_targets(rewards: torch.Tensor, terminateds: torch.Tensor, next_values: torch.Tensor,
                   gamma: float) -> torch.Tensor:
    """y = r + gamma * (1 - terminated) * V(s'), all (B,). Only a termination drops the bootstrap:
    a truncated transition's s' (its final observation) still has a soft value."""
    return rewards + gamma * (1.0 - terminateds) * next_values


def continuous_soft_value(next_q1: torch.Tensor, next_q2: torch.Tensor, next_log_probs: torch.Tensor,
                          alpha: float | torch.Tensor) -> torch.Tensor:
    """V(s') = min(Q1'(s', a'), Q2'(s', a')) - alpha * log pi(a'|s') for one sampled a' ~ pi(s'); all (B,)."""
    return torch.min(next_q1, next_q2) - alpha * next_log_probs


def continuous_policy_loss(log_probs: torch.Tensor, q1: torch.Tensor, q2: torch.Tensor,
                           alpha: float | torch.Tensor) -> torch.Tensor:
    """J_pi = mean(alpha * log pi(a~|s) - min(Q1, Q2)(s, a~)) for reparameterised a~; inputs (B,)."""
    return (alpha * log_probs - torch.min(q1, q2)).mean()


def temperature_loss(log_alpha: torch.Tensor, entropy: torch.Tensor, target_entropy: float) -> torch.Tensor:
    """J_alpha = -exp(log_alpha) * (target_entropy - H), H held fixed: descending it raises alpha
    while the policy's entropy H is below target and lowers it above. For continuous actions H is
    -mean log pi(a~|s) over the batch, so this equals SAC's -mean(alpha * (log pi + target_entropy))."""
    return -(log_alpha.exp() * (target_entropy - entropy.detach())).sum()


# --- nets ---------------------------------------------------------------------------------------
class Temperature(nn.Module):
    """log_alpha, the entropy temperature's logarithm, as a parameter (so it rides the nets'
    state_dict and has an optimizer of its own). Starts at 0 (alpha = 1), as in SLM-Lab."""

    def __init__(self):
        super().__init__()
        self.log_alpha = nn.Parameter(torch.zeros(1))


@accepts('`"auto"` or a number')
def _check_target_entropy(value, path):
    if isinstance(value, str) and value != 'auto':
        raise SpecError(f"{path}: {value!r} is not valid; use \"auto\" (SLM-Lab's default) or a number")


SAC_SCHEMA = {
    **BASE_SCHEMA,
    'training_iter': Field((int,), None, nullable=True, min=1, max=MAX_REPEATS,
                           doc='batches (gradient steps) per training (null: env.num_envs, as in SLM-Lab v5)'),
    'training_frequency': Field((int,), 1, min=1, max=MAX_FRAME, doc='frames between trainings'),
    'training_start_step': Field((int,), None, nullable=True, min=1, max=MAX_FRAME,
                                 doc='frames of uniformly random actions, and transitions in memory, before training '
                                     "starts (null: max(1000, memory.batch_size), SLM-Lab v5's default)"),
    'policy_delay': Field((int,), 1, min=1, max=MAX_REPEATS,
                          doc='critic steps per policy and temperature step (2: TD3-style)'),
    'entropy_penalty_coef': Field((float,), 0.0, min=0,
                                  doc='discrete actions: weight of the penalty 0.5 * (H_ema - H)^2 on entropy changes '
                                      '(SD-SAC; 0: off)'),
    'symlog': Field((bool,), False, doc='(SLM-Lab v5) critic loss between symlog(Q) and symlog(y) (DreamerV3)'),
    'log_alpha_min': Field((float,), -5.0, doc='lower clamp of log_alpha after each temperature step'),
    'log_alpha_max': Field((float,), 2.0, doc='upper clamp of log_alpha after each temperature step'),
    'alpha_lr': Field((float,), None, nullable=True, min=0, min_exclusive=True,
                      doc="learning rate of the temperature's optimizer (null: net.optim_spec's lr)"),
    'fixed_alpha': Field((float,), None, nullable=True, min=0,
                         doc='a constant temperature instead of the learned one (null: learned)'),
    'alpha_anneal_frames': Field((int,), 0, min=0, max=MAX_FRAME,
                                 doc='with fixed_alpha: frames over which alpha falls linearly to 0 (0: constant)'),
    'target_entropy': Field((float, str), 'auto', check=_check_target_entropy,
                            doc='entropy the temperature steers to; "auto": -act_dim (continuous), '
                                'entropy_anneal.start_ratio * ln(n_actions) (discrete)'),
    'entropy_anneal': Field((dict,), None, nullable=True, schema={
        'start_ratio': Field((float,), 0.6, min=0, doc='target entropy / ln(n_actions) at frame 0'),
        'end_ratio': Field((float,), None, nullable=True, min=0, doc='the ratio after `frames` (null: start_ratio)'),
        'frames': Field((int,), 0, min=0, max=MAX_FRAME, doc='frames of the linear change (0: none)'),
    }, doc='discrete actions with target_entropy "auto": the ratio of ln(n_actions) the target entropy is'),
    'spectral_norm': Field((bool,), False, planned={
        True: "SLM-Lab v5's spectral normalisation of the critics' penultimate layer"},
        doc='(SLM-Lab v5) only false in this version'),
}


def action_kind(action_space: gym.Space, algo_spec: dict) -> str:
    """Which SAC an env's actions take: 'continuous' (Box), 'discrete' (Discrete, Categorical) or
    'relaxed' (Discrete on GumbelSoftmax: SLM-Lab v4's discrete SAC)."""
    if not isinstance(action_space, gym.spaces.Discrete):
        return 'continuous'
    return 'relaxed' if algo_spec.get('action_pdtype') == 'GumbelSoftmax' else 'discrete'


class SoftActorCritic(TwinCriticAlgorithm):
    """SAC with twin critics, polyak targets and a learned temperature, on Replay or PrioritizedReplay.

    The class a spec names stands for its family: constructed, it builds the member for the env's
    actions (action_kind), itself for continuous ones. A member for other actions declares them
    as a class argument (`class DiscreteSAC(SoftActorCritic, actions='discrete')`) and joins the
    family of its nearest base that declares none (CrossQ is a family of its own)."""

    spec_schema = SAC_SCHEMA
    memory_names = ('Replay', 'PrioritizedReplay')
    nets_doc = """a policy net (discrete: logits; continuous: a tanh-squashed Gaussian, the log
        std as a second output clamped to [-5, 2] unless `log_std_init` gives a learned one), twin Q nets
        with target copies that follow them as `update_type` / `polyak_coef` / `update_frequency` say, and the
        temperature log_alpha; the actor's optimizer is `optim_spec`, the critics' the critic net spec's
        `optim_spec`, the temperature's `optim_spec` at `alpha_lr`. The critic loss is `loss_spec`."""
    continuous_ok = True
    pdtypes = ('default', 'Categorical', 'GumbelSoftmax', 'Normal')
    actions = 'continuous'  # the action kind this class trains
    members: dict[str, type] = {}  # the family's classes for other action kinds, by kind

    def __init_subclass__(cls, actions: str | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if actions is None:  # a family of its own
            cls.members = {}
        else:
            cls.actions = actions
            family = next(base for base in cls.__mro__[1:] if 'members' in vars(base))
            family.members[actions] = cls

    def __new__(cls, agent_spec: dict | None = None, env_spec: dict | None = None, obs_space=None,
                action_space: gym.Space | None = None, *args, **kwargs):
        if action_space is None:  # not built from a spec (a copy): the class as it is
            return super().__new__(cls)
        return super().__new__(cls.members.get(action_kind(action_space, agent_spec['algorithm']), cls))

    derived_defaults = {'training_iter': ('env.num_envs',), 'training_start_step': ('agent.memory.batch_size',)}

    @classmethod
    def check_spec(cls, spec: dict) -> None:
        algo = spec['agent']['algorithm']
        super().check_spec(spec)
        if algo['action_pdtype'] not in cls.pdtypes:
            raise SpecError(f"agent.algorithm.action_pdtype: '{algo['action_pdtype']}' does not fit {cls.__name__}; "
                            f'use one of: {", ".join(cls.pdtypes)} ("Normal" is tanh-squashed)')
        for path, net in (('agent.net', spec['agent']['net']), ('agent.critic_net', spec['agent'].get('critic_net'))):
            if net and net['type'] == 'RecurrentNet':
                raise SpecError(f'{path}.type: {cls.__name__} does not take a RecurrentNet (SLM-Lab has no spec that '
                                'pairs them); use MLPNet')
        if algo['log_alpha_min'] > algo['log_alpha_max']:
            raise SpecError(f"agent.algorithm.log_alpha_min: {algo['log_alpha_min']} is above log_alpha_max "
                            f"{algo['log_alpha_max']}; make log_alpha_min <= log_alpha_max")
        if algo['training_iter'] is None:  # SLM-Lab v5: one gradient step per frame of a vector step
            algo['training_iter'] = spec['env']['num_envs']
        if algo['training_start_step'] is None:
            algo['training_start_step'] = max(1000, spec['agent']['memory']['batch_size'])

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        spec = self.algorithm_spec
        self.net = self.build_policy()
        self.build_critics(*self.critic_dims())
        self.fixed_alpha = spec['fixed_alpha']
        self.temperature = None if self.fixed_alpha is not None else Temperature().to(self.device)
        more = {}
        if self.temperature is not None:
            alpha_spec = dict(self.net_spec['optim_spec'])
            if spec['alpha_lr'] is not None:
                alpha_spec['lr'] = spec['alpha_lr']
            more['alpha'] = net_util.make_optimizer(self.temperature.parameters(), alpha_spec)
        self.build_optimizers(**more)
        self.log_alpha_min, self.log_alpha_max = spec['log_alpha_min'], spec['log_alpha_max']
        self.entropy_ema: float | None = None  # running entropy for entropy_penalty_coef (discrete actions)

    # --- what an action kind sets ---------------------------------------------------------------
    def build_policy(self) -> nn.Module:
        """The policy net: a tanh-squashed Gaussian over [-1, 1]^act_dim, scaled to the env's bounds."""
        policy = GaussianPolicy(self.net_spec, self.in_shape, self.act_dim).to(self.device)
        self.init_unit_actions()
        return policy

    def critic_dims(self) -> tuple[int, int]:
        """(values per critic, width of the action joined to the state): Q(s, a) of the action."""
        return 1, self.act_dim

    def nets(self):
        nets = {'net': self.net, **self.critic_nets()}
        if self.temperature is not None:
            nets['temperature'] = self.temperature
        return nets

    # --- acting -------------------------------------------------------------------------------
    def alpha(self) -> float | torch.Tensor:
        """The temperature now: exp(log_alpha), or fixed_alpha (falling linearly to 0 over
        alpha_anneal_frames when set)."""
        if self.temperature is not None:
            return self.temperature.log_alpha.detach().exp()
        frames = self.algorithm_spec['alpha_anneal_frames']
        t = min(self.clock.frame / frames, 1.0) if frames > 0 else 0.0
        return self.fixed_alpha * (1.0 - t)

    def target_entropy(self) -> float:
        value = self.algorithm_spec['target_entropy']
        return self.auto_target_entropy() if value == 'auto' else float(value)

    def auto_target_entropy(self) -> float:
        """target_entropy "auto": -act_dim."""
        return -float(self.act_dim)

    def policy_actions(self, obs):
        actions, _ = self.net.sample(self.tensor(obs), reparam=False)
        return self.to_env(actions.cpu().numpy())

    @torch.no_grad()
    def act_greedy(self, obs):
        loc, _ = self.net(self.tensor(obs))
        return self.to_env(torch.tanh(loc).cpu().numpy())

    # --- training -----------------------------------------------------------------------------
    def critique(self, batch) -> Critique:
        return self.critic_values(batch.states, batch.actions, batch.next_states, batch.rewards, batch.terminateds,
                                  self.alpha())

    def critic_values(self, states, actions, next_states, rewards, terminateds, alpha) -> Critique:
        """The online critics on the batch and the soft targets from the target critics."""
        with torch.no_grad():
            next_actions, next_log_probs = self.net.sample(next_states, reparam=False)
            next_values = continuous_soft_value(state_action_value(self.target_q1_net, next_states, next_actions),
                                                state_action_value(self.target_q2_net, next_states, next_actions),
                                                next_log_probs, alpha)
            targets = soft_q_targets(rewards, terminateds, next_values, self.gamma)
        return Critique(state_action_value(self.q1_net, states, actions),
                        state_action_value(self.q2_net, states, actions), targets)

    def critic_loss(self, q, targets, weights):
        """The twin critics' loss (TwinCriticAlgorithm.critic_loss), between symlog(Q) and
        symlog(y) with the symlog key."""
        if self.algorithm_spec['symlog']:
            q, targets = symlog(q), symlog(targets)
        return super().critic_loss(q, targets, weights)

    def policy_loss(self, batch, critique):
        """(J_pi, the policy's entropy estimate -mean log pi(a~|s), detached)."""
        actions, log_probs = self.net.sample(batch.states, reparam=True)
        q1, q2 = self.policy_q(batch.states, actions)
        return continuous_policy_loss(log_probs, q1, q2, self.alpha()), -log_probs.mean().detach()

    def policy_q(self, states, actions) -> tuple[torch.Tensor, torch.Tensor]:
        """Q1(s, a~), Q2(s, a~) for the policy loss."""
        return state_action_value(self.q1_net, states, actions), state_action_value(self.q2_net, states, actions)

    def after_policy_step(self, loss, entropy):
        """The temperature's step, when it is learned."""
        return loss if self.temperature is None else loss + self.step_temperature(entropy)

    def step_temperature(self, entropy: torch.Tensor) -> torch.Tensor:
        """One step of log_alpha on J_alpha, then the clamp. Not clipped by net.clip_grad_val:
        SLM-Lab steps the temperature without clipping."""
        opt = self.optimizers['alpha']
        loss = temperature_loss(self.temperature.log_alpha, entropy, self.target_entropy())
        self.temperature.log_alpha.grad = None  # opt.zero_grad(set_to_none=True): its one parameter
        loss.backward()
        step_optimizer(opt)  # opt.step()'s numbers without its per-call wrappers (net/optimizers.py)
        with torch.no_grad():
            self.temperature.log_alpha.clamp_(self.log_alpha_min, self.log_alpha_max)
        return loss.detach()

    # --- state ----------------------------------------------------------------------------------
    def extra_state(self) -> dict:
        return {**super().extra_state(), 'entropy_ema': self.entropy_ema}

    def load_extra_state(self, state: dict) -> None:
        super().load_extra_state(state)
        self.entropy_ema = state['entropy_ema']
