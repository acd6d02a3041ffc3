"""How fast a SAC update can go on this CPU in float32: the lab's own against hand-written ones.

    python bench/sac_update.py --cpu 1                  # rl-zoo3's HalfCheetah sizes, pinned to core 1
    python bench/sac_update.py --cpu 1 --compile        # also the hand-written update under torch.compile
    python bench/sac_update.py --cpu 1 --bf16           # also the lab's update in bf16 (agent.net.precision)

One SAC update of rl-zoo3's HalfCheetah-v5 settings (actor and two critics [256, 256], batch 256,
Adam 3e-4 with `fused`, learned temperature, polyak 0.005), one torch thread, timed four ways in
alternating rounds (median ms per update over the rounds):
  lab        the lab's SoftActorCritic from spec/benchmark/sac/sac_halfcheetah_zoo.json on
             HalfCheetah-v5's spaces: Agent.update on random transitions, one update per call (the
             store into the replay included; acting and the env not);
  separate   the same maths written as plainly as a single-file implementation does it: two
             critic nets, each its own matrix products;
  ensemble   the same, the two critics (and their targets) as one stacked set of weights, one
             batched product per layer for both (torch.baddbmm), as TorchRL's vmapped Q-ensembles;
  compiled   (--compile) `separate` with its three losses under torch.compile, start-up excluded;
  lab_bf16   (--bf16) `lab` with `agent.net.precision: "bf16"` (its nets under bf16 autocast).
What the gaps mean: lab - separate is what the lab's structure costs per update (records, metric
norms, Python); separate - ensemble what stacking the twin critics saves. Nothing here changes a
number the lab computes; the hand-written forms start from other random weights.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

from pinning import add_cpu_arg, pin  # bench/ (not a package) is on sys.path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ('spec/benchmark/sac/sac_halfcheetah_zoo.json', 'sac_halfcheetah_zoo')
B, OBS, ACT, HID = 256, 17, 6, 256


def lab_update(torch, np, precision: str = 'fp32'):
    """One Agent.update (store + one SAC update) of the lab's zoo spec, on random transitions,
    its nets in `precision` (agent.net.precision)."""
    import gymnasium as gym

    from slm_lab.agent import Agent
    from slm_lab.env.clock import Clock
    from slm_lab.spec import load_spec

    spec = load_spec(str(ROOT / SPEC[0]), SPEC[1])
    spec['agent']['algorithm']['training_start_step'] = 1000
    spec['agent']['net']['precision'] = precision
    env = gym.make('HalfCheetah-v5')
    clock = Clock(10**7, 1)
    agent = Agent(spec, env.observation_space, env.action_space, 1, clock, seed=0)
    env.close()
    rng = np.random.default_rng(0)

    def update():
        obs = rng.standard_normal((1, OBS)).astype(np.float32)
        action = rng.uniform(-1, 1, (1, ACT)).astype(np.float32)
        metrics = agent.update(obs, action, rng.standard_normal(1).astype(np.float32),
                               rng.standard_normal((1, OBS)).astype(np.float32), np.zeros(1, bool), np.zeros(1, bool))
        clock.tick(0)
        return metrics

    while update() is None:  # fill past training_start_step
        pass
    return update


def hand_written(torch, ensemble: bool, compiled: bool):
    """The same SAC update as a single-file implementation writes it (see the module docstring)."""
    nn, F = torch.nn, torch.nn.functional

    def mlp(i, o):
        return nn.Sequential(nn.Linear(i, HID), nn.ReLU(), nn.Linear(HID, HID), nn.ReLU(), nn.Linear(HID, o))

    class Twin(nn.Module):
        """Q1 and Q2 as one module: Q(x) -> (2, B)."""

        def __init__(self):
            super().__init__()
            if ensemble:
                pair = [mlp(OBS + ACT, 1), mlp(OBS + ACT, 1)]
                self.w = nn.ParameterList(nn.Parameter(torch.stack([q[k].weight.detach().t() for q in pair]))
                                          for k in (0, 2, 4))
                self.b = nn.ParameterList(nn.Parameter(torch.stack([q[k].bias.detach() for q in pair]).unsqueeze(1))
                                          for k in (0, 2, 4))
            else:
                self.q1, self.q2 = mlp(OBS + ACT, 1), mlp(OBS + ACT, 1)

        def forward(self, x):
            if not ensemble:
                return torch.stack([self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)])
            h = x.expand(2, *x.shape)
            h = torch.relu(torch.baddbmm(self.b[0], h, self.w[0]))
            h = torch.relu(torch.baddbmm(self.b[1], h, self.w[1]))
            return torch.baddbmm(self.b[2], h, self.w[2]).squeeze(-1)

    actor, critic, target = mlp(OBS, 2 * ACT), Twin(), Twin()
    target.load_state_dict(critic.state_dict())
    critic_params, target_params = list(critic.parameters()), list(target.parameters())
    critic_opt = torch.optim.Adam(critic_params, lr=3e-4, fused=True)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=3e-4, fused=True)
    log_alpha = torch.zeros(1, requires_grad=True)
    alpha_opt = torch.optim.Adam([log_alpha], lr=3e-4)
    n = 10_000
    states, actions = torch.randn(n, OBS), torch.rand(n, ACT) * 2 - 1
    rewards, next_states, dones = torch.randn(n), torch.randn(n, OBS), torch.zeros(n)

    def policy(s):
        mu, log_std = actor(s).chunk(2, -1)
        log_std = log_std.clamp(-20, 2)
        std = log_std.exp()
        u = mu + std * torch.randn_like(mu)
        log_prob = (-((u - mu) ** 2) / (2 * std ** 2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        return torch.tanh(u), log_prob - (2 * (math.log(2) - u - F.softplus(-2 * u))).sum(-1)

    def targets(s2, r, d):
        with torch.no_grad():
            a2, log_prob2 = policy(s2)
            return r + 0.99 * (1 - d) * (target(torch.cat([s2, a2], -1)).min(0).values - log_alpha.exp() * log_prob2)

    def critic_loss(s, a, y):
        return ((critic(torch.cat([s, a], -1)) - y) ** 2).mean(1).sum()

    def actor_loss(s):
        a, log_prob = policy(s)
        return (log_alpha.exp().detach() * log_prob - critic(torch.cat([s, a], -1)).min(0).values).mean(), log_prob

    if compiled:
        targets, critic_loss, actor_loss = (torch.compile(f) for f in (targets, critic_loss, actor_loss))

    def update():
        i = torch.randint(n, (B,))
        s = states[i]
        loss = critic_loss(s, actions[i], targets(next_states[i], rewards[i], dones[i]))
        critic_opt.zero_grad()
        loss.backward()
        critic_opt.step()
        for p in critic_params:
            p.requires_grad_(False)
        loss, log_prob = actor_loss(s)
        actor_opt.zero_grad()
        loss.backward()
        actor_opt.step()
        for p in critic_params:
            p.requires_grad_(True)
        alpha_loss = -(log_alpha * (log_prob.detach() - ACT)).mean()
        alpha_opt.zero_grad()
        alpha_loss.backward()
        alpha_opt.step()
        with torch.no_grad():
            torch._foreach_lerp_(target_params, critic_params, 0.005)

    return update


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=7)
    parser.add_argument('--updates', type=int, default=100, help='updates per form per round')
    parser.add_argument('--compile', action='store_true', help='also the hand-written update under torch.compile')
    parser.add_argument('--bf16', action='store_true',
                        help="also the lab's update with its nets in bf16 (agent.net.precision)")
    add_cpu_arg(parser)
    args = parser.parse_args(argv)
    where = pin(args.cpu)
    warnings.filterwarnings('ignore')
    sys.path.insert(0, str(ROOT))
    import numpy as np
    import torch
    torch.manual_seed(0)
    forms = {'lab': lab_update(torch, np), 'separate': hand_written(torch, False, False),
             'ensemble': hand_written(torch, True, False)}
    if args.bf16:
        forms['lab_bf16'] = lab_update(torch, np, 'bf16')
    if args.compile:
        forms['compiled'] = hand_written(torch, False, True)
    for update in forms.values():  # warm-up (and torch.compile's start-up)
        for _ in range(20):
            update()
    times = {name: [] for name in forms}
    for _ in range(args.rounds):
        for name, update in forms.items():
            t0 = time.perf_counter()
            for _ in range(args.updates):
                update()
            times[name].append((time.perf_counter() - t0) / args.updates * 1e3)
    print(f'# {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())} | {where} | SAC update, HalfCheetah sizes, '
          f'batch {B} | median of {args.rounds} rounds of {args.updates}')
    base = statistics.median(times['separate'])
    print(f'{"form":>9} {"ms/update":>10} {"min":>8} {"max":>8} {"vs separate":>12}')
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f'{name:>9} {m:>10.3f} {min(ts):>8.3f} {max(ts):>8.3f} {base / m:>11.2f}x')
    return 0


if __name__ == '__main__':
    sys.exit(main())
