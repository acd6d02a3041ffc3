"""Vector-env wrappers gymnasium does not provide in the form the lab needs."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.wrappers.utils import RunningMeanStd as GymRunningMeanStd


class RunningMeanStd(GymRunningMeanStd):
    """gymnasium's running mean/std, with a batch of one sample (a single env's step) taken as its
    moments directly: the sample itself and a variance of zeros, the values np.mean and np.var
    return for one row, without their reductions (a tenth of a MuJoCo step's time in the two
    normalisation wrappers). The same statistics, the same attributes (mean, var, count), so
    snapshots hold and restore it as gymnasium's.

    For that one sample, gymnasium's update_mean_var_count_from_moments with batch_count 1 and
    batch_var 0 is computed without its operations that leave a number as it is (a product by 1,
    a sum with 0): the same numbers, bit for bit, in 9 numpy operations instead of 14."""

    def update(self, x):
        if x.shape[0] == 1:
            # gymnasium: delta = b - m; t = c + 1; m' = m + delta * 1 / t;
            # v' = (v * c + 0 * 1 + delta**2 * c * 1 / t) / t
            delta = x[0] - self.mean
            tot_count = self.count + 1
            self.mean = self.mean + delta / tot_count
            self.var = (self.var * self.count + np.square(delta) * self.count / tot_count) / tot_count
            self.count = tot_count
        else:
            super().update(x)


class NormalizeReward(gym.wrappers.vector.NormalizeReward):
    """gymnasium's vector NormalizeReward (rewards divided by the running std of the discounted
    return), whose step in the same-step autoreset mode the lab's vector envs use computes the same
    numbers operation for operation without masking every sub-env as active; its statistics in the
    RunningMeanStd above. Its name and attributes are gymnasium's, so a snapshot of either restores
    into it. Other autoreset modes take gymnasium's step."""

    def __init__(self, env: gym.vector.VectorEnv, gamma: float = 0.99, epsilon: float = 1e-8):
        super().__init__(env, gamma=gamma, epsilon=epsilon)
        self.return_rms = RunningMeanStd(shape=())
        self._same_step = self._autoreset_mode == gym.vector.AutoresetMode.SAME_STEP

    def step(self, actions):
        if not self._same_step:
            return super().step(actions)
        obs, reward, terminated, truncated, info = self.env.step(actions)
        returns = self.accumulated_reward
        returns[:] = returns * self.gamma * (1 - terminated) + reward
        if self._update_running_mean:
            self.return_rms.update(returns.copy())
        dones = np.logical_or(terminated, truncated)
        self._prev_dones = dones.astype(np.float32)
        returns[dones] = 0  # the done sub-envs were reset in this step: their next return starts now
        return obs, reward / np.sqrt(self.return_rms.var + self.epsilon), terminated, truncated, info


class NormalizeObservation(gym.vector.VectorWrapper):
    """Running mean/std observation normalisation for a vector env that resets finished sub-envs
    in the same step. gymnasium's vector NormalizeObservation refuses that autoreset mode because
    it would leave info['final_obs'] unnormalised (and so does VectorObservationWrapper, hence a
    plain VectorWrapper here); this one normalises final_obs too, with the same statistics as
    the observations the step returns, so every sub-env's next observation in a step is on one
    scale. Statistics update on the observations returned by step and reset, before they are
    normalised (not on final_obs, which the next step's statistics would count twice otherwise).

    clip: when given, normalised observations are clipped to [-clip, clip] (env.clip_obs), here
    rather than in a wrapper of their own so that evaluation, which normalises with `normalize`,
    clips the same way.

    State (for snapshots): obs_rms (mean, var, count), epsilon, update_running_mean.
    """

    def __init__(self, env: gym.vector.VectorEnv, epsilon: float = 1e-8, clip: float | None = None):
        super().__init__(env)
        self.obs_rms = RunningMeanStd(shape=self.single_observation_space.shape,
                                      dtype=self.single_observation_space.dtype)
        self.epsilon = epsilon
        self.clip = clip
        self.update_running_mean = True

    def normalize(self, observations: np.ndarray) -> np.ndarray:
        """Normalise (and clip, with `clip`) with the current statistics, without updating them."""
        normalized = (observations - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + self.epsilon)
        if self.clip is not None:  # np.clip's numbers (NaN stays NaN) without its dispatch
            normalized = np.minimum(np.maximum(normalized, -self.clip, out=normalized), self.clip, out=normalized)
        return normalized.astype(np.float32)

    def observations(self, observations: np.ndarray) -> np.ndarray:
        if self.update_running_mean:
            self.obs_rms.update(observations)
        return self.normalize(observations)

    def reset(self, *, seed=None, options=None):
        obs, infos = self.env.reset(seed=seed, options=options)
        return self.observations(obs), infos

    def step(self, actions):
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        obs = self.observations(obs)  # first: final_obs takes the statistics updated by this step
        if '_final_obs' in infos and infos['_final_obs'].any():
            mask = infos['_final_obs']
            final = infos['final_obs'].copy()
            normalized = self.normalize(np.stack(final[mask]))
            for i, j in enumerate(np.flatnonzero(mask)):
                final[j] = normalized[i]
            infos = {**infos, 'final_obs': final}
        return obs, rewards, terminations, truncations, infos


def clip_observation(env: gym.Env, bound: float) -> gym.Env:
    """One env whose observations are clipped to [-bound, bound] (env.clip_obs without
    normalize_obs). Applied to each sub-env of a vector env, so final_obs is clipped too."""
    return gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -bound, bound).astype(obs.dtype),
                                             env.observation_space)


class _WholeBatchActions:
    """A vectorised gymnasium action wrapper (ClipAction, RescaleAction) that applies its single-env
    transform to the whole batch of actions in one numpy expression, where gymnasium's applies it
    to each sub-env's action in turn and concatenates the results (about 12 us a step of one
    MuJoCo env, a tenth of the step). The transforms are elementwise (np.clip to the bounds;
    (a - intercept) / gradient), so broadcasting them over the batch computes the same numbers;
    the result is a new array of the wrapped env's action dtype, as gymnasium's (the given array,
    overwritten, where the space is unchanged). The class names
    stay gymnasium's: a snapshot records the wrapper layers by name."""

    def actions(self, actions):
        out = self.wrapper.func(actions)
        if self.same_out:  # the space unchanged: gymnasium writes the results into the given array
            np.copyto(actions, out, casting='same_kind')
            return actions
        return np.array(out, dtype=self.env.single_action_space.dtype)  # a new array, as gymnasium's


class ClipAction(_WholeBatchActions, gym.wrappers.vector.ClipAction):
    """gymnasium's vector ClipAction, a whole batch at once (see _WholeBatchActions)."""


class RescaleAction(_WholeBatchActions, gym.wrappers.vector.RescaleAction):
    """gymnasium's vector RescaleAction, a whole batch at once (see _WholeBatchActions)."""


class FireReset(gym.Wrapper):
    """Presses FIRE once after each reset of a game whose action set has it (Breakout, Pong, ...),
    which some games need to start, as SLM-Lab v4's FireResetEnv and v5's Atari vector env do; the
    step's reward (none in those games) is dropped. No state of its own."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()
        self.fire = meanings.index('FIRE') if 'FIRE' in meanings else None

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        if self.fire is not None:
            obs, _, terminated, truncated, info = self.env.step(self.fire)
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


class LifeLossTermination(gym.Wrapper):
    """A lost life ends the agent's episode (terminated, so no value is bootstrapped past it)
    while the game goes on: SLM-Lab v5's env.life_loss_info, and how SLM-Lab v4 trained Atari
    (its EpisodicLifeEnv). The reset that follows (the vector env's autoreset) returns the last
    observation as it is, so the game, its frame stack included, continues from the agent's next
    action (as ALE's vector env does); only a game over resets it. The whole game's return (the
    env's own rewards) is in info['game_return'] at the step that ends the game, for the records,
    which count whole games.

    State (plain attributes, so a snapshot continues exactly): lives, game_over, game_return, last_obs."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.game_over = True
        self.game_return = 0.0
        self.last_obs = None

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_return += float(reward)
        self.game_over = bool(terminated or truncated)
        lives = self.env.unwrapped.ale.lives()
        if self.game_over:
            info = {**info, 'game_return': self.game_return}
        elif 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        self.last_obs = obs
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.game_over or self.last_obs is None:
            obs, info = self.env.reset(**kwargs)
            self.game_over, self.game_return = False, 0.0
            self.lives = self.env.unwrapped.ale.lives()
            self.last_obs = obs
            return obs, info
        return self.last_obs.copy(), {'lives': self.lives}


def finished_returns(info: dict, whole_games: bool = False) -> np.ndarray:
    """The returns of the episodes that ended in a vector step, from its info: the vector
    RecordEpisodeStatistics' ('episode'), or with env.life_loss_info, where an episode is a life,
    those of the games that ended (LifeLossTermination's 'game_return', in the final step's info:
    'final_info' where the step also reset them, the step's own info with env.autoreset "next_step")."""
    if not whole_games:
        return info['episode']['r'][info['_episode']]
    final = info.get('final_info') or info
    if '_game_return' not in final:
        return np.zeros(0)
    return np.asarray(final['game_return'])[final['_game_return']]
