"""The pure parts of a read-only copy (worker/_coordex_copy.py): what travels by value,
which runtimes force a copy by value, and a link that skips what is not a message."""

from __future__ import annotations

import os
import pickle
import threading
import types

from coordex.protocol import encode, message
from coordex.worker import _coordex_copy as copier


def _unpack(blob: bytes) -> dict[str, object]:
    packed = pickle.loads(blob)
    return {**packed["values"], **{k: f"module {v}" for k, v in packed["modules"].items()}}


def test_values_travel_together_and_modules_by_name() -> None:
    shared = [1, 2]
    namespace = {"a": shared, "b": shared, "os": os, "__name__": "__main__", "_": 5,
                 "cap": len}
    blob, left_out = copier.pack_values(namespace, skip={"cap"})
    assert left_out == []
    packed = pickle.loads(blob)
    assert packed["modules"] == {"os": "os"}
    assert packed["values"]["a"] is packed["values"]["b"]  # one object, as in the session
    assert set(packed["values"]) == {"a", "b"}


def test_what_cannot_travel_is_left_out_by_name() -> None:
    main = types.ModuleType("__main__")
    exec("class Local:\n    pass\nmine = Local()\ndef helper():\n    return 1\n", main.__dict__)
    namespace = {"lock": threading.Lock(), "Local": main.Local, "mine": main.mine,
                 "helper": main.helper, "rows": [1, 2, 3]}
    blob, left_out = copier.pack_values(namespace)
    assert left_out == ["Local", "helper", "lock", "mine"]
    assert _unpack(blob) == {"rows": [1, 2, 3]}


def test_a_loaded_fork_unsafe_library_is_named() -> None:
    fake = {name: types.ModuleType(name) for name in ("duckdb", "numpy", "torch")}
    assert copier.fork_unsafe_runtimes(fake) == ["duckdb", "torch"]
    assert copier.fork_unsafe_runtimes({"numpy": fake["numpy"]}) == []


def test_polars_counts_only_once_its_pool_has_threads() -> None:
    # This process has no thread named polars-N, whatever modules it has loaded.
    assert copier.fork_unsafe_runtimes({"polars": types.ModuleType("polars")}) == []
    assert copier._is_pool_thread("polars-3", "polars-")
    assert not copier._is_pool_thread("polars-ooc-clea", "polars-")


def test_the_link_skips_lines_that_are_not_messages() -> None:
    reader = copier.LinkReader()
    ready = message("copy_ready", isolation={"names": True})
    got = reader.feed(b"MARK=pwned\n" + encode(ready)[:10])
    assert got == []
    got = reader.feed(encode(ready)[10:] + b"{}\n" + b'{"type": "run"}\n')
    assert got == [ready]


def test_a_capability_answer_carries_the_value_or_the_error() -> None:
    call = message("capability_call", id="copy-1", name="add", args=[1, 2], kwargs={})
    assert copier.answer_capability(call, lambda n, a, k: sum(a))["value"] == 3
    failed = copier.answer_capability(call, lambda n, a, k: 1 / 0)
    assert failed["error"]["type"] == "ZeroDivisionError"
    unplain = copier.answer_capability(call, lambda n, a, k: object())
    assert unplain["error"]["type"] == "TypeError"
