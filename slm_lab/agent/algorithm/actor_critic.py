"""Advantage Actor-Critic (A2C; Mnih et al. 2016), SLM-Lab's `ActorCritic`.

Per update, on a batch of T steps of N sub-envs (B = T*N samples; whole episodes are N = 1):
  advantages and value targets, by the first of these the spec gives:
    lam (GAE):               A_t = GAE(gamma, lam),              V_target_t = A_t + V(s_t)
    num_step_returns n:      R_t = n-step return (nstep_returns), A_t = R_t - V(s_t), V_target_t = R_t
    neither (plain returns): R_t = discounted return to the episode or batch end, A_t = R_t - V(s_t)
  policy loss = -policy_loss_coef * mean(log pi(a|s) * standardize(A)) - entropy_coef * mean(H(pi(.|s)))
  value loss  = val_loss_coef * loss_fn(V(s), V_target)     (both scaled by a running std of the
                targets when normalize_v_targets; see ReturnNormalizer)
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
from slm_lab.agent.memory.onpolicy import EpisodeBatch, RolloutBatch
from slm_lab.agent.net import net_util
from slm_lab.agent.net.actor_critic import ActorCriticNet
from slm_lab.lib.decay import schedule_field
from slm_lab.lib.schema import MAX_FRAME, Field


# --- the maths ------------------------------------------------------------------------------------

def gae(rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor, terminateds: torch.Tensor,
        dones: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """Generalised advantage estimates over a (T, N) rollout; all inputs (T, N), floats.

    delta_t = r_t + gamma * (1 - terminated_t) * V(s'_t) - V(s_t)
    A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1},   A_T = 0
    s'_t is the true next state (the final observation when the episode ended at t). Only a
    termination drops the bootstrap V(s'_t): a truncated episode's last state still has a
    future. Both end the recursion, since A_{t+1} belongs to the next episode (done_t =
    terminated_t or truncated_t). At the batch end the recursion stops too and V(s'_{T-1})
    carries the rest.
    """
    deltas = rewards + gamma * (1.0 - terminateds) * next_values - values
    discounts = gamma * lam * (1.0 - dones)  # each element as the per-step form computes it
    if deltas.device.type == 'cpu' and not deltas.requires_grad:
        # the recursion on the tensors' numpy views: the same float32 operations, each one
        # rounded as torch's, at a third of the cost per step (T steps of a few elements each)
        d, c = deltas.numpy(), discounts.numpy()
        advantages = torch.empty_like(deltas)
        out = advantages.numpy()
        running = np.zeros_like(d[0])
        with np.errstate(all='ignore'):  # silent on inf / nan as torch is (a diverged run says so in one line)
            for t in range(len(d) - 1, -1, -1):
                running = d[t] + c[t] * running
                out[t] = running
        return advantages
    advantages = torch.zeros_like(deltas)
    running = torch.zeros_like(deltas[0])
    for t in range(len(deltas) - 1, -1, -1):
        running = deltas[t] + discounts[t] * running
        advantages[t] = running
    return advantages


def episode_returns(rewards: torch.Tensor, next_values: torch.Tensor, terminateds: torch.Tensor,
                    dones: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted returns to each episode's end over a (T, N) rollout; all inputs (T, N), floats.

    R_t = r_t + gamma * (1 - terminated_t) * [(1 - done_t) * R_{t+1} + done_t * V(s'_t)],   R_T = 0
    A terminated episode's return stops at its last reward; a truncated one's bootstraps from the
    value of its final observation (its state still had a future); an episode still running at
    the batch end is cut there, without a bootstrap (a Monte-Carlo return of what was seen).
    """
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in range(len(rewards) - 1, -1, -1):
        future = (1.0 - dones[t]) * running + dones[t] * next_values[t]
        running = rewards[t] + gamma * (1.0 - terminateds[t]) * future
        returns[t] = running
    return returns


def nstep_returns(rewards: torch.Tensor, next_values: torch.Tensor, terminateds: torch.Tensor,
                  dones: torch.Tensor, gamma: float, n: int) -> torch.Tensor:
    """n-step returns over a (T, N) rollout; all inputs (T, N), floats.

    R_t = sum_{k<h} gamma^k r_{t+k} + gamma^h * (1 - terminated_{t+h-1}) * V(s'_{t+h-1})
    where the horizon h = min(n, T - t, 1 + the steps from t to the first episode end at or after t):
    the sum stops after n rewards, at the batch end, or at the end of the episode, and bootstraps
    from the value of the true next state where it stops, except where the episode terminated
    (a truncated episode's last state still has a future). On a batch of exactly n steps this is
    A3C's return: each step's rewards to the batch end, then V of the last next state.
    """
    T = len(rewards)
    zeros = torch.zeros_like(rewards)

    def ahead(x: torch.Tensor, k: int) -> torch.Tensor:  # x_{t+k} at row t, 0 past the batch end
        return torch.cat([x[k:], zeros[:k]]) if k else x

    returns = torch.zeros_like(rewards)
    open_ = torch.ones_like(rewards)  # 1 while R_t's horizon has not been reached
    last = torch.zeros_like(rewards)
    last[T - 1:] = 1.0  # the batch end stops every sum
    for k in range(min(n, T)):
        returns = returns + open_ * gamma ** k * ahead(rewards, k)
        stops = ahead(torch.maximum(dones, last), k) if k < n - 1 else torch.ones_like(rewards)
        bootstrap = gamma ** (k + 1) * (1.0 - ahead(terminateds, k)) * ahead(next_values, k)
        returns = returns + open_ * stops * bootstrap
        open_ = open_ * (1.0 - stops)
    return returns


def standardize(x: torch.Tensor) -> torch.Tensor:
    """(x - mean(x)) / (std(x) + 1e-8) over a (B,) batch, std with Bessel's correction as in
    SLM-Lab; a single value is kept as it is."""
    return (x - x.mean()) / (x.std() + 1e-8) if len(x) > 1 else x


def actor_critic_policy_loss(log_probs: torch.Tensor, advantages: torch.Tensor, entropy: torch.Tensor,
                             policy_loss_coef: float, entropy_coef: float) -> torch.Tensor:
    """The A2C policy loss, to minimise; log_probs and advantages (B,), entropy (B,):

    loss = -policy_loss_coef * mean_i(log pi(a_i|s_i) * A_i) - entropy_coef * mean_i(H_i)
    (the advantages are used as given: standardise them first if wanted)."""
    return -policy_loss_coef * (log_probs * advantages).mean() - entropy_coef * entropy.mean()


class ReturnNormalizer:
    """SLM-Lab v5's running scale of value targets (normalize_v_targets).

    Keeps the mean and variance of every target seen (Chan et al.'s merge of batch moments):
      mean' = mean + delta * b / (c + b),   M2' = M2 + var_b * b + delta^2 * c * b / (c + b),
      var = M2' / (c + b) once more than one target was seen (1 before),
    with delta = mean_b - mean, c the count so far and b, mean_b, var_b (population) the batch's.
    scale(v) = clamp(v / max(sqrt(var + 1e-8), 1), -10, 10): divided by the running std (never
    enlarged), not centred, and clipped, as SLM-Lab applies it to both predictions and targets.
    """

    def __init__(self, epsilon: float = 1e-8, clip: float = 10.0):
        self.epsilon, self.clip = epsilon, clip
        self.mean, self.var, self.m2, self.count = 0.0, 1.0, 0.0, 0

    def update(self, values: torch.Tensor) -> None:
        """Fold a batch of targets (any shape) into the running moments."""
        batch = values.detach().flatten().double()
        n = len(batch)
        if n == 0:
            return
        batch_mean = float(batch.mean())
        batch_var = float(batch.var(correction=0)) if n > 1 else 0.0
        delta, total = batch_mean - self.mean, self.count + n
        self.mean += delta * n / total
        self.m2 += batch_var * n + delta ** 2 * self.count * n / total
        self.count = total
        if self.count > 1:
            self.var = self.m2 / self.count

    def scale(self, values: torch.Tensor) -> torch.Tensor:
        std = max(math.sqrt(self.var + self.epsilon), 1.0)
        return torch.clamp(values / std, -self.clip, self.clip)

    def state_dict(self) -> dict:
        return {'mean': self.mean, 'var': self.var, 'm2': self.m2, 'count': self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.m2 = float(state['mean']), float(state['var']), float(state['m2'])
        self.count = int(state['count'])


# --- the algorithm ----------------------------------------------------------------------------------

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
