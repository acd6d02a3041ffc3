"""Advantage Actor-Critic (A2C; Mnih et al. 2016), SLM-Lab's `ActorCritic`.

Per update, on a batch of T steps of N sub-envs (B = T*N samples; whole episodes are N = 1):
  advantages and value targets, by the first of these the spec gives:
    lam (GAE):               A_t = GAE(gamma, lam),              V_target_t = A_t + V(s_t)
    num_step_returns n:      R_t = n-step return (maths.nstep_returns), A_t = R_t - V(s_t), V_target_t = R_t
    neither (plain returns): R_t = discounted return to the episode or batch end, A_t = R_t - V(s_t)
  policy loss = -policy_loss_coef * mean(log pi(a|s) * standardize(A)) - entropy_coef * mean(H(pi(.|s)))
  value loss  = val_loss_coef * loss_fn(V(s), V_target)     (both scaled by a running std of the
                targets when normalize_v_targets; see maths.ReturnNormalizer)
V(s) comes from the forward that gives the policy; V(s'_t) is V(s_{t+1}) of the same sub-env
wherever the next state has the bytes of the following state, so only the other next states
(episode ends, the batch's last step) are forwarded, all of them when the nets do not forward per
sample (a batch norm, dropout in training mode; net_util.forwards_per_sample).
A shared net steps once on policy loss + value loss; separate actor and critic nets step their
own optimizers, the actor on the policy loss and the critic on the value loss (two optimizer
steps, as in SLM-Lab).

Subclasses (PPO, SIL) reuse the pieces: `build_model` (nets, optimizers, LR schedulers),
`rollout` (a batch from either memory as tensors), `next_values`, `advantages_and_targets`,
`policy_loss`, `value_loss`, `step_losses` (each loss to its optimizer) and `train`; they override
the ones their algorithm changes and extend `extra_state` / `load_extra_state` with `super()`.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch

from slm_lab.agent.algorithm import policy_util
from slm_lab.agent.algorithm.base import BASE_SCHEMA
from slm_lab.agent.algorithm.on_policy import OnPolicyAlgorithm
from slm_lab.agent.algorithm.maths import (ReturnNormalizer, actor_critic_policy_loss, episode_returns, gae,
                                            nstep_returns, standardize)
from slm_lab.agent.memory.onpolicy import EpisodeBatch, RolloutBatch
from slm_lab.agent.net import net_util
from slm_lab.agent.net.actor_critic import ActorCriticNet
from slm_lab.lib.decay import schedule_field
from slm_lab.lib.schema import MAX_FRAME, Field


class Rollout(NamedTuple):
    """A training batch from either on-policy memory, as tensors on the algorithm's device.
    T steps of N sub-envs (an EpisodeBatch is N = 1: its episodes one after another, each
    ending with done = 1). states (T*N, *obs_shape), row t*N + n, prepared for the nets
    (ActorCriticNet.prepare: an image net's division by 255 done once for the batch); actions
    (T*N, *act_shape) (long for Discrete actions); rewards, terminateds, dones (T, N).
    next_kept (T, N) bool: the steps whose next state is not the following step's state of the
    same sub-env (memory.onpolicy.next_kept: byte for byte; every step when the nets do not
    forward per sample, see ActorCritic.rollout); next_states (K, *obs_shape), prepared: the next
    states of those K steps, in row order. The others' next state is states[(t + 1)*N + n]."""
    states: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_states: torch.Tensor
    next_kept: torch.Tensor
    terminateds: torch.Tensor
    dones: torch.Tensor


class ActorCritic(OnPolicyAlgorithm):
    """A2C with GAE, n-step or plain returns, on whole episodes (OnPolicyReplay) or batches of
    training_frequency vector steps (OnPolicyBatchReplay), with a shared or separate actor and
    critic (net.shared)."""

    spec_schema = {
        **BASE_SCHEMA,
        'lam': Field((float,), None, nullable=True, min=0, max=1,
                     doc='GAE lambda: advantages by GAE when given (null: num_step_returns decides)'),
        'num_step_returns': Field((int,), None, nullable=True, min=1, max=MAX_FRAME,
                                  doc='n of n-step returns, used when lam is null; training_frequency then '
                                      "becomes n, as in SLM-Lab (both null: plain discounted returns)"),
        'entropy_coef_spec': schedule_field('schedule of the entropy bonus coefficient'),
        'policy_loss_coef': Field((float,), 1.0, min=0, doc='weight of the policy-gradient term'),
        'val_loss_coef': Field((float,), 1.0, min=0, doc="weight of the value loss (SLM-Lab's default 1)"),
        'training_frequency': Field((int,), 1, min=1, max=MAX_FRAME,
                                    doc='OnPolicyBatchReplay: vector steps per update; OnPolicyReplay: episodes '
                                        'per update (replaced by num_step_returns for n-step returns)'),
        'normalize_v_targets': Field((bool,), False,
                                     doc='(SLM-Lab v5) divide value predictions and targets by a running std of '
                                         'the targets (at least 1), clipped to [-10, 10], in the value loss'),
        'normalize_advantage': Field((bool,), True,
                                     doc='standardise the advantages over each batch in the policy loss (SLM-Lab '
                                         "v5 does for every A2C variant; Stable-Baselines3's A2C does not)"),
    }
    memory_names = ('OnPolicyReplay', 'OnPolicyBatchReplay', 'OnPolicyCrossEntropy')
    nets_doc = """a policy and a value function. With `shared: false`, two nets with the same
        hidden layers (actor and critic); with `shared: true`, one net with a policy head and a value head. One
        optimizer from `optim_spec` on the sum of the losses, unless `shared` is false and `actor_optim_spec`
        is given: then the actor steps on the policy loss with `actor_optim_spec` and the critic on the value
        loss with `critic_optim_spec` (`actor_optim_spec` when `use_same_optim` is true or
        `critic_optim_spec` is null). A shared net takes `actor_optim_spec` when it is given (as in SLM-Lab).
        The value loss is `loss_spec`."""
    continuous_ok = True
    samples_from_policy = True

    @classmethod
    def recurrent_slots(cls, agent_spec: dict) -> int:
        """Separate actor and critic nets each carry a hidden state."""
        return 1 if agent_spec['net']['shared'] else 2

    @classmethod
    def batch_steps(cls, algo_spec: dict) -> int:
        """SLM-Lab trains n-step A2C (num_step_returns without lam) every num_step_returns vector
        steps, whatever training_frequency says."""
        if algo_spec.get('lam') is None and algo_spec.get('num_step_returns') is not None:
            return algo_spec['num_step_returns']
        return super().batch_steps(algo_spec)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        spec = self.algorithm_spec
        self.build_model()
        self.lam = spec.get('lam')
        self.num_step_returns = spec.get('num_step_returns')
        self.policy_loss_coef = spec.get('policy_loss_coef', 1.0)
        self.val_loss_coef = spec['val_loss_coef']
        self.training_frequency = spec.get('training_frequency', 1)
        if self.lam is None and self.num_step_returns is not None:
            # SLM-Lab trains n-step A2C every n steps (episodes with OnPolicyReplay), whatever
            # training_frequency says
            self.training_frequency = self.num_step_returns
        self.return_normalizer = ReturnNormalizer() if spec.get('normalize_v_targets') else None
        self.normalize_advantage = spec.get('normalize_advantage', True)

    def build_model(self) -> None:
        """self.model (an ActorCriticNet), self.optimizers and self.lr_schedulers from the net spec.
        Separate nets with actor_optim_spec get an 'actor' and a 'critic' optimizer (the critic's
        from critic_optim_spec, or actor_optim_spec with use_same_optim or when it is absent);
        a shared net gets one 'net' optimizer from actor_optim_spec (SLM-Lab ignores
        critic_optim_spec there), and a spec with only optim_spec one 'net' optimizer for all."""
        net_spec = self.net_spec
        # as in SLM-Lab: with log_std_init, a learned state-independent log std; without, the
        # policy net outputs the log scale too
        log_std_init = net_spec.get('log_std_init')
        head = policy_util.PolicyHead(self.pdtype, self.act_dim, log_std_init)
        pd_dim = policy_util.pd_out_dim(self.pdtype, self.act_dim, log_std_init)
        self.model = ActorCriticNet(net_spec, self.in_shape, pd_dim,
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
        elif actor_spec:
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

    def clip_groups(self):
        """Separate actor and critic nets clip their gradients each on its own (SLM-Lab steps them
        in separate train steps), whether they share an optimizer or not."""
        if self.model.shared:
            return super().clip_groups()
        return [self.model.actor_parameters(), self.model.critic_parameters()]

    def nets(self):
        return {'model': self.model}

    # --- acting ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def act(self, obs):
        out = self.model.pd_out(self.tensor(obs))
        return policy_util.to_env_actions(self.draw_actions(out), self.action_space)

    def draw_actions(self, out: torch.Tensor) -> torch.Tensor:
        """Actions drawn from the policy net's output under the spec's action policy."""
        return policy_util.sample_actions(out, self.model.head, self.action_policy,
                                          self.explore_var.value(self.clock.frame), self.rng, self.act_dim)

    @torch.no_grad()
    def act_greedy(self, obs):
        out = self.model.pd_out(self.tensor(obs))
        return policy_util.to_env_actions(self.model.head.greedy_action(out), self.action_space)

    # --- training -------------------------------------------------------------------------------
    def train_batch(self, batch: RolloutBatch | EpisodeBatch) -> dict:
        """One update (train, which PPO overrides) on the memory's batch."""
        return self.train(batch)

    def rollout(self, batch: RolloutBatch | EpisodeBatch) -> Rollout:
        """A memory's batch as a Rollout: (T, N) for a RolloutBatch, (T, 1) for an EpisodeBatch.
        Only the next states that are not the following state are kept, unless the nets do not
        forward per sample (a batch norm in training mode, dropout; see
        net_util.forwards_per_sample): then V(s') is a forward over every next state, as each
        such forward moves the running statistics or draws random numbers and a state's value
        depends on the batch it is in. A recurrent net's contexts qualify: within an episode the
        next context has the bytes of the following one (the same window and hidden state), and
        a context's output does not depend on the others in its batch."""
        if isinstance(batch, RolloutBatch):
            states, actions, next_states = batch.flat('states'), batch.flat('actions'), batch.flat('next_states')
            rewards, terminateds = batch.rewards, batch.terminateds
            dones = np.maximum(batch.terminateds, batch.truncateds)
        else:
            states, actions, next_states = batch.states, batch.actions, batch.next_states
            rewards, terminateds, dones = batch.rewards[:, None], batch.terminateds[:, None], batch.dones[:, None]
        if self.model.forwards_per_sample():
            kept = batch.next_kept().reshape(rewards.shape)
            next_states = next_states[kept.reshape(-1)]
        else:
            kept = np.ones(rewards.shape, dtype=bool)
        actions = torch.as_tensor(actions, device=self.device)
        actions = actions.long() if isinstance(self.action_space, gym.spaces.Discrete) else actions.float()
        prepare = self.model.prepare
        return Rollout(prepare(self.tensor(states)), actions, self.tensor(rewards), prepare(self.tensor(next_states)),
                       torch.as_tensor(kept, device=self.device), self.tensor(terminateds), self.tensor(dones))

    @torch.no_grad()
    def next_values(self, rollout: Rollout, values: torch.Tensor) -> torch.Tensor:
        """V(s'_t) (T, N) from the state values V(s_t) (T, N): V(s_{t+1}) of the same sub-env where
        the next state is the following state, a forward over rollout.next_states elsewhere (an
        episode's end, the batch's last step, or every step when the nets do not forward per
        sample)."""
        next_values = torch.empty_like(values)
        next_values[:-1] = values[1:]
        next_values[rollout.next_kept] = self.model.value(rollout.next_states, prepared=True)
        return next_values

    @torch.no_grad()
    def advantages_and_targets(self, rollout: Rollout, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Advantages and value targets (T*N,) each, from the state values V(s_t) (T, N) (no
        gradient) and V(s'_t) (next_values): by GAE when lam is given, else n-step returns when
        num_step_returns is, else discounted returns to each episode's end (see episode_returns)."""
        rewards, terminateds, dones = rollout.rewards, rollout.terminateds, rollout.dones
        next_values = self.next_values(rollout, values)
        if self.lam is not None:
            advs = gae(rewards, values, next_values, terminateds, dones, self.gamma, self.lam)
            targets = advs + values
        else:
            if self.num_step_returns is not None:
                targets = nstep_returns(rewards, next_values, terminateds, dones, self.gamma, self.num_step_returns)
            else:
                targets = episode_returns(rewards, next_values, terminateds, dones, self.gamma)
            advs = targets - values
        return advs.reshape(-1), targets.reshape(-1)

    def entropy_coef_now(self) -> float:
        """The entropy bonus coefficient at this frame (0 without entropy_coef_spec)."""
        value = self.entropy_coef.value(self.clock.frame)
        return 0.0 if np.isnan(value) else value

    def policy_loss(self, pd: torch.distributions.Distribution, actions: torch.Tensor,
                    advantages: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(policy loss, mean entropy) on a batch: advantages (B,) standardised over the batch
        (SLM-Lab v5 does so for every A2C variant) unless normalize_advantage is false, then
        actor_critic_policy_loss."""
        return self.policy_loss_of(pd.log_prob(actions), pd.entropy(), advantages)

    def policy_loss_of(self, log_probs: torch.Tensor, entropy: torch.Tensor,
                       advantages: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """policy_loss from the log-probabilities of the batch's actions and the policy's
        entropies, (B,) each."""
        advantages = standardize(advantages) if self.normalize_advantage else advantages
        loss = actor_critic_policy_loss(log_probs, advantages, entropy, self.policy_loss_coef,
                                        self.entropy_coef_now())
        return loss, entropy.mean()

    def value_loss(self, values: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """val_loss_coef * loss_fn(V(s), V_target), (B,) each; with normalize_v_targets the running
        scale takes the batch's targets first, then divides both sides."""
        if self.return_normalizer is not None:
            self.return_normalizer.update(targets)
            values, targets = self.return_normalizer.scale(values), self.return_normalizer.scale(targets)
        return self.val_loss_coef * self.loss_fn(values, targets)

    def step_losses(self, policy_loss: torch.Tensor, value_loss: torch.Tensor) -> float:
        """Separate optimizers: the actor's steps on the policy loss, the critic's on the value loss
        (one optimizer step each, counted as two); one optimizer: one step on their sum. Returns
        the gradient norm over everything stepped. The separate nets' losses reach disjoint
        parameters, so one backward of their sum gives each net the gradients its own loss's
        backward would (step_clip_groups), and each is clipped and stepped on its own as before."""
        if 'actor' in self.optimizers:
            norms = self.step_clip_groups(policy_loss + value_loss, names=('actor', 'critic'), ticks=2)
            return math.sqrt(sum(float(n) ** 2 for n in norms))
        return self.step_optimizers(policy_loss + value_loss)

    def train(self, batch: RolloutBatch | EpisodeBatch) -> dict:
        """One A2C update on a memory's batch; returns the training metrics."""
        rollout = self.rollout(batch)
        out, values = self.model.pd_out_and_value(rollout.states, prepared=True)
        advs, targets = self.advantages_and_targets(rollout, values.detach().reshape(rollout.rewards.shape))
        policy_loss, entropy = self.policy_loss_of(*self.model.head.log_prob_and_entropy(out, rollout.actions), advs)
        value_loss = self.value_loss(values, targets)
        grad_norm = self.step_losses(policy_loss, value_loss)
        self.step_lr_schedulers()
        return {'loss': float((policy_loss + value_loss).detach()), 'entropy': float(entropy.detach()),
                'grad_norm': grad_norm}

    # --- state ----------------------------------------------------------------------------------
    def extra_state(self) -> dict:
        state = super().extra_state()
        if self.return_normalizer is not None:
            state['return_normalizer'] = self.return_normalizer.state_dict()
        return state

    def load_extra_state(self, state: dict) -> None:
        super().load_extra_state(state)
        if self.return_normalizer is not None:
            self.return_normalizer.load_state_dict(state['return_normalizer'])
