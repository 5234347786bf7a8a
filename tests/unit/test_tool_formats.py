"""Tool definitions as the official SDKs and OpenAI's strict mode take them.

Each rendered definition is validated against the SDK's own request type (``openai``,
``anthropic``), every schema against the JSON Schema 2020-12 meta-schema, and the strict
schemas against the rules OpenAI's strict mode enforces.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator
from typing import Any

import jsonschema
import pydantic
import pytest
from anthropic.types import ToolParam
from openai.types.chat import ChatCompletionFunctionToolParam
from openai.types.responses import FunctionToolParam
from openai.types.shared_params import FunctionDefinition

from coordex.tools import TOOLS, output_schema, tool_definitions

FORMATS = ("openai", "openai-responses", "anthropic", "mcp")
# The keywords OpenAI's strict mode accepts inside a schema (its "supported schemas"
# list); anything else is refused by the API.
STRICT_KEYWORDS = {
    "type", "description", "properties", "required", "additionalProperties", "items",
    "enum", "anyOf", "$defs", "$ref", "const", "pattern", "format", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minItems", "maxItems",
}


def rendered(fmt: str, strict: bool = False) -> list[dict[str, Any]]:
    result = tool_definitions(fmt, strict=strict)
    assert isinstance(result, list)
    return result


def schema_of(definition: dict[str, Any], fmt: str) -> dict[str, Any]:
    if fmt == "openai":
        return dict(definition["function"]["parameters"])
    key = {"openai-responses": "parameters", "anthropic": "input_schema", "mcp": "inputSchema"}
    return dict(definition[key[fmt]])


def fits(typed_dict: Any, value: dict[str, Any]) -> None:
    """``value`` validates as ``typed_dict`` and carries no key the type does not know."""
    pydantic.TypeAdapter(typed_dict).validate_python(value)
    known = set(typing.get_type_hints(typed_dict))
    assert set(value) <= known, f"keys {set(value) - known} are not in {typed_dict.__name__}"


@pytest.mark.parametrize("strict", [False, True])
def test_openai_chat_definitions_fit_the_sdk_type(strict: bool) -> None:
    for definition in rendered("openai", strict):
        fits(ChatCompletionFunctionToolParam, definition)
        fits(FunctionDefinition, definition["function"])
        assert definition["function"].get("strict", False) is strict


@pytest.mark.parametrize("strict", [False, True])
def test_openai_responses_definitions_fit_function_tool_param(strict: bool) -> None:
    for definition in rendered("openai-responses", strict):
        fits(FunctionToolParam, definition)
        assert definition["strict"] is strict


def test_the_chat_shape_is_not_a_responses_tool() -> None:
    # The reason for a separate format: the Responses API wants name at the top.
    with pytest.raises(pydantic.ValidationError):
        pydantic.TypeAdapter(FunctionToolParam).validate_python(rendered("openai")[0])


@pytest.mark.parametrize("strict", [False, True])
def test_anthropic_definitions_fit_tool_param(strict: bool) -> None:
    for definition in rendered("anthropic", strict):
        fits(ToolParam, definition)


def all_schemas() -> Iterator[tuple[str, dict[str, Any]]]:
    for fmt in FORMATS:
        for strict in (False, True):
            for definition in rendered(fmt, strict):
                yield f"{fmt}/{strict}", schema_of(definition, fmt)
    for tool in TOOLS:
        yield f"output/{tool.name}", output_schema(tool)


def test_every_schema_is_valid_json_schema() -> None:
    for where, schema in all_schemas():
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["type"] == "object", where


def walk(schema: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(schema, dict):
        yield path, schema
        for key in ("items", "additionalProperties"):
            if isinstance(schema.get(key), dict):
                yield from walk(schema[key], f"{path}.{key}")
        for name, sub in (schema.get("properties") or {}).items():
            yield from walk(sub, f"{path}.{name}")
        for i, sub in enumerate(schema.get("anyOf") or []):
            yield from walk(sub, f"{path}.anyOf[{i}]")


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "anthropic"])
def test_strict_schemas_follow_openai_strict_mode(fmt: str) -> None:
    # Anthropic's strict dialect differs (anyOf, no limits): tests/unit/test_strict_providers.py
    for definition, tool in zip(rendered(fmt, strict=True), TOOLS, strict=True):
        schema = schema_of(definition, fmt)
        for path, node in walk(schema):
            where = f"{tool.name}{path}"
            assert set(node) <= STRICT_KEYWORDS, f"{where}: {set(node) - STRICT_KEYWORDS}"
            assert "type" in node or "anyOf" in node, f"{where} has no type"
            kinds = node.get("type")
            if kinds == "object" or (isinstance(kinds, list) and "object" in kinds):
                assert node.get("additionalProperties") is False, where
                assert node.get("required") == list(node.get("properties", {})), where
        for name, prop in schema["properties"].items():
            optional = name not in tool.required
            assert ("null" in prop["type"]) is optional, f"{tool.name}.{name}"
            if optional and "enum" in prop:
                assert None in prop["enum"], f"{tool.name}.{name}"


def test_strict_call_function_carries_free_form_values_as_json_text() -> None:
    [definition] = tool_definitions("openai-responses", strict=True, names=["call_function"])
    props = definition["parameters"]["properties"]
    assert props["args"]["type"] == props["kwargs"]["type"] == ["string", "null"]
    assert "JSON text" in props["args"]["description"]


def test_defaults_move_into_the_strict_description() -> None:
    [definition] = tool_definitions("openai", strict=True, names=["execute_code"])
    language = definition["function"]["parameters"]["properties"]["language"]
    assert "default" not in language and '"python"' in language["description"]
    assert language["enum"] == ["python", "bash", None]


def test_non_strict_optionals_without_a_default_accept_null() -> None:
    # What the OpenAI Agents SDK's own strict conversion keeps usable: it requires every
    # key, so a model must be able to send session_id: null next to a session_name.
    props = schema_of(rendered("mcp")[0], "mcp")["properties"]
    for name in ("session_id", "session_name", "venv_id", "timeout"):
        assert "null" in props[name]["type"], name
    assert props["language"]["enum"] == ["python", "bash"]  # a default: sent explicitly
    validator = jsonschema.Draft202012Validator(schema_of(rendered("mcp")[0], "mcp"))
    assert validator.is_valid({"code": "1", "session_id": None, "session_name": "a"})


@pytest.mark.parametrize("fmt", ["mcp", "openai", "anthropic"])
def test_descriptions_name_the_default_timeout(fmt: str) -> None:
    seconds = "50 s" if fmt == "mcp" else "60 s"
    description = str(rendered(fmt)[0])
    assert f"interrupted after {seconds} unless you pass timeout" in description
    assert f"(default {seconds})" in description
    assert "{default_timeout}" not in description
    custom = str(tool_definitions(fmt, default_timeout=120))
    assert "after 120 s" in custom


def test_mcp_tools_have_a_title_and_an_output_schema() -> None:
    for definition in rendered("mcp"):
        assert definition["title"] and definition["title"] == definition["annotations"]["title"]
        branches = definition["outputSchema"]["anyOf"]
        assert branches[-1]["required"] == ["error", "error_type", "suggestion"]


def test_strict_must_be_a_boolean() -> None:
    error = tool_definitions("openai", strict="yes")
    assert isinstance(error, dict) and error["error_type"] == "validation"
