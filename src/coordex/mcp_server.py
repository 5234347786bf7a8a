"""The MCP front end: coordex's tools over stdio (``coordex mcp``) and streamable HTTP
(``coordex serve``).

A thin layer. :func:`build_server` makes one low-level MCP ``Server`` over one
:class:`~coordex.Executor`: ``tools/list`` renders :mod:`coordex.tools` (the one source
of the descriptions and schemas) and ``tools/call`` hands the raw arguments to
:func:`coordex.tools.call_tool` in a worker thread, because the executor blocks. The
low-level server is used rather than ``MCPServer`` on purpose: ``MCPServer`` validates
arguments itself and answers a bad one with its generic "Error executing tool" text,
while a model must get the SPEC error dict (``error``/``error_type``/``suggestion``)
that names the fix.

Every result - success or error - becomes a tool result: the dict as structured
content, the same dict as JSON text (image data replaced by a pointer to the image
blocks, so a model is not fed base64), each image as MCP image content, and
``isError`` when the dict is an error. Output produced while a call runs reaches the
client as progress notifications carrying the newest output, and a call that prints
nothing still sends one every few seconds (the heartbeat: elapsed time, newest line).

Stdio: before anything else starts, :func:`claim_stdio` moves the wire to private
descriptors and points fd 1 at stderr and fd 0 at /dev/null, so ``os.write(1, ...)``
or a child process can never write into the protocol stream.

HTTP: :class:`BearerTenantApp` checks ``Authorization: Bearer <token>`` on every
request (constant-time, a wrong token answered exactly like a missing one) and hands
the request to the token's tenant: its own ``Server``, session manager and
``Executor``, so no tenant can reach another's sessions, not even by replaying an MCP
session id.
"""

from __future__ import annotations

import contextlib
import contextvars
import hmac
import io
import json
import os
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from . import __version__
from .contract import ExecutorLike, ForwardsTools
from .core.errors import make_error
from .mcp_hello import INSTRUCTIONS, SERVER_NAME, Greeting, WireFds, claim_stdio
from .observe import http as operator_http
from .observe.hook import watch_tool_call
from .stopping import STOPPING
from .tools import (
    MCP_DEFAULT_TIMEOUT,
    TOOL_NAMES,
    call_tool,
    internal_error,
    json_normal,
    tool_definitions,
)

# How often progress notifications may be sent while output streams in, and how much
# of the newest output each one carries.
PROGRESS_INTERVAL = 0.25
PROGRESS_TAIL_CHARS = 1000
# However silent a call, a progress notification at least this often (SPEC 14 asks for
# one every 10 s; half that leaves room for a loaded machine).
HEARTBEAT_INTERVAL = 5.0
HEARTBEAT_FIRST = 1.0
HEARTBEAT_LINE_CHARS = 200
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


# --- results ---------------------------------------------------------------------------


def to_tool_result(record: dict[str, Any]) -> types.CallToolResult:
    """A coordex result or error dict as an MCP tool result."""
    # One JSON round trip, shared by both views: the structured content is exactly what a
    # client decodes, and the text view is its serialisation (lone surrogates escaped).
    structured = json_normal(record)
    images = [img for img in structured.get("images") or [] if isinstance(img, dict)]
    text_view = structured
    if images:
        text_view = dict(structured)
        text_view["images"] = [
            {"mime": img.get("mime", "image/png"), "data": f"<image content block {i + 1}>"}
            for i, img in enumerate(images)
        ]
    content: list[types.TextContent | types.ImageContent | types.ResourceLink] = [
        types.TextContent(type="text", text=json.dumps(text_view, ensure_ascii=False))
    ]
    for img in images:
        content.append(
            types.ImageContent(
                type="image", data=str(img.get("data", "")), mime_type=img.get("mime", "image/png")
            )
        )
    content.extend(spilled_links(structured))
    return types.CallToolResult(
        content=list(content), structured_content=structured, is_error="error_type" in record
    )


def spilled_links(record: dict[str, Any]) -> list[types.ResourceLink]:
    """A ``resource_link`` for each file holding a stream or value the result cut
    (``spilled``, SPEC 14): a file the session reads, as a ``file://`` URI."""
    spilled = record.get("spilled")
    links = []
    for name, path in (spilled.items() if isinstance(spilled, dict) else ()):
        if not (isinstance(path, str) and os.path.isabs(path)):
            continue
        links.append(types.ResourceLink(
            type="resource_link", uri=Path(path).as_uri(), name=f"{name}.txt",
            title=f"The whole {name} of this call",
            description=f"This call's {name}, whole; the result holds its head and tail. "
                        "Read it through this link, or with execute_code in the same "
                        "session.",
            mime_type="text/plain"))
    return links


# --- progress --------------------------------------------------------------------------


class OutputRelay:
    """Collects output chunks from the executor's threads for the async progress pump.

    ``on_output`` must return at once (it runs on the executor's reader threads), so it
    only records. Build lines (stream ``"build"``: uv's, and the heartbeat while it is
    silent) and this call's own heartbeat lines (:meth:`beat`) are each sent as a
    notification of their own, in order; the run's output is
    sent at most once per interval as its newest part, a change of stream always
    starting a new line. ``progress`` is the number of characters seen so far, raised by
    one where needed so that it rises with every notification (as MCP requires).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen = 0
        self._output_sent = 0
        self._output_seen = 0
        self._progress = 0
        self._tail = ""
        self._stream = ""
        self._lines: deque[str] = deque()

    def __call__(self, stream: str, text: str) -> None:
        with self._lock:
            if stream == "build":
                for line in text.splitlines() or [""]:
                    self._seen += len(line) + 1
                    self._lines.append(f"[build] {line}")
                return
            self._seen += len(text)
            self._output_seen += len(text)
            prefix = "" if stream in ("stdout", "") else f"[{stream}] "
            if self._tail and not self._tail.endswith("\n"):
                # A chunk goes on the line the last one left open, unless the stream changed.
                prefix = "" if stream == self._stream else "\n" + prefix
            self._stream = stream
            self._tail = (self._tail + prefix + text)[-PROGRESS_TAIL_CHARS:]

    def take(self) -> list[tuple[int, str]]:
        """What to send now: each build line not sent yet, then the newest output if any
        came since the last take; each with its progress value."""
        with self._lock:
            updates = [(self._next(), line) for line in self._lines]
            self._lines.clear()
            if self._output_seen != self._output_sent:
                self._output_sent = self._output_seen
                updates.append((self._next(), self._tail))
            return updates

    def beat(self, elapsed: float) -> None:
        """A heartbeat line for a call silent since the last notification: the seconds
        it has run and the newest line of its output, if any."""
        with self._lock:
            newest = next((line for line in reversed(self._tail.splitlines()) if line.strip()),
                          "")
            line = f"running for {elapsed:.0f} s"
            if newest:
                line += f"; newest output: {newest[-HEARTBEAT_LINE_CHARS:]}"
            self._lines.append(line)

    def _next(self) -> int:
        self._progress = max(self._seen, self._progress + 1)
        return self._progress


async def _send_progress(ctx: ServerRequestContext[Any, Any], relay: OutputRelay) -> bool:
    """Send what the relay holds; whether anything went."""
    updates = relay.take()
    for progress, message in updates:
        # A no-op when the client sent no progress token.
        await ctx.session.report_progress(float(progress), None, message)
    return bool(updates)


async def _pump_progress(ctx: ServerRequestContext[Any, Any], relay: OutputRelay) -> None:
    """Output as it comes, and the heartbeat (SPEC 14): however silent the call, a
    notification at least every :data:`HEARTBEAT_INTERVAL`, so clients that give up on
    a call without a sign of life keep waiting for it."""
    started = time.monotonic()
    # The first sign comes early (a fast call sends none), then one every interval.
    last = started - HEARTBEAT_INTERVAL + HEARTBEAT_FIRST
    while True:
        await anyio.sleep(PROGRESS_INTERVAL)
        now = time.monotonic()
        if now - last >= HEARTBEAT_INTERVAL:
            relay.beat(now - started)
        if await _send_progress(ctx, relay):
            last = now


# --- stopping (SPEC section 8) -----------------------------------------------------------


# How long answers to the requests in flight may take at a stop (SPEC: out within 5 s).
ANSWER_SECONDS = 3.0
# Once the last one left run_tool: time for the transport to write it.
WRITE_SECONDS = 0.3


def stop_answering(executors: Sequence[ExecutorLike]) -> None:
    """Begin the stop: no new call runs, the executors close (every call in flight
    returns its error dict), and this returns once each has been answered or
    :data:`ANSWER_SECONDS` passed. Blocks; run it off the event loop. Never raises."""
    STOPPING.event.set()
    for executor in executors:
        with contextlib.suppress(Exception):
            executor.close()
    if STOPPING.wait_answered(ANSWER_SECONDS):
        time.sleep(WRITE_SECONDS)


def stopping_result(result: dict[str, Any] | None = None) -> dict[str, Any]:
    """The answer to a request the stop ended (or that came during it): the call's own
    record with its ``state_lost`` and output kept, its error worded for the stop."""
    record = dict(result or {})
    record.update(make_error(
        record.get("error_type", "crashed") if result else "crashed",
        "The server is stopping: this call was ended before it finished"
        if result else "The server is stopping: this call did not run.",
        "Run the call again once the server is back; sessions do not outlive the "
        "server, so rebuild_session brings a session's state back from the call log.",
        state_lost=bool(record.get("state_lost", False))))
    return record


# --- long work (SPEC 14) ------------------------------------------------------------------

# Seconds a tool call waits over MCP before it answers ``running`` (``--max-wait``): the
# default of ``wait`` and its most, below the ~60 s at which hosted clients cut a call.
MAX_WAIT = 45.0
# The tools that take ``wait``.
WAITING_TOOLS = ("execute_code", "call_function", "rebuild_session", "wait_call")


def with_wait(name: str, arguments: Any, max_wait: float) -> Any:
    """``arguments`` with ``wait`` at most ``max_wait`` (its default when not given); a
    ``wait`` that is not a positive number is left for the executor to refuse."""
    if name not in WAITING_TOOLS or not isinstance(arguments, dict | None):
        return arguments
    args = dict(arguments or {})
    given = args.get("wait")
    if given is None:
        args["wait"] = max_wait
    elif isinstance(given, int | float) and not isinstance(given, bool) and given > 0:
        args["wait"] = min(float(given), max_wait)
    return args


class Delivery:
    """Whether the answer to one HTTP request reached the client (SPEC 14).

    Set for each request by :class:`BearerTenantApp` (a context variable, which the SDK
    carries into the tool handler); the response's last body message marks it
    delivered. A request that ends without it (the stream broke, the client went away)
    is lost: the calls that answered it are held for their re-sent twins."""

    def __init__(self) -> None:
        self.finished = False
        self.disconnected = False
        self.ended = False
        self._lost: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def on_lost(self, action: Callable[[], None]) -> None:
        with self._lock:
            if not self.ended:
                self._lost.append(action)
                return
            lost = not self.finished
        if lost:
            _in_thread(action)

    def end(self) -> None:
        with self._lock:
            self.ended = True
            actions, self._lost = ([] if self.finished else self._lost), []
        for action in actions:
            _in_thread(action)


def _in_thread(action: Callable[[], object]) -> None:
    threading.Thread(target=action, name="coordex-hold", daemon=True).start()


DELIVERY: contextvars.ContextVar[Delivery | None] = contextvars.ContextVar(
    "coordex_delivery", default=None)


def _hold(executor: ExecutorLike, result: Any) -> Callable[[], None]:
    """What holds ``result``'s call for redelivery (a result with no call_id: nothing)."""
    def hold() -> None:
        call_id = result.get("call_id") if isinstance(result, dict) else None
        hold_call = getattr(executor, "hold_call", None)
        if isinstance(call_id, str) and hold_call is not None:
            with contextlib.suppress(Exception):
                hold_call(call_id)

    return hold


# --- the tasks extension (SPEC 14) -----------------------------------------------------------

TASKS = "io.modelcontextprotocol/tasks"
# How long a task's record is kept (the call record's: an hour), and how often to poll.
TASK_TTL_MS = 3_600_000
TASK_POLL_MS = 2_000


def wants_tasks(ctx: Any) -> bool:
    """Whether this request's client declared the tasks extension (2026-07-28: per
    request, in its ``_meta`` capabilities)."""
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS

    meta = getattr(ctx, "meta", None)
    if not isinstance(meta, dict):
        return False
    if meta.get("io.modelcontextprotocol/protocolVersion") not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = meta.get("io.modelcontextprotocol/clientCapabilities")
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
    return isinstance(extensions, dict) and TASKS in extensions


def _iso(at: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


def task_of(record: dict[str, Any], result_type: str) -> dict[str, Any]:
    """A call record (running, or final) as a task of the tasks extension."""
    now = time.time()
    started = now - float(record.get("elapsed_ms") or record.get("duration_ms") or 0) / 1000
    task: dict[str, Any] = {
        "resultType": result_type, "taskId": record["call_id"], "status": "working",
        "createdAt": _iso(started), "lastUpdatedAt": _iso(now), "ttlMs": TASK_TTL_MS,
        "pollIntervalMs": TASK_POLL_MS}
    if record.get("running"):
        task["statusMessage"] = "Running; output so far: " + (
            str(record.get("stdout") or "")[-500:] or "(none)")
    else:
        task["status"] = "completed"
        task["result"] = to_tool_result(record).model_dump(by_alias=True, mode="json",
                                                          exclude_none=True)
    return task


def add_tasks(server: Server[Any], executor: ExecutorLike, limiter: anyio.CapacityLimiter | None) -> None:
    """Serve ``tasks/get`` and ``tasks/cancel`` from the call record behind
    ``wait_call`` and ``cancel_call``; a ``tools/call`` answered ``running`` becomes a
    task for a client that declared the extension (:func:`wants_tasks`)."""
    from mcp.shared.exceptions import MCPError
    from mcp_types import CancelTaskRequestParams, GetTaskRequestParams

    def refuse(ctx: Any) -> None:
        if not wants_tasks(ctx):
            raise MCPError(code=-32021, message="Missing required client capability",
                           data={"requiredCapabilities": {"extensions": {TASKS: {}}}})

    # A task's poll and cancel reach no model (a confined host's reply to them must not
    # say the loss a model is yet to be told of, SPEC 9).
    poll = getattr(executor, "poll_call", None) or (lambda call_id: executor.wait_call(
        call_id, 0.001))
    stop = getattr(executor, "stop_call", None) or executor.cancel_call

    async def current(task_id: str) -> dict[str, Any]:
        record = await anyio.to_thread.run_sync(lambda: poll(task_id), limiter=limiter)
        if not isinstance(record, dict) or "call_id" not in record:
            raise MCPError(code=-32602, message="Failed to retrieve task: Task not found "
                           "(results are kept an hour after a call ends)")
        return record

    async def get(ctx: Any, params: GetTaskRequestParams) -> dict[str, Any]:
        refuse(ctx)
        return task_of(await current(params.task_id), "complete")

    async def cancel(ctx: Any, params: CancelTaskRequestParams) -> dict[str, Any]:
        refuse(ctx)
        await current(params.task_id)
        # Cooperative and eventually consistent: acknowledged at once, interrupted
        # as cancel_call interrupts; tasks/get then shows the call's final result.
        _in_thread(lambda: stop(params.task_id))
        return {}

    server.add_request_handler("tasks/get", GetTaskRequestParams, get)
    server.add_request_handler("tasks/cancel", CancelTaskRequestParams, cancel)
    server.extensions[TASKS] = {}


# --- spilled files as resources (SPEC 14) ------------------------------------------------

# JSON-RPC error code of a resource that does not exist (the MCP specification's).
RESOURCE_NOT_FOUND = -32002


def add_resources(server: Server[Any], executor: ExecutorLike,
                  limiter: anyio.CapacityLimiter | None) -> None:
    """Serve ``resources/read`` for the ``resource_link`` of each spilled file: read by
    this server's executor (a tenant's own, in its host), so a tenant reaches its own
    files alone. ``resources/list`` is empty: the files are reached by their links."""
    from mcp.shared.exceptions import MCPError

    async def read(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        uri = str(params.uri)
        found = await anyio.to_thread.run_sync(executor.read_spilled, uri, limiter=limiter)
        if not isinstance(found, dict) or not isinstance(found.get("text"), str):
            said = found.get("error") if isinstance(found, dict) else None
            raise MCPError(code=RESOURCE_NOT_FOUND,
                           message=str(said or f"Resource not found: {uri}"),
                           data={"uri": uri})
        return types.ReadResourceResult(contents=[types.TextResourceContents(
            uri=uri, mime_type=str(found.get("mime_type") or "text/plain"),
            text=found["text"])])

    async def listed(ctx: Any, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[])

    server.add_request_handler("resources/read", types.ReadResourceRequestParams, read)
    server.add_request_handler("resources/list", types.PaginatedRequestParams, listed)


# --- the server ------------------------------------------------------------------------


async def run_tool(
    executor: ExecutorLike, name: str, arguments: dict[str, Any] | None,
    ctx: ServerRequestContext[Any, Any] | None = None,
    limiter: anyio.CapacityLimiter | None = None,
) -> dict[str, Any]:
    """Run one tool call in a worker thread, relaying output as progress.

    ``limiter`` bounds the threads of this executor's calls (a tenant's own limit, so
    no tenant's calls can hold every thread); default: anyio's shared pool. An executor
    with ``forward_tool`` (a confined host's client) takes the whole call over its pipe.

    If the request is cancelled and the executor's ``execute_code`` accepts a
    ``cancel`` event, the event is set so the running code is interrupted; otherwise
    the call finishes in the background (bounded by its timeout) and its result is
    dropped.
    """
    if STOPPING.event.is_set():
        return stopping_result()
    STOPPING.enter()
    try:
        result = await _run_tool(executor, name, arguments, ctx, limiter)
    finally:
        STOPPING.leave()
    if STOPPING.event.is_set() and "error" in result:
        return stopping_result(result)
    return result


async def _run_tool(
    executor: ExecutorLike, name: str, arguments: dict[str, Any] | None,
    ctx: ServerRequestContext[Any, Any] | None,
    limiter: anyio.CapacityLimiter | None,
) -> dict[str, Any]:
    relay = OutputRelay()
    cancel = threading.Event()
    arguments = with_wait(name, arguments, MAX_WAIT)
    delivery = DELIVERY.get()
    lost = threading.Event()  # the request's stream broke: the result is held, not sent
    answered: list[dict[str, Any]] = []

    forward = executor.forward_tool if isinstance(executor, ForwardsTools) else None

    def work() -> dict[str, Any]:
        if forward is not None:
            from .log.running import tracked

            # The page lists the calls a confined host runs from here, where they pass.
            with tracked(executor, name, arguments, relay, cancel) as watch:
                return watch.done(forward(name, arguments, on_output=watch.output,
                                          cancel=cancel))
        return call_tool(executor, name, arguments, on_output=relay, cancel=cancel)

    def guarded() -> dict[str, Any]:
        try:
            result = work()
        except Exception as exc:  # a coordex bug must still reach the model as data
            result = internal_error(exc)
        answered.append(result)
        if lost.is_set():
            _hold(executor, result)()
        return result

    try:
        async with anyio.create_task_group() as tg:
            if ctx is not None:
                tg.start_soon(_pump_progress, ctx, relay)
            try:
                result = await anyio.to_thread.run_sync(guarded, abandon_on_cancel=True,
                                                        limiter=limiter)
            finally:
                tg.cancel_scope.cancel()
    except anyio.get_cancelled_exc_class():
        if delivery is not None and delivery.disconnected:
            # The stream broke (at 2026-07-28 a closed stream is all a client sends):
            # the code goes on and its result is held for the re-sent call (SPEC 14).
            lost.set()
            if answered:
                _in_thread(_hold(executor, answered[0]))
        else:
            cancel.set()
        raise
    if delivery is not None:
        delivery.on_lost(_hold(executor, result))
    if ctx is not None:
        # Output of the last interval (or of a call shorter than one) still goes out,
        # ahead of the result.
        with contextlib.suppress(Exception):
            await _send_progress(ctx, relay)
    return result


def build_server(executor: ExecutorLike, name: str = SERVER_NAME,
                 limiter: anyio.CapacityLimiter | None = None, *,
                 tenant: str | None = None, transport: str = "pipe") -> Server[Any]:
    """A low-level MCP server exposing every coordex tool over ``executor``.

    ``tenant`` (under ``--tokens``) labels the calls' figures and log lines;
    ``transport`` is the span's ``network.transport`` (``pipe`` for stdio, ``tcp``)."""

    # The descriptions name the call timeout this server's executor applies (50 s unless
    # the operator chose another with --timeout).
    default_timeout = getattr(executor, "timeout", MCP_DEFAULT_TIMEOUT)

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        defs = tool_definitions("mcp", default_timeout=default_timeout, default_wait=MAX_WAIT)
        assert isinstance(defs, list)  # "mcp" is a known format
        return types.ListToolsResult(tools=[types.Tool.model_validate(d) for d in defs])

    async def call(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | dict[str, Any]:
        # Unknown tools and malformed arguments come back from call_tool as error dicts.
        watch = watch_tool_call(tenant, transport, params.name, params.arguments, ctx.meta)
        try:
            record = await run_tool(executor, params.name, params.arguments, ctx, limiter)
        except BaseException:
            if watch is not None:
                watch.done({"error_type": "cancelled"})
            raise
        if watch is not None:
            watch.done(record)
        if record.get("running") and wants_tasks(ctx):  # SPEC 14: a task of the call
            return task_of(record, "task")
        return to_tool_result(record)

    def input_schema(tool: str) -> dict[str, Any] | None:
        # Used by the SDK only for header validation; the schema is the tools.py one.
        defs = tool_definitions("mcp", names=[tool]) if tool in TOOL_NAMES else []
        return defs[0]["inputSchema"] if isinstance(defs, list) and defs else None

    server: Server[Any] = Server(
        name,
        version=__version__,
        instructions=INSTRUCTIONS,
        get_tool_input_schema=input_schema,
        on_list_tools=list_tools,
        # The SDK types a tools/call handler's result as CallToolResult (or input
        # required); a task of the tasks extension is a dict it passes as it is.
        on_call_tool=cast(Any, call),
    )
    add_tasks(server, executor, limiter)
    add_resources(server, executor, limiter)
    return server


# --- stdio -----------------------------------------------------------------------------


# An escaped backslash, a surrogate pair, or a lone surrogate, as JSON escapes.
_JSON_SURROGATE = re.compile(
    r"\\\\|\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})|\\u(d[89a-f][0-9a-f]{2})", re.I)


def escape_json_surrogates(line: str) -> str:
    """A JSON text whose lone-surrogate escapes (``\\udce9``) are made literal text.

    The SDK drops a message holding one without a reply (the client then waits for
    ever); written as ``\\\\udce9`` it arrives as the same escaped text every place
    prints for such a character.
    """
    if "\\u" not in line:
        return line
    return _JSON_SURROGATE.sub(lambda m: "\\\\u" + m.group(3) if m.group(3) else m.group(0), line)


class _EscapedLines(io.TextIOBase):
    """The client's lines, passed through :func:`escape_json_surrogates`."""

    def __init__(self, inner: io.TextIOWrapper) -> None:
        super().__init__()
        self._inner = inner

    def readable(self) -> bool:
        return True

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
        return escape_json_surrogates(self._inner.readline(-1 if size is None else size))


class _ReadFirst(io.RawIOBase):
    """A descriptor's bytes, after the ``first`` bytes someone already read from it.

    Never closes the descriptor: the SDK's reader thread may still block on it at exit.
    """

    def __init__(self, fd: int, first: bytes) -> None:
        super().__init__()
        self._fd = fd
        self._first = first

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._first:
            n = min(len(buffer), len(self._first))
            buffer[:n] = self._first[:n]
            self._first = self._first[n:]
            return n
        data = os.read(self._fd, len(buffer))
        buffer[:len(data)] = data
        return len(data)


class _Answered(io.TextIOBase):
    """The wire as the SDK writes it, less its answer to the ``initialize`` that
    :func:`coordex.mcp_hello.greet` answered already."""

    def __init__(self, inner: io.TextIOWrapper, greeting: Greeting) -> None:
        super().__init__()
        self._inner = inner
        self._greeting = greeting

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self._greeting.drops(text):
            return len(text)
        return self._inner.write(text)

    def flush(self) -> None:
        self._inner.flush()


async def serve_stdio(executor: ExecutorLike, wire: WireFds, greeting: Greeting | None = None) -> None:
    """Serve one MCP client over the claimed descriptors until it closes stdin.

    ``greeting``: what :func:`coordex.mcp_hello.greet` read and answered before the SDK
    was loaded; the SDK reads it first and its second answer is dropped.
    """
    server = build_server(executor)
    greeting = greeting if greeting is not None else Greeting()
    reader = io.TextIOWrapper(io.BufferedReader(_ReadFirst(wire.read_fd, greeting.read)),
                              encoding="utf-8", errors="replace")
    writer = io.TextIOWrapper(
        os.fdopen(wire.write_fd, "wb", closefd=False), encoding="utf-8", write_through=True
    )
    lines = _EscapedLines(reader)
    answered = _Answered(writer, greeting)
    async with stdio_server(stdin=anyio.wrap_file(cast(Any, lines)),
                            stdout=anyio.wrap_file(cast(Any, answered))) as (
        read_stream,
        write_stream,
    ):
        await server.run(read_stream, write_stream, server.create_initialization_options())


# --- HTTP ------------------------------------------------------------------------------

TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class TokenFileError(ValueError):
    """A ``--tokens`` file that cannot be used; the message names the line and the fix."""


def parse_tokens(text: str, source: str = "tokens file") -> dict[str, str]:
    """``NAME TOKEN`` lines → {name: token}. Blank lines and ``#`` comments are skipped."""
    tenants: dict[str, str] = {}
    seen_tokens: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise TokenFileError(
                f"{source}, line {number}: expected 'NAME TOKEN', got {len(parts)} field(s)."
            )
        name, token = parts
        if not TENANT_NAME.match(name):
            raise TokenFileError(
                f"{source}, line {number}: tenant name {name!r} must be letters, digits, "
                "'_', '.' or '-' (starting with a letter or digit, at most 64 characters)."
            )
        if name in tenants:
            raise TokenFileError(f"{source}, line {number}: tenant {name!r} is listed twice.")
        if token in seen_tokens:
            raise TokenFileError(
                f"{source}, line {number}: tenant {name!r} reuses another tenant's token; "
                "every tenant needs its own."
            )
        tenants[name] = token
        seen_tokens.add(token)
    if not tenants:
        raise TokenFileError(f"{source}: no 'NAME TOKEN' lines found.")
    return tenants


@dataclass
class Tenant:
    name: str
    token: str
    executor: ExecutorLike
    manager: StreamableHTTPSessionManager


def security_settings(host: str, extra_hosts: Sequence[str] = ()) -> TransportSecuritySettings:
    """DNS-rebinding protection: only loopback names (and the bound host) may be used."""
    # A Host header may omit the port (a proxy on 80/443 forwarding, some clients).
    hosts = ["127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.1", "localhost", "[::1]"]
    origins = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]
    for name in [host, *extra_hosts]:
        if name in LOOPBACK_HOSTS or name in ("0.0.0.0", "::", ""):
            continue
        shown = f"[{name}]" if ":" in name else name
        hosts += [shown, f"{shown}:*"]
        origins += [f"http://{shown}:*", f"https://{shown}:*", f"https://{shown}"]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )


class BearerTenantApp:
    """ASGI app: Bearer check on every request, then the token's tenant's MCP endpoint.

    Every configured token is compared (``hmac.compare_digest``) so the time taken does
    not reveal which, if any, matched a prefix. The lifespan runs every tenant's session
    manager and closes the executors on shutdown.
    """

    def __init__(self, tenants: Sequence[Tenant], path: str = "/mcp",
                 ui_root: Path | None = None, oauth: Any = None) -> None:
        self.tenants = list(tenants)
        self.path = path.rstrip("/") or "/"
        # coordex.oauth.OAuthGate when serve takes JWTs of an issuer beside the tokens.
        self.oauth = oauth
        # The operator's token for /metrics (every tenant's series), when one is set.
        self.metrics_token: str | None = None
        from .ui import UIApp
        from .ui.keys import SignedKeys, secret_under

        # A browser's login outlives a restart: its keys are signed with a secret kept
        # in the server's data folder (``ui_root``), for whichever token it showed.
        keys = None if ui_root is None else SignedKeys(
            secret_under(ui_root), lambda: [tenant.token for tenant in self.tenants])

        # The page (SPEC 11): a token may come as ?token= once, then the browser's keys;
        # it shows the token's tenant alone, with the Host/Origin rules of /mcp.
        checks = getattr(self.tenants[0].manager, "security_settings", None) \
            if self.tenants else None
        self.ui = UIApp(lambda token: getattr(self.tenant_for(f"Bearer {token}"), "executor", None),
                        allowed_hosts=getattr(checks, "allowed_hosts", None),
                        allowed_origins=getattr(checks, "allowed_origins", None), keys=keys)

    def tenant_for(self, authorization: str | bytes | None) -> Tenant | None:
        presented = b""
        if isinstance(authorization, bytes):  # as sent: a token is UTF-8, nothing else
            try:
                authorization = authorization.decode("utf-8")
            except UnicodeDecodeError:
                return None
        if authorization:
            scheme, _, credentials = authorization.partition(" ")
            if scheme.lower() == "bearer":
                presented = credentials.strip().encode("utf-8", "replace")
        found: Tenant | None = None
        for tenant in self.tenants:
            if hmac.compare_digest(presented, tenant.token.encode("utf-8")) and presented:
                found = tenant
        return found

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if await operator_http.answer(self, scope, send):  # /healthz, /readyz, /metrics
            return
        if self.ui.handles(scope["path"]):
            from .ui.asgi import serve_asgi

            await serve_asgi(self.ui, scope, receive, send)
            return
        if self.oauth is not None and self.oauth.handles(scope["path"]):
            await self.oauth.metadata(scope, receive, send)  # RFC 9728, before any token
            return
        # Exactly one Authorization header, or none is taken (two could each be read
        # by a different part: the first by one proxy, the last by another).
        sent = [v for k, v in scope["headers"] if k.lower() == b"authorization"]
        tenant = self.tenant_for(sent[0]) if len(sent) == 1 else None
        if tenant is None and self.oauth is not None and len(sent) <= 1:
            try:
                tenant = await self._oauth_tenant(scope)
            except PermissionError as exc:
                await _plain_response(send, 403, f"Forbidden: {exc}\n")
                return
        if tenant is None:
            challenge = self.oauth.challenge() if self.oauth is not None \
                else b'Bearer realm="coordex"'
            await _plain_response(
                send, 401, "Unauthorized: send 'Authorization: Bearer <token>'.\n",
                [(b"www-authenticate", challenge)],
            )
            return
        if scope["path"].rstrip("/") != self.path:
            await _plain_response(send, 404, f"Not found: the MCP endpoint is {self.path}\n")
            return
        delivery = Delivery()
        token = DELIVERY.set(delivery)

        async def watched_receive() -> Any:
            message = await receive()
            if message.get("type") == "http.disconnect":
                delivery.disconnected = True
            return message

        async def watched_send(message: Any) -> None:
            await send(message)
            if message.get("type") == "http.response.body" and not message.get("more_body"):
                delivery.finished = True

        try:
            await tenant.manager.handle_request(scope, watched_receive, watched_send)
        finally:
            DELIVERY.reset(token)
            delivery.end()

    async def _oauth_tenant(self, scope: Any) -> Tenant | None:
        names = [tenant.name for tenant in self.tenants]
        name = await self.oauth.tenant_name(scope, names)
        return None if name is None else self.tenants[names.index(name)]

    async def _lifespan(self, receive: Any, send: Any) -> None:
        message = await receive()
        assert message["type"] == "lifespan.startup"
        async with contextlib.AsyncExitStack() as stack:
            try:
                for tenant in self.tenants:
                    await stack.enter_async_context(tenant.manager.run())
            except Exception as exc:
                await send({"type": "lifespan.startup.failed", "message": str(exc)})
                return
            await send({"type": "lifespan.startup.complete"})
            message = await receive()
        for tenant in self.tenants:
            with contextlib.suppress(Exception):
                await anyio.to_thread.run_sync(tenant.executor.close)
        await send({"type": "lifespan.shutdown.complete"})


async def _plain_response(
    send: Any, status: int, text: str, extra: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    body = text.encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            *extra,
        ],
    })
    await send({"type": "http.response.body", "body": body})


def make_tenant(
    name: str, token: str, executor: ExecutorLike, host: str, extra_hosts: Sequence[str] = (), *,
    limiter: anyio.CapacityLimiter | None = None, max_mcp_sessions: int | None = None,
    idle_timeout: float | None = None, tenant_label: str | None = None,
) -> Tenant:
    """One tenant's MCP endpoint; its own thread ``limiter`` and MCP session cap;
    ``tenant_label`` names it in figures and log lines (under ``--tokens``)."""
    server = build_server(executor, limiter=limiter, transport="tcp",
                          tenant=tenant_label)
    manager = StreamableHTTPSessionManager(
        app=server, security_settings=security_settings(host, extra_hosts),
        max_sessions=max_mcp_sessions, session_idle_timeout=idle_timeout or 1800,
    )
    return Tenant(name, token, executor, manager)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0 = any free port); OSError if it cannot.

    Bound here rather than by uvicorn so a busy port is a clean error before any
    executor starts, and ``--port 0`` can report the port it got.
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


async def serve_http(app: BearerTenantApp, sock: socket.socket,
                     on_ready: Callable[[], None] | None = None) -> None:
    """Run ``app`` under uvicorn on ``sock`` until interrupted; ``on_ready()`` once serving."""
    import uvicorn

    executors = [tenant.executor for tenant in app.tenants]

    class StoppingServer(uvicorn.Server):
        """At the first SIGTERM/SIGINT the requests in flight are answered (the
        executors close, each call returns, :func:`stop_answering`) before uvicorn
        starts its shutdown; a second signal stops at once."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            if STOPPING.event.is_set():
                super().handle_exit(sig, frame)
                return

            def answer_then_exit() -> None:
                stop_answering(executors)
                super(StoppingServer, self).handle_exit(sig, None)

            STOPPING.event.set()
            threading.Thread(target=answer_then_exit, name="coordex-stop",
                             daemon=True).start()

    # Streams still open once the answers went (a GET stream, a /ui request) get
    # this long, then are cancelled: the server is out within 5 s of the signal.
    # A header deadline, a header size and room for every client (SPEC 8: no tenant's
    # idle half-requests use up the server's descriptors): see coordex.connections.
    from .connections import BACKLOG, guarded_protocol

    config = uvicorn.Config(app, log_level="warning", lifespan="on",
                            timeout_graceful_shutdown=1, http=guarded_protocol(),
                            backlog=BACKLOG)
    server = StoppingServer(config)

    async def announce() -> None:
        while not server.started:
            await anyio.sleep(0.05)
        if on_ready is not None:
            on_ready()

    async with anyio.create_task_group() as tg:
        tg.start_soon(announce)
        try:
            await server.serve(sockets=[sock])
        finally:
            tg.cancel_scope.cancel()


__all__ = [
    "STOPPING", "BearerTenantApp", "OutputRelay", "Tenant", "TokenFileError", "WireFds",
    "bind_socket", "build_server", "claim_stdio", "internal_error", "make_tenant",
    "parse_tokens", "run_tool", "security_settings", "serve_http", "serve_stdio",
    "stop_answering", "stopping_result", "to_tool_result",
]
