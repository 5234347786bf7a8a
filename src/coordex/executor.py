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
import dataclasses
import functools
import itertools
import os
import shutil
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

from . import branches, sessions, spill
from .backends._reap import keeper as _process_keeper
from .backends.base import SESSION_CWD, Outcome, OutputCallback, Place, RunRequest, Session, empty_outcome
from .backends.env import EnvironmentPlace
from .backends.own import OwnPlace, OwnSession
from .core import coordinates as coords
from .core import messages
from .core.bindings import bound_names
from .core.coordinates import Coordinate, SessionKey
from .core.errors import CoordexError, validation
from .core.registry import PLAN_KEY
from .core.results import DEFAULT_OUTPUT_LIMIT, session_record, success
from .core.root import default_root
from .core.shapes import (
    CheckpointList,
    CheckpointResult,
    CloseResult,
    EnvironmentBuilt,
    EnvironmentCreated,
    EnvironmentList,
    EnvironmentShown,
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
from .log import LOG_FILE, CallLog
from .log.calls import log_off_error, note_changes, record_call
from .log.detached import _current as _recorded_call
from .log.running import RunningCalls, where
from .long_work import LongWork
from .long_work import error_record as _error_record
from .long_work import ms as _ms
from .observe.hook import call_env, watch_call
from .sessions import SessionTable

if TYPE_CHECKING:
    from .library.functions import FunctionLibrary

PlaceKey = tuple[str, int | None]
_F = TypeVar("_F", bound=Callable[..., Any])


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
                 environments_manager: Any = None, records: Any = None,
                 persist: bool = False, snapshot_interval: float = 30.0,
                 persist_max_bytes: int = 2**31) -> None:
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
        self._cluster: Any = self._join_cluster(cluster) if cluster is not None else None
        self._lock = threading.RLock()
        self._capabilities: dict[str, Callable[..., Any]] = {}
        self._environments: Any = environments_manager
        self._functions: Any = None
        # Where the call log and the function store are written when not under root by
        # this process (a confined host's owner writes them: hosting/records).
        self._records = records
        self._progress = _Progress()
        import builtins

        self.plan_namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        self._own_place = OwnPlace(self._session_globals, _CapabilityBridge(self),
                                   inline=bool(own_on_caller_thread))
        self._places: dict[PlaceKey, Place] = {("python", None): self._own_place}
        self._table = SessionTable(max_sessions,
                                   self._own_place.open_session(self.plan_namespace))
        self._call_log = self._open_call_log(log, log_max_rows)
        self._persist = self._open_persistence(persist, snapshot_interval, persist_max_bytes)
        self._persist_max_bytes = int(persist_max_bytes)
        # Calls in flight, for the page (SPEC 11): their output so far, and interrupt.
        self.running_calls = RunningCalls(
            self._call_log.reserve if self._call_log is not None else None)
        # Calls given ``wait`` (SPEC 14): wait_call, cancel_call, busy, join, redelivery.
        self._calls = LongWork(self._table, self._call_log, self._check_open, self.root)
        self._ui: Any = None
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
        if self._persist is not None and not self._table.closed:
            with contextlib.suppress(Exception):
                self._persist.close()
        sessions = self._table.drain()
        with self._lock:
            places = list(self._places.values())
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
        watch = watch_call("execute_code")  # None unless someone observes (SPEC 16)
        if watch is None:
            return self._execute_code(code, language, state_mode, session_id, session_name,
                                      venv_id, timeout, on_output, on_progress, cancel, wait)
        result: Any = None
        try:
            result = self._execute_code(code, language, state_mode, session_id, session_name,
                                        venv_id, timeout, on_output, on_progress, cancel, wait)
        finally:
            watch.done({"code": code, "language": language, "state_mode": state_mode,
                        "session_id": session_id, "session_name": session_name,
                        "venv_id": venv_id}, result)
            watch.close()
        return cast(RunResult, result)

    def _execute_code(self, code: Any, language: Any, state_mode: Any, session_id: Any,
                      session_name: Any, venv_id: Any, timeout: Any,
                      on_output: OutputCallback | None, on_progress: Any,
                      cancel: threading.Event | None, wait: Any) -> RunResult:
        if wait is None and not self._calls.active:
            if cancel is None and (record := getattr(_recorded_call, "record", None)):
                cancel = record.cancel  # a recorded call's own calls (a rebuild's replays)
            return cast(RunResult, self._execute(
                code, language, state_mode, session_id, session_name, venv_id, timeout,
                on_output, on_progress, cancel, self.output_limit, nested=False))
        asked = {"code": code, "language": language, "state_mode": state_mode,
                 "session_id": session_id, "session_name": session_name, "venv_id": venv_id,
                 "timeout": timeout}

        def run(output: OutputCallback | None, event: threading.Event | None) -> dict[str, Any]:
            return self._execute(code, language, state_mode, session_id, session_name,
                                 venv_id, timeout, output, on_progress, event,
                                 self.output_limit, nested=False)

        return cast(RunResult, self._calls.run("execute_code", asked, state_mode, run, wait,
                                              on_output, cancel))

    # ------------------------------------------------------------------ long work (SPEC 14)

    def run_recorded(self, tool: str, arguments: dict[str, Any],
                     run: Callable[[OutputCallback | None, threading.Event | None],
                                   dict[str, Any]],
                     wait: float | None, on_output: OutputCallback | None = None,
                     cancel: threading.Event | None = None) -> dict[str, Any]:
        """For front ends: run one tool call (``run(on_output, cancel)``) through the
        call record of SPEC 14, as ``execute_code`` runs with ``wait``: ``busy`` for a
        session a detached call holds, joined to an identical running call, a held
        result redelivered, else run and waited for at most ``wait`` seconds."""
        if wait is None and not self._calls.active:
            return run(on_output, cancel)
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
        return self._calls.wait_call(call_id, wait)

    def cancel_call(self, call_id: str) -> dict[str, Any]:
        """Interrupt a call that returned ``running`` as ``cancel`` does (state kept;
        killed only if it ignores the interrupt past the grace period) and return its
        final result, ``call_id`` added. An ended call: its result, unchanged."""
        return self._calls.cancel_call(call_id)

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

    def _execute(self, code: Any, language: Any, state_mode: Any, session_id: Any,
                 session_name: Any, venv_id: Any, timeout: Any, on_output: Any,
                 on_progress: Callable[[str], None] | None, cancel: threading.Event | None,
                 output_limit: int, *, nested: bool) -> dict[str, Any]:
        """The body of every call: validate, run where the coordinate says, shape.

        ``nested`` marks a stored-function call, which may come from code running in the
        very session it names (see :meth:`_active_session`).
        """
        started = time.perf_counter()
        coordinate: Coordinate | None = None
        seq: int | None = None  # the call's log row, where one was reserved while it ran
        tee: spill.Tee | None = None  # a stored function's inner call is fitted by its caller
        try:
            code = coords.check_code(code)
            coordinate = coords.check_coordinate(language, state_mode, session_id,
                                                 session_name, venv_id)
            limit = coords.check_timeout(timeout) or self.timeout
            if on_output is not None and not callable(on_output):
                raise validation("on_output must be a callable taking (stream, text).",
                                 "Pass a function like lambda stream, text: ..., or None.")
            self._check_open()
            if cancel is None and self._ui is not None:  # the page may interrupt it
                cancel = threading.Event()
            running = self.running_calls.start(
                where(coordinate.language, coordinate.venv_id, coordinate.session_id,
                      coordinate.session_name, coordinate.state_mode), code, cancel, on_output)
            running.recorded = getattr(_recorded_call, "record", None)
            if not nested:
                tee = spill.Tee(self.spill_folder, output_limit, running.output)
            try:
                request = RunRequest(code, limit, tee or running.output, output_limit,
                                     cancel=cancel, env=call_env(),
                                     value_limit=None if nested else spill.VALUE_KEEP_CHARS)
                self._progress.callback = running.progress(on_progress)  # the page sees builds
                active = self._active_session(coordinate) if nested else None
                if active is None:
                    outcome, session = self._dispatch(coordinate, request)
                else:
                    outcome, session = self._run_in_active(active, coordinate, request)
            finally:
                seq = self.running_calls.finish(running)
        except CoordexError as exc:
            result = _error_record(exc, coordinate, started)
        else:
            result = self._shape(outcome, session, coordinate, started)
            if running.interrupted:  # a person stopped it from the page
                result = messages.stopped_by(result, "person")
            elif cancel is not None and cancel.is_set():  # its caller cancelled it
                result = messages.stopped_by(result, "caller")
        if tee is not None:
            result = tee.finish(result, output_limit)
        asked = None if coordinate is not None else (language, state_mode, session_id,
                                                      session_name, venv_id)
        result = record_call(self._call_log, result, code, coordinate, seq, asked)
        if self._persist is not None and coordinate is not None and \
                coordinate.state_mode == "stateful":
            from .log.calls import last_row

            self._persist.after_call(result, last_row())
        return result

    def _dispatch(self, coordinate: Coordinate, request: RunRequest) -> tuple[Outcome, dict[str, Any]]:
        if coordinate.venv_id is not None:
            self._require_environment(coordinate.venv_id)
        if coordinate.state_mode == "stateless":
            where = session_record(coordinate.language, coordinate.venv_id, None, None)
            place = self._place(coordinate.language, coordinate.venv_id)
            return sessions.attempts(place, "stateless", place.run_stateless, request), where
        if coordinate.state_mode == "stateful":
            return self._run_stateful(coordinate, request)
        return self._run_read_only(coordinate, request)

    def _run_stateful(self, coordinate: Coordinate,
                      request: RunRequest) -> tuple[Outcome, dict[str, Any]]:
        if self._persist is not None:
            self._claim_kept(coordinate)
        with self._table.stateful(coordinate, request.timeout, request.cancel,
                                  self._open_session) as (key, session, call):
            record = self._table.record(key)
            if session is None:
                return _busy_outcome(), record
            outcome: Outcome = {}
            place = self._place(key.language, key.venv_id)
            restored = None
            if self._persist is not None and call == 1:  # before the call's code runs
                restored = self._persist.restore(key, record, session, self.timeout * 5)
            try:
                outcome = self._table.run(key, place, "stateful", session.run, request)
                if restored is not None and restored.get("state_lost"):
                    outcome["state_lost"] = True  # kept, but nothing could be restored
                    if outcome.get("error"):
                        outcome["error"]["state_lost"] = True
                elif restored is not None:
                    outcome["restored"] = restored
                if key.language == "python" and "error" not in outcome:
                    # ``x = 41`` again is a rebinding though the object is the same one.
                    outcome["rebound"] = list(dict.fromkeys(
                        [*(outcome.get("rebound") or ()), *bound_names(request.code)]))
                if self._call_log is not None:
                    note_changes(outcome.get("rebound"), outcome.get("deleted"))
                if self._persist is not None:
                    self._persist.note(call, key.language == "bash" or any(
                        name != "_" for name in [*(outcome.get("rebound") or ()),
                                                 *(outcome.get("deleted") or ())]))
            finally:
                self._table.finish(key, call, outcome)
            return outcome, record

    def _claim_kept(self, coordinate: Coordinate) -> None:
        """A kept session named in ``coordinate`` and not yet restored gets its old id;
        a new named session never takes the id of one still kept."""
        assert self._persist is not None
        if coordinate.session_name is None:
            return
        kept = self._persist.find_waiting(coordinate.language, coordinate.venv_id, None,
                                          coordinate.session_name)
        taken = self._persist.kept_ids(coordinate.language, coordinate.venv_id)
        if kept is None and not taken:
            return
        with self._table.lock:
            registry = self._table.registry
            if registry.find(coordinate) is not None:
                return
            held = {e.key.session_id for e in registry.entries()
                    if (e.key.language, e.key.venv_id) == (coordinate.language, coordinate.venv_id)}
            if kept is not None and kept.session_id not in held:
                sid = kept.session_id
            else:
                sid = next(i for i in itertools.count(1) if i not in held | taken)
            key = SessionKey(coordinate.language, coordinate.venv_id, sid)
            if key not in registry:
                with contextlib.suppress(CoordexError):  # capacity: said by the call itself
                    registry.reserve(key, coordinate.session_name, time.time())

    def _open_persistence(self, persist: bool, interval: float, max_bytes: int) -> Any:
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval < 0:
            raise ValueError(f"snapshot_interval must be a number of seconds >= 0, got {interval!r}")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"persist_max_bytes must be an integer >= 1, got {max_bytes!r}")
        if not persist:
            return None
        from .persist import Persistence

        return Persistence(self.root, self._table, self._call_log, interval=float(interval),
                           max_bytes=max_bytes)

    def _open_session(self, key: SessionKey) -> Session:
        return self._place(key.language, key.venv_id).open_session()

    def _run_read_only(self, coordinate: Coordinate,
                       request: RunRequest) -> tuple[Outcome, dict[str, Any]]:
        restored = self._bring_back(coordinate, request.timeout)
        with self._table.reading(coordinate, request.timeout, request.cancel) as (key, slot):
            record = self._table.record(key)
            if slot is None or slot.session is None:
                return _busy_outcome(), record
            self._table.count_call(key)
            with self._protected(request) as protected:
                session = slot.session
                place = self._place(key.language, key.venv_id)
                outcome = self._table.run(key, place, "read_only", session.run_read_only,
                                          protected)
            note_changes(outcome.pop("rebound", None), outcome.pop("deleted", None),
                         outcome.pop("written", None))
            if restored is not None:
                outcome["restored"] = restored
            return outcome, record

    def _bring_back(self, coordinate: Coordinate, timeout: float) -> dict[str, Any] | None:
        """A kept session not yet restored, named by a read-only call or an inspection:
        opened and restored first, as its first stateful call would (SPEC 12). Returns
        what the restore says."""
        if self._persist is None or self._persist.find_waiting(
                coordinate.language, coordinate.venv_id, coordinate.session_id,
                coordinate.session_name) is None:
            return None
        opening = dataclasses.replace(coordinate, state_mode="stateful")
        outcome, _ = self._run_stateful(opening, RunRequest(code="", timeout=timeout))
        restored: dict[str, Any] | None = outcome.get("restored")
        return restored

    @contextlib.contextmanager
    def _protected(self, request: RunRequest) -> Iterator[RunRequest]:
        """``request`` with a fresh scratch folder and the folders to protect (SPEC
        guarantee 3); the scratch folder is removed when the call is over."""
        scratch = tempfile.mkdtemp(prefix="coordex-ro-")
        try:
            yield dataclasses.replace(request, protect_paths=self._protect_paths(),
                                      scratch=scratch,
                                      report_changes=self._call_log is not None)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _protect_paths(self) -> tuple[str, ...]:
        # Places resolve SESSION_CWD against the session's own cwd where the copy runs.
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
            if outcome.get("restored"):
                record["restored"] = outcome["restored"]
            record["duration_ms"] = _ms(started)
            return record
        extra = {k: v for k, v in outcome.items()
                 if k not in ("stdout", "stderr", "truncated", "result", "exit_code", "images")}
        return success(stdout=outcome.get("stdout", ""), stderr=outcome.get("stderr", ""),
                       truncated=bool(outcome.get("truncated")), result=outcome.get("result"),
                       exit_code=outcome.get("exit_code"), images=outcome.get("images") or [],
                       session=session, state_mode=coordinate.state_mode,
                       duration_ms=_ms(started), **extra)

    # ------------------------------------------------------------------ places

    def _place(self, language: str, venv_id: int | None) -> Place:
        """The place for one (language, environment), made on first use.

        The one point where the kind of place is chosen: a new kind of place (a confined
        host, a cluster node) is one more branch in :meth:`_new_place`, nothing else
        changes. Making a place may build its environment, so it happens outside the
        executor's lock; of two threads racing, one place is kept and the other closed.
        """
        key: PlaceKey = (language, venv_id)
        with self._lock:
            place = self._places.get(key)
        if place is not None:
            return place
        self._check_open()
        made = self._new_place(language, venv_id)
        with self._lock:
            place = self._places.get(key)
            if place is None and not self._closed:
                self._places[key] = made
                return made
        made.close()
        if place is None:
            raise messages.executor_closed()
        return place

    def _new_place(self, language: str, venv_id: int | None) -> Place:
        if self._cluster is not None:
            return self._cluster_place(language, venv_id)
        if language == "bash":
            from .backends.shell import ShellPlace

            return ShellPlace(env=self._bash_env(venv_id))
        assert venv_id is not None  # the own interpreter's place exists from the start
        return EnvironmentPlace(
            lambda: self.environments_manager.python_for(venv_id, self._progress.emit),
            lambda: self._worker_env(venv_id), _CapabilityBridge(self))

    def _join_cluster(self, address: Any) -> Any:
        """Join the Ray cluster at ``address`` (SPEC section 10); ValueError if it cannot."""
        if hasattr(address, "converse"):  # a confined tenant's cluster, through its owner
            address.capabilities, address.build_timeout = _CapabilityBridge(self), self.build_timeout
            return address
        if not isinstance(address, str) or not address.strip():
            raise ValueError(f"cluster must be a Ray address such as 'auto' or "
                             f"'ray://host:10001', got {address!r}")
        try:
            from .backends.ray import RayCluster

            return RayCluster(address, capabilities=_CapabilityBridge(self),
                              build_timeout=self.build_timeout)
        except CoordexError as exc:
            raise ValueError(f"{exc.error} {exc.suggestion}") from None

    def _cluster_place(self, language: str, venv_id: int | None) -> Place:
        """A place on the cluster: its sessions live on nodes, and an environment is built
        on the node that needs it, from its spec and hash, with the spec's resources."""
        from .backends.ray import EnvRef
        from .core.spec import parse_spec

        env = None
        if venv_id is not None:
            text, spec_hash, label = self.environments_manager.describe(venv_id)
            asked = parse_spec(text).resources  # [tool.coordex]
            env = EnvRef(text, spec_hash, label, {k: float(v) for k, v in asked.items() if v})
        place: Place = self._cluster.place(language, env, self._progress.emit)
        return place

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

    def _check_open(self) -> None:
        if self._table.closed:
            raise messages.executor_closed()

    # ------------------------------------------------------------------ sessions API

    def list_sessions(self) -> SessionsResult:
        """All open sessions with their provenance, and the cap (none once closed)."""
        records: list[dict[str, Any]] = []
        max_sessions = self._table.registry.max_sessions
        if self._table.closed:
            return cast(SessionsResult, {"sessions": records, "max_sessions": max_sessions})
        for entry, session in self._table.entries():
            record = entry.record()
            if session is not None:
                with contextlib.suppress(Exception):
                    record["alive"] = bool(session.alive())
                node = getattr(session, "node", None)
                if node:  # placed on a cluster node
                    record["node"] = node
            record["held"] = True  # held by this process (SPEC 12: kept ones are not)
            records.append(record)
        self._calls.mark_busy(records)  # SPEC 14: the sessions detached calls hold
        if self._persist is not None:
            records.extend(self._persist.waiting())
        return cast(SessionsResult, {"sessions": records, "max_sessions": max_sessions})

    def inspect_session(self, language: Language = "python", session_id: int | None = None,
                        session_name: str | None = None,
                        venv_id: int | None = None) -> InspectResult:
        """What a session holds. Without a session: session 0 of that place.

        Python: ``{"names": [{"name","type","repr","bound_at_call","calls_ago"}], ...}``
        with capabilities and ``functions`` listed apart. Bash: ``{"cwd", "variables",
        "functions", "aliases"}`` — only what the session added. Changes nothing.
        """
        try:
            coordinate = coords.check_coordinate(language, "stateful", session_id,
                                                 session_name, venv_id)
            restored = self._bring_back(coordinate, self.timeout)
            with self._table.reading(coordinate, self.timeout, None) as (key, slot):
                if slot is None or slot.session is None:
                    return cast(InspectResult, _busy_outcome()["error"])
                report = self._table.inspect(key, slot, self._place(key.language,
                                                                    key.venv_id))
            if "error_type" in report:  # one failure shape in every place: the error dict
                report["session"] = self._table.record(key)
                return cast(InspectResult, report)
            if key.language == "python":
                for item in report.get("names", []):
                    bound, ago = self._table.provenance(key, item["name"])
                    item["bound_at_call"], item["calls_ago"] = bound, ago
                report.setdefault("capabilities", sorted(self._capabilities))
            report["session"] = self._table.record(key)
            if self._persist is not None:  # SPEC 12: how it is kept on disk
                report["kept"] = self._persist.describe(report["session"])
            if restored is not None:
                report["restored"] = restored
            return cast(InspectResult, report)
        except CoordexError as exc:
            return cast(InspectResult, exc.to_dict())

    def close_session(self, language: Language = "python", session_id: int | None = None,
                      session_name: str | None = None,
                      venv_id: int | None = None) -> CloseResult:
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
            kept = None if self._persist is None else self._persist.find_waiting(
                coordinate.language, coordinate.venv_id, coordinate.session_id,
                coordinate.session_name)
            if kept is not None and self._table.find(coordinate) is None:
                assert self._persist is not None
                if not self._persist.forget(kept):  # kept on disk only: its snapshot goes
                    from .persist.manager import held_elsewhere

                    raise held_elsewhere(kept.record())
                branches.forget(self, kept.record())
                if self._call_log is not None:  # a rebuild brings it back from the log
                    self._call_log.event("close", kept.record())
                return cast(CloseResult, {"closed": True, "session": kept.record()})
            record, session = self._table.remove(coordinate)
            if session is not None:
                session.close()
            if self._persist is not None:
                from .persist import Identity

                self._persist.forget(Identity.of(record))
            branches.forget(self, record)  # its checkpoints go with it (SPEC 15)
            if self._call_log is not None:
                self._call_log.event("close", record)
            spill.forget_session(self.spill_folder, record)
            return cast(CloseResult, {"closed": True, "session": record})
        except CoordexError as exc:
            return cast(CloseResult, exc.to_dict())

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
        return cast(ForkResult, branches.fork_session(self, session_id, session_name, language,
                                                      venv_id, new_name))

    def checkpoint_session(self, language: Language = "python", session_id: int | None = None,
                           session_name: str | None = None, venv_id: int | None = None, *,
                           label: str | None = None) -> CheckpointResult:
        """Record a session's state (written from a copy: the session keeps answering).

        Returns ``{"checkpoint", "label", "at", "bytes", "ms", "left_out", "session"}``
        (and ``dropped`` when the oldest of the 10 kept went)."""
        return cast(CheckpointResult, branches.checkpoint_session(
            self, language, session_id, session_name, venv_id, label))

    def restore_session(self, language: Language = "python", session_id: int | None = None,
                        session_name: str | None = None, venv_id: int | None = None, *,
                        checkpoint: str | None = None) -> RestoreResult:
        """Put a session back to a checkpoint of it (files on disk are not touched)."""
        return cast(RestoreResult, branches.restore_session(
            self, language, session_id, session_name, venv_id, checkpoint))

    def list_checkpoints(self, language: Language = "python", session_id: int | None = None,
                         session_name: str | None = None,
                         venv_id: int | None = None) -> CheckpointList:
        """A session's checkpoints, newest last."""
        return cast(CheckpointList, branches.list_checkpoints(
            self, language, session_id, session_name, venv_id))

    # ------------------------------------------------------------------ the call log

    def _open_call_log(self, enabled: bool, max_rows: int) -> CallLog | None:
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
            raise ValueError(f"log_max_rows must be an integer >= 1, got {max_rows!r}")
        if not enabled:
            return None
        if self._records is not None:
            log: CallLog = self._records.call_log(max_rows)
            return log
        return CallLog(self.root / LOG_FILE, max_rows)

    def _record_call(self, result: dict[str, Any], code: Any,
                     coordinate: Coordinate | None) -> dict[str, Any]:
        """The end of every call: its log row, and a suggestion naming rebuild_session
        where state was lost (the wording: ``coordex.core.messages.rebuild_hint``)."""
        return record_call(self._call_log, result, code, coordinate)

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
        from .log.calls import history

        try:
            if self._call_log is None:
                raise log_off_error("history")
            return cast(HistoryResult, history(
                self._call_log, language, session_id, session_name, venv_id, limit, seq,
                outcome=outcome, state_mode=state_mode, text=text, after_seq=after_seq))
        except CoordexError as exc:
            return cast(HistoryResult, exc.to_dict())

    def rebuild_session(self, language: Language = "python", session_id: int | None = None,
                        session_name: str | None = None,
                        venv_id: int | None = None, *, wait: float | None = None) -> RebuildResult:
        """Bring back a session whose state was lost (or that was closed) from the log.

        ``wait`` (seconds > 0): as for :meth:`execute_code`, a rebuild still replaying
        then returns a ``running`` record; :meth:`wait_call` fetches its result.
        """
        if wait is None and not self._calls.active:
            return self._rebuild_session(language, session_id, session_name, venv_id)
        asked = {"language": language, "session_id": session_id,
                 "session_name": session_name, "venv_id": venv_id}
        return cast(RebuildResult, self._calls.run(
            "rebuild_session", asked, "stateful",
            lambda output, event: dict(self._rebuild_session(language, session_id,
                                                             session_name, venv_id)),
            wait, None, None))

    def _rebuild_session(self, language: Any, session_id: Any, session_name: Any,
                         venv_id: Any) -> RebuildResult:
        """Bring back a session whose state was lost (or that was closed) from the log.

        Replays into a fresh session, in order, the stateful calls that succeeded and
        built the lost state (since the session was created or last started over, up to
        the loss), stopping at the first that fails. Replayed code runs again: files it
        writes are written again. Works for a session of an earlier run under the same
        ``root`` too.

        Returns:
            ``{"replayed": n, "failed_at": seq | None, "session": {...}, "calls": [seq...]}``
            (and ``"failure"``, the failed call's error, when ``failed_at`` is set);
            ``not_found`` when the log holds nothing of that session, ``validation`` with
            ``log=False`` or when nothing was lost.
        """
        from .log.replay import rebuild_session

        try:
            self._check_open()
            if self._persist is not None:
                kept = self._rebuild_kept(language, session_id, session_name, venv_id)
                if kept is not None:
                    return cast(RebuildResult, kept)
            if self._call_log is None:
                raise log_off_error("rebuild_session")
            return cast(RebuildResult, rebuild_session(self, self._call_log, language, session_id,
                                                       session_name, venv_id))
        except CoordexError as exc:
            return cast(RebuildResult, exc.to_dict())

    def _rebuild_kept(self, language: Any, session_id: Any, session_name: Any,
                      venv_id: Any) -> dict[str, Any] | None:
        """``rebuild_session`` from a kept session's snapshot (SPEC 12): a kept session
        not yet restored is restored; an open one whose state was lost after its last
        snapshot gets that snapshot back plus the calls logged before the loss. None:
        the log alone rebuilds it."""
        assert self._persist is not None
        coordinate = coords.check_coordinate(language, "stateful", session_id,
                                             session_name, venv_id)
        waiting = self._persist.find_waiting(coordinate.language, coordinate.venv_id,
                                             coordinate.session_id, coordinate.session_name)
        plan = None
        record = waiting.record() if waiting is not None else None
        if waiting is not None and self._persist.held_elsewhere(waiting):
            from .persist.manager import held_elsewhere

            raise held_elsewhere(waiting.record(), "rebuild")
        if waiting is None:
            found = self._table.find(coordinate)
            if found is None or found[0] == PLAN_KEY or self._call_log is None:
                return None
            record = self._table.record(found[0])
            plan = self._persist.plan_rebuild(record)
            if plan is None:
                return None
            _, session = self._table.remove(coordinate)
            if session is not None:
                session.close()
            at = self._call_log.event("rebuild", record, {"snapshot": True,
                                                          "until": plan["until"]})
            self._persist.rebuilding(record, at, plan["until"])
        restored = self._bring_back(coordinate, self.timeout) or {}
        found = self._table.find(coordinate)
        return {"replayed": int(restored.get("replayed") or 0),
                "failed_at": restored.get("failed_at"),
                "session": self._table.record(found[0]) if found else record,
                "calls": plan["calls"] if plan else [],
                "skipped_failed": plan["failed"] if plan else [], "restored": restored}

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
                places = list(self._places.values())
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

    def run_function_code(self, code: str, *, state_mode: str, session_id: int | None,
                          session_name: str | None, venv_id: int | None,
                          timeout: float | None, on_output: OutputCallback | None,
                          output_limit: int,
                          on_progress: Callable[[str], None] | None = None) -> dict[str, Any]:
        """``execute_code`` of Python for a stored-function call (the library's
        :class:`~coordex.library.functions.FunctionRunner`).

        Same validation, registry, capacity and isolation, with two differences: the
        output limit may be larger (the function's value comes back in ``result``), and
        a call from code running in the very session it names (plan code calling
        ``functions.f.stateful()(...)``) runs there at once instead of waiting for that
        session's lock, which the outer call holds.
        """
        record = getattr(_recorded_call, "record", None)  # cancel_call reaches it
        return self._execute(code, "python", state_mode, session_id, session_name, venv_id,
                             timeout, on_output, on_progress,
                             record.cancel if record is not None else None,
                             max(output_limit, self.output_limit), nested=True)

    def _run_in_active(self, active: tuple[SessionKey, OwnSession], coordinate: Coordinate,
                       request: RunRequest) -> tuple[Outcome, dict[str, Any]]:
        key, session = active
        place = self._place(key.language, key.venv_id)
        if coordinate.state_mode == "read_only":
            with self._protected(request) as protected:
                outcome = sessions.attempts(place, "read_only", functools.partial(
                    session.run_nested, read_only=True), protected)
        else:  # nested: runs inline on this thread, inside the outer call
            outcome = sessions.attempts(place, "stateful", functools.partial(
                session.run_nested, read_only=False), request)
        for kept in ("rebound", "deleted", "written"):  # the outer call records those
            outcome.pop(kept, None)
        return outcome, self._table.record(key)

    def _active_session(self, coordinate: Coordinate) -> tuple[SessionKey, OwnSession] | None:
        """The own-interpreter session ``coordinate`` names if this thread is running
        code in it right now (its namespace is the globals of a frame on the stack)."""
        from .backends.own.output import local as own_call

        if coordinate.venv_id is not None or coordinate.state_mode == "stateless":
            return None
        if not getattr(own_call, "in_call", False):
            return None
        found = self._table.find(coordinate)
        if found is None:
            return None
        key, slot = found
        session = slot.session
        if isinstance(session, OwnSession) and session.running_here(sys._getframe(1)):
            return key, session
        return None


class Environments:
    """``ex.environments``: a thin dict-returning facade over the environment manager."""

    def __init__(self, executor: Executor) -> None:
        self._executor = executor

    def create(self, spec: str, name: str | None = None) -> EnvironmentCreated:
        return cast(EnvironmentCreated, self._guard(lambda m: m.create(spec, name)))

    def list(self) -> EnvironmentList:
        return cast(EnvironmentList, self._guard(lambda m: m.list()))

    def show(self, venv_id: int) -> EnvironmentShown:
        """One environment's spec, whether it is built, and its packages and versions."""
        return cast(EnvironmentShown, self._guard(lambda m: m.show(venv_id)))

    def build(self, venv_id: int, on_progress: Callable[[str], None] | None = None) -> EnvironmentBuilt:
        return cast(EnvironmentBuilt, self._guard(lambda m: m.build(venv_id, on_progress=on_progress)))

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
    return {**empty_outcome(), "error": messages.session_busy()}


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
