"""The tool loops of docs/python-api.md (``examples/``), run with the real OpenAI and Anthropic SDKs.

The SDK clients talk HTTP to a scripted endpoint (``httpx.MockTransport``) that plays
the model: it asks for a strict-mode tool call (every optional argument null), then
answers with the tool result it received. The SDKs build and parse real requests;
coordex routes the calls with ``Executor.call_tool``.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anthropic
import httpx
import openai
import pytest

from coordex import Executor

from .test_call_tool import with_nulls

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CALL = with_nulls("execute_code", {"code": "rows = [3, 1, 2]\nsorted(rows)",
                                   "state_mode": "stateful", "session_name": "audit"})


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def ex(tmp_path: Path) -> Iterator[Executor]:
    with Executor(root=tmp_path) as executor:
        yield executor


def scripted(replies: list[Callable[[dict[str, Any]], dict[str, Any]]],
             seen: list[dict[str, Any]], http: Any = httpx) -> Any:
    """An HTTP client whose n-th request is answered by ``replies[n](request body)``.

    ``http`` is the SDK's HTTP package (``httpx``, or its fork ``httpx2``).
    """
    def handle(request: Any) -> Any:
        body = json.loads(request.content)
        seen.append(body)
        return http.Response(200, json=replies[len(seen) - 1](body))

    return http.Client(transport=http.MockTransport(handle))


def test_the_openai_loop(ex: Executor) -> None:
    def tool_call(body: dict[str, Any]) -> dict[str, Any]:
        assert body["tools"] == ex.tool_definitions(format="openai", strict=True)
        return {"id": "c1", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": None, "tool_calls": [{
                        "id": "t1", "type": "function",
                        "function": {"name": "execute_code", "arguments": json.dumps(CALL)}}]}}]}

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        result = json.loads(body["messages"][-1]["content"])
        return {"id": "c2", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop", "message": {
                    "role": "assistant", "content": f"sorted: {result['result']}"}}]}

    seen: list[dict[str, Any]] = []
    client = openai.OpenAI(api_key="test", base_url="http://model.test/v1",
                           http_client=scripted([tool_call, answer], seen), max_retries=0)
    assert example("openai_loop").run(client, ex, "sort the rows", model="scripted") == "sorted: [1, 2, 3]"
    assert seen[1]["messages"][-1]["tool_call_id"] == "t1"
    assert ex.inspect_session(session_name="audit")["names"][0]["name"] == "rows"


def anthropic_http() -> Any:
    """The HTTP package the installed Anthropic SDK is built on."""
    try:
        import httpx2
    except ImportError:  # SDK versions built on httpx itself
        return httpx
    return httpx2


def test_the_anthropic_loop(ex: Executor) -> None:
    def tool_use(body: dict[str, Any]) -> dict[str, Any]:
        assert body["tools"] == ex.tool_definitions(format="anthropic")
        return {"id": "m1", "type": "message", "role": "assistant", "model": "m",
                "content": [{"type": "tool_use", "id": "u1", "name": "execute_code",
                             "input": CALL}],
                "stop_reason": "tool_use", "stop_sequence": None,
                "usage": {"input_tokens": 1, "output_tokens": 1}}

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        [block] = body["messages"][-1]["content"]
        assert block["tool_use_id"] == "u1" and block["is_error"] is False
        result = json.loads(block["content"])
        return {"id": "m2", "type": "message", "role": "assistant", "model": "m",
                "content": [{"type": "text", "text": f"sorted: {result['result']}"}],
                "stop_reason": "end_turn", "stop_sequence": None,
                "usage": {"input_tokens": 1, "output_tokens": 1}}

    seen: list[dict[str, Any]] = []
    client = anthropic.Anthropic(api_key="test", base_url="http://model.test",
                                 http_client=scripted([tool_use, answer], seen, anthropic_http()),
                                 max_retries=0)
    assert example("anthropic_loop").run(client, ex, "sort the rows", model="scripted") == "sorted: [1, 2, 3]"
    assert len(seen) == 2
