"""The page in a real headless browser (Debian's chromium): it shows a session that was
just created, what it holds with its staleness, and the call log; the token passed once
in the URL is kept in a cookie. Without chromium the tests skip, except in CI."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from coordex import Executor

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--disable-dev-shm-usage"]


@pytest.fixture(scope="module")
def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("CI") == "true":
        pytest.fail("chromium is not installed; CI must install it (see .ci/run)")
    pytest.skip("chromium is not installed")


def browse(chromium: str, profile: Path, url: str, *action: str) -> str:
    done = subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}",
                           "--virtual-time-budget=5000", *action, url],
                          capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_page_shows_a_session_just_created(chromium: str, tmp_path: Path) -> None:
    with Executor(root=tmp_path / "home") as ex:
        url = ex.serve_ui()["url"]
        ex.execute_code("ledger = [3, 1, 2]\ntotal = sum(ledger)", state_mode="stateful",
                        session_name="audit")
        ex.execute_code("ledger.sort()", state_mode="stateful", session_name="audit")
        ex.execute_code("cd /tmp && export STAGE=load", language="bash", state_mode="stateful",
                        session_name="etl")
        dom = browse(chromium, tmp_path / "profile", url, "--dump-dom")
        assert "What audit holds" in dom and "What etl holds" in dom
        assert "<code>ledger</code>" in dom and "[1, 2, 3]" in dom
        assert "<code>STAGE</code>" in dom
        assert "ledger.sort()" in dom  # the call log
        assert 'id="status">updated' in dom  # the last refresh reached the server
        # The token came once in the URL; the browser kept it as a cookie and the page
        # reached the JSON endpoints with it, not with the URL.
        bare = url.split("?")[0]
        assert httpx.get(bare).status_code == 401
        later = browse(chromium, tmp_path / "profile", bare, "--dump-dom")
        assert "What audit holds" in later


def test_the_log_grows_on_the_page(chromium: str, tmp_path: Path) -> None:
    with Executor(root=tmp_path / "home") as ex:
        url = ex.serve_ui()["url"]
        ex.execute_code("first_step = 1", state_mode="stateful", session_name="grow")
        before = browse(chromium, tmp_path / "profile", url, "--dump-dom")
        assert "first_step = 1" in before and "second_step" not in before
        time.sleep(0.05)
        ex.execute_code("second_step = 2", state_mode="stateful", session_name="grow")
        after = browse(chromium, tmp_path / "profile", url.split("?")[0], "--dump-dom")
        assert "second_step = 2" in after


def test_a_screenshot_of_the_page(chromium: str, tmp_path: Path) -> None:
    with Executor(root=tmp_path / "home") as ex:
        ex.execute_code("x = 41", state_mode="stateful", session_name="audit")
        shot = tmp_path / "page.png"
        browse(chromium, tmp_path / "profile", ex.serve_ui()["url"], "--window-size=1400,800",
               f"--screenshot={shot}")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
