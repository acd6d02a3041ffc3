"""state_dict / load_state_dict for gymnasium envs, wrappers and vector envs.

An env's state is gathered layer by layer along its wrapper chain as plain data: numbers,
strings, numpy arrays, tuples of those, deques (as lists), running mean/std statistics and
numpy random generators (as their bit-generator state). Restoring sets the same attributes on a
freshly built env of the same spec.

Whether the in-progress episodes can be continued exactly depends on the env: gymnasium's
classic-control and toy-text envs keep all their dynamics in such attributes; ALE's games keep
theirs in the emulator, whose whole state (RAM, CPU, the sticky-action RNG) ALE clones to bytes
(`cloneState(include_rng=True)`, about 14 KB) and restores; MuJoCo's integration state
(`mj_getState(..., mjSTATE_INTEGRATION)`: time, positions, velocities, actuator activations,
warm-start accelerations, controls) is an array that `mj_setState` restores, after which
`mj_forward` recomputes the quantities derived from it. Box2D keeps its world in native objects
that cannot be read back, so for it only the wrappers' state (normalisation statistics, episode
counters) is restored and fresh episodes are started.
"""
from __future__ import annotations

import copy
from collections import deque

import gymnasium as gym
import numpy as np

from slm_lab.lib.errors import ResumeError

# envs whose whole dynamics state lives in plain attributes
EXACT_ENV_MODULES = ('gymnasium.envs.classic_control', 'gymnasium.envs.toy_text', 'ale_py', 'gymnasium.envs.mujoco')
# vector envs whose sub-envs' whole state lives in their own plain attributes (no gymnasium sub-envs)
EXACT_VECTOR_ENVS = ('CartPoleVector', 'AcrobotVector')
ALE_KEY = '__ale_state__'  # an ALE game's emulator state, as the bytes of ALEState.serialize()
MUJOCO_KEY = '__mujoco_state__'  # a MuJoCo env's mjSTATE_INTEGRATION array
MUJOCO_DERIVED_KEY = '__mujoco_derived__'  # and the derived quantities envs read between steps
# mjData's quantities computed from the state, which gymnasium's MuJoCo envs read (positions of
# bodies and sites, forces, tendons): after mj_step they belong to the start of its last substep,
# which mj_forward on the restored state would not reproduce (Ant's and Humanoid's rewards read
# them before stepping), so they are kept as they were
MUJOCO_DERIVED = ('xpos', 'xquat', 'xmat', 'xipos', 'ximat', 'subtree_com', 'site_xpos', 'site_xmat', 'geom_xpos',
                  'geom_xmat', 'cinert', 'cvel', 'cacc', 'cfrc_ext', 'cfrc_int', 'ten_length', 'ten_velocity',
                  'qfrc_actuator', 'qfrc_constraint', 'qfrc_bias', 'qfrc_passive', 'actuator_force', 'sensordata')
SKIP_ATTRS = {'env', 'envs', 'unwrapped', 'spec', '_cached_spec', 'screen', 'clock', 'isopen', 'render_mode',
              'viewer', 'window', 'metadata', '_metadata', '_saved_kwargs', 'action_space', 'observation_space',
              'single_action_space', 'single_observation_space', '_action_space', '_observation_space',
              'episode_start_times', 'time_queue', 'env_fns', '_env_obs'}
_PLAIN = (bool, int, float, str, type(None), np.bool_, np.integer, np.floating)


def _is_plain(value) -> bool:
    if isinstance(value, _PLAIN) or isinstance(value, np.ndarray):
        return True
    if isinstance(value, (tuple, list)):
        return all(_is_plain(v) for v in value)
    return False


def _encode(value):
    """Plain form of an attribute value, or None (sentinel _SKIP) when it is not state."""
    if isinstance(value, np.random.Generator):
        return {'__rng__': value.bit_generator.state}
    if isinstance(value, list) and value and all(isinstance(v, np.random.Generator) for v in value):
        return {'__rngs__': [v.bit_generator.state for v in value]}  # a generator per sub-env
    if isinstance(value, deque):
        return {'__deque__': list(value), 'maxlen': value.maxlen} if _is_plain(list(value)) else _SKIP
    if all(hasattr(value, k) for k in ('mean', 'var', 'count')) and not isinstance(value, np.ndarray):
        return {'__rms__': {'mean': np.array(value.mean), 'var': np.array(value.var), 'count': float(value.count)}}
    if isinstance(value, np.ndarray):
        return value.copy()
    if _is_plain(value):
        return copy.deepcopy(value) if isinstance(value, (list, tuple)) else value  # (lists of frame buffers)
    return _SKIP


_SKIP = object()


def _layer_state(layer) -> dict:
    state = {}
    # an ALE game (AtariEnv); ALE's vector env (AtariVectorEnv) has no state it can clone
    if type(layer).__module__.startswith('ale_py') and hasattr(getattr(layer, 'ale', None), 'cloneState'):
        serialized = layer.ale.cloneState(include_rng=True).serialize()
        state[ALE_KEY] = np.frombuffer(serialized, dtype=np.uint8).copy()
    if type(layer).__module__.startswith('gymnasium.envs.mujoco') and all(hasattr(layer, k) for k in ('model', 'data')):
        import mujoco  # noqa: PLC0415 (the MuJoCo extra: only a MuJoCo env has this state)
        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        array = np.empty(mujoco.mj_stateSize(layer.model, spec))
        mujoco.mj_getState(layer.model, layer.data, array, spec)
        state[MUJOCO_KEY] = array
        state[MUJOCO_DERIVED_KEY] = {f: np.array(getattr(layer.data, f)) for f in MUJOCO_DERIVED}
    for key, value in vars(layer).items():
        if key in SKIP_ATTRS:
            continue
        enc = _encode(value)
        if enc is not _SKIP:
            state[key] = enc
    return state


def _load_layer_state(layer, state: dict) -> None:
    for key, enc in state.items():
        if key == ALE_KEY:
            import ale_py  # noqa: PLC0415 (the Atari extra: only an Atari env has this state)
            layer.ale.restoreState(ale_py.ALEState(np.asarray(enc, dtype=np.uint8).tobytes()))
            continue
        if key == MUJOCO_KEY:
            import mujoco  # noqa: PLC0415 (the MuJoCo extra: only a MuJoCo env has this state)
            mujoco.mj_setState(layer.model, layer.data, np.asarray(enc, dtype=np.float64),
                               mujoco.mjtState.mjSTATE_INTEGRATION)
            mujoco.mj_forward(layer.model, layer.data)
            continue
        if key == MUJOCO_DERIVED_KEY:  # after MUJOCO_KEY (dicts keep their order): as they were
            for field, value in enc.items():
                getattr(layer.data, field)[...] = value
            continue
        # attributes an env creates only in reset() (e.g. Pendulum's `state`) are set too
        current = getattr(layer, key, None)
        if isinstance(enc, dict) and '__rng__' in enc:
            if isinstance(current, np.random.Generator):
                current.bit_generator.state = enc['__rng__']
            else:
                setattr(layer, key, _generator(enc['__rng__']))
        elif isinstance(enc, dict) and '__rngs__' in enc:  # a generator per sub-env
            setattr(layer, key, [_generator(rng_state) for rng_state in enc['__rngs__']])
        elif isinstance(enc, dict) and '__deque__' in enc:
            setattr(layer, key, deque(enc['__deque__'], maxlen=enc['maxlen']))
        elif isinstance(enc, dict) and '__rms__' in enc:
            rms = enc['__rms__']
            if current is None:
                from gymnasium.wrappers.utils import RunningMeanStd  # noqa: PLC0415 (gymnasium: only a normalised env has this state)
                current = RunningMeanStd(shape=np.shape(rms['mean']))
                setattr(layer, key, current)
            current.mean, current.var, current.count = np.array(rms['mean']), np.array(rms['var']), rms['count']
        elif isinstance(enc, np.ndarray) or hasattr(enc, 'numpy'):
            arr = np.array(enc)
            if isinstance(current, np.ndarray) and current.shape == arr.shape:
                current[...] = arr
            else:
                setattr(layer, key, arr)
        else:  # a copy: a layer that changes its lists in place (env/classic.py's) leaves the snapshot as read
            setattr(layer, key, copy.deepcopy(enc) if isinstance(enc, (list, dict)) else enc)


def _generator(bit_generator_state: dict) -> np.random.Generator:
    """A numpy generator in the state a snapshot recorded (its bit generator's state dict)."""
    rng = np.random.default_rng()
    rng.bit_generator.state = bit_generator_state
    return rng


def _chain(env) -> list:
    layers = []
    while env is not None:
        layers.append(env)
        env = getattr(env, 'env', None)
    return layers


def _layer_types(layers: list) -> list[str]:
    return [type(layer).__name__ for layer in layers]


def _paired(state: dict, layers: list) -> list[tuple]:
    """(layer, its saved state) for each layer of `layers` that the snapshot has a state for.
    Layers are matched by type, in order: a layer the chain has now and the snapshot lacks (a
    wrapper that an edit resumed with --force adds, e.g. env.clip_reward) keeps its fresh state,
    and a saved layer the chain no longer has is dropped; restoring by position alone would put
    each layer's state on the wrong one. A snapshot from before the types were recorded pairs by
    position when its number of layers matches, and is refused otherwise."""
    states = state['layers']
    saved = state.get('layer_types')
    if saved is None:
        count = len(states) + (0 if state.get('exact', True) or 'sub_envs' in state else 1)
        if count != len(layers):
            base = layers[-1]
            sub_envs = getattr(base, 'envs', None)  # a sync vector env: name the env it steps
            name = type((sub_envs[0] if sub_envs else base).unwrapped).__name__
            raise ResumeError(f"the snapshot's env has {count} wrapper layers and the one this lab builds for {name} "
                              f"has {len(layers)} ({', '.join(_layer_types(layers))}): an older lab version wrote it; "
                              'resume it with that version, or start the run again with train')
        return list(zip(layers, states))
    names = list(saved)[:len(states)]  # a single env's inexact state holds no base layer
    pairs, start = [], 0
    for layer in layers:
        name = type(layer).__name__
        for k in range(start, len(names)):
            if names[k] == name:
                pairs.append((layer, states[k]))
                start = k + 1
                break
    return pairs


def is_exact(env: gym.Env) -> bool:
    """Whether this single env's dynamics can be snapshotted exactly: an ALE game only without
    ALE's own sticky actions (the lab's Atari wrappers make them with StickyAction instead), whose
    memory of the last action is not in the state ALE clones."""
    module = type(env.unwrapped).__module__
    if module.startswith('ale_py'):
        return env.unwrapped.ale.getFloat('repeat_action_probability') == 0.0
    return module.startswith(EXACT_ENV_MODULES)


def obs_norm_from_state(vector_env_state: dict) -> dict | None:
    """The observation-normalisation statistics (mean, var, count, epsilon) held in a vector env's
    snapshot state (see NormalizeObservation), or None when observations were not normalised."""
    for layer in vector_env_state['layers']:
        if 'obs_rms' in layer:
            return layer['obs_rms']['__rms__'] | {'epsilon': layer.get('epsilon', 1e-8)}
    return None


def env_state_dict(env: gym.Env) -> dict:
    """State of a single env: every wrapper layer plus the base env (when exact)."""
    layers = _chain(env)
    exact = is_exact(env)
    return {'exact': exact, 'type': type(env.unwrapped).__name__, 'layer_types': _layer_types(layers),
            'layers': [_layer_state(layer) for layer in (layers if exact else layers[:-1])]}


def load_env_state_dict(env: gym.Env, state: dict) -> bool:
    """Restore a single env; returns whether it was restored exactly. An exact state goes into
    the env after one reset (see load_vector_env_state_dict)."""
    if state['exact']:
        env.reset(seed=0)
    return _load_env(env, state)


def _load_env(env: gym.Env, state: dict) -> bool:
    layers = _chain(env)
    pairs = _paired(state, layers)
    for layer, layer_state in pairs:
        _load_layer_state(layer, layer_state)
        if isinstance(layer, gym.wrappers.PassiveEnvChecker) and getattr(layer, '_previous_data', None) is None:
            # its one-off checks compare a step's objects with the previous reset's or step's, which
            # are not state: restored just after a reset or the first step, they would compare with None
            layer.checked_step = layer.checked_data_reuse = True
    return bool(state['exact']) and any(layer is layers[-1] for layer, _ in pairs)


def vector_env_state_dict(venv) -> dict:
    """State of a vector env built by make_env: its wrapper layers and each sub-env (sync mode).
    'exact' is False where some sub-env's dynamics cannot be captured (then fresh episodes start
    on resume)."""
    layers = _chain(venv)
    base = layers[-1]
    sub_envs = getattr(base, 'envs', None)
    state = {'layers': [_layer_state(layer) for layer in layers], 'layer_types': _layer_types(layers),
             'sub_envs': None, 'exact': False}
    if sub_envs is not None:
        state['sub_envs'] = [env_state_dict(e) for e in sub_envs]
        state['exact'] = all(s['exact'] for s in state['sub_envs'])
    elif type(base).__name__ in EXACT_VECTOR_ENVS:
        state['exact'] = True
    return state


def load_vector_env_state_dict(venv, state: dict) -> bool:
    """Restore a vector env; returns whether the in-progress episodes were restored exactly.
    When not exact, only the wrapper statistics are restored and the caller must reset.

    An exact state is restored into the env after one reset, which the state then overwrites:
    ALE draws each frame over the last one in a frame buffer that its cloned state does not hold,
    and some games leave pixels undrawn (Qbert diverged at the first step after a restore into a
    never-reset env; after a reset the undrawn pixels are the game's own)."""
    layers = _chain(venv)
    pairs = _paired(state, layers)
    base = layers[-1]
    # exact only into the same vector env (its base layer matched) stepping the same envs
    if type(base).__name__ in EXACT_VECTOR_ENVS:  # its sub-envs are in its own state
        saved = next((layer_state for layer, layer_state in pairs if layer is base), None)
        exact = bool(state['exact']) and saved is not None and saved.get('num_envs') == base.num_envs
    else:
        exact = (bool(state['exact']) and any(layer is base for layer, _ in pairs)
                 and len(getattr(base, 'envs', ())) == len(state['sub_envs'])
                 and all(sub.get('type') == type(env.unwrapped).__name__
                         for env, sub in zip(base.envs, state['sub_envs'])))
    if exact:
        venv.reset(seed=0)
    for layer, layer_state in pairs:
        if layer is base and not exact:
            continue
        _load_layer_state(layer, layer_state)
    if exact and state['sub_envs'] is not None:
        for env, env_state in zip(layers[-1].envs, state['sub_envs']):
            _load_env(env, env_state)
    return exact
