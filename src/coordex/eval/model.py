"""``--policy model``: an OpenAI-compatible Chat Completions endpoint drives a task.

The loop is the one any application writes (README, "Tool calls in your own loop"):
``POST {base_url}/chat/completions`` with the task as the user message and coordex's
own tool definitions (``Executor.tool_definitions(format="openai")``); each tool call the
model makes is routed by ``Executor.call_tool`` exactly as it came, and its result goes
back as a ``tool`` message. The task ends when the model answers without a tool call,
or fails after ``max_turns`` requests.

Standard library only (``urllib``), so the eval needs no SDK. What the endpoint does
wrong is an :class:`EndpointError` with a sentence a person can act on; what the model
does wrong (a tool that does not exist, arguments that are not JSON, an impossible
coordinate) is coordex's own error dict handed back to the model, as in production.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# A tool result longer than this goes back to the model cut in the middle.
RESULT_CHARS = 16_000

SYSTEM = """You are an agent doing a data task on this machine through coordex's tools.
Run all code with execute_code; choose its coordinates (language, state_mode, session,
venv_id) for each call as the work asks. The task's steps come in order: do each one.
In Python, `from coordex.eval import kit` gives the helpers the steps name; those called
slow take seconds. Stored functions are callable as `functions.NAME(...)` in Python or
with call_function. Write the files the steps ask for. When every step is done, answer
with a short summary and no tool call."""


class EndpointError(Exception):
    """The endpoint could not be used. ``unreachable``: not even a connection (no
    point trying the next task)."""

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


@dataclass
class Endpoint:
    """An OpenAI-compatible Chat Completions endpoint."""

    base_url: str
    model: str
    api_key: str | None = None
    timeout: float = 300.0

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        """One request; the reply's JSON. Raises :class:`EndpointError`."""
        body = json.dumps({"model": self.model, "messages": messages, "tools": tools}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                text = response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:300].strip()
            hint = (" Set OPENAI_API_KEY to a key this endpoint accepts."
                    if exc.code in (401, 403) else "")
            raise EndpointError(f"{self.url} answered HTTP {exc.code}: {detail or exc.reason}.{hint}",
                                unreachable=exc.code in (401, 403, 404))
        except OSError as exc:  # URLError, refused, reset, timed out
            reason = getattr(exc, "reason", exc)
            raise EndpointError(f"cannot reach {self.url}: {reason}. Check --base-url (it ends "
                                "before /chat/completions, e.g. http://127.0.0.1:8080/v1).",
                                unreachable=True)
        try:
            reply = json.loads(text)
        except ValueError:
            raise EndpointError(f"{self.url} did not answer with JSON: {text[:200]!r}")
        if not isinstance(reply, dict) or not reply.get("choices"):
            raise EndpointError(f"{self.url} answered without 'choices': {text[:200]!r}")
        return reply


@dataclass
class ModelRun:
    """How a task went under a model: tokens from ``usage`` (None when the endpoint gave
    none), the requests made, why it failed if it did, and the conversation."""

    tokens: int | None = None
    turns: int = 0
    failure: str | None = None
    unreachable: bool = False
    messages: list[dict[str, Any]] = field(default_factory=list)


def _usage(reply: Mapping[str, Any]) -> int | None:
    usage = reply.get("usage")
    if not isinstance(usage, dict):
        return None
    total = usage.get("total_tokens")
    if isinstance(total, int):
        return total
    parts = [usage.get(k) for k in ("prompt_tokens", "completion_tokens")]
    return sum(p for p in parts if isinstance(p, int)) if any(isinstance(p, int) for p in parts) else None


def _clip(text: str) -> str:
    if len(text) <= RESULT_CHARS:
        return text
    half = RESULT_CHARS // 2
    return f"{text[:half]}\n... [{len(text) - RESULT_CHARS} characters cut] ...\n{text[-half:]}"


def task_prompt(brief: str, steps: list[str]) -> str:
    lines = [brief, "", "Steps:"]
    lines += [f"{n}. {says}" for n, says in enumerate(steps, start=1)]
    return "\n".join(lines)


def drive(ex: Any, endpoint: Endpoint, prompt: str, max_turns: int,
          on_result: Callable[[str, Any, dict[str, Any]], None]) -> ModelRun:
    """Let the model at ``endpoint`` work through ``prompt`` with ``ex``'s tools.

    ``on_result(name, arguments, result)`` sees every tool call and its result.
    """
    tools = ex.tool_definitions(format="openai")
    run = ModelRun(messages=[{"role": "system", "content": SYSTEM},
                             {"role": "user", "content": prompt}])
    counted: list[int] = []
    while run.turns < max_turns:
        run.turns += 1
        try:
            reply = endpoint.complete(run.messages, tools)
        except EndpointError as exc:
            run.failure, run.unreachable = str(exc), exc.unreachable
            break
        tokens = _usage(reply)
        if tokens is not None:
            counted.append(tokens)
        message = reply["choices"][0].get("message") if isinstance(reply["choices"], list) else None
        if not isinstance(message, dict):
            run.failure = f"{endpoint.url} answered a choice without a message"
            break
        calls = [c for c in message.get("tool_calls") or [] if isinstance(c, dict)]
        kept: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if calls:
            kept["tool_calls"] = calls
        run.messages.append(kept)
        if not calls:
            break
        for number, call in enumerate(calls):
            named = call.get("function")
            function: Mapping[str, Any] = named if isinstance(named, dict) else {}
            name, arguments = function.get("name"), function.get("arguments")
            result = ex.call_tool(str(name), arguments)
            on_result(str(name), arguments, result)
            run.messages.append({"role": "tool", "tool_call_id": call.get("id") or f"call_{number}",
                                 "content": _clip(json.dumps(result, default=str))})
    else:
        run.failure = (f"the model was still calling tools after --max-turns {max_turns} "
                       "requests; the task is counted as failed")
    run.tokens = sum(counted) if counted else None
    return run
