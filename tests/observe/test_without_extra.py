"""Without the otel extra nothing of it is imported and nothing is paid (SPEC 16)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

# A process where OpenTelemetry and prometheus_client cannot be imported, as where the
# extra is not installed; it runs calls in every place it has and reports what it loaded.
SCRIPT = r"""
import importlib.abc, json, logging, sys, tempfile

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("opentelemetry", "prometheus_client"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, NotInstalled())
logging.basicConfig(level=logging.INFO)  # the per-call log line still works
from coordex import Executor

with Executor(root=tempfile.mkdtemp()) as ex:
    results = [
        ex.execute_code("1 + 1"),
        ex.execute_code("x = 1", state_mode="stateful", session_name="s"),
        ex.execute_code("x", state_mode="read_only", session_name="s"),
        ex.execute_code("echo hi", language="bash", state_mode="stateful"),
        ex.call_tool("list_sessions", {}),
    ]
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("opentelemetry", "prometheus_client"))
print(json.dumps({"errors": [r.get("error") for r in results if "error" in r], "loaded": loaded}))
"""


def test_no_opentelemetry_module_is_imported_without_the_extra(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=100, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"errors": [], "loaded": []}
    assert "outcome=ok" in done.stderr  # one INFO line a call, through logging
    assert "1 + 1" not in done.stderr  # never the code


def test_a_server_asked_for_metrics_without_the_extra_says_what_to_install(
        tmp_path: Path) -> None:
    # The MCP SDK itself needs opentelemetry-api: only what the extra adds is missing.
    script = SCRIPT.split("logging.basicConfig")[0].replace(
        'name.split(".")[0] in ("opentelemetry", "prometheus_client")',
        'name.startswith(("opentelemetry.sdk", "prometheus_client"))') + (
        "from coordex.cli import main\n"
        "sys.exit(main(['serve', '--port', '0', '--metrics']))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=100, cwd=tmp_path,
                          env={"COORDEX_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2, done.stderr
    assert "pip install 'coordex[otel]'" in done.stderr
