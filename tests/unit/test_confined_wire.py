"""The confined host's wire and the router's start-up checks: pure, no processes."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from coordex import router
from coordex.backends.confined import wire
from coordex.backends.confined.jail import JailSpec, landlock_covers


def test_lines_are_ascii_and_checked() -> None:
    line = wire.encode(wire.message("call", id=1, method="execute_code",
                                    args={"code": "print('✓')"}))
    line.decode("ascii")
    assert wire.decode(line, wire.OWNER_TO_HOST)["args"]["code"] == "print('✓')"
    with pytest.raises(wire.ProtocolError, match="does not travel"):
        wire.decode(line, wire.HOST_TO_OWNER)
    with pytest.raises(wire.ProtocolError, match="is not one of"):
        wire.message("call", id=1, method="plan_namespace", args={})
    with pytest.raises(wire.ProtocolError, match="lacks field"):
        wire.message("reply", id=1)
    with pytest.raises(wire.ProtocolError, match="unknown field"):
        wire.message("cancel", id=1, now=True)
    with pytest.raises(wire.ProtocolError, match="not a JSON line"):
        wire.decode(b"\xff")


def test_a_line_reader_joins_chunks_and_ends_a_flood() -> None:
    # Lines split across reads come out whole and in order; a peer sending a line with
    # no end past the bound is a ProtocolError (its host is ended), not memory gone.
    lines = wire.LineReader(-1, max_line=16)
    assert lines.feed(b'{"a"') == []
    assert lines.feed(b': 1}\n{"b": 2}\n{"c"') == [b'{"a": 1}', b'{"b": 2}']
    assert lines.feed(b": 3}\n") == [b'{"c": 3}']
    assert lines.feed(b"x" * 16) == []
    with pytest.raises(wire.ProtocolError, match="longer than 16"):
        lines.feed(b"x")


def test_capability_and_plan_namespace_never_travel() -> None:
    assert "capability" not in wire.METHODS and "plan_namespace" not in wire.METHODS


def test_short_tokens_are_named() -> None:
    assert router.short_tokens({"alice": "a" * 16}) is None
    problem = router.short_tokens({"alice": "a" * 16, "bob": "short", "": "x"})
    assert problem is not None
    assert "'bob'" in problem and "'COORDEX_TOKEN'" in problem and "'alice'" not in problem


def test_several_tenants_without_confinement_are_refused_unless_allowed() -> None:
    assert router.confinement_refusal("none", 2, allow_unconfined=False) is not None
    assert router.confinement_refusal("none", 2, allow_unconfined=True) is None
    assert router.confinement_refusal("none", 1, allow_unconfined=False) is None
    assert router.confinement_refusal("landlock", 5, allow_unconfined=False) is None


def test_the_public_bind_warning() -> None:
    assert router.startup_warnings("0.0.0.0", [], is_loopback=False)
    assert not router.startup_warnings("0.0.0.0", ["example.org"], is_loopback=False)
    assert not router.startup_warnings("127.0.0.1", [], is_loopback=True)


@pytest.mark.parametrize(("text", "size"), [("512M", 512 << 20), ("4G", 4 << 30),
                                            ("1.5GiB", 3 << 29), ("100000000", 100000000)])
def test_memory_sizes(text: str, size: int) -> None:
    parser = argparse.ArgumentParser()
    router.add_confinement_options(parser, tenants=True)
    assert parser.parse_args(["--memory-limit", text]).memory_limit == size


def test_landlock_cannot_hide_what_lies_under_an_allowed_folder() -> None:
    assert landlock_covers(JailSpec(folder="/srv/t/a", hidden=("/srv/secret",)))
    assert not landlock_covers(JailSpec(folder="/srv/t/a", hidden=("/etc/coordex-tokens",)))


def test_python_or_coordex_in_tmp_is_carried_into_the_private_tmp(tmp_path: Path) -> None:
    # A checkout or a virtual environment in /tmp would vanish under the jail's private
    # /tmp (the host then fails to import): such readable folders are bound back,
    # read-only; never the tenant's own, nor anything holding or inside a hidden path.
    from coordex.backends.confined.jail import _carried

    if not str(tmp_path.resolve()).startswith("/tmp/"):
        pytest.skip("the temporary folder is not in /tmp here")
    for sub in ("venv/lib", "tenant/pkg", "secret/pkg", "other"):
        (tmp_path / sub).mkdir(parents=True)
    spec = JailSpec(folder=str(tmp_path / "tenant"), hidden=(str(tmp_path / "secret"),),
                    readable=(str(tmp_path / "venv"), str(tmp_path / "venv" / "lib"),
                              str(tmp_path / "tenant" / "pkg"), str(tmp_path / "secret" / "pkg"),
                              "/usr", str(tmp_path / "missing")))
    assert _carried(spec) == [str((tmp_path / "venv").resolve())]
