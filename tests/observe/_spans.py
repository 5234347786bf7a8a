"""Spans read with the SDK's in-memory exporter, on the global tracer provider as a
library user sets it; put back as it was after each test."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)


def _reset_globals() -> None:
    # As OpenTelemetry's own tests do (opentelemetry.test.globals_test): the API sets a
    # global provider once per process.
    trace._TRACER_PROVIDER_SET_ONCE._done = False  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    metrics._internal._METER_PROVIDER_SET_ONCE._done = False  # type: ignore[attr-defined]
    metrics._internal._METER_PROVIDER = None  # type: ignore[attr-defined]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with recording() as exporter:
        yield exporter


@contextlib.contextmanager
def recording() -> Iterator[InMemorySpanExporter]:
    """The spans made meanwhile, on a global provider set for the while."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_globals()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        _reset_globals()


@pytest.fixture
def meter() -> Iterator[InMemoryMetricReader]:
    from coordex.observe import hook

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    metrics._internal._METER_PROVIDER_SET_ONCE._done = False  # type: ignore[attr-defined]
    metrics._internal._METER_PROVIDER = None  # type: ignore[attr-defined]
    metrics.set_meter_provider(provider)
    try:
        yield reader
    finally:
        hook.FIGURES = None
        provider.shutdown()
        metrics._internal._METER_PROVIDER_SET_ONCE._done = False  # type: ignore[attr-defined]
        metrics._internal._METER_PROVIDER = None  # type: ignore[attr-defined]


def by_name(exporter: InMemorySpanExporter, name: str) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name == name]
