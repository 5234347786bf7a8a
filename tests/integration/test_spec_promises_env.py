"""SPEC promises about environments, checked through the Executor with real offline builds."""

from __future__ import annotations

import time

import pytest

from coordex import Executor
from tests.fakes.wheels import bulky_wheel, requirement

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("UV_OFFLINE", "1")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "uvc"))
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)


def test_env_session_zero_is_created_by_first_stateful_call(tmp_path):
    with Executor(root=tmp_path / "h") as ex:
        v = ex.environments.create("")["venv_id"]
        r = ex.execute_code("1", state_mode="read_only", session_id=0, venv_id=v)
        assert r["error_type"] == "not_found"
        r = ex.execute_code("x = 1", state_mode="stateful", venv_id=v)
        assert r["session"] == {"language": "python", "venv_id": v, "session_id": 0, "session_name": None}
        assert ex.execute_code("x", state_mode="read_only", session_id=0, venv_id=v)["result"] == "1"


def test_build_does_not_count_against_the_call_timeout(tmp_path):
    wheel = bulky_wheel(tmp_path / "w", modules=1500)
    with Executor(root=tmp_path / "h", timeout=0.3) as ex:
        v = ex.environments.create(requirement("bulkylib", wheel))["venv_id"]
        started = time.monotonic()
        r = ex.execute_code("import bulkylib; bulkylib.VALUE", venv_id=v)
        took = time.monotonic() - started
        assert r.get("result") == "1", r
        assert took > 0.3  # the build alone ran past the call timeout


def test_executor_build_timeout_is_honoured(tmp_path):
    wheel = bulky_wheel(tmp_path / "w", modules=1500)
    with Executor(root=tmp_path / "h", build_timeout=0.05) as ex:
        v = ex.environments.create(requirement("bulkylib", wheel))["venv_id"]
        r = ex.execute_code("1", venv_id=v)
        assert r["error_type"] == "environment" and "build_timeout" in r["suggestion"] and r["log"]


def test_environments_list_has_every_key(tmp_path):
    with Executor(root=tmp_path / "h") as ex:
        t0 = time.time()
        v = ex.environments.create("", name="empty")["venv_id"]
        ex.execute_code("1", venv_id=v)
        [e] = ex.environments.list()["environments"]
        assert set(e) >= {"venv_id", "name", "spec_hash", "built", "created_at", "last_used_at"}
        assert e["venv_id"] == v and e["name"] == "empty" and e["built"] is True
        assert t0 - 1 <= e["created_at"] <= e["last_used_at"] <= time.time() + 1


def test_worker_death_during_call_is_retried_through_executor(tmp_path):
    flag = tmp_path / "died"
    with Executor(root=tmp_path / "h") as ex:
        v = ex.environments.create("")["venv_id"]
        ex.execute_code("x = 1", state_mode="stateful", session_name="w", venv_id=v)
        r = ex.execute_code(f"import os\nif not os.path.exists({str(flag)!r}):\n"
                            f"    open({str(flag)!r}, 'w').close(); os.kill(os.getpid(), 9)\n'again'",
                            state_mode="stateful", session_name="w", venv_id=v)
        assert r["result"] == "'again'" and r["retried"] is True and r["state_lost"] is True


def test_equal_specs_same_venv_id_via_executor(tmp_path):
    with Executor(root=tmp_path / "h") as ex:
        a = ex.environments.create("six==1.16.0\n# comment\n")
        b = ex.environments.create('# /// script\n# dependencies = ["six==1.16.0"]\n# ///\n')
        c = ex.environments.create("six==1.15.0")
        assert a["venv_id"] == b["venv_id"] != c["venv_id"]
