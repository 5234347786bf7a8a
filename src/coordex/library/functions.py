"""The stored-function library: ``ex.functions`` (SPEC section 5).

How it works:

- A function is stored as data (:mod:`.store`): its source text and the environment
  spec it needs. ``@functions.define(env=...)`` takes the decorated function's own
  source (decorators stripped, dedented); ``define(source=..., name=...)`` takes text.
- Calling never runs the function here directly. Every call is generated Python that
  defines the function from its source and calls it, sent through the Executor like
  any ``execute_code`` call, so coordinates are validated the same way, sessions are
  counted and listed the same way, and read-only calls get the same isolation.
- Values: in the agent's own interpreter (stateless and stateful) arguments and the
  return value are real objects, handed over through a per-call slot in this module.
  Across a process boundary — an environment's worker, or the fork a read-only call
  runs in — they travel as plain JSON (:mod:`._codec`): arguments embedded in the code
  as a literal, the return value as the cell's last expression (``result``). Arguments
  that are not plain are refused before anything runs.
- A failure raises :class:`~coordex.library.errors.CallError` carrying the error record.

The generated code keeps the session's visible names clean: its helper is named
``__coordex_call__`` and removes itself (inspect hides dunder names anyway).
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import json
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, overload

from ..core import coordinates as coords
from ..core.coordinates import StateMode
from ..core.errors import CoordexError, nearest, quoted_list
from ..worker._coordex_engine import safe_repr
from . import _codec
from .errors import CallError
from .store import FunctionRecord, LibraryStore

if TYPE_CHECKING:
    from ..log.detached import CallRecord as Recorded

OutputCallback = Callable[[str, str], None]

DB_NAME = "library.sqlite3"
# Largest return value (characters of JSON) that may cross a process boundary. The cell's
# result is a repr() of that JSON string, which escapes at most doubles it.
RESULT_LIMIT = 8 * 1024 * 1024
_TRANSFER_LIMIT = 2 * RESULT_LIMIT + 4096

_PLAIN = ("plain values: numbers, strings, bytes, bool, None, and lists/tuples/dicts "
          "(string keys) of them")


# --------------------------------------------------------------------------- call slots


class _Slot:
    """Arguments in, value out, for one call in the agent's own interpreter."""

    __slots__ = ("args", "done", "kwargs", "value")

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.args = args
        self.kwargs = kwargs
        self.value: Any = None
        self.done = False


# Read by generated code through __import__ (a read-only fork sees a copy of it).
_SLOTS: dict[str, _Slot] = {}


# --------------------------------------------------------------------------- source


def source_of(fn: Callable[..., Any]) -> str:
    """The source of ``fn``'s ``def``, dedented, without its decorator lines."""
    name = getattr(fn, "__name__", None)
    if not inspect.isfunction(fn) or name == "<lambda>":
        raise CallError(
            "validation", f"define() takes a function defined with def, got {_shown(fn)}.",
            "Decorate a def function, or pass its code as text: "
            "functions.define(source='def f(x): ...', name='f').")
    try:
        text = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        raise CallError(
            "validation", f"The source of {name!r} cannot be found (defined interactively?).",
            "Pass the code as text instead: functions.define(source='def ...', "
            f"name={name!r}).")
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            lines = text.splitlines(keepends=True)
            body = "".join(lines[node.lineno - 1:node.end_lineno])
            return textwrap.dedent(body)
    raise CallError("validation", f"Could not find 'def {name}' in its own source.",
                    f"Pass the code as text: functions.define(source=..., name={name!r}).")


def analyse(source: str, name: str | None) -> tuple[str, str, str | None]:
    """Check ``source`` and find the function: returns (name, signature, docstring).

    ``name`` may be None when the source defines exactly one top-level function.
    """
    if not isinstance(source, str) or not source.strip():
        raise CallError("validation", "source must be non-empty Python text, got "
                        f"{_shown(source)}.",
                        "Pass the function's code as a string: source='def f(x):\\n    ...'.")
    if name is not None and not isinstance(name, str):
        _check_name(name)
    if not coords.is_valid_text(source) or (isinstance(name, str)
                                            and not coords.is_valid_text(name)):
        raise CallError("validation", "The source or name holds a character that is not valid "
                        "text (a lone surrogate, as from undecodable bytes).",
                        "Write the code in plain UTF-8 text; build such strings at run time "
                        "(os.fsdecode) instead of writing them into the source.")
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise CallError("validation", f"The source does not parse: {exc.msg} (line {exc.lineno}).",
                        f"Fix the syntax at line {exc.lineno} and define it again.")
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    if any(isinstance(n, ast.AsyncFunctionDef) for n in tree.body) and not defs:
        raise CallError("validation", "The source defines only async functions.",
                        "Stored functions are called synchronously; define a regular def "
                        "(call asyncio.run(...) inside it if you need a coroutine).")
    if name is None:
        if len(defs) != 1:
            found = quoted_list(defs, empty="no top-level def")
            raise CallError(
                "validation",
                f"Cannot tell which function to store: the source defines {found}.",
                "Pass name='...' naming the function to call." if defs else
                "Define one top-level function with def, e.g. source='def f(x):\n    return x'.")
        name = next(iter(defs))
    _check_name(name)
    node = defs.get(name)
    if node is None:
        bound = {t.id for n in tree.body if isinstance(n, ast.Assign | ast.AnnAssign)
                 for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                 if isinstance(t, ast.Name)}
        bound |= {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
        if name not in bound:
            hint = nearest(name, defs)
            raise CallError(
                "validation", f"The source does not define {name!r} at top level.",
                f"Did you mean name={hint!r}?" if hint else
                f"Top-level functions in it: {quoted_list(defs)}. Pass one of them as name=.")
        return name, f"{name}(...)", None
    signature = f"{name}({ast.unparse(node.args)})"
    if node.returns is not None:
        signature += f" -> {ast.unparse(node.returns)}"
    return name, signature, ast.get_docstring(node)


def _shown(value: Any) -> str:
    """``repr(value)`` for a message: never raising, valid text, at most 80 characters."""
    return safe_repr(value, 80)


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("__"):
        raise CallError("validation",
                        f"A stored function's name must be a Python identifier, got {_shown(name)}.",
                        "Use a name like 'run_forecast' (letters, digits, underscores; "
                        "not starting with '__').")


def _env_key(env: Any) -> str | None:
    """The spec's normalised text (its identity), or None for the own interpreter."""
    if env is None:
        return None
    from ..core.spec import parse_spec

    try:
        return parse_spec(env).normalised()
    except CoordexError as exc:
        raise CallError(exc.error_type, exc.error, exc.suggestion, **exc.extra)


# --------------------------------------------------------------------------- generated code


def call_code(source: str, name: str, *, token: str | None = None,
              args_json: str | None = None, plain_value: bool = True) -> str:
    """The cell that defines the function from ``source`` and calls it once.

    Args:
        token: the ``_SLOTS`` key holding the arguments (own interpreter, read-only
            forks included); when None they come from ``args_json``.
        args_json: ``[args, kwargs]`` as encoded JSON text.
        plain_value: send the value back as JSON in the cell's last expression (across
            a process boundary) instead of putting the object in the slot.
    """
    body = []
    if token is not None:
        body += [f"slot = __import__({__name__!r}, fromlist=['_SLOTS'])._SLOTS[{token!r}]",
                 "args, kwargs = slot.args, slot.kwargs"]
    else:
        body += ["import json", f"args, kwargs = decode(json.loads({args_json!r}))"]
    body.append(f"value = {name}(*args, **kwargs)")
    if not plain_value:
        body += ["slot.value = value", "slot.done = True", "return None"]
    else:
        body += [
            "import json",
            "try:",
            "    text = json.dumps(encode(value, 'the return value'))",
            "except TypeError as exc:",
            f"    raise TypeError('coordex: %s of {name} is a %s, which cannot cross a process "
            "boundary' % (getattr(exc, 'where', 'the return value'), "
            "getattr(exc, 'type_name', '?')))",
            f"if len(text) > {RESULT_LIMIT}:",
            f"    raise ValueError('coordex: {name} returned %d characters of JSON, over the "
            f"{RESULT_LIMIT} limit' % len(text))",
            "return text",
        ]
    if token is None or plain_value:
        body[:0] = _codec.IMPORT_SOURCE.splitlines()
    lines = [source.rstrip("\n"), "", "", "def __coordex_call__():"]
    lines += ["    " + line if line else "" for line in body]
    # Last expression: the call's value (JSON text or None); the helper removes itself.
    lines.append("globals().pop('__coordex_call__')()")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- calls


class Call:
    """A stored function placed at one coordinate; call it like the function.

    Created by :meth:`StoredFunction.stateless`, ``.stateful`` or ``.read_only``.
    """

    def __init__(self, function: StoredFunction, state_mode: StateMode,
                 session_id: int | None, session_name: str | None,
                 timeout: float | None, on_output: OutputCallback | None) -> None:
        try:
            coords.check_coordinate("python", state_mode, session_id, session_name, None)
            if timeout is not None and coords.check_timeout(timeout) is None:
                raise CallError("validation", f"timeout must be a positive number, got "
                                f"{timeout!r}.", "Pass timeout=<seconds> or leave it out.")
        except CoordexError as exc:
            raise _as_call_error(exc)
        self.function = function
        self.state_mode = state_mode
        self.session_id = session_id
        self.session_name = session_name
        self.timeout = timeout
        self.on_output = on_output

    def __repr__(self) -> str:
        where = ""
        if self.session_name is not None:
            where = f"session_name={self.session_name!r}"
        elif self.session_id is not None:
            where = f"session_id={self.session_id}"
        return f"<{self.function.name} v{self.function.version}.{self.state_mode}({where})>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function._library._call(self, args, kwargs)


class StoredFunction:
    """One version of a stored function. ``f(...)`` is ``f.stateless()(...)``.

    Attributes: ``name``, ``version``, ``source``, ``env`` (spec text or None),
    ``signature``, ``doc``, ``created_at``.
    """

    def __init__(self, library: FunctionLibrary, record: FunctionRecord) -> None:
        self._library = library
        self.record = record
        self.name = record.name
        self.version = record.version
        self.source = record.source
        self.env = record.env
        self.signature = record.signature
        self.doc = record.doc
        self.created_at = record.created_at
        self.__doc__ = record.doc

    def __repr__(self) -> str:
        where = "own interpreter"
        if self.record.env_key is not None:
            needs = [ln for ln in self.record.env_key.splitlines() if not ln.startswith("#")]
            where = "environment: " + (", ".join(needs) or "no packages")
            where = where if len(where) <= 100 else where[:97] + "..."
        return f"<stored function {self.signature} v{self.version}, {where}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.stateless()(*args, **kwargs)

    def stateless(self, session_id: int | None = None, session_name: str | None = None, *,
                  timeout: float | None = None, on_output: OutputCallback | None = None) -> Call:
        """A fresh namespace (or process) per call; nothing is kept. Naming a session
        is a ``validation`` error, as for execute_code."""
        return Call(self, "stateless", session_id, session_name, timeout, on_output)

    def stateful(self, session_id: int | None = None, session_name: str | None = None, *,
                 timeout: float | None = None, on_output: OutputCallback | None = None) -> Call:
        """Run inside a kept session (session 0 when none is named: in the own
        interpreter, the plan's namespace). The session keeps the definition and
        whatever the call changed."""
        return Call(self, "stateful", session_id, session_name, timeout, on_output)

    def read_only(self, session_id: int | None = None, session_name: str | None = None, *,
                  timeout: float | None = None, on_output: OutputCallback | None = None) -> Call:
        """Run against a copy of an existing session; nothing it does persists. The
        return value must be plain (it comes back from another process)."""
        return Call(self, "read_only", session_id, session_name, timeout, on_output)

    def describe(self) -> dict[str, Any]:
        """What ``functions.list()`` shows for this version."""
        return self._library._describe(self.record)


# --------------------------------------------------------------------------- the runner


class FunctionRunner(Protocol):
    """What the library needs of whoever runs its calls (the Executor implements it).

    ``run_function_code`` is ``execute_code`` for Python with the same validation,
    sessions, capacity and isolation, a larger output limit (the value comes back in
    ``result``), and one difference: a call made from code running in the very session
    it names runs there at once instead of waiting for that session.
    """

    root: Path

    @property
    def environments(self) -> Any: ...

    def run_function_code(self, code: str, *, state_mode: StateMode, session_id: int | None,
                          session_name: str | None, venv_id: int | None,
                          timeout: float | None, on_output: OutputCallback | None,
                          output_limit: int, recorded: Recorded | None = None
                          ) -> dict[str, Any]: ...


# --------------------------------------------------------------------------- the library


class FunctionLibrary:
    """``ex.functions``: define, look up, list and call stored functions.

    ``functions["name"]`` / ``functions.name`` give the latest version;
    ``functions["name@1"]`` or ``functions.get("name", version=1)`` an older one.
    A name that is also a method here (``list``, ``get``, ``define``) is reached with
    ``functions["list"]``.
    """

    def __init__(self, executor: FunctionRunner, store: LibraryStore | None = None) -> None:
        self._executor = executor
        self._path = Path(executor.root) / DB_NAME
        # ``store``: one written elsewhere (a confined host's, by its owner).
        self._store_obj: LibraryStore | None = store
        self._lock = threading.Lock()
        self._venv_ids: dict[str, int] = {}

    @property
    def _store(self) -> LibraryStore:
        # Opened on first use: every Executor injects the library into its sessions,
        # and most never store anything.
        with self._lock:
            if self._store_obj is None:
                self._store_obj = LibraryStore(self._path)
            return self._store_obj

    def close(self) -> None:
        with self._lock:
            if self._store_obj is not None:
                self._store_obj.close()

    # -- defining -----------------------------------------------------------------------

    @overload
    def define(self, fn: Callable[..., Any], *, env: str | None = None,
               name: str | None = None) -> StoredFunction: ...

    @overload
    def define(self, fn: None = None, *, env: str | None = None, source: str,
               name: str | None = None) -> StoredFunction: ...

    @overload
    def define(self, fn: None = None, *, env: str | None = None, source: None = None,
               name: str | None = None) -> Callable[[Callable[..., Any]], StoredFunction]: ...

    def define(self, fn: Callable[..., Any] | None = None, *, env: str | None = None,
               source: str | None = None, name: str | None = None) -> Any:
        """Store a function; returns its :class:`StoredFunction`.

        Use as ``@functions.define``, ``@functions.define(env=spec)``, or
        ``functions.define(source="def f(x): ...", name="f", env=spec)``.

        Args:
            fn: a ``def`` function; its own source is stored (decorators stripped).
                It must be self-contained: imports and helpers inside it.
            env: an environment spec (requirements list, pyproject.toml text or a PEP 723
                block) to run it in, or None for the agent's own interpreter.
            source: the code as text, instead of ``fn``; it may hold imports and helpers
                around the function.
            name: the function to call in ``source`` (inferred when it defines exactly
                one); with ``fn``, a name to store it under instead of ``fn.__name__``.

        Same source and environment as the latest version keeps that version; anything
        else becomes a new version (older ones stay callable).

        Nothing the caller passes makes it raise (SPEC 2): bad source, name or spec
        (a lone surrogate included) returns the ``validation`` error dict, and coordex's
        own storage failing (a full disk, a read-only or damaged library, a full
        environment registry) the ``environment`` one, instead of a
        :class:`StoredFunction`.
        """
        try:
            return self._define(fn, env=env, source=source, name=name)
        except CallError as exc:
            return dict(exc.record)

    def _define(self, fn: Callable[..., Any] | None, *, env: str | None,
                source: str | None, name: str | None) -> Any:
        if fn is None and source is None:
            return lambda f: self.define(f, env=env, name=name)
        if fn is not None and source is not None:
            raise CallError("validation", "define() got both a function and source=.",
                            "Pass one: decorate the function, or give source= text.")
        if fn is not None:
            text = source_of(fn)
            found, signature, doc = analyse(text, fn.__name__)
            if name is not None and name != found:
                _check_name(name)
                text += f"\n\n{name} = {found}\n"
                signature = name + signature[len(found):]
                found = name
        else:
            found, signature, doc = analyse(source, name)  # type: ignore[arg-type]
            text = source  # type: ignore[assignment]
        env_key = _env_key(env)
        if env is not None:
            self._venv_id(env, env_key)  # registers the environment; fails early on bad specs
        record, _ = self._store.define(name=found, source=text, env=env, env_key=env_key,
                                       signature=signature, doc=doc, now=time.time())
        return StoredFunction(self, record)

    # -- looking up ---------------------------------------------------------------------

    def get(self, name: str, version: int | None = None) -> StoredFunction:
        """A stored function (the latest version unless ``version`` is given).

        Raises:
            CallError: ``not_found`` naming the nearest stored names or the versions.
        """
        if isinstance(name, str) and "@" in name and version is None:
            base, _, number = name.rpartition("@")
            if not number.isdigit():
                raise CallError("validation", f"Bad version in {name!r}.",
                                f"Write it as '{base}@1' (name@version, a whole number).")
            name, version = base, int(number)
        if not isinstance(name, str):
            raise CallError("validation", f"A function name must be a string, got {_shown(name)}.",
                            "Use functions['name'] or functions.get('name').")
        if not coords.is_valid_text(name):  # a lone surrogate: no stored name holds one
            raise CallError("validation", f"A function name must be valid text, got {name!r:.80}.",
                            "Use the name functions.list() shows.")
        if version is not None and (isinstance(version, bool) or not isinstance(version, int)
                                    or not 0 <= version < 1 << 63):
            raise CallError("validation", f"version must be an integer, got {version!r:.40}.",
                            "Pass version=1 (see functions.versions(name)).")
        record = self._store.get(name, version)
        if record is None:
            raise self._not_found(name, version)
        return StoredFunction(self, record)

    def versions(self, name: str) -> list[int]:
        """Every stored version of ``name``, oldest first (empty if none, and for a name
        no stored function can have: not text, or a lone surrogate in it)."""
        if not isinstance(name, str) or not coords.is_valid_text(name):
            return []
        return self._store.versions(name)

    def _not_found(self, name: str, version: int | None) -> CallError:
        names = self._store.names()
        if version is not None and name in names:
            versions = self._store.versions(name)
            return CallError(
                "not_found", f"Stored function {name!r} has no version {version}.",
                f"Versions of {name!r}: {', '.join(map(str, versions))}. Use "
                f"functions.get({name!r}, version={versions[-1]}) or functions[{name!r}] "
                "for the latest.")
        hint = nearest(name, names)
        if hint is not None:
            suggestion = (f"Did you mean {hint!r}? Stored functions: {quoted_list(names)}.")
        elif names:
            suggestion = (f"Stored functions: {quoted_list(names)}. Define it first with "
                          "functions.define(source=..., name=...).")
        else:
            suggestion = ("No functions are stored yet. Define one with @functions.define or "
                          "functions.define(source='def f(x): ...').")
        return CallError("not_found", f"No stored function named {name!r}.", suggestion)

    def __getitem__(self, name: str) -> StoredFunction:
        return self.get(name)

    def __getattr__(self, name: str) -> StoredFunction:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self.get(name)
        except CallError as exc:
            # Also an AttributeError, so hasattr()/getattr(..., default) keep working.
            raise FunctionNotFoundError.from_record(exc.record)

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        try:
            self.get(name)
        except CallError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self._store.names())

    def __len__(self) -> int:
        return len(self._store.names())

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._store.names()))

    def __repr__(self) -> str:
        items = [f"{r.signature} v{r.version}" for r in self._store.latest_all()]
        return f"<functions: {', '.join(items) or 'none stored'}>"

    def show(self, name: str, version: int | None = None) -> dict[str, Any]:
        """One function as a dict, source included; an error dict if there is none
        (never raises: for front ends such as ``coordex functions show``)."""
        try:
            fn = self.get(name, version)
        except CallError as exc:
            return exc.record
        return {**fn.describe(), "source": fn.source}

    def list(self) -> dict[str, Any]:
        """``{"functions": [{"name","version","signature","doc","env","venv_id",
        "created_at","versions"}...]}``: the latest version of each, by name."""
        return {"functions": [self._describe(r) for r in self._store.latest_all()]}

    def _describe(self, record: FunctionRecord) -> dict[str, Any]:
        venv_id = None
        if record.env is not None:
            with contextlib.suppress(CallError):
                venv_id = self._venv_id(record.env, record.env_key)
        return {"name": record.name, "version": record.version, "signature": record.signature,
                "doc": record.doc, "env": record.env, "venv_id": venv_id,
                "created_at": record.created_at,
                "versions": self._store.versions(record.name)}

    # -- calling ------------------------------------------------------------------------

    def _venv_id(self, env: str, env_key: str | None) -> int:
        key = env_key or env
        with self._lock:
            known = self._venv_ids.get(key)
        if known is not None:
            return known
        created = self._executor.environments.create(env)
        if "error_type" in created:
            raise CallError.from_record(created)
        venv_id = int(created["venv_id"])
        with self._lock:
            self._venv_ids[key] = venv_id
        return venv_id

    def call(self, name: str, args: Sequence[Any] | None = None,
             kwargs: dict[str, Any] | None = None, *, state_mode: str = "stateless",
             session_id: int | None = None, session_name: str | None = None,
             version: int | None = None, timeout: float | None = None,
             on_output: OutputCallback | None = None,
             recorded: Recorded | None = None) -> dict[str, Any]:
        """Call a stored function and return a dict; never raises (for front ends).

        ``on_output(stream, text)`` receives what the function prints as it runs.
        ``recorded``: the call record (SPEC 14) a front end runs this call under (its
        ``call_id`` on the call's log row; ``cancel_call`` reaches the code).

        Returns:
            the execute_code result keys (``stdout``, ``stderr``, ``session``, ...) plus
            ``function`` (name and version) and ``value``: the return value as plain
            JSON-ready data (bytes as ``{"__bytes__": base64}``), or ``None`` with
            ``value_repr`` when it is not plain. On failure, the error dict.
        """
        try:
            mode = coords.check_state_mode(state_mode)
            fn = self.get(name, version)
            placed = Call(fn, mode, session_id, session_name, timeout, on_output)
            if not isinstance(args, list | tuple | type(None)) or \
                    not isinstance(kwargs, dict | type(None)):
                raise CallError("validation", "args must be a list and kwargs a dict.",
                                "Pass args=[...] and kwargs={...}, or leave them out.")
            record, value = self._invoke(placed, tuple(args or ()), dict(kwargs or {}),
                                         echo=False, recorded=recorded)
        except CoordexError as exc:
            return _as_call_error(exc).record
        record = {k: v for k, v in record.items() if k != "result"}
        record["function"] = {"name": fn.name, "version": fn.version}
        try:
            record["value"] = _codec.encode(value)
        except _codec.NotPlain:
            from ..worker._coordex_engine import safe_repr

            record["value"], record["value_repr"] = None, safe_repr(value, 2000)
        from ..spill import fit_function_result

        # SPEC 14: one result stays within what clients accept; the rest goes to a file.
        return fit_function_result(record, getattr(self._executor, "spill_folder", None))

    def _call(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self._invoke(call, args, kwargs, echo=call.on_output is None)[1]

    def _invoke(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any], *,
                echo: bool, recorded: Recorded | None = None) -> tuple[dict[str, Any], Any]:
        """Run one call; returns (the executor's record, the value) or raises CallError."""
        fn = call.function
        venv_id = None if fn.env is None else self._venv_id(fn.env, fn.record.env_key)
        # Own interpreter: real objects through a slot; a read-only call runs in a fork,
        # which can read the slot but must send its value back as JSON.
        in_process = venv_id is None
        plain_value = not in_process or call.state_mode == "read_only"
        token = uuid.uuid4().hex if in_process else None
        args_json = None if in_process else _encode_arguments(fn, args, kwargs, venv_id)
        code = call_code(fn.source, fn.name, token=token, args_json=args_json,
                         plain_value=plain_value)
        slot = _Slot(args, kwargs) if token is not None else None
        if token is not None and slot is not None:
            _SLOTS[token] = slot
        try:
            record = self._executor.run_function_code(
                code, state_mode=call.state_mode, session_id=call.session_id,
                session_name=call.session_name, venv_id=venv_id, timeout=call.timeout,
                on_output=call.on_output, output_limit=_TRANSFER_LIMIT, recorded=recorded)
        finally:
            if token is not None:
                _SLOTS.pop(token, None)
        if echo:
            _echo(record)
        if "error_type" in record:
            raise _call_failed(fn, record)
        if slot is not None and not plain_value:
            return record, slot.value
        return record, _decode_result(fn, record)


def _encode_arguments(fn: StoredFunction, args: tuple[Any, ...], kwargs: dict[str, Any],
                      venv_id: int | None) -> str:
    try:
        encoded = [_codec.encode(list(args), "args"), _codec.encode(kwargs, "kwargs")]
    except _codec.NotPlain as exc:
        path, type_name = getattr(exc, "path", "an argument"), getattr(exc, "type_name", "?")
        if type_name.startswith("pathlib."):
            raise CallError(
                "validation", f"Cannot pass {path} (a {type_name}) to {fn.name!r}: it runs in "
                f"environment venv_id={venv_id}, another process, and only {_PLAIN} cross "
                "into it.", f"Pass the path as a string instead: str({path}). Nothing ran.")
        raise CallError(
            "validation",
            f"Cannot pass {path} (of type {type_name}) to {fn.name!r}: it runs in environment "
            f"venv_id={venv_id}, another process, and only {_PLAIN} cross into it.",
            "Write it to a file and pass the path (e.g. df.to_csv('data.csv'), then pass "
            "'data.csv'), or pass a plain value (a list, dict or string). Nothing ran.")
    return json.dumps(encoded)


def _decode_result(fn: StoredFunction, record: dict[str, Any]) -> Any:
    text = record.get("result")
    try:
        return _codec.decode(json.loads(ast.literal_eval(text))) if text is not None else None
    except (ValueError, SyntaxError, TypeError):
        raise CallError(
            "execution", f"The value {fn.name!r} returned could not be read back "
            f"({len(text or '')} characters).",
            f"Return a smaller plain value (under {RESULT_LIMIT} characters of JSON), or "
            "write it to a file and return the path.")


def _echo(record: dict[str, Any]) -> None:
    """Show the call's output where the caller's output goes (the outer cell, nested)."""
    for key, stream in (("stdout", sys.stdout), ("stderr", sys.stderr)):
        text = record.get(key)
        if text:
            with contextlib.suppress(Exception):
                stream.write(text)


def _call_failed(fn: StoredFunction, record: dict[str, Any]) -> CallError:
    record = dict(record)
    record.pop("duration_ms", None)
    message = str(record.get("error", ""))
    if record.get("error_type") == "execution":
        if "coordex: " in message:
            # Our own boundary checks inside the generated code.
            detail = message.split("coordex: ", 1)[1]
            record["error"] = detail
            record["suggestion"] = ("Return plain values, or write the data to a file and "
                                    "return the path.")
        elif record.get("exception") == "NameError":
            record["suggestion"] = (
                f"Stored functions carry only their own source: import modules and define "
                f"helpers inside {fn.name!r} (or in its source= text), then define it again.")
        else:
            record["suggestion"] = (
                f"{fn.name!r} v{fn.version} raised; read the traceback, then fix the "
                "arguments or define a corrected version.")
    return CallError.from_record(record)


def _as_call_error(exc: CoordexError) -> CallError:
    if isinstance(exc, CallError):
        return exc
    return CallError(exc.error_type, exc.error, exc.suggestion, **exc.extra)


class FunctionNotFoundError(CallError, AttributeError):
    """``functions.nope``: a ``not_found`` CallError that is also an AttributeError."""
