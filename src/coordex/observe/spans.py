"""Spans: one per tool call, children for a build and a restore (SPEC 16).

Imported only once OpenTelemetry is (by the user, the MCP SDK or ``--otel``). The
tracer comes from the global provider, so a library user's own provider is used as it
is; none set (the API's proxy) means no span is made at all.

Over MCP the SDK already opens the request's span, named ``tools/call {tool}`` with the
MCP semantic conventions' attributes and parented by ``params._meta.traceparent``;
coordex adds to that span (``network.transport``, its coordinates and outcome) rather
than open a second one. The ``Executor`` used as a library opens the same span itself,
without the MCP attributes.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import (
    NonRecordingSpan,
    NoOpTracerProvider,
    ProxyTracerProvider,
    SpanKind,
    StatusCode,
)

from . import shared

TRACER_NAME = "coordex"
# Characters of code and of each stream kept as attributes with COORDEX_OTEL_CONTENT=1.
CONTENT_CHARS = 4096

_tracer: tuple[Any, Any] | None = None  # (provider, tracer)


def active() -> bool:
    """True when the global tracer provider records spans."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, (ProxyTracerProvider, NoOpTracerProvider))


def tracer() -> Any:
    global _tracer
    provider = trace.get_tracer_provider()
    if _tracer is None or _tracer[0] is not provider:
        __version__ = sys.modules["coordex"].__version__  # loaded before any of its modules
        _tracer = (provider, provider.get_tracer(TRACER_NAME, __version__))
    return _tracer[1]


def trace_env(span: Any = None) -> dict[str, str] | None:
    """``span``'s (default: the current span's) context as the call's ``TRACEPARENT``
    and ``TRACESTATE``: W3C trace context, the variables' own format, written directly
    (a few microseconds less than the propagators)."""
    found = (span or trace.get_current_span()).get_span_context()
    if not found.is_valid:
        return None
    env = {"TRACEPARENT": f"00-{found.trace_id:032x}-{found.span_id:016x}-"
                          f"{found.trace_flags:02x}"}
    if found.trace_state:
        env["TRACESTATE"] = found.trace_state.to_header()
    return env


# A call's attributes, made once per coordinate and outcome (the SDK copies what it is
# given): the key is what they are made of. Cleared when it grows past _MADE_MAX.
_made: dict[tuple[Any, ...], dict[str, Any]] = {}
_MADE_MAX = 4096


def outcome_attributes(tool: str, arguments: Mapping[str, Any] | None, result: Any,
                       library: bool = False) -> dict[str, Any]:
    """coordex's attributes of one call: coordinates and outcome, ``error.type`` for an
    error (code and output only with ``COORDEX_OTEL_CONTENT=1``); with ``library`` the
    tool's own (``gen_ai.*``), which the MCP SDK's span already has."""
    facts = shared.coordinates(tool, arguments, result)
    key = (tool, library, facts["language"], facts["state_mode"], facts["session"],
           facts["venv_id"], facts["outcome"], facts["state_lost"], facts["retried"])
    attributes = _made.get(key)
    if attributes is None:
        attributes = _made_attributes(tool, library, facts)
        if len(_made) >= _MADE_MAX:
            _made.clear()
        _made[key] = attributes
    if shared.content_on():
        attributes = dict(attributes)
        args = arguments if isinstance(arguments, dict) else {}
        record = result if isinstance(result, dict) else {}
        for name, value in (("coordex.code", args.get("code")),
                            ("coordex.stdout", record.get("stdout")),
                            ("coordex.stderr", record.get("stderr")),
                            ("coordex.result", record.get("result"))):
            if isinstance(value, str):
                attributes[name] = value[:CONTENT_CHARS]
    return attributes


def _made_attributes(tool: str, library: bool, facts: Mapping[str, Any]) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    if library:
        attributes.update({"gen_ai.tool.name": tool, "gen_ai.operation.name": "execute_tool"})
    attributes.update({"coordex.outcome": facts["outcome"],
                       "coordex.state_lost": facts["state_lost"],
                       "coordex.retried": facts["retried"]})
    for key in ("language", "state_mode", "session"):
        if facts[key]:
            attributes["coordex." + key] = facts[key]
    venv_id = facts["venv_id"]
    if venv_id:  # an int as the call gave it; as it was asked if it was no id at all
        attributes["coordex.venv_id"] = int(venv_id) if venv_id.isdigit() else venv_id
    if facts["outcome"] not in ("ok", "running"):
        attributes["error.type"] = "tool_error"
    return attributes


def finish(span: Any, tool: str, arguments: Mapping[str, Any] | None, result: Any,
           ended_ns: int | None = None, library: bool = False) -> None:
    """Set a call's outcome on ``span`` (ours, or the MCP SDK's) and its restore child;
    nothing at all when the span records nothing (sampled out)."""
    if not span.is_recording():
        return
    attributes = outcome_attributes(tool, arguments, result, library)
    span.set_attributes(attributes)
    if "error.type" in attributes:
        span.set_status(StatusCode.ERROR)
    if type(result) is not dict:
        return
    call_id = result.get("call_id")
    if call_id is None and tool in ("wait_call", "cancel_call") and \
            isinstance(arguments, dict):
        call_id = arguments.get("call_id")
    if isinstance(call_id, str):
        _tie(span, tool, call_id, result)
    if "restored" in result:
        restored = result["restored"]
        if isinstance(restored, Mapping) and isinstance(restored.get("ms"), (int, float)):
            restore_span(span, restored, ended_ns)
    if shared.FACTS_KEY in result:
        for fact in result[shared.FACTS_KEY] or ():  # builds a confined host made
            if isinstance(fact, dict) and isinstance(fact.get("seconds"), (int, float)):
                build_span(span, str(fact.get("build")), float(fact["seconds"]))


# Each call given ``wait`` (SPEC 14), by call_id, newest last: its span's context and
# start, for a ``wait_call`` or ``cancel_call`` span to link to, and whether its run's
# span was made. At most _CALLS_MAX are kept.
_calls: dict[str, _Tied] = {}
_calls_lock = threading.Lock()
_CALLS_MAX = 1024


class _Tied:
    __slots__ = ("context", "ran", "start", "tool")

    def __init__(self, context: Any, start: int | None, tool: str) -> None:
        self.context, self.start, self.tool, self.ran = context, start, tool, False


def _tie(span: Any, tool: str, call_id: str, result: dict[str, Any]) -> None:
    """``gen_ai.tool.call.id`` on a call given ``wait`` and on a ``wait_call`` /
    ``cancel_call`` of it, which also links to the call's span. A call whose run made
    no span where it ran (a tenant's confined host makes none) gets it from the end a
    ``wait_call`` fetched: from the call's start, for the ``duration_ms`` it reports."""
    span.set_attribute("gen_ai.tool.call.id", call_id)
    if tool in ("wait_call", "cancel_call"):
        tied = _calls.get(call_id)
        if tied is None:
            return
        span.add_link(tied.context, {"coordex.link": "the call"})
        took = result.get("duration_ms")
        if not tied.ran and tied.start is not None and not result.get("running") \
                and isinstance(took, (int, float)):
            _execution(tied, call_id, None, result, min(tied.start + int(took * 1e6),
                                                        time.time_ns()))
        return
    with _calls_lock:  # calls given wait run on threads of their own
        if call_id not in _calls:
            if len(_calls) >= _CALLS_MAX:
                del _calls[next(iter(_calls))]
            _calls[call_id] = _Tied(span.get_span_context(),
                                    getattr(span, "start_time", None), tool)


def execution_span(parent: Any, tool: str, arguments: Mapping[str, Any] | None,
                   result: Any, call_id: str | None) -> None:
    """The run of a call that answered ``running`` (SPEC 14), ended with its code: a
    child of the call's span, placed from the call's start, named and marked as the
    GenAI conventions' tool execution (``execute_tool {tool}``), with the outcome the
    call's span could not have."""
    tied = _calls.get(call_id) if call_id else None
    if tied is None:
        tied = _Tied(parent.get_span_context(), getattr(parent, "start_time", None), tool)
    _execution(tied, call_id, arguments, result, None)


def _execution(tied: _Tied, call_id: str | None, arguments: Mapping[str, Any] | None,
               result: Any, end: int | None) -> None:
    tied.ran = True
    parent = trace.set_span_in_context(NonRecordingSpan(tied.context))
    span = tracer().start_span(f"execute_tool {tied.tool}", context=parent,
                               start_time=tied.start)
    try:
        if span.is_recording():
            finish(span, tied.tool, arguments, result, library=True)
            if call_id:
                span.set_attribute("gen_ai.tool.call.id", call_id)
    finally:
        span.end(end_time=end)


def build_span(parent: Any, outcome: str, seconds: float) -> None:
    """A build a confined host made for this call, as the call's child span: the host
    reports its outcome and how long it took; it is placed from the call's start."""
    start = getattr(parent, "start_time", None) or time.time_ns()
    child = tracer().start_span("coordex.build", context=trace.set_span_in_context(parent),
                                start_time=start, attributes={"coordex.outcome": outcome})
    if outcome != "ok":
        child.set_status(StatusCode.ERROR)
    child.end(end_time=start + int(seconds * 1e9))


def restore_span(parent: Any, restored: Mapping[str, Any], ended_ns: int | None) -> None:
    """A restore as the call's child span. A restore runs before the call's code, on
    the session's first call; where it ran (this process or a confined host) it reports
    how long it took, so the span is placed from the call's start for that long."""
    start = getattr(parent, "start_time", None) or time.time_ns()
    end = start + int(float(restored["ms"]) * 1e6)
    if ended_ns is not None:
        end = min(end, ended_ns)
    ctx = trace.set_span_in_context(parent)
    child = tracer().start_span("coordex.restore", context=ctx, start_time=start, attributes={
        "coordex.restored.from": str(restored.get("from", "")),
        "coordex.restored.left_out": len(restored.get("left_out") or ())})
    child.end(end_time=max(start, end))


_names: dict[str, str] = {}  # tool -> its span's name


def start_call(tool: str) -> Any:
    """The span the ``Executor`` makes for a library call (no front end): its
    attributes all come at its end, in one go (given at the start, the SDK's sampler
    and the span would each check them: several microseconds more)."""
    name = _names.get(tool)
    if name is None:
        name = _names.setdefault(tool, f"tools/call {tool}")
    return tracer().start_span(name, kind=SpanKind.INTERNAL)


def child(name: str, attributes: dict[str, Any], parent: Any = None) -> tuple[Any, Any]:
    """A child of ``parent``, the call's span (or of OpenTelemetry's current span: the
    MCP SDK's), made current; end it with :func:`end_child`."""
    context = trace.set_span_in_context(parent) if parent is not None else None
    span = tracer().start_span(name, context=context, attributes=attributes)
    return span, otel_context.attach(trace.set_span_in_context(span))


def end_child(made: tuple[Any, Any], outcome: str, **attributes: Any) -> None:
    span, token = made
    otel_context.detach(token)
    span.set_attribute("coordex.outcome", outcome)
    for key, value in attributes.items():
        span.set_attribute(f"coordex.{key}", value)
    if outcome != "ok":
        span.set_status(StatusCode.ERROR)
    span.end()


# --- the MCP server's side ---------------------------------------------------------------


def server_span(transport: str) -> Any:
    """The span the MCP SDK opened for this request, given ``network.transport``; None
    when it records nothing."""
    span = trace.get_current_span()
    if isinstance(span, NonRecordingSpan) or not span.is_recording():
        return None
    span.set_attribute("network.transport", transport)
    return span


def configure_sdk() -> None:
    """``coordex serve|mcp --otel``: the SDK, configured from the standard ``OTEL_*``
    variables: ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` (``otlp``, the
    default, over HTTP; ``console``; ``none``), ``OTEL_EXPORTER_OTLP_ENDPOINT`` and the
    exporter's other variables, ``OTEL_SERVICE_NAME`` (default ``coordex``),
    ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``. A provider set already is
    kept as it is."""
    from opentelemetry import metrics
    from opentelemetry.sdk.resources import Resource

    os.environ.setdefault("OTEL_SERVICE_NAME", "coordex")
    resource = Resource.create()
    if not active():
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(resource=resource)
        for exporter in _exporters("traces"):
            provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    from .figures import meter_active

    if not meter_active():
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        readers = [PeriodicExportingMetricReader(e) for e in _exporters("metrics")]
        metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))


# Seconds an OTLP export may take, retries included, unless OTEL_EXPORTER_OTLP_TIMEOUT
# says otherwise (the SDK's default is 10): a collector that is down must not hold the
# server past the 5 s it has to stop in (SPEC 8), when the last spans are flushed.
EXPORT_SECONDS = 2.0


def _timeout(signal: str) -> float | None:
    given = (f"OTEL_EXPORTER_OTLP_{signal.upper()}_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
    return None if any(os.environ.get(name) for name in given) else EXPORT_SECONDS


def _exporters(signal: str) -> list[Any]:
    names = os.environ.get(f"OTEL_{signal.upper()}_EXPORTER", "otlp")
    made: list[Any] = []
    for name in (n.strip().lower() for n in names.split(",")):
        if name in ("", "none"):
            continue
        if name == "console" and signal == "traces":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            made.append(ConsoleSpanExporter())
        elif name == "console":
            from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

            made.append(ConsoleMetricExporter())
        elif name.startswith("otlp") and signal == "traces":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            made.append(OTLPSpanExporter(timeout=_timeout(signal)))
        elif name.startswith("otlp"):
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )

            made.append(OTLPMetricExporter(timeout=_timeout(signal)))
        else:
            raise ValueError(f"OTEL_{signal.upper()}_EXPORTER={name!r} is not one coordex "
                             "knows: use otlp, console or none.")
    return made
