"""Atari games in training: the preprocessing a spec asks for (AtariSettings), and the two vector
envs that apply it: gymnasium's (one AtariEnv per game under gymnasium's wrappers, built by
make_env) and ALE's own (AtariVectorEnv: every game stepped by C++ threads, built here).

env.vector_backend chooses between them. Both give the same frames and rewards for the same
emulator frames (measured pixel for pixel, docs/environments.md); they differ in how a reset
starts a game (the no-op count's range, FIRE for one frame or one agent step) and in resume:
ALE's vector env cannot clone or restore its games, so a snapshot of it holds no game state and a
resumed run starts fresh episodes (approximate), where gymnasium's path resumes exactly."""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from slm_lab.env.ids import ENV_FAMILIES, atari_frames, env_family, is_ale_v5

# why a run on ALE's vector env resumes approximately, and the key that resumes exactly
ALE_VECTOR_NOTE = (" (env.vector_backend 'ale': ALE's vector env cannot save its games; env.vector_backend "
                   "'gymnasium' runs them so that a run resumes exactly)")


def approximate_resume_note(env_spec: dict) -> str:
    """ALE_VECTOR_NOTE for an env spec run on ALE's vector env (whose resume is approximate), else ''."""
    return ALE_VECTOR_NOTE if env_spec.get('vector_backend') == 'ale' else ''


NOOP_MAX = 30  # up to 30 no-op frames at each game's start, as the DQN papers and SLM-Lab
# constructor arguments of an ALE game that ALE's vector env takes too (the rest it has no way to set)
_ALE_VECTOR_KWARGS = ('game', 'frameskip', 'repeat_action_probability', 'full_action_space',
                      'max_num_frames_per_episode', 'obs_type')


@dataclass(frozen=True)
class AtariSettings:
    """The preprocessing of one Atari game in the lab: `stack` frames of `size` (width, height)
    greyscale, `frame_skip` emulator frames per agent step (max-pooled over the last two), each
    frame's action repeated with probability `sticky`; life_loss: a lost life ends the agent's
    episode while the game goes on; max_t: env.max_t in agent steps (None: the game's own limit)."""

    stack: int
    size: tuple[int, int]
    frame_skip: int
    sticky: float
    life_loss: bool
    max_t: int | None


def atari_settings(env_spec: dict, whole_games: bool = False) -> AtariSettings:
    """The AtariSettings of an Atari env spec with image observations. whole_games: no
    life-loss episodes (an evaluation or a replay plays whole games)."""
    # as SLM-Lab: frame_op_len frames when frame_op is given (v4's Atari specs), else v5's 4
    # for ALE/ ids and one frame for the older ids
    stack = env_spec['frame_op_len'] if env_spec.get('frame_op') else (4 if is_ale_v5(env_spec['name']) else 1)
    size = tuple(env_spec.get('image_downsize') or (84, 84))
    frames = atari_frames(env_spec)  # None: ALE skips frames and sticks actions itself
    frame_skip, sticky = frames or (1, 0.0)
    # a lost life ends the episode in training: life_loss_info (v5), always for the older ids (v4
    # trained them under its EpisodicLifeEnv)
    life_loss = not whole_games and (bool(env_spec.get('life_loss_info')) or (
        not is_ale_v5(env_spec['name']) and env_spec.get('life_loss_info') is not False and frames is not None))
    max_t = env_spec.get('max_t') if frames is not None else None
    return AtariSettings(stack, size, frame_skip, sticky, life_loss, max_t)


def _game_kwargs(env_spec: dict) -> dict:
    """The game's constructor arguments: its registration's, then the spec's env keys that are
    arguments of ale-py's AtariEnv, then make_kwargs (as make_env passes them to gymnasium.make)."""
    from ale_py.env import AtariEnv  # noqa: PLC0415 the Atari extra, installed where an Atari id is registered
    params = inspect.signature(AtariEnv.__init__).parameters
    registered = gym.envs.registry.get(env_spec['name'])
    given = {k: v for k, v in env_spec.items() if k in params and k != 'self'}
    return {**(registered.kwargs if registered is not None else {}), **given, **(env_spec.get('make_kwargs') or {})}


def ale_vector_unfit(env_spec: dict) -> str | None:
    """Why ALE's vector env cannot run this env spec (a phrase), or None when it can: an Atari
    game with image observations and a fixed frame skip, with constructor arguments it takes."""
    name = env_spec.get('name')
    if not isinstance(name, str) or env_family(name) is not ENV_FAMILIES['atari']:
        return f'{name!r} is not an Atari game'
    if name not in gym.envs.registry:
        return f"'{name}' is not registered"
    if atari_frames(env_spec) is None:
        return (f"'{name}' has RAM observations or a frame skip that ALE draws at random (ALE's vector env skips a "
                'fixed number of frames and gives image observations)')
    kwargs = _game_kwargs(env_spec)
    other = sorted(k for k in kwargs if k not in _ALE_VECTOR_KWARGS)
    if other:
        return f"ALE's vector env takes no constructor argument {', '.join(other)}"
    if kwargs.get('obs_type', 'rgb') != 'rgb':
        return f"ALE's vector env takes obs_type 'rgb' only (the lab makes the frames grey), not {kwargs['obs_type']!r}"
    if env_spec.get('clip_obs') is not None and not env_spec.get('normalize_obs'):
        return "ALE's vector env has no per-game observation clipping (env.clip_obs without normalize_obs)"
    return None


def default_backend(env_spec: dict) -> str:
    """env.vector_backend when the spec does not say: 'ale' for an Atari game ALE's vector env can
    run in more than one env (its threads step them in parallel), else 'gymnasium'."""
    if env_spec.get('num_envs', 1) > 1 and ale_vector_unfit(env_spec) is None:
        return 'ale'
    return 'gymnasium'


def make_ale_vector_env(env_spec: dict, num_envs: int) -> gym.vector.VectorEnv:
    """ALE's AtariVectorEnv with the lab's Atari preprocessing (atari_settings): resets finished
    games in the same step (final observation in info['final_obs']), rewards unclipped (the lab
    clips them after recording returns), FIRE pressed at each game's start where the game has it,
    up to NOOP_MAX no-op frames first. Wrapped in AleGames, which gives the infos make_env's
    other wrappers and the session read."""
    import ale_py  # noqa: PLC0415 the Atari extra: ensure_env_registered has checked it is installed
    from ale_py.vector_env import AtariVectorEnv  # noqa: PLC0415 (the Atari extra, as above)
    settings = atari_settings(env_spec)
    kwargs = _game_kwargs(env_spec)
    max_frames = (settings.max_t * settings.frame_skip if settings.max_t
                  else kwargs.get('max_num_frames_per_episode', 108000))
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    env = AtariVectorEnv(
        kwargs['game'], num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        img_width=settings.size[0], img_height=settings.size[1], grayscale=True, stack_num=settings.stack,
        frameskip=settings.frame_skip, maxpool=True, noop_max=NOOP_MAX, use_fire_reset=True,
        repeat_action_probability=settings.sticky, full_action_space=bool(kwargs.get('full_action_space', False)),
        max_num_frames_per_episode=max_frames, episodic_life=False, life_loss_info=settings.life_loss,
        reward_clipping=False)
    return AleGames(env, settings.frame_skip)


def game_seeds(seed: int, num_envs: int) -> np.ndarray:
    """One seed per game for ALE's vector env, drawn from `seed` (any int >= 0: the lab's seeds go
    up to 10**18) by numpy's SeedSequence: ALE takes seeds of 1 to 2**31 - 1 (a C int; one of 0
    leaves the game unseeded)."""
    state = np.random.SeedSequence(seed).generate_state(num_envs, dtype=np.uint32).astype(np.int64)
    return state % (2**31 - 2) + 1


class AleGames(gym.vector.VectorWrapper):
    """The infos of gymnasium's vector envs for ALE's vector env, which gives final_obs without
    its mask and no per-game records: '_final_obs' (the sub-envs whose episode ended), and in
    'final_info' (with its masks) each ended episode's lives and, at a game's end, the game's
    return (the env's own rewards, summed over its lives: LifeLossTermination's 'game_return').

    With life-loss episodes a terminated sub-env either lost a life (its game goes on: its lives
    fell and its frame count went on by one step's frames; ALE leaves its final_obs unwritten, and
    the observation it returns is the episode's last, as LifeLossTermination's) or ended its game
    (ALE reset it: its lives and frame count start again).

    State (plain arrays): lives, episode_frames, game_return; a reset clears them (a resumed
    session starts fresh games, ALE's games having no state to restore)."""

    def __init__(self, env: gym.vector.VectorEnv, frame_skip: int):
        super().__init__(env)
        self.frame_skip = frame_skip
        self.lives = np.zeros(self.num_envs, dtype=np.int64)
        self.episode_frames = np.zeros(self.num_envs, dtype=np.int64)
        self.game_return = np.zeros(self.num_envs, dtype=np.float64)

    def reset(self, *, seed=None, options=None):
        if isinstance(seed, int) and options is None:
            seed = game_seeds(seed, self.num_envs)
        obs, info = self.env.reset(seed=seed, options=options)
        self.lives[:] = info['lives']
        self.episode_frames[:] = info['episode_frame_number']
        self.game_return[:] = 0.0
        return obs, info

    def step(self, actions):
        obs, rewards, terminated, truncated, info = self.env.step(np.asarray(actions, dtype=np.int64))
        lives, frames = np.asarray(info['lives']), np.asarray(info['episode_frame_number'])
        self.game_return += rewards
        ended = terminated | truncated
        if ended.any():
            life_lost = (terminated & ~truncated & (lives < self.lives)
                         & (frames == self.episode_frames + self.frame_skip))
            game_over = ended & ~life_lost
            final_obs = info['final_obs']
            if life_lost.any():  # ALE fills final_obs only for the games it reset: a lost life's is obs
                final_obs = final_obs.copy()
                final_obs[life_lost] = obs[life_lost]
            info = {**info, 'final_obs': final_obs, '_final_obs': ended,
                    # a finished game's lives: none left when it was lost, as they were when cut short
                    'final_info': {'lives': np.where(life_lost, lives, np.where(truncated, self.lives, 0)),
                                   '_lives': ended,
                                   'game_return': np.where(game_over, self.game_return, 0.0),
                                   '_game_return': game_over}}
            self.game_return[game_over] = 0.0
        else:
            info = {**info, '_final_obs': ended}
        self.lives[:], self.episode_frames[:] = lives, frames
        return obs, rewards.astype(np.float64), terminated, truncated, info
