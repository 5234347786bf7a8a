"""The places one Executor runs code in, by (language, environment): the one point
where the kind of place is chosen.

A place is made on first use (:meth:`Places.get`): the agent's own interpreter exists
from the start; bash is a :class:`~coordex.backends.shell.ShellPlace`; Python in an
environment an :class:`~coordex.backends.env.EnvironmentPlace`; with a cluster, every
one of those is the cluster's place instead. A new kind of place is one more branch in
:meth:`Places._new` and nothing else here changes (``docs/architecture.md``).
"""

from __future__ import annotations

import os
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .backends.base import Place, ProgressCallback
from .backends.env import EnvironmentPlace
from .core import messages
from .core.errors import CoordexError

if TYPE_CHECKING:
    from .backends.ray import RayCluster
    from .executor import Executor

PlaceKey = tuple[str, int | None]


class Places:
    """The places of one Executor, made on first use, closed with it."""

    def __init__(self, executor: Executor, own: Place) -> None:
        self._executor = executor
        self._lock = threading.Lock()
        self._made: dict[PlaceKey, Place] = {("python", None): own}

    def all(self) -> list[Place]:
        with self._lock:
            return list(self._made.values())

    def get(self, language: str, venv_id: int | None,
            on_progress: ProgressCallback | None = None) -> Place:
        """The place for one (language, environment), made on first use (an environment
        built for it reports its lines to ``on_progress``, the asking call's).

        Making a place may build its environment, so it happens outside the lock; of
        two threads racing, one place is kept and the other closed.
        """
        key: PlaceKey = (language, venv_id)
        with self._lock:
            place = self._made.get(key)
        if place is not None:
            return place
        executor = self._executor
        executor._check_open()
        made = self._new(language, venv_id, on_progress)
        with self._lock:
            place = self._made.get(key)
            if place is None and not executor._closed:
                self._made[key] = made
                return made
        made.close()
        if place is None:
            raise messages.executor_closed()
        return place

    def _new(self, language: str, venv_id: int | None,
             on_progress: ProgressCallback | None) -> Place:
        executor = self._executor
        if executor._cluster is not None:
            return self._cluster_place(language, venv_id)
        if language == "bash":
            from .backends.shell import ShellPlace

            return ShellPlace(env=self._bash_env(venv_id, on_progress))
        assert venv_id is not None  # the own interpreter's place exists from the start
        return EnvironmentPlace(
            lambda progress: executor.environments_manager.python_for(
                venv_id, progress),
            lambda: self._worker_env(venv_id), CapabilityBridge(executor))

    def _cluster_place(self, language: str, venv_id: int | None) -> Place:
        """A place on the cluster: its sessions live on nodes, and an environment is built
        on the node that needs it, from its spec and hash, with the spec's resources."""
        from .backends.ray import EnvRef
        from .core.spec import parse_spec

        executor = self._executor
        env = None
        if venv_id is not None:
            text, spec_hash, label = executor.environments_manager.describe(venv_id)
            asked = parse_spec(text).resources  # [tool.coordex]
            env = EnvRef(text, spec_hash, label, {k: float(v) for k, v in asked.items() if v})
        cluster = executor._cluster
        assert cluster is not None  # _new asked
        place: Place = cluster.place(language, env)
        return place

    def _bash_env(self, venv_id: int | None,
                  on_progress: ProgressCallback | None) -> dict[str, str] | None:
        """The environment for bash: the host's, or with ``venv_id`` activated."""
        if venv_id is None:
            return None
        # Built on first use for bash too: activating a folder that does not exist yet
        # would silently leave the host's python first on PATH.
        self._executor.environments_manager.python_for(venv_id, on_progress)
        return self._worker_env(venv_id)

    def _worker_env(self, venv_id: int) -> dict[str, str]:
        env = dict(os.environ)
        env_dir = self._executor.environments_manager.env_dir(venv_id)
        if env_dir is not None:
            env["VIRTUAL_ENV"] = str(env_dir)
            env["PATH"] = str(Path(env_dir) / "bin") + os.pathsep + env.get("PATH", "")
            env.pop("PYTHONHOME", None)
        return env


def join_cluster(executor: Executor, address: Any) -> RayCluster:
    """Join the Ray cluster at ``address`` (SPEC section 10); ValueError if it cannot."""
    if hasattr(address, "converse"):  # a confined tenant's cluster, through its owner
        address.capabilities = CapabilityBridge(executor)
        address.build_timeout = executor.build_timeout
        cluster: RayCluster = address  # a hosting.relay.RelayCluster
        return cluster
    if not isinstance(address, str) or not address.strip():
        raise ValueError(f"cluster must be a Ray address such as 'auto' or "
                         f"'ray://host:10001', got {address!r}")
    try:
        from .backends.ray import RayCluster

        return RayCluster(address, capabilities=CapabilityBridge(executor),
                          build_timeout=executor.build_timeout)
    except CoordexError as exc:
        raise ValueError(f"{exc.error} {exc.suggestion}") from None




class CapabilityBridge:
    """What a worker sees of the host's capabilities."""

    def __init__(self, executor: Executor) -> None:
        self._executor = weakref.ref(executor)

    def names(self) -> list[str]:
        executor = self._executor()
        return sorted(executor._capabilities) if executor is not None else []

    def call(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        executor = self._executor()
        if executor is None:
            raise RuntimeError("the executor is closed")
        return executor.call_capability(name, args, kwargs)
