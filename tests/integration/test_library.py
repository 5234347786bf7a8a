"""The stored-function library end to end, with real sessions and real environments.

What is proved here: functions are stored as data (own source, decorators stripped;
or text) with versions and survive a new Executor on the same root; the three modes on
the function mean what they mean for execute_code (stateful accumulates, read-only
sees and changes nothing, stateless sees nothing); failures raise CallError with the
SPEC record; ``functions`` works from plan code, and its errors keep their error_type
there; and — offline, with tiny wheels — an old function pinned to ledgerlib 1.0 and a
new one needing 2.0 are called from one plan, with non-plain arguments refused first.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordex import CallError, Executor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.wheels import ledgerlib_wheel, requirement

pytestmark = pytest.mark.timeout(60)

ACCUMULATE = '''
def add_reading(x):
    """Append x to this session's readings; return how many there are."""
    global readings
    try:
        readings
    except NameError:
        readings = []
    readings.append(x)
    return len(readings)
'''


def _names(ex: Executor, **session: Any) -> dict[str, str]:
    report = ex.inspect_session(**session)
    return {item["name"]: item["repr"] for item in report["names"]}


# -- defining, versions, persistence ---------------------------------------------------------


def test_decorator_stores_own_source_without_decorator(ex: Executor) -> None:
    @ex.functions.define
    def scale(values, factor=2):
        """Multiply every value by factor."""
        return [v * factor for v in values]

    assert scale.source.startswith("def scale(values, factor=2):"), scale.source
    assert "@" not in scale.source and not scale.source.startswith(" ")
    assert scale([1, 2]) == [2, 4]
    assert "scale" in ex.functions and "nope" not in ex.functions
    assert list(ex.functions) == ["scale"] and len(ex.functions) == 1
    [entry] = ex.functions.list()["functions"]
    assert entry["name"] == "scale" and entry["version"] == 1 and entry["env"] is None
    assert entry["signature"] == "scale(values, factor=2)" and entry["venv_id"] is None
    assert entry["doc"] == "Multiply every value by factor." and entry["created_at"] > 0


def test_versions_keep_history_and_latest_is_default(ex: Executor) -> None:
    one = ex.functions.define(source="def rate():\n    return 1\n")
    again = ex.functions.define(source="def rate():\n    return 1\n")
    assert one.version == again.version == 1
    two = ex.functions.define(source="def rate():\n    return 2\n")
    assert two.version == 2 and ex.functions.versions("rate") == [1, 2]
    assert ex.functions["rate"]() == 2 and ex.functions.rate() == 2
    assert ex.functions["rate@1"]() == 1 and ex.functions.get("rate", version=1)() == 1
    # The same source in another environment is a different function: a new version.
    three = ex.functions.define(source="def rate():\n    return 2\n", env="")
    assert three.version == 3 and three.env == ""
    with pytest.raises(CallError) as info:
        ex.functions.get("rate", version=9)
    assert info.value.error_type == "not_found" and "1, 2, 3" in info.value.suggestion


def test_text_definitions(ex: Executor) -> None:
    source = ("import math\n\n"
              "def _helper(x):\n    return math.sqrt(x)\n\n"
              "def root_sum(xs):\n    return sum(_helper(x) for x in xs)\n")
    refused = ex.functions.define(source=source)
    assert refused["error_type"] == "validation" and "'_helper', 'root_sum'" in refused["error"]
    fn = ex.functions.define(source=source, name="root_sum")
    assert fn([4, 9]) == 5.0
    assert ex.functions.define(source="def only(a, *, b=3) -> int:\n    return a + b\n"
                               ).signature == "only(a, *, b=3) -> int"
    for bad, words in [("def f(:\n", "does not parse"), ("x = 1\n", "no top-level def")]:
        refused = ex.functions.define(source=bad)
        assert refused["error_type"] == "validation" and words in refused["error"]


def test_library_survives_a_new_executor(root: Path) -> None:
    with Executor(root=root, timeout=30) as first:
        first.functions.define(source="def greet(who):\n    return 'hi ' + who\n")
        first.functions.define(source="def greet(who):\n    return 'hello ' + who\n")
    assert (root / "library.sqlite3").exists()
    with Executor(root=root, timeout=30) as second:
        assert second.functions.greet("ada") == "hello ada"
        assert second.functions["greet@1"]("ada") == "hi ada"
        assert [f["name"] for f in second.functions.list()["functions"]] == ["greet"]


# -- the three modes in the agent's own interpreter ------------------------------------------


def test_three_modes_in_own_interpreter(ex: Executor) -> None:
    add = ex.functions.define(source=ACCUMULATE)
    assert [add.stateful(session_name="acc")(x) for x in (10, 20, 30)] == [1, 2, 3]
    # Read-only sees what the session accumulated, and its append is discarded.
    assert add.read_only(session_name="acc")(40) == 4
    assert _names(ex, session_name="acc")["readings"] == "[10, 20, 30]"
    # Stateless sees nothing of any session.
    assert add(50) == 1 and add.stateless()(60) == 1
    # The session keeps the definition; generated helpers stay out of sight.
    names = _names(ex, session_name="acc")
    assert set(names) == {"add_reading", "readings"}, names
    assert ex.execute_code("readings", state_mode="stateful", session_name="acc")["result"] \
        == "[10, 20, 30]"
    # Stateful without a session is session 0: the plan's own namespace.
    assert add.stateful()(1) == 1 and ex.plan_namespace["readings"] == [1]
    sessions = {(s["session_id"], s["session_name"]) for s in ex.list_sessions()["sessions"]}
    assert sessions == {(0, None), (1, "acc")}


def test_own_interpreter_passes_real_objects(ex: Executor) -> None:
    class Box:
        pass

    box = Box()
    ident = ex.functions.define(source="def ident(x):\n    return x\n")
    assert ident(box) is box
    assert ident.stateful(session_name="s")(box) is box
    # A read-only call runs in a copy of the process: its value must come back as data.
    assert ident.read_only(session_name="s")(b"\x00raw") == b"\x00raw"
    with pytest.raises(CallError) as info:
        ident.read_only(session_name="s")(box)
    assert info.value.error_type == "execution"
    assert "cannot cross a process boundary" in info.value.error and "Box" in info.value.error
    assert "file" in info.value.suggestion


def test_output_is_shown_and_streamed(ex: Executor, capsys: pytest.CaptureFixture[str]) -> None:
    shout = ex.functions.define(source="def shout(x):\n    print('got', x)\n    return x\n")
    assert shout(3) == 3
    assert capsys.readouterr().out == "got 3\n"
    chunks: list[tuple[str, str]] = []
    assert shout.stateless(on_output=lambda s, t: chunks.append((s, t)))(4) == 4
    assert "".join(t for s, t in chunks if s == "stdout") == "got 4\n"
    assert capsys.readouterr().out == ""


# -- errors -----------------------------------------------------------------------------------


def test_call_error_shapes(ex: Executor) -> None:
    boom = ex.functions.define(source="def boom(x):\n    raise ValueError(f'bad {x}')\n")
    with pytest.raises(CallError) as info:
        boom.stateful(session_name="b")(7)
    err = info.value
    assert err.error_type == "execution" and err.error == "ValueError: bad 7"
    assert err.traceback is not None and "raise ValueError" in err.traceback
    assert err.record["exception"] == "ValueError" and err.record["session"]["session_name"] == "b"
    assert "boom" in err.suggestion and err.error in str(err) and err.suggestion in str(err)

    before = ex.list_sessions()["sessions"]
    with pytest.raises(CallError) as info:
        boom.read_only()
    assert info.value.error_type == "validation" and "session" in info.value.suggestion
    with pytest.raises(CallError) as info:
        boom.stateless(session_name="b")
    assert info.value.error_type == "validation"
    with pytest.raises(CallError) as info:
        boom.read_only(session_name="never")(1)
    assert info.value.error_type == "not_found"
    assert ex.list_sessions()["sessions"] == before

    with pytest.raises(CallError) as info:
        ex.functions["bom"]
    assert info.value.error_type == "not_found" and "'boom'" in info.value.suggestion
    assert not hasattr(ex.functions, "bom")

    uses_global = ex.functions.define(source="def uses_global():\n    return json.dumps(1)\n")
    with pytest.raises(CallError) as info:
        uses_global()
    assert "import modules and define helpers inside" in info.value.suggestion


def test_timeout_and_capacity(root: Path) -> None:
    with Executor(root=root, max_sessions=2, timeout=30) as ex:
        nap = ex.functions.define(source="import time\n\ndef nap(s):\n    time.sleep(s)\n")
        with pytest.raises(CallError) as info:
            nap.stateless(timeout=0.3)(5)
        assert info.value.error_type == "timeout"
        nap.stateful(session_name="one")(0)
        with pytest.raises(CallError) as info:
            nap.stateful(session_name="two")(0)
        assert info.value.error_type == "capacity" and "sessions" in info.value.record


# -- visible to the plan ----------------------------------------------------------------------


def test_functions_visible_inside_execute_code(ex: Executor) -> None:
    ex.functions.define(source=ACCUMULATE)
    plan = ("n = functions.add_reading.stateful(session_name='audit')(5)\n"
            "m = functions['add_reading'].stateful(session_name='audit')(6)\n"
            "peek = functions.add_reading.read_only(session_name='audit')(7)\n"
            "fresh = functions.add_reading(8)\n"
            "(n, m, peek, fresh)")
    result = ex.execute_code(plan, state_mode="stateful")
    assert result["result"] == "(1, 2, 3, 1)", result
    assert _names(ex, session_name="audit")["readings"] == "[5, 6]"
    # From the plan's own namespace, into the plan's own namespace.
    result = ex.execute_code("functions.add_reading.stateful()(9)\n"
                             "functions.add_reading.read_only(session_id=0)(10), readings",
                             state_mode="stateful")
    assert result["result"] == "(2, [9])", result
    assert "functions" not in _names(ex)


def test_call_errors_keep_their_type_in_execute_code(ex: Executor) -> None:
    ex.functions.define(source="def f(x):\n    return x\n")
    missing = ex.execute_code("functions.f.read_only(session_name='nope')(1)")
    assert missing["error_type"] == "not_found" and "nope" in missing["error"]
    assert "stateful" in missing["suggestion"] and missing["exception"] == "CallError"
    unknown = ex.execute_code("functions.g(1)")
    assert unknown["error_type"] == "not_found" and "'f'" in unknown["suggestion"]
    coordinate = ex.execute_code("functions.f.read_only()(1)", state_mode="stateful",
                                 session_name="p")
    assert coordinate["error_type"] == "validation"
    assert coordinate["suggestion"].startswith("Provide session_id or session_name")


# -- environments: the seed's story -------------------------------------------------------------


@pytest.fixture(scope="module")
def ledger_wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("library-wheels")
    return {"1.0": ledgerlib_wheel(folder, "1.0"), "2.0": ledgerlib_wheel(folder, "2.0")}


@pytest.fixture
def offline_uv(tmp_path_factory: pytest.TempPathFactory,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "library-uv-cache"))
    monkeypatch.setenv("UV_OFFLINE", "1")
    for name in ("UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS", "UV_DEFAULT_INDEX",
                 "UV_INDEX", "VIRTUAL_ENV"):
        monkeypatch.delenv(name, raising=False)
    yield


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_old_and_new_library_versions_in_one_plan(root: Path, ledger_wheels: dict[str, Path],
                                                  offline_uv: None) -> None:
    with Executor(root=root, timeout=60) as ex:
        v1 = requirement("ledgerlib", ledger_wheels["1.0"])
        v2 = requirement("ledgerlib", ledger_wheels["2.0"])

        @ex.functions.define(env=v1)
        def old_total(xs):
            """Sum with ledgerlib 1.x."""
            import ledgerlib

            return {"version": ledgerlib.VERSION, "total": ledgerlib.total(xs)}

        ex.functions.define(
            source=("import ledgerlib\n\n"
                    "def new_total(xs, currency='EUR'):\n"
                    "    return ledgerlib.VERSION, ledgerlib.total(xs, currency=currency)\n"),
            env=f'# /// script\n# dependencies = ["{v2}"]\n# ///\n')

        plan = ("old = functions.old_total([1, 2, 3])\n"
                "new = functions.new_total([1, 2, 3], currency='USD')\n"
                "old, new")
        result = ex.execute_code(plan, state_mode="stateful")
        assert result.get("result") == "({'version': '1.0', 'total': 6}, ['2.0', '6 USD'])", result

        listed = {f["name"]: f for f in ex.functions.list()["functions"]}
        envs = {e["venv_id"] for e in ex.environments.list()["environments"]}
        assert {listed["old_total"]["venv_id"], listed["new_total"]["venv_id"]} == envs
        assert len(envs) == 2 and listed["old_total"]["doc"] == "Sum with ledgerlib 1.x."

        # Stateful in an environment session, read-only against a copy of it.
        keep = ex.functions.define(
            source="def keep(x):\n    global kept\n    kept = globals().get('kept', ()) + (x,)\n"
                   "    return list(kept)\n", env=v1)
        assert keep.stateful(session_name="fc")(1) == [1]
        assert keep.stateful(session_name="fc")(b"\x01") == [1, b"\x01"]
        assert keep.read_only(session_name="fc")(3) == [1, b"\x01", 3]
        assert keep.stateful(session_name="fc")(4) == [1, b"\x01", 4]
        assert keep(5) == [5]
        venv = listed["old_total"]["venv_id"]
        assert "fc" in {s["session_name"] for s in ex.list_sessions()["sessions"]
                        if s["venv_id"] == venv}

        # Non-plain values are refused before anything runs.
        calls = _calls(ex, venv)
        with pytest.raises(CallError) as info:
            ex.functions.new_total({1, 2})
        assert info.value.error_type == "validation" and "set" in info.value.error
        assert "write it to a file and pass the path" in info.value.suggestion.lower()
        with pytest.raises(CallError) as info:
            keep.stateful(session_name="fc")(object())
        assert _calls(ex, venv) == calls

        # Errors in an environment carry the remote traceback.
        with pytest.raises(CallError) as info:
            ex.functions.new_total(["x"])
        assert info.value.error_type == "execution" and "TypeError" in info.value.error
        assert info.value.traceback is not None and "new_total" in info.value.traceback

        # From plan code, a refusal keeps its error_type too.
        refused = ex.execute_code("functions.new_total({1})")
        assert refused["error_type"] == "validation", refused

    # A new Executor on the same root calls them again (environments already built).
    with Executor(root=root, timeout=60) as again:
        started = time.monotonic()
        assert again.functions.old_total([4]) == {"version": "1.0", "total": 4}
        assert time.monotonic() - started < 30


def _calls(ex: Executor, venv_id: int) -> int:
    return sum(s["calls"] for s in ex.list_sessions()["sessions"] if s["venv_id"] == venv_id)


def test_call_returns_a_dict_for_front_ends(ex: Executor) -> None:
    ex.functions.define(source="def pair(a, b=0):\n    print('pairing')\n    return (a, b'x')\n")
    result = ex.functions.call("pair", [1], {"b": 2}, state_mode="stateful", session_name="s")
    assert result["value"] == [1, {"__bytes__": "eA=="}] and result["stdout"] == "pairing\n"
    assert result["function"] == {"name": "pair", "version": 1}
    assert result["session"]["session_name"] == "s" and result["state_mode"] == "stateful"
    assert ex.functions.call("pair", [{1}])["value_repr"] == "({1}, b'x')"
    assert ex.functions.call("pairs")["error_type"] == "not_found"
    assert ex.functions.call("pair", [1], state_mode="readonly")["error_type"] == "validation"
    assert ex.functions.call("pair", state_mode="read_only")["error_type"] == "validation"
    assert ex.functions.call("pair")["error_type"] == "execution"  # missing argument
    shown = ex.functions.show("pair")
    assert shown["source"].startswith("def pair") and shown["version"] == 1
    assert ex.functions.show("nope")["error_type"] == "not_found"


def test_a_stored_function_called_from_a_read_only_copy_runs_there(tmp_path: Path) -> None:
    """The copy is a fork without the interpreter's runner thread: a stored function it
    calls runs inline in the copy (before: it waited out the call's timeout)."""
    with Executor(root=tmp_path / "home") as ex:
        ex.functions.define(source="def double(x):\n    print('doubling')\n    return 2 * x\n")
        ex.execute_code("a = 1", state_mode="stateful", session_name="s")
        started = time.monotonic()
        r = ex.execute_code("b = functions.double(21)\nb", state_mode="read_only",
                            session_name="s", timeout=10)
        assert r.get("result") == "42" and r["stdout"] == "doubling\n", r
        assert time.monotonic() - started < 5
        assert ex.execute_code("'b' in globals()", state_mode="stateful",
                               session_name="s")["result"] == "False"
