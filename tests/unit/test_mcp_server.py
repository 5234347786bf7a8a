"""The MCP layer's pure parts: result conversion, tokens files, bearer matching."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from coordex.mcp_server import (
    BearerTenantApp,
    OutputRelay,
    Tenant,
    TokenFileError,
    parse_tokens,
    security_settings,
    to_tool_result,
)


def test_success_becomes_structured_content_and_json_text() -> None:
    record = {"stdout": "hi\n", "result": "1", "images": []}
    result = to_tool_result(record)
    assert result.is_error is False
    assert result.structured_content == record
    assert json.loads(result.content[0].text) == record  # type: ignore[union-attr]


def test_errors_set_is_error_and_keep_the_dict() -> None:
    record = {"error": "e", "error_type": "validation", "suggestion": "s"}
    result = to_tool_result(record)
    assert result.is_error is True
    assert result.structured_content == record


def test_images_become_image_content_and_leave_the_text_short() -> None:
    data = "iVBORw0KGgo" + "A" * 5000
    result = to_tool_result({"stdout": "", "images": [{"mime": "image/png", "data": data}]})
    kinds = [c.type for c in result.content]
    assert kinds == ["text", "image"]
    assert result.content[1].data == data  # type: ignore[union-attr]
    assert data not in result.content[0].text  # type: ignore[union-attr]
    assert result.structured_content is not None
    assert result.structured_content["images"][0]["data"] == data


def test_output_relay_sends_only_news_with_a_rising_count() -> None:
    relay = OutputRelay()
    assert relay.take() == []
    relay("stdout", "a\n")
    relay("stderr", "b\n")
    [first] = relay.take()
    assert first[0] == 4 and first[1].endswith("a\n[stderr] b\n")
    assert relay.take() == []
    relay("stdout", "x" * 5000)
    [second] = relay.take()
    assert second[0] > first[0] and len(second[1]) <= 1000


def test_output_relay_sends_build_lines_one_each_and_never_glues_streams() -> None:
    relay = OutputRelay()
    relay("build", "Resolved 3 packages in 2ms")
    relay("stdout", "partial")
    relay("build", "Installed 3 packages in 5ms")
    relay("stderr", "warning\n")
    sent = relay.take()
    assert [message for _, message in sent] == [
        "[build] Resolved 3 packages in 2ms", "[build] Installed 3 packages in 5ms",
        "partial\n[stderr] warning\n"]
    values = [value for value, _ in sent]
    assert values == sorted(set(values))


def test_parse_tokens() -> None:
    text = "# comment\n\nalice  tok-a\nbob tok-b  \n"
    assert parse_tokens(text) == {"alice": "tok-a", "bob": "tok-b"}


@pytest.mark.parametrize(("text", "fragment"), [
    ("alice", "line 1"),
    ("alice a b", "line 1"),
    ("../x tok", "tenant name"),
    ("a t1\na t2", "twice"),
    ("a t\nb t", "reuses"),
    ("# only comments\n", "no 'NAME TOKEN'"),
])
def test_bad_token_files_name_the_problem(text: str, fragment: str) -> None:
    with pytest.raises(TokenFileError, match=re.escape(fragment)):
        parse_tokens(text)


def tenant(name: str, token: str) -> Tenant:
    return Tenant(name=name, token=token, executor=None, manager=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("header", "expected"), [
    ("Bearer tok-a", "alice"), ("bearer tok-b", "bob"), ("Bearer  tok-a ", "alice"),
    ("Bearer tok-", None), ("Bearer ", None), ("Basic tok-a", None), ("tok-a", None),
    (None, None), ("Bearer tok-a tok-b", None),
])
def test_bearer_matching(header: Any, expected: str | None) -> None:
    app = BearerTenantApp([tenant("alice", "tok-a"), tenant("bob", "tok-b")])
    found = app.tenant_for(header)
    assert (found.name if found else None) == expected


def test_security_settings_allow_loopback_and_the_bound_host_only() -> None:
    local = security_settings("127.0.0.1")
    assert local.enable_dns_rebinding_protection
    assert "localhost:*" in local.allowed_hosts
    public = security_settings("10.1.2.3", ["coordex.internal"])
    assert "10.1.2.3:*" in public.allowed_hosts and "coordex.internal:*" in public.allowed_hosts
