"""The env ids of SLM-Lab's spec files: renamed gymnasium ids run their current version with a
warning, the optional families (Box2D, MuJoCo, Atari) train when installed and are one line naming
the install command when not, and packages that cannot run here are one line naming the package."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from conftest import LabWarnings

from slm_lab import lab
from slm_lab.env import ENV_FAMILIES, ensure_env_registered
from slm_lab.lib.errors import SpecError
from slm_lab.spec import validate_spec
from slm_lab.spec.compat import RENAMED_ENV_IDS

ROOT = Path(__file__).resolve().parents[2]
RUN_LAB = str(ROOT / 'run_lab.py')

# Every env.name of SLM-Lab's published JSON and YAML specs, v4.2.4 and v5.3 (the values its
# v4 `spec_params.env` lists fill `${env}` with included), read from its repository.
SLM_LAB_ENV_IDS = sorted({
    # v4.2.4 env.name
    '2DBall', '3dball', 'BipedalWalker-v2', 'BreakoutNoFrameskip-v4', 'CartPole-v0', 'HalfCheetahBulletEnv-v0',
    'LunarLander-v2', 'MountainCar-v0', 'Pendulum-v0', 'PongNoFrameskip-v4', 'QbertNoFrameskip-v4',
    'RoboschoolHalfCheetah-v1', 'RoboschoolHumanoid-v1', 'RoboschoolHumanoidFlagrun-v1',
    'RoboschoolHumanoidFlagrunHarder-v1', 'SeaquestNoFrameskip-v4', 'Unity3DBall-v0', 'UnityCrawlerDynamic-v0',
    'UnityHallway-v0', 'VideoPinball-v0', 'gridworld', 'tennis',
    # v4.2.4 spec_params.env
    *(f'{game}NoFrameskip-v4' for game in (
        'Adventure AirRaid Alien Amidar Assault Asterix Asteroids Atlantis BankHeist BattleZone BeamRider '
        'Berzerk Bowling Boxing Breakout Carnival Centipede ChopperCommand CrazyClimber Defender DemonAttack '
        'DoubleDunk ElevatorAction FishingDerby Freeway Frostbite Gopher Gravitar Hero IceHockey Jamesbond '
        'JourneyEscape Kangaroo Krull KungFuMaster MontezumaRevenge MsPacman NameThisGame Phoenix Pitfall Pong '
        'Pooyan PrivateEye Qbert Riverraid RoadRunner Robotank Seaquest Skiing Solaris SpaceInvaders StarGunner '
        'Tennis TimePilot Tutankham UpNDown Venture VideoPinball WizardOfWor YarsRevenge Zaxxon').split()),
    *(f'Roboschool{task}-v1' for task in (
        'Ant AtlasForwardWalk HalfCheetah Hopper InvertedDoublePendulum InvertedPendulum '
        'InvertedPendulumSwingup Reacher Walker2d').split()),
    *(f'Unity{task}-v0' for task in (
        '3DBall 3DBallHard CrawlerDynamic CrawlerStatic Hallway PushBlock Pyramids Reacher Walker').split()),
    # v5.3 env.name
    'ALE/Breakout-v5', 'ALE/Pong-v5', 'ALE/Qbert-v5', 'ALE/Seaquest-v5', 'Acrobot-v1', 'Ant-v5',
    'BipedalWalker-v3', 'CartPole-v1', 'HalfCheetah-v5', 'Hopper-v5', 'Humanoid-v5', 'HumanoidStandup-v5',
    'InvertedDoublePendulum-v5', 'InvertedPendulum-v5', 'LunarLander-v3', 'LunarLanderContinuous-v3',
    'Pendulum-v1', 'Pusher-v5', 'Reacher-v5', 'Swimmer-v5', 'Walker2d-v5',
})
CANNOT_RUN = {'Roboschool': 'package roboschool', 'BulletEnv': 'package pybullet', 'Unity': 'mlagents',
              'dball': 'mlagents', 'DBall': 'mlagents', 'gridworld': 'mlagents', 'tennis': 'mlagents'}


def installed(family: str) -> bool:
    return importlib.util.find_spec(ENV_FAMILIES[family].module) is not None


def needs(family: str):
    return pytest.mark.skipif(not installed(family), reason=f'the {family} extra is not installed '
                                                            f'({ENV_FAMILIES[family].install_command})')


def continuous_ppo(make_spec, env: str, max_frame: int = 256) -> dict:
    spec = make_spec('PPO', env=env, max_frame=max_frame)
    spec['agent']['algorithm']['action_pdtype'] = 'Normal'
    return spec


def saved_spec(run: Path, name: str) -> dict:
    return json.loads((run / f'{name}_t0_s0_spec.json').read_text())


def train_frames(run: Path, name: str) -> list[int]:
    return pd.read_csv(run / 'info' / f'{name}_t0_s0_session_df_train.csv')['frame'].tolist()


# ---------------------------------------------------------------------------------------------
# which ids run

def test_each_renamed_id_is_gone_from_gymnasium_and_its_successor_is_registered():
    import gymnasium as gym
    for old, (new, what) in RENAMED_ENV_IDS.items():
        assert new in gym.envs.registry, (old, new)
        # gone, or registered only to say that mujoco-py (which no longer installs) is needed
        assert old not in gym.envs.registry or not isinstance(gym.envs.registry[old].entry_point, str), old
        assert what and '\n' not in what


def test_every_env_id_of_slm_labs_specs_runs_or_is_one_line_naming_a_package(make_spec):
    """Each id either validates (as itself or its current version) or is refused in one line that
    names the package: its install command, or why it cannot run here."""
    outcomes = {}
    for name in SLM_LAB_ENV_IDS:
        try:
            outcomes[name] = validate_spec(make_spec('Random', env=name))['env']['name']
        except SpecError as e:
            line = str(e)
            assert '\n' not in line and line.startswith('env.name: '), line
            if any(key in name for key in CANNOT_RUN):
                assert 'cannot run here' in line or 'does not have' in line, line
                assert next(v for k, v in CANNOT_RUN.items() if k in name) in line, line
            else:  # an optional family that is not installed here
                assert 'pip install' in line and 'requirements-envs.txt' in line, line
            outcomes[name] = 'refused'
    assert outcomes['LunarLander-v2'] in ('LunarLander-v3', 'refused')
    assert outcomes['Pendulum-v0'] == 'Pendulum-v1' and outcomes['CartPole-v0'] == 'CartPole-v0'
    for family, example in (('box2d', 'BipedalWalker-v2'), ('mujoco', 'Humanoid-v5'), ('atari', 'ALE/Pong-v5')):
        assert (outcomes[example] != 'refused') == installed(family), example
    assert outcomes['PongNoFrameskip-v4'] in ('PongNoFrameskip-v4', 'refused')  # still an ale-py id, unchanged


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize('name, package', [
    ('RoboschoolHumanoidFlagrun-v1', 'package roboschool'),
    ('HalfCheetahBulletEnv-v0', 'package pybullet'),
    ('UnityHallway-v0', 'packages mlagents and gym-unity'),
    ('vizdoom-v0', 'package vizdoom'),
])
def test_an_env_that_cannot_run_here_is_one_line_naming_its_package_and_makes_no_run(name, package, tmp_path):
    spec_path = tmp_path / 'spec.json'
    spec_path.write_text(json.dumps({'old': {
        'agent': [{'name': 'Random', 'algorithm': {'name': 'Random'}}],
        'env': [{'name': name, 'max_frame': 100}], 'body': {'product': 'outer', 'num': 1}, 'meta': {}}}))
    done = subprocess.run([sys.executable, RUN_LAB, str(spec_path), 'old', 'train'], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith('error:')]
    assert f"'{name}'" in line and package in line and 'Traceback' not in done.stderr
    assert not (tmp_path / 'data').exists()


# ---------------------------------------------------------------------------------------------
# missing packages

@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize('family, name', [
    ('box2d', 'LunarLander-v3'), ('box2d', 'LunarLander-v2'), ('mujoco', 'InvertedPendulum-v5'),
    ('mujoco', 'HalfCheetah-v2'), ('atari', 'ALE/Pong-v5'), ('atari', 'PongNoFrameskip-v4'),
    ('atari:cv2', 'ALE/Pong-v5'),
])
def test_a_missing_env_family_is_one_line_naming_its_install_command(family, name, tmp_path, make_spec):
    """run_lab.py in a process where the family's module (or after the colon, another module its
    envs need) cannot be imported (as when the package is not installed): one error line with the
    pinned install command, exit 2, no run directory."""
    spec_path = tmp_path / 'spec.json'
    spec_path.write_text(json.dumps({'fam': make_spec('Random', env=name, max_frame=100)}))
    family, _, module = family.partition(':')
    module = module or ENV_FAMILIES[family].module
    blocked = ('import runpy, sys\n'
               f'sys.path.insert(0, {str(ROOT)!r})\n'
               f'sys.modules[{module!r}] = None  # import {module} raises ImportError, as when it is not installed\n'
               f'sys.argv = [{RUN_LAB!r}, {str(spec_path)!r}, "fam", "train"]\n'
               f'runpy.run_path({RUN_LAB!r}, run_name="__main__")\n')
    done = subprocess.run([sys.executable, '-c', blocked], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith('error:')]
    assert ENV_FAMILIES[family].install_command in line and 'pip install -r requirements-envs.txt' in line, line
    assert 'Traceback' not in done.stderr
    assert not (tmp_path / 'data').exists()


def test_the_install_commands_pin_what_pyproject_and_requirements_envs_pin():
    """The pins the error lines name are the extras' and requirements-envs.txt's, and the test
    requirements (CI's install) include every family."""
    extras = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['optional-dependencies']
    lines = [ln.strip() for ln in (ROOT / 'requirements-envs.txt').read_text().splitlines()]
    for key, family in ENV_FAMILIES.items():
        assert tuple(extras[key]) == family.requirements, key
        assert all(r in lines for r in family.requirements), key
    assert extras['envs'] == [f'slm-lab[{",".join(ENV_FAMILIES)}]']
    assert '-r requirements.txt' in lines
    assert '-r requirements-envs.txt' in (ROOT / 'requirements-test.txt').read_text().splitlines()


def test_env_family_check_accepts_the_envs_gymnasium_always_has():
    for name in ('CartPole-v1', 'Pendulum-v1', 'MountainCarContinuous-v0', 'Acrobot-v1'):
        ensure_env_registered(name)


# ---------------------------------------------------------------------------------------------
# training

def test_a_renamed_id_trains_its_current_version_with_one_warning(lab_run, make_spec):
    spec = continuous_ppo(make_spec, 'Pendulum-v0', max_frame=128)
    with LabWarnings() as warned:
        _, run = lab_run(spec, 'oldpendulum')
    (line,) = [ln for ln in warned.lines if 'Pendulum-v0' in ln]
    assert "running 'Pendulum-v1' instead" in line
    assert saved_spec(run, 'oldpendulum')['env']['name'] == 'Pendulum-v1'  # what ran


@needs('box2d')
def test_box2d_lunar_lander_v2_trains_as_v3_with_dqn(lab_run, make_spec):
    with LabWarnings() as warned:
        _, run = lab_run(make_spec('DQN', env='LunarLander-v2', max_frame=300), 'lander')
    assert any("'LunarLander-v2' no longer exists" in ln for ln in warned.lines)
    assert saved_spec(run, 'lander')['env']['name'] == 'LunarLander-v3'
    assert train_frames(run, 'lander')[-1] == 300


@needs('mujoco')
def test_mujoco_inverted_pendulum_trains_with_ppo(lab_run, make_spec):
    _, run = lab_run(continuous_ppo(make_spec, 'InvertedPendulum-v5', max_frame=256), 'pendulum5')
    assert saved_spec(run, 'pendulum5')['env']['name'] == 'InvertedPendulum-v5'
    assert train_frames(run, 'pendulum5')[-1] == 256


@pytest.mark.slow
@needs('box2d')
def test_a_box2d_run_resumes_with_fresh_episodes_and_says_so(tmp_path, make_spec, spec_file, no_png):
    path = spec_file({'walker': continuous_ppo(make_spec, 'BipedalWalker-v3', max_frame=128)})
    data = str(tmp_path / 'data')
    lab.run(path, 'walker', 'train', data_dir=data)
    with LabWarnings() as warned:
        lab.run(path, 'walker', 'train@latest', ['env.max_frame=256'], data_dir=data)
    (run,) = [p for p in Path(data).iterdir() if p.name.startswith('walker_')]
    assert any('BipedalWalker-v3 cannot be snapshotted mid-episode' in ln and 'approximate' in ln
               for ln in warned.lines), warned.lines
    record = json.loads((run / 'walker_resumes.json').read_text())[-1]
    assert record['approximate']['0'], record
    assert train_frames(run, 'walker')[-1] == 256


@pytest.mark.slow
@needs('atari')
def test_atari_ram_observations_train_with_the_mlp(lab_run, make_spec):
    spec = make_spec('DQN', env='ALE/Pong-v5', max_frame=200)
    spec['env']['make_kwargs'] = {'obs_type': 'ram'}
    _, run = lab_run(spec, 'pongram')
    assert saved_spec(run, 'pongram')['env']['make_kwargs'] == {'obs_type': 'ram'}
    assert train_frames(run, 'pongram')[-1] == 200


@pytest.mark.slow
@pytest.mark.subprocess
def test_an_older_env_version_runs_with_one_line_of_warning(tmp_path):
    """CartPole-v0 (SLM-Lab v4's specs) runs as it is; gymnasium's multi-line deprecation warning
    at every make gives way to one line of the lab's."""
    spec = {'agent': {'name': 'PPO', 'algorithm': {'name': 'PPO', 'time_horizon': 32},
                      'memory': {'name': 'OnPolicyBatchReplay'}, 'net': {'type': 'MLPNet', 'hid_layers': [16]}},
            'env': {'name': 'CartPole-v0', 'max_frame': 200}, 'meta': {'log_frequency': 100}}
    path = tmp_path / 'old.json'
    path.write_text(json.dumps({'old': spec}))
    done = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[2] / 'run_lab.py'), str(path), 'old',
                           'train'], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert 'DeprecationWarning' not in done.stderr and 'out of date' not in done.stderr
    assert done.stderr.count('a newer version of it is CartPole-v1') == 1, done.stderr
