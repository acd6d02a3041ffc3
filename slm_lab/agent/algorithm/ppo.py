"""PPO (Schulman et al. 2017), clipped surrogate objective with GAE advantages.

Per update, on a batch of time_horizon vector steps x num_envs (B = T*N samples):
  delta_t = r_t + gamma * V(s'_t) * (1 - terminated_t) - V(s_t)          (bootstraps truncations)
  A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1}                (done = terminated or truncated)
  R_t     = A_t + V(s_t)
then training_epoch passes over shuffled minibatches of minibatch_size:
  ratio   = exp(log pi(a|s) - log pi_old(a|s))
  loss    = -mean(min(ratio*A, clip(ratio, 1-eps, 1+eps)*A)) + val_loss_coef * loss_fn(V(s), R)
            - entropy_coef * mean(H(pi(.|s)))
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from slm_lab.agent.algorithm import policy_util
from slm_lab.agent.algorithm.base import BASE_SCHEMA, Algorithm
from slm_lab.agent.net import MLPNet, net_util
from slm_lab.lib.decay import Schedule, schedule_field
from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import Field


class ActorCriticNet(nn.Module):
    """Policy and value function: one MLP with two heads (net.shared) or two MLPs.
    Input (B, obs_dim); `pd_out` gives (B, act_dim) logits or means, `value` gives (B,)."""

    def __init__(self, net_spec: dict, in_dim: int, act_dim: int, pdtype: str):
        super().__init__()
        self.shared = net_spec['shared']
        if self.shared:
            self.body = MLPNet(net_spec, in_dim, [act_dim, 1], out_gains=[0.01, 1.0])
        else:
            self.actor = MLPNet(net_spec, in_dim, act_dim, out_gains=[0.01])
            self.critic = MLPNet(net_spec, in_dim, 1, out_gains=[1.0])
        self.head = policy_util.PolicyHead(pdtype, act_dim)

    def pd_out(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)[0] if self.shared else self.actor(x)

    def value(self, x: torch.Tensor) -> torch.Tensor:
        return (self.body(x)[1] if self.shared else self.critic(x)).squeeze(-1)

    def pd_out_and_value(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.shared:
            out, v = self.body(x)
            return out, v.squeeze(-1)
        return self.actor(x), self.critic(x).squeeze(-1)

    def actor_parameters(self):
        return list(self.actor.parameters()) + list(self.head.parameters())


class PPO(Algorithm):
    """Proximal Policy Optimization with clipping, on OnPolicyBatchReplay."""

    spec_schema = {
        **BASE_SCHEMA,
        'lam': Field((float,), 0.95, min=0, max=1, doc='GAE lambda'),
        'clip_eps_spec': schedule_field('schedule of the clipping epsilon', default={
            'name': 'no_decay', 'start_val': 0.2, 'end_val': 0.2, 'start_step': 0, 'end_step': 0}),
        'entropy_coef_spec': schedule_field('schedule of the entropy bonus coefficient'),
        'val_loss_coef': Field((float,), 0.5, min=0, doc='weight of the value loss'),
        'time_horizon': Field((int,), 128, min=1, doc='vector steps per update (batch = time_horizon * num_envs)'),
        'minibatch_size': Field((int,), 64, min=1, doc='samples per gradient step'),
        'training_epoch': Field((int,), 4, min=1, doc='passes over the batch per update'),
        'normalize_advantage': Field((bool,), True, doc='standardise advantages per minibatch'),
        'clip_vloss': Field((bool,), False, doc='clip the value update around the old values by clip_eps'),
    }
    memory_names = ('OnPolicyBatchReplay',)
    continuous_ok = True

    @classmethod
    def check_spec(cls, spec):
        super().check_spec(spec)
        net = spec['agent']['net']
        if net['shared'] and (net['actor_optim_spec'] or net['critic_optim_spec']):
            raise SpecError('agent.net.actor_optim_spec: a shared net has one optimizer; use agent.net.optim_spec '
                            'or set agent.net.shared to false')

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        spec, net_spec = self.algorithm_spec, self.net_spec
        self.device = net_util.get_device(net_spec['gpu'])
        self.model = ActorCriticNet(net_spec, self.in_dim, self.act_dim, self.pdtype).to(self.device)
        actor_spec = net_spec['actor_optim_spec']
        if actor_spec and not self.model.shared:
            critic_spec = actor_spec if net_spec['use_same_optim'] else (net_spec['critic_optim_spec'] or actor_spec)
            self.optimizers = {
                'actor': net_util.make_optimizer(self.model.actor_parameters(), actor_spec,
                                                 'agent.net.actor_optim_spec'),
                'critic': net_util.make_optimizer(self.model.critic.parameters(), critic_spec,
                                                  'agent.net.critic_optim_spec'),
            }
        else:
            self.optimizers = {'net': net_util.make_optimizer(self.model.parameters(), net_spec['optim_spec'])}
        self.lr_schedulers = {}
        for name, opt in self.optimizers.items():
            sched = net_util.make_lr_scheduler(opt, net_spec['lr_scheduler_spec'], self.clock)
            if sched:
                self.lr_schedulers[name] = sched
        self.loss_fn = net_util.make_loss(net_spec['loss_spec'])
        self.clip_eps = Schedule(spec['clip_eps_spec'])
        self.lam, self.val_loss_coef = spec['lam'], spec['val_loss_coef']
        self.minibatch_size, self.training_epoch = spec['minibatch_size'], spec['training_epoch']
        self.normalize_advantage, self.clip_vloss = spec['normalize_advantage'], spec['clip_vloss']

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
    def advantages(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """GAE over a (T, N) batch: (advantages (T*N,), returns (T*N,), old values (T*N,))."""
        T, N = batch['rewards'].shape
        states = self.tensor(batch['states']).reshape(T * N, -1)
        next_states = self.tensor(batch['next_states']).reshape(T * N, -1)
        values = self.model.value(states).reshape(T, N)
        next_values = self.model.value(next_states).reshape(T, N)
        rewards, term = self.tensor(batch['rewards']), self.tensor(batch['terminateds'])
        dones = torch.maximum(term, self.tensor(batch['truncateds']))
        deltas = rewards + self.gamma * next_values * (1.0 - term) - values
        advs = torch.zeros_like(deltas)
        running = torch.zeros(N, device=self.device)
        for t in range(T - 1, -1, -1):
            running = deltas[t] + self.gamma * self.lam * (1.0 - dones[t]) * running
            advs[t] = running
        return advs.reshape(-1), (advs + values).reshape(-1), values.reshape(-1)

    def train(self, batch: dict) -> dict:
        advs, returns, old_values = self.advantages(batch)
        T, N = batch['rewards'].shape
        states = self.tensor(batch['states']).reshape(T * N, -1)
        actions = torch.as_tensor(batch['actions'], device=self.device).reshape((T * N,) + batch['actions'].shape[2:])
        if self.pdtype != 'Normal':
            actions = actions.long()
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
            for start in range(0, batch_size - mb_size + 1, mb_size):
                idx = perm[start:start + mb_size]
                out, v = self.model.pd_out_and_value(states[idx])
                pd = self.model.head.distribution(out)
                log_probs = pd.log_prob(actions[idx])
                ratio = (log_probs - old_log_probs[idx]).exp()
                adv = advs[idx]
                if self.normalize_advantage and len(idx) > 1:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                pg_loss = -torch.min(ratio * adv, ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv).mean()
                if self.clip_vloss:
                    v_clipped = old_values[idx] + (v - old_values[idx]).clamp(-clip_eps, clip_eps)
                    v_loss = torch.max(self.loss_fn(v, returns[idx]), self.loss_fn(v_clipped, returns[idx]))
                else:
                    v_loss = self.loss_fn(v, returns[idx])
                entropy = pd.entropy().mean()
                loss = pg_loss + self.val_loss_coef * v_loss - entropy_coef * entropy
                norms.append(self.step_optimizers(loss))
                losses.append(loss.detach())
                entropies.append(entropy.detach())
        self.step_lr_schedulers()
        return {'loss': float(torch.stack(losses).mean()), 'entropy': float(torch.stack(entropies).mean()),
                'grad_norm': float(np.mean(norms))}
