"""What an operator sees (SPEC 16): spans, figures, health, logs.

* :mod:`.hook` - the hooks on the call path (standard library only; nearly free when
  no one observes): the executor's, the MCP server's tool dispatch, a build.
* :mod:`.spans` - one span per tool call with the MCP conventions' attributes and
  coordex's coordinates and outcome; children for a build and a restore; ``--otel``.
* :mod:`.figures` - the Prometheus series and the same as OpenTelemetry instruments.
* :mod:`.http` - ``/healthz``, ``/readyz``, ``/metrics`` of ``coordex serve``.
* :mod:`.logs` - one log line per call, text or JSON lines.

Only :mod:`.spans` and :mod:`.figures` import OpenTelemetry or ``prometheus_client``
(``pip install 'coordex[otel]'``), and only once someone observes.
"""

from .hook import watch_build, watch_call, watch_tool_call

__all__ = ["watch_build", "watch_call", "watch_tool_call"]
