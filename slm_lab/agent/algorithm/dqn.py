"""The DQN family (Mnih et al. 2015; van Hasselt et al. 2016) on a Replay memory.

For a sampled batch (B transitions):
  VanillaDQN: y = r + gamma * (1 - terminated) * max_a' Q(s', a')                (online net)
  DQN, double_q false: y = r + gamma * (1 - terminated) * max_a' Q_target(s', a')
  DoubleDQN, and DQN with double_q true:
              y = r + gamma * (1 - terminated) * Q_target(s', argmax_a' Q(s', a'))
  loss = loss_fn(Q(s, a), y)
SLM-Lab's DQN changed between its generations: v4.2.4's is the literature's (the target net picks
and values the next action); since v5.0.0 its DQNBase picks with the online net, so v5's DQN
computes DoubleDQN's y. The lab's DQN does either by `double_q`, which a spec in v5's flat layout
(the lab's own files included) leaves true and one in v4's layout false (spec/compat/v4_layout.py);
a run saved before the key existed resumes false, as it ran (persistence/edits.py).
Every training_frequency frames (once training_start_step transitions are stored): training_iter
batches, each used for training_batch_iter gradient steps (y computed again before each, with the
online net as the previous step left it). The target net follows the online net
every update_frequency frames: a copy (replace) or target <- polyak_coef*online + (1-polyak_coef)*target
(SLM-Lab's convention: polyak_coef is the weight of the online net).

On a PrioritizedReplay the loss is mean_i[w_i * loss_fn(Q(s_i, a_i), y_i)] with the batch's
importance weights w_i (all 1 unless the memory's beta is set: SLM-Lab's unweighted loss), and
before each gradient step the sampled transitions get the priorities of |y_i - Q(s_i, a_i)|, as
in SLM-Lab.
"""
from __future__ import annotations

import copy

import numpy as np
import torch

from slm_lab.agent.algorithm import policy_util
from slm_lab.agent.algorithm.base import BASE_SCHEMA
from slm_lab.agent.algorithm.off_policy import OffPolicyAlgorithm
from slm_lab.agent.net import build_net, net_util
from slm_lab.lib.decay import schedule_field
from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import MAX_FRAME, MAX_REPEATS, Field, ignored_field


def q_targets(rewards: torch.Tensor, terminateds: torch.Tensor, next_q_select: torch.Tensor,
              next_q_eval: torch.Tensor, gamma: float) -> torch.Tensor:
    """Bootstrapped Q-learning targets for B transitions: rewards and terminateds (B,), the
    next-state action values of the net that picks the next action and of the net that values
    it, (B, n_actions):

    y = r + gamma * (1 - terminated) * Q_eval(s', argmax_a' Q_select(s', a'))
    With one net for both (VanillaDQN: online, DQN: target) this is r + gamma * max_a' Q(s', a');
    DoubleDQN selects with the online net and evaluates with the target net. Only a termination
    drops the bootstrap: a truncated transition's s' (its final observation) still has a value.
    """
    best = next_q_select.argmax(dim=-1, keepdim=True)
    next_value = next_q_eval.gather(-1, best).squeeze(-1)
    return rewards + gamma * (1.0 - terminateds) * next_value


class VanillaDQN(OffPolicyAlgorithm):
    """Q-learning with a replay memory and no target net."""

    spec_schema = {
        **BASE_SCHEMA,
        'action_pdtype': Field((str,), 'Argmax', choices=policy_util.PDTYPES + policy_util.PLANNED_PDTYPES,
                               doc='action distribution'),
        'action_policy': Field((str,), 'epsilon_greedy', choices=policy_util.ACTION_POLICIES,
                               planned=policy_util.PLANNED_ACTION_POLICIES, doc='how actions are drawn'),
        'explore_var_spec': schedule_field('schedule of epsilon (epsilon_greedy) or temperature (boltzmann)',
                                           default={'name': 'linear_decay', 'start_val': 1.0, 'end_val': 0.05,
                                                    'start_step': 0, 'end_step': 10000}),
        'training_batch_iter': Field((int,), 1, min=1, max=MAX_REPEATS, doc='gradient steps per sampled batch'),
        'training_iter': Field((int,), 1, min=1, max=MAX_REPEATS, doc='batches sampled per training'),
        'training_frequency': Field((int,), 1, min=1, max=MAX_FRAME, doc='frames between trainings'),
        'training_start_step': Field((int,), None, nullable=True, min=1, max=MAX_FRAME,
                                     doc="transitions in memory before training starts (null: the memory's batch_size, "
                                         "as in SLM-Lab; the saved spec records the number)"),
        'normalize_state': ignored_field('(SLM-Lab v4) ignored: no SLM-Lab v4.2.4 algorithm reads it; '
                                         'env.normalize_obs normalises observations'),
    }
    memory_names = ('Replay', 'PrioritizedReplay')
    nets_doc = """one net with a Q-value per action (`DuelingMLPNet`: V + A - mean(A)); `DQN`
        and `DoubleDQN` add a target net, a copy of it, which follows the online net every `update_frequency`
        frames: `update_type` `"replace"` copies the weights, `"polyak"` sets target = `polyak_coef` * online +
        (1 - `polyak_coef`) * target (SLM-Lab's convention: a small `polyak_coef` such as 0.005 is a slow
        target); `VanillaDQN` has no target net and ignores these three keys. The Q loss is `loss_spec`,
        weighted by the importance weights of a PrioritizedReplay with `beta` > 0."""
    uses_target_net = False
    double = False
    polyak_lerp = False  # SLM-Lab's DQN arithmetic, (1 - c) * target + c * online (see off_policy.py)

    derived_defaults = {'training_start_step': ('agent.memory.batch_size',)}

    @classmethod
    def check_spec(cls, spec: dict) -> None:
        super().check_spec(spec)
        algo = spec['agent']['algorithm']
        if algo['training_start_step'] is None:  # SLM-Lab starts once one batch can be sampled
            algo['training_start_step'] = spec['agent']['memory']['batch_size']

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        spec, net_spec = self.algorithm_spec, self.net_spec
        self.net = build_net(net_spec, self.in_shape, self.act_dim).to(self.device)
        self.head = policy_util.PolicyHead(self.pdtype, self.act_dim)  # boltzmann / default sampling
        self.target_net = copy.deepcopy(self.net) if self.uses_target_net else None
        if self.target_net is not None:
            self.target_net.requires_grad_(False)
        self.optimizers = {'net': net_util.make_optimizer(self.net.parameters(), net_spec['optim_spec'])}
        sched = net_util.make_lr_scheduler(self.optimizers['net'], net_spec['lr_scheduler_spec'], self.clock)
        self.lr_schedulers = {'net': sched} if sched else {}
        self.loss_fn = net_util.make_loss(net_spec['loss_spec'])
        # per-transition losses, for the importance weights of a prioritized batch
        self.elementwise_loss_fn = net_util.make_loss({**net_spec['loss_spec'], 'reduction': 'none'})
        self.training_frequency = spec['training_frequency']
        self.training_start_step = spec['training_start_step']
        self.training_iter, self.training_batch_iter = spec['training_iter'], spec['training_batch_iter']
        self.update_type, self.update_frequency = net_spec['update_type'], net_spec['update_frequency']
        self.polyak_coef = net_spec['polyak_coef']

    def nets(self):
        nets = {'net': self.net}
        if self.target_net is not None:
            nets['target_net'] = self.target_net
        return nets

    @torch.no_grad()
    def act(self, obs):
        epsilon = self.explore_var.value(self.clock.frame)
        if self.action_policy == 'epsilon_greedy':
            # draw exploration first, so a fully random step skips the forward pass
            explore = self.rng.random(len(obs)) < epsilon
            random_actions = self.rng.integers(0, self.act_dim, size=len(obs))
            if explore.all():
                return random_actions
            greedy = self.net(self.tensor(obs)).argmax(dim=-1).cpu().numpy()
            return np.where(explore, random_actions, greedy)
        out = self.net(self.tensor(obs))
        actions = policy_util.sample_actions(out, self.head, self.action_policy, epsilon, self.rng, self.act_dim)
        return policy_util.to_env_actions(actions, self.action_space)

    @torch.no_grad()
    def act_greedy(self, obs):
        return self.net(self.tensor(obs)).argmax(dim=-1).cpu().numpy()

    def target_pairs(self):
        return [(self.target_net, self.net)] if self.target_net is not None else []

    def update(self, obs, action, reward, next_obs, terminated, truncated):
        """Store and train when due; then the target net follows every update_frequency frames."""
        metrics = super().update(obs, action, reward, next_obs, terminated, truncated)
        if self.target_net is not None and self.crossed_next(self.update_frequency):
            self.update_target_nets(self.update_type, self.polyak_coef)
        return metrics

    @property
    def online_targets(self) -> bool:
        """Whether y depends on the online net (VanillaDQN, DoubleDQN, DQN with double_q): then
        each of a batch's training_batch_iter gradient steps gets y anew, as in SLM-Lab; the y of
        the target net alone (DQN, double_q false) stays the same through them."""
        return self.target_net is None or self.double

    @torch.no_grad()
    def q_targets(self, rewards, next_states, terminateds) -> torch.Tensor:
        """y for a batch, with the nets of this variant (see q_targets and the module doc)."""
        next_q_online = self.net(next_states) if self.target_net is None or self.double else None
        next_q_target = self.target_net(next_states) if self.target_net is not None else None
        select = next_q_online if next_q_online is not None else next_q_target
        evaluate = next_q_target if next_q_target is not None else next_q_online
        return q_targets(rewards, terminateds, select, evaluate, self.gamma)

    def train(self) -> dict:
        losses, norms = [], []
        for _ in range(self.training_iter):
            batch = self.memory.sample().to(self.device)
            actions = batch.actions.long().unsqueeze(-1)
            targets = None
            for _ in range(self.training_batch_iter):
                if targets is None or self.online_targets:  # the online net moved since the last step
                    targets = self.q_targets(batch.rewards, batch.next_states, batch.terminateds)
                q = self.net(batch.states).gather(-1, actions).squeeze(-1)
                if batch.weights is None:
                    loss = self.loss_fn(q, targets)
                else:  # a prioritized batch: importance-weighted, and its new TD errors handed back
                    loss = (batch.weights * self.elementwise_loss_fn(q, targets)).mean()
                    self.memory.update_priorities(batch.indices, (targets - q.detach()).abs().cpu().numpy())
                norms.append(self.step_optimizers(loss))
                losses.append(loss.detach())
        self.step_lr_schedulers()
        return {'loss': float(torch.stack(losses).mean()), 'grad_norm': sum(norms) / len(norms)}


class DQN(VanillaDQN):
    """DQN with a target net for the bootstrap value, which picks the next action too (SLM-Lab
    v4's) or leaves that to the online net (`double_q`, SLM-Lab v5's)."""

    spec_schema = {
        **VanillaDQN.spec_schema,
        'double_q': Field((bool,), True,
                          doc="double-DQN targets: the online net picks the next action and the target net values it "
                              "(SLM-Lab v5's DQN); false: the target net does both (SLM-Lab v4's). Left out: false in "
                              "a spec of SLM-Lab v4's layout, and for a run saved before this key existed when it is "
                              "resumed or forked (what it ran); a warm start from a DQN run takes the parent's; the "
                              'saved spec records the value. DoubleDQN: always true'),
    }
    uses_target_net = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # absent only from a spec an older lab saved and nothing validated since (a resumed
        # search's trial spec): its DQN computed v4's targets
        self.double = self.algorithm_spec.get('double_q', False)


class DoubleDQN(DQN):
    """Double DQN: the online net picks the next action, the target net values it (DQN with
    `double_q` true)."""

    @classmethod
    def check_spec(cls, spec: dict) -> None:
        super().check_spec(spec)
        if spec['agent']['algorithm']['double_q'] is not True:
            raise SpecError('agent.algorithm.double_q: false does not fit DoubleDQN, whose online net always picks '
                            'the next action; remove the key, or use DQN with double_q false for targets of the '
                            'target net alone')

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.double = True
