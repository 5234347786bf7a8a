"""A user's type checker sees coordex's axes and results (SPEC 2).

mypy --strict runs over a small user script, as a user's CI would: the axes are
``Literal`` types (``state_mode="readonly"`` is flagged before it runs), results are
``TypedDict``s (a misspelt key is flagged, ``r["result"]`` is ``str | None``), and the
decorators keep what they decorate typed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

USER_SCRIPT = '''\
from coordex import AsyncExecutor, Executor, RunResult


def run(ex: Executor) -> str | None:
    first: RunResult = ex.execute_code("rows = [1, 2]", state_mode="stateful",
                                       session_name="audit")
    if "error" in first:
        print(first["error_type"], first["suggestion"])
    lost: bool = first.get("state_lost", False)
    print(lost, first["session"]["session_name"], first["stdout"])
    ex.execute_code("rows", state_mode="readonly")  # BAD
    ex.execute_code("rows", language="ruby")  # BAD
    print(first["reslt"])  # BAD
    print(ex.inspect_session(session_name="audit")["names"][0]["calls_ago"])
    made = ex.environments.create("six")
    print(made["venv_id"], ex.environments.list()["environments"][0]["built"])
    print(ex.list_sessions()["sessions"][0]["language"])
    ex.tool_definitions(format="openia")  # BAD

    @ex.functions.define()
    def double(x: int) -> int:
        return 2 * x

    @ex.functions.define
    def triple(x: int) -> int:
        return 3 * x

    @ex.capability
    def lookup(key: str) -> int:
        return len(key)

    n: int = lookup("abc")
    print(n, double.name, triple.version, ex.functions["double"].stateless()(3))
    return first["result"]


async def run_async(ex: AsyncExecutor) -> int | None:
    done = await ex.execute_code("1", state_mode="read_only", session_name="audit")
    return done.get("exit_code")
'''


def test_mypy_strict_flags_bad_axes_and_keys_and_nothing_else(tmp_path: Path) -> None:
    script = tmp_path / "user_script.py"
    script.write_text(USER_SCRIPT, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--hide-error-context",
         "--cache-dir", str(tmp_path / "cache"), "--python-version", "3.10", str(script)],
        capture_output=True, text=True, timeout=280, cwd=tmp_path)
    flagged = {int(m.group(1)) for m in re.finditer(r"user_script\.py:(\d+): error", done.stdout)}
    bad = {i for i, line in enumerate(USER_SCRIPT.splitlines(), 1) if line.endswith("# BAD")}
    assert flagged == bad, done.stdout + done.stderr
    assert "read_only" in done.stdout  # the Literal names what is allowed
