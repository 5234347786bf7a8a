"""The library's SQLite store, the plain-value codec and source analysis, without sessions.

The store is shared by processes: two processes defining one name at once get distinct,
consecutive versions, and a forked child opens its own connection.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from coordex import CallError
from coordex.library import _codec
from coordex.library.functions import analyse, call_code, source_of
from coordex.library.store import LibraryStore

pytestmark = pytest.mark.timeout(60)


def _define(store: LibraryStore, name: str, source: str, env_key: str | None = None) -> int:
    record, _ = store.define(name=name, source=source, env=env_key, env_key=env_key,
                             signature=f"{name}()", doc=None, now=1.0)
    return record.version


def test_versions_history_and_latest(tmp_path: Path) -> None:
    store = LibraryStore(tmp_path / "lib.sqlite3")
    assert _define(store, "f", "def f(): return 1") == 1
    assert _define(store, "f", "def f(): return 1") == 1
    assert _define(store, "f", "def f(): return 1", env_key="pandas<2") == 2
    assert _define(store, "f", "def f(): return 1") == 3  # back to v1's content: a new latest
    assert _define(store, "g", "def g(): pass") == 1
    assert store.versions("f") == [1, 2, 3] and store.names() == ["f", "g"]
    latest = store.get("f")
    assert latest is not None and latest.version == 3 and latest.env_key is None
    assert [(r.name, r.version) for r in store.latest_all()] == [("f", 3), ("g", 1)]
    assert store.get("f", 9) is None and store.get("h") is None
    store.close()
    again = LibraryStore(tmp_path / "lib.sqlite3")
    assert again.versions("f") == [1, 2, 3]
    again.close()


_WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from coordex.library.store import LibraryStore
    store = LibraryStore(Path(sys.argv[1]))
    for i in range(20):
        store.define(name="shared", source=f"def shared(): return {sys.argv[2]!r}, {i}",
                     env=None, env_key=None, signature="shared()", doc=None, now=0.0)
    store.close()
""")


def test_two_processes_define_concurrently(tmp_path: Path) -> None:
    db = tmp_path / "lib.sqlite3"
    LibraryStore(db).close()
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(db), tag])
             for tag in ("a", "b")]
    try:
        for proc in procs:
            assert proc.wait(timeout=30) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    store = LibraryStore(db)
    assert store.versions("shared") == list(range(1, 41))
    store.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_uses_its_own_connection(tmp_path: Path) -> None:
    store = LibraryStore(tmp_path / "lib.sqlite3")
    _define(store, "f", "def f(): pass")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 0
        try:
            code = 0 if store.versions("f") == [1] and _define(store, "f", "def f(): 2") == 2 \
                else 1
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert store.versions("f") == [1, 2]  # the parent's connection still works
    store.close()


def test_codec_round_trip_and_refusal() -> None:
    value = {"a": [1, 2.5, None, True, "x"], "b": b"\x00\xff", "t": (1, 2),
             "tricky": {"__bytes__": "not bytes"}, "nested": {"__dict__": 1}}
    import json

    back = _codec.decode(json.loads(json.dumps(_codec.encode(value))))
    assert back == {**value, "t": [1, 2]}
    with pytest.raises(_codec.NotPlain) as info:
        _codec.encode({"rows": [1, {2}]}, "args")
    assert str(info.value) == "args['rows'][1] is a set"
    with pytest.raises(_codec.NotPlain):
        _codec.encode({1: "non-string key"})


def test_source_of_strips_decorators_and_dedents() -> None:
    def deco(f: object) -> object:
        return f

    @deco
    @deco
    def inner(x: int) -> int:
        """Doc."""
        return x + 1

    source = source_of(inner)
    assert source.startswith("def inner(x: int) -> int:") and "@deco" not in source
    assert analyse(source, None) == ("inner", "inner(x: int) -> int", "Doc.")
    with pytest.raises(CallError) as info:
        source_of(lambda x: x)
    assert info.value.error_type == "validation" and "source=" in info.value.suggestion


def test_generated_code_is_plain_python() -> None:
    code = call_code("def f(a, b=1):\n    return [a, b]\n", "f", args_json='[[2], {"b": 3}]')
    namespace: dict[str, object] = {"__name__": "__main__"}
    *body, last = code.rstrip("\n").split("\n")
    exec("\n".join(body), namespace)
    assert eval(last, namespace) == "[2, 3]"
    assert set(namespace) - {"__builtins__"} == {"__name__", "f"}
