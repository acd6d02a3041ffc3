"""What an env id stands for: the optional env family whose package provides it (Box2D, MuJoCo,
Atari), a package SLM-Lab once used that cannot run here, an older version of a registered env,
and the frame skip and sticky actions of an Atari game."""
from __future__ import annotations

import functools
import importlib
import re
import sys
import warnings
from dataclasses import dataclass

import gymnasium as gym

from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import SpecError

logger = lab_logger.get_logger('slm_lab.env')


@dataclass(frozen=True)
class EnvFamily:
    """An optional family of gymnasium envs: the module its envs import and the pinned packages
    that install it (the pins of the family's extra in pyproject.toml and requirements-envs.txt;
    a test keeps the three equal)."""

    title: str
    module: str
    requirements: tuple[str, ...]
    also_needs: tuple[str, ...] = ()  # further modules its envs import (Atari's preprocessing: cv2)

    @property
    def install_command(self) -> str:
        """The pip command that installs this family alone."""
        return 'pip install ' + ' '.join(f'"{r}"' if '[' in r else r for r in self.requirements)


ENV_FAMILIES = {
    'box2d': EnvFamily('Box2D', 'Box2D', ('gymnasium[box2d]==1.4.0', 'box2d==2.3.10')),
    'mujoco': EnvFamily('MuJoCo', 'mujoco', ('gymnasium[mujoco]==1.4.0', 'mujoco==3.14.0')),
    'atari': EnvFamily('Atari', 'ale_py', ('gymnasium[atari]==1.4.0', 'ale-py==0.12.1',
                                           'opencv-python-headless==5.0.0.93'), also_needs=('cv2',)),
}
ALL_FAMILIES_COMMAND = 'pip install -r requirements-envs.txt'

# The games ale-py registers under gym's old Atari ids (Pong-v0, PongNoFrameskip-v4,
# PongDeterministic-v4), which SLM-Lab v4 specs use: without ale-py they are not in the registry,
# so they are recognised by name, to name the package that provides them.
_ATARI_V4_GAMES = frozenset(
    'Adventure AirRaid Alien Amidar Assault Asterix Asteroids Atlantis BankHeist BattleZone BeamRider Berzerk '
    'Bowling Boxing Breakout Carnival Centipede ChopperCommand CrazyClimber Defender DemonAttack DoubleDunk '
    'ElevatorAction Enduro FishingDerby Freeway Frostbite Gopher Gravitar Hero IceHockey Jamesbond JourneyEscape '
    'Kangaroo Krull KungFuMaster MontezumaRevenge MsPacman NameThisGame Phoenix Pitfall Pong Pooyan PrivateEye '
    'Qbert Riverraid RoadRunner Robotank Seaquest Skiing Solaris SpaceInvaders StarGunner Tennis TimePilot '
    'Tutankham UpNDown Venture VideoPinball WizardOfWor YarsRevenge Zaxxon'.split())
_ATARI_V4_RE = re.compile(r'(?P<game>[A-Za-z]+?)(NoFrameskip|Deterministic)?-v[04]')

# Env packages SLM-Lab once used that cannot run here, by the form of their ids: (pattern, what
# the package is and why it cannot run). A `task` group names the MuJoCo task to suggest instead.
_UNAVAILABLE_ENVS = (
    (re.compile(r'Roboschool(?P<task>[A-Za-z0-9]+?)(Flagrun(Harder)?|ForwardWalk|Swingup)?-v\d+'),
     'a Roboschool env (package roboschool), which its authors discontinued and which has no build for the '
     'Python this lab needs (3.11+), so it cannot run here'),
    (re.compile(r'(?P<task>[A-Za-z0-9]+?)BulletEnv-v\d+'),
     'a PyBullet env (package pybullet, module pybullet_envs), which registers with the old gym package, not '
     'with gymnasium, so it cannot run here'),
    # SLM-Lab v4's Unity ids, and the names its older experimental specs gave Unity envs
    (re.compile(r'Unity[A-Za-z0-9]*-v\d+|2dball|3dball|gridworld|tennis', re.IGNORECASE),
     'a Unity ML-Agents env (packages mlagents and gym-unity, with the Unity builds SLM-Lab shipped), which '
     'this lab does not have'),
    # SLM-Lab v5's ids of MuJoCo Playground envs (its env.device key is theirs)
    (re.compile(r'playground/.+'),
     "a MuJoCo Playground env (package mujoco_playground, on JAX, which SLM-Lab v5 wraps as a vector env of its "
     'own), which this lab does not have'),
    (re.compile(r'vizdoom-v\d+', re.IGNORECASE),
     "SLM-Lab v4's own VizDoom env (package vizdoom, with SLM-Lab's scenario files), which this lab does not "
     'have (its observations are images, which need ConvNet, not available yet)'),
)

def env_family(name: str) -> EnvFamily | None:
    """The optional family of an env id (by its registered entry point; Atari ids, which only
    ale-py registers, also by their form), or None for the envs gymnasium always has."""
    registered = gym.envs.registry.get(name)
    entry_point = registered.entry_point if registered is not None else None
    if isinstance(entry_point, str):
        for key, package in (('box2d', 'gymnasium.envs.box2d'), ('mujoco', 'gymnasium.envs.mujoco'),
                             ('atari', 'ale_py')):
            if entry_point.startswith(package):
                return ENV_FAMILIES[key]
        return None
    match = _ATARI_V4_RE.fullmatch(name)
    if name.startswith('ALE/') or (match is not None and match['game'] in _ATARI_V4_GAMES):
        return ENV_FAMILIES['atari']
    return None


def _unavailable_reason(name: str) -> str | None:
    """Why the id of a package that cannot run here cannot run (with the nearest MuJoCo env when
    there is one), or None for any other id."""
    for pattern, reason in _UNAVAILABLE_ENVS:
        match = pattern.fullmatch(name)
        if match:
            task = match.groupdict().get('task')
            nearest = f'{task}-v5' if task and f'{task}-v5' in gym.envs.registry else None
            instead = (f'; the nearest gymnasium env is {nearest} (MuJoCo: {ENV_FAMILIES["mujoco"].install_command})'
                       if nearest else '')
            return f"'{name}' is {reason}{instead}"
    return None


# gymnasium warns of an older env version with a multi-line coloured DeprecationWarning at every
# make (three per run); the lab says it once, in one line, where the spec is checked
warnings.filterwarnings('ignore', message=r'.*The environment .* is out of date', category=DeprecationWarning)


@functools.lru_cache(maxsize=None)
def warn_if_outdated(name: str) -> None:
    """One warning per process when `name` is an older version of a registered env (it still
    runs as it is: SLM-Lab's specs name e.g. CartPole-v0, whose episodes end at 200 steps)."""
    spec = gym.envs.registry.get(name)
    if spec is None or spec.version is None:
        return
    newest = max((s.version for s in gym.envs.registry.values() if s.namespace == spec.namespace
                  and s.name == spec.name and s.version is not None), default=spec.version)
    if newest > spec.version:
        newer = gym.envs.registration.get_env_id(spec.namespace, spec.name, newest)
        logger.warning(f'env.name: {name} runs as it is; a newer version of it is {newer}')


def ensure_env_registered(name: str, path: str = 'env.name') -> None:
    """Make an env id's optional family available (importing ale_py registers the Atari ids), or
    raise a one-line SpecError: for an id of a package that cannot run here, naming the package;
    for an id of a family whose package is missing, naming the command that installs it. Whether
    the id itself exists is left to the caller's registry check (which suggests close ids)."""
    if not isinstance(name, str):
        return
    reason = _unavailable_reason(name)
    if reason:
        raise SpecError(f'{path}: {reason}')
    family = env_family(name)
    if family is None:
        return
    try:
        for module in (family.module, *family.also_needs):
            importlib.import_module(module)
        if family.module == 'ale_py':  # ALE's banner on stderr at each game load would read as the lab's output
            sys.modules['ale_py'].ALEInterface.setLoggerMode(sys.modules['ale_py'].LoggerMode.Error)
    except ImportError as e:
        raise SpecError(f"{path}: '{name}' is a {family.title} env and its package is not installed "
                        f'({type(e).__name__}: {e}); install it with: {family.install_command} '
                        f'(or every env family: {ALL_FAMILIES_COMMAND})') from None

def atari_frames(env_spec: dict) -> tuple[int, float] | None:
    """(frame skip, sticky-action probability) that the lab's wrappers apply to an Atari game whose
    frame skip is a fixed number (ALE/ ids: 4, and the NoFrameskip ids, skipped 4 as SLM-Lab v4 did),
    with the sticky-action probability of the id or of the spec (`repeat_action_probability`), or
    None for other envs, RAM observations and the ids whose frame skip ALE draws at random.

    ALE's own sticky actions keep the last action it executed outside the state it clones, so a
    resumed game would act differently for its first steps; emulated one frame at a time under
    gymnasium's StickyAction, which keeps that action in plain attributes, a snapshot holds it."""
    if env_family(env_spec['name']) is not ENV_FAMILIES['atari']:
        return None
    registered = gym.envs.registry.get(env_spec['name'])
    given = {**{k: v for k, v in env_spec.items() if k in ('frameskip', 'repeat_action_probability', 'obs_type')},
             **(env_spec.get('make_kwargs') or {})}
    kwargs = {**(registered.kwargs if registered is not None else {}), **given}
    frameskip = kwargs.get('frameskip', 4)
    if kwargs.get('obs_type', 'rgb') == 'ram' or isinstance(frameskip, bool) or not isinstance(frameskip, int):
        return None
    if 'NoFrameskip' in env_spec['name'] and 'frameskip' not in given:
        frameskip = 4  # SLM-Lab v4 skipped 4 frames of these ids itself (its MaxAndSkipEnv)
    return frameskip, float(kwargs.get('repeat_action_probability', 0.25))


def is_ale_v5(name: str) -> bool:
    """An id of ale-py's own namespace (ALE/Pong-v5), which SLM-Lab v5's Atari specs use."""
    return name.startswith('ALE/')
