"""Action distributions and action policies: from a net's output to actions.

action_pdtype names the distribution over actions (`default`: Categorical for Discrete, Normal
for Box), with SLM-Lab's meanings:
- Discrete: `Categorical` (logits), `Argmax` (always the largest logit; SLM-Lab's "distribution"
  with probability 1 on the argmax), `GumbelSoftmax` (SLM-Lab's relaxed one-hot Categorical at
  temperature 1: `sample` gives a hard action index, `rsample` a straight-through one-hot, and
  log_prob / entropy are the Categorical's).
- 1-D Box: `Normal`, `Gumbel`, `LogNormal` (loc and scale per action dimension) and
  `MultivariateNormal` (one joint distribution with a diagonal covariance). The net gives the
  loc (B, act_dim); the scale is either a learned state-independent log std (one parameter per
  dimension, initialised to net.log_std_init; what the lab's PPO / Reinforce / ActorCritic
  build) or, when PolicyHead gets log_std_init=None, a second output of the net, as SLM-Lab's
  nets without log_std_init give it: pd_out_dim is then 2 * act_dim, [loc..., log_scale...].
  Either way std = exp(clamp(log_scale, -5, 2)) (SLM-Lab v5's bounds), except that
  MultivariateNormal reads exp(clamped output) as the variance, as SLM-Lab builds its covariance.

action_policy names how an action is drawn (`default`: sample the distribution; `random`:
uniform over the Discrete actions; `epsilon_greedy`: uniform random with probability explore_var,
else the largest output (SLM-Lab v5; v4 sampled the distribution there, which is the same for
the Argmax pdtype its epsilon-greedy specs use); `boltzmann`: sample the distribution of
output / explore_var).
"""
from __future__ import annotations


import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import distributions as D

from slm_lab.lib.errors import SpecError

DISCRETE_PDTYPES = ('Categorical', 'Argmax', 'GumbelSoftmax')
CONTINUOUS_PDTYPES = ('Normal', 'Gumbel', 'LogNormal', 'MultivariateNormal')
PDTYPES = ('default',) + DISCRETE_PDTYPES + CONTINUOUS_PDTYPES
# SLM-Lab names refused with the "not available yet" line: Beta (SLM-Lab builds every continuous
# distribution from loc and scale, which Beta does not take, so no SLM-Lab run has used it),
# MultiCategorical (MultiDiscrete action spaces) and NormalTanh (only its MuJoCo Playground spec)
PLANNED_PDTYPES = ('Beta', 'MultiCategorical', 'NormalTanh')
ACTION_POLICIES = ('default', 'random', 'epsilon_greedy', 'boltzmann')
# SLM-Lab v4's action policies for several action heads (its HydraDQN), not available here yet
PLANNED_ACTION_POLICIES = {
    'multi_epsilon_greedy': "an action policy for several action heads (SLM-Lab v4's HydraDQN)",
    'multi_boltzmann': "an action policy for several action heads (SLM-Lab v4's HydraDQN)",
}
LOG_SCALE_MIN, LOG_SCALE_MAX = -5.0, 2.0  # SLM-Lab v5's clamp of a log scale output


def check_action_space(action_space: gym.Space, algo_spec: dict, algo_name: str, continuous_ok: bool) -> str:
    """Resolve action_pdtype for this action space; SpecError when they do not fit."""
    pdtype = algo_spec.get('action_pdtype', 'default')
    if isinstance(action_space, gym.spaces.Discrete):
        pdtype = 'Categorical' if pdtype == 'default' else pdtype
        if pdtype not in DISCRETE_PDTYPES:
            raise SpecError(f"agent.algorithm.action_pdtype: '{pdtype}' does not fit the env's Discrete actions; "
                            f'use one of: default, {", ".join(DISCRETE_PDTYPES)}')
    elif isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        if not continuous_ok:
            raise SpecError(f"agent.algorithm.name: {algo_name} needs Discrete actions but the env's actions are "
                            f'continuous (Box); use PPO or Reinforce, or a Discrete env')
        pdtype = 'Normal' if pdtype == 'default' else pdtype
        policy = algo_spec.get('action_policy', 'default')
        if policy != 'default':
            raise SpecError(f"agent.algorithm.action_policy: '{policy}' needs Discrete actions but the env's are "
                            'continuous (Box); use "default"')
        if pdtype not in CONTINUOUS_PDTYPES:
            raise SpecError(f"agent.algorithm.action_pdtype: '{pdtype}' does not fit the env's continuous (Box) "
                            f'actions; use one of: default, {", ".join(CONTINUOUS_PDTYPES)}')
    else:
        raise SpecError(f"env.name: action space {action_space} is not supported yet; "
                        'use an env with Discrete or 1-D Box actions')
    return pdtype


def action_dim(action_space: gym.Space) -> int:
    """Number of outputs a policy needs: n for Discrete, the action size for Box."""
    if isinstance(action_space, gym.spaces.Discrete):
        return int(action_space.n)
    return int(np.prod(action_space.shape))


def is_discrete(pdtype: str) -> bool:
    """Whether pdtype is a distribution over action indices (its actions are long integers)."""
    return pdtype in DISCRETE_PDTYPES


def pd_actions(actions: torch.Tensor, pdtype: str) -> torch.Tensor:
    """Stored actions as the distribution's log_prob takes them: long indices (B,) for a discrete
    pdtype, float (B, act_dim) for a continuous one."""
    return actions.long() if is_discrete(pdtype) else actions.float()


def pd_out_dim(pdtype: str, act_dim: int, log_std_init: float | None = 0.0) -> int:
    """Width of the policy net's output for a distribution over act_dim actions (or action
    dimensions): logits or locs, one per action; twice that for a continuous pdtype whose scale
    the net outputs too (log_std_init None, SLM-Lab's layout [loc..., log_scale...])."""
    if not is_discrete(pdtype) and log_std_init is None:
        return 2 * act_dim
    return act_dim


class GumbelSoftmax(D.RelaxedOneHotCategorical):
    """SLM-Lab's GumbelSoftmax: a relaxed one-hot Categorical (Jang et al. 2017; Maddison et al.
    2017) whose `sample()` is the hard action index argmax(logits + g) / T, g ~ Gumbel(0, 1)
    (B,), whose `rsample()` is the straight-through one-hot y_hard - y_soft.detach() + y_soft
    (B, n), and whose log_prob and entropy are those of Categorical(logits): the relaxed density
    is not what a policy gradient over discrete actions needs."""

    def sample(self, sample_shape=torch.Size()) -> torch.Tensor:
        with torch.no_grad():
            logits = self.logits.expand(torch.Size(sample_shape) + self.logits.shape)
            gumbel = -torch.empty_like(logits).exponential_().log()
            return ((logits + gumbel) / self.temperature).argmax(dim=-1)

    def rsample(self, sample_shape=torch.Size()) -> torch.Tensor:
        y_soft = super().rsample(sample_shape)
        y_hard = F.one_hot(y_soft.argmax(dim=-1), y_soft.shape[-1]).to(y_soft.dtype)
        return y_hard - y_soft.detach() + y_soft

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """value: action indices (B,) or one-hot / relaxed vectors (B, n)."""
        log_p = F.log_softmax(self.logits, dim=-1)
        if value.shape != self.logits.shape:
            return log_p.gather(-1, value.long().unsqueeze(-1)).squeeze(-1)
        return (value * log_p).sum(dim=-1)

    def entropy(self) -> torch.Tensor:
        return D.Categorical(logits=self.logits).entropy()


def argmax_logits(out: torch.Tensor) -> torch.Tensor:
    """SLM-Lab's Argmax distribution as logits: 1 where out is largest in its row, -1e8
    elsewhere (ties share the probability), so Categorical(logits) puts probability 1 there."""
    is_max = out == out.max(dim=-1, keepdim=True).values
    return torch.where(is_max, torch.ones_like(out), torch.full_like(out, -1e8))


def loc_scale_distribution(pdtype: str, loc: torch.Tensor, log_scale: torch.Tensor) -> D.Distribution:
    """The continuous distribution of (B, act_dim) locs and raw log scales, over (B, act_dim)
    actions with log_prob / entropy (B,): independent Normal / Gumbel / LogNormal with
    scale = exp(clamp(log_scale, -5, 2)), or MultivariateNormal with covariance
    diag(exp(clamp(log_scale, -5, 2))) (SLM-Lab passes that exp as the covariance)."""
    scale = log_scale.clamp(LOG_SCALE_MIN, LOG_SCALE_MAX).exp()
    if pdtype == 'MultivariateNormal':
        return D.MultivariateNormal(loc, scale_tril=torch.diag_embed(scale.sqrt()))
    cls = {'Normal': D.Normal, 'Gumbel': D.Gumbel, 'LogNormal': D.LogNormal}[pdtype]
    return D.Independent(cls(loc, scale.expand_as(loc)), 1)


def draw_one(probs: torch.Tensor) -> torch.Tensor:
    """One index per row of `probs` (B, K): the draw torch.multinomial(probs, 1, True) makes, the
    same numbers from the same generator state. For one sample torch draws q ~ Exp(1) of probs'
    shape and takes argmax(probs / q) (the exponential form of the Gumbel-max trick), after three
    checks of the probabilities read back to the host, which cost more than the draw (10 us against
    4 us a vector step of 8 CartPoles). Probabilities from a softmax need one of them: NaN (from
    non-finite logits) is refused with multinomial's error, so a session reports the divergence at
    the step that met it, as before."""
    if bool(probs.isnan().any()):  # a softmax gives no inf and no negatives: NaN is all there is to refuse
        raise RuntimeError('probability tensor contains either `inf`, `nan` or element < 0')
    q = torch.empty_like(probs).exponential_(1)
    return torch.argmax(probs / q, dim=-1)


class PolicyHead(nn.Module):
    """Turns a policy net's raw output into a torch distribution (see the module docstring).

    Continuous pdtypes with a float log_std_init own a learned, state-independent log std (one
    per action dimension, initialised to it); with log_std_init None the net outputs the log
    scale (pd_out_dim gives the width to build the net with)."""

    def __init__(self, pdtype: str, act_dim: int, log_std_init: float | None = 0.0):
        super().__init__()
        self.pdtype = pdtype
        self.act_dim = act_dim
        if not is_discrete(pdtype) and log_std_init is not None:
            self.log_std = nn.Parameter(torch.full((act_dim,), float(log_std_init)))
        else:
            self.log_std = None

    def loc_and_log_scale(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A continuous pdtype's loc (B, act_dim) and raw log scale (B, act_dim) from the net's output."""
        if self.log_std is not None:
            return out, self.log_std.expand_as(out)
        return out[..., :self.act_dim], out[..., self.act_dim:]

    def distribution(self, out: torch.Tensor) -> D.Distribution:
        """out: (B, pd_out_dim) logits, locs, or [locs, log scales]."""
        if self.pdtype == 'Argmax':
            return D.Categorical(logits=argmax_logits(out))
        if self.pdtype == 'GumbelSoftmax':
            return GumbelSoftmax(torch.tensor(1.0, device=out.device), logits=out)
        if is_discrete(self.pdtype):
            return D.Categorical(logits=out)
        return loc_scale_distribution(self.pdtype, *self.loc_and_log_scale(out))

    def sample(self, out: torch.Tensor) -> torch.Tensor:
        """An action drawn from distribution(out): (B,) or (B, act_dim). For Categorical, the same
        draw as torch's Categorical(logits=out).sample() (normalised logits, softmax, one
        multinomial draw per row), and for Normal, the same torch.normal draw as Normal's sample,
        without building the object and validating its arguments (a step's acting, where that was
        half the time of a small net's act)."""
        if self.pdtype == 'Categorical':
            probs = torch.softmax(out - out.logsumexp(dim=-1, keepdim=True), dim=-1)
            return draw_one(probs.reshape(-1, probs.shape[-1])).reshape(probs.shape[:-1])
        if self.pdtype == 'Normal':  # Independent(Normal(loc, scale)).sample(): the same torch.normal draw
            loc, log_scale = self.loc_and_log_scale(out)
            return torch.normal(loc, log_scale.clamp(LOG_SCALE_MIN, LOG_SCALE_MAX).exp().expand_as(loc))
        return self.distribution(out).sample()

    def log_prob_and_entropy(self, out: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log pi(a|s) (B,), entropy H(pi(.|s)) (B,)) of distribution(out) at `actions`. For
        Categorical, torch's Categorical log_prob and entropy computed op for op, so the same
        numbers, without the distribution object and its argument checks (a PPO update calls this
        once per minibatch, where that overhead was a tenth of the step)."""
        if self.pdtype == 'Categorical':
            logits = out - out.logsumexp(dim=-1, keepdim=True)
            log_prob = logits.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
            probs = torch.softmax(logits, dim=-1)
            entropy = -(torch.clamp(logits, min=torch.finfo(logits.dtype).min) * probs).sum(-1)
            return log_prob, entropy
        pd = self.distribution(out)
        return pd.log_prob(actions), pd.entropy()

    def log_prob(self, out: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log pi(a|s) (B,) of distribution(out) at `actions` (see log_prob_and_entropy)."""
        if self.pdtype == 'Categorical':
            logits = out - out.logsumexp(dim=-1, keepdim=True)
            return logits.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        return self.distribution(out).log_prob(actions)

    def greedy_action(self, out: torch.Tensor) -> torch.Tensor:
        """The action an evaluation takes from this head's net output (see greedy)."""
        return self.greedy(out, self.pdtype, self.act_dim if self.log_std is None else None)

    @staticmethod
    def greedy(out: torch.Tensor, pdtype: str, act_dim: int | None = None) -> torch.Tensor:
        """The action an evaluation takes: the largest logit for a discrete pdtype; for a
        continuous one the loc (the first act_dim outputs, when the net gives the log scale
        too), the mode of Normal, Gumbel and MultivariateNormal, or exp(loc), LogNormal's median."""
        if is_discrete(pdtype):
            return out.argmax(dim=-1)
        loc = out[..., :act_dim] if act_dim is not None else out
        return loc.exp() if pdtype == 'LogNormal' else loc


def sample_actions(out: torch.Tensor, head: PolicyHead, action_policy: str, explore_var: float,
                   rng: np.random.Generator, n_actions: int | None) -> torch.Tensor:
    """Draw actions (B,) or (B, act_dim) from a net output per the action policy. The policies
    other than `default` apply to Discrete actions (n_actions of them); their random draws come
    from `rng`, whose state the algorithm saves, so a resumed run draws the same actions."""
    if action_policy == 'random':
        return torch.as_tensor(rng.integers(0, n_actions, size=out.shape[0]), device=out.device)
    if action_policy == 'epsilon_greedy':
        greedy = out.argmax(dim=-1)
        explore = rng.random(out.shape[0]) < explore_var
        if explore.any():
            # on the net's device: torch.where refuses operands on different devices
            random_actions = torch.as_tensor(rng.integers(0, n_actions, size=out.shape[0]), device=out.device)
            greedy = torch.where(torch.as_tensor(explore, device=out.device), random_actions, greedy)
        return greedy
    if action_policy == 'boltzmann':
        tau = max(explore_var, 1e-8)
        # SLM-Lab divides the output by the temperature and samples the pdtype's distribution
        # (for Argmax that is still the largest output)
        return head.distribution(out / tau).sample()
    if head.pdtype == 'Argmax':
        return out.argmax(dim=-1)
    return head.sample(out)


def to_env_actions(actions: torch.Tensor, action_space: gym.Space) -> np.ndarray:
    """Tensor actions to numpy. Box actions are not clipped here: the agent learns from the
    action it sampled, and the env (ClipAction, see make_env) clips what it executes."""
    a = actions.cpu().numpy()
    if isinstance(action_space, gym.spaces.Box):
        return a.astype(action_space.dtype)
    return a
