"""The builder channel of a jail (docs/protocol.md): a real socketpair, a real builder
loop with a real environment manager on one end, the host's manager on the other.

What the host sends is the tenant's: bad arguments of any type are answered, not
obeyed or fatal; a line the builder cannot decode ends it, and the host's calls then
fail with an ``environment`` error that says what to do. (Builds through the channel,
inside a real jail, are in test_confined.py.)
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordex.core.errors import CoordexError
from coordex.environments.manager import EnvironmentManager
from coordex.hosting.builder import BuilderClient, serve


class Channel:
    def __init__(self, folder: Path, refused: str = "") -> None:
        self.builder_end, host_end = socket.socketpair()
        self.local = EnvironmentManager(folder) if not refused else None
        self.code: list[int] = []
        self.thread = threading.Thread(target=lambda: self.code.append(
            serve(self.builder_end, lambda: self.local, refused)))
        self.thread.start()
        self.client = BuilderClient(host_end)
        self.manager = EnvironmentManager(folder, builder=self.client)

    def close(self) -> None:
        self.manager.close()
        self.client.close()
        self.thread.join(timeout=5)
        self.builder_end.close()


@pytest.fixture
def channel(tmp_path: Path) -> Iterator[Channel]:
    made = Channel(tmp_path / "environments")
    try:
        yield made
    finally:
        made.close()


def test_the_hosts_manager_works_through_the_builder(channel: Channel) -> None:
    created = channel.manager.create("ledgerlib==1.0", name="ledger")
    assert created["created"] is True and created["built"] is False, created
    venv_id = created["venv_id"]
    assert channel.manager.exists(venv_id) and not channel.manager.exists(venv_id + 1)
    listed = channel.manager.list()["environments"]
    assert [(e["venv_id"], e["name"]) for e in listed] == [(venv_id, "ledger")]
    assert channel.manager.env_dir(venv_id) == channel.local.env_dir(venv_id)  # type: ignore[union-attr]
    text, _, label = channel.manager.describe(venv_id)
    assert text == "ledgerlib==1.0" and "venv_id=" in label
    with pytest.raises(CoordexError) as missing:
        channel.manager.describe(venv_id + 1)
    assert missing.value.error_type == "not_found"
    assert channel.manager.remove_unused() == {"removed": [], "skipped": []}


@pytest.mark.parametrize(("op", "args", "expected"), [
    ("create", {"spec": 5, "name": ["x"]}, "validation"),
    ("exists", {"venv_id": [1]}, "validation"),
    ("env_dir", {"venv_id": {"a": 1}}, "validation"),
    ("describe", {"venv_id": "1"}, "not_found"),
    ("build", {"venv_id": -1}, "validation"),
    ("touch", {"venv_id": None}, None),
    ("list", {"extra": 1}, {"environments": []}),
])
def test_bad_arguments_are_answered_not_fatal(channel: Channel, op: str,
                                              args: dict[str, Any], expected: Any) -> None:
    value = channel.client.call(op, args)
    if isinstance(expected, str):  # an error of that type, with a way out
        assert value["error_type"] == expected and value["suggestion"], value
    else:
        assert value == expected, value
    assert channel.manager.list() == {"environments": []}  # the builder still answers


def test_a_broken_line_ends_the_builder_and_the_host_is_told(channel: Channel) -> None:
    channel.client._sock.sendall(b"not json\n")
    channel.thread.join(timeout=5)
    assert channel.code == [3]
    with pytest.raises(CoordexError) as gone:
        channel.manager.describe(1)
    assert gone.value.error_type == "environment" and "Run the call again" in gone.value.suggestion


def test_a_builder_that_could_not_confine_itself_builds_nothing(tmp_path: Path) -> None:
    refused = Channel(tmp_path / "environments", refused="OSError: landlock")
    try:
        made = refused.manager.create("ledgerlib==1.0")
        assert made["error_type"] == "environment" and "could not confine" in made["error"]
        assert made["suggestion"].startswith("Use venv_id=None")
        assert not (tmp_path / "environments").exists()
    finally:
        refused.close()
