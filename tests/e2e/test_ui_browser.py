"""The page in a real headless browser (Debian's chromium, driven over the DevTools
protocol): a call's output appears while it runs, a click interrupts it, a call opens
to everything it returned, the filters narrow the log, a session is closed and rebuilt
from the page (it stays listed, closed, until then), no button or name of the sessions
is cut off at 1,400 or 1,024 px, and the token passed once is gone from the address bar.
Without chromium the tests skip, except in CI."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from coordex import Executor

from ._cdp import Browser

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("CI") == "true":
        pytest.fail("chromium is not installed; CI must install it (see .ci/run)")
    pytest.skip("chromium is not installed")


def _rows(browser: Browser, table: str) -> list[str]:
    rows: list[str] = browser.js(
        f"[...document.querySelectorAll('#{table} tbody tr')].map(r => r.innerText)")
    return rows


def test_a_running_call_shows_its_output_and_a_click_interrupts_it(chromium: str,
                                                                   tmp_path: Path) -> None:
    with Executor(root=tmp_path / "home") as ex:
        ex.execute_code("done = 0", state_mode="stateful", session_name="audit")
        url = ex.serve_ui()["url"]
        outcome: dict[str, Any] = {}

        def long_call() -> None:
            outcome.update(ex.execute_code(
                "import time\nfor step in range(600):\n    print('step', step, flush=True)\n"
                "    done = step\n    time.sleep(0.05)", state_mode="stateful",
                session_name="audit"))

        worker = threading.Thread(target=long_call, daemon=True)
        browser = Browser(chromium, tmp_path / "profile", url)
        try:
            browser.wait_for("document.getElementById('status').textContent.startsWith('updated')")
            # The token came once in the URL; it is gone from the address bar.
            assert "token" not in browser.js("location.href")
            assert "key=" not in browser.js("location.href")
            worker.start()
            started = time.monotonic()
            browser.wait_for("document.querySelector('#running .run pre.out')"
                             " && document.querySelector('#running .run pre.out')"
                             ".innerText.includes('step 3')")
            busy = browser.wait_for("[...document.querySelectorAll('#sessions tbody tr')]"
                                    ".find(r => r.innerText.includes('audit'))"
                                    "?.innerText.includes('busy')")
            assert busy and time.monotonic() - started < 5
            # While the session is busy the page still answers at once.
            polled = time.monotonic()
            browser.wait_for("(async () => { const t0 = performance.now();"
                             " await fetch('api/sessions', {headers: {'X-Coordex-Key':"
                             " localStorage.getItem('coordex-key')}}); return"
                             " performance.now() - t0 < 1000; })()")
            assert time.monotonic() - polled < 2
            shot = tmp_path / "running.png"
            browser.screenshot(shot)
            assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
            browser.click("#running button[data-act=interrupt]")
            browser.wait_for("document.getElementById('modal').className === 'open'")
            assert "Interrupt call" in browser.js("document.getElementById('modal-text').textContent")
            assert worker.is_alive()  # nothing happens before the person confirms
            browser.click("#modal-ok")
            worker.join(timeout=20)
            assert not worker.is_alive()
            assert outcome["error_type"] == "timeout" and outcome["state_lost"] is False
            assert outcome["stdout"].startswith("step 0\n")
            browser.wait_for("document.getElementById('running').innerText"
                             ".includes('Nothing is running')")
        finally:
            browser.close()
        # Interrupted, not killed: the session kept what the code did before.
        kept = ex.execute_code("done", state_mode="stateful", session_name="audit")
        assert int(kept["result"]) >= 3


def test_a_call_opens_to_everything_it_returned_and_the_filters_narrow_the_log(
        chromium: str, tmp_path: Path) -> None:
    with Executor(root=tmp_path / "home") as ex:
        ex.execute_code("ledger = [3, 1, 2]", state_mode="stateful", session_name="audit")
        ex.execute_code("print('sorted'); ledger.sort(); ledger", state_mode="stateful",
                        session_name="audit")
        ex.execute_code("ledger.append(4)", state_mode="read_only", session_name="audit")
        ex.execute_code("1 / 0", state_mode="stateful", session_name="audit")
        ex.execute_code("cd /tmp && export STAGE=load && echo loaded", language="bash",
                        state_mode="stateful", session_name="etl")
        browser = Browser(chromium, tmp_path / "profile", ex.serve_ui()["url"])
        try:
            browser.wait_for("document.querySelectorAll('#calls tbody tr').length === 5")
            failed = ex.history(session_name="audit")["calls"][-1]["seq"]
            browser.click(f"#calls tbody tr[data-seq='{failed}']")
            drawer = browser.wait_for("document.getElementById('drawer').className === 'open'"
                                      " && document.getElementById('drawer').innerText"
                                      ".includes('ZeroDivisionError') &&"
                                      " document.getElementById('drawer').innerText")
            assert "SUGGESTION" in drawer.upper() and "1 / 0" in drawer
            browser.js("document.querySelector('#drawer button').click()")
            # A read-only call shows its isolation and what its copy changed.
            read_only = ex.history(session_name="audit")["calls"][2]["seq"]
            browser.click(f"#calls tbody tr[data-seq='{read_only}']")
            drawer = browser.wait_for("document.getElementById('drawer').innerText"
                                      ".includes('isolation') &&"
                                      " document.getElementById('drawer').innerText")
            assert '"names":true' in drawer.replace(" ", "")
            browser.js("document.querySelector('#drawer button').click()")
            # Filters: errors only, then text, then one session.
            browser.js("{ const o = document.getElementById('f-outcome'); o.value = 'error';"
                       " o.dispatchEvent(new Event('change')) }")
            browser.wait_for("document.querySelectorAll('#calls tbody tr').length === 1")
            assert "1 / 0" in _rows(browser, "calls")[0]
            browser.js("{ const o = document.getElementById('f-outcome'); o.value = '';"
                       " o.dispatchEvent(new Event('change'));"
                       " const t = document.getElementById('f-text'); t.value = 'sorted';"
                       " t.dispatchEvent(new Event('input')) }")
            browser.wait_for("document.querySelectorAll('#calls tbody tr').length === 1 &&"
                             " document.querySelector('#calls tbody tr').innerText"
                             ".includes('ledger.sort()')")
            browser.js("{ const t = document.getElementById('f-text'); t.value = '';"
                       " t.dispatchEvent(new Event('input')) }")
            browser.click("#sessions tbody tr[data-session=etl]")
            holds = browser.wait_for("document.getElementById('holdings').innerText"
                                     ".includes('STAGE') &&"
                                     " document.getElementById('holdings').innerText")
            assert "/tmp" in holds
            browser.wait_for("document.querySelectorAll('#calls tbody tr').length === 1 &&"
                             " document.querySelector('#calls tbody tr').innerText"
                             ".includes('export STAGE')")
        finally:
            browser.close()


def test_a_session_is_closed_and_rebuilt_from_the_page(chromium: str, tmp_path: Path) -> None:
    with Executor(root=tmp_path / "home") as ex:
        ex.execute_code("rows = [1, 2]", state_mode="stateful", session_name="work")
        ex.execute_code("rows.append(3)", state_mode="stateful", session_name="work")
        browser = Browser(chromium, tmp_path / "profile", ex.serve_ui()["url"])
        try:
            browser.wait_for("!!document.querySelector('#sessions tbody tr[data-session=work]')")
            browser.click("#sessions tbody tr[data-session=work] button[data-act=close]")
            browser.wait_for("document.getElementById('modal').className === 'open'")
            browser.click("#modal-cancel")  # cancelled: nothing happens
            time.sleep(0.3)
            assert "work" in {s["session_name"] for s in ex.list_sessions()["sessions"]}
            browser.click("#sessions tbody tr[data-session=work] button[data-act=close]")
            browser.wait_for("document.getElementById('modal').className === 'open'")
            browser.click("#modal-ok")
            browser.wait_for("document.getElementById('notice').textContent.startsWith('closed')")
            assert "work" not in {s["session_name"] for s in ex.list_sessions()["sessions"]}
            # Closed, it stays on the page, said so, with the calls a rebuild replays,
            # and is rebuilt from there.
            row = "#sessions tbody tr[data-session=work][data-closed]"
            browser.wait_for(f"!!document.querySelector('{row}')")
            text = browser.js(f"document.querySelector('{row}').innerText")
            assert "closed" in text and "2" in text, text
            assert browser.js(f"!!document.querySelector('{row} button[data-act=close]')") is False
            browser.click(f"{row} button[data-act=rebuild]")
            browser.wait_for("document.getElementById('modal').className === 'open'")
            assert "run again" in browser.js("document.getElementById('modal-text').textContent")
            browser.click("#modal-ok")
            browser.wait_for("document.getElementById('notice').textContent"
                             ".startsWith('rebuilt work: 2 call(s) replayed')")
            browser.wait_for("!!document.querySelector('#sessions tbody tr[data-session=work]"
                             ":not([data-closed])')")
        finally:
            browser.close()
        assert ex.execute_code("rows", state_mode="stateful",
                               session_name="work")["result"] == "[1, 2, 3]"


def test_the_keys_stay_with_the_page(chromium: str, tmp_path: Path) -> None:
    with Executor(root=tmp_path / "home") as ex:
        url = ex.serve_ui()["url"]
        bare = url.split("?")[0]
        browser = Browser(chromium, tmp_path / "profile", url)
        try:
            browser.wait_for("document.getElementById('status').textContent.startsWith('updated')")
            # The cookie is HttpOnly: the page's own scripts cannot read it.
            assert "coordex_ui" not in browser.js("document.cookie")
            # The API without the page's second key: refused, though the cookie is sent.
            assert browser.js("fetch('api/sessions').then(r => r.status)") == 401
        finally:
            browser.close()
        assert httpx.get(bare).status_code == 401
        # The same browser opening the bare address later still has its keys.
        again = Browser(chromium, tmp_path / "profile", bare)
        try:
            again.wait_for("document.getElementById('status').textContent.startsWith('updated')")
        finally:
            again.close()


_CLIPPED = """(() => {
  // Each session's name cell and each button of the sessions table: whole inside the
  // viewport and inside its card's visible box (a card scrolls what does not fit).
  const card = document.querySelector('#sessions').closest('section').getBoundingClientRect();
  const bad = [];
  for (const e of document.querySelectorAll('#sessions tbody td.name, #sessions tbody button')) {
    const r = e.getBoundingClientRect();
    const inside = (b) => r.left >= b.left - 0.5 && r.right <= b.right + 0.5;
    if (!inside({left: 0, right: innerWidth}) || !inside(card) || e.scrollWidth > e.clientWidth + 1)
      bad.push(e.innerText + ' ' + JSON.stringify([r.left, r.right, card.left, card.right]));
  }
  return bad;
})()"""


@pytest.mark.parametrize("width", [1400, 1024])
def test_no_button_or_name_of_the_sessions_is_cut_off(chromium: str, tmp_path: Path,
                                                      width: int) -> None:
    with Executor(root=tmp_path / "home", persist=True) as ex:  # kept on disk after
        ex.execute_code("kept = 1", state_mode="stateful", session_name="ledger-2026-q4")
    with Executor(root=tmp_path / "home", persist=True) as ex:
        for name in ("a-rather-long-session-name-for-the-quarterly-ledger-audit", "work"):
            ex.execute_code("x = 1", state_mode="stateful", session_name=name)
        ex.execute_code("X=1", language="bash", state_mode="stateful", session_name="shell")
        browser = Browser(chromium, tmp_path / "profile", ex.serve_ui()["url"])
        try:
            browser.send("Emulation.setDeviceMetricsOverride", width=width, height=900,
                         deviceScaleFactor=1, mobile=False)
            browser.wait_for("document.querySelectorAll('#sessions tbody button"
                             "[data-act=rebuild]').length >= 4")
            time.sleep(0.3)  # laid out at the new width
            browser.screenshot(tmp_path / f"width-{width}.png")
            assert browser.js(_CLIPPED) == []
            assert browser.js("document.documentElement.scrollWidth") <= width
        finally:
            browser.close()



def test_the_page_shows_branches_and_checkpoints_and_restores_one(chromium: str,
                                                                   tmp_path: Path) -> None:
    with Executor(root=tmp_path / "home") as ex:
        ex.execute_code("rows = [3, 1, 2]", state_mode="stateful", session_name="clean")
        ex.fork_session(session_name="clean", new_name="trial")
        made = ex.checkpoint_session(session_name="clean", label="unsorted")
        ex.execute_code("rows = None", state_mode="stateful", session_name="clean")
        browser = Browser(chromium, tmp_path / "profile", ex.serve_ui()["url"])
        try:
            # The fork's row says where it came from.
            text = browser.wait_for("document.querySelector('#sessions tbody tr"
                                    "[data-session=trial]')?.innerText")
            assert "from clean" in text, text
            browser.click("#sessions tbody tr[data-session=clean]")
            branch = browser.wait_for("document.getElementById('branch').innerText"
                                      ".includes('unsorted') &&"
                                      " document.getElementById('branch').innerText")
            assert made["checkpoint"] in branch and "forks of it: trial" in branch
            button = f"#branch tr[data-checkpoint={made['checkpoint']}] button[data-act=restore]"
            browser.click(button)
            browser.wait_for("document.getElementById('modal').className === 'open'")
            assert "files on disk are not touched" in browser.js(
                "document.getElementById('modal-text').textContent")
            browser.click("#modal-cancel")  # cancelled: nothing happens
            time.sleep(0.3)
            assert ex.execute_code("rows", state_mode="stateful",
                                   session_name="clean")["result"] is None
            browser.click(button)
            browser.wait_for("document.getElementById('modal').className === 'open'")
            browser.click("#modal-ok")
            browser.wait_for("document.getElementById('notice').textContent"
                             f".startsWith('restored clean to {made['checkpoint']}')")
        finally:
            browser.close()
        assert ex.execute_code("rows", state_mode="stateful",
                               session_name="clean")["result"] == "[3, 1, 2]"
