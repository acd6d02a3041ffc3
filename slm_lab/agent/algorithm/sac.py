"""Soft Actor-Critic (Haarnoja et al. 2018) for continuous actions and, with the exact expectation
over actions (Christodoulou 2019), for discrete ones; SLM-Lab v5's keys, defaults and variants.

Nets: a policy pi, twin critics Q1, Q2 and their polyak targets Q1', Q2', and the temperature
alpha = exp(log_alpha), learned so that the policy's entropy tracks target_entropy.
For a sampled batch (B transitions, terminated = 1 where the episode truly ended):

  continuous (tanh-squashed Gaussian, a = tanh(u), u ~ N(mu(s), sigma(s))):
    y       = r + gamma * (1 - terminated) * (min(Q1', Q2')(s', a') - alpha * log pi(a'|s')),  a' ~ pi(s')
    J_pi    = mean(alpha * log pi(a~|s) - min(Q1, Q2)(s, a~)),   a~ ~ pi(s) reparameterised
  discrete (Categorical):
    y       = r + gamma * (1 - terminated) * sum_a pi(a|s') (Qbar'(s', a) - alpha * log pi(a|s'))
    J_pi    = mean(sum_a pi(a|s) (alpha * log pi(a|s) - Qbar(s, a)))
    with Qbar = (Q1 + Q2) / 2, SLM-Lab v5's choice for discrete actions (the mean counters the
    underestimation of the minimum there; SD-SAC)
  discrete on GumbelSoftmax (SLM-Lab v4's discrete SAC): the critics take (s, one_hot(a)) and the
    continuous forms above apply with a' the policy's sampled action and a~ its straight-through
    one-hot sample (rsample), log pi Categorical's; "auto" target entropy -n_actions, as in v4
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

import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from slm_lab.agent.algorithm import policy_util
from slm_lab.agent.algorithm.base import BASE_SCHEMA
from slm_lab.agent.algorithm.maths import symlog
from slm_lab.agent.algorithm.off_policy import OffPolicyAlgorithm, state_action_value
from slm_lab.agent.net import build_net, net_util
from slm_lab.agent.net.squashed_gaussian import GaussianPolicy, squashed_log_prob  # noqa: F401 (tested here)
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


def discrete_soft_value(next_logits: torch.Tensor, next_q: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
    """V(s') = sum_a pi(a|s') * (Q(s', a) - alpha * log pi(a|s')), the exact expectation over the
    actions; next_logits and next_q (B, n_actions), pi = softmax(next_logits). Returns (B,)."""
    log_pi = F.log_softmax(next_logits, dim=-1)
    return (log_pi.exp() * (next_q - alpha * log_pi)).sum(dim=-1)


def continuous_policy_loss(log_probs: torch.Tensor, q1: torch.Tensor, q2: torch.Tensor,
                           alpha: float | torch.Tensor) -> torch.Tensor:
    """J_pi = mean(alpha * log pi(a~|s) - min(Q1, Q2)(s, a~)) for reparameterised a~; inputs (B,)."""
    return (alpha * log_probs - torch.min(q1, q2)).mean()


def discrete_policy_loss(logits: torch.Tensor, q: torch.Tensor, alpha: float | torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """J_pi = mean_s sum_a pi(a|s) * (alpha * log pi(a|s) - Q(s, a)), with Q (B, n_actions) held
    fixed and pi = softmax(logits (B, n_actions)). Returns (J_pi, the mean entropy of pi, detached)."""
    log_pi = F.log_softmax(logits, dim=-1)
    pi = log_pi.exp()
    loss = (pi * (alpha * log_pi - q.detach())).sum(dim=-1).mean()
    return loss, -(pi * log_pi).sum(dim=-1).mean().detach()


def temperature_loss(log_alpha: torch.Tensor, entropy: torch.Tensor, target_entropy: float) -> torch.Tensor:
    """J_alpha = -exp(log_alpha) * (target_entropy - H), H held fixed: descending it raises alpha
    while the policy's entropy H is below target and lowers it above. For continuous actions H is
    -mean log pi(a~|s) over the batch, so this equals SAC's -mean(alpha * (log pi + target_entropy))."""
    return -(log_alpha.exp() * (target_entropy - entropy.detach())).sum()


def discrete_target_entropy(n_actions: int, start_ratio: float, end_ratio: float, anneal_frames: int,
                            frame: int) -> float:
    """SLM-Lab v5's target entropy for n discrete actions: ratio * log(n), the ratio moving
    linearly from start_ratio to end_ratio over anneal_frames frames (constant when 0)."""
    t = min(frame / anneal_frames, 1.0) if anneal_frames > 0 else 0.0
    return (start_ratio + t * (end_ratio - start_ratio)) * math.log(n_actions)


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
    'policy_delay': Field((int,), 1, min=1, max=MAX_REPEATS, doc='critic steps per policy and temperature step (2: TD3-style)'),
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


class SoftActorCritic(OffPolicyAlgorithm):
    """SAC with twin critics, polyak targets and a learned temperature, on Replay or PrioritizedReplay."""

    spec_schema = SAC_SCHEMA
    memory_names = ('Replay', 'PrioritizedReplay')
    nets_doc = """a policy net (discrete: logits; continuous: a tanh-squashed Gaussian, the log
        std as a second output clamped to [-5, 2] unless `log_std_init` gives a learned one), twin Q nets
        with target copies that follow them as `update_type` / `polyak_coef` / `update_frequency` say, and the
        temperature log_alpha; the actor's optimizer is `optim_spec`, the critics' the critic net spec's
        `optim_spec`, the temperature's `optim_spec` at `alpha_lr`. The critic loss is `loss_spec`."""
    continuous_ok = True
    uses_target_nets = True
    pdtypes = ('default', 'Categorical', 'GumbelSoftmax', 'Normal')

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
        spec, net_spec = self.algorithm_spec, self.net_spec
        self.discrete = self.pdtype in ('Categorical', 'GumbelSoftmax')
        self.relaxed = self.pdtype == 'GumbelSoftmax'  # SLM-Lab v4's discrete SAC: critics of (s, one_hot(a))
        self.critic_spec = self.critic_net_spec(self.agent_spec)
        if self.relaxed:
            self.net = build_net(net_spec, self.in_shape, self.act_dim).to(self.device)
            self.head = policy_util.PolicyHead('GumbelSoftmax', self.act_dim)
            q_in, q_out, q_extra = self.in_shape, 1, self.act_dim
        elif self.discrete:
            self.net = build_net(net_spec, self.in_shape, self.act_dim).to(self.device)
            self.head = policy_util.PolicyHead('Categorical', self.act_dim)  # epsilon_greedy / boltzmann acting
            q_in, q_out, q_extra = self.in_shape, self.act_dim, 0
        else:
            self.net = GaussianPolicy(net_spec, self.in_shape, self.act_dim).to(self.device)
            self.init_unit_actions()
            q_in, q_out, q_extra = self.in_shape, 1, self.act_dim
        self.q1_net = self.build_critic(q_in, q_out, q_extra).to(self.device)
        self.q2_net = self.build_critic(q_in, q_out, q_extra).to(self.device)
        self.target_q1_net = self.target_q2_net = None
        if self.uses_target_nets:
            self.target_q1_net = copy.deepcopy(self.q1_net).requires_grad_(False)
            self.target_q2_net = copy.deepcopy(self.q2_net).requires_grad_(False)

        self.fixed_alpha = spec['fixed_alpha']
        self.temperature = None if self.fixed_alpha is not None else Temperature().to(self.device)
        ea = spec['entropy_anneal'] or {}
        self.entropy_anneal = (ea.get('start_ratio', 0.6), ea.get('end_ratio'), ea.get('frames', 0))
        self.optimizers = {
            'actor': net_util.make_optimizer(self.net.parameters(), net_spec['optim_spec']),
            'critic': net_util.make_optimizer(list(self.q1_net.parameters()) + list(self.q2_net.parameters()),
                                              self.critic_spec['optim_spec'], self.critic_path + '.optim_spec'),
        }
        if self.temperature is not None:
            alpha_spec = dict(net_spec['optim_spec'])
            if spec['alpha_lr'] is not None:
                alpha_spec['lr'] = spec['alpha_lr']
            self.optimizers['alpha'] = net_util.make_optimizer(self.temperature.parameters(), alpha_spec)
        for name, opt in self.optimizers.items():
            sched_spec = (self.critic_spec if name == 'critic' else net_spec).get('lr_scheduler_spec')
            sched = net_util.make_lr_scheduler(opt, sched_spec, self.clock)
            if sched is not None:
                self.lr_schedulers[name] = sched
        # the critics' loss is agent.net's loss_spec, as in SLM-Lab (also with a separate critic_net)
        self.loss_fn = net_util.make_loss(net_spec['loss_spec'])
        # per-sample losses, for PrioritizedReplay's importance weights
        self.sample_loss_fn = net_util.make_loss({**net_spec['loss_spec'], 'reduction': 'none'})
        self.training_iter, self.training_frequency = spec['training_iter'], spec['training_frequency']
        self.training_start_step, self.policy_delay = spec['training_start_step'], spec['policy_delay']
        self.log_alpha_min, self.log_alpha_max = spec['log_alpha_min'], spec['log_alpha_max']
        self.train_step = 0  # critic steps so far: the policy steps on every policy_delay-th
        self.entropy_ema: float | None = None  # running entropy for entropy_penalty_coef

    # --- the pieces CrossQ changes ------------------------------------------------------------
    critic_path = 'agent.net'

    def build_critic(self, in_dim: int | tuple[int, ...], out_dim: int, extra_dim: int = 0) -> nn.Module:
        """One Q net of the critic net spec for states of shape in_dim (and actions of width
        extra_dim joined to them), before any optimizer sees its parameters (a subclass that adds
        layers does it here)."""
        return build_net(self.critic_spec, in_dim, out_dim, extra_dim=extra_dim)

    def critic_net_spec(self, agent_spec: dict) -> dict:
        """The net spec the critics are built from: agent.net (SAC)."""
        return self.net_spec

    def nets(self):
        nets = {'net': self.net, 'q1_net': self.q1_net, 'q2_net': self.q2_net}
        if self.uses_target_nets:
            nets.update(target_q1_net=self.target_q1_net, target_q2_net=self.target_q2_net)
        if self.temperature is not None:
            nets['temperature'] = self.temperature
        return nets

    def clip_groups(self):
        """Each net clipped on its own, as SLM-Lab clips each in its own train step."""
        return [list(self.net.parameters()), list(self.q1_net.parameters()), list(self.q2_net.parameters())]

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
        if value != 'auto':
            return float(value)
        if not self.discrete or self.relaxed:  # -act_dim; v4's -n_actions on GumbelSoftmax
            return -float(self.act_dim)
        start, end, frames = self.entropy_anneal
        return discrete_target_entropy(self.act_dim, start, start if end is None else end, frames, self.clock.frame)

    @torch.no_grad()
    def act(self, obs):
        n = len(obs)
        if self.clock.frame < self.training_start_step:  # uniform random actions fill the memory first
            if self.discrete:
                return self.rng.integers(0, self.act_dim, size=n)
            return self.to_env(self.rng.uniform(-1.0, 1.0, size=(n, self.act_dim)))
        x = self.tensor(obs)
        if self.discrete:
            actions = policy_util.sample_actions(self.net(x), self.head, self.action_policy,
                                                 self.explore_var.value(self.clock.frame), self.rng, self.act_dim)
            return actions.cpu().numpy()
        actions, _ = self.net.sample(x, reparam=False)
        return self.to_env(actions.cpu().numpy())

    @torch.no_grad()
    def act_greedy(self, obs):
        x = self.tensor(obs)
        if self.discrete:
            return self.net(x).argmax(dim=-1).cpu().numpy()
        loc, _ = self.net(x)
        return self.to_env(torch.tanh(loc).cpu().numpy())

    # --- training -----------------------------------------------------------------------------
    def memory_action(self, action):
        """Continuous actions are stored in [-1, 1], as the critics take them."""
        return action if self.discrete else self.to_unit(action)

    def q(self, q_net: nn.Module, states: torch.Tensor, actions: torch.Tensor | None) -> torch.Tensor:
        """Q(s, .) (B, n_actions) for discrete actions (actions None), Q(s, a) (B,) for continuous
        ones and for GumbelSoftmax's one-hot actions (B, n_actions)."""
        if self.discrete and not self.relaxed:
            return q_net(states)
        return state_action_value(q_net, states, actions)

    def critic_values(self, states, actions, next_states, rewards, terminateds, alpha):
        """(Q1(s, a) (B,), Q2(s, a) (B,), targets y (B,), Q1(s, .), Q2(s, .) (B, n) or None):
        the online critics on the batch and the soft targets from the target critics."""
        if self.relaxed:
            return self.relaxed_critic_values(states, actions, next_states, rewards, terminateds, alpha)
        q1_all = q2_all = None
        with torch.no_grad():
            if self.discrete:
                next_q = (self.target_q1_net(next_states) + self.target_q2_net(next_states)) / 2
                next_values = discrete_soft_value(self.net(next_states), next_q, alpha)
            else:
                next_actions, next_log_probs = self.net.sample(next_states, reparam=False)
                next_values = continuous_soft_value(self.q(self.target_q1_net, next_states, next_actions),
                                                    self.q(self.target_q2_net, next_states, next_actions),
                                                    next_log_probs, alpha)
            targets = soft_q_targets(rewards, terminateds, next_values, self.gamma)
        if self.discrete:
            q1_all, q2_all = self.q1_net(states), self.q2_net(states)
            index = actions.long().unsqueeze(-1)
            return q1_all.gather(-1, index).squeeze(-1), q2_all.gather(-1, index).squeeze(-1), targets, q1_all, q2_all
        return self.q(self.q1_net, states, actions), self.q(self.q2_net, states, actions), targets, None, None

    def relaxed_critic_values(self, states, actions, next_states, rewards, terminateds, alpha):
        """critic_values for GumbelSoftmax: the continuous soft value at a sampled next action."""
        with torch.no_grad():
            dist = self.head.distribution(self.net(next_states))
            next_actions = dist.sample()
            next_one_hot = F.one_hot(next_actions, self.act_dim).float()
            next_values = continuous_soft_value(self.q(self.target_q1_net, next_states, next_one_hot),
                                                self.q(self.target_q2_net, next_states, next_one_hot),
                                                dist.log_prob(next_actions), alpha)
            targets = soft_q_targets(rewards, terminateds, next_values, self.gamma)
        one_hot = F.one_hot(actions.long(), self.act_dim).float()
        return self.q(self.q1_net, states, one_hot), self.q(self.q2_net, states, one_hot), targets, None, None

    def critic_loss(self, q: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
        """loss_fn(Q, y); with importance weights w (B,), mean(w * per-sample loss)."""
        if self.algorithm_spec['symlog']:
            q, targets = symlog(q), symlog(targets)
        if weights is None:
            return self.loss_fn(q, targets)
        return (weights * self.sample_loss_fn(q, targets)).mean()

    def policy_loss(self, states, q1_all, q2_all, alpha) -> tuple[torch.Tensor, torch.Tensor]:
        """(J_pi, the policy's entropy estimate H (detached))."""
        if self.relaxed:  # straight-through one-hot actions carry the critics' gradient to the logits
            dist = self.head.distribution(self.net(states))
            actions = dist.rsample()
            log_probs = dist.log_prob(actions)
            q1, q2 = self.policy_q(states, actions)
            return continuous_policy_loss(log_probs, q1, q2, alpha), -log_probs.mean().detach()
        if self.discrete:
            loss, entropy = discrete_policy_loss(self.net(states), (q1_all + q2_all) / 2, alpha)
            coef = self.algorithm_spec['entropy_penalty_coef']
            if coef > 0:  # SD-SAC: hold the entropy near its running mean
                if self.entropy_ema is None:
                    self.entropy_ema = float(entropy)
                logits = self.net(states)
                live_entropy = -(F.softmax(logits, -1) * F.log_softmax(logits, -1)).sum(-1).mean()
                loss = loss + coef * 0.5 * (self.entropy_ema - live_entropy) ** 2
                self.entropy_ema = 0.99 * self.entropy_ema + 0.01 * float(entropy)
            return loss, entropy
        actions, log_probs = self.net.sample(states, reparam=True)
        q1, q2 = self.policy_q(states, actions)
        return continuous_policy_loss(log_probs, q1, q2, alpha), -log_probs.mean().detach()

    def policy_q(self, states, actions) -> tuple[torch.Tensor, torch.Tensor]:
        """Q1(s, a~), Q2(s, a~) for the policy loss."""
        return self.q(self.q1_net, states, actions), self.q(self.q2_net, states, actions)

    def step_temperature(self, entropy: torch.Tensor) -> torch.Tensor:
        """One step of log_alpha on J_alpha, then the clamp. Not clipped by net.clip_grad_val:
        SLM-Lab steps the temperature without clipping."""
        opt = self.optimizers['alpha']
        loss = temperature_loss(self.temperature.log_alpha, entropy, self.target_entropy())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            self.temperature.log_alpha.clamp_(self.log_alpha_min, self.log_alpha_max)
        return loss.detach()

    def train(self) -> dict:
        losses, entropies, norms = [], [], []
        for _ in range(self.training_iter):
            batch = self.memory.sample().to(self.device)
            states, weights, alpha = batch.states, batch.weights, self.alpha()
            q1, q2, targets, q1_all, q2_all = self.critic_values(
                states, batch.actions, batch.next_states, batch.rewards, batch.terminateds, alpha)
            loss = self.critic_loss(q1, targets, weights) + self.critic_loss(q2, targets, weights)
            norms.append(self.step_optimizers(loss, names=('critic',)))
            loss = loss.detach()
            self.train_step += 1
            if self.train_step % self.policy_delay == 0:
                # the critics are not trained on this loss: no gradients for them
                self.q1_net.requires_grad_(False), self.q2_net.requires_grad_(False)
                policy_loss, entropy = self.policy_loss(states, q1_all, q2_all, alpha)
                self.q1_net.requires_grad_(True), self.q2_net.requires_grad_(True)
                self.step_optimizers(policy_loss, names=('actor',), tick=False)
                loss = loss + policy_loss.detach()
                if self.temperature is not None:
                    loss = loss + self.step_temperature(entropy)
                entropies.append(float(entropy))
                self.update_targets()
            losses.append(loss)
            if batch.indices is not None:  # PrioritizedReplay: the sampled transitions' new TD errors
                with torch.no_grad():
                    errors = (torch.min(q1, q2) - targets).abs().cpu().numpy()
                self.memory.update_priorities(batch.indices, errors)
        self.step_lr_schedulers()
        metrics = {'loss': float(torch.stack(losses).mean()), 'grad_norm': sum(norms) / len(norms)}
        if entropies:
            metrics['entropy'] = sum(entropies) / len(entropies)
        return metrics

    def target_pairs(self):
        if not self.uses_target_nets:
            return []
        return [(self.target_q1_net, self.q1_net), (self.target_q2_net, self.q2_net)]

    # --- state ----------------------------------------------------------------------------------
    def extra_state(self) -> dict:
        return {'train_step': self.train_step, 'entropy_ema': self.entropy_ema}

    def load_extra_state(self, state: dict) -> None:
        self.train_step = int(state['train_step'])
        self.entropy_ema = state['entropy_ema']
