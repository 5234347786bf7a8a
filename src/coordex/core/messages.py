"""Every model-facing message about what happened to a call, built from facts.

A place (the own interpreter, a worker, a shell) reports *facts* — the code ran past
its timeout and survived the interrupt, the process died during the call, the session
was busy — and this module turns them into the SPEC error dict. So one event reads the
same in every place: the same ``error_type``, the same ``state_lost`` and the same
sentence, with only the name of the place and of what it holds filled in.

Pure: no processes, no disk, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from . import facts
from .coordinates import StateMode
from .errors import CoordexError, ErrorType, make_error

Mode = StateMode  # the state mode, defined once (core.coordinates)
PlaceKind = Literal["own", "worker", "shell", "cluster", "host"]

# After SIGINT, how long code gets to stop before its process is killed (state lost).
INTERRUPT_GRACE = 2.0


@dataclass(frozen=True)
class PlaceWords:
    """How messages name a place and what its sessions hold."""

    process: str  # what runs the code: "worker process", "bash shell"
    holds: str  # what a stateful session keeps there


WORDS: dict[PlaceKind, PlaceWords] = {
    "own": PlaceWords("agent's own interpreter", "names"),
    "worker": PlaceWords("worker process", "names"),
    "shell": PlaceWords("bash shell", "variables, functions, aliases, options and cwd"),
    "cluster": PlaceWords("process on the cluster node", "names"),
    "host": PlaceWords("confined host", "sessions"),
}

REBUILD_HINT = ("To bring the lost state back, call rebuild_session with the same "
                "coordinates: it replays the stateful calls that built it (their code runs "
                "again).")


def session_arguments(session: dict[str, Any]) -> str:
    """``language=..., session_name=...`` for a session record, as a call would pass them."""
    parts = [f"language={session.get('language') or 'python'!r}"]
    if session.get("session_name") is not None:
        parts.append(f"session_name={session['session_name']!r}")
    elif session.get("session_id") is not None:
        parts.append(f"session_id={session['session_id']}")
    if session.get("venv_id") is not None:
        parts.append(f"venv_id={session['venv_id']}")
    return ", ".join(parts)


def rebuild_hint(session: dict[str, Any] | None) -> str:
    """:data:`REBUILD_HINT` with the session's own coordinates filled in."""
    where = session_arguments(session) if session else "language=..., session_name=..."
    return (f"To bring the lost state back, call rebuild_session({where}): it replays the "
            "stateful calls that built it (their code runs again).")


def with_rebuild_hint(suggestion: str, hint: str = REBUILD_HINT) -> str:
    """``suggestion`` followed by the rebuild hint (``hint``: the exact call, where the
    call log holds what it replays), once."""
    if "rebuild_session" in suggestion:
        return suggestion
    return f"{suggestion} {hint}".strip()


def timeout(place: PlaceKind, mode: Mode, seconds: float, *, survived: bool,
            stuck: bool = False, stdout: str = "", stderr: str = "", hint: str = REBUILD_HINT,
            stopped: StoppedBy | None = None) -> dict[str, Any]:
    """The code ran past ``seconds``.

    ``survived``: the interrupt stopped it and the session kept its state. ``stuck``:
    the code did not stop and its place cannot be killed (the own interpreter).
    ``stopped``: a person or the caller interrupted it as at its timeout (SPEC 6): the
    sentence says who, not the timeout, and what to do instead of a larger timeout.
    """
    words = WORDS[place]
    limit = f"{seconds:g} s"
    if stopped is not None:
        return _stopped_timeout(place, mode, survived=survived, stuck=stuck, stopped=stopped,
                                stdout=stdout, stderr=stderr)
    longer = f"timeout={max(seconds * 4, 60):g}"
    common: dict[str, Any] = {"stdout": stdout, "stderr": stderr}
    if stuck:
        if mode == "stateful":
            suggestion = ("The code did not stop when interrupted (it is blocked outside Python "
                          "bytecode); the agent's own interpreter cannot be killed, so the "
                          "session is still busy and its state is kept. Further calls to this "
                          "session return timeout at once until the code stops: wait, or use "
                          "another session.")
        else:
            suggestion = ("The code did not stop when interrupted (it is blocked outside Python "
                          "bytecode) and finishes in the background of the agent's process; no "
                          "session is affected. Make it faster or pass a larger timeout=.")
        return make_error("timeout", f"The code ran past its timeout of {limit}.", suggestion,
                          state_lost=False, **common)
    if not survived and mode == "stateful":
        return make_error(
            "timeout",
            f"The code ran past its timeout of {limit}, did not stop within "
            f"{INTERRUPT_GRACE:g} s of the interrupt, and its {words.process} was killed and "
            "restarted: the session's state is lost.",
            with_rebuild_hint(
                f"The session was restarted (state lost): re-create the {words.holds} you "
                "need before continuing. Keep long work "
                "interruptible (do not ignore SIGINT or swallow KeyboardInterrupt), split it "
                f"into smaller calls, or pass a larger timeout (e.g. {longer}).", hint),
            state_lost=True, **common)
    if mode == "stateful":
        return make_error(
            "timeout",
            f"The code ran past its timeout of {limit} and was interrupted; the session "
            f"survived with its state ({words.holds} set before the interrupt are kept).",
            "The session survived (interrupted: state kept). Continue in the same session: "
            "make the code faster, work on a smaller piece, or pass a larger timeout (e.g. "
            f"{longer}).", state_lost=False, **common)
    where = ("the session is unchanged" if mode == "read_only"
             else "nothing was kept, as with any stateless call")
    return make_error(
        "timeout", f"The code ran past its timeout of {limit} and was stopped; {where}.",
        f"Make the code faster, work on a smaller piece, or pass a larger timeout (e.g. "
        f"{longer}).", state_lost=False, **common)


def not_taken(place: PlaceKind, seconds: float, hint: str = REBUILD_HINT) -> dict[str, Any]:
    """The session's process never took the code within its timeout (stopped, stuck)
    and was replaced: the code did not run, the state is lost."""
    words = WORDS[place]
    return make_error(
        "timeout",
        f"The session's {words.process} did not take the code within its timeout of "
        f"{seconds:g} s (it was stopped or stuck) and was replaced: the code did not run, "
        "and the session's state is lost.",
        with_rebuild_hint(f"Re-create the {words.holds} you need in the fresh session, "
                          "then run the code again.", hint), state_lost=True)


def timeout_after_a_retry(place: PlaceKind, mode: Mode, seconds: float, how: str, *,
                          survived: bool, hint: str = REBUILD_HINT) -> dict[str, Any]:
    """A call whose process died under it, ran again on a fresh one and then ran past
    what was left of its one timeout: one story, from the settled facts (the state from
    before the call went with the first process, whatever the second run's interrupt
    kept)."""
    words = WORDS[place]
    limit = f"{seconds:g} s"
    longer = f"timeout={max(seconds * 4, 60):g}"
    head = (f"The {words.process} died during this call ({how}); the call ran again on a "
            f"fresh one, which ran past the call's timeout of {limit} and ")
    faster = ("make the code faster, split it into smaller calls, or pass a larger timeout "
              f"(e.g. {longer}).")
    if mode == "stateful":
        end = ("was interrupted: the session's state from before this call is lost; the "
               f"{words.holds} this second run set before the interrupt are kept."
               if survived else
               f"did not stop within {INTERRUPT_GRACE:g} s of the interrupt, so that "
               f"{words.process} was killed too: the session's state is lost.")
        return make_error("timeout", head + end, with_rebuild_hint(
            f"Re-create the {words.holds} you need before continuing; " + faster, hint),
            state_lost=True)
    where = ("the session is unchanged" if mode == "read_only"
             else "nothing was kept, as with any stateless call")
    return make_error("timeout", head + f"was stopped; {where}.", faster[0].upper() + faster[1:],
                      state_lost=False)


StoppedBy = Literal["person", "caller"]

_STOPPED_BY: dict[StoppedBy, tuple[str, str]] = {
    "person": ("The call was interrupted from the page by the person watching it",
               "It was stopped on purpose, not for taking too long: do not run it again as "
               "it was. Read its output so far (stdout, stderr), then ask, or change "
               "course."),
    "caller": ("The call was cancelled by its caller (the client cancelled the request)",
               "It was stopped on purpose, not for taking too long: run it again only if "
               "it is still wanted; its output so far is in stdout and stderr."),
}


def stopped_words(who: StoppedBy) -> tuple[str, str]:
    """How a call ``who`` stopped is said: the head of its error, and its suggestion."""
    return _STOPPED_BY[who]


def _stopped_timeout(place: PlaceKind, mode: Mode, *, survived: bool, stuck: bool,
                     stopped: StoppedBy, **common: Any) -> dict[str, Any]:
    """:func:`timeout` for a call a person or its caller interrupted: what the interrupt
    did, after who did it (the head already says the call was interrupted)."""
    words = WORDS[place]
    head, suggestion = _STOPPED_BY[stopped]
    if stuck:
        return make_error("timeout", head + ".", suggestion, state_lost=False, **common)
    if not survived and mode == "stateful":
        return make_error(
            "timeout",
            f"{head}, did not stop within {INTERRUPT_GRACE:g} s of the interrupt, and its "
            f"{words.process} was killed and restarted: the session's state is lost.",
            suggestion, state_lost=True, **common)
    if mode == "stateful":
        return make_error(
            "timeout", f"{head}; the session survived with its state ({words.holds} set "
            "before the interrupt are kept).", suggestion, state_lost=False, **common)
    where = ("the session is unchanged" if mode == "read_only"
             else "nothing was kept, as with any stateless call")
    return make_error("timeout", f"{head}; {where}.", suggestion, state_lost=False, **common)


def stopped_error(error: dict[str, Any], who: StoppedBy | None) -> dict[str, Any]:
    """A ``timeout`` error worded before it was known that ``who`` stopped the call (a
    session that stayed busy, a place that never took the code): who stopped it comes
    first, and what to do instead. Built once, as the error is made."""
    if who is None or error.get("error_type") != "timeout":
        return error
    head, suggestion = _STOPPED_BY[who]
    return {**error, "error": f"{head}. {error['error']}", "suggestion": suggestion}


def killed_by(signal_number: int) -> str:
    """How a process a signal ended is named in every message: one spelling."""
    import signal

    try:
        return f"killed by {signal.Signals(signal_number).name}"
    except ValueError:
        return f"killed by signal {signal_number}"


def crashed(place: PlaceKind, mode: Mode, how: str, *, attempts: int = 1,
            state_lost: bool | None = None, hint: str = REBUILD_HINT,
            **extra: Any) -> dict[str, Any]:
    """The process running the code died during the call (after ``attempts`` tries)."""
    words = WORDS[place]
    times = "" if attempts == 1 else f" {attempts} times"
    if mode == "read_only":
        return make_error(
            "crashed",
            f"The read-only copy of the session died{times} while running this code ({how}); "
            "the session itself is unchanged.",
            "The code probably ends its own process (os._exit, os.kill, a crash in a C "
            "extension, running out of memory); change that part. The session keeps its "
            "state.", state_lost=False if state_lost is None else state_lost, **extra)
    if mode == "stateless":
        return make_error(
            "crashed", f"The {words.process} running this code died{times} ({how}).",
            "The code probably ends its own process (os._exit, os.kill, `kill $$`, a crash "
            "in a C extension, running out of memory); change that part and run it again.",
            state_lost=True if state_lost is None else state_lost, **extra)
    return make_error(
        "crashed",
        f"The session's {words.process} died{times} while running this code ({how}); the "
        "session's state is lost.",
        with_rebuild_hint(
            "The next call starts on a fresh process: re-create the "
            f"{words.holds} you need, then run the code again. If the code ends its own "
            "process (os._exit, os.kill, `kill $$`, a crash in a C extension, running out "
            "of memory), change that part.", hint),
        state_lost=True if state_lost is None else state_lost, **extra)


def node_lost(how: str, mode: Mode, hint: str = REBUILD_HINT) -> dict[str, Any]:
    """The cluster node holding a session (or running a stateless call) was lost."""
    if mode == "stateless":
        return make_error("crashed", f"The node running this call was lost ({how}); "
                          "nothing was kept.", "Run the call again: it runs on another node.",
                          state_lost=True)
    copy = " (the read-only copy did not run)." if mode == "read_only" else "."
    return make_error(
        "crashed", f"The node holding this session was lost ({how}): its state is gone "
        f"with it{copy}",
        with_rebuild_hint("Run the setup again, or rebuild the session; the next stateful "
                          "call opens a fresh session on another node.", hint), state_lost=True)


def session_busy(stopped: StoppedBy | None = None) -> dict[str, Any]:
    """The call waited its whole timeout for another call to the same session (or
    until ``stopped`` interrupted the wait)."""
    return stopped_error(_session_busy(), stopped)


def _session_busy() -> dict[str, Any]:
    return make_error(
        "timeout", "The session stayed busy with another call for the whole timeout.",
        "Nothing ran and no state changed. Retry later, pass a larger timeout=, or use "
        "another session.", stdout="", stderr="", state_lost=False)


def detached_busy(call_id: str) -> dict[str, Any]:
    """A stateful or read-only call to a session whose detached call (one that returned
    ``running``, SPEC 14) still runs: answered at once, nothing ran."""
    return make_error(
        "busy", f"The session is running an earlier call ({call_id}) that returned "
        "'running'; nothing ran.",
        f"Call wait_call(call_id={call_id!r}) for its result, then run this call "
        f"again; or cancel_call(call_id={call_id!r}) to interrupt it; or use "
        "another session.", call_id=call_id)


def session_closed(place: PlaceKind, hint: str = REBUILD_HINT) -> dict[str, Any]:
    """A call to a kept session that was closed (``close_session``, or its place): one
    sentence for every place."""
    words = WORDS[place]
    return make_error(
        "crashed", f"This session was closed: its {words.process} and everything it "
        "started were ended, and its state is gone.",
        with_rebuild_hint("Open a new session with a stateful call (the same name starts "
                          "a fresh one), or use state_mode='stateless'.", hint), state_lost=True)


def closed_during_call(place: PlaceKind, mode: str, detail: str = "", *,
                       session: bool = False, **extra: Any) -> dict[str, Any]:
    """The Executor (or, with ``session``, the call's session) was closed while the call
    ran: one sentence for every place. ``detail`` says what may still run (code blocked
    in C in the agent's process)."""
    words = WORDS[place]
    subject = "This code's session" if session else "The Executor"
    again = ("Open a new session with a stateful call" if session
             else "Create a new Executor")
    return make_error(
        "crashed", f"{subject} was closed while this code ran; its {words.process} was "
        f"ended{detail}.", f"{again} and run the code again.",
        state_lost=mode != "stateless", **extra)


# -- one attempt's facts, worded -------------------------------------------------------


def error_of(event: facts.Event, place: PlaceKind, mode: Mode, seconds: float,
             attempts: int = 1, hows: Sequence[str] = (), *, hint: str = REBUILD_HINT,
             stopped: StoppedBy | None = None) -> dict[str, Any]:
    """The SPEC error dict for a call whose last attempt ended in ``event`` (anything
    but ``Ok``/``Exited``), in ``mode`` at ``place``: ``seconds`` its timeout,
    ``attempts`` how often it ran (``hows``: how each death happened), ``hint`` the
    rebuild call a lost state names, ``stopped`` who interrupted it (SPEC 6).
    :func:`coordex.core.record.render` puts it in the result."""
    error = _error(event, place, mode, seconds, attempts, hows, hint, stopped)
    return stopped_error(error, stopped) if stopped is not None and not (
        isinstance(event, facts.TimedOut) and event.taken
        and not (attempts > 1 and hows and not event.stuck)) else error


def _error(event: facts.Event, place: PlaceKind, mode: Mode, seconds: float, attempts: int,
           hows: Sequence[str], hint: str, stopped: StoppedBy | None) -> dict[str, Any]:
    if isinstance(event, facts.Raised):
        return raised(event, place, mode)
    if isinstance(event, facts.TimedOut):
        if not event.taken:
            return not_taken(place, seconds, hint)
        if attempts > 1 and hows and not event.stuck:
            error = timeout_after_a_retry(place, mode, seconds, "; ".join(dict.fromkeys(hows)),
                                          survived=event.survived, hint=hint)
        elif stopped is not None:
            return timeout(place, mode, seconds, survived=event.survived, stuck=event.stuck,
                           stopped=stopped)
        else:
            error = timeout(place, mode, seconds, survived=event.survived, stuck=event.stuck,
                            hint=hint)
        if place == "shell":
            error["suggestion"] += (" A long command can run in the background "
                                    "(`cmd > out.log 2>&1 &`) in a stateful session while "
                                    "you read the log later; do not ignore SIGINT "
                                    "(`trap '' INT`).")
        return error
    if isinstance(event, facts.Died):
        how = "; ".join(dict.fromkeys([*hows, event.how])) or "no reason given"
        if event.what == "node":
            return node_lost(how, mode, hint)
        if not event.started:
            how += ", before it read the code"
        elif place == "shell" and mode != "read_only":
            how += "; the command was not retried"
        error = crashed(place, mode, how, attempts=attempts, hint=hint)
        if place == "shell" and mode != "read_only":
            error["suggestion"] += (" A command that signals its own shell (e.g. `kill $$`) "
                                    "can run in a subshell `( ... )` instead.")
        return error
    if isinstance(event, facts.Closed):
        if event.by == "session" and not event.during:
            return session_closed(place, hint)
        return closed_during_call(place, mode, event.detail, session=event.by == "session")
    if isinstance(event, facts.StartFailed):
        if event.error is not None:
            return event.error.to_dict()
        if event.copy:
            return make_error(
                "crashed", f"The read-only copy could not be made ({event.reason}); the code "
                "did not run.", "The session itself is unchanged: run the read-only call "
                "again (if the reason names processes or memory, free some first).")
        return make_error(
            "crashed", f"Could not start the {WORDS[place].process} for this call: "
            f"{event.reason}.", "Check that the program exists and the machine has free "
            "processes and memory, then run the call again.")
    assert isinstance(event, facts.Busy)
    if event.stuck:
        return make_error(
            "timeout", "This session is still busy with code from an earlier call that "
            "timed out and did not stop.",
            "Wait for that code to finish, or run in another session (a different "
            "session_name) or with state_mode='stateless'. The session's state is kept.")
    return make_error(
        "timeout", f"The {WORDS[place].process} stayed busy with another call for the "
        "whole timeout.", "Nothing ran and no state changed. Retry, or run this in an "
        "environment (venv_id) or bash, whose sessions run in parallel.")


_NO_COMPILE = ("SyntaxError", "IndentationError", "TabError")


def raised(event: facts.Raised, place: PlaceKind, mode: Mode) -> dict[str, Any]:
    """The code raised: the exception's own last line, and what to do about it."""
    headline = f"{event.exception}: {event.message}" if event.message else event.exception
    extra = {"traceback": event.traceback, "exception": event.exception}
    if event.error_type is not None:
        # A coordex error raised inside the code (a stored function's CallError): the
        # model sees its own error_type and suggestion, not a generic execution error.
        return make_error(cast(ErrorType, event.error_type),
                          event.error or event.message or headline,
                          event.suggestion or _after_raise(event.exception, place, mode),
                          **extra)
    return make_error("execution", headline, _after_raise(event.exception, place, mode),
                      **extra)


def _after_raise(exception: str, place: PlaceKind, mode: Mode) -> str:
    if exception in _NO_COMPILE:
        return ("The code does not compile: fix the syntax at the line the traceback "
                "points to; nothing in the code ran.")
    if exception == "SystemExit":
        return ("The code called sys.exit()/exit(); nothing was ended and the process keeps "
                "running. Remove the exit call (to stop early, return from a function).")
    if exception == "NameError":
        where = ("this session" if mode != "stateless" else
                 "a stateless call, which starts from an empty namespace")
        return (f"A name is not defined in {where}. Define it in the same code, or run it in "
                "a session that has it (state_mode='stateful' with session_name=...); "
                "inspect_session shows which names a session holds.")
    if exception in ("ModuleNotFoundError", "ImportError"):
        if place == "own":
            return ("The module is not installed in the agent's own interpreter. Create an "
                    "environment with it (environments.create / create_environment) and "
                    "pass its venv_id.")
        return ("The module is not installed in this environment. Create an environment "
                "whose spec lists it (environments.create / create_environment) and pass "
                "its venv_id.")
    if mode == "stateful":
        return ("Read the traceback, fix the code and run it again; the session's state is "
                "kept (names bound before the failing line too).")
    if mode == "read_only":
        return "Read the traceback, fix the code and run it again; the session is unchanged."
    return "Read the traceback, fix the code and run it again."


def checkpoint_not_written(problem: str | None, why: str, max_bytes: int,
                           seconds: float) -> CoordexError:
    """A checkpoint whose copy wrote nothing, by what its writer noted (``problem``)."""
    if problem == "too_large":
        return CoordexError(
            "capacity", f"The checkpoint was not written: the session's state is larger "
            f"than persist_max_bytes={max_bytes} bytes.",
            "Delete large values the session no longer needs (del name), or start the "
            "Executor with a larger persist_max_bytes, then checkpoint again.")
    if problem == "timeout":
        return CoordexError(
            "timeout", f"The checkpoint was not written within {seconds:g} s; the session "
            "is unchanged.", "Checkpoint again when the session is idle; if its state is "
            "very large, delete what it no longer needs first.",
            stdout="", stderr="", state_lost=False)
    fix = ("Free disk space under the Executor's root (or fix its permissions), then "
           "checkpoint again." if problem == "disk_full" else
           "Delete what cannot be kept (open files, connections, objects that cannot be "
           "pickled) or free disk space under the Executor's root, then checkpoint again.")
    return CoordexError(
        "environment", "The checkpoint could not be written; the session is unchanged.",
        fix, log=why)


def checkpoint_not_restored(why: str) -> CoordexError:
    """The checkpoint's state could not be loaded: the session was started afresh."""
    return CoordexError(
        "crashed", f"The checkpoint could not be restored ({why}); the session now starts "
        "empty.", "Rebuild it with rebuild_session, or restore another checkpoint.",
        state_lost=True)


def executor_closed() -> CoordexError:
    return CoordexError("validation", "This Executor is closed.",
                        "Create a new Executor (with Executor(...) as ex: ...) and call it.")


def start_failed(language: str, reason: object) -> CoordexError:
    """A session's process could not be started at all."""
    return CoordexError(
        "crashed", f"Could not start the {language} session: {reason}.",
        "Check that the program exists and the machine has free processes and memory, "
        "then run the call again.", state_lost=True)


# -- a cluster's refusals (raised where a session would open) -----------------------------


def cluster_start_failed(what: str) -> CoordexError:
    """coordex's actor, or a session, could not be started on a node."""
    return CoordexError(
        "crashed", f"Could not start on the cluster: {what}.",
        "Check that the cluster's nodes are up (ray status) and have free resources, then "
        "run the call again: it opens the session on another node.", state_lost=True)


def cluster_wire_mismatch(what: str, found: object, expected: int) -> CoordexError:
    """coordex's actor on a node speaks another version of the cluster wire: the node
    runs another coordex (docs/protocol.md, the driver and node actor conversation)."""
    spoken = "no version" if found is None else f"version {found}"
    return CoordexError(
        "crashed", f"Could not start on the cluster: {what} speaks cluster wire {spoken}, "
        f"this coordex speaks version {expected}: the node runs another coordex.",
        "Install the same coordex version on every node of the cluster and on this "
        "machine, then run the call again.", state_lost=True)


def no_live_node(*, confining: bool) -> CoordexError:
    """No node to open a session on (``confining``: none that can confine a tenant)."""
    if confining:
        return CoordexError(
            "crashed", "No live node of the Ray cluster can confine a tenant's sessions "
            "(each node's level is 'none', or none is alive).",
            "Ask the operator to enable unprivileged user namespaces or Landlock on the "
            "cluster's nodes (coordex serve lists each node's level at start), then run "
            "the call again.", state_lost=True)
    return CoordexError(
        "crashed", "No node of the Ray cluster is alive.",
        "Start the cluster's nodes again (ray start), then run the call again; "
        "rebuild_session(...) replays the calls of a lost session.", state_lost=True)


def no_node_fits(resources: str) -> CoordexError:
    """No node has the resources an environment's spec asks for."""
    return CoordexError(
        "environment", f"No node of the cluster has {resources}, which this environment's "
        "spec asks for ([tool.coordex]).",
        "Lower num_cpus / num_gpus / memory in the spec's [tool.coordex] table, or add a "
        "node that has them (ray start --address=... --num-gpus=...).", log="")


def environment_not_found(venv_id: int, known: list[tuple[int, str | None]]) -> CoordexError:
    listed = ", ".join(f"{vid}" + (f" ({name!r})" if name else "") for vid, name in known)
    return CoordexError(
        "not_found", f"No environment with venv_id={venv_id}.",
        f"Existing environments: {listed or 'none yet'}. Create one with "
        "environments.create(spec) (MCP: create_environment) and use the venv_id it returns, "
        "or venv_id=None for the agent's own interpreter.")


# -- builds that fail for a cause outside the spec (SPEC 5) -----------------------------------

BuildCause = Literal["tls", "network", "index_access"]

# How uv (reqwest, rustls, hyper) words each cause, lower-cased.
_BUILD_CAUSES: tuple[tuple[BuildCause, tuple[str, ...]], ...] = (
    ("tls", ("invalid peer certificate", "unknownissuer", "certificate verify failed",
             "self-signed certificate", "self signed certificate", "tls handshake",
             "invalid certificate", "certificate has expired", "unknown ca")),
    ("index_access", ("401 unauthorized", "403 forbidden", "407 proxy authentication")),
    ("network", ("dns error", "failed to lookup address", "connection refused",
                 "tcp connect error", "error sending request", "operation timed out",
                 "network is unreachable", "connection reset", "failed to connect",
                 "no route to host", "temporary failure in name resolution",
                 "name or service not known", "proxy")),
)
_URL = re.compile(r"https?://[^\s'\"`]+")
_WHERE_TO_SET = ("under [build.env] in {settings}, or in the env block this MCP client "
                 "starts coordex with")


def build_cause(reason: str) -> BuildCause | None:
    """Why uv failed when the spec is not to blame, from uv's own words; else None."""
    lowered = reason.lower()
    for cause, markers in _BUILD_CAUSES:
        if any(marker in lowered for marker in markers):
            return cause
    return None


def build_outside_spec(label: str, reason: str, settings: str) -> CoordexError | None:
    """The ``environment`` error for a build that failed on TLS, the network or the
    index's access rules (``reason`` is uv's explanation; ``settings`` names the
    ``coordex.toml`` builds read), or None when the cause is not one of those."""
    cause = build_cause(reason)
    if cause is None:
        return None
    found = _URL.search(reason)
    index = f" ({found.group(0).rstrip('.,:;)')})" if found else ""
    where = _WHERE_TO_SET.format(settings=settings)
    if cause == "tls":
        what = f"uv could not verify the TLS certificate of the package index{index}"
        fix = ("Set SSL_CERT_FILE to a PEM bundle holding the certificate authority of this "
               "proxy or index (or UV_SYSTEM_CERTS=1 to trust the system's store) " + where)
    elif cause == "index_access":
        what = f"the package index{index} refused access"
        fix = ("Give the index's credentials (UV_INDEX_URL=https://user:token@host/simple) or "
               "the proxy's (HTTPS_PROXY=http://user:password@proxy:port) " + where)
    else:
        what = f"uv could not reach the package index{index}"
        fix = ("Set HTTPS_PROXY / HTTP_PROXY (and NO_PROXY) if this machine reaches the "
               "internet through a proxy, UV_INDEX_URL for a mirror it can reach, or "
               "UV_FIND_LINKS to a folder of wheels with UV_OFFLINE=1, " + where)
    return CoordexError(
        "environment", f"Could not build {label}: {what}, so nothing was installed.\n{reason}",
        f"The spec is fine; the connection is not. {fix}; then run the call again.")
