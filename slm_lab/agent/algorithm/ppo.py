"""PPO (Schulman et al. 2017), clipped surrogate objective with GAE advantages.

Per update, on a batch of time_horizon vector steps x num_envs (B = T*N samples):
  delta_t = r_t + gamma * V(s'_t) * (1 - terminated_t) - V(s_t)          (bootstraps truncations)
  A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1}                (done = terminated or truncated)
  R_t     = A_t + V(s_t)
then training_epoch passes over the shuffled batch in minibatches of minibatch_size (the last
one smaller when minibatch_size does not divide B, so every sample is trained on in every epoch):
  ratio   = exp(log pi(a|s) - log pi_old(a|s))
  loss    = -mean(min(ratio*A, clip(ratio, 1-eps, 1+eps)*A)) + val_loss_coef * L_V
            - entropy_coef * mean(H(pi(.|s)))
  L_V     = loss_fn(V(s), R), or with clip_vloss, per sample i:
            mean_i max(l(V_i, R_i), l(V_old_i + clip(V_i - V_old_i, -eps, eps), R_i))   (l: loss_fn per sample)
            with symlog, V, V_old and R are replaced by symlog(V), symlog(V_old), symlog(R) in L_V
"""
from __future__ import annotations

import numpy as np
import torch

from slm_lab.agent.algorithm import policy_util
from slm_lab.agent.algorithm.actor_critic import gae
from slm_lab.agent.algorithm.base import BASE_SCHEMA, Algorithm
from slm_lab.agent.memory.onpolicy import RolloutBatch
from slm_lab.agent.net import net_util
from slm_lab.agent.net.actor_critic import ActorCriticNet
from slm_lab.lib.decay import Schedule, schedule_field
from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import OMIT, Field, ignored_field


def ppo_policy_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                    clip_eps: float) -> torch.Tensor:
    """PPO's clipped surrogate, as a loss to minimise; inputs (B,).

    ratio_i = exp(log pi(a_i|s_i) - log pi_old(a_i|s_i))
    loss    = -mean_i min(ratio_i * A_i, clip(ratio_i, 1 - eps, 1 + eps) * A_i)
    """
    ratio = (log_probs - old_log_probs).exp()
    return -torch.min(ratio * advantages, ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * advantages).mean()


def ppo_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip_eps: float,
                   sample_loss) -> torch.Tensor:
    """PPO's clipped value loss; inputs (B,), `sample_loss(v, R)` gives per-sample losses (B,).

    V_clip_i = V_old_i + clip(V_i - V_old_i, -eps, eps)
    loss     = mean_i max(sample_loss(V_i, R_i), sample_loss(V_clip_i, R_i))
    The max is taken per sample, so each sample's update is held back only where moving its
    value past the clip range would lower its own loss.
    """
    clipped = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
    return torch.max(sample_loss(values, returns), sample_loss(clipped, returns)).mean()


def symlog(x: torch.Tensor) -> torch.Tensor:
    """symlog(x) = sign(x) * ln(1 + |x|): near x for small |x|, logarithmic for large ones
    (DreamerV3), so value targets of very different scales weigh alike in the value loss."""
    return torch.sign(x) * torch.log1p(x.abs())


class PPO(Algorithm):
    """Proximal Policy Optimization with clipping, on OnPolicyBatchReplay."""

    spec_schema = {
        **BASE_SCHEMA,
        'lam': Field((float,), 0.95, min=0, max=1, doc='GAE lambda'),
        'clip_eps_spec': schedule_field('schedule of the clipping epsilon', default={
            'name': 'no_decay', 'start_val': 0.2, 'end_val': 0.2, 'start_step': 0, 'end_step': 0}),
        'entropy_coef_spec': schedule_field('schedule of the entropy bonus coefficient'),
        'val_loss_coef': Field((float,), 1.0, min=0, doc="weight of the value loss (SLM-Lab's default 1)"),
        'time_horizon': Field((int,), 128, min=1, doc='vector steps per update (batch = time_horizon * num_envs)'),
        'minibatch_size': Field((int,), 4, min=1,
                                doc="samples per gradient step (the last minibatch of an epoch takes the remainder; "
                                    "SLM-Lab's default 4)"),
        'training_epoch': Field((int,), 4, min=1, doc='passes over the batch per update'),
        'normalize_advantage': Field((bool,), True, doc='standardise advantages per minibatch'),
        'normalize_advantages': Field((str,), OMIT, choices=('standardize',), planned={
            'percentile': "SLM-Lab v5's percentile scaling of advantages (DreamerV3)"},
            doc='(SLM-Lab v5) "standardize": what normalize_advantage true does (SLM-Lab v5\'s default); '
                '"percentile" is not available yet'),
        'symlog': Field((bool,), False, doc='(SLM-Lab v5) fit values in symlog space (DreamerV3): the value loss '
                                            'compares symlog(V) with symlog(R) (and symlog(V_old) with clip_vloss)'),
        'clip_vloss': Field((bool,), False, aliases=('clip_val_loss',),
                            doc='clip the value update around the old values by clip_eps '
                                '(mean over samples of the larger of the clipped and unclipped loss); '
                                "SLM-Lab v5's specs write clip_val_loss, which its code never reads (all its "
                                'published values are false): here it is an alias, so true does clip'),
        'normalize_v_targets': Field((bool,), False, planned={
            True: "SLM-Lab v5's scaling of value targets by a running std of the returns"},
            doc='(SLM-Lab v5) only false in this version'),
        'training_frequency': ignored_field('ignored, as in SLM-Lab: PPO trains every time_horizon vector steps'),
    }
    memory_names = ('OnPolicyBatchReplay',)
    # SLM-Lab's PPO also trains on whole episodes
    planned_memory_names = {'OnPolicyReplay': 'PPO on whole episodes (OnPolicyReplay)'}
    continuous_ok = True
    samples_from_policy = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        spec, net_spec = self.algorithm_spec, self.net_spec
        head = policy_util.PolicyHead(self.pdtype, self.act_dim, net_spec.get('log_std_init') or 0.0)
        self.model = ActorCriticNet(net_spec, self.in_dim, policy_util.pd_out_dim(self.pdtype, self.act_dim),
                                    head).to(self.device)
        actor_spec = net_spec['actor_optim_spec']
        if actor_spec and not self.model.shared:
            critic_spec = actor_spec if net_spec['use_same_optim'] else (net_spec['critic_optim_spec'] or actor_spec)
            self.optimizers = {
                'actor': net_util.make_optimizer(self.model.actor_parameters(), actor_spec,
                                                 'agent.net.actor_optim_spec'),
                'critic': net_util.make_optimizer(self.model.critic_parameters(), critic_spec,
                                                  'agent.net.critic_optim_spec'),
            }
        elif actor_spec:  # a shared net is the actor's net: SLM-Lab gives it actor_optim_spec (critic_ is unused)
            self.optimizers = {'net': net_util.make_optimizer(self.model.parameters(), actor_spec,
                                                              'agent.net.actor_optim_spec')}
        else:
            self.optimizers = {'net': net_util.make_optimizer(self.model.parameters(), net_spec['optim_spec'])}
        self.lr_schedulers = {}
        for name, opt in self.optimizers.items():
            sched = net_util.make_lr_scheduler(opt, net_spec['lr_scheduler_spec'], self.clock)
            if sched:
                self.lr_schedulers[name] = sched
        self.loss_fn = net_util.make_loss(net_spec['loss_spec'])
        # clip_vloss takes its max per sample, so it needs the loss before reduction
        self.sample_loss_fn = net_util.make_loss({**net_spec['loss_spec'], 'reduction': 'none'})
        self.clip_eps = Schedule(spec['clip_eps_spec'])
        self.lam, self.val_loss_coef = spec['lam'], spec['val_loss_coef']
        self.minibatch_size, self.training_epoch = spec['minibatch_size'], spec['training_epoch']
        self.normalize_advantage, self.clip_vloss = spec['normalize_advantage'], spec['clip_vloss']
        self.symlog = spec['symlog']

    @classmethod
    def check_spec(cls, spec: dict) -> None:
        super().check_spec(spec)
        algo = spec['agent']['algorithm']
        if algo.get('normalize_advantages') == 'standardize' and not algo['normalize_advantage']:
            raise SpecError('agent.algorithm.normalize_advantages: "standardize" contradicts normalize_advantage: '
                            'false; keep one of the two')

    def clip_groups(self):
        """Separate actor and critic nets clip their gradients each on its own (SLM-Lab steps them
        in separate train steps), whether they share an optimizer or not."""
        if self.model.shared:
            return super().clip_groups()
        return [self.model.actor_parameters(), self.model.critic_parameters()]

    def nets(self):
        return {'model': self.model}

    def schedule_values(self):
        return {**super().schedule_values(), 'clip_eps': self.clip_eps.value(self.clock.frame)}

    @torch.no_grad()
    def act(self, obs):
        out = self.model.pd_out(self.tensor(obs))
        actions = policy_util.sample_actions(out, self.model.head, self.action_policy,
                                             self.explore_var.value(self.clock.frame), self.rng, self.act_dim)
        return policy_util.to_env_actions(actions, self.action_space)

    @torch.no_grad()
    def act_greedy(self, obs):
        out = self.model.pd_out(self.tensor(obs))
        return policy_util.to_env_actions(policy_util.PolicyHead.greedy(out, self.pdtype), self.action_space)

    def update(self, obs, action, reward, next_obs, terminated, truncated):
        self.memory.add(obs, action, reward, next_obs, terminated, truncated)
        if not self.memory.is_full:
            return None
        return self.train(self.memory.sample())

    @torch.no_grad()
    def advantages(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """GAE over a (T, N) batch: (advantages (T*N,), returns (T*N,), old values (T*N,))."""
        T, N = batch.rewards.shape
        states, next_states = self.tensor(batch.flat('states')), self.tensor(batch.flat('next_states'))
        values = self.model.value(states).reshape(T, N)
        next_values = self.model.value(next_states).reshape(T, N)
        terminateds = self.tensor(batch.terminateds)
        dones = torch.maximum(terminateds, self.tensor(batch.truncateds))
        advs = gae(self.tensor(batch.rewards), values, next_values, terminateds, dones, self.gamma, self.lam)
        return advs.reshape(-1), (advs + values).reshape(-1), values.reshape(-1)

    def train(self, batch: RolloutBatch) -> dict:
        advs, returns, old_values = self.advantages(batch)
        T, N = batch.rewards.shape
        states = self.tensor(batch.flat('states'))
        actions = policy_util.pd_actions(torch.as_tensor(batch.flat('actions'), device=self.device), self.pdtype)
        with torch.no_grad():
            old_log_probs = self.model.head.distribution(self.model.pd_out(states)).log_prob(actions)
        frame = self.clock.frame
        clip_eps = self.clip_eps.value(frame)
        entropy_coef = self.entropy_coef.value(frame)
        entropy_coef = 0.0 if np.isnan(entropy_coef) else entropy_coef
        losses, entropies, norms = [], [], []
        batch_size = T * N
        mb_size = min(self.minibatch_size, batch_size)
        for _ in range(self.training_epoch):
            perm = torch.randperm(batch_size, device=self.device)
            for start in range(0, batch_size, mb_size):  # the last minibatch holds the remainder
                idx = perm[start:start + mb_size]
                out, v = self.model.pd_out_and_value(states[idx])
                pd = self.model.head.distribution(out)
                adv = advs[idx]
                if self.normalize_advantage and len(idx) > 1:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                pg_loss = ppo_policy_loss(pd.log_prob(actions[idx]), old_log_probs[idx], adv, clip_eps)
                v_fit, old_fit, returns_fit = v, old_values[idx], returns[idx]
                if self.symlog:
                    v_fit, old_fit, returns_fit = symlog(v_fit), symlog(old_fit), symlog(returns_fit)
                if self.clip_vloss:
                    v_loss = ppo_value_loss(v_fit, old_fit, returns_fit, clip_eps, self.sample_loss_fn)
                else:
                    v_loss = self.loss_fn(v_fit, returns_fit)
                entropy = pd.entropy().mean()
                loss = pg_loss + self.val_loss_coef * v_loss - entropy_coef * entropy
                norms.append(self.step_optimizers(loss))
                losses.append(loss.detach())
                entropies.append(entropy.detach())
        self.step_lr_schedulers()
        return {'loss': float(torch.stack(losses).mean()), 'entropy': float(torch.stack(entropies).mean()),
                'grad_norm': float(np.mean(norms))}
