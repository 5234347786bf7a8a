"""SPEC 15 word for word where no other test holds it: ``fork_session(session_id |
session_name, ...)`` takes the source as its first positional argument, by id or by
name, and the results carry every key the SPEC names."""

from __future__ import annotations

from pathlib import Path

from coordex import Executor

FORK_KEYS = {"session", "from", "ms", "left_out"}
CHECKPOINT_KEYS = {"checkpoint", "label", "at", "bytes", "ms", "left_out"}


def test_fork_takes_the_source_first_by_name_or_id_and_results_carry_the_keys(
        tmp_path: Path) -> None:
    with Executor(root=tmp_path / "root") as ex:
        made = ex.execute_code("v = [1]", state_mode="stateful", session_name="src")
        source = made["session"]
        by_name = ex.fork_session("src", new_name="by-name")
        by_id = ex.fork_session(source["session_id"], new_name="by-id")
        for forked, name in ((by_name, "by-name"), (by_id, "by-id")):
            assert set(forked) >= FORK_KEYS, forked
            assert forked["from"] == source and forked["session"]["session_name"] == name
            assert isinstance(forked["ms"], float) and forked["left_out"] == []
        taken = ex.checkpoint_session(session_name="src", label="first")
        assert set(taken) >= CHECKPOINT_KEYS, taken
        assert isinstance(taken["at"], float) and isinstance(taken["ms"], float)
        listed = ex.list_checkpoints(session_name="src")["checkpoints"]
        assert [c["checkpoint"] for c in listed] == [taken["checkpoint"]]
        back = ex.restore_session(session_name="src", checkpoint=taken["checkpoint"])
        assert back["left_out"] == [] and "files" in back, back
