"""The protocol module and docs/protocol.md say the same thing; plain values round-trip.

jupyter_client's protocol doc and code drifted apart (5.5 vs 5.4); this test keeps ours
in step: every message type and field of ``MESSAGES`` is documented under its own
heading, the version matches, and the worker files stay valid Python 3.8.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from coordex import protocol
from coordex.protocol import (
    HOST_TO_WORKER,
    MESSAGES,
    PROTOCOL_VERSION,
    WORKER_TO_HOST,
    ProtocolError,
    decode,
    encode,
    from_wire,
    message,
    to_wire,
)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "protocol.md"
WORKER_DIR = ROOT / "src" / "coordex" / "worker"


CONFINED_PART = "# The owner ↔ confined host protocol"
BUILDER_PART = "# The host ↔ builder channel"


def _part(confined: bool, builder: bool = False) -> str:
    worker, confined_text = DOC.read_text().split(CONFINED_PART, 1)
    confined_text, builder_text = confined_text.split(BUILDER_PART, 1)
    return builder_text if builder else confined_text if confined else worker


def _sections(confined: bool = False, builder: bool = False) -> dict[str, str]:
    parts = re.split(r"^### `(\w+)`", _part(confined, builder), flags=re.MULTILINE)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def test_version_matches_the_doc() -> None:
    found = re.search(r"Protocol version: \*\*(\d+)\*\*", _part(confined=False))
    assert found is not None and int(found.group(1)) == PROTOCOL_VERSION


def _check_documented(sections: dict[str, str],
                      messages: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]],
                      arrows: dict[str, str]) -> None:
    assert set(sections) == set(messages), "doc headings and MESSAGES differ"
    for kind, (direction, required, optional) in messages.items():
        body = sections[kind].split("\n## ", 1)[0]
        assert arrows[direction] in sections[kind].splitlines()[0], kind
        for name in required:
            assert re.search(rf"- `{name}` —", body), f"{kind}.{name} undocumented"
        for name in optional:
            assert re.search(rf"- `{name}` \(\*optional\*", body), \
                f"{kind}.{name} not documented as optional"


def test_every_message_and_field_is_documented_in_its_section() -> None:
    _check_documented(_sections(), MESSAGES,
                      {HOST_TO_WORKER: "host → worker", WORKER_TO_HOST: "worker → host"})


def test_directions_are_known() -> None:
    assert {spec[0] for spec in MESSAGES.values()} == {HOST_TO_WORKER, WORKER_TO_HOST}


def test_messages_are_checked() -> None:
    line = encode(message("inspect", id="1"))
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode(line, HOST_TO_WORKER) == {"type": "inspect", "id": "1"}
    with pytest.raises(ProtocolError, match="does not travel"):
        decode(line, WORKER_TO_HOST)
    with pytest.raises(ProtocolError, match="lacks field"):
        message("run", id="1", code="x")
    with pytest.raises(ProtocolError, match="unknown message type"):
        decode(b'{"type": "nope"}')
    with pytest.raises(ProtocolError, match="not a JSON line"):
        decode(b"garbage")
    with pytest.raises(ProtocolError, match="run mode"):
        message("run", id="1", code="", mode="sideways", output_limit=1)


def test_lines_are_ascii_whatever_the_text() -> None:
    line = encode(message("run", id="1", code="print('héllo\\n✓')", mode="stateful",
                          output_limit=10))
    line.decode("ascii")
    assert decode(line)["code"] == "print('héllo\\n✓')"


@pytest.mark.parametrize("value", [
    None, True, 3, 2.5, "text", b"\x00\xff", [1, [b"a"]], {"k": {"n": [None]}},
    {"__bytes__": "looks like bytes"}, {"__dict__": {"__bytes__": 1}},
])
def test_plain_values_round_trip(value: object) -> None:
    assert from_wire(decode(encode(message("capability_result", id="1",
                                           value=to_wire(value))))["value"]) == value


def test_tuples_become_lists() -> None:
    assert from_wire(to_wire((1, (2, b"x")))) == [1, [2, b"x"]]


def test_non_plain_values_name_the_type_and_the_way_out() -> None:
    with pytest.raises(TypeError, match=r"argument\[1\] is a builtins.set object.*file"):
        to_wire([1, {2}], "argument")
    with pytest.raises(TypeError, match="key of type int"):
        to_wire({1: "a"})
    cyclic: list[object] = []
    cyclic.append(cyclic)
    with pytest.raises(TypeError, match="nested more than"):
        to_wire(cyclic)


def test_reexport_is_the_worker_module() -> None:
    from coordex.worker import _coordex_protocol

    assert protocol.MESSAGES is _coordex_protocol.MESSAGES


@pytest.mark.parametrize("name", ["_coordex_worker.py", "_coordex_protocol.py",
                                  "_coordex_engine.py", "_coordex_import_check.py",
                                  "_coordex_env.py"])
def test_worker_files_are_python_38(name: str) -> None:
    ast.parse((WORKER_DIR / name).read_text(), feature_version=(3, 8))


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(ProtocolError, match="unknown field"):
        message("inspect", id="1", extra=True)
    with pytest.raises(ProtocolError, match="unknown field"):
        decode(b'{"type": "shutdown", "now": 1}')


def test_the_launcher_wire_is_documented_with_its_version() -> None:
    from coordex.backends.shell import launcher

    text = DOC.read_text()
    version = launcher.HELLO.decode().split()[-1]
    assert f"Launcher version: **{version}**" in text
    assert launcher.HEADER.format == "!cii" and "`!cii`" in text
    section = text.split("# The launcher wire", 1)[1].split("# The bash record wire", 1)[0]
    for kind in ("R", "W", "P", "X", "E"):
        assert f"| `{kind}` |" in section, kind


def test_the_bash_record_wire_is_documented_with_its_version() -> None:
    from coordex.backends.shell import wire

    text = DOC.read_text()
    assert f"Record wire version: **{wire.RECORD_WIRE_VERSION}**" in text
    assert "`FLAGS` is `$-:${#BASHOPTS}`" in text
    assert wire.FLAGS == "$-:${#BASHOPTS}"
    for record in ("`TOKEN r N STATUS FLAGS`", "`TOKEN s N STATUS FLAGS`"):
        assert record in text


def test_the_confined_host_protocol_is_documented_in_its_part() -> None:
    from coordex.hosting import wire

    found = re.search(r"Confined host protocol version: \*\*(\d+)\*\*", _part(confined=True))
    assert found is not None and int(found.group(1)) == wire.PROTOCOL_VERSION
    sections = _sections(confined=True)
    _check_documented(sections, wire.MESSAGES,
                      {wire.OWNER_TO_HOST: "owner → host", wire.HOST_TO_OWNER: "host → owner"})
    documented = re.findall(r"`([a-z_]+(?:\.[a-z_|]+)?)`", sections["call"])
    methods = {m for d in documented for m in _expand(d)}
    assert set(wire.METHODS) <= methods, set(wire.METHODS) - methods


def _expand(name: str) -> list[str]:
    head, _, tails = name.partition(".")
    return [f"{head}.{t}" for t in tails.split("|")] if tails else [head]


def test_the_builder_channel_is_documented_in_its_part() -> None:
    from coordex.hosting import wire

    found = re.search(r"Builder channel version: \*\*(\d+)\*\*", _part(False, builder=True))
    assert found is not None and int(found.group(1)) == wire.BUILDER_PROTOCOL_VERSION
    sections = _sections(builder=True)
    _check_documented(sections, wire.BUILDER_MESSAGES, {
        wire.HOST_TO_BUILDER: "host → builder", wire.BUILDER_TO_HOST: "builder → host"})
    documented = set(re.findall(r"`([a-z_]+)`", sections["request"].split("- `args`")[0]))
    assert set(wire.BUILDER_OPS) <= documented, set(wire.BUILDER_OPS) - documented


CLUSTER_PART = "# The driver ↔ node actor conversation"


def _cluster_tables() -> dict[str, set[str]]:
    """Each table of the cluster part, by its heading: the names in its first column."""
    text = DOC.read_text().split(CLUSTER_PART, 1)[1]
    tables: dict[str, set[str]] = {}
    for chunk in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        heading, _, body = chunk.partition("\n")
        tables[heading.strip()] = set(re.findall(r"^\| `(\w+)` \|", body, flags=re.MULTILINE))
    return tables


def test_the_cluster_wire_is_documented_with_its_version() -> None:
    from coordex.backends.ray import node

    part = DOC.read_text().split(CLUSTER_PART, 1)[1]
    found = re.search(r"Cluster wire version: \*\*(\d+)\*\*", part)
    assert found is not None and int(found.group(1)) == node.CLUSTER_WIRE_VERSION
    tables = _cluster_tables()
    assert tables["Actor methods"] == set(node.ACTOR_METHODS)
    assert tables["Operations of `begin`"] == set(node.OPS)
    assert tables["Events"] == set(node.EVENTS)
    assert tables["The end of a call"] == set(node.DONE_KEYS)
    events = part.split("## Events", 1)[1].split("\n## ", 1)[0]
    for kind, fields in node.EVENTS.items():
        row = next(line for line in events.splitlines() if line.startswith(f"| `{kind}` |"))
        assert all(f"`{name}`" in row for name in fields), kind


def test_the_node_actor_offers_the_documented_methods() -> None:
    from coordex.backends.ray.node import ACTOR_METHODS, NodeHost
    from coordex.hosting.tenant_node import TenantNodeHost

    for actor in (NodeHost, TenantNodeHost):
        missing = [m for m in ACTOR_METHODS if not callable(getattr(actor, m, None))]
        assert not missing, (actor.__name__, missing)


def test_an_actor_of_another_wire_version_is_refused() -> None:
    from coordex.backends.ray.node import CLUSTER_WIRE_VERSION
    from coordex.backends.ray.place import wire_refused

    assert wire_refused({"node": "n", "wire": CLUSTER_WIRE_VERSION}, "the actor") is None
    for info in ({"node": "n"}, {"node": "n", "wire": CLUSTER_WIRE_VERSION + 1}, None):
        refused = wire_refused(info, "the node's coordex actor")
        assert refused is not None and refused.error_type == "crashed"
        assert f"this coordex speaks version {CLUSTER_WIRE_VERSION}" in refused.error
        assert "same coordex version on every node" in refused.suggestion
