"""The CartPole rows and PPO Hopper as bare torch loops: what each row costs in torch itself.

    python bench/bare_torch.py --rows ppo,a2c,dqn,ppo_hopper --seeds 0,1,2 --cpu 1   # bare and the lab, interleaved
    python bench/bare_torch.py --rows ppo,a2c,dqn --seeds 0,1,2 --cpu 1 --with-sb3   # and SB3 (the bench venv)
    python bench/bare_torch.py --rows ppo --seeds 0 --bare-only --frames 4096    # a quick check

The CartPole rows and PPO Hopper of bench/sb3_side_by_side.py are bound by per-call costs, not by
arithmetic: their nets are 64 or 256 units wide, so bench/floor.py's floor (the env alone plus the products at
this CPU's peak) is tens of times above what any tool reaches, and says nothing about how much
room a tool has left. This bench measures another reference: the row's algorithm written as a
plain loop over gymnasium and torch, with nothing but the work itself: the row's vector env
(gymnasium's sync vector env with RecordEpisodeStatistics, resetting finished sub-envs in the same
step), its nets (torch.nn.Sequential of nn.Linear and the activation, orthogonal init), acting under
torch.inference_mode with torch's Categorical draw (softmax, multinomial), the update of rl-zoo3's
hyperparameters (bench/side_rows.py: the same batch sizes, epochs, gradient steps, clipping and
learning-rate schedule; PPO Hopper's running normalisation of observations and rewards as SB3's
VecNormalize computes it), and the fastest public optimizer steps (Adam(fused=True),
RMSprop(foreach=True)). No records, no snapshots, no checks, no schedules' objects: a lower bound
for an eager-torch implementation of the row on this machine, not a library. What a tool spends
above it is its own overhead (and the records it keeps); a tool cannot run at twice the frames/s
of another whose loop is already within 2x of this one without doing less work than the loop does.

It is not the fastest the row can run: a compiled graph (torch.compile) or a hand-written kernel
could do better. Measured on the PPO CartPole update's forward, backward and Adam step at batch
256 (the row's 20 epochs of one minibatch): torch.compile 10% faster than eager once compiled,
after 6 s of compiling (docs/BENCHMARKS.md).

How it runs: as bench/sb3_side_by_side.py runs its columns (a fresh Python process per run, one
torch thread, pinned with --cpu, each tool first in turn over the seeds), the lab's and SB3's
children being that bench's own. frames/s: env frames over the wall seconds of the training loop
(the bare loop: from its first reset to its last update; the lab and SB3: as that bench says).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pinning import child_result, python_child  # noqa: E402  (bench/ is not a package)
from side_rows import REPO_ROOT, ROWS, Row, run_frames  # noqa: E402

BARE_ROWS = ('ppo', 'a2c', 'dqn', 'ppo_hopper')


def _mlp(n_in: int, hidden: list[int], n_out: int, activation, out_gain: float):
    """nn.Sequential of Linear + activation, orthogonal init (gain sqrt(2) hidden, out_gain out), as
    SB3's and the lab's on-policy nets; zero biases."""
    import torch.nn as nn
    layers, width = [], n_in
    for h in hidden:
        layers += [nn.Linear(width, h), activation()]
        width = h
    layers.append(nn.Linear(width, n_out))
    linears = [m for m in layers if isinstance(m, nn.Linear)]
    for m in linears:
        nn.init.orthogonal_(m.weight, gain=math.sqrt(2) if m is not linears[-1] else out_gain)
        nn.init.zeros_(m.bias)
    return nn.Sequential(*layers)


def _vector_env(row: Row, seed: int, gamma: float = 0.99):
    """The row's gymnasium sync vector env, same-step resets, episode statistics (with
    row.normalize the loop normalises, see _Normalize)."""
    import gymnasium as gym
    env = gym.make_vec(row.env_id, num_envs=row.n_envs, vectorization_mode='sync',
                       vector_kwargs={'autoreset_mode': gym.vector.AutoresetMode.SAME_STEP})
    env = gym.wrappers.vector.RecordEpisodeStatistics(env)
    obs, _ = env.reset(seed=seed)
    return env, obs


class _Normalize:
    """rl-zoo3's `normalize: true` as SB3's VecNormalize computes it: observations by their running
    mean and variance, rewards by the running std of the discounted return, both clipped to +-10
    (gymnasium's vector normalisation wrappers refuse same-step resets)."""

    def __init__(self, n_obs: int, n_envs: int, gamma: float):
        from gymnasium.wrappers.utils import RunningMeanStd
        self.obs_rms, self.ret_rms = RunningMeanStd(shape=(n_obs,)), RunningMeanStd(shape=())
        self.ret, self.gamma = np.zeros(n_envs), gamma

    def obs(self, raw: np.ndarray, update: bool = True) -> np.ndarray:
        if update:
            self.obs_rms.update(raw)
        return np.clip((raw - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + 1e-8), -10, 10).astype(np.float32)

    def reward(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        self.ret = self.ret * self.gamma + reward
        self.ret_rms.update(self.ret)
        self.ret[done] = 0.0
        return np.clip(reward / np.sqrt(self.ret_rms.var + 1e-8), -10, 10)


def _finished(info: dict) -> list[float]:
    ep = info.get('episode')
    return [] if ep is None else list(ep['r'][info['_episode']])


def bare_on_policy(row: Row, seed: int, frames: int) -> dict:
    """PPO or A2C on the row's vector env: rollouts of n_steps x n_envs, GAE, then the update
    (PPO: n_epochs over minibatches of batch_size, clipped ratio, normalised advantages; A2C: one
    step on the whole rollout), one optimizer over actor and critic, the global gradient norm
    clipped to 0.5, a truncated episode's reward bootstrapped with V(final observation) as SB3 does.
    Discrete actions: a Categorical policy (softmax, multinomial); continuous (ppo_hopper): a
    diagonal Normal with a learned state-independent log std (SB3's), actions clipped to the
    env's bounds for the step."""
    import torch
    import torch.nn as nn
    torch.manual_seed(seed)
    kw = row.sb3_kwargs
    ppo = row.algo == 'PPO'
    n_steps = kw.get('n_steps', 2048 if ppo else 5)
    gamma, lam = kw.get('gamma', 0.99), kw.get('gae_lambda', 0.95 if ppo else 1.0)
    n_epochs, batch_size = kw.get('n_epochs', 10), kw.get('batch_size', 64)
    lr0 = float(str(kw.get('learning_rate', 3e-4 if ppo else 7e-4)).replace('lin_', ''))
    clip0 = float(str(kw.get('clip_range', 0.2)).replace('lin_', ''))
    lin = isinstance(kw.get('learning_rate'), str)
    env, obs = _vector_env(row, seed, gamma)
    n_envs = row.n_envs
    n_obs = env.single_observation_space.shape[0]
    norm = _Normalize(n_obs, n_envs, gamma) if row.normalize else None
    if norm is not None:
        obs = norm.obs(obs)
    space = env.single_action_space
    discrete = hasattr(space, 'n')
    n_act = int(space.n) if discrete else space.shape[0]
    low, high = (None, None) if discrete else (space.low, space.high)
    actor = _mlp(n_obs, [64, 64], n_act, nn.Tanh, 0.01)
    critic = _mlp(n_obs, [64, 64], 1, nn.Tanh, 1.0)
    log_std = nn.Parameter(torch.zeros(n_act))
    params = [*actor.parameters(), *critic.parameters()] + ([] if discrete else [log_std])
    opt = (torch.optim.Adam(params, lr=lr0, eps=1e-5, fused=True) if ppo
           else torch.optim.RMSprop(params, lr=lr0, alpha=0.99, eps=1e-5, foreach=True))
    B = n_steps * n_envs
    b_obs = np.zeros((n_steps, n_envs, n_obs), np.float32)
    b_act = np.zeros((n_steps, n_envs) + (() if discrete else (n_act,)), np.int64 if discrete else np.float32)
    b_logp = np.zeros((n_steps, n_envs), np.float32)
    b_val = np.zeros((n_steps, n_envs), np.float32)
    b_rew = np.zeros((n_steps, n_envs), np.float32)
    b_start = np.zeros((n_steps, n_envs), np.float32)  # 1 where the step's obs begins an episode
    episode_start = np.ones(n_envs, np.float32)
    returns_seen: list[float] = []
    frame, t0 = 0, time.perf_counter()
    while frame < frames:
        for t in range(n_steps):
            with torch.inference_mode():
                x = torch.from_numpy(np.asarray(obs, np.float32))
                out, value = actor(x), critic(x).squeeze(-1)
                if discrete:
                    action = torch.multinomial(torch.softmax(out, -1), 1).squeeze(-1)
                    logp = torch.log_softmax(out, -1).gather(-1, action.unsqueeze(-1)).squeeze(-1)
                else:
                    pd = torch.distributions.Normal(out, log_std.exp())
                    action = pd.sample()
                    logp = pd.log_prob(action).sum(-1)
            a = action.numpy()
            next_obs, reward, term, trunc, info = env.step(a if discrete else np.clip(a, low, high))
            if norm is not None:
                next_obs, reward = norm.obs(next_obs), norm.reward(reward, term | trunc)
            reward = reward.astype(np.float32)
            if trunc.any():  # bootstrap a cut episode from its final observation, as SB3 does
                cut = trunc & ~term
                if cut.any():
                    final = np.stack(info['final_obs'][cut]).astype(np.float32)
                    final = final if norm is None else norm.obs(final, update=False)
                    with torch.inference_mode():
                        reward[cut] += gamma * critic(torch.from_numpy(final)).squeeze(-1).numpy()
            b_obs[t], b_act[t], b_logp[t], b_val[t], b_rew[t], b_start[t] = obs, a, logp.numpy(), value.numpy(), \
                reward, episode_start
            episode_start = (term | trunc).astype(np.float32)
            returns_seen += _finished(info)
            obs = next_obs
            frame += n_envs
        with torch.inference_mode():
            last_val = critic(torch.from_numpy(np.asarray(obs, np.float32))).squeeze(-1).numpy()
        adv = np.zeros((n_steps, n_envs), np.float32)
        gae = np.zeros(n_envs, np.float32)
        for t in reversed(range(n_steps)):
            nonterminal = 1.0 - (episode_start if t == n_steps - 1 else b_start[t + 1])
            next_val = last_val if t == n_steps - 1 else b_val[t + 1]
            delta = b_rew[t] + gamma * next_val * nonterminal - b_val[t]
            gae = delta + gamma * lam * nonterminal * gae
            adv[t] = gae
        ret = adv + b_val
        progress = min(1.0, frame / row.full_frames)
        if lin:
            for g in opt.param_groups:
                g['lr'] = lr0 * (1 - progress)
        clip = clip0 * (1 - progress) if isinstance(kw.get('clip_range'), str) else clip0
        s_obs = torch.from_numpy(b_obs.reshape(B, n_obs))
        s_act = torch.from_numpy(b_act.reshape((B,) + b_act.shape[2:]))
        s_logp, s_adv = torch.from_numpy(b_logp.reshape(B)), torch.from_numpy(adv.reshape(B))
        s_ret = torch.from_numpy(ret.reshape(B))
        for _ in range(n_epochs if ppo else 1):
            perm = torch.randperm(B) if ppo else None
            for start in range(0, B, batch_size if ppo else B):
                idx = perm[start:start + batch_size] if ppo else slice(None)  # A2C: the whole rollout
                out, value = actor(s_obs[idx]), critic(s_obs[idx]).squeeze(-1)
                if discrete:
                    log_all = torch.log_softmax(out, -1)
                    logp = log_all.gather(-1, s_act[idx].unsqueeze(-1)).squeeze(-1)
                    entropy = -(log_all.exp() * log_all).sum(-1).mean()
                else:
                    pd = torch.distributions.Normal(out, log_std.exp())
                    logp = pd.log_prob(s_act[idx]).sum(-1)
                    entropy = pd.entropy().sum(-1).mean()
                a_mb = s_adv[idx]
                if ppo:
                    a_mb = (a_mb - a_mb.mean()) / (a_mb.std() + 1e-8)
                    ratio = torch.exp(logp - s_logp[idx])
                    pg = -torch.min(a_mb * ratio, a_mb * ratio.clamp(1 - clip, 1 + clip)).mean()
                else:
                    pg = -(a_mb * logp).mean()
                v_loss = torch.nn.functional.mse_loss(value, s_ret[idx])
                loss = pg + 0.5 * v_loss - kw.get('ent_coef', 0.0) * entropy
                opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(params, 0.5)
                opt.step()
    seconds = time.perf_counter() - t0
    return {'frames': frame, 'seconds': seconds, 'returns': returns_seen}


def bare_dqn(row: Row, seed: int, frames: int) -> dict:
    """DQN on one env: epsilon-greedy acting (linear from 1 to exploration_final_eps over
    exploration_fraction of rl-zoo3's frames), a numpy replay, gradient_steps updates of
    batch_size every train_freq frames from learning_starts on (Huber loss, the target net's max,
    the gradient norm clipped to 10, Adam), the target net copied every target_update_interval."""
    import torch
    import torch.nn as nn
    torch.manual_seed(seed)
    kw = row.sb3_kwargs
    rng = np.random.default_rng(seed)
    env, obs = _vector_env(row, seed)
    hidden = kw['policy_kwargs']['net_arch']
    q = _mlp(4, hidden, 2, nn.ReLU, 1.0)
    target = _mlp(4, hidden, 2, nn.ReLU, 1.0)
    target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=kw['learning_rate'], fused=True)
    size = kw['buffer_size']
    r_obs = np.zeros((size, 4), np.float32)
    r_next = np.zeros((size, 4), np.float32)
    r_act = np.zeros(size, np.int64)
    r_rew = np.zeros(size, np.float32)
    r_done = np.zeros(size, np.float32)
    explore_frames = kw['exploration_fraction'] * row.full_frames
    eps_end, gamma = kw['exploration_final_eps'], kw['gamma']
    returns_seen: list[float] = []
    n, frame, t0 = 0, 0, time.perf_counter()
    while frame < frames:
        eps = max(eps_end, 1.0 - (1.0 - eps_end) * frame / explore_frames)
        if rng.random() < eps:
            a = rng.integers(0, 2, size=1)
        else:
            with torch.inference_mode():
                a = q(torch.from_numpy(obs)).argmax(-1).numpy()
        next_obs, reward, term, trunc, info = env.step(a)
        true_next = next_obs
        if term[0] or trunc[0]:
            true_next = np.stack(info['final_obs'])
        i = n % size
        r_obs[i], r_next[i], r_act[i], r_rew[i], r_done[i] = obs[0], true_next[0], a[0], reward[0], float(term[0])
        n += 1
        returns_seen += _finished(info)
        obs = next_obs
        frame += 1
        if frame >= kw['learning_starts'] and frame % kw['train_freq'] == 0:
            for _ in range(kw['gradient_steps']):
                idx = rng.integers(0, min(n, size), size=kw['batch_size'])
                o, nx = torch.from_numpy(r_obs[idx]), torch.from_numpy(r_next[idx])
                act, rew, done = (torch.from_numpy(a[idx]) for a in (r_act, r_rew, r_done))
                with torch.no_grad():
                    y = rew + gamma * (1 - done) * target(nx).max(-1).values
                pred = q(o).gather(-1, act.unsqueeze(-1)).squeeze(-1)
                loss = torch.nn.functional.smooth_l1_loss(pred, y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(q.parameters(), 10.0)
                opt.step()
        if frame % kw['target_update_interval'] == 0:
            target.load_state_dict(q.state_dict())
    seconds = time.perf_counter() - t0
    return {'frames': frame, 'seconds': seconds, 'returns': returns_seen}


def bare_child(row_key: str, seed: int, frames: int, cpu: int | None) -> dict:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    import torch
    torch.set_num_threads(1)
    row = ROWS[row_key]
    out = (bare_dqn if row.algo == 'DQN' else bare_on_policy)(row, seed, frames)
    last = out['returns'][-100:]
    return {'frames': out['frames'], 'fps': out['frames'] / out['seconds'],
            'last100_return': float(np.mean(last)) if last else math.nan}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog='bench/bare_torch.py', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rows', default=','.join(BARE_ROWS),
                        type=lambda s: [k.strip() for k in s.split(',') if k.strip()])
    parser.add_argument('--seeds', default='0,1,2', type=lambda s: [int(k) for k in s.split(',') if k.strip()])
    parser.add_argument('--cpu', type=int, metavar='N', help='pin each run to core N')
    parser.add_argument('--frames', type=int, metavar='N', help="each run's length (default: the side-by-side's)")
    parser.add_argument('--bare-only', action='store_true', help='only the bare loop (no lab, no SB3)')
    parser.add_argument('--with-sb3', action='store_true', help="also SB3's column (needs requirements-bench.txt)")
    parser.add_argument('--json', metavar='OUT', help='also write every figure to OUT as JSON')
    parser.add_argument('--child', action='store_true', help=argparse.SUPPRESS)
    parser.add_argument('--seed', type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    bad = [k for k in args.rows if k not in BARE_ROWS]
    if bad or not args.rows:
        parser.error(f'--rows: unknown {", ".join(bad) or "(none given)"}; choose from {", ".join(BARE_ROWS)}')
    if args.child:
        print('RESULT ' + json.dumps(bare_child(args.rows[0], args.seed, args.frames, args.cpu)), flush=True)
        return 0
    tools = ['bare'] + ([] if args.bare_only else ['lab']) + (['sb3'] if args.with_sb3 else [])
    if 'lab' in tools or 'sb3' in tools:
        import sb3_side_by_side as side  # its children: the lab's default column and SB3
    print(f'# {time.strftime("%Y-%m-%d %H:%M %Z")} | one torch thread per run'
          f'{f" | pinned to core {args.cpu}" if args.cpu is not None else ""} | tools {", ".join(tools)}', flush=True)
    results = []
    for key in args.rows:
        row = ROWS[key]
        frames = args.frames or run_frames(row, False, 1.0)
        for i, seed in enumerate(args.seeds):
            for tool in tools[i % len(tools):] + tools[:i % len(tools)]:
                if tool == 'bare':
                    cmd = python_child(__file__, '--child', '--rows', key, '--seed', str(seed), '--frames', str(frames))
                    r = child_result(cmd + (['--cpu', str(args.cpu)] if args.cpu is not None else []),
                                     f'the bare run of {key} seed {seed}')
                    fps, ret = r['fps'], r['last100_return']
                else:
                    ns = argparse.Namespace(eval_episodes=0, cpu=args.cpu)
                    m = side.run_child(tool, row, seed, frames, ns)
                    fps, ret = m.fps, m.last100_return
                results.append({'row': key, 'seed': seed, 'tool': tool, 'frames': frames, 'fps': fps,
                                'last100_return': ret})
                print(f'done {tool} {key} seed {seed}: {frames:,} frames, fps {fps:,.0f}, last-100 return {ret:.1f}',
                      flush=True)
    print()
    both = 'lab' in tools and 'sb3' in tools
    head = f'{"row":10s} {"seeds":>5s} ' + ' '.join(f'{t + " fps":>10s}' for t in tools) + \
        ''.join(f' {t + "/bare":>10s}' for t in tools if t != 'bare') + (f' {"lab/sb3":>10s}' if both else '')
    print('medians over the seeds (of frames/s, and of the per-seed ratios)')
    print(head)
    summary = []
    for key in args.rows:
        by_seed = {}
        for r in results:
            if r['row'] == key:
                by_seed.setdefault(r['seed'], {})[r['tool']] = r['fps']
        med = {t: statistics.median(s[t] for s in by_seed.values()) for t in tools}
        ratios = {t: statistics.median(s[t] / s['bare'] for s in by_seed.values()) for t in tools if t != 'bare'}
        entry = {'row': key, 'seeds': len(by_seed), 'median_fps': med, 'median_ratio_to_bare': ratios}
        if both:
            entry['median_lab_vs_sb3'] = statistics.median(s['lab'] / s['sb3'] for s in by_seed.values())
        summary.append(entry)
        print(f'{key:10s} {len(by_seed):5d} ' + ' '.join(f'{med[t]:10,.0f}' for t in tools)
              + ''.join(f' {ratios[t]:9.2f}x' for t in tools if t != 'bare')
              + (f' {entry["median_lab_vs_sb3"]:9.2f}x' if both else ''))
    if args.json:
        sys.path.insert(0, str(REPO_ROOT))
        from slm_lab.lib.io import atomic_write_text
        atomic_write_text(args.json, json.dumps({'date': time.strftime('%Y-%m-%dT%H:%M:%S%z'), 'cpu': args.cpu,
                                                 'runs': results, 'summary': summary}, indent=1))
    return 0


if __name__ == '__main__':
    sys.exit(main())
