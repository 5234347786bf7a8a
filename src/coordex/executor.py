"""The Executor: the one orchestrator behind every front end.

``execute_code`` validates the coordinate (pure core), asks the session table
(:mod:`coordex.sessions`, the one owner of session state) for the session, and hands
the code to the place for that (language, environment) through the
:class:`~coordex.backends.base.Place` / :class:`~coordex.backends.base.Session`
protocols: the own interpreter, a worker in an environment, a bash shell. It never
asks which kind of place it talks to. The outcome is shaped into the SPEC result or
error dict.

Nothing here raises for bad input: every failure is returned as an error dict.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

from . import branches, calling, managing, spill
from .backends._reap import keeper as _process_keeper
from .backends.base import OutputCallback, Place, Session
from .backends.own import OwnPlace
from .core import coordinates as coords
from .core import messages
from .core.coordinates import Coordinate, SessionKey
from .core.errors import CoordexError
from .core.results import DEFAULT_OUTPUT_LIMIT
from .core.root import default_root
from .core.shapes import (
    CheckpointList,
    CheckpointResult,
    CloseResult,
    ForkResult,
    HistoryResult,
    InspectResult,
    Language,
    RebuildResult,
    RestoreResult,
    RunResult,
    SessionsResult,
    StateMode,
    ToolFormat,
    UIResult,
)
from .environments.facade import Environments
from .log.calls import open_call_log
from .log.running import RunningCalls
from .long_work import LongWork
from .observe.hook import watch_call, watched
from .persist.hooks import Keeping
from .places import CapabilityBridge, Places, join_cluster
from .sessions import SessionTable

if TYPE_CHECKING:
    from .backends.ray import RayCluster
    from .environments.manager import EnvironmentManager
    from .library.functions import FunctionLibrary
    from .log.detached import CallRecord as Recorded
    from .log.detached import Run
    from .ui.server import UIServer

PlaceKey = tuple[str, int | None]
_F = TypeVar("_F", bound=Callable[..., Any])


def _where(language: Any, session_id: Any, session_name: Any, venv_id: Any) -> dict[str, Any]:
    """A session tool's coordinate, as a watch reads it (SPEC 16)."""
    return {"language": language, "session_id": session_id, "session_name": session_name,
            "venv_id": venv_id}


class Executor:
    """Runs code at a coordinate: language x state mode x session x environment.

    Args:
        root: data folder (environments, the function library, logs). Default:
            ``COORDEX_HOME`` or the user data dir.
        max_sessions: sessions alive at once across all languages and environments,
            the plan namespace included.
        timeout: default seconds per call; ``execute_code(timeout=...)`` overrides.
        build_timeout: seconds an environment build may take (not counted in ``timeout``).
        output_limit: characters kept per stream (head and tail); the rest is cut.
        read_only_paths: folders whose writes a read-only call discards (default: the
            session's working directory and the home folder). Relative entries are
            taken relative to the session's working directory (``"."`` is that
            directory); writes anywhere else are refused.
        envs_dir: where built environments live (default ``root/envs``); tenants may
            share one, since folders are named by the spec's hash.
        log: record every call in the call log under ``root`` (SPEC section 11).
        log_max_rows: rows the call log keeps; the oldest go first.
        cluster: a Ray cluster's address (``"auto"``, ``"ray://host:port"``, or a local
            cluster's address): bash sessions, environment sessions and stateless
            environment and bash calls then run on its nodes (SPEC section 10). Needs
            ``pip install 'coordex[ray]'``; without Ray, or when the cluster cannot be
            joined, the constructor raises ``ValueError`` saying what to do, as it does
            for any bad constructor argument.
        own_on_caller_thread: run own-interpreter code on the calling thread when that
            is the main thread (one thread hand-off less per call). The trade: a timeout then
            returns only once code blocked in C that retries on signals (``os.system``,
            a long BLAS call) or code that catches every interrupt lets go; by default
            the code runs on a runner thread and the timeout always returns.
        environments_manager: the environment manager to use instead of one made from
            ``root``, ``envs_dir`` and ``build_timeout`` (a confined host passes one whose
            builds run in its builder process).
        records: where the call log and the function library are written, instead of
            files under ``root`` (a confined host passes its owner's writer, so the
            tenant's code cannot change its own log).
        persist: keep sessions on disk under ``root/snapshots`` so they outlive this
            process (SPEC section 12): a later Executor on the same ``root`` restores a
            session on its first call, from its last snapshot plus the stateful calls
            the log holds after it. Python globals are pickled by value (cloudpickle),
            modules imported again; bash keeps its cwd, variables, functions, aliases,
            options and umask. What cannot be pickled is rebuilt by replaying the calls
            that bound it, else listed in the result's ``restored["left_out"]``.
        snapshot_interval: seconds between a session's background snapshots; one is
            written after a stateful call that changed names once this has passed, by
            a fork of the session's process (the session keeps answering), and at close.
        persist_max_bytes: a snapshot larger than this is not written; the session is
            then kept by replaying its calls alone.
        replaces_lost: this Executor starts in place of one that died with its sessions
            (a confined host started again, SPEC 9): the first ``execute_code`` or
            ``call_function`` result (or error) says ``state_lost: true``, once; one
            that says ``restored`` says that instead. A host whose first call is
            another method says it on that one (:meth:`take_unsaid_loss`).

    Every method returns a JSON-serialisable dict and never raises for bad arguments.
    Use as a context manager, or call :meth:`close`: it ends every process it started.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None, max_sessions: int = 20,
                 timeout: float = 60.0, *, build_timeout: float = 900.0,
                 output_limit: int = DEFAULT_OUTPUT_LIMIT,
                 read_only_paths: list[str] | None = None,
                 envs_dir: str | os.PathLike[str] | None = None,
                 log: bool = True, log_max_rows: int = 100_000,
                 cluster: str | None = None, own_on_caller_thread: bool = False,
                 environments_manager: EnvironmentManager | None = None, records: Any = None,
                 persist: bool = False, snapshot_interval: float = 30.0,
                 persist_max_bytes: int = 2**31, replaces_lost: bool = False) -> None:
        if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
            raise ValueError(f"max_sessions must be an integer >= 1, got {max_sessions!r}")
        try:
            if coords.check_timeout(timeout) is None:
                raise ValueError("timeout must be a positive number of seconds, not None")
        except CoordexError as exc:
            raise ValueError(exc.error) from None
        self.root = Path(root).expanduser() if root is not None else default_root()
        self.root.mkdir(parents=True, exist_ok=True)
        self.timeout = float(timeout)
        self.build_timeout = float(build_timeout)
        self.output_limit = int(output_limit)
        self.read_only_paths = list(read_only_paths) if read_only_paths is not None else None
        self._envs_dir = Path(envs_dir) if envs_dir is not None else None
        self._cluster: RayCluster | None = (join_cluster(self, cluster) if cluster is not None
                                            else None)
        self._lock = threading.RLock()
        self._capabilities: dict[str, Callable[..., Any]] = {}
        self._environments: EnvironmentManager | None = environments_manager
        self._functions: Any = None
        # Where the call log and the function store are written when not under root by
        # this process (a confined host's owner writes them: hosting/records).
        self._records = records
        import builtins

        self.plan_namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        self._own_place = OwnPlace(self._session_globals, CapabilityBridge(self),
                                   inline=bool(own_on_caller_thread))
        self._places = Places(self, self._own_place)
        self._table = SessionTable(max_sessions,
                                   self._own_place.open_session(namespace=self.plan_namespace),
                                   replaces_lost=replaces_lost)
        self._call_log = open_call_log(self.root, self._records, log, log_max_rows)
        self._keeping = Keeping.open(self.root, self._table, self._call_log, persist=persist,
                                     interval=snapshot_interval, max_bytes=persist_max_bytes)
        # Calls in flight, for the page (SPEC 11): their output so far, and interrupt.
        self.running_calls = RunningCalls(
            self._call_log.reserve if self._call_log is not None else None)
        # Calls given ``wait`` (SPEC 14): wait_call, cancel_call, busy, join, redelivery.
        self._calls = LongWork(self._table, self._call_log, self._check_open, self.root)
        self._ui: UIServer | None = None
        # Output and values that do not fit a result go here (SPEC 14).
        self.spill_folder = spill.folder_of(_working_folder(self.root))
        _LIVE.add(self)

    # ------------------------------------------------------------------ context manager

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def _closed(self) -> bool:
        return self._table.closed

    def close(self) -> None:
        """End every process this executor started: sessions, stateless runners, places.

        With ``persist``, each session that changed since its last snapshot is written
        first (at most a few seconds in all; the call log keeps what is not written)."""
        self._keeping.close()
        sessions = self._table.drain()
        places = self._places.all()
        for session in sessions:
            with contextlib.suppress(Exception):
                session.close()
        for place in places:
            with contextlib.suppress(Exception):
                place.close()
        for part in (self._functions, self._environments, self._ui, self._cluster):
            if part is not None:
                with contextlib.suppress(Exception):
                    part.close()
        if self._call_log is not None:
            self._call_log.close()
        _process_keeper().release()  # the host's process keeper, once no process is left

    # ------------------------------------------------------------------ execute_code

    def execute_code(self, code: str, language: Language = "python",
                     state_mode: StateMode = "stateless",
                     session_id: int | None = None, session_name: str | None = None,
                     venv_id: int | None = None, timeout: float | None = None,
                     on_output: OutputCallback | None = None, *,
                     on_progress: Callable[[str], None] | None = None,
                     cancel: threading.Event | None = None,
                     wait: float | None = None) -> RunResult:
        """Run ``code`` at one coordinate and return the SPEC result or error dict.

        Args:
            code: Python source or a bash script.
            language: ``"python"`` or ``"bash"``.
            state_mode: ``"stateless"`` (fresh, keeps nothing), ``"stateful"`` (a kept
                session; session 0 when none is named) or ``"read_only"`` (a copy of an
                existing session; nothing it does persists).
            session_id / session_name: the session; never both.
            venv_id: ``None`` for the agent's own interpreter, or an environment id.
            timeout: seconds for this call (default: the executor's).
            on_output: ``on_output(stream, text)`` called with output chunks as they come.
            on_progress: ``on_progress(line)`` called with environment build lines when
                this call builds its environment on first use (builds do not count
                against ``timeout``).
            cancel: an event a front end sets when its request is cancelled; the code
                is then interrupted as on a timeout, in every place (state kept; killed
                only if it ignores the interrupt past the grace period).
            wait: seconds (> 0) to wait for the end (SPEC 14). A call still running
                then returns ``{"running": True, "call_id", "elapsed_ms", "stdout",
                "stderr", "session", "state_mode", "suggestion"}`` and goes on under its
                own ``timeout``; :meth:`wait_call` fetches its result. A call given
                ``wait`` that ends in time returns its result with its ``call_id``.
                Default: wait for the end.
        """
        return cast(RunResult, calling.watched_start(
            self, code, language, state_mode, session_id, session_name, venv_id, timeout,
            on_output, on_progress, cancel, wait))

    # ------------------------------------------------------------------ long work (SPEC 14)

    def run_recorded(self, tool: str, arguments: dict[str, Any], run: Run,
                     wait: float | None, on_output: OutputCallback | None = None,
                     cancel: threading.Event | None = None) -> dict[str, Any]:
        """For front ends: run one tool call (``run(on_output, cancel, record)``) through
        the call record of SPEC 14, as ``execute_code`` runs with ``wait``: ``busy`` for a
        session a detached call holds, joined to an identical running call, a held
        result redelivered, else run and waited for at most ``wait`` seconds. ``record``
        (None when the call was run at once) goes down the call's path: to
        :meth:`run_function_code` for a stored function."""
        if wait is None and not self._calls.active:
            return run(on_output, cancel, None)
        return self._calls.run(tool, {k: v for k, v in arguments.items() if k != "wait"},
                              arguments.get("state_mode", "stateless"), run, wait,
                              on_output, cancel)

    def wait_call(self, call_id: str, wait: float | None = None) -> dict[str, Any]:
        """The result of a call that returned ``running`` (SPEC 14).

        Args:
            call_id: the ``call_id`` of a ``running`` record.
            wait: seconds (> 0) to wait; still running then: another ``running``
                record. Default: wait for the end.

        Returns:
            The very dict the call would have returned, ``call_id`` added: kept at
            least an hour after the call ends, and read from the call log after that
            or after a restart (then with ``"from_log": true``). ``not_found`` for an
            unknown or expired id, naming the calls still running.
        """
        return cast(dict[str, Any], watched(  # SPEC 16
            "wait_call", {"call_id": call_id}, lambda: self._calls.wait_call(call_id, wait)))

    def cancel_call(self, call_id: str) -> dict[str, Any]:
        """Interrupt a call that returned ``running`` as ``cancel`` does (state kept;
        killed only if it ignores the interrupt past the grace period) and return its
        final result, ``call_id`` added. An ended call: its result, unchanged."""
        return cast(dict[str, Any], watched(  # SPEC 16
            "cancel_call", {"call_id": call_id}, lambda: self._calls.cancel_call(call_id)))

    def read_spilled(self, uri: str) -> dict[str, Any]:
        """For front ends: a file a result named in ``spilled``, by the ``file://`` URI of
        its resource link (an MCP ``resources/read``). Returns ``{"uri", "mime_type",
        "text"}`` (the first 8 Mi characters), or ``not_found`` for anything that is not
        a spilled file of this executor's."""
        return spill.read(self.spill_folder, uri)

    def hold_call(self, call_id: str) -> dict[str, Any]:
        """For front ends: the answer to a request of ``call_id`` was lost before it
        was delivered (its connection or stream broke; not a cancellation). The call's
        result is held for 10 minutes: the identical call gets it with
        ``"redelivered": true`` instead of running again."""
        return self._calls.hold_call(call_id)


    def _bring_back(self, coordinate: Coordinate, timeout: float) -> dict[str, Any] | None:
        return calling.bring_back(self, coordinate, timeout)

    def _open_session(self, key: SessionKey,
                      on_progress: Callable[[str], None] | None = None) -> Session:
        return self._place(key.language, key.venv_id, on_progress).open_session(on_progress)

    def _place(self, language: str, venv_id: int | None,
               on_progress: Callable[[str], None] | None = None) -> Place:
        return self._places.get(language, venv_id, on_progress)

    def _check_open(self) -> None:
        if self._table.closed:
            raise messages.executor_closed()


    # ------------------------------------------------------------------ sessions API

    def take_unsaid_loss(self) -> bool:
        """Whether this Executor replaces a lost one (``replaces_lost``) and no result has
        said so yet; the caller says it (a confined host's reply to a method that is not
        a call of code, SPEC 9). True once at most."""
        return self._table.unsaid_loss and self._table.take_unsaid_loss()

    def list_sessions(self) -> SessionsResult:
        """All open sessions with their provenance, and the cap (none once closed)."""
        return cast(SessionsResult, watched("list_sessions", {},
                                            lambda: managing.list_sessions(self)))

    def inspect_session(self, language: Language = "python", session_id: int | None = None,
                        session_name: str | None = None,
                        venv_id: int | None = None) -> InspectResult:
        """What a session holds. Without a session: session 0 of that place.

        Python: ``{"names": [{"name","type","repr","bound_at_call","calls_ago"}], ...}``
        with capabilities and ``functions`` listed apart. Bash: ``{"cwd", "variables",
        "functions", "aliases"}`` — only what the session added. Changes nothing.
        """
        return cast(InspectResult, watched(
            "inspect_session", _where(language, session_id, session_name, venv_id),
            lambda: managing.inspect_session(self, language, session_id, session_name,
                                             venv_id)))

    def close_session(self, language: Language = "python", session_id: int | None = None,
                      session_name: str | None = None,
                      venv_id: int | None = None) -> CloseResult:
        """Close one session and end its process. Needs a session; never session 0 of
        the own interpreter's Python (the plan namespace)."""
        return cast(CloseResult, watched(
            "close_session", _where(language, session_id, session_name, venv_id),
            lambda: managing.close_session(self, language, session_id, session_name, venv_id)))

    # ------------------------------------------------------------------ branches (SPEC 15)

    def fork_session(self, session_id: int | str | None = None, session_name: str | None = None,
                     language: Language = "python", venv_id: int | None = None, *,
                     new_name: str | None = None) -> ForkResult:
        """Open a new session ``new_name`` holding a copy of a session's state; the source
        never changes. Files on disk are shared, not copied.

        Returns ``{"session": {...new...}, "from": {...}, "ms", "copy", "left_out",
        "files"}``; ``capacity`` beyond ``max_sessions``; ``validation`` when ``new_name``
        is in use (naming a free one) or the place cannot fork.
        """
        return cast(ForkResult, watched(
            "fork_session", _where(language, session_id, session_name, venv_id),
            lambda: branches.fork_session(self, session_id, session_name, language, venv_id,
                                          new_name)))

    def checkpoint_session(self, language: Language = "python", session_id: int | None = None,
                           session_name: str | None = None, venv_id: int | None = None, *,
                           label: str | None = None) -> CheckpointResult:
        """Record a session's state (written from a copy: the session keeps answering).

        Returns ``{"checkpoint", "label", "at", "bytes", "ms", "left_out", "session"}``
        (and ``dropped`` when the oldest of the 10 kept went)."""
        return cast(CheckpointResult, watched(
            "checkpoint_session", _where(language, session_id, session_name, venv_id),
            lambda: branches.checkpoint_session(self, language, session_id, session_name,
                                                venv_id, label)))

    def restore_session(self, language: Language = "python", session_id: int | None = None,
                        session_name: str | None = None, venv_id: int | None = None, *,
                        checkpoint: str | None = None) -> RestoreResult:
        """Put a session back to a checkpoint of it (files on disk are not touched)."""
        return cast(RestoreResult, watched(
            "restore_session", _where(language, session_id, session_name, venv_id),
            lambda: branches.restore_session(self, language, session_id, session_name,
                                             venv_id, checkpoint)))

    def list_checkpoints(self, language: Language = "python", session_id: int | None = None,
                         session_name: str | None = None,
                         venv_id: int | None = None) -> CheckpointList:
        """A session's checkpoints, newest last."""
        return cast(CheckpointList, watched(
            "list_checkpoints", _where(language, session_id, session_name, venv_id),
            lambda: branches.list_checkpoints(self, language, session_id, session_name,
                                              venv_id)))

    # ------------------------------------------------------------------ the call log

    def history(self, language: Language | None = None, session_id: int | None = None,
                session_name: str | None = None, venv_id: int | None = None,
                limit: int = 50, seq: int | None = None, *, outcome: str | None = None,
                state_mode: StateMode | None = None, text: str | None = None,
                after_seq: int | None = None) -> HistoryResult:
        """The newest ``limit`` calls in the log under ``root``, newest last (SPEC 11).

        Each record: ``seq, at, language, venv_id, session_id, session_name, state_mode,
        code, duration_ms, outcome`` (``"ok"`` or the ``error_type``) ``, state_lost``.
        Filters left as ``None`` match everything. Calls of every process that shares
        this ``root`` are listed. With ``seq``: ``{"call": {...}}``, that one call with
        everything its row keeps (stdout, stderr, result, error, suggestion, exit_code,
        isolation, changed, ...); ``not_found`` when the log no longer holds it.
        ``outcome`` (``"ok"``, an ``error_type``, ``"error"`` or ``"running"``),
        ``state_mode``, ``text`` (found in the code, output, result or error) and
        ``after_seq`` (newer calls only) narrow the list further, as the page does.
        """
        return cast(HistoryResult, managing.history(
            self, language, session_id, session_name, venv_id, limit, seq, outcome=outcome,
            state_mode=state_mode, text=text, after_seq=after_seq))

    def rebuild_session(self, language: Language = "python", session_id: int | None = None,
                        session_name: str | None = None,
                        venv_id: int | None = None, *, wait: float | None = None) -> RebuildResult:
        """Bring back a session whose state was lost (or that was closed) from the log.

        Replays into a fresh session, in order, the stateful calls that succeeded and
        built the lost state (since the session was created or last started over, up to
        the loss), stopping at the first that fails. Replayed code runs again: files it
        writes are written again. Works for a session of an earlier run under the same
        ``root`` too; with ``persist``, a kept session starts from its snapshot.

        ``wait`` (seconds > 0): as for :meth:`execute_code`, a rebuild still replaying
        then returns a ``running`` record; :meth:`wait_call` fetches its result.

        Returns:
            ``{"replayed": n, "failed_at": seq | None, "session": {...}, "calls": [seq...]}``
            (and ``"failure"``, the failed call's error, when ``failed_at`` is set);
            ``not_found`` when the log holds nothing of that session, ``validation`` with
            ``log=False`` or when nothing was lost.
        """
        asked = _where(language, session_id, session_name, venv_id)
        if wait is None and not self._calls.active:
            return cast(RebuildResult, watched("rebuild_session", asked, lambda: (
                managing.rebuild_session(self, language, session_id, session_name, venv_id))))
        return cast(RebuildResult, watched("rebuild_session", asked, lambda: self._calls.run(
            "rebuild_session", asked, "stateful",
            lambda output, event, record: managing.rebuild_session(
                self, language, session_id, session_name, venv_id, record),
            wait, None, None)))

    def serve_ui(self, port: int = 0, *, host: str = "127.0.0.1") -> UIResult:
        """Serve the page that shows this executor's sessions and call log (SPEC 11).

        Returns ``{"url": ...}``: open it in a browser; it carries the token once, and
        the browser then holds keys of the page's own (a cookie and a key in the page's
        storage), never the token. Loopback unless ``host`` says otherwise; the server
        stops with the executor. A second call returns the running page's URL.
        """
        from .ui.server import start_ui

        try:
            self._check_open()
            with self._lock:
                if self._ui is None:
                    self._ui = start_ui(self, host, port)
                return cast(UIResult, {"url": self._ui.url})
        except CoordexError as exc:
            return cast(UIResult, exc.to_dict())

    # ------------------------------------------------------------------ capabilities

    @overload
    def capability(self, fn: _F, *, name: str | None = None) -> _F: ...

    @overload
    def capability(self, fn: None = None, *, name: str | None = None) -> Callable[[_F], _F]: ...

    def capability(self, fn: Callable[..., Any] | None = None, *,
                   name: str | None = None) -> Any:
        """Register a host capability, visible as a global name in every Python session.

        Use as ``@ex.capability``, ``@ex.capability(name="lookup")`` or
        ``ex.capability(fn, name="lookup")``. Code in an environment calls it over one JSON
        line each way; arguments and results must be plain values there.
        """
        def register(func: Callable[..., Any]) -> Callable[..., Any]:
            cap_name = name or getattr(func, "__name__", None)
            if not isinstance(cap_name, str) or not cap_name.isidentifier():
                raise ValueError(f"capability name must be a Python identifier, got {cap_name!r}")
            with self._lock:
                self._capabilities[cap_name] = func
            places = self._places.all()
            for place in places:
                with contextlib.suppress(Exception):
                    place.capabilities_changed()
            return func

        if fn is not None:
            return register(fn)
        return register

    def call_capability(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        func = self._capabilities.get(name)
        if func is None:
            raise LookupError(f"no capability named {name!r}; registered: {sorted(self._capabilities)}")
        return func(*args, **kwargs)

    def _session_globals(self) -> dict[str, Any]:
        return {**self._capabilities, "functions": self.functions}

    # ------------------------------------------------------------------ environments & library

    @property
    def environments_manager(self) -> EnvironmentManager:
        with self._lock:
            if self._environments is None:
                from .environments.manager import EnvironmentManager

                self._environments = EnvironmentManager(self.root, build_timeout=self.build_timeout,
                                                        envs_dir=self._envs_dir)
            return self._environments

    @property
    def environments(self) -> Environments:
        """``create(spec, name=None)``, ``list()``, ``build(venv_id)``: dicts, never raising."""
        return Environments(lambda: self.environments_manager)

    def _require_environment(self, venv_id: int) -> None:
        if not self.environments_manager.exists(venv_id):
            listed = self.environments_manager.list().get("environments", [])
            raise messages.environment_not_found(
                venv_id, [(e["venv_id"], e.get("name")) for e in listed])

    @property
    def functions(self) -> FunctionLibrary:
        """The stored-function library (SPEC section 5)."""
        with self._lock:
            if self._functions is None:
                from .library.functions import FunctionLibrary

                self._functions = FunctionLibrary(
                    self, store=self._records.library_store() if self._records else None)
            library: FunctionLibrary = self._functions
            return library

    # ------------------------------------------------------------------ tool schemas

    def tool_definitions(self, format: ToolFormat = "openai",
                         strict: bool = False) -> list[dict[str, Any]]:
        """Tool definitions for ``"openai"``, ``"openai-responses"``, ``"anthropic"`` or ``"mcp"``.

        ``strict=True`` gives schemas OpenAI's strict mode accepts (every property
        required, optional ones nullable). ``null`` for an argument means "omitted" in
        every format. The descriptions name this executor's default call timeout.
        """
        from .tools import tool_definitions

        # A bad format or strict comes back as the validation error dict, as SPEC 2 has
        # every method do; the type says what a well-typed call gets.
        return cast(list[dict[str, Any]],
                    tool_definitions(format, strict=strict, default_timeout=self.timeout))

    def call_tool(self, name: str, arguments: dict[str, Any] | str | None = None) -> dict[str, Any]:
        """Route one tool call exactly as a model produced it; never raises.

        Args:
            name: the tool's name (``"execute_code"``, ``"list_sessions"``, ...).
            arguments: the argument dict, or its JSON text (as the OpenAI SDKs hand it
                over); ``null`` values mean "omitted".

        Returns:
            The same dict the MCP tool returns as structured content. An unknown tool
            is a ``not_found`` error whose suggestion names the nearest tool.
        """
        from .tools import route

        watch = watch_call(str(name))  # None unless someone observes (SPEC 16)
        if watch is None:
            return route(self, name, arguments)
        result: Any = None
        try:
            result = route(self, name, arguments)
        finally:
            watch.done(arguments if isinstance(arguments, dict) else None, result)
            watch.close()
        return cast(dict[str, Any], result)

    # ------------------------------------------------------------------ library hooks

    def run_function_code(self, code: str, *, state_mode: StateMode, session_id: int | None,
                          session_name: str | None, venv_id: int | None,
                          timeout: float | None, on_output: OutputCallback | None,
                          output_limit: int,
                          on_progress: Callable[[str], None] | None = None,
                          recorded: Recorded | None = None) -> dict[str, Any]:
        """``execute_code`` of Python for a stored-function call (the library's
        :class:`~coordex.library.functions.FunctionRunner`).

        Same validation, registry, capacity and isolation, with two differences: the
        output limit may be larger (the function's value comes back in ``result``), and
        a call from code running in the very session it names (plan code calling
        ``functions.f.stateful()(...)``) runs there at once instead of waiting for that
        session's lock, which the outer call holds. ``recorded``: the call record
        (SPEC 14) of a ``call_function`` given ``wait``: ``cancel_call`` reaches the code
        through it, and the call's log row carries its ``call_id``.
        """
        return calling.execute(self, code, "python", state_mode, session_id, session_name,
                               venv_id, timeout, on_output, on_progress,
                               recorded.cancel if recorded is not None else None,
                               max(output_limit, self.output_limit), nested=True,
                               recorded=recorded)


# An Executor forgotten without close() still ends its processes at interpreter exit.
_LIVE: weakref.WeakSet[Executor] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for executor in list(_LIVE):
        with contextlib.suppress(Exception):
            executor.close()


def _working_folder(root: Path) -> str:
    """The folder sessions start in: this process's (its root's, if that is gone)."""
    try:
        return os.getcwd()
    except OSError:
        return str(root)
