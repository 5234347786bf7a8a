"""The command line's part: ``--otel``, ``--metrics``, ``--log-level``, ``--log-format``."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable
from typing import Any

from . import hook, logs

NEEDS_EXTRA = "needs pip install 'coordex[otel]'"


def add_options(parser: argparse.ArgumentParser, *, serve: bool) -> None:
    group = parser.add_argument_group("what an operator sees")
    group.add_argument("--otel", action="store_true",
                       help="send spans (one per tool call) and metrics with OpenTelemetry, "
                       "configured from the OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT, "
                       f"OTEL_TRACES_EXPORTER, ...); {NEEDS_EXTRA}")
    if serve:
        group.add_argument("--metrics", action="store_true",
                           help="serve Prometheus text at /metrics (token rules of /mcp; "
                           "COORDEX_METRICS_TOKEN shows every tenant's); " + NEEDS_EXTRA)
    group.add_argument("--log-level", choices=logs.LEVELS, default="info" if serve else "warning",
                       help="log level on stderr (default %(default)s; each call is one "
                       "info line)")
    group.add_argument("--log-format", choices=logs.FORMATS, default="text",
                       help="text, or json: one JSON object a line")


def start(args: argparse.Namespace, *, tenants: bool = False,
          sources: Callable[[], Iterable[tuple[str | None, Any]]] | None = None) -> str | None:
    """Logging, then ``--otel`` and ``--metrics``; a message saying why they cannot
    start, or None."""
    logs.configure(getattr(args, "log_level", "warning"), getattr(args, "log_format", "text"))
    want_metrics = bool(getattr(args, "metrics", False))
    try:
        if getattr(args, "otel", False):
            from . import spans

            spans.configure_sdk()
        from .figures import Figures, meter_active

        if want_metrics or meter_active():
            hook.FIGURES = Figures(tenants=tenants, prometheus=want_metrics, sources=sources)
    except ImportError as exc:
        flag = "--otel" if getattr(args, "otel", False) else "--metrics"
        return f"{flag} {NEEDS_EXTRA} ({exc})."
    except ValueError as exc:
        return str(exc)
    return None


def metrics_token() -> str | None:
    """The operator's token for /metrics, taken out of the environment so that no
    session sees it."""
    token = (os.environ.pop("COORDEX_METRICS_TOKEN", "") or "").strip()
    return token or None
