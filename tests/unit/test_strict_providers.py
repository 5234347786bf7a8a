"""Strict tool schemas each provider's own SDK leaves as they are (SPEC 2).

- Anthropic: ``anthropic.lib._parse._transform.transform_schema`` is what its SDK does to
  a schema before strict tool use; a schema it changes (a type array it cannot read,
  numeric limits it moves into the description) is one the API may refuse.
- OpenAI: the ``openai`` SDK's strict conversion (``_ensure_strict_json_schema``) leaves
  the strict schemas unchanged, and the OpenAI Agents SDK's (``ensure_strict_json_schema``,
  what ``convert_schemas_to_strict`` runs over the MCP schemas) keeps no ``default``
  that is not null, which Azure's strict mode refuses.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from anthropic.lib._parse._transform import transform_schema
from openai.lib._pydantic import _ensure_strict_json_schema

from coordex.tools import TOOL_NAMES, tool_definitions


def schemas(fmt: str, strict: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    key = {"openai-responses": "parameters", "anthropic": "input_schema", "mcp": "inputSchema"}
    defs = tool_definitions(fmt, strict=strict)
    assert isinstance(defs, list)
    for name, definition in zip(TOOL_NAMES, defs, strict=True):
        yield name, (definition["function"]["parameters"] if fmt == "openai"
                     else definition[key[fmt]])


def nodes(schema: Any) -> Iterator[dict[str, Any]]:
    if isinstance(schema, dict):
        yield schema
        for value in schema.values():
            yield from nodes(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from nodes(value)


@pytest.mark.parametrize("name", TOOL_NAMES)
def test_anthropic_strict_schemas_are_what_anthropics_transform_makes_of_them(name: str) -> None:
    schema = dict(schemas("anthropic", True))[name]
    assert transform_schema(copy.deepcopy(schema)) == schema


def test_anthropic_strict_keeps_what_the_limits_and_nulls_meant() -> None:
    props = dict(schemas("anthropic", True))["execute_code"]["properties"]
    assert {"type": "null"} in props["session_id"]["anyOf"]
    assert ">= 0" in props["session_id"]["description"]
    assert "604800" in props["timeout"]["description"]
    assert None in props["language"]["enum"]


@pytest.mark.parametrize("fmt", ["openai", "openai-responses"])
def test_openai_strict_schemas_are_what_openais_strict_conversion_makes_of_them(fmt: str) -> None:
    for name, schema in schemas(fmt, True):
        converted = _ensure_strict_json_schema(copy.deepcopy(schema), path=(), root=schema)
        assert converted == schema, name


@pytest.mark.parametrize("fmt", ["mcp", "openai", "openai-responses", "anthropic"])
def test_no_default_that_is_not_null_survives_the_agents_sdks_strict_conversion(fmt: str) -> None:
    strict_schema = pytest.importorskip("agents.strict_schema")  # the frameworks extra
    ensure_strict_json_schema = strict_schema.ensure_strict_json_schema

    for name, schema in schemas(fmt, False):
        converted = ensure_strict_json_schema(copy.deepcopy(schema))
        kept = [node["default"] for node in nodes(converted)
                if isinstance(node, dict) and node.get("default") is not None]
        assert kept == [], (name, kept)
    language = dict(schemas(fmt, False))["execute_code"]["properties"]["language"]
    assert "'python'" in language["description"]  # the default is still said
