"""Gymnasium ids in SLM-Lab spec files that gymnasium has since renamed: each runs as its current
id, with a one-line warning saying what changed."""
from __future__ import annotations

from typing import Any

from slm_lab.lib import logger as lab_logger

logger = lab_logger.get_logger('slm_lab.env')  # the warning is about env.name, under the name it always had

# Gymnasium ids in SLM-Lab spec files that gymnasium no longer provides: old id -> (the id that
# replaced it, what changed, from the env's own version history). Validation puts the current id
# in the spec (so the saved spec says what ran, and a resume or replay of it needs no renaming)
# and warns with the note each time a spec file naming the old id is read. Ids gymnasium still
# provides (CartPole-v0, MountainCar-v0, Acrobot-v1, and the Atari v0/v4 ids ale-py still
# registers, e.g. PongNoFrameskip-v4) are the envs they always were and run as they are.
_MUJOCO_V5 = ('the same task on the mujoco bindings (v2/v3 need mujoco-py, which does not install on current '
              'Python); v5 fixes model and reward details, so returns are close to, not equal to, v2/v3 ones')
RENAMED_ENV_IDS: dict[str, tuple[str, str]] = {
    'Pendulum-v0': ('Pendulum-v1', 'the same dynamics and reward: v1 only rewrote the equations'),
    'LunarLander-v2': ('LunarLander-v3', 'v3 resets wind at each reset, is deterministic given a seed and widens '
                                         'the observation bounds; dynamics and reward are otherwise the same'),
    'LunarLanderContinuous-v2': ('LunarLanderContinuous-v3', 'the changes of LunarLander-v3'),
    'BipedalWalker-v2': ('BipedalWalker-v3', 'v3 returns the closest lidar hit instead of the furthest'),
    'BipedalWalkerHardcore-v2': ('BipedalWalkerHardcore-v3', 'the change of BipedalWalker-v3'),
    'CarRacing-v0': ('CarRacing-v3', 'later versions changed lap completion, added domain randomisation and end '
                                     'a finished lap as terminated rather than truncated'),
    **{f'{task}-{old}': (f'{task}-v5', _MUJOCO_V5)
       for task in ('Ant', 'HalfCheetah', 'Hopper', 'Humanoid', 'HumanoidStandup', 'InvertedDoublePendulum',
                    'InvertedPendulum', 'Pusher', 'Reacher', 'Swimmer', 'Walker2d')
       for old in ('v2', 'v3')},
}

def current_env_id(name: str) -> tuple[str, str | None]:
    """(the id to run, a one-line note on what changed) for an env id; the note is None unless
    gymnasium renamed the id (RENAMED_ENV_IDS)."""
    if name in RENAMED_ENV_IDS:
        new, what = RENAMED_ENV_IDS[name]
        return new, f"env.name: '{name}' no longer exists in gymnasium; running '{new}' instead ({what})"
    return name, None


def rename_env_id(env_spec: Any) -> Any:
    """The env spec with a renamed gymnasium id replaced by its current one (a copy), logging the
    one-line warning; anything else is returned as it is, for the validator to judge."""
    if isinstance(env_spec, dict) and isinstance(env_spec.get('name'), str):
        name, note = current_env_id(env_spec['name'])
        if note:
            logger.warning(note)
            return {**env_spec, 'name': name}
    return env_spec
