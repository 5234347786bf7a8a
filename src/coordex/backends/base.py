"""What every place takes and gives back.

A place runs one :class:`RunRequest` and ends each attempt in a frozen
:class:`~coordex.core.facts.Ran`: the output fields and exactly one event saying how the
run ended (``Ok``, ``Exited``, ``Raised``, ``TimedOut``, ``Died``, ``Closed``,
``StartFailed``, ``Busy``), and whether the process was found dead and replaced before
the code ran. Places report facts, never sentences: the session table decides what
follows (:func:`coordex.sessions.settle`: a retry, a loss said once, settled into a
:class:`~coordex.core.record.Settled`) and :func:`coordex.core.record.render` words it.
"""

from __future__ import annotations

import codecs
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..core import facts
from ..core.errors import storage_error
from ..core.facts import Ran
from ..core.messages import PlaceKind
from ..core.quick import quick_init
from ..core.results import DEFAULT_OUTPUT_LIMIT, OutputBuffer
from ..core.terminal import QueryFilter
from ..diskspace import free_bytes

OutputCallback = Callable[[str, str], None]
ProgressCallback = Callable[[str], None]
Outcome = dict[str, Any]

# Pagers never take over a call (SPEC section 6): every backend's processes see these.
PAGER_ENV = {"PAGER": "cat", "GIT_PAGER": "cat", "MANPAGER": "cat"}

# After SIGINT, how long code gets to stop before its process is killed (state lost).
INTERRUPT_GRACE = 2.0
# In ``RunRequest.protect_paths``: the session's working directory, wherever it is now.
SESSION_CWD = "."


def new_scratch() -> str:
    """A name for a read-only call's scratch folder in the temporary folder, not yet
    made: unguessable, as :func:`tempfile.mkdtemp` makes its names, so that no one can
    make it first. A folder is a system call or two on the call's path, more where the
    machine sat idle; a call whose place needs none pays for none."""
    return os.path.join(tempfile.gettempdir(), f"coordex-ro-{secrets.token_hex(8)}")


def make_scratch(path: str) -> None:
    """Make the scratch folder :func:`new_scratch` named (there already: kept).
    Raises OSError."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass


def scratch_failed(scratch: str | None, exc: OSError) -> facts.StartFailed:
    """The fact of a read-only copy that did not start for want of its scratch folder
    (``scratch``, None: the temporary folder), the disk full or the folder unwritable."""
    folder = os.path.dirname(scratch) if scratch is not None else tempfile.gettempdir()
    return facts.StartFailed(copy=True, error=storage_error(
        exc, folder, "temporary folder (TMPDIR)", free_bytes(Path(folder))))


def made_scratch(request: RunRequest) -> Ran | None:
    """Make ``request``'s scratch folder if it names one (:func:`make_scratch`): None,
    or the fact of a copy that could not start without it."""
    if request.scratch is None:
        return None
    try:
        make_scratch(request.scratch)
    except OSError as exc:
        return Ran(scratch_failed(request.scratch, exc))
    return None


def remove_scratch(path: str) -> None:
    """Remove a scratch folder and what is in it, if it was made; never raises."""
    try:
        os.rmdir(path)  # made and left empty, the usual case: one system call
    except FileNotFoundError:
        pass
    except OSError:
        shutil.rmtree(path, ignore_errors=True)


@quick_init
@dataclass(frozen=True)
class RunRequest:
    code: str
    timeout: float
    on_output: OutputCallback | None = None
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    # Read-only file protection (SPEC guarantee 3), applied only when ``scratch`` is set:
    # folders whose writes the copy sees but that must not change. Relative entries are
    # resolved where the copy runs, against the session's working directory, so
    # ``SESSION_CWD`` (".") stands for that directory in every backend.
    protect_paths: tuple[str, ...] = field(default_factory=tuple)
    # The call's private scratch folder (its TMPDIR), named by the caller (:func:`
    # new_scratch`) and removed by it (:func:`remove_scratch`); made by the place that
    # uses it as a folder (:func:`make_scratch`): a bash copy protected by its launcher
    # has one of its own. None: the copy is not protected and reports ``files: "none"``.
    scratch: str | None = None
    # Set by a front end whose request was cancelled: every place interrupts the code as
    # at its timeout (state kept), and kills only past INTERRUPT_GRACE.
    cancel: threading.Event | None = None
    # Set when the caller keeps what a read-only copy changed (the call log is on):
    # places that pay to find that out (a bash copy dumps its state at its end) do it
    # only then; Python copies report it always (it costs them nothing).
    report_changes: bool = False
    # Characters of the last expression's repr handed back; None: ``output_limit``. The
    # executor asks for more when it keeps what does not fit a result in a file.
    value_limit: int | None = None

    @property
    def result_limit(self) -> int:
        """Characters of the value's repr a place hands back (the rest cut in the middle)."""
        return self.value_limit or self.output_limit
    # Variables the call's code sees in its environment for this call alone, on top of
    # its session's (the trace context: TRACEPARENT, TRACESTATE; SPEC 16).
    env: Mapping[str, str] | None = None
    # The call's ``on_progress``: the lines of an environment a place builds for it on
    # first use (a build is not counted against the call's timeout).
    on_progress: ProgressCallback | None = None


class Cancel(Protocol):
    """What ``wait_for`` asks of a cancel event (a ``threading.Event``, or several)."""

    def is_set(self) -> bool: ...


def wait_for(lock: Any, seconds: float, cancel: Cancel | None) -> bool:
    """Acquire ``lock`` within ``seconds``; give up early when ``cancel`` is set.

    Without a cancel event this is one blocking acquire. With one, the wait is cut into
    short slices so a cancelled request stops within ~50 ms.
    """
    if cancel is None:
        return bool(lock.acquire(True, max(0.0, seconds)))
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if lock.acquire(True, max(0.0, min(0.05, left))):
            return True
        if left <= 0 or cancel.is_set():
            return False


def emit(request: RunRequest, stream: str, text: str) -> None:
    """Call ``on_output`` without letting a broken callback break the run."""
    if request.on_output is not None and text:
        try:
            request.on_output(stream, text)
        except Exception:
            pass


_utf8_decoder = codecs.getincrementaldecoder("utf-8")


class StreamCapture:
    """One output stream of one call: bytes in, text out, bounded and streamed out.

    Invalid UTF-8 (binary output) becomes U+FFFD; a character split across two reads is
    held back until its remaining bytes arrive. With ``queries``, terminal queries
    (``ESC [ 6 n``...) are dropped: they never reach a client terminal to answer (bash).
    Nothing is allocated until the first byte arrives: most calls print nothing, and
    this sits on the path every call takes.
    """

    __slots__ = ("_decoder", "_queries", "_with_queries", "buffer", "name", "request")

    def __init__(self, name: str, request: RunRequest, *, queries: bool = False) -> None:
        self.name = name
        self.request = request
        self.buffer: OutputBuffer | None = None
        self._decoder: codecs.IncrementalDecoder | None = None
        self._with_queries = queries
        self._queries: QueryFilter | None = None

    def feed(self, data: bytes, final: bool = False) -> None:
        if self._decoder is None:
            if not data:
                return
            self._decoder = _utf8_decoder(errors="replace")
            if self._with_queries:
                self._queries = QueryFilter()
            self.buffer = OutputBuffer(self.request.output_limit)
        text = self._decoder.decode(data, final)
        if self._queries is not None:
            text = self._queries.feed(text, final)
        if text:
            assert self.buffer is not None
            self.buffer.write(text)
            emit(self.request, self.name, text)

    def finish(self) -> None:
        """The end of the stream: a character cut short comes out as U+FFFD."""
        self.feed(b"", final=True)

    def getvalue(self) -> str:
        return "" if self.buffer is None else self.buffer.getvalue()

    @property
    def truncated(self) -> bool:
        return self.buffer is not None and self.buffer.truncated


def empty_outcome() -> Outcome:
    return {"stdout": "", "stderr": "", "truncated": False, "result": None,
            "exit_code": None, "images": []}


@runtime_checkable
class Session(Protocol):
    """One kept session in one place: a namespace, a worker process or a shell.

    Every method returns data, never raises for what the code did: a crash, a timeout
    or a dead process comes back as a :class:`Ran` whose event says so. ``close`` is
    idempotent and safe from any thread.
    """

    def run(self, request: RunRequest) -> Ran:
        """Run code in the session; what it changes stays (stateful)."""
        ...

    def run_read_only(self, request: RunRequest) -> Ran:
        """Run code against a copy of the session; the fact carries ``isolation``."""
        ...

    def inspect(self) -> dict[str, Any] | Ran:
        """What the session holds, without changing it (SPEC section 7); ``replaced``
        when its process was found dead and replaced first. A :class:`Ran` (its event:
        ``Closed``, ``StartFailed``, ``Died``) when it cannot say."""
        ...

    def alive(self) -> bool:
        """Whether the process (or namespace) holding the session is still there."""
        ...

    def close(self) -> None:
        """End the session and every process it started."""
        ...


@runtime_checkable
class CapabilityHost(Protocol):
    """Host functions exposed to code as global names (the Executor's capabilities,
    SPEC 2): what a place's sessions ask when their code calls one."""

    def names(self) -> list[str]: ...

    def call(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any: ...


@runtime_checkable
class Place(Protocol):
    """Where code of one (language, environment) runs: it opens sessions and serves
    stateless calls. The Executor holds one per (language, venv_id) it has used.

    ``kind`` names the place in messages (:data:`coordex.core.messages.WORDS`);
    ``retries`` says whether a call whose process died may run once more (SPEC 6:
    Python workers yes, shells and the own interpreter no); the death itself is the
    event ``Died`` of the attempt's :class:`Ran`.
    """

    kind: PlaceKind
    retries: bool

    def open_session(self, on_progress: ProgressCallback | None = None) -> Session:
        """Start a new kept session (raises ``CoordexError`` when it cannot start).
        ``on_progress``: the opening call's, given the lines of an environment built
        for it."""
        ...

    def run_stateless(self, request: RunRequest) -> Ran:
        """Run code in a fresh namespace / process / shell that is gone afterwards."""
        ...

    def capabilities_changed(self) -> None:
        """A capability was registered: make it visible to the sessions open here."""
        ...

    def close(self) -> None:
        """End every process this place started that no session owns."""
        ...


# -- capabilities a place's sessions may have (SPEC section 15) ---------------------------
#
# Optional: a session that has one says so by having its methods (the protocols are
# runtime-checkable), and the Executor asks ``isinstance(session, Forkable)``, never which
# place it is. Each place implements them in its own package.


@dataclass(frozen=True)
class Forked:
    """A fork of a session: the new session and how its state was copied.

    ``copy`` is ``"process"`` (the process holding the session was forked: copy-on-write)
    or ``"values"`` (the values were carried into a new session by value); ``left_out``
    names what could not be carried.
    """

    session: Session
    copy: str
    left_out: tuple[str, ...] = ()


@runtime_checkable
class Forkable(Protocol):
    """A session that can be forked into a new, independent one (``fork_session``)."""

    def fork(self, timeout: float) -> Forked:
        """A new session holding a copy of this one's state; this one is never changed.
        Called with the session held (no call runs meanwhile). Raises ``CoordexError``
        when no copy can be made."""
        ...


# What a checkpoint's writer reports once it is done: ``{"bytes", "left_out", "ms"}``,
# or ``{"error": why}`` when nothing was written.
Written = dict[str, Any]


@runtime_checkable
class Checkpointable(Protocol):
    """A session whose state can be written to a folder and put back (checkpoints)."""

    def start_checkpoint(self, folder: str, max_bytes: int) -> Callable[[float], Written]:
        """Start writing the session's state into ``folder`` from a copy of it, and
        return ``finish(timeout)``, which waits for the writer. Called with the session
        held; ``finish`` is called after it is let go, so the session keeps answering
        while its copy writes."""
        ...

    def restore_checkpoint(self, folder: str, timeout: float) -> Written:
        """Put the state written in ``folder`` back in place of the session's (files on
        disk are not touched): ``{"left_out", "ms"}``, or ``{"error": why}``."""
        ...


# -- kept: sessions that outlive their process (SPEC 12) ----------------------------------


@runtime_checkable
class Writer(Protocol):
    """A snapshot being written by a copy of a session (a fork), while the session
    answers on. What :mod:`coordex.persist` watches until it is done."""

    def running(self) -> bool:
        """Whether the copy is still at work (one that ended is reaped here)."""
        ...

    def wait(self) -> None:
        """Wait for a copy that has written to end (reaped)."""
        ...

    def kill(self) -> None:
        """Stop the copy now (what it had not written is kept by the call log)."""
        ...


@dataclass(frozen=True)
class Done:
    """A writer that was done before it was returned (a bash shell dumps itself)."""

    def running(self) -> bool:
        return False

    def wait(self) -> None:
        pass

    def kill(self) -> None:
        pass


@runtime_checkable
class Kept(Protocol):
    """A session whose state can be written to a snapshot folder and brought back into
    a fresh session of the same place, in this process or a later one (SPEC 12).

    The folder's ``meta.json`` (:mod:`coordex.worker._coordex_snapshot`) is the record of
    what was written: the writer updates it last, with ``attempt`` and ``file`` (None and
    ``problem_why`` when nothing was written). When and where snapshots are written, how
    many are kept and what is replayed after one is :mod:`coordex.persist`'s policy.
    """

    def start_snapshot(self, folder: str, *, attempt: int, through: int, max_bytes: int,
                       identity: Mapping[str, Any], close: tuple[int, ...] = ()
                       ) -> Writer | None:
        """Start writing the session's state into ``folder``, tagged ``attempt`` and
        ``through`` (the last logged call it holds), with ``identity`` in its meta.
        Called with the session held; returns at once with the writer (None: the session
        did not answer). ``close``: descriptors a copy of this process lets go of first."""
        ...

    def restore_snapshot(self, folder: str, replay: list[str], timeout: float) -> Written:
        """Load the snapshot in ``folder`` into this session (just opened, no code run),
        then run ``replay`` (the calls that bound what it left out):
        ``{"names", "left_out", "replayed", "ms"}``, or ``{"error": why}``."""
        ...


# -- nested calls: a stored function calling back into the session running it ----------


@runtime_checkable
class RunsNested(Protocol):
    """A session whose running code may call back into itself on the same thread (a
    stored function called from code in the own interpreter)."""

    def running_here(self, frame: Any) -> bool:
        """Whether ``frame`` (or a caller of it) runs in this session right now."""
        ...

    def run_nested(self, request: RunRequest, read_only: bool) -> Ran:
        """Run inside the outer call that is running in this session right now."""
        ...
