"""PPO (Schulman et al. 2017), clipped surrogate objective with GAE advantages; an ActorCritic
(see actor_critic.py) with its own training step.

Per update, on a batch of time_horizon vector steps x num_envs (B = T*N samples), or with
OnPolicyReplay on training_frequency whole episodes (B = their steps):
  delta_t = r_t + gamma * V(s'_t) * (1 - terminated_t) - V(s_t)          (bootstraps truncations)
  A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1}                (done = terminated or truncated)
  R_t     = A_t + V(s_t)
with the weights before the update: log pi_old(a|s) and V(s) as the acting forwards computed
them (keep_acting_outputs, with one shared net on OnPolicyBatchReplay: Stable-Baselines3's way),
or from one forward over the batch that gives both together; V(s'_t) is V(s_{t+1}) of the same
sub-env wherever the next state has the bytes of the following state, and a forward over the other
next states (episode ends, the batch's last step) gives the rest. Nets that do not forward per
sample (a batch norm, dropout in training mode; net_util.forwards_per_sample) keep three forwards
over the whole batch, V(s), V(s'), pi_old, as each moves their running statistics or draws random
numbers. An image batch is divided by 255
once, not per minibatch.
Then training_epoch passes over the shuffled batch in minibatches of minibatch_size (the last
one smaller when minibatch_size does not divide B, so every sample is trained on in every epoch):
  ratio   = exp(log pi(a|s) - log pi_old(a|s))
  loss    = -mean(min(ratio*A, clip(ratio, 1-eps, 1+eps)*A)) + val_loss_coef * L_V
            - entropy_coef * mean(H(pi(.|s)))
  L_V     = loss_fn(V(s), R), or with clip_vloss, per sample i:
            mean_i max(l(V_i, R_i), l(V_old_i + clip(V_i - V_old_i, -eps, eps), R_i))   (l: loss_fn per sample)
            with symlog, V, V_old and R are replaced by symlog(V), symlog(V_old), symlog(R) in L_V;
            with normalize_v_targets (and no clip_vloss), V and R are divided by a running std of
            the minibatches' R first (ActorCritic's ReturnNormalizer, updated per minibatch)
Advantages are standardised per minibatch, or with normalize_advantages "percentile" divided by
max(1, P95 - P5), P5 and P95 moving averages of the minibatches' 5th and 95th percentiles
(PercentileNormalizer).
"""
from __future__ import annotations

import numpy as np
import torch

from slm_lab.agent.algorithm import policy_util
from slm_lab.agent.algorithm.actor_critic import ActorCritic
from slm_lab.agent.algorithm.base import BASE_SCHEMA
from slm_lab.agent.algorithm.maths import symlog
from slm_lab.agent.memory.onpolicy import EpisodeBatch, OnPolicyBatchReplay, RolloutBatch
from slm_lab.agent.net import net_util
from slm_lab.lib.decay import Schedule, schedule_field
from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import MAX_BATCH, MAX_REPEATS, OMIT, Field, ignored_field



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


SIL_KEYS = ('sil_policy_loss_coef', 'sil_val_loss_coef', 'training_batch_iter')
# SLM-Lab's lunar_pg.json names PPO with self-imitation keys (its ppo_sil_* specs). SLM-Lab's PPO
# does not read them, so those specs trained plain PPO: they run here as they ran there, with one
# warning (check_spec) telling whoever meant self-imitation that PPOSIL is its name.
_SIL_KEY_DOC = "(SLM-Lab key of SIL/PPOSIL) not read, as by SLM-Lab's PPO; a warning points to PPOSIL"
STRAY_SIL_FIELDS = {key: ignored_field(_SIL_KEY_DOC) for key in SIL_KEYS}
STRAY_SIL_MEMORY_FIELDS = {'sil_replay_name': ignored_field(_SIL_KEY_DOC)}


class PercentileNormalizer:
    """SLM-Lab v5's percentile scaling of advantages (DreamerV3), normalize_advantages "percentile".

    Per minibatch of advantages A (B,): P5 <- 0.99 * P5 + 0.01 * q05(A), P95 <- 0.99 * P95 +
    0.01 * q95(A) (both start at 0; q: torch.quantile, linear interpolation), then
    scale(A) = A / max(1, P95 - P5): not centred, and never enlarged.
    """

    def __init__(self, decay: float = 0.99):
        self.decay = decay
        self.perc5, self.perc95 = 0.0, 0.0

    def update(self, advantages: torch.Tensor) -> None:
        p5, p95 = torch.quantile(advantages, 0.05), torch.quantile(advantages, 0.95)
        self.perc5 = self.decay * self.perc5 + (1 - self.decay) * float(p5)
        self.perc95 = self.decay * self.perc95 + (1 - self.decay) * float(p95)

    def scale(self, advantages: torch.Tensor) -> torch.Tensor:
        return advantages / max(1.0, self.perc95 - self.perc5)

    def state_dict(self) -> dict:
        return {'perc5': self.perc5, 'perc95': self.perc95}

    def load_state_dict(self, state: dict) -> None:
        self.perc5, self.perc95 = float(state['perc5']), float(state['perc95'])


class ActingOutputs:
    """log pi(a_t|s_t) and V(s_t) of each vector step of the rollout being collected, (T, N) each, as
    the acting forward computed them (PPO's keep_acting_outputs). Steps are recorded in order from
    the batch's first; `take` hands over a whole batch's worth and starts the next one, or None when
    the record does not cover the batch step for step (a batch not collected by this algorithm's
    act: then the update forwards over the batch)."""

    def __init__(self, shape: tuple[int, int]):
        self.log_probs = np.zeros(shape, dtype=np.float32)
        self.values = np.zeros(shape, dtype=np.float32)
        self.steps = 0  # vector steps recorded, in order, since the batch began; -1: out of order

    def record(self, step: int, log_probs: torch.Tensor, values: torch.Tensor) -> None:
        """The acting forward's outputs (N,) each for the batch's vector step `step`."""
        if step != self.steps:  # not the next step of this batch: the record cannot stand for it
            self.steps = -1
            return
        self.log_probs[step] = log_probs.float().cpu().numpy()
        self.values[step] = values.float().cpu().numpy()
        self.steps += 1

    def take(self, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray] | None:
        """(log_probs, values) (T, N) copies for a batch of `shape` (T, N), and a fresh record."""
        steps, self.steps = self.steps, 0
        if steps != shape[0] or tuple(shape[1:]) != self.log_probs.shape[1:]:
            return None
        return self.log_probs[:steps].copy(), self.values[:steps].copy()

    def state_dict(self) -> dict:
        return {'log_probs': self.log_probs[:max(self.steps, 0)].copy(),
                'values': self.values[:max(self.steps, 0)].copy(), 'steps': self.steps}

    def load_state_dict(self, state: dict) -> None:
        steps = int(state['steps'])
        self.log_probs[:max(steps, 0)] = state['log_probs']
        self.values[:max(steps, 0)] = state['values']
        self.steps = steps


class PPO(ActorCritic):
    """Proximal Policy Optimization with clipping, on OnPolicyBatchReplay (time_horizon vector
    steps per update) or OnPolicyReplay (training_frequency episodes per update). Inherits
    ActorCritic's nets, optimizers, acting, batches and GAE; overrides the training step."""

    spec_schema = {
        **BASE_SCHEMA,
        'lam': Field((float,), 0.95, min=0, max=1, doc='GAE lambda'),
        'clip_eps_spec': schedule_field('schedule of the clipping epsilon', default={
            'name': 'no_decay', 'start_val': 0.2, 'end_val': 0.2, 'start_step': 0, 'end_step': 0}),
        'entropy_coef_spec': schedule_field('schedule of the entropy bonus coefficient'),
        'val_loss_coef': Field((float,), 1.0, min=0, doc="weight of the value loss (SLM-Lab's default 1)"),
        'time_horizon': Field((int,), 128, min=1, doc='OnPolicyBatchReplay: vector steps per update '
                                                      '(batch = time_horizon * num_envs)'),
        'minibatch_size': Field((int,), 4, min=1, max=MAX_BATCH,
                                doc="samples per gradient step (the last minibatch of an epoch takes the remainder; "
                                    "SLM-Lab's default 4)"),
        'training_epoch': Field((int,), 4, min=1, max=MAX_REPEATS, doc='passes over the batch per update'),
        'normalize_advantage': Field((bool,), True,
                                     doc='normalise advantages per minibatch (how: normalize_advantages)'),
        'normalize_advantages': Field((str,), OMIT, choices=('standardize', 'percentile'),
                                      doc='(SLM-Lab v5) "standardize" (its default): (A - mean) / std per minibatch; '
                                          '"percentile": A / max(1, P95 - P5), P5 and P95 moving averages (decay '
                                          '0.99) of the minibatches\' 5th and 95th percentiles (DreamerV3)'),
        'symlog': Field((bool,), False, doc='(SLM-Lab v5) fit values in symlog space (DreamerV3): the value loss '
                                            'compares symlog(V) with symlog(R) (and symlog(V_old) with clip_vloss)'),
        'clip_vloss': Field((bool,), False, aliases=('clip_val_loss',),
                            doc='clip the value update around the old values by clip_eps '
                                '(mean over samples of the larger of the clipped and unclipped loss); '
                                "SLM-Lab v5's specs write clip_val_loss, which its code never reads (all its "
                                'published values are false): here it is an alias, so true does clip'),
        'normalize_v_targets': Field((bool,), False,
                                     doc='(SLM-Lab v5) divide values and value targets by a running std of the '
                                         'targets (at least 1, updated per minibatch), clipped to [-10, 10], in the '
                                         'value loss; not with clip_vloss, as in SLM-Lab'),
        'keep_acting_outputs': Field((bool,), True,
                                     doc="with one shared net (net.shared) and OnPolicyBatchReplay: log pi_old(a|s) "
                                         "and V(s) as the forward that chose each action computed them (Stable-"
                                         "Baselines3's way), so the update makes no forward over the batch for them; "
                                         "false: one forward over the batch at the update (the lab's way before this "
                                         "key; a run saved before it resumes so). The same quantities from the same "
                                         "weights, rounded as a forward of num_envs rows or of the whole batch rounds "
                                         "them; no effect with separate nets, OnPolicyReplay, a net that does not "
                                         "forward per sample (batch norm, dropout), a bf16 net that acts in float32 "
                                         "(env.num_envs below net.bf16_min_rows), or meta.distributed \"shared\" "
                                         "(other sessions move the weights during a rollout)"),
        'training_frequency': ignored_field('OnPolicyReplay: episodes per update (default 1); ignored with '
                                            'OnPolicyBatchReplay, as in SLM-Lab: PPO trains every time_horizon '
                                            'vector steps'),
        **STRAY_SIL_FIELDS,
    }
    memory_names = ('OnPolicyBatchReplay', 'OnPolicyReplay')
    continuous_ok = True
    samples_from_policy = True
    # SLM-Lab's ppo_sil_* specs also give PPOSIL's replay choice in the memory
    memory_schema = STRAY_SIL_MEMORY_FIELDS

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        spec, net_spec = self.algorithm_spec, self.net_spec
        if not isinstance(self.memory, OnPolicyBatchReplay):
            self.training_frequency = spec.get('training_frequency') or 1
        # clip_vloss takes its max per sample, so it needs the loss before reduction
        self.sample_loss_fn = net_util.make_loss({**net_spec['loss_spec'], 'reduction': 'none'})
        self.clip_eps = Schedule(spec['clip_eps_spec'])
        self.minibatch_size, self.training_epoch = spec['minibatch_size'], spec['training_epoch']
        self.normalize_advantage, self.clip_vloss = spec['normalize_advantage'], spec['clip_vloss']
        self.symlog = spec['symlog']
        self.percentile_normalizer = (PercentileNormalizer() if spec.get('normalize_advantages') == 'percentile'
                                      else None)
        # absent only from a spec an older lab saved and nothing validated since: it made the batch forward
        self.acting_outputs = None
        # a bf16 net acting in float32 (fewer envs than net.bf16_min_rows) would hand the update old
        # log-probabilities in another precision than its minibatches': a ratio off 1 from the start
        if spec.get('keep_acting_outputs', False) and isinstance(self.memory, OnPolicyBatchReplay) \
                and self.model.shared and getattr(self.model.body, 'bf16_min_rows', 1) <= self.num_envs:
            self.acting_outputs = ActingOutputs(self.memory.buffers['rewards'].shape)

    @classmethod
    def check_spec(cls, spec: dict) -> None:
        super().check_spec(spec)
        algo = spec['agent']['algorithm']
        stray = [f'agent.algorithm.{k}' for k in algo if cls.spec_schema.get(k) is STRAY_SIL_FIELDS.get(k, 0)]
        stray += [f'agent.memory.{k}' for k in (spec['agent'].get('memory') or {})
                  if cls.memory_schema.get(k) is STRAY_SIL_MEMORY_FIELDS.get(k, 0)]
        if stray:
            lab_logger.warn_once('slm_lab.agent',
                                 f'{", ".join(stray)}: self-imitation keys, which {cls.__name__} does not read (nor '
                                 f'did SLM-Lab\'s PPO): this trains plain PPO; set agent.algorithm.name to "PPOSIL" '
                                 'for PPO with self-imitation learning')
        way = algo.get('normalize_advantages')
        if way is not None and not algo['normalize_advantage']:
            raise SpecError(f'agent.algorithm.normalize_advantages: "{way}" contradicts normalize_advantage: '
                            'false; keep one of the two')
        frequency = algo.get('training_frequency')
        if (spec['agent'].get('memory') or {}).get('name') == 'OnPolicyReplay' and frequency is not None \
                and not (type(frequency) is int and frequency >= 1):
            raise SpecError(f'agent.algorithm.training_frequency: {frequency!r} episodes per update; with '
                            'OnPolicyReplay PPO needs a whole number >= 1')

    def schedule_values(self):
        return {**super().schedule_values(), 'clip_eps': self.clip_eps.value(self.clock.frame)}

    def train_due(self) -> bool:
        """A full batch of time_horizon vector steps, or training_frequency finished episodes."""
        if isinstance(self.memory, OnPolicyBatchReplay):
            return self.memory.is_full
        return self.memory.num_finished >= self.training_frequency

    def advantages(self, batch: RolloutBatch | EpisodeBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """GAE over a memory's batch: (advantages (B,), returns (B,), old values (B,))."""
        return self.old_policy_and_advantages(self.rollout(batch), from_acting=False)[1:]

    @torch.inference_mode()
    def act(self, obs):
        """ActorCritic.act; with acting_outputs, the log-probability of each chosen action and each
        state's value from the same forward are kept for the update (keep_acting_outputs)."""
        if self.acting_outputs is None:
            return super().act(obs)
        out, values = self.model.pd_out_and_value(self.tensor(obs))
        actions = self.draw_actions(out)
        self.acting_outputs.record(self.memory.size, self.model.head.log_prob(out, actions), values)
        return policy_util.to_env_actions(actions, self.action_space)

    @torch.no_grad()
    def old_policy_and_advantages(self, rollout, from_acting: bool = True) -> tuple[torch.Tensor, ...]:
        """What the epochs compare against, from the weights before the update: (old log-probs
        log pi_old(a|s) (B,), advantages (B,), returns R = A + V(s) (B,), old values V(s) (B,)).

        With keep_acting_outputs (`from_acting`, a shared net on OnPolicyBatchReplay), log pi_old
        and V(s) are those the acting forwards computed (ActingOutputs), when they cover the batch
        step for step. Otherwise one forward over the batch gives both; V(s'_t) is V(s_{t+1}) where the
        next state is the following state, with a forward over the other next states only
        (ActorCritic.next_values). Nets that do not forward per sample (a batch norm in training
        mode, dropout) keep three forwards over the whole batch in this order, V(s), V(s'), pi(s),
        since each moves their running statistics or draws random numbers."""
        states, actions, shape = rollout.states, rollout.actions, rollout.rewards.shape
        kept = self.acting_outputs.take(shape) if self.acting_outputs is not None and from_acting else None
        if kept is not None and self.model.forwards_per_sample():  # what acting computed (keep_acting_outputs)
            log_probs, values = (self.tensor(x) for x in kept)
            advs, returns = self.advantages_and_targets(rollout, values)
            return log_probs.reshape(-1), advs, returns, values.reshape(-1)
        if self.model.forwards_per_sample():
            out, values = self.model.pd_out_and_value(states, prepared=True)
            values = values.reshape(shape)
            advs, returns = self.advantages_and_targets(rollout, values)
        else:
            values = self.model.value(states, prepared=True).reshape(shape)
            advs, returns = self.advantages_and_targets(rollout, values)
            out = self.model.pd_out(states, prepared=True)
        return self.model.head.log_prob(out, actions), advs, returns, values.reshape(-1)

    def normalize_advantages(self, advantages: torch.Tensor) -> torch.Tensor:
        """A minibatch's advantages (B,) as the policy loss weighs them: percentile-scaled,
        standardised (more than one sample), or as they are (normalize_advantage false)."""
        if self.percentile_normalizer is not None:
            self.percentile_normalizer.update(advantages)
            return self.percentile_normalizer.scale(advantages)
        if self.normalize_advantage and len(advantages) > 1:
            return (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        return advantages

    def ppo_value_loss(self, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       clip_eps: float) -> torch.Tensor:
        """L_V of a minibatch (B,) each (without val_loss_coef): symlog first when set, then the
        clipped loss (clip_vloss) or loss_fn, with normalize_v_targets scaling both sides."""
        if self.symlog:
            values, old_values, returns = symlog(values), symlog(old_values), symlog(returns)
        if self.clip_vloss:
            return ppo_value_loss(values, old_values, returns, clip_eps, self.sample_loss_fn)
        if self.return_normalizer is not None:
            self.return_normalizer.update(returns)
            values, returns = self.return_normalizer.scale(values), self.return_normalizer.scale(returns)
        return self.loss_fn(values, returns)

    def train(self, batch: RolloutBatch | EpisodeBatch) -> dict:
        rollout = self.rollout(batch)
        old_log_probs, advs, returns, old_values = self.old_policy_and_advantages(rollout)
        states, actions = rollout.states, rollout.actions
        frame = self.clock.frame
        clip_eps = self.clip_eps.value(frame)
        entropy_coef = self.entropy_coef_now()
        losses, entropies, norms = [], [], []
        batch_size = len(states)
        mb_size = min(self.minibatch_size, batch_size)
        for _ in range(self.training_epoch):
            perm = torch.randperm(batch_size, device=self.device)
            for start in range(0, batch_size, mb_size):  # the last minibatch holds the remainder
                idx = perm[start:start + mb_size]
                out, v = self.model.pd_out_and_value(states[idx], prepared=True)
                log_probs, entropies_mb = self.model.head.log_prob_and_entropy(out, actions[idx])
                adv = self.normalize_advantages(advs[idx])
                pg_loss = ppo_policy_loss(log_probs, old_log_probs[idx], adv, clip_eps)
                v_loss = self.ppo_value_loss(v, old_values[idx], returns[idx], clip_eps)
                entropy = entropies_mb.mean()
                loss = pg_loss + self.val_loss_coef * v_loss - entropy_coef * entropy
                norms.append(self.step_optimizers(loss))
                losses.append(loss.detach())
                entropies.append(entropy.detach())
        self.step_lr_schedulers()
        return {'loss': float(torch.stack(losses).mean()), 'entropy': float(torch.stack(entropies).mean()),
                'grad_norm': float(np.mean(norms))}

    # --- state ----------------------------------------------------------------------------------
    def extra_state(self) -> dict:
        state = super().extra_state()
        if self.percentile_normalizer is not None:
            state['percentile_normalizer'] = self.percentile_normalizer.state_dict()
        if self.acting_outputs is not None:
            state['acting_outputs'] = self.acting_outputs.state_dict()
        return state

    def load_extra_state(self, state: dict) -> None:
        super().load_extra_state(state)
        if self.percentile_normalizer is not None:
            self.percentile_normalizer.load_state_dict(state['percentile_normalizer'])
        if self.acting_outputs is not None and 'acting_outputs' in state:  # absent: a run forced to keep them
            self.acting_outputs.load_state_dict(state['acting_outputs'])
