"""The Executor: the one orchestrator behind every front end.

``execute_code`` validates the coordinate (pure core), resolves or reserves the session
in the registry, hands the code to the backend for that place (own interpreter, a
worker in an environment, a bash shell) and shapes the outcome into the SPEC result or
error dict. The registry is guarded by one lock; each session has its own lock so calls
to one session are serialised while different sessions run in parallel.

Nothing here raises for bad input: every failure is returned as an error dict.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .backends import isolation  # imported here, not in the fork: saves ~2 ms a call
from .backends.base import SESSION_CWD, Outcome, OutputCallback, RunRequest
from .backends.own_interpreter import NamespaceSession, OwnInterpreter
from .core import coordinates as coords
from .core.coordinates import Coordinate, SessionKey
from .core.errors import CoordexError, make_error, validation
from .core.registry import PLAN_KEY, SessionRegistry
from .core.results import DEFAULT_OUTPUT_LIMIT, session_record, success

_INSPECT_REPR_LIMIT = 200


def default_root() -> Path:
    """``COORDEX_HOME`` if set, else the user data dir for "coordex"."""
    env = os.environ.get("COORDEX_HOME")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("coordex", appauthor=False))


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

    Every method returns a JSON-serialisable dict and never raises for bad arguments.
    Use as a context manager, or call :meth:`close`: it ends every process it started.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None, max_sessions: int = 20,
                 timeout: float = 60.0, *, build_timeout: float = 900.0,
                 output_limit: int = DEFAULT_OUTPUT_LIMIT,
                 read_only_paths: list[str] | None = None,
                 envs_dir: str | os.PathLike[str] | None = None) -> None:
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
        self._lock = threading.RLock()
        self._registry = SessionRegistry(max_sessions, now=time.time())
        self._own = OwnInterpreter()
        self._capabilities: dict[str, Callable[..., Any]] = {}
        self.plan_namespace: dict[str, Any] = {"__name__": "__main__"}
        import builtins

        self.plan_namespace["__builtins__"] = builtins
        self._sessions: dict[SessionKey, Any] = {PLAN_KEY: self._own.new_session(self.plan_namespace)}
        self._session_locks: dict[SessionKey, threading.Lock] = {PLAN_KEY: threading.Lock()}
        self._templates: dict[int, Any] = {}
        self._environments: Any = None
        self._functions: Any = None
        self._closed = False
        self._progress = _Progress()
        self._inject_globals(self._sessions[PLAN_KEY])
        _LIVE.add(self)

    # ------------------------------------------------------------------ context manager

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End every process this executor started (shells, workers, templates)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sessions = list(self._sessions.values())
            templates = list(self._templates.values())
            self._sessions.clear()
            self._templates.clear()
        for backend in sessions + templates:
            if not isinstance(backend, NamespaceSession):
                with contextlib.suppress(Exception):
                    backend.close()
        self._own.close()
        if self._functions is not None:
            with contextlib.suppress(Exception):
                self._functions.close()
        if self._environments is not None:
            with contextlib.suppress(Exception):
                self._environments.close()

    # ------------------------------------------------------------------ execute_code

    def execute_code(self, code: str, language: str = "python", state_mode: str = "stateless",
                     session_id: int | None = None, session_name: str | None = None,
                     venv_id: int | None = None, timeout: float | None = None,
                     on_output: OutputCallback | None = None, *,
                     on_progress: Callable[[str], None] | None = None,
                     cancel: threading.Event | None = None) -> dict[str, Any]:
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
            cancel: an event a front end sets when its request is cancelled; code in the
                agent's own interpreter is then interrupted as on a timeout (bash and
                environment calls run until their own timeout).
        """
        return self._execute(code, language, state_mode, session_id, session_name, venv_id,
                             timeout, on_output, on_progress, cancel, self.output_limit,
                             nested=False)

    def _execute(self, code: Any, language: Any, state_mode: Any, session_id: Any,
                 session_name: Any, venv_id: Any, timeout: Any, on_output: Any,
                 on_progress: Callable[[str], None] | None, cancel: threading.Event | None,
                 output_limit: int, *, nested: bool) -> dict[str, Any]:
        """The body of every call: validate, run where the coordinate says, shape.

        ``nested`` marks a stored-function call, which may come from code running in the
        very session it names (see :meth:`_library_active_session`).
        """
        started = time.perf_counter()
        coordinate: Coordinate | None = None
        try:
            code = coords.check_code(code)
            coordinate = coords.check_coordinate(language, state_mode, session_id,
                                                 session_name, venv_id)
            limit = coords.check_timeout(timeout) or self.timeout
            if on_output is not None and not callable(on_output):
                raise validation("on_output must be a callable taking (stream, text).",
                                 "Pass a function like lambda stream, text: ..., or None.")
            self._check_open()
            request = RunRequest(code, limit, on_output, output_limit, cancel=cancel)
            self._progress.callback = on_progress
            active = self._library_active_session(coordinate) if nested else None
            if active is None:
                outcome, session = self._dispatch(coordinate, request)
            else:
                outcome, session = self._run_in_active(active, coordinate, request)
        except CoordexError as exc:
            return _error_record(exc, coordinate, started)
        return self._shape(outcome, session, coordinate, started)

    def _dispatch(self, coordinate: Coordinate, request: RunRequest) -> tuple[Outcome, dict[str, Any]]:
        if coordinate.venv_id is not None:
            self._require_environment(coordinate.venv_id)
        if coordinate.state_mode == "stateless":
            where = session_record(coordinate.language, coordinate.venv_id, None, None)
            return self._run_stateless(coordinate, request), where
        if coordinate.state_mode == "stateful":
            return self._run_stateful(coordinate, request)
        return self._run_read_only(coordinate, request)

    def _run_stateless(self, coordinate: Coordinate, request: RunRequest) -> Outcome:
        if coordinate.language == "bash":
            from .backends.shell import run_stateless

            return dict(run_stateless(request, env=self._bash_env(coordinate.venv_id)))
        if coordinate.venv_id is None:
            return self._own.run_stateless(request, self._session_globals())
        template = self._template(coordinate.venv_id)
        return dict(template.run_stateless(request))

    def _run_stateful(self, coordinate: Coordinate,
                      request: RunRequest) -> tuple[Outcome, dict[str, Any]]:
        with self._lock:
            key, created = self._registry.resolve_or_reserve(coordinate, time.time())
            lock = self._session_locks.setdefault(key, threading.Lock())
        record = self._session_record(key)
        if not lock.acquire(timeout=request.timeout):
            return _busy_outcome(), record
        try:
            try:
                backend = self._sessions.get(key)
                if backend is None:
                    backend = self._start_session(key)
            except BaseException as exc:
                if created:  # never leave a reserved session without a process
                    with self._lock:
                        self._forget(key)
                if isinstance(exc, OSError):
                    raise CoordexError(
                        "crashed", f"Could not start the {key.language} session: {exc}.",
                        "Check that the program exists and the machine has free processes "
                        "and memory, then run the call again.", state_lost=True) from exc
                raise
            with self._lock:
                call = self._registry.begin_call(key, time.time())
                self._registry.move(key, "busy")
            try:
                if isinstance(backend, NamespaceSession):
                    outcome = self._own.run(backend, request)
                else:
                    outcome = dict(backend.run(request))
            finally:
                with self._lock:
                    if key in self._registry:
                        self._registry.move(key, "idle")
            with self._lock:
                self._registry.record_bindings(key, call, outcome.pop("rebound", ()),
                                               outcome.pop("deleted", ()))
            return outcome, record
        finally:
            lock.release()

    def _run_read_only(self, coordinate: Coordinate,
                       request: RunRequest) -> tuple[Outcome, dict[str, Any]]:
        with self._lock:
            key = self._registry.require(coordinate)
            backend = self._sessions.get(key)
            lock = self._session_locks.setdefault(key, threading.Lock())
        record = self._session_record(key)
        if backend is None:
            raise self._registry.not_found(coordinate)
        if not lock.acquire(timeout=request.timeout):
            return _busy_outcome(), record
        try:
            with self._lock:
                self._registry.begin_call(key, time.time())
            with self._protected(request) as protected:
                if isinstance(backend, NamespaceSession):
                    outcome = self._own_read_only(backend, protected)
                else:
                    outcome = dict(backend.run_read_only(protected))
            outcome.pop("rebound", None)
            outcome.pop("deleted", None)
            return outcome, record
        finally:
            lock.release()

    def _own_read_only(self, session: NamespaceSession, request: RunRequest) -> Outcome:
        scratch, paths = request.scratch, request.protect_paths
        isolation.best_mode()  # probe once and load libc here, not in every fork child

        def protect() -> str:  # in the fork child, after it entered the session's cwd
            return "none" if scratch is None else str(isolation.protect(paths, scratch))

        # Capabilities the copy calls run here, in the agent's process (SPEC section 1).
        return self._own.run_read_only(session, request, protect, _CapabilityBridge(self))

    @contextlib.contextmanager
    def _protected(self, request: RunRequest) -> Iterator[RunRequest]:
        """``request`` with a fresh scratch folder and the folders to protect (SPEC
        guarantee 3); the scratch folder is removed when the call is over."""
        scratch = tempfile.mkdtemp(prefix="coordex-ro-")
        try:
            yield dataclasses.replace(request, protect_paths=self._protect_paths(),
                                      scratch=scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _protect_paths(self) -> tuple[str, ...]:
        # Backends resolve SESSION_CWD against the session's own cwd where the copy runs.
        if self.read_only_paths is not None:
            return tuple(self.read_only_paths)
        return (SESSION_CWD, os.path.expanduser("~"))

    def _shape(self, outcome: Outcome, session: dict[str, Any], coordinate: Coordinate,
               started: float) -> dict[str, Any]:
        error = outcome.pop("error", None)
        if error is not None:
            record = dict(error)
            record.setdefault("session", session)
            record.setdefault("state_mode", coordinate.state_mode)
            for key in ("isolation", "retried"):
                if key in outcome and key not in record:
                    record[key] = outcome[key]
            if outcome.get("images"):
                record.setdefault("images", outcome["images"])
            if coordinate.state_mode == "read_only":
                # Nothing ran (the session was busy): no copy was made, nothing is claimed.
                record.setdefault("isolation", {"names": True, "objects": True, "files": "none",
                                                "copy": "none"})
            if outcome.get("state_lost"):
                record["state_lost"] = True
            record["duration_ms"] = _ms(started)
            return record
        extra = {k: v for k, v in outcome.items()
                 if k not in ("stdout", "stderr", "truncated", "result", "exit_code", "images")}
        return success(stdout=outcome.get("stdout", ""), stderr=outcome.get("stderr", ""),
                       truncated=bool(outcome.get("truncated")), result=outcome.get("result"),
                       exit_code=outcome.get("exit_code"), images=outcome.get("images") or [],
                       session=session, state_mode=coordinate.state_mode,
                       duration_ms=_ms(started), **extra)

    # ------------------------------------------------------------------ session backends

    def _start_session(self, key: SessionKey) -> Any:
        if key.language == "bash":
            from .backends.shell import ShellSession

            backend: Any = ShellSession(env=self._bash_env(key.venv_id))
        elif key.venv_id is None:
            backend = self._own.new_session()
            self._inject_globals(backend)
        else:
            from .backends.workers import WorkerSession

            python = self.environments_manager.python_for(key.venv_id, self._progress.emit)
            backend = WorkerSession(python, env=self._worker_env(key.venv_id),
                                    capabilities=_CapabilityBridge(self))
        with self._lock:
            if self._closed:
                if not isinstance(backend, NamespaceSession):
                    backend.close()
                raise _closed_error()
            self._sessions[key] = backend
            self._registry.move(key, "idle")
        return backend

    def _template(self, venv_id: int) -> Any:
        with self._lock:
            template = self._templates.get(venv_id)
        if template is not None:
            return template
        from .backends.workers import WorkerTemplate

        python = self.environments_manager.python_for(venv_id, self._progress.emit)
        template = WorkerTemplate(python, env=self._worker_env(venv_id),
                                  capabilities=_CapabilityBridge(self))
        with self._lock:
            existing = self._templates.get(venv_id)
            if existing is None and not self._closed:
                self._templates[venv_id] = template
                return template
        template.close()
        if existing is None:
            raise _closed_error()
        return existing

    def _bash_env(self, venv_id: int | None) -> dict[str, str] | None:
        """The environment for bash: the host's, or with ``venv_id`` activated."""
        if venv_id is None:
            return None
        # Built on first use for bash too: activating a folder that does not exist yet
        # would silently leave the host's python first on PATH.
        self.environments_manager.python_for(venv_id, self._progress.emit)
        return self._worker_env(venv_id)

    def _worker_env(self, venv_id: int) -> dict[str, str]:
        env = dict(os.environ)
        env_dir = self.environments_manager.env_dir(venv_id)
        if env_dir is not None:
            env["VIRTUAL_ENV"] = str(env_dir)
            env["PATH"] = str(Path(env_dir) / "bin") + os.pathsep + env.get("PATH", "")
            env.pop("PYTHONHOME", None)
        return env

    def _forget(self, key: SessionKey) -> None:
        if key in self._registry and key != PLAN_KEY:
            self._registry.remove(key)
        self._sessions.pop(key, None)
        self._session_locks.pop(key, None)

    def _session_record(self, key: SessionKey) -> dict[str, Any]:
        entry = self._registry.get(key)
        name = entry.name if entry is not None else None
        return session_record(key.language, key.venv_id, key.session_id, name)

    def _check_open(self) -> None:
        if self._closed:
            raise _closed_error()

    # ------------------------------------------------------------------ sessions API

    def list_sessions(self) -> dict[str, Any]:
        """All open sessions with their provenance, and the cap (none once closed)."""
        with self._lock:
            records: list[dict[str, Any]] = []
            if self._closed:
                return {"sessions": records, "max_sessions": self._registry.max_sessions}
            for entry in self._registry.entries():
                record = entry.record()
                backend = self._sessions.get(entry.key)
                if backend is not None and not isinstance(backend, NamespaceSession):
                    with contextlib.suppress(Exception):
                        record["alive"] = bool(backend.alive())
                records.append(record)
            return {"sessions": records, "max_sessions": self._registry.max_sessions}

    def inspect_session(self, language: str = "python", session_id: int | None = None,
                        session_name: str | None = None,
                        venv_id: int | None = None) -> dict[str, Any]:
        """What a session holds. Without a session: session 0 of that place.

        Python: ``{"names": [{"name","type","repr","bound_at_call","calls_ago"}], ...}``
        with capabilities and ``functions`` listed apart. Bash: ``{"cwd", "variables",
        "functions", "aliases"}`` — only what the session added. Changes nothing.
        """
        try:
            coordinate = coords.check_coordinate(language, "stateful", session_id,
                                                 session_name, venv_id)
            self._check_open()
            with self._lock:
                key = self._registry.require(coordinate)
                backend = self._sessions.get(key)
                lock = self._session_locks.setdefault(key, threading.Lock())
            if backend is None:
                raise self._registry.not_found(coordinate)
            if not lock.acquire(timeout=self.timeout):
                return _busy_outcome()["error"]
            try:
                if isinstance(backend, NamespaceSession):
                    report = self._inspect_namespace(backend)
                else:
                    report = dict(backend.inspect())
            finally:
                lock.release()
            if "error_type" in report:
                return report
            if key.language == "python":
                with self._lock:
                    for item in report.get("names", []):
                        bound, ago = self._registry.provenance(key, item["name"])
                        item["bound_at_call"], item["calls_ago"] = bound, ago
                report.setdefault("capabilities", sorted(self._capabilities))
            report["session"] = self._session_record(key)
            return report
        except CoordexError as exc:
            return exc.to_dict()

    def _inspect_namespace(self, session: NamespaceSession) -> dict[str, Any]:
        from .worker._coordex_engine import safe_repr

        names = []
        for name, value in list(session.namespace.items()):
            if name.startswith("__") or name == "_" or name in session.injected:
                continue
            names.append({"name": name, "type": type(value).__name__,
                          "repr": safe_repr(value, _INSPECT_REPR_LIMIT)})
        names.sort(key=lambda item: item["name"])
        return {"names": names, "functions": "functions" in session.injected}

    def close_session(self, language: str = "python", session_id: int | None = None,
                      session_name: str | None = None,
                      venv_id: int | None = None) -> dict[str, Any]:
        """Close one session and end its process. Needs a session; never session 0 of
        the own interpreter's Python (the plan namespace)."""
        try:
            coordinate = coords.check_coordinate(language, "stateful", session_id,
                                                 session_name, venv_id)
            self._check_open()
            if not coordinate.names_session:
                raise validation(
                    "close_session needs a session: pass session_id or session_name.",
                    "Call list_sessions() to see open sessions, then close_session("
                    "language=..., session_name='...') or session_id=<int>.")
            with self._lock:
                key = self._registry.require(coordinate)
                record = self._session_record(key)
                self._registry.remove(key)  # raises validation for the plan namespace
                backend = self._sessions.pop(key, None)
                self._session_locks.pop(key, None)
            if backend is not None and not isinstance(backend, NamespaceSession):
                backend.close()
            return {"closed": True, "session": record}
        except CoordexError as exc:
            return exc.to_dict()

    # ------------------------------------------------------------------ capabilities

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
                for backend in self._sessions.values():
                    if isinstance(backend, NamespaceSession):
                        backend.namespace[cap_name] = func
                        backend.injected.add(cap_name)
                workers = [b for b in self._sessions.values()
                           if not isinstance(b, NamespaceSession) and hasattr(b, "refresh_capabilities")]
            for worker in workers:
                with contextlib.suppress(Exception):
                    worker.refresh_capabilities()
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

    def _inject_globals(self, session: NamespaceSession) -> None:
        extra = self._session_globals()
        session.namespace.update(extra)
        session.injected.update(extra)

    # ------------------------------------------------------------------ environments & library

    @property
    def environments_manager(self) -> Any:
        with self._lock:
            if self._environments is None:
                from .environments.manager import EnvironmentManager

                self._environments = EnvironmentManager(self.root, build_timeout=self.build_timeout,
                                                        envs_dir=self._envs_dir)
            return self._environments

    @property
    def environments(self) -> Environments:
        """``create(spec, name=None)``, ``list()``, ``build(venv_id)``: dicts, never raising."""
        return Environments(self)

    def _require_environment(self, venv_id: int) -> None:
        if not self.environments_manager.exists(venv_id):
            listed = self.environments_manager.list().get("environments", [])
            known = ", ".join(f"{e['venv_id']}" + (f" ({e['name']!r})" if e.get("name") else "")
                              for e in listed) or "none yet"
            raise CoordexError(
                "not_found", f"No environment with venv_id={venv_id}.",
                f"Existing environments: {known}. Create one with environments.create(spec) "
                "(MCP: create_environment) and use the venv_id it returns, or venv_id=None for "
                "the agent's own interpreter.")

    @property
    def functions(self) -> Any:
        """The stored-function library (SPEC section 5)."""
        with self._lock:
            if self._functions is None:
                from .library.functions import FunctionLibrary

                self._functions = FunctionLibrary(self)
            return self._functions

    # ------------------------------------------------------------------ tool schemas

    def tool_definitions(self, format: str = "openai") -> Any:
        """Tool definitions for ``"openai"``, ``"anthropic"`` or ``"mcp"``."""
        from .tools import tool_definitions

        return tool_definitions(format)

    # ------------------------------------------------------------------ library hooks

    def _library_execute(self, code: str, *, state_mode: str, session_id: int | None,
                         session_name: str | None, venv_id: int | None,
                         timeout: float | None, on_output: OutputCallback | None,
                         output_limit: int,
                         on_progress: Callable[[str], None] | None = None) -> dict[str, Any]:
        """``execute_code`` of Python for a stored-function call (``coordex.library``).

        Same validation, registry, capacity and isolation, with two differences: the
        output limit may be larger (the function's value comes back in ``result``), and
        a call from code running in the very session it names (plan code calling
        ``functions.f.stateful()(...)``) runs there at once instead of waiting for that
        session's lock, which the outer call holds.
        """
        return self._execute(code, "python", state_mode, session_id, session_name, venv_id,
                             timeout, on_output, on_progress, None,
                             max(output_limit, self.output_limit), nested=True)

    def _run_in_active(self, active: tuple[SessionKey, NamespaceSession, Any],
                       coordinate: Coordinate,
                       request: RunRequest) -> tuple[Outcome, dict[str, Any]]:
        key, session, runner = active
        if coordinate.state_mode == "read_only":
            # A view of the live session (its runner is busy with the outer call, so the
            # session itself reads as stuck); the fork copies it as it is.
            view = self._own.new_session(session.namespace)
            with self._protected(request) as protected:
                outcome = self._own_read_only(view, protected)
        else:  # nested: runs inline on this thread, inside the outer call
            outcome = self._own._run_on(runner, session, session.namespace, request)
        return outcome, self._session_record(key)

    def _library_active_session(self, coordinate: Coordinate) -> tuple[
            SessionKey, NamespaceSession, Any] | None:
        """The own-interpreter session ``coordinate`` names if this thread is running
        code in it right now (its namespace is the globals of a frame on the stack)."""
        import sys

        from .backends import own_interpreter

        if coordinate.venv_id is not None or coordinate.state_mode == "stateless":
            return None
        if not getattr(own_interpreter._local, "in_call", False):
            return None
        with self._lock:
            key = self._registry.find(coordinate)
            backend = self._sessions.get(key) if key is not None else None
        if key is None or not isinstance(backend, NamespaceSession) or backend.runner is None:
            return None
        frame: Any = sys._getframe(1)
        while frame is not None:
            if frame.f_globals is backend.namespace:
                return key, backend, backend.runner
            frame = frame.f_back
        return None


class Environments:
    """``ex.environments``: a thin dict-returning facade over the environment manager."""

    def __init__(self, executor: Executor) -> None:
        self._executor = executor

    def create(self, spec: str, name: str | None = None) -> dict[str, Any]:
        return self._guard(lambda m: m.create(spec, name))

    def list(self) -> dict[str, Any]:
        return self._guard(lambda m: m.list())

    def build(self, venv_id: int, on_progress: Callable[[str], None] | None = None) -> dict[str, Any]:
        return self._guard(lambda m: m.build(venv_id, on_progress=on_progress))

    def remove_unused(self) -> dict[str, Any]:
        """Delete built environment folders that no stored environment refers to."""
        return self._guard(lambda m: m.remove_unused())

    def _guard(self, action: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
        try:
            return dict(action(self._executor.environments_manager))
        except CoordexError as exc:
            return exc.to_dict()


class _Progress(threading.local):
    """The build-progress callback of the call running on this thread."""

    callback: Callable[[str], None] | None = None

    def emit(self, line: str) -> None:
        if self.callback is not None:
            with contextlib.suppress(Exception):
                self.callback(line)


class _CapabilityBridge:
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


def _busy_outcome() -> Outcome:
    return {"stdout": "", "stderr": "", "truncated": False, "result": None, "exit_code": None,
            "images": [],
            "error": make_error(
                "timeout", "The session stayed busy with another call for the whole timeout.",
                "Nothing ran and no state changed. Retry later, pass a larger timeout=, or use "
                "another session.", stdout="", stderr="", state_lost=False)}


def _closed_error() -> CoordexError:
    return CoordexError("validation", "This Executor is closed.",
                        "Create a new Executor (with Executor(...) as ex: ...) and call it.")


# An Executor forgotten without close() still ends its processes at interpreter exit.
_LIVE: weakref.WeakSet[Executor] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for executor in list(_LIVE):
        with contextlib.suppress(Exception):
            executor.close()


def _error_record(exc: CoordexError, coordinate: Coordinate | None,
                  started: float) -> dict[str, Any]:
    record = exc.to_dict()
    if coordinate is not None:
        record.setdefault("state_mode", coordinate.state_mode)
    record["duration_ms"] = _ms(started)
    return record


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000.0, 3)
