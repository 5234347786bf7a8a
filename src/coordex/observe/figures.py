"""The figures an operator watches (SPEC 16): calls, their latency and outcome, sessions,
lost state, rebuilds, builds, detached calls; each with a ``tenant`` label under
``--tokens``.

Every figure is counted where every call passes: the server's tool dispatch (from each
call's result, so a tenant whose executor runs in a confined host is counted on the
server, where its token was checked), or the ``Executor`` used as a library. Builds are
counted where they run; a confined host hands the builds of a call back with its result.
Sessions and detached calls are read when scraped.

Two outlets, either or both: Prometheus text for ``/metrics`` (``prometheus_client``,
``coordex serve --metrics``), and OpenTelemetry instruments when a meter provider is
configured (``--otel``, or the library user's own).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..contract import ExecutorLike
from . import shared

# Seconds: a call is from a millisecond to the 50 s MCP default and beyond.
CALL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 25.0, 50.0, 120.0, 300.0, float("inf"))
BUILD_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0,
                 float("inf"))
# Tools whose calls carry coordinates (the rest are counted in coordex_tool_calls_total).
CODE_TOOLS = ("execute_code", "call_function")
# Tools that hand over the final result of a call answered ``running`` (SPEC 14).
FETCH_TOOLS = ("wait_call", "cancel_call")
# Call ids whose end was counted, remembered so a result fetched again counts once.
COUNTED_IDS = 10_000
Sources = Callable[[], Iterable[tuple[str | None, Any]]]


def meter_active() -> bool:
    """True when a global OpenTelemetry meter provider records (not the API's proxy)."""
    import sys

    if "opentelemetry.metrics" not in sys.modules:
        return False
    from opentelemetry import metrics

    provider = metrics.get_meter_provider()
    names = {type(provider).__name__}
    return not names & {"_ProxyMeterProvider", "NoOpMeterProvider"}


class Figures:
    """The counters, written from any thread; read by a scrape and by OpenTelemetry.

    Args:
        tenants: label every series with ``tenant`` (``coordex serve --tokens``).
        prometheus: keep a ``prometheus_client`` registry for ``/metrics``.
        sources: ``(tenant, executor)`` pairs whose sessions the sessions gauge reads.
    """

    def __init__(self, *, tenants: bool = False, prometheus: bool = True,
                 sources: Sources | None = None) -> None:
        self.tenants = tenants
        self.sources = sources or (lambda: ())
        self._lock = threading.Lock()
        self._busy: dict[tuple[str, str, str, str, str], int] = {}
        self._counted: dict[str, None] = {}  # call ids, oldest first
        self.registry: Any = None
        self._otel: Any = None
        base = ["tenant"] if tenants else []
        if prometheus:
            from prometheus_client import CollectorRegistry, Counter, Histogram

            reg = self.registry = CollectorRegistry(auto_describe=True)
            coords = [*base, "language", "state_mode", "place"]
            self._calls = Counter("coordex_calls", "Tool calls that ran code, by outcome "
                                  "(ok or the error_type).", [*coords, "outcome"], registry=reg)
            self._duration = Histogram("coordex_call_duration_seconds", "Time a call took, "
                                       "as the server saw it.", coords, buckets=CALL_BUCKETS,
                                       registry=reg)
            self._tools = Counter("coordex_tool_calls", "Every tool call, by tool and outcome.",
                                  [*base, "tool", "outcome"], registry=reg)
            self._lost = Counter("coordex_state_lost", "Calls whose session lost its state.",
                                 base, registry=reg)
            self._rebuilds = Counter("coordex_rebuilds", "Sessions rebuilt from the call log "
                                     "(rebuild_session).", base, registry=reg)
            self._builds = Counter("coordex_builds", "Environment builds, by outcome.",
                                   [*base, "outcome"], registry=reg)
            self._build_time = Histogram("coordex_build_duration_seconds", "Time an "
                                         "environment build took.", base,
                                         buckets=BUILD_BUCKETS, registry=reg)
            reg.register(_Gauges(self))
        if meter_active():
            self._otel = _Instruments(self)

    # -- written by the hooks -------------------------------------------------------------

    def began(self, tenant: str | None, tool: str, arguments: Mapping[str, Any] | None) -> Any:
        """A call starts: its session counts as busy until :meth:`ended`."""
        args = arguments if isinstance(arguments, Mapping) else {}
        if tool not in CODE_TOOLS or args.get("state_mode") not in ("stateful", "read_only"):
            return None
        facts = shared.coordinates(tool, args, None)
        key = (tenant or "", facts["language"], facts["place"], facts["venv_id"],
               facts["session"] or "0")
        with self._lock:
            self._busy[key] = self._busy.get(key, 0) + 1
        return key

    def ended(self, key: Any) -> None:
        if key is None:
            return
        with self._lock:
            left = self._busy.get(key, 0) - 1
            if left > 0:
                self._busy[key] = left
            else:
                self._busy.pop(key, None)

    def count(self, tenant: str | None, tool: str, arguments: Mapping[str, Any] | None,
              result: Any, seconds: float) -> None:
        """One finished tool call, from its result.

        A call answered ``running`` (SPEC 14) has not ended: it counts among the tool
        calls, and as a call (outcome ``ok`` or its ``error_type``, its own duration,
        lost state, a rebuild) once its final result passes by, from the call itself, a
        ``wait_call`` or a ``cancel_call``; a result fetched again counts once."""
        facts = shared.coordinates(tool, arguments, result)
        record = result if isinstance(result, Mapping) else {}
        ended = facts["outcome"] != "running" and self._first_end(record.get("call_id"))
        kind = tool
        if tool in FETCH_TOOLS:  # the end of the call it names, under that call's facts
            kind = "rebuild_session" if "replayed" in record else \
                CODE_TOOLS[0] if "state_mode" in record else ""
            facts = shared.coordinates(kind, None, record) if kind else facts
            duration = record.get("duration_ms")
            if isinstance(duration, (int, float)) and not isinstance(duration, bool):
                seconds = duration / 1000
        base = [tenant or ""] if self.tenants else []
        if self.registry is not None:
            self._tools.labels(*base, tool, facts["outcome"]).inc()
            if ended and kind in CODE_TOOLS:
                coords = [*base, facts["language"], facts["state_mode"], facts["place"]]
                self._calls.labels(*coords, facts["outcome"]).inc()
                self._duration.labels(*coords).observe(seconds)
            if ended and facts["state_lost"]:
                _labelled(self._lost, base).inc()
            if ended and kind == "rebuild_session" and facts["outcome"] == "ok":
                _labelled(self._rebuilds, base).inc()
        if self._otel is not None:
            self._otel.count(tenant, tool, kind if ended else "", facts, seconds)
        if isinstance(result, Mapping):
            for fact in result.get(shared.FACTS_KEY) or ():  # a confined host's builds
                if isinstance(fact, Mapping) and isinstance(fact.get("seconds"), (int, float)):
                    self.build(tenant, str(fact.get("build")), float(fact["seconds"]))

    def _first_end(self, call_id: Any) -> bool:
        """Whether the end of the call ``call_id`` (None: a call without one) is new."""
        if not isinstance(call_id, str):
            return True
        with self._lock:
            if call_id in self._counted:
                return False
            self._counted[call_id] = None
            if len(self._counted) > COUNTED_IDS:
                del self._counted[next(iter(self._counted))]
        return True

    def build(self, tenant: str | None, outcome: str, seconds: float) -> None:
        base = [tenant or ""] if self.tenants else []
        if self.registry is not None:
            self._builds.labels(*base, outcome).inc()
            _labelled(self._build_time, base).observe(seconds)
        if self._otel is not None:
            self._otel.build(tenant, outcome, seconds)

    # -- read when scraped ----------------------------------------------------------------

    def sessions(self) -> dict[tuple[str, str, str, str], int]:
        """{(tenant, language, place, state): n}, state one of open (idle), busy, kept.

        Busy: a session a tool call is running in, or one a detached call (SPEC 14)
        holds after its request returned (``list_sessions`` marks it ``busy``)."""
        counts: dict[tuple[str, str, str, str], int] = {}
        with self._lock:
            busy = dict(self._busy)
        held_busy: set[tuple[str, str, str, str, str]] = set()
        for source, executor in self.sources():
            tenant = source or ""
            for record in _held_sessions(executor):
                place = "shell" if record.get("language") == "bash" else \
                    ("own" if record.get("venv_id") is None else "env")
                if record.get("node"):
                    place = "cluster"
                language = str(record.get("language"))
                state = "open" if record.get("held", True) else "kept"
                if record.get("busy") is True:
                    state = "busy"
                    venv = "" if record.get("venv_id") is None else str(record["venv_id"])
                    for label in (record.get("session_name"), record.get("session_id")):
                        if label is not None:
                            held_busy.add((tenant, language, place, venv, str(label)))
                key = (tenant, language, place, state)
                counts[key] = counts.get(key, 0) + 1
        busy_by: dict[tuple[str, str, str], int] = {}
        for tenant, language, place, venv, session in busy:
            if (tenant, language, place, venv, session) in held_busy:
                continue  # counted busy from its listing already
            where = (tenant, language, place)
            busy_by[where] = busy_by.get(where, 0) + 1
        for (tenant, language, place), n in busy_by.items():
            opened = (tenant, language, place, "open")
            moved = min(n, counts.get(opened, 0))
            if moved:
                counts[opened] -= moved
                if not counts[opened]:
                    del counts[opened]
            busied = (tenant, language, place, "busy")
            counts[busied] = counts.get(busied, 0) + n
        return counts

    def detached(self) -> dict[str, int]:
        """Detached calls by tenant: calls answered ``running`` (SPEC 14) whose code
        still runs, as each executor's running calls (the page's ``GET running``) list
        them; 0 for a tenant that has none."""
        from ..log.running import calls_of

        counts = {tenant or "": 0 for tenant, _ in self.sources()}
        for source, executor in self.sources():
            try:
                running = calls_of(executor).running()
            except Exception:  # a closing executor: nothing runs
                continue
            tenant = source or ""
            counts[tenant] = counts.get(tenant, 0) + sum(
                1 for call in running if call.get("detached") is True)
        return counts

    def render(self, tenant: str | None = None) -> bytes:
        """Prometheus text: every series, or under ``--tokens`` one tenant's alone."""
        from prometheus_client import generate_latest

        if tenant is None or not self.tenants:
            return bytes(generate_latest(self.registry))
        return bytes(generate_latest(_OneTenant(self.registry, tenant)))


def _labelled(metric: Any, values: list[str]) -> Any:
    """``metric`` with these label values; a metric without labels (no tenants) as is."""
    return metric.labels(*values) if values else metric


def _held_sessions(executor: ExecutorLike) -> list[dict[str, Any]]:
    """An executor's sessions; a confined host not running holds none, and a scrape
    never starts one."""
    if hasattr(executor, "forward_tool") and not getattr(executor, "host_alive", False):
        return []
    # A confined host's listing for no model: it never says a loss in the model's place.
    lister = getattr(executor, "held_sessions", None) or executor.list_sessions
    try:
        listed = lister()
    except Exception:  # a closing executor: nothing held
        return []
    sessions = listed.get("sessions") if isinstance(listed, dict) else None
    return [s for s in sessions or () if isinstance(s, dict)]


class _Gauges:
    """coordex_sessions and coordex_detached_calls, made at each scrape."""

    def __init__(self, figures: Figures) -> None:
        self.figures = figures

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import GaugeMetricFamily

        base = ["tenant"] if self.figures.tenants else []
        sessions = GaugeMetricFamily("coordex_sessions", "Sessions by state: open (idle), "
                                     "busy (a call running), kept (on disk, not restored).",
                                     labels=[*base, "language", "place", "state"])
        for (tenant, language, place, state), n in sorted(self.figures.sessions().items()):
            sessions.add_metric([*([tenant] if base else []), language, place, state], n)
        yield sessions
        detached = GaugeMetricFamily("coordex_detached_calls", "Calls running after their "
                                     "request returned (SPEC 14).", labels=base)
        counts = self.figures.detached()
        if base:
            for tenant, n in sorted(counts.items()):
                detached.add_metric([tenant], n)
        else:
            detached.add_metric([], sum(counts.values()))
        yield detached


class _OneTenant:
    """A registry's families with only one tenant's samples."""

    def __init__(self, registry: Any, tenant: str) -> None:
        self.registry = registry
        self.tenant = tenant

    def collect(self) -> Iterable[Any]:
        for family in self.registry.collect():
            family.samples = [s for s in family.samples if s.labels.get("tenant") == self.tenant]
            yield family


class _Instruments:
    """The same figures as OpenTelemetry instruments on the global meter provider."""

    def __init__(self, figures: Figures) -> None:
        from opentelemetry import metrics

        __version__ = sys.modules["coordex"].__version__  # loaded before any of its modules
        meter = metrics.get_meter("coordex", __version__)
        self.calls = meter.create_counter("coordex.calls", unit="{call}",
                                          description="Tool calls that ran code, by outcome.")
        self.duration = meter.create_histogram("coordex.call.duration", unit="s",
                                               description="Time a call took.")
        self.tools = meter.create_counter("coordex.tool_calls", unit="{call}")
        self.lost = meter.create_counter("coordex.state_lost", unit="{call}")
        self.rebuilds = meter.create_counter("coordex.rebuilds", unit="{session}")
        self.builds = meter.create_counter("coordex.builds", unit="{build}")
        self.build_time = meter.create_histogram("coordex.build.duration", unit="s")

        def sessions(options: Any) -> Iterable[Any]:
            for (tenant, language, place, state), n in figures.sessions().items():
                labels = {"language": language, "place": place, "state": state}
                if figures.tenants:
                    labels["tenant"] = tenant
                yield metrics.Observation(n, labels)

        def detached(options: Any) -> Iterable[Any]:
            for tenant, n in figures.detached().items():
                yield metrics.Observation(n, {"tenant": tenant} if figures.tenants else {})

        meter.create_observable_gauge("coordex.sessions", [sessions], unit="{session}")
        meter.create_observable_gauge("coordex.detached_calls", [detached], unit="{call}")
        self.tenants = figures.tenants

    def _base(self, tenant: str | None) -> dict[str, str]:
        return {"tenant": tenant or ""} if self.tenants else {}

    def count(self, tenant: str | None, tool: str, ended: str, facts: Mapping[str, Any],
              seconds: float) -> None:
        """One tool call; ``ended``: the kind of call whose end it counts, or ``""``."""
        base = self._base(tenant)
        self.tools.add(1, {**base, "tool": tool, "outcome": facts["outcome"]})
        if ended in CODE_TOOLS:
            coords = {**base, "language": facts["language"], "state_mode": facts["state_mode"],
                      "place": facts["place"]}
            self.calls.add(1, {**coords, "outcome": facts["outcome"]})
            self.duration.record(seconds, coords)
        if ended and facts["state_lost"]:
            self.lost.add(1, base)
        if ended == "rebuild_session" and facts["outcome"] == "ok":
            self.rebuilds.add(1, base)

    def build(self, tenant: str | None, outcome: str, seconds: float) -> None:
        base = self._base(tenant)
        self.builds.add(1, {**base, "outcome": outcome})
        self.build_time.record(seconds, base)
