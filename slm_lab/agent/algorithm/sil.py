"""Self-imitation learning (Oh et al. 2018, arXiv:1806.05635): SIL (ActorCritic + SIL) and
PPOSIL (PPO + SIL).

The on-policy algorithm trains as usual. Every finished episode also goes into a replay of
past episodes, each transition with its discounted return; after each on-policy update, when
that replay holds at least batch_size transitions, training_iter batches of batch_size are
drawn from it and each is trained on training_batch_iter times with

  A+_i  = max(R_i - V(s_i), 0)
  L_pi  = -mean_i log pi(a_i|s_i) * A+_i        (A+ a constant weight: no gradient through it)
  L_V   = mean_i 0.5 * (A+_i)^2
  loss  = sil_policy_loss_coef * L_pi + sil_val_loss_coef * L_V

so the agent imitates only its own past actions whose outcome beat its current estimate of the
state's value. R_i is the return from s_i to the end of its episode, computed when the episode
ends (s_T the final observation, T the episode's length):

  R_t = sum_{k=t}^{T-1} gamma^(k-t) r_k  +  gamma^(T-t) * (1 - terminated) * V(s_T)

A terminated episode's return is the Monte-Carlo sum. A truncated one (time limit) did not end
in the MDP, so its return bootstraps from the critic's value of its final observation, taken
at the time of each SIL update (the replay keeps the discounted reward sum, the bootstrap
discount gamma^(T-t) and s_T); without that, time-limited episodes would look worse than they
are and be imitated less.

sil_replay_name picks the replay: Replay draws uniformly; PrioritizedReplay draws transition i in
proportion to (A+_i + epsilon)^alpha (A+ from its last SIL step; a new transition gets the
priority of an error of 100000, as in the lab's PrioritizedReplay) and weighs its losses by
w_i = (n P(i))^-beta / max_batch w, as the paper does (SLM-Lab's SIL never updates priorities).

Where this differs from SLM-Lab's SIL (v4.2.4 and v5), and why:
- SLM-Lab adds every on-policy transition to the replay and computes returns over each randomly
  sampled minibatch as though its rows were one trajectory (v4 cut at `dones`, v5 at
  `terminateds`), mixing rewards of unrelated transitions. Here each episode's returns are
  computed when it ends, as in the paper; unfinished episodes wait in the replay until they end.
- With separate actor and critic nets SLM-Lab steps only the actor's optimizer with the SIL loss
  (the value term's critic gradients are dropped); here the SIL loss steps every optimizer, so
  the critic learns from sil_val_loss_coef too.
- SLM-Lab v4 let the policy term's gradient reach the critic through A+; here A+ is a constant
  in the policy term, as in SLM-Lab v5 and the paper.
- use_cer puts the single newest transition last in each SIL batch (v4's rule). SLM-Lab v5's SIL
  replay is its Replay, whose use_cer puts every transition stored since the previous sample in
  the batch's tail; since this replay receives whole episodes at once, that would fill batches
  with the latest episode, which is not what combined experience replay is for.
- The SIL replay stores observations as the env gives them (float32); SLM-Lab v5's, a Replay,
  rounds them to float16: agent.memory.obs_dtype "float16" does so here too.
"""
from __future__ import annotations

import torch

from slm_lab.agent.algorithm import policy_util
from slm_lab.agent.algorithm.actor_critic import ActorCritic
from slm_lab.agent.algorithm.ppo import PPO
from slm_lab.agent.memory.base import space_bytes
from slm_lab.agent.memory.replay import Replay
from slm_lab.agent.memory.sil_replay import PRIORITY_KEYS, SIL_MEMORY_SCHEMA, PrioritizedSILReplay, SILReplay
from slm_lab.lib.errors import SpecError
from slm_lab.resources import Need, kept_on_disk
from slm_lab.lib.schema import MAX_REPEATS, Field

SIL_SCHEMA = {
    'sil_policy_loss_coef': Field((float,), 1.0, min=0, doc='weight of the self-imitation policy loss'),
    'sil_val_loss_coef': Field((float,), 0.01, min=0,
                               doc="weight of the self-imitation value loss (the paper's beta^sil, 0.01)"),
    'training_iter': Field((int,), 1, min=1, max=MAX_REPEATS,
                           doc='SIL batches drawn from the SIL replay after each on-policy update '
                                                 '(SLM-Lab has no default; its specs all give it)'),
    'training_batch_iter': Field((int,), 1, min=1, max=MAX_REPEATS, doc='SIL gradient steps on each of those batches '
                                                       '(SLM-Lab has no default; its specs all give it)'),
}


# --- maths ------------------------------------------------------------------------------------

def sil_returns(reward_sums: torch.Tensor, boot_discounts: torch.Tensor, final_values: torch.Tensor) -> torch.Tensor:
    """Returns of replayed transitions; inputs (B,):  R_i = reward_sums_i + boot_discounts_i * V(s_T,i)."""
    return reward_sums + boot_discounts * final_values


def sil_losses(log_probs: torch.Tensor, values: torch.Tensor, returns: torch.Tensor,
               weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Self-imitation losses (before their coefficients) of a batch; inputs (B,).

    A+_i = max(R_i - V(s_i), 0)
    L_pi = -mean_i w_i * log pi(a_i|s_i) * A+_i     (A+ detached: it weighs the log-probability only)
    L_V  = mean_i w_i * 0.5 * (A+_i)^2              (gradient -w_i (R_i - V(s_i)) / B where R_i > V(s_i))
    w_i: importance weights of a prioritized sample (1 when not given).
    Returns (L_pi, L_V).
    """
    clipped_advs = (returns - values).clamp(min=0.0)
    weights = torch.ones_like(clipped_advs) if weights is None else weights
    policy_loss = -(weights * log_probs * clipped_advs.detach()).mean()
    value_loss = (weights * 0.5 * clipped_advs.pow(2)).mean()
    return policy_loss, value_loss


# --- the algorithms ---------------------------------------------------------------------------

class SelfImitation:
    """Adds self-imitation learning to an on-policy actor-critic algorithm (put it first among
    the bases: `class PPOSIL(SelfImitation, PPO)`). The base must provide `self.model`, an
    ActorCriticNet (`pd_out_and_value`, `value`, `head.distribution`), and train in its
    `update`, returning its metrics (or None when it did not train).
    """

    memory_schema = SIL_MEMORY_SCHEMA
    owned_replay_keys = ('sil_replay',)  # its replay's state rides extra_state

    def __init__(self, agent_spec: dict, *args, **kwargs):
        super().__init__(agent_spec, *args, **kwargs)
        spec = self.algorithm_spec
        self.sil_policy_loss_coef, self.sil_val_loss_coef = spec['sil_policy_loss_coef'], spec['sil_val_loss_coef']
        self.training_iter, self.training_batch_iter = spec['training_iter'], spec['training_batch_iter']
        # its batches are drawn with the algorithm's generator, which the algorithm's state holds
        replay_cls = PrioritizedSILReplay if agent_spec['memory']['sil_replay_name'] == 'PrioritizedReplay' \
            else SILReplay
        self.sil_replay = replay_cls(agent_spec['memory'], self.obs_space, self.action_space, self.num_envs,
                                    self.gamma, self.rng, persist=self.persist_replay)

    @classmethod
    def owned_replay_needs(cls, spec: dict, obs_space, action_space) -> list[Need]:
        """The SIL replay's max_size transitions, written whole in each kept snapshot."""
        memory_spec = spec['agent']['memory']
        obs_bytes = Replay.stored_obs_bytes(memory_spec, obs_space)
        sil = SILReplay.storage_bytes(memory_spec['max_size'], obs_bytes, space_bytes(action_space),
                                      memory_spec['sil_replay_name'] == 'PrioritizedReplay')
        return [Need('SIL replay', 'agent.memory.max_size', sil, kept_on_disk(sil, 1.0, spec.get('meta', {})))]

    @classmethod
    def check_spec(cls, spec: dict) -> None:
        super().check_spec(spec)
        memory = spec['agent']['memory']
        for key in PRIORITY_KEYS:
            if key in memory and memory['sil_replay_name'] != 'PrioritizedReplay':
                raise SpecError(f'agent.memory.{key}: a priority key, for a prioritized SIL replay only; set '
                                'agent.memory.sil_replay_name to "PrioritizedReplay", or remove the key')

    def update(self, obs, action, reward, next_obs, terminated, truncated):
        """Store the step in the SIL replay too; after each on-policy update, the SIL updates."""
        self.sil_replay.add(obs, action, reward, next_obs, terminated, truncated)
        metrics = super().update(obs, action, reward, next_obs, terminated, truncated)
        if metrics is None or len(self.sil_replay) < self.sil_replay.batch_size:
            return metrics
        return self.train_sil(metrics)

    def train_sil(self, metrics: dict) -> dict:
        """training_iter batches x training_batch_iter gradient steps of the SIL loss, each stepping
        every optimizer. Returns the on-policy update's metrics with the mean SIL loss added to
        its loss (SLM-Lab reports the two summed too); entropy and grad_norm stay the on-policy
        update's. The returns' bootstrap values V(s_T) are taken once per batch, before its steps."""
        losses = []
        for _ in range(self.training_iter):
            batch = self.sil_replay.sample()
            states = self.tensor(batch.states)
            actions = policy_util.pd_actions(torch.as_tensor(batch.actions, device=self.device), self.pdtype)
            weights = self.tensor(batch.weights)
            with torch.no_grad():
                returns = sil_returns(self.tensor(batch.reward_sums), self.tensor(batch.boot_discounts),
                                      self.model.value(self.tensor(batch.final_states)))
            for _ in range(self.training_batch_iter):
                out, values = self.model.pd_out_and_value(states)
                log_probs = self.model.head.distribution(out).log_prob(actions)
                policy_loss, value_loss = sil_losses(log_probs, values, returns, weights)
                loss = self.sil_policy_loss_coef * policy_loss + self.sil_val_loss_coef * value_loss
                self.step_optimizers(loss)
                losses.append(loss.detach())
            # a prioritized replay re-weighs the batch by A+ of its last step (values before that step)
            self.sil_replay.update_priorities(batch.indices, (returns - values.detach()).clamp(min=0.0).cpu().numpy())
        return {**metrics, 'loss': metrics['loss'] + float(torch.stack(losses).mean())}

    def extra_state(self) -> dict:
        return {**super().extra_state(), 'sil_replay': self.sil_replay.state_dict()}

    def load_extra_state(self, state: dict) -> None:
        super().load_extra_state(state)
        self.sil_replay.load_state_dict(state['sil_replay'])


class PPOSIL(SelfImitation, PPO):
    """PPO with self-imitation learning: PPO's update, then the SIL updates (see the module)."""

    spec_schema = {**PPO.spec_schema, **SIL_SCHEMA}


class SIL(SelfImitation, ActorCritic):
    """A2C with self-imitation learning: ActorCritic's update, then the SIL updates (see the module)."""

    spec_schema = {**ActorCritic.spec_schema, **SIL_SCHEMA}
