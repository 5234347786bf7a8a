"""What does not fit a result is kept in files (SPEC 14): bounded memory while output
streams in, a cap on the folder, and a folder that cannot be written costing the file,
never the call."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from coordex import Executor
from coordex.core.results import RESULT_BUDGET, json_bytes
from coordex.spill import Tee, prune

pytestmark = pytest.mark.timeout(60)


def test_a_stream_past_the_limit_goes_to_a_file_as_it_comes(tmp_path: Path) -> None:
    tee = Tee(tmp_path, limit=1000)
    for _ in range(100):
        tee("stdout", "x" * 1000)
    # Past the limit the chunks were written out (but for a write buffer), not held.
    partial = list(tmp_path.glob(".partial-*"))
    assert len(partial) == 1 and partial[0].stat().st_size >= 90_000
    record = tee.finish({"stdout": "x" * 1000 + "[cut]", "stderr": "", "truncated": True,
                         "session": None})
    assert Path(record["spilled"]["stdout"]).read_text() == "x" * 100_000
    assert not list(tmp_path.glob(".partial-*"))


def test_output_under_the_limit_never_touches_the_disk(tmp_path: Path) -> None:
    tee = Tee(tmp_path / "out", limit=1000)
    tee("stdout", "small\n")
    record = tee.finish({"stdout": "small\n", "stderr": "", "session": None})
    assert "spilled" not in record and not (tmp_path / "out").exists()


def test_the_oldest_files_go_first_past_the_cap(tmp_path: Path) -> None:
    for age, name in enumerate(["newest", "middle", "oldest"]):
        path = tmp_path / f"stateless-{name}.txt"
        path.write_text("x" * 400)
        os.utime(path, (1_000_000 - age * 100, 1_000_000 - age * 100))
    writing, left = tmp_path / ".partial-now-stdout.txt", tmp_path / ".partial-old-stdout.txt"
    writing.write_text("y")
    left.write_text("y")
    os.utime(left, (1_000_000, 1_000_000))
    prune(tmp_path, max_bytes=900)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".partial-now-stdout.txt", "stateless-middle.txt", "stateless-newest.txt"]


def test_a_folder_that_cannot_be_written_costs_the_file_not_the_call(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    with Executor(root=tmp_path / "home") as ex:
        ex.spill_folder = blocker / ".coordex" / "out"
        r = ex.execute_code("print('x' * 300_000)\n'v' * 100_000")
    assert "error_type" not in r and "spilled" not in r
    assert r["truncated"] is True and json_bytes(r) <= RESULT_BUDGET


def test_a_stored_functions_big_value_is_cut_and_kept(tmp_path: Path) -> None:
    with Executor(root=tmp_path / "home") as ex:
        ex.spill_folder = tmp_path / "out"
        ex.functions.define(source="def rows(n):\n    return [{'i': i} for i in range(n)]\n")
        r = ex.functions.call("rows", [20_000])
        assert json_bytes(r) <= RESULT_BUDGET
        assert r["value"] is None and r["value_repr"].startswith('[{"i": 0}')
        import json

        whole = json.loads(Path(r["spilled"]["result"]).read_text())
        assert whole == [{"i": i} for i in range(20_000)]
        assert ex.functions.call("rows", [3])["value"] == [{"i": 0}, {"i": 1}, {"i": 2}]


def test_read_serves_a_spilled_file_by_its_uri_and_nothing_else(tmp_path: Path) -> None:
    """What ``resources/read`` reaches: a regular file directly in the folder, by its
    ``file://`` URI; never through a link, a fifo, '..', or a partial file."""
    from coordex.spill import READ_MAX_CHARS, read

    folder = tmp_path / ".coordex" / "out"
    folder.mkdir(parents=True)
    kept = folder / "python-own-1-x-stdout.txt"
    kept.write_text("whole\n")
    assert read(folder, kept.as_uri()) == {"uri": kept.as_uri(), "mime_type": "text/plain",
                                           "text": "whole\n"}
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    os.symlink(secret, folder / "planted.txt")
    os.mkfifo(folder / "fifo.txt")
    (folder / ".partial-1").write_text("half")
    for uri in (secret.as_uri(), (folder / "planted.txt").as_uri(),
                (folder / "fifo.txt").as_uri(), (folder / ".partial-1").as_uri(),
                folder.as_uri() + "/../../secret.txt", folder.as_uri(),
                "file://elsewhere" + str(kept), "http://x/y", 7):
        assert read(folder, uri)["error_type"] in ("not_found", "validation"), uri
    big = folder / "python-own-1-y-stdout.txt"
    big.write_text("y" * (READ_MAX_CHARS + 5))
    text = read(folder, big.as_uri())["text"]
    assert text.startswith("y" * READ_MAX_CHARS) and "cut at" in text
