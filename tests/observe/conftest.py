"""The otel extra's tests: spans read with the SDK's in-memory exporter (``_spans``).
Without the extra only ``test_without_extra.py`` runs (it checks nothing is imported)."""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("opentelemetry.sdk") is None:
    collect_ignore_glob = ["test_health.py", "test_library_spans.py", "test_servers.py",
                           "test_trace_context.py", "test_long_work_spans.py"]
else:
    from ._spans import meter, spans  # noqa: F401 - fixtures for the tests here
