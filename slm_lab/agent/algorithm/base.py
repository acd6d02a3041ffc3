"""Algorithm base class: the contract between the Session loop and each RL algorithm."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from slm_lab.agent.algorithm import policy_util
from slm_lab.agent.memory.base import to_tensor
from slm_lab.agent.net import kernels, net_util
from slm_lab.agent.net.optim_steps import step_optimizer
from slm_lab.lib.decay import Schedule, linear_to_zero_factor, linear_to_zero_frame, schedule_field
from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import Field, not_available

BASE_SCHEMA = {
    'name': Field((str,), doc='algorithm class'),
    'action_pdtype': Field((str,), 'default', choices=policy_util.PDTYPES + policy_util.PLANNED_PDTYPES,
                           doc='action distribution'),
    'action_policy': Field((str,), 'default', choices=policy_util.ACTION_POLICIES,
                           planned=policy_util.PLANNED_ACTION_POLICIES, doc='how actions are drawn'),
    'explore_var_spec': schedule_field('schedule of epsilon (epsilon_greedy) or temperature (boltzmann)'),
    'gamma': Field((float,), 0.99, min=0, max=1, doc='discount factor'),
}


class Algorithm:
    """One RL algorithm: builds its nets, acts, and trains from its memory.

    The Session calls, per vector step: `act(obs)` then `update(obs, action, reward, next_obs,
    terminated, truncated)`; `update` stores the transition in memory and trains when due,
    returning the training metrics of that update (or None).
    Everything that shapes what happens next is in `state_dict()`.
    """

    spec_schema: dict = BASE_SCHEMA
    requires: tuple = ('memory', 'net')  # spec sections this algorithm needs
    memory_names: tuple | None = None  # memories it can use (None: any)
    continuous_ok: bool = False  # whether it supports Box actions
    # an on-policy gradient (log pi(a|s) weighted by returns) is unbiased only for actions drawn
    # from pi itself, so such algorithms refuse action policies that draw from anything else
    samples_from_policy: bool = False
    # what nets this algorithm builds from agent.net and which optimizers and losses train them
    # (docs/spec.md lists it under agent.net); empty for an algorithm without nets
    nets_doc: str = ''
    # keys this algorithm reads in agent.memory beside the memory's own schema (SIL's replay), by
    # name: validation checks the memory section against both
    memory_schema: dict = {}
    # whether it reads agent.critic_net (a net spec of its own for the critics, CrossQ); without
    # it, validation refuses a critic_net
    uses_critic_net: bool = False
    # memory names SLM-Lab pairs with this algorithm in a later version, each with what it is:
    # validation says "not available yet" for them instead of "cannot use"
    planned_memory_names: dict[str, str] = {}
    # keys of extra_state() that hold a replay the algorithm keeps itself, beside the agent's memory
    # (SIL's 'sil_replay'); each such state carries 'persisted' (see owned_replay_states)
    owned_replay_keys: tuple[str, ...] = ()
    # the loss a net spec's loss_spec builds, when the algorithm has one (validation tries it once)
    loss_fn = None

    # algorithm keys whose null check_spec replaces with a value derived from other keys, and the
    # spec paths that value follows: a search that draws one of those leaves the key null in its
    # own spec, for each trial to derive (spec.validate.validate_spec)
    derived_defaults: dict[str, tuple[str, ...]] = {}

    @classmethod
    def check_spec(cls, spec: dict) -> None:
        """Cross-key checks on a validated spec (raise SpecError); fills derived_defaults."""
        algo = spec['agent']['algorithm']
        pdtype = algo.get('action_pdtype', 'default')
        policy = algo.get('action_policy', 'default')
        if cls.samples_from_policy and policy != 'default':
            raise SpecError(f"agent.algorithm.action_policy: '{policy}' does not fit {cls.__name__}: its policy "
                            'gradient needs actions sampled from the policy it trains, and this one draws them '
                            'otherwise; use "default"')
        if cls.samples_from_policy and pdtype == 'Argmax':
            raise SpecError(f"agent.algorithm.action_pdtype: 'Argmax' does not fit {cls.__name__}: it acts by the "
                            'largest output, not by sampling the policy its gradient trains; use "default" or '
                            '"Categorical"')
        if policy in ('epsilon_greedy', 'boltzmann') and algo.get('explore_var_spec') is None:
            what = 'epsilon' if policy == 'epsilon_greedy' else 'temperature'
            raise SpecError(f"agent.algorithm.explore_var_spec: action_policy '{policy}' needs a schedule of its "
                            f'{what}, e.g. {{"name": "linear_decay", "start_val": 1.0, "end_val": 0.05, '
                            '"start_step": 0, "end_step": 10000}')
        if pdtype in policy_util.PLANNED_PDTYPES:
            raise not_available('agent.algorithm.action_pdtype', f"SLM-Lab's action distribution '{pdtype}'",
                                f'; available: {", ".join(policy_util.PDTYPES)}')

    @classmethod
    def owned_replay_states(cls, algorithm_state: dict) -> list[dict]:
        """The states of the replays this algorithm keeps itself (owned_replay_keys), from one of
        its state_dict()s: where a resume learns whether they were in the snapshot."""
        extra = algorithm_state.get('extra') or {}
        return [extra[key] for key in cls.owned_replay_keys if key in extra]

    @classmethod
    def owned_replay_needs(cls, spec: dict, obs_space: gym.Space, action_space: gym.Space) -> list:
        """What the replays this algorithm keeps itself (owned_replay_keys) take of the machine for
        a validated spec, as resources.Need items (agent.estimate.estimate_session): none by default."""
        return []

    @classmethod
    def recurrent_slots(cls, agent_spec: dict) -> int:
        """How many RecurrentNets that read observations this algorithm builds from a RecurrentNet
        spec (each carries its own hidden state; see net/recurrent.py): one by default."""
        return 1

    @classmethod
    def batch_steps(cls, algo_spec: dict) -> int:
        """Vector steps an OnPolicyBatchReplay holds for this algorithm's update: its time_horizon,
        else its training_frequency (override when the algorithm decides otherwise)."""
        return algo_spec.get('time_horizon') or algo_spec.get('training_frequency', 1)

    def __init__(self, agent_spec: dict, env_spec: dict, obs_space: gym.Space, action_space: gym.Space,
                 num_envs: int, clock, memory, seed: int | list[int], persist_replay: bool = False):
        """persist_replay (resources.replay_in_snapshots of the run's meta): whether a replay the
        algorithm keeps itself (SIL's) goes into snapshots, as the agent's Replay memory does."""
        self.persist_replay = persist_replay
        self.agent_spec = agent_spec
        self.algorithm_spec = agent_spec['algorithm']
        self.net_spec = agent_spec.get('net')
        self.env_spec = env_spec
        self.obs_space, self.action_space = obs_space, action_space
        self.num_envs = num_envs
        self.clock = clock
        self.memory = memory
        self.rng = np.random.default_rng(seed)
        self.gamma = self.algorithm_spec.get('gamma', 0.99)
        self.action_policy = self.algorithm_spec.get('action_policy', 'default')
        self.explore_var = Schedule(self.algorithm_spec.get('explore_var_spec'))
        self.entropy_coef = Schedule(self.algorithm_spec.get('entropy_coef_spec'))
        self.pdtype = policy_util.check_action_space(action_space, self.algorithm_spec, type(self).__name__,
                                                     self.continuous_ok)
        self.in_shape = tuple(obs_space.shape)  # what the nets take (image nets keep the shape)
        self.in_dim = int(np.prod(obs_space.shape))
        self.act_dim = policy_util.action_dim(action_space)
        # where the nets live: the spec's net.gpu / net.cuda_id (an algorithm without a net acts on the cpu)
        self.device = (net_util.get_device(self.net_spec['gpu'], self.net_spec.get('cuda_id')) if self.net_spec
                       else torch.device('cpu'))
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.lr_schedulers: dict = {}
        self._optim_params: list[list[torch.Tensor]] | None = None  # clip_groups(), on the first optimizer step
        self._clip_group_cache: dict[tuple[str, ...], list[list[torch.Tensor]]] = {}

    # --- acting -------------------------------------------------------------------------------
    def act(self, obs: np.ndarray) -> np.ndarray:
        """Actions for a batch of observations (N, *obs_shape), as the env takes them."""
        raise NotImplementedError

    def act_greedy(self, obs: np.ndarray) -> np.ndarray:
        """Greedy (argmax / mean) actions, for evaluation and replay."""
        raise NotImplementedError

    # --- training -----------------------------------------------------------------------------
    def update(self, obs, action, reward, next_obs, terminated, truncated) -> dict | None:
        """Store one vector step in memory and train when due. Returns training metrics or None."""
        raise NotImplementedError

    def nets(self) -> dict[str, torch.nn.Module]:
        """Every module whose weights are trained or used (target nets too), by name."""
        return {}

    def current_lr(self) -> float:
        """Learning rate of the first optimizer (NaN if none)."""
        for opt in self.optimizers.values():
            return float(opt.param_groups[0]['lr'])
        return float('nan')

    def schedule_values(self) -> dict:
        """The scheduled coefficients at the current frame, for the records."""
        frame = self.clock.frame
        return {'explore_var': self.explore_var.value(frame), 'entropy_coef': self.entropy_coef.value(frame)}

    def crossed_next(self, frequency: int) -> bool:
        """Whether the vector step being stored (ticked on the clock after update) crosses a
        multiple of `frequency` frames: how training_frequency and update_frequency, counted in
        frames as in SLM-Lab, fire whatever num_envs is."""
        frame = self.clock.frame + self.num_envs  # the frame count once this step is ticked
        return frame // frequency > self.clock.frame // frequency

    def tensor(self, x: np.ndarray) -> torch.Tensor:
        """An array as the nets take it (memory.base.to_tensor), on this algorithm's device."""
        return to_tensor(x, self.device)

    def clip_groups(self) -> list[list[torch.Tensor]]:
        """The parameter groups whose gradients are clipped to net.clip_grad_val each on its own:
        one per net, as SLM-Lab clips each net in its own train step (an actor's step is not
        shrunk by its critic's gradient). By default, every optimizer's parameters as one group."""
        return [[p for opt in self.optimizers.values() for g in opt.param_groups for p in g['params']]]

    def step_optimizers(self, loss: torch.Tensor, names: tuple[str, ...] | None = None, tick: bool = True) -> float:
        """One gradient step of the optimizers `names` (default: all) on `loss`: zero their
        gradients, backward, clip each of their clip groups' gradients to net.clip_grad_val, step
        them. An algorithm with several losses (actor, critic, temperature) calls this once per
        loss with the optimizer that goes with it. Returns the gradient norm before clipping (of
        all the groups stepped together) and, when `tick`, counts one optimizer step on the clock."""
        norms = self.step_clip_groups(loss, names, ticks=int(tick))
        return float(norms[0]) if len(norms) == 1 else float(torch.linalg.vector_norm(torch.stack(norms)))

    def step_clip_groups(self, loss: torch.Tensor, names: tuple[str, ...] | None = None,
                         ticks: int = 1) -> list[torch.Tensor]:
        """step_optimizers' work, returning the gradient norm of each clip group before clipping
        (0-d tensors, in clip_groups' order) and counting `ticks` optimizer steps on the clock.
        Losses whose graphs reach disjoint parameters (separate nets, each with its optimizer) may
        be stepped with one backward of their sum: each parameter gets the gradient its own loss
        gives it, bit for bit (a sum passes its gradient on to each term unchanged)."""
        names = tuple(self.optimizers) if names is None else names
        optimizers = [self.optimizers[name] for name in names]
        for opt in optimizers:  # opt.zero_grad(set_to_none=True) without its per-call wrappers
            for group in opt.param_groups:
                for p in group['params']:
                    p.grad = None
        loss.backward()
        clip = self.net_spec.get('clip_grad_val') if self.net_spec else None
        groups = self._clip_groups_of(names)
        norms = _group_grad_norms([[p.grad for p in params if p.grad is not None] for params in groups])
        for params, norm in zip(groups, norms):
            # clip_grad_norm_ scales by min(1, clip / (norm + 1e-6)): skip its multiply by exactly 1.0
            # (the margin keeps that exact in float32); a NaN or inf norm still goes through it
            if clip is not None and not float(norm) < clip * (1.0 - 1e-5):
                clip_grads_with_norm_(params, clip, norm)
        for opt in optimizers:
            step_optimizer(opt)
        for _ in range(ticks):
            self.clock.tick_opt_step()
        return norms

    def _clip_groups_of(self, names: tuple[str, ...]) -> list[list[torch.Tensor]]:
        """The clip groups (see clip_groups) whose parameters the optimizers `names` train, each
        cut to those parameters. Computed once per set of names: the optimizers' parameters never
        change after construction."""
        if names not in self._clip_group_cache:
            if self._optim_params is None:
                self._optim_params = self.clip_groups()
            owned = {id(p) for name in names for g in self.optimizers[name].param_groups for p in g['params']}
            groups = [[p for p in group if id(p) in owned] for group in self._optim_params]
            self._clip_group_cache[names] = [group for group in groups if group]
        return self._clip_group_cache[names]

    def step_lr_schedulers(self) -> None:
        """Set each optimizer's learning rate to its schedule's value at this step's frame. Call
        once after each training update, from update(), before the clock ticks the step: the frame
        counts the step being trained on, as SLM-Lab v4's clock did when it set the rate for its
        update (see net_util.step_lr_scheduler: torch schedulers count frames, not updates)."""
        frame = self.clock.frame + self.clock.num_envs
        for sched in self.lr_schedulers.values():
            net_util.step_lr_scheduler(sched, frame)

    def cut_episodes(self) -> None:
        """The running episodes were abandoned (see Memory.cut_episodes); override when the
        algorithm holds steps of them itself."""

    # --- state ----------------------------------------------------------------------------------
    def extra_state(self) -> dict:
        """Algorithm counters beyond nets and optimizers (override to add)."""
        return {}

    def load_extra_state(self, state: dict) -> None:
        pass

    def state_dict(self) -> dict:
        return {
            'nets': {k: v.state_dict() for k, v in self.nets().items()},
            'optimizers': {k: v.state_dict() for k, v in self.optimizers.items()},
            'lr_schedulers': {k: v.state_dict() for k, v in self.lr_schedulers.items()},
            'rng': self.rng.bit_generator.state,
            'extra': self.extra_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a snapshot. The optimizers' hyperparameters come from the spec, not the
        snapshot, so a run resumed under an edited optim_spec (--force) trains with the edited
        values; see _apply_spec_hyperparameters."""
        spec_groups = {k: [{h: v for h, v in g.items() if h != 'params'} for g in opt.param_groups]
                       for k, opt in self.optimizers.items()}
        for k, net in self.nets().items():
            net.load_state_dict(state['nets'][k])
        for k, opt in self.optimizers.items():
            opt.load_state_dict(state['optimizers'][k])
        for k, sched in self.lr_schedulers.items():
            new_end = getattr(sched, 'linear_to_zero_end', None)
            spec_args = {a: v for a, v in vars(sched).items() if a not in SCHEDULER_STATE}
            sched.load_state_dict(state['lr_schedulers'][k])  # brings back the arguments it was saved with
            if new_end is not None:
                _move_linear_to_zero(sched, new_end)
            else:  # the spec's arguments (step_size, gamma, milestones...), edited with --force or not
                vars(sched).update(spec_args)
        for k, opt in self.optimizers.items():
            _apply_spec_hyperparameters(opt, spec_groups[k], self.lr_schedulers.get(k))
        self.rng.bit_generator.state = state['rng']
        self.load_extra_state(state['extra'])


# what a torch LR scheduler's state holds beyond the arguments it was built with
SCHEDULER_STATE = ('optimizer', 'last_epoch', 'base_lrs', '_last_lr', '_step_count', '_get_lr_called_within_step',
                   '_is_initial', 'linear_to_zero_end', 'lr_lambdas', 'verbose', 'T_cur')


def _move_linear_to_zero(sched, new_end: float) -> None:
    """A LinearToZero schedule whose end moved (env.max_frame raised on resume) continues as if
    the run had been started with the new end, from the next update on: the loaded rate
    base * (1 - f / old_end), set at the last update's frame f, becomes base * (1 - f / new_end).
    (The old end is in the scheduler's own state; snapshots older than that attribute keep their rate.)"""
    old_end, sched.linear_to_zero_end = sched.linear_to_zero_end, new_end
    if new_end == old_end:
        return
    for i, group in enumerate(sched.optimizer.param_groups):
        base = sched.base_lrs[i]
        if not base:
            continue
        frame = linear_to_zero_frame(group['lr'], base, old_end)  # the frame of the last scheduler step
        group['lr'] = base * linear_to_zero_factor(frame, new_end)
        sched._last_lr[i] = group['lr']


def _apply_spec_hyperparameters(opt: torch.optim.Optimizer, spec_groups: list[dict], sched) -> None:
    """Give a loaded optimizer the hyperparameters of the spec it was built from (identical for
    an unchanged spec, so exact resumes stay exact). A changed learning rate rescales what the
    LR schedule had reached: the run continues as if it had been started with the new rate."""
    for i, (group, spec_group) in enumerate(zip(opt.param_groups, spec_groups)):
        for key, value in spec_group.items():
            if key not in ('lr', 'initial_lr'):
                group[key] = value
        spec_lr = spec_group.get('initial_lr', spec_group['lr'])
        loaded_lr = group.get('initial_lr', group['lr'])
        if isinstance(spec_lr, torch.Tensor) or isinstance(loaded_lr, torch.Tensor) or spec_lr == loaded_lr:
            continue
        ratio = spec_lr / loaded_lr if loaded_lr else None
        group['lr'] = group['lr'] * ratio if ratio is not None else spec_lr
        if 'initial_lr' in group:
            group['initial_lr'] = spec_lr
        if sched is not None and hasattr(sched, 'base_lrs'):
            sched.base_lrs[i] = spec_lr
            if hasattr(sched, '_last_lr'):
                sched._last_lr[i] = group['lr']


def clip_grads_with_norm_(params: list[torch.Tensor], max_norm: float, norm: torch.Tensor) -> None:
    """torch.nn.utils.clip_grads_with_norm_ (each gradient times min(1, max_norm / (norm + 1e-6))),
    the same numbers with one multiply over the list where the gradients share a device and a
    dtype, without torch's grouping of them by device and dtype at each call (about 8 us of the
    17-20 a call took on an A2C CartPole net here)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    if len({(g.device, g.dtype) for g in grads}) > 1:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        return
    coef = torch.clamp(float(max_norm) / (norm + 1e-6), max=1.0)
    kernels.mul_(grads, coef.to(grads[0].device))


def _group_grad_norms(grad_groups: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """The L2 norm of each group's gradients, as torch.nn.utils.get_total_norm gives it (the
    vector norm of the per-tensor norms), with one kernels.norms over every group's tensors
    when they share a device and dtype: the same numbers for one kernel call instead of one per
    group. A group without gradients has norm 0."""
    flat = [g for grads in grad_groups for g in grads]
    if not flat or len({(g.device, g.dtype) for g in flat}) > 1 or flat[0].device.type not in ('cpu', 'cuda'):
        return [torch.nn.utils.get_total_norm(grads) for grads in grad_groups]
    per_tensor = kernels.norms(flat)
    norms, start = [], 0
    for grads in grad_groups:
        part = per_tensor[start:start + len(grads)]
        start += len(grads)
        norms.append(torch.linalg.vector_norm(torch.stack(part), 2.0) if part else torch.tensor(0.0))
    return norms
