"""The one accessor of a snapshot's parts. A session's snapshot state is
`{component: component.state_dict()}` (Session.state_dict): its nesting (the agent's algorithm
inside the agent, the replay memory beside it, the env's wrapper layers...) is known here and
nowhere else outside persistence/, so a reader asks for `nets(state)`, not for
`state['agent']['algorithm']['nets']`.

    snapshot = load_latest_snapshot(ckpt_dir)      # a Snapshot, or None
    snapshot.frame, snapshot.nets, snapshot.obs_norm, snapshot.agent_state

A Snapshot read in one process continues in another without being read again: `portable()` is
what the state file held (tensors, no mapped arrays) with its manifest and directory, small
enough to send to a session's process, where `Snapshot.reopen` maps its array files again.
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from slm_lab.lib.arrays import map_arrays
from slm_lab.persistence.env_state import obs_norm_from_state


def nets(state: dict) -> dict[str, dict]:
    """The algorithm's nets: {net name: its state_dict}."""
    return state['agent']['algorithm']['nets']


def optimizers(state: dict) -> dict[str, dict]:
    """The algorithm's optimizers: {optimizer name: its state_dict}."""
    return state['agent']['algorithm']['optimizers']


def agent_state(state: dict) -> dict:
    """The agent's part (Agent.state_dict()): its algorithm's and its memory's states."""
    return state['agent']


def env_state(state: dict) -> dict:
    """The training vector env's state (env_state.vector_env_state_dict)."""
    return state['env']


def obs_norm(state: dict) -> dict | None:
    """The observation-normalisation statistics of the training env, None when not normalised."""
    return obs_norm_from_state(env_state(state))


def global_state(state: dict) -> dict | None:
    """meta.distributed: the global nets as the session read them ('mode', 'updates', 'nets',
    'optimizers'); None in a session that trained alone."""
    return state.get('global')


def best_model(state: dict) -> dict | None:
    """What model_best.pt held at the snapshot's frame (None before the first, and in snapshots of
    older lab versions)."""
    return state.get('best_model')


class PassedOver(NamedTuple):
    """A damaged snapshot passed over on the way to an older intact one, and what is wrong with it."""

    path: Path
    problem: str


class Portable(NamedTuple):
    """A snapshot as it travels to another process: the state file's plain contents (arrays as
    references to their files), the manifest and the snapshot's directory, and the damaged
    snapshots passed over to reach it."""

    plain: dict
    manifest: dict
    path: str
    passed_over: tuple[PassedOver, ...] = ()


class Snapshot:
    """A loaded snapshot: its state (arrays memory-mapped), manifest and directory. Unpacks as
    (state, manifest, path). `plain` (what its state file held, before the arrays were mapped)
    makes it portable to another process. `passed_over`: the newer snapshots of its session that
    were found damaged on the way to it (load_latest_snapshot), for whoever continues from it to
    report and set aside."""

    __slots__ = ('state', 'manifest', 'path', 'plain', 'passed_over')

    def __init__(self, state: dict, manifest: dict, path: Path, plain: dict | None = None,
                 passed_over: tuple[PassedOver, ...] = ()):
        self.state, self.manifest, self.path, self.plain = state, manifest, Path(path), plain
        self.passed_over = tuple(passed_over)

    def __iter__(self):
        return iter((self.state, self.manifest, self.path))

    def portable(self) -> Portable:
        """What another process needs to continue from this snapshot without reading it again."""
        if self.plain is None:
            raise ValueError(f'snapshot {self.path} was not loaded with its plain state: it cannot be sent on')
        return Portable(self.plain, self.manifest, str(self.path), self.passed_over)

    @classmethod
    def reopen(cls, portable: Portable) -> Snapshot:
        """The snapshot `portable()` sent, its array files mapped again (not read: the state file's
        contents came with it, and the arrays' checks run as after any load)."""
        path = Path(portable.path)
        return cls(map_arrays(portable.plain, path, portable.manifest['files']), portable.manifest, path,
                   portable.plain, portable.passed_over)

    @property
    def frame(self) -> int:
        """The frame the snapshot was taken at."""
        return self.manifest['frame']

    @property
    def nets(self) -> dict[str, dict]:
        return nets(self.state)

    @property
    def optimizers(self) -> dict[str, dict]:
        return optimizers(self.state)

    @property
    def agent_state(self) -> dict:
        return agent_state(self.state)

    @property
    def env_state(self) -> dict:
        return env_state(self.state)

    @property
    def obs_norm(self) -> dict | None:
        return obs_norm(self.state)

    @property
    def global_state(self) -> dict | None:
        return global_state(self.state)

    @property
    def best_model(self) -> dict | None:
        return best_model(self.state)
