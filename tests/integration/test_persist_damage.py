"""A damaged snapshot never claims a restore that did not happen (SPEC 12): a data file
cut short or emptied, a ``meta.json`` removed or replaced by garbage - in each place
(the own interpreter, an environment's worker, a bash shell) - and the session comes back
by replaying its logged calls, listed as kept before, with ``restored`` saying why."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from coordex import Executor
from tests.conftest import assert_no_new_children, child_pids

pytestmark = pytest.mark.timeout(180)

DAMAGES = ("cut", "emptied", "meta_removed", "meta_garbage")
WHY = {"cut": "cut short", "emptied": "empty", "meta_removed": "meta.json) is missing",
       "meta_garbage": "meta.json) cannot be read"}


def _ok(result: dict) -> dict:
    assert "error_type" not in result, result
    return result


def _damage(folder: Path, how: str) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    data = folder / meta["file"]
    assert data.stat().st_size == meta["bytes"]
    if how == "cut":
        data.write_bytes(data.read_bytes()[: meta["bytes"] // 2])
    elif how == "emptied":
        data.write_bytes(b"")
    elif how == "meta_removed":
        (folder / "meta.json").unlink()
    else:
        (folder / "meta.json").write_text("}{ not a description")


def _check(root: Path, place: str, how: str) -> None:
    before = child_pids()
    language = "bash" if place == "bash" else "python"
    build = ["n=41", "m=2"] if language == "bash" else ["n = 41", "m = 2"]
    probe = 'echo "$n,$m"' if language == "bash" else "print(f'{n},{m}')"
    with Executor(root=root, persist=True) as ex:
        venv = ex.environments.create("")["venv_id"] if place == "env" else None
        for code in build:
            _ok(ex.execute_code(code, language=language, state_mode="stateful",
                                session_name="s", venv_id=venv))
    (folder,) = (root / "snapshots").iterdir()
    _damage(folder, how)
    with Executor(root=root, persist=True) as ex:
        kept = [(s["session_name"], s["venv_id"]) for s in ex.list_sessions()["sessions"]
                if s.get("held") is False]
        assert kept == [("s", venv)], kept  # still listed: the log can bring it back
        r = _ok(ex.execute_code(probe, language=language, state_mode="stateful",
                                session_name="s", venv_id=venv))
        # Written again at close: the next start restores from a whole snapshot.
    assert r["stdout"].strip() == "41,2", r
    assert r["restored"]["from"] == "replay" and r["restored"]["replayed"] == 2, r
    assert WHY[how] in r["restored"]["why"], r["restored"]
    assert not r.get("state_lost")
    with Executor(root=root, persist=True) as ex:
        again = _ok(ex.execute_code(probe, language=language, state_mode="stateful",
                                    session_name="s", venv_id=venv))
    assert again["stdout"].strip() == "41,2" and again["restored"]["from"] == "snapshot", again
    assert_no_new_children(before)


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("place", ["own", "bash"])
def test_a_damaged_snapshot_comes_back_by_replay_and_says_why(root: Path, place: str,
                                                              how: str) -> None:
    _check(root, place, how)


@pytest.mark.slow
@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_environment_snapshot_comes_back_by_replay_and_says_why(
        root: Path, how: str) -> None:
    os.environ.setdefault("UV_OFFLINE", "1")
    _check(root, "env", how)


def test_a_bash_snapshot_with_a_changed_byte_is_not_sourced(root: Path) -> None:
    with Executor(root=root, persist=True) as ex:
        _ok(ex.execute_code("n=41", language="bash", state_mode="stateful", session_name="s"))
    (folder,) = (root / "snapshots").iterdir()
    data = folder / json.loads((folder / "meta.json").read_text())["file"]
    text = data.read_bytes()
    data.write_bytes(text.replace(b"n=\"41\"", b"n=\"99\""))  # same size, other value
    with Executor(root=root, persist=True) as ex:
        r = _ok(ex.execute_code('echo "$n"', language="bash", state_mode="stateful",
                                session_name="s"))
    assert r["stdout"].strip() == "41" and r["restored"]["from"] == "replay", r
    assert "checksum" in r["restored"]["why"]


def test_a_snapshot_nothing_describes_is_a_loss_never_a_fresh_session(root: Path) -> None:
    with Executor(root=root, persist=True) as ex:
        _ok(ex.execute_code("n = 41", state_mode="stateful", session_name="s"))
    (folder,) = (root / "snapshots").iterdir()
    (folder / "meta.json").unlink()
    (folder / "kept.json").unlink()
    with Executor(root=root, persist=True) as ex:
        r = _ok(ex.execute_code("'n' in globals()", state_mode="stateful", session_name="s"))
        assert r["result"] == "False" and r["state_lost"] is True and "restored" not in r
        assert "rebuild_session" in r["suggestion"]
        rebuilt = ex.rebuild_session(session_name="s")
        assert rebuilt["replayed"] == 1, rebuilt
        assert _ok(ex.execute_code("n", state_mode="stateful", session_name="s"))["result"] == "41"


@pytest.mark.parametrize("where", ["buffer", "stream"])
def test_a_python_snapshot_with_a_flipped_byte_is_not_restored(root: Path, where: str) -> None:
    """A byte flipped in a large buffer (mapped, not parsed) or in the pickle stream is
    seen by the snapshot's checksums: the session comes back by replay, saying why,
    never with the changed value restored as if good."""
    with Executor(root=root, persist=True) as ex:
        _ok(ex.execute_code("big = bytearray(4_000_000)\nnote = 'abcdefgh' * 8",
                            state_mode="stateful", session_name="s"))
    (folder,) = (root / "snapshots").iterdir()
    meta = json.loads((folder / "meta.json").read_text())
    data = folder / meta["file"]
    raw = bytearray(data.read_bytes())
    at = raw.find(b"abcdefgh") + 3 if where == "stream" else len(raw) // 2
    assert raw[at] in b"d\0", (where, raw[at])
    raw[at] ^= 0x01
    data.write_bytes(bytes(raw))
    with Executor(root=root, persist=True) as ex:
        r = _ok(ex.execute_code("(big.count(0) == len(big), note == 'abcdefgh' * 8)",
                                state_mode="stateful", session_name="s"))
    assert r["result"] == "(True, True)", r
    assert r["restored"]["from"] == "replay" and "checksum" in r["restored"]["why"], r
