"""Branches and checkpoints of sessions (SPEC section 15), above the places.

``fork_session`` asks the source session's place for a copy through the
:class:`~coordex.backends.base.Forkable` capability and puts it in the table as a new
named session; ``checkpoint_session`` / ``restore_session`` / ``list_checkpoints`` write a
session's state through :class:`~coordex.backends.base.Checkpointable` into the tenant's
own store under ``root`` (:class:`~coordex.persist.checkpoints.CheckpointStore`). Which
place a session is in is never asked: a session has the capability or it does not.

Every function returns the SPEC result or error dict; none raises for bad input.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from .backends.base import Checkpointable, Forkable
from .core import coordinates as coords
from .core import messages
from .core.coordinates import Coordinate
from .core.errors import CoordexError, validation
from .core.lineage import forget_fork, note_fork
from .persist.checkpoints import KEEP, CheckpointStore
from .persist.store import Identity

if TYPE_CHECKING:
    from .executor import Executor

FILES_SHARED = ("Files on disk are shared, not copied: both sessions see the same working "
                "folder, and a file one writes the other reads.")
FILES_UNTOUCHED = ("Files on disk were not touched: only the session's state (names, or the "
                   "shell's folder, variables, functions, aliases and options) went back.")
# How long a checkpoint's writer may take (a fork of the session writes it).
WRITE_TIMEOUT = 600.0


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000.0, 1)


def _session_coordinate(language: Any, session_id: Any, session_name: Any,
                        venv_id: Any) -> Coordinate:
    if isinstance(session_id, str) and session_name is None:
        session_id, session_name = None, session_id  # fork_session("name", ...)
    return coords.check_coordinate(language, "stateful", session_id, session_name, venv_id)


def _free_name(ex: Executor, language: str, venv_id: int | None, name: str) -> str:
    for n in range(2, 10_000):
        candidate = f"{name}-{n}"
        if ex._table.find(Coordinate(language, "stateful", venv_id, None,  # type: ignore[arg-type]
                                     candidate)) is None:
            return candidate
    return f"{name}-{time.time_ns()}"


def _unsupported(what: str, record: dict[str, Any]) -> CoordexError:
    return validation(
        f"Sessions of this place ({record['language']}, venv_id={record['venv_id']}) cannot "
        f"be {what}.", "Use state_mode='read_only' to try a step on a copy, or rebuild the "
        "state in a new session.")


# -- fork ---------------------------------------------------------------------------------


def fork_session(ex: Executor, session_id: Any, session_name: Any, language: Any,
                 venv_id: Any, new_name: Any) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        coordinate = _session_coordinate(language, session_id, session_name, venv_id)
        if not isinstance(new_name, str) or not new_name.strip():
            raise validation("fork_session needs new_name: the name of the new session.",
                             "Pass new_name='trial' (any name not in use).")
        coords.check_coordinate(coordinate.language, "stateful", None, new_name,
                                coordinate.venv_id)  # a name a session may have
        ex._check_open()
        if coordinate.venv_id is not None:
            ex._require_environment(coordinate.venv_id)
        ex._bring_back(coordinate, ex.timeout)
        table = ex._table
        if table.find(Coordinate(coordinate.language, "stateful", coordinate.venv_id, None,
                                 new_name)) is not None or (
                ex._keeping.find_waiting(coordinate.language, coordinate.venv_id, None,
                                         new_name) is not None):
            free = _free_name(ex, coordinate.language, coordinate.venv_id, new_name)
            raise validation(f"A {coordinate.language} session named {new_name!r} already "
                             "exists in this environment.",
                             f"Pick a name not in use, e.g. new_name={free!r}.")
        with table.reading(coordinate, ex.timeout, None) as (key, slot):
            source = table.record(key)
            if slot is None or slot.session is None:
                return {**messages.session_busy(), "session": source}
            session = slot.session
            if not isinstance(session, Forkable):
                raise _unsupported("forked", source)
            taken = ex._keeping.kept_ids(coordinate.language, coordinate.venv_id)
            new_key = table.reserve_named(coordinate.language, coordinate.venv_id, new_name,
                                          taken)
            try:
                forked = session.fork(ex.timeout)
            except BaseException:
                table.release(new_key)
                raise
        lock = table.lock_of(new_key)
        if lock is None or not lock.acquire(timeout=ex.timeout) or \
                not table.install(new_key, forked.session, key):
            forked.session.close()
            table.release(new_key)
            raise CoordexError("not_found", "The executor closed while the fork was made.",
                               "Open a new Executor.")
        try:
            ex._keeping.adopt(table.record(new_key), forked.session)  # kept from now (SPEC 12)
        finally:
            lock.release()
        note_fork(ex, table.record(new_key), source)
        return {"session": table.record(new_key), "from": source, "ms": _ms(started),
                "copy": forked.copy, "left_out": list(forked.left_out), "files": FILES_SHARED}
    except CoordexError as exc:
        return exc.to_dict()


# -- checkpoints --------------------------------------------------------------------------


def _store(ex: Executor) -> CheckpointStore:
    return CheckpointStore(ex.root)


def checkpoint_session(ex: Executor, language: Any, session_id: Any, session_name: Any,
                       venv_id: Any, label: Any) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        coordinate = _session_coordinate(language, session_id, session_name, venv_id)
        if label is not None and not isinstance(label, str):
            raise validation(f"label must be text, got {label!r:.80}.",
                             "Pass label='before the reshape', or leave it out.")
        ex._check_open()
        ex._bring_back(coordinate, ex.timeout)
        store = _store(ex)
        with ex._table.reading(coordinate, ex.timeout, None) as (key, slot):
            record = ex._table.record(key)
            if slot is None or slot.session is None:
                return {**messages.session_busy(), "session": record}
            session = slot.session
            if not isinstance(session, Checkpointable):
                raise _unsupported("checkpointed", record)
            identity = Identity.of(record)
            try:
                checkpoint, folder = store.new(identity)
            except OSError as exc:
                raise _storage(store, exc) from None
            at = time.time()
            finish = session.start_checkpoint(str(folder), ex._keeping.max_bytes)
        written = finish(WRITE_TIMEOUT)  # the session is free again: its copy writes
        if "error" in written:
            store.discard(identity, checkpoint)
            error = messages.checkpoint_not_written(
                written.get("problem"), str(written["error"]), ex._keeping.max_bytes,
                WRITE_TIMEOUT)
            return {**error.to_dict(), "session": record}
        try:
            dropped = store.keep(identity, checkpoint, label, at, written)
        except OSError as exc:
            store.discard(identity, checkpoint)
            raise _storage(store, exc) from None
        result = {"checkpoint": checkpoint, "label": label, "at": at,
                  "bytes": written.get("bytes"), "ms": _ms(started),
                  "left_out": list(written.get("left_out") or []), "session": record}
        if dropped:
            result["dropped"] = [_public(info) for info in dropped]
            result["note"] = (f"At most {KEEP} checkpoints are kept per session: the oldest "
                              f"({', '.join(i['checkpoint'] for i in dropped)}) was dropped.")
        return result
    except CoordexError as exc:
        return exc.to_dict()


def _storage(store: CheckpointStore, exc: OSError) -> CoordexError:
    return CoordexError("environment", f"The checkpoint could not be stored: {exc}.",
                        f"Free disk space (or fix permissions) under {store.path}.",
                        log=str(exc))


def _public(info: dict[str, Any]) -> dict[str, Any]:
    return {key: info.get(key) for key in ("checkpoint", "label", "at", "bytes", "left_out")}


def list_checkpoints(ex: Executor, language: Any, session_id: Any, session_name: Any,
                     venv_id: Any) -> dict[str, Any]:
    try:
        coordinate = _session_coordinate(language, session_id, session_name, venv_id)
        ex._check_open()
        identity = _identity(ex, coordinate)
        listed = _store(ex).list(identity)
        return {"checkpoints": [_public(info) for info in listed],
                "session": identity.record(), "max_checkpoints": KEEP}
    except CoordexError as exc:
        return exc.to_dict()


def _identity(ex: Executor, coordinate: Coordinate) -> Identity:
    """The session a coordinate names: open here, kept on disk, or (its checkpoints
    outliving it) only in the checkpoint store."""
    found = ex._table.find(coordinate)
    if found is not None:
        return Identity.of(ex._table.record(found[0]))
    kept = ex._keeping.waiting(coordinate)
    if kept is not None:
        return kept
    wanted = Identity(coordinate.language, coordinate.venv_id, coordinate.session_id or 0,
                      coordinate.session_name)
    if _store(ex).list(wanted):
        return wanted
    raise ex._table.registry.not_found(coordinate)


def restore_session(ex: Executor, language: Any, session_id: Any, session_name: Any,
                    venv_id: Any, checkpoint: Any) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        coordinate = _session_coordinate(language, session_id, session_name, venv_id)
        if not isinstance(checkpoint, str) or not checkpoint:
            raise validation("restore_session needs checkpoint: the id checkpoint_session "
                             "returned.", "Call list_checkpoints(...) for the session's "
                             "checkpoints, then restore_session(..., checkpoint='cp-...').")
        ex._check_open()
        identity = _identity(ex, coordinate)
        store = _store(ex)
        found = store.find(checkpoint)
        mine = store.list(identity)
        if found is None:
            ids = ", ".join(i["checkpoint"] for i in mine) or "none"
            raise CoordexError("not_found", f"There is no checkpoint {checkpoint!r}.",
                               f"This session's checkpoints: {ids} (list_checkpoints).")
        info, folder = found
        owner = info.get("session") or {}
        if not Identity.of(owner).same_session(identity) or \
                Identity.of(owner).slug() != identity.slug():
            raise validation(
                f"Checkpoint {checkpoint!r} belongs to another session: {owner.get('language')} "
                f"session {owner.get('session_name') or owner.get('session_id')!r} "
                f"(venv_id={owner.get('venv_id')}).",
                "Restore it into the session it was taken of, or fork that session "
                "(fork_session) to get a copy under a new name.")
        opening = Coordinate(identity.language, "stateful", identity.venv_id,  # type: ignore[arg-type]
                             None if identity.session_name else identity.session_id,
                             identity.session_name)
        ex._bring_back(opening, ex.timeout)
        with ex._table.stateful(opening, ex.timeout, None, ex._open_session) as (key, session,
                                                                               call):
            record = ex._table.record(key)
            rebound: list[str] = []
            lost = False
            try:
                if session is None:
                    return {**messages.session_busy(), "session": record}
                if not isinstance(session, Checkpointable):
                    raise _unsupported("restored", record)
                report = session.restore_checkpoint(str(folder), WRITE_TIMEOUT)
                if "error" in report:
                    lost = True
                    return {**messages.checkpoint_not_restored(str(report["error"])).to_dict(),
                            "session": record}
                rebound = list(report.get("names") or [])
                ex._keeping.adopt(record, session, anew=True)  # what is kept of it starts here
            finally:
                ex._table.finish(key, call, None, rebound, lost=lost)
        return {"restored": True, "checkpoint": checkpoint, "label": info.get("label"),
                "at": info.get("at"), "session": record, "ms": _ms(started),
                "left_out": list(report.get("left_out") or []), "files": FILES_UNTOUCHED}
    except CoordexError as exc:
        return exc.to_dict()


def forget(ex: Executor, record: dict[str, Any]) -> None:
    """``close_session``: the session's checkpoints go with it."""
    forget_fork(ex, record)
    with contextlib.suppress(OSError):
        _store(ex).forget(Identity.of(record))
