"""``coordex serve`` shows a generated token only once it listens: a run that cannot
bind its port never prints a token no server will accept."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from ._procs import child_env, run_cli

pytestmark = pytest.mark.timeout(60)


def test_a_busy_port_is_reported_without_a_generated_token(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        done = run_cli("serve", "--port", str(port), env=child_env(tmp_path, COORDEX_TOKEN=None))
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "token" not in done.stderr.lower(), done.stderr
