"""With one COORDEX_TOKEN there is one tenant whose root is root itself (SPEC section 8)."""

from __future__ import annotations

from pathlib import Path

from tests.e2e._procs import child_env, spawn
from tests.e2e.test_mcp_http import READY, TOKEN, call_with_sdk


def test_single_token_tenant_root_is_home_itself(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with spawn("serve", "--port", "0", env=child_env(home, COORDEX_TOKEN=TOKEN)) as running:
        url = running.wait_for(READY).group(1)
        [r] = call_with_sdk(url, TOKEN, [("define_function", {"source": "def f():\n    return 1\n"})])
        assert not r["is_error"], r
    assert (home / "library.sqlite3").exists()
    assert not (home / "tenants").exists()
