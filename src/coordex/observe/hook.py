"""The hooks the call path holds: standard library only, and all but free when off.

Three places call in here: ``Executor.execute_code`` / ``Executor.call_tool``
(:func:`watch_call`), the MCP server's tool dispatch (:func:`watch_tool_call`, the
server side of every tenant), and an environment build (:func:`watch_build`). Each asks
first whether anyone observes: tracing is on when ``opentelemetry.trace`` is already
imported *and* a real tracer provider is set (a dict lookup and an ``isinstance``);
metrics when a front end installed :data:`FIGURES` or a meter provider is set. When no
one observes, a hook returns ``None`` and nothing of OpenTelemetry or
``prometheus_client`` is ever imported by coordex.

Three context variables carry a call's facts across the layers of one process:
``IN_TOOL_CALL`` (the watch of the call: a front end's already makes this call's span
and counts it, so the executor makes no second one), ``CALL_ENV``
(``TRACEPARENT``/``TRACESTATE`` the call's code sees) and ``CALL_FACTS`` (builds a
confined host made during the call, handed back to the server with the result, which
counts them for the tenant).

A call given ``wait`` that answers ``running`` (SPEC 14) ends its span with that answer,
as the MCP conventions have a request's span end with its response; long work tells the
watch (:func:`telling_end`) when the code ends, on the call's own thread, and the run
becomes a child span of the call's with its outcome (``execute_tool {tool}``).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .shared import FACTS_KEY, coordinates

# The watch of the call running in this context (True: a confined host's call, watched
# by its server); False: none.
IN_TOOL_CALL: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "coordex_in_tool_call", default=False)
CALL_ENV: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "coordex_call_env", default=None)
CALL_FACTS: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar(
    "coordex_call_facts", default=None)

# The server's figures (observe.figures.Figures), set by `coordex serve --metrics` or
# when a meter provider is configured; None: nothing is counted.
FIGURES: Any = None
CALLS_LOG = logging.getLogger("coordex.calls")



_spans: Any = None  # observe.spans, once OpenTelemetry is loaded


def tracing_on() -> bool:
    """True when spans would be recorded: OpenTelemetry loaded and a provider set."""
    global _spans
    if _spans is None:
        if "opentelemetry.trace" not in sys.modules:
            return False
        from . import spans as _spans
    return bool(_spans.active())


def call_env() -> Mapping[str, str] | None:
    """``TRACEPARENT`` (and ``TRACESTATE``) for the call running in this context."""
    return CALL_ENV.get()


def call_span() -> Any:
    """The span of the call running in this context, if a watch made or holds one."""
    watch = IN_TOOL_CALL.get()
    return watch._span if isinstance(watch, _Ends) else None


# Taken twice by a call that answers ``running``, never by any other.
_ENDS = threading.Lock()


class _Ends:
    """What a watch knows of a call that may answer ``running`` before its code ends
    (SPEC 14): ``_end`` is None, then ``("ended", result)`` if the code ended first or
    ``("detached", arguments, call_id)`` if the answer came first; whichever comes
    second makes the run's span."""

    __slots__ = ("_end", "_span", "tool")

    def __init__(self, tool: str, span: Any) -> None:
        self.tool = tool
        self._span = span
        self._end: tuple[Any, ...] | None = None

    def answered(self, arguments: Mapping[str, Any] | None, result: Any) -> None:
        """The call answered ``result``; if that is ``running``, its run is to come."""
        if self._span is None or type(result) is not dict or not result.get("running"):
            return
        with _ENDS:
            ended, self._end = self._end, ("detached", arguments, result.get("call_id"))
        if ended is not None and ended[0] == "ended":
            _spans.execution_span(self._span, self.tool, arguments, ended[1],
                                  result.get("call_id"))

    def code_ended(self, result: Any) -> None:
        """On the call's own thread: its code ended with ``result``."""
        with _ENDS:
            detached = self._end
            if detached is None:
                self._end = ("ended", result)
                return
        if detached[0] == "detached":
            _spans.execution_span(self._span, self.tool, detached[1], result, detached[2])


class _Watch(_Ends):
    """One call watched by the executor (a library user's call, no front end)."""

    __slots__ = ("_env_token", "_started", "_token")

    def __init__(self, tool: str, span: Any) -> None:
        _Ends.__init__(self, tool, span)
        self._started = time.perf_counter()
        self._token = IN_TOOL_CALL.set(self)
        self._env_token = CALL_ENV.set(_spans.trace_env(span)) if span is not None else None

    def done(self, arguments: Mapping[str, Any] | None, result: Any) -> None:
        seconds = time.perf_counter() - self._started
        span = self._span
        if span is not None:
            try:
                _spans.finish(span, self.tool, arguments, result, library=True)
                self.answered(arguments, result)
            finally:
                span.end()
        if FIGURES is not None:
            FIGURES.count(None, self.tool, arguments, result, seconds)
        if CALLS_LOG.isEnabledFor(logging.INFO):
            log_call(None, self.tool, arguments, result, seconds)

    def close(self) -> None:
        if self._env_token is not None:
            CALL_ENV.reset(self._env_token)
        IN_TOOL_CALL.reset(self._token)


def watch_call(tool: str) -> _Watch | None:
    """The executor's hook: a watch for one library call, or None when no one observes
    (or a front end already watches this call)."""
    if IN_TOOL_CALL.get():
        return None
    if FIGURES is None and "opentelemetry.metrics" in sys.modules:
        _meter_figures()
    tracing = tracing_on()
    if not tracing and FIGURES is None and not CALLS_LOG.isEnabledFor(logging.INFO):
        return None
    return _Watch(tool, _spans.start_call(tool) if tracing else None)


def watched(tool: str, arguments: Mapping[str, Any], call: Callable[[], Any]) -> Any:
    """``call()`` watched as the library call ``tool`` with ``arguments`` (every tool
    but the code's own, which the call path watches: SPEC 16's span per tool call; a
    ``wait_call``'s or ``cancel_call``'s links to the call's)."""
    watch = watch_call(tool)
    if watch is None:
        return call()
    result: Any = None
    try:
        result = call()
    finally:
        watch.done(arguments, result)
        watch.close()
    return result


def telling_end(run: Callable[[Any, Any, Any], dict[str, Any]],
                wait: Any) -> Callable[[Any, Any, Any], dict[str, Any]]:
    """Long work's hook (SPEC 14): ``run`` as it is, or, for a call given ``wait`` that
    has a span, made to tell the call's watch when its code ends (it may answer
    ``running`` before)."""
    watch = IN_TOOL_CALL.get() if wait is not None else None
    if not isinstance(watch, _Ends) or watch._span is None:
        return run

    def run_and_tell(output: Any, cancel: Any, recorded: Any) -> dict[str, Any]:
        result: Any = None
        try:
            result = run(output, cancel, recorded)
        finally:
            watch.code_ended(result)
        return result

    return run_and_tell


_meter_seen: list[Any] = [None]  # the meter provider last found to record nothing


def _meter_figures() -> None:
    """A library user's meter provider gets the same figures as a server's (looked at
    again only when the global provider changes)."""
    global FIGURES
    provider = sys.modules["opentelemetry.metrics"].get_meter_provider()
    if provider is _meter_seen[0]:
        return
    from .figures import Figures, meter_active

    if meter_active():
        FIGURES = Figures(prometheus=False)
    else:
        _meter_seen[0] = provider


@contextlib.contextmanager
def watch_build(venv_id: Any) -> Iterator[dict[str, Any]]:
    """Around an environment build: a child span, and the build counted (in this
    process's figures, or handed back to the server by a confined host). The body sets
    ``cached`` in the dict it gets; a cached environment is no build."""
    facts: dict[str, Any] = {"cached": False}
    tracing = tracing_on()
    sink = CALL_FACTS.get()
    if not tracing and FIGURES is None and sink is None:
        yield facts
        return
    started = time.perf_counter()
    span = None
    if tracing:
        from . import spans

        span = spans.child("coordex.build", {"coordex.venv_id": str(venv_id)}, call_span())
    outcome = "error"
    try:
        yield facts
        outcome = "ok"
    except BaseException as exc:
        # An id that names no environment is no build; a build that failed is one.
        if getattr(exc, "error_type", None) in ("validation", "not_found"):
            facts["cached"] = True
        raise
    finally:
        seconds = time.perf_counter() - started
        if span is not None:
            spans.end_child(span, outcome, cached=bool(facts.get("cached")))
        if not facts.get("cached"):
            if FIGURES is not None:
                FIGURES.build(None, outcome, seconds)
            if sink is not None:
                sink.append({"build": outcome, "seconds": seconds})


def log_call(tenant: str | None, tool: str, arguments: Mapping[str, Any] | None,
             result: Any, seconds: float) -> None:
    """The one INFO line of a call: tenant, coordinates, outcome, ms; never code or output."""
    facts = coordinates(tool, arguments, result)
    facts["ms"] = round(seconds * 1000, 3)
    if tenant:
        facts = {"tenant": tenant, **facts}
    text = " ".join(f"{key}={value}" for key, value in facts.items() if value not in ("", None))
    CALLS_LOG.info("call %s", text, extra={"coordex": facts})


class _ToolWatch(_Ends):
    """One tool call watched by a front end (the server's side, for every tenant)."""

    __slots__ = ("_busy", "_env_token", "_started", "_token", "arguments", "tenant")

    def __init__(self, tenant: str | None, tool: str, arguments: Any, span: Any,
                 env: Mapping[str, str] | None) -> None:
        _Ends.__init__(self, tool, span)
        self.tenant = tenant
        self.arguments = arguments if isinstance(arguments, Mapping) else {}
        self._started = time.perf_counter()
        self._busy = FIGURES.began(tenant, tool, self.arguments) if FIGURES is not None else None
        self._token = IN_TOOL_CALL.set(self)
        self._env_token = CALL_ENV.set(env)

    def done(self, result: Any) -> None:
        seconds = time.perf_counter() - self._started
        CALL_ENV.reset(self._env_token)
        IN_TOOL_CALL.reset(self._token)
        if self._span is not None:
            _spans.finish(self._span, self.tool, self.arguments, result)
            self.answered(self.arguments, result)
        if FIGURES is not None:
            FIGURES.ended(self._busy)
            FIGURES.count(self.tenant, self.tool, self.arguments, result, seconds)
        if CALLS_LOG.isEnabledFor(logging.INFO):
            log_call(self.tenant, self.tool, self.arguments, result, seconds)
        if isinstance(result, dict):
            result.pop(FACTS_KEY, None)


def watch_tool_call(tenant: str | None, transport: str, tool: str, arguments: Any,
                    meta: Mapping[str, Any] | None) -> _ToolWatch | None:
    """The MCP server's hook, in its ``tools/call`` handler (inside the SDK's span for
    the request): None when no one observes and no trace context came with the call."""
    carried = isinstance(meta, Mapping) and "traceparent" in meta
    tracing = tracing_on()
    if not (tracing or carried or FIGURES is not None or CALLS_LOG.isEnabledFor(logging.INFO)):
        return None
    span = env = None
    if tracing or carried:
        from . import spans

        span = spans.server_span(transport) if tracing else None
        env = spans.trace_env()
    return _ToolWatch(tenant, tool, arguments, span, env)


# --- across a confined host's pipe ------------------------------------------------------


def observed() -> dict[str, Any]:
    """What a server's client sends with a tool call into a confined host: the trace
    context (``trace``) and whether to hand back the call's builds (``observe``)."""
    extra: dict[str, Any] = {}
    env = CALL_ENV.get()
    if env:
        extra["trace"] = dict(env)
    if FIGURES is not None or env:  # counted, or a span to hang the builds under
        extra["observe"] = True
    return extra


@contextlib.contextmanager
def observing(args: Mapping[str, Any]) -> Iterator[Any]:
    """In a confined host, around one tool call from the server: the call's code sees
    the server's trace context, and the builds it made go back with its result (under
    :data:`FACTS_KEY`, taken off by the server before anyone sees the result)."""
    trace = args.get("trace")
    env = {k: v for k, v in trace.items() if k in ("TRACEPARENT", "TRACESTATE")
           and isinstance(v, str)} if isinstance(trace, Mapping) else None
    facts: list[dict[str, Any]] | None = [] if args.get("observe") else None
    tokens = (CALL_ENV.set(env or None), CALL_FACTS.set(facts), IN_TOOL_CALL.set(True))

    def handed_back(result: Any) -> Any:
        if facts and isinstance(result, dict):
            return {**result, FACTS_KEY: list(facts)}
        return result

    try:
        yield handed_back
    finally:
        IN_TOOL_CALL.reset(tokens[2])
        CALL_FACTS.reset(tokens[1])
        CALL_ENV.reset(tokens[0])
