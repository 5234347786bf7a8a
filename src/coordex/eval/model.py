"""``--policy model``: an OpenAI-compatible Chat Completions endpoint drives a task.

The loop is the one any application writes (docs/python-api.md, "Tool calls in your own loop"):
``POST {base_url}/chat/completions`` with the task as the user message and coordex's
own tool definitions (``Executor.tool_definitions(format="openai")``); each tool call the
model makes is routed by ``Executor.call_tool`` exactly as it came, and its result goes
back as a ``tool`` message. The task ends when the model answers without a tool call,
or fails after ``max_turns`` requests. With ``stepwise`` the steps come one at a time: the
first user message holds the brief and step 1, and each answer without a tool call
brings the next step, as a person gives them.

The arm (``--tools``) is what the model is given: ``coordex``, coordex's own tools;
``kept`` or ``fresh``, one ``execute_code`` without ``state_mode`` or session arguments,
whose description states its fixed policy (one interpreter and one shell kept for the
whole task, or a fresh one every call), run by coordex at that fixed coordinate. The
arms differ in that one thing: the same tasks, checkers, endpoint and measures.

Standard library only (``urllib``), so the eval needs no SDK. What the endpoint does
wrong is an :class:`EndpointError` with a sentence a person can act on; what the model
does wrong (a tool that does not exist, arguments that are not JSON, an impossible
coordinate) is coordex's own error dict handed back to the model, as in production.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..contract import ExecutorLike
from .measures import Work

# A tool result longer than this goes back to the model cut in the middle.
RESULT_CHARS = 16_000

SYSTEM = """You are an agent doing a data task on this machine through coordex's tools.
Run all code with execute_code; choose its coordinates (language, state_mode, session,
venv_id) for each call as the work asks. The task's steps come in order: do each one.
In Python, `from coordex.eval import kit` gives the helpers the steps name; those called
slow take seconds. Stored functions are callable as `functions.NAME(...)` in Python or
with call_function. Write the files the steps ask for. When every step is done, answer
with a short summary and no tool call."""

SYSTEM_STEPWISE = """You are an agent doing a data task on this machine through the tools
you are given. The steps come one at a time from the user: do the step you are given,
then answer with a short summary and no tool call to get the next one. In Python,
`from coordex.eval import kit` gives the helpers the steps name; those called slow take
seconds. Stored functions are callable as `functions.NAME(...)` in Python. Write the
files the steps ask for."""

ARMS = ("coordex", "kept", "fresh")

# The fixed arms' one tool: what the model is told of its policy.
FIXED_POLICY = {
    "kept": "Run Python or bash code. One Python interpreter and one bash shell (one each per "
            "environment) are kept for the whole task: names, imports, objects, the shell's "
            "folder and variables stay from one call to the next.",
    "fresh": "Run Python or bash code. Every call runs in a fresh interpreter or shell: "
             "nothing is kept from one call to the next but the files written.",
}
_FIXED_ARGUMENTS = ("code", "language", "venv_id", "timeout")
_FIXED_MODE = {"kept": "stateful", "fresh": "stateless"}


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
    work: Work = field(default_factory=Work)
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


def step_prompts(brief: str, steps: list[str]) -> list[str]:
    """The user messages of a stepwise task: the brief with step 1, then a step each."""
    total = len(steps)
    return [(f"{brief}\n\n" if n == 1 else "") + f"Step {n} of {total}: {says}"
            for n, says in enumerate(steps, start=1)]


def arm_tools(ex: ExecutorLike, arm: str) -> list[dict[str, Any]]:
    """The tool definitions (OpenAI's format) the model is given under ``arm``."""
    ours: list[dict[str, Any]] = ex.tool_definitions(format="openai")
    if arm == "coordex":
        return ours
    execute = next(t for t in ours if t["function"]["name"] == "execute_code")["function"]
    parameters = execute["parameters"]
    properties = {k: v for k, v in parameters["properties"].items() if k in _FIXED_ARGUMENTS}
    return [{"type": "function", "function": {
        "name": "execute_code", "description": FIXED_POLICY[arm],
        "parameters": {"type": "object", "properties": properties,
                       "required": [k for k in parameters.get("required", ()) if k in properties]}}}]


def route(ex: ExecutorLike, arm: str, name: str, arguments: Any) -> dict[str, Any]:
    """A tool call of the model's, run under ``arm``: as it came, for coordex's own tools;
    at the arm's fixed coordinate (whatever state arguments it sent) for one of the others."""
    if arm == "coordex":
        result: dict[str, Any] = ex.call_tool(name, arguments)
        return result
    if name != "execute_code":
        return {"error": f"There is no tool named {name!r}.", "error_type": "not_found",
                "suggestion": "Call execute_code: it is the one tool."}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return dict(ex.call_tool(name, arguments))
    if not isinstance(arguments, dict):
        return dict(ex.call_tool(name, arguments))
    fixed = {k: v for k, v in arguments.items() if k in _FIXED_ARGUMENTS}
    return dict(ex.call_tool(name, {**fixed, "state_mode": _FIXED_MODE[arm]}))


def drive(ex: ExecutorLike, endpoint: Endpoint, prompts: list[str], max_turns: int,
          on_result: Callable[[str, Any, dict[str, Any]], None], *,
          arm: str = "coordex", stepwise: bool = False) -> ModelRun:
    """Let the model at ``endpoint`` work through ``prompts`` (one user message, or one
    a step with ``stepwise``) with the tools of ``arm``.

    ``on_result(name, arguments, result)`` sees every tool call and its result.
    """
    tools = arm_tools(ex, arm)
    waiting = list(prompts)
    run = ModelRun(messages=[{"role": "system", "content": SYSTEM_STEPWISE if stepwise else SYSTEM},
                             {"role": "user", "content": waiting.pop(0)}])
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
            if not waiting:
                break
            run.messages.append({"role": "user", "content": waiting.pop(0)})
            continue
        for number, call in enumerate(calls):
            named = call.get("function")
            function: Mapping[str, Any] = named if isinstance(named, dict) else {}
            name, arguments = function.get("name"), function.get("arguments")
            started = time.perf_counter()
            result = route(ex, arm, str(name), arguments)
            seconds = time.perf_counter() - started
            on_result(str(name), arguments, result)
            content = _clip(json.dumps(result, default=str))
            sent = arguments if isinstance(arguments, str) else json.dumps(arguments, default=str)
            run.work.add(sent, content, seconds)
            run.messages.append({"role": "tool", "tool_call_id": call.get("id") or f"call_{number}",
                                 "content": content})
    else:
        run.failure = (f"the model was still calling tools after --max-turns {max_turns} "
                       "requests; the task is counted as failed")
    run.tokens = sum(counted) if counted else None
    return run
