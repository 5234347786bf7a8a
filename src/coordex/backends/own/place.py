"""Python in the agent's own interpreter, behind the :class:`~..base.Place` protocol.

Sessions are namespaces in this process (:mod:`.interpreter`); read-only calls run
against a copy of one (:mod:`.copies`). What the place needs from the Executor (the
globals every session sees) comes in as a callable, so it knows nothing of the Executor.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ...core.facts import Ran
from ...core.messages import PlaceKind
from ...worker import _coordex_copy as copier
from .. import isolation
from ..base import Forked, ProgressCallback, RunRequest, Writer, Written, made_scratch
from . import branches, keep
from .interpreter import NamespaceSession, OwnInterpreter

_INSPECT_REPR_LIMIT = 200

GlobalsProvider = Callable[[], Mapping[str, Any]]


class OwnSession:
    """A namespace of the agent's own interpreter, with its own cwd and environment."""

    def __init__(self, place: OwnPlace, namespace: NamespaceSession) -> None:
        self._place = place
        self.state: NamespaceSession | None = namespace

    @property
    def namespace(self) -> dict[str, Any]:
        return self._require().namespace

    def _require(self) -> NamespaceSession:
        if self.state is None:
            raise RuntimeError("this own-interpreter session is closed")
        return self.state

    def run(self, request: RunRequest) -> Ran:
        return self._place.own.run(self._require(), request)

    def run_read_only(self, request: RunRequest) -> Ran:
        return self._place.run_read_only(self._require(), request)

    def inspect(self) -> dict[str, Any]:
        from ...worker._coordex_engine import safe_repr

        session = self._require()
        names = []
        for name, value in list(session.namespace.items()):
            if name.startswith("__") or name == "_" or name in session.injected:
                continue
            names.append({"name": name, "type": type(value).__name__,
                          "repr": safe_repr(value, _INSPECT_REPR_LIMIT)})
        names.sort(key=lambda item: item["name"])
        return {"names": names, "functions": "functions" in session.injected}

    def alive(self) -> bool:
        return self.state is not None

    # -- capabilities (base.Kept, base.Forkable, base.Checkpointable) ----------------------

    def fork(self, timeout: float) -> Forked:
        return branches.fork(self, timeout)

    def start_checkpoint(self, folder: str, max_bytes: int) -> Callable[[float], Written]:
        return branches.start_checkpoint(self, folder, max_bytes)

    def restore_checkpoint(self, folder: str, timeout: float) -> Written:
        return branches.restore_checkpoint(self, folder, timeout)

    def start_snapshot(self, folder: str, *, attempt: int, through: int, max_bytes: int,
                       identity: Mapping[str, Any], close: tuple[int, ...] = ()) -> Writer:
        return keep.start_snapshot(self, folder, attempt=attempt, through=through,
                                   max_bytes=max_bytes, identity=identity, close=close)

    def restore_snapshot(self, folder: str, replay: list[str], timeout: float) -> Written:
        return keep.restore_snapshot(self, folder, replay)

    def close(self) -> None:
        """Drop every reference this session holds, so its memory can be released."""
        session, self.state = self.state, None
        if session is not None:
            self._place.release(session)

    # -- nested calls (base.RunsNested): from code already running in this session -------

    def running_here(self, frame: Any) -> bool:
        """Whether ``frame`` (or a caller of it) runs in this session's namespace."""
        session = self.state
        if session is None or session.current is None:
            return False
        while frame is not None:
            if frame.f_globals is session.namespace:
                return True
            frame = frame.f_back
        return False

    def run_nested(self, request: RunRequest, read_only: bool) -> Ran:
        """Run inside the outer call that is running in this session right now."""
        session = self._require()
        if read_only:
            # A view of the live session (its runner is busy with the outer call, so the
            # session itself reads as stuck); the fork copies it as it is.
            return self._place.run_read_only(self._place.own.new_session(session.namespace),
                                             request)
        return self._place.own._run_on(session.runner, session, session.namespace, request)


class OwnPlace:
    """Python in the agent's own interpreter: one :class:`OwnInterpreter` per Executor."""

    kind: PlaceKind = "own"
    retries = False  # nothing here can die and be replaced: it is the agent's process

    def __init__(self, session_globals: GlobalsProvider, capabilities: Any,
                 inline: bool = False) -> None:
        self.own = OwnInterpreter(inline=inline)
        self._globals = session_globals
        self._capabilities = capabilities  # what a read-only copy may call back
        self._sessions: list[OwnSession] = []
        self._lock = threading.Lock()

    def open_session(self, on_progress: ProgressCallback | None = None,
                     namespace: dict[str, Any] | None = None) -> OwnSession:
        state = self.own.new_session(namespace)
        session = OwnSession(self, state)
        self._inject(state)
        with self._lock:
            self._sessions.append(session)
        return session

    def run_stateless(self, request: RunRequest) -> Ran:
        return self.own.run_stateless(request, dict(self._globals()))

    def run_read_only(self, session: NamespaceSession, request: RunRequest) -> Ran:
        failed = made_scratch(request)
        if failed is not None:
            return failed
        scratch, paths = request.scratch, request.protect_paths
        # Set up here, once, what every fork child would repeat (libc, the filters).
        isolation.prepare()
        copier.prepare()

        def protect(map_identity: Callable[[str, str], bool] | None) -> str:
            # In the fork child, after it entered the session's cwd.
            if scratch is None:
                return "none"
            return str(isolation.protect(paths, scratch, map_identity=map_identity))

        # Capabilities the copy calls run here, in the agent's process (SPEC section 1).
        from .copies import run_read_only  # loaded by the first read-only call

        return run_read_only(self.own, session, request, protect, self._capabilities)

    def capabilities_changed(self) -> None:
        with self._lock:
            sessions = [s.state for s in self._sessions if s.state is not None]
        for state in sessions:
            self._inject(state)

    def _inject(self, state: NamespaceSession) -> None:
        extra = self._globals()
        state.namespace.update(extra)
        state.injected.update(extra)

    def release(self, state: NamespaceSession) -> None:
        with self._lock:
            self._sessions = [s for s in self._sessions if s.state is not None]
        self.own.owned.end(state.mark)  # before the namespace goes (a Popen warns)
        state.close()

    def close(self) -> None:
        with self._lock:
            sessions, self._sessions = self._sessions, []
        self.own.owned.end()  # what the code started, before the namespaces go
        for session in sessions:
            with contextlib.suppress(Exception):
                session.close()
        self.own.close()



__all__ = ["OwnPlace", "OwnSession"]
