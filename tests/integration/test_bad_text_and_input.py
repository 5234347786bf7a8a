"""Invalid text and out-of-range input come back as data, escaped the same way in every
place: never UnicodeEncodeError, OverflowError or RecursionError (SPEC 2 and 4)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from coordex import Executor
from coordex.backends.base import RunRequest
from coordex.backends.env.workers import WorkerSession
from tests.said import said

pytestmark = pytest.mark.timeout(60)


def utf8_json(record: dict[str, Any]) -> str:
    """What a front end sends: JSON as UTF-8 (fails on a lone surrogate)."""
    text = json.dumps(record, ensure_ascii=False)
    text.encode("utf-8")
    return text


@pytest.fixture
def odd_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "odd"
    folder.mkdir()
    with open(os.path.join(os.fsencode(folder), b"caf\xe9.txt"), "w"):
        pass
    return folder


def test_own_interpreter_escapes_a_lone_surrogate_like_a_worker(ex: Executor,
                                                                odd_folder: Path) -> None:
    code = f"import os\nfor n in os.listdir({str(odd_folder)!r}):\n    print(n)"
    r = ex.execute_code(code)
    assert r["stdout"] == "caf\\udce9.txt\n", r
    utf8_json(r)
    ex.execute_code("x = 1", state_mode="stateful")
    assert ex.execute_code(code, state_mode="read_only", session_id=0)["stdout"] == r["stdout"]
    worker = said(WorkerSession(sys.executable))
    try:
        assert worker.run(RunRequest(code, timeout=20))["stdout"] == r["stdout"]
    finally:
        worker.close()


def test_bash_turns_the_byte_into_a_replacement_character(ex: Executor,
                                                          odd_folder: Path) -> None:
    r = ex.execute_code(f"ls {str(odd_folder)!r}", language="bash")
    assert r["stdout"] == "caf\ufffd.txt\n"
    utf8_json(r)


@pytest.mark.parametrize("code", [
    "raise ValueError('caf\\udce9')",
    "class R:\n    def __repr__(self):\n        return 'caf\\udce9'\nR()",
    "import sys\nsys.stderr.write('caf\\udce9')",
    "print('caf\\udce9', end='')\nraise KeyError",
])
def test_surrogates_in_errors_results_and_streams_are_escaped(ex: Executor, code: str) -> None:
    r = ex.execute_code(code, state_mode="stateful")
    text = utf8_json(r)
    assert "caf\\\\udce9" in text


def test_a_lone_surrogate_in_a_name_or_spec_is_a_validation_error(ex: Executor) -> None:
    r = ex.execute_code("1", state_mode="stateful", session_name="a\udce9")
    assert r["error_type"] == "validation" and "surrogate" in r["suggestion"]
    utf8_json(r)
    for spec, name in (("", "env\udce9"), ("caf\udce9lib", None),
                       ("[project]\nname = 'x\udce9'\n", None)):
        r = ex.environments.create(spec, name=name)
        assert r["error_type"] == "validation", r
        utf8_json(r)
    r = ex.functions.define(source="def f():\n    return 'caf\udce9'\n")
    assert r["error_type"] == "validation" and "surrogate" in r["error"], r
    utf8_json(r)


def test_a_surrogate_written_as_an_escape_in_code_runs(ex: Executor) -> None:
    r = ex.execute_code("s = 'caf\\udce9'\nlen(s)")
    assert r["result"] == "4"


def test_ids_beyond_sqlite_integers_are_refused(ex: Executor) -> None:
    for venv_id in (2**70, 2**63):
        r = ex.execute_code("1", venv_id=venv_id)
        assert r["error_type"] == "validation" and "venv_id" in r["error"], r
        r = ex.environments.build(venv_id)
        assert r["error_type"] == "validation", r
    r = ex.execute_code("1", venv_id=2**63 - 1)
    assert r["error_type"] == "not_found"
    assert ex.environments.build(2**63 - 1)["error_type"] == "not_found"


@pytest.mark.parametrize("spec", [
    "[project]\ndependencies = []\nx = " + "[" * 5000 + "]" * 5000,
    "[project]\ndependencies = []\nx = " + "{a=" * 3000 + "1" + "}" * 3000,
    "# /// script\n# dependencies = []\n# x = " + "[" * 5000 + "]" * 5000 + "\n# ///\n",
])
def test_deeply_nested_toml_is_a_validation_error(ex: Executor, spec: str) -> None:
    r = ex.environments.create(spec)
    assert r["error_type"] == "validation" and "deeply" in r["error"], r
    r = ex.functions.define(source="def f():\n    return 1\n", env=spec)
    assert r["error_type"] == "validation", r


class _Evil:
    """An argument whose every method raises: what a caller's bug can hand over."""

    def __repr__(self) -> str:
        raise RuntimeError("repr")

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("eq")

    def __hash__(self) -> int:
        raise RuntimeError("hash")

    def __index__(self) -> int:
        raise RuntimeError("index")

    def __bool__(self) -> bool:
        raise RuntimeError("bool")


@pytest.mark.parametrize("call", [
    pytest.param(lambda ex: ex.functions.define(source="def f\ud800():\n    return 1\n"),
                 id="define-surrogate-in-code"),
    pytest.param(lambda ex: ex.functions.define(source="def f():\n    return 1\n",
                                                name="f\ud800"), id="define-surrogate-in-name"),
    pytest.param(lambda ex: ex.functions.define(lambda: 1, name="g\ud800"),
                 id="define-fn-surrogate-name"),
    pytest.param(lambda ex: ex.functions.define(source=12), id="define-source-not-text"),
    pytest.param(lambda ex: ex.functions.define(source="def f():\n    return 1\n",
                                                name=_Evil()), id="define-odd-name"),
    pytest.param(lambda ex: ex.functions.define(source="def f():\n    return 1\n",
                                                env=_Evil()), id="define-odd-env"),
    pytest.param(lambda ex: ex.functions.show("\ud800"), id="show-surrogate"),
    pytest.param(lambda ex: ex.functions.show(_Evil()), id="show-odd"),
    pytest.param(lambda ex: ex.functions.call("\ud800"), id="call-surrogate"),
    pytest.param(lambda ex: ex.functions.call(_Evil()), id="call-odd"),
    pytest.param(lambda ex: ex.serve_ui(port=_Evil()), id="serve_ui-odd-port"),
    pytest.param(lambda ex: ex.serve_ui(host=_Evil()), id="serve_ui-odd-host"),
    pytest.param(lambda ex: ex.serve_ui(host="h\ud800"), id="serve_ui-surrogate-host"),
    pytest.param(lambda ex: ex.serve_ui(host="no-such-host.invalid"), id="serve_ui-unknown-host"),
    pytest.param(lambda ex: ex.tool_definitions(_Evil()), id="tool_definitions-odd-format"),
    pytest.param(lambda ex: ex.tool_definitions("openai", strict=_Evil()),
                 id="tool_definitions-odd-strict"),
])
def test_the_python_api_never_raises_for_what_the_caller_passes(ex: Executor, call) -> None:
    """F14 (SPEC 2): a lone surrogate or an argument whose methods raise comes back as an
    error dict with a suggestion, valid as UTF-8 JSON, never as an exception."""
    r = call(ex)
    assert isinstance(r, dict) and r["error_type"] in ("validation", "not_found",
                                                        "environment"), r
    assert r["suggestion"], r
    utf8_json(r)


def test_versions_of_a_name_no_function_can_have_is_empty(ex: Executor) -> None:
    assert ex.functions.versions("\ud800") == [] and ex.functions.versions(_Evil()) == []
