"""Environment specs held as text: parse, normalise, hash. Pure: no disk, no processes.

A spec arrives in one of three shapes (SPEC section 5) and is told apart by its text:

1. PEP 723 inline script metadata — a ``# /// script`` … ``# ///`` block anywhere in
   the text (the code around it is ignored: it does not change the environment);
2. a ``pyproject.toml`` — any TOML table header such as ``[project]``; PEP 621
   ``[project] dependencies`` and ``requires-python`` are read;
3. otherwise a plain requirements list, one PEP 508 requirement per line.

All three become one :class:`EnvironmentSpec`: requirements normalised (canonical
names, sorted extras and specifiers, markers in canonical form), de-duplicated and
sorted, so ``Ledger_Lib>=1`` and ``ledger-lib >= 1`` are the same environment whichever
shape carried them. ``normalised()`` is the text identity of the environment; the
``kind`` is where it came from and is deliberately *not* part of that identity.

``spec_hash(extra)`` adds what else changes the built result — interpreter, uv version,
index settings — passed in as data by the caller, which is the one that looks at the
machine. Text that cannot be parsed raises a ``validation`` :class:`CoordexError` that
names the line, quotes it and says how to write it instead.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name

from .errors import CoordexError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

SpecKind = Literal["pyproject", "script", "requirements"]

# Bump when the normalised text format changes: old hashes must not collide with new.
NORMAL_FORM_VERSION = 1

# The reference regex of PEP 723 ("Inline script metadata", section "Reference
# implementation"), matching one ``# /// TYPE`` block.
PEP723_BLOCK = re.compile(
    r"(?m)^# /// (?P<type>[a-zA-Z0-9-]+)$\s(?P<content>(^#(| .*)$\s)+)^# ///$"
)
_PEP723_OPEN = re.compile(r"(?m)^# /// script[ \t]*$")
# A TOML table header line: ``[project]``, ``[tool.uv]``, ``[[tool.x]]``.
_TOML_TABLE = re.compile(r"(?m)^[ \t]*\[\[?[ \t]*[A-Za-z0-9_\-.\"' ]+\]\]?[ \t]*(#.*)?$")
_TOML_LINE = re.compile(r"at line (\d+)")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")

_EXAMPLE = "'ledgerlib==1.0' or 'ledgerlib @ file:///path/to/ledgerlib-1.0-py3-none-any.whl'"


@dataclass(frozen=True)
class EnvironmentSpec:
    """A parsed environment spec: what to install, on which Python.

    Attributes:
        requirements: PEP 508 strings, normalised, de-duplicated and sorted.
        requires_python: a normalised specifier set such as ``">=3.10"``, or None.
        kind: which text shape the spec came from (not part of its identity).
    """

    requirements: tuple[str, ...]
    requires_python: str | None
    kind: SpecKind

    def normalised(self) -> str:
        """The canonical text of the spec: equal environments have equal text."""
        lines = [f"# coordex environment spec v{NORMAL_FORM_VERSION}"]
        lines.append(f"# requires-python: {self.requires_python or 'any'}")
        lines.extend(self.requirements)
        return "\n".join(lines) + "\n"

    def spec_hash(self, extra: Mapping[str, Any] | None = None) -> str:
        """sha256 (hex) of the normalised spec plus what else changes the result.

        Args:
            extra: JSON-serialisable facts that change the built environment, such as
                the interpreter's version and path, uv's version and index settings.
                Key order does not matter.
        """
        payload = self.normalised() + json.dumps(
            dict(extra or {}), sort_keys=True, separators=(",", ":"), default=str
        )
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()

    def requirements_txt(self) -> str:
        """The requirements as a file uv can read (``uv pip install -r``)."""
        return "".join(f"{r}\n" for r in self.requirements)

    def names(self) -> tuple[str, ...]:
        """Canonical project names the spec asks for, in order."""
        return tuple(dict.fromkeys(Requirement(r).name for r in self.requirements))


def parse_spec(text: str) -> EnvironmentSpec:
    """Parse a spec given as text (PEP 723 block, pyproject.toml, or requirements list).

    Raises:
        CoordexError: ``validation``, naming and quoting the offending line.
    """
    if not isinstance(text, str):
        raise _invalid(
            f"An environment spec must be text, got {type(text).__name__}.",
            "Pass the spec as a string: a requirements list such as 'ledgerlib==1.0', "
            "a pyproject.toml text, or a '# /// script' block.",
        )
    if "\x00" in text:
        raise _invalid("The environment spec contains a NUL character.",
                       "Remove the NUL character from the spec text.")
    if _PEP723_OPEN.search(text):
        return _parse_script(text)
    if _TOML_TABLE.search(text):
        return _parse_pyproject(text)
    return _parse_requirements(text)


# -- the three shapes ---------------------------------------------------------------------


def _parse_script(text: str) -> EnvironmentSpec:
    blocks = [m for m in PEP723_BLOCK.finditer(text) if m.group("type") == "script"]
    opened = _PEP723_OPEN.search(text)
    if not blocks:
        line = _line_of_offset(text, opened.start()) if opened else 1
        raise _invalid(
            f"The '# /// script' block opened at line {line} is not closed, or one of its "
            "lines does not start with '#'.",
            "End the block with a line '# ///' and start every line inside it with '# ' "
            "(PEP 723), e.g. '# /// script\\n# dependencies = [\"ledgerlib==1.0\"]\\n# ///'.",
        )
    if len(blocks) > 1:
        lines = ", ".join(str(_line_of_offset(text, b.start())) for b in blocks)
        raise _invalid(
            f"The spec has {len(blocks)} '# /// script' blocks (at lines {lines}); "
            "PEP 723 allows one.",
            "Merge them into a single '# /// script' … '# ///' block.",
        )
    block = blocks[0]
    content = "".join(
        line[2:] if line.startswith("# ") else line[1:]
        for line in block.group("content").splitlines(keepends=True)
    )
    first_line = _line_of_offset(text, block.start("content"))
    data = _load_toml(content, "the '# /// script' block", line_offset=first_line - 1)
    deps = _string_list(data, "dependencies", "the '# /// script' block", text)
    requires_python = _requires_python(data.get("requires-python"), text)
    return _build(deps, requires_python, "script")


def _parse_pyproject(text: str) -> EnvironmentSpec:
    data = _load_toml(text, "the pyproject.toml text", line_offset=0)
    project = data.get("project")
    if not isinstance(project, dict):
        raise _invalid(
            "The pyproject.toml text has no [project] table, so it names no dependencies.",
            "Add a PEP 621 table: '[project]\\nname = \"env\"\\nversion = \"0\"\\n"
            "dependencies = [\"ledgerlib==1.0\"]', or pass a plain requirements list.",
        )
    deps = _string_list(project, "dependencies", "[project]", text)
    requires_python = _requires_python(project.get("requires-python"), text)
    return _build(deps, requires_python, "pyproject")


def _parse_requirements(text: str) -> EnvironmentSpec:
    entries: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        if not pending:
            start = number
        line = raw.rstrip()
        if line.endswith("\\"):  # pip-style continuation: join with the next line
            pending.append(line[:-1])
            continue
        pending.append(line)
        joined = _strip_comment(" ".join(p.strip() for p in pending)).strip()
        pending = []
        if joined:
            entries.append((start, joined))
    if pending:
        joined = _strip_comment(" ".join(p.strip() for p in pending)).strip()
        if joined:
            entries.append((start, joined))
    requirements: list[str] = []
    for number, line in entries:
        if line.startswith("-"):
            raise _invalid(
                f"Line {number} of the requirements list is a pip option, which a spec "
                f"cannot carry: {line!r}.",
                _option_hint(line),
            )
        requirements.append(_normalise_requirement(line, f"Line {number} of the "
                                                          "requirements list"))
    return _finish(requirements, None, "requirements")


# -- pieces ---------------------------------------------------------------------------------


def _build(deps: list[tuple[str, str]], requires_python: str | None,
           kind: SpecKind) -> EnvironmentSpec:
    requirements = [_normalise_requirement(value, where) for where, value in deps]
    return _finish(requirements, requires_python, kind)


def _finish(requirements: list[str], requires_python: str | None,
            kind: SpecKind) -> EnvironmentSpec:
    unique = sorted(set(requirements), key=lambda r: (Requirement(r).name, r))
    return EnvironmentSpec(tuple(unique), requires_python, kind)


def _normalise_requirement(value: str, where: str) -> str:
    try:
        requirement = Requirement(value)
    except InvalidRequirement as exc:
        reason = str(exc).splitlines()[0]
        raise _invalid(f"{where} is not a valid requirement: {value!r} ({reason}).",
                       _requirement_hint(value))
    requirement.name = canonicalize_name(requirement.name)
    if requirement.url is not None and requirement.url.startswith("/"):
        # 'name @ /abs/path.whl' is what people type; uv wants the file:// URL of it.
        requirement.url = "file://" + urllib.parse.quote(requirement.url)
    if requirement.url is not None and not _URL.match(requirement.url):
        raise _invalid(
            f"{where} points at {requirement.url!r}, which is not a URL.",
            "Use an absolute URL such as 'name @ file:///abs/path/pkg-1.0-py3-none-any.whl'.",
        )
    return str(requirement)


def _requires_python(value: Any, text: str) -> str | None:
    if value is None:
        return None
    where = f"requires-python (line {_line_of_value(text, 'requires-python')})"
    if not isinstance(value, str):
        raise _invalid(f"{where} must be a string, got {value!r}.",
                       "Write it as a version specifier string, e.g. requires-python = \">=3.10\".")
    try:
        specifiers = SpecifierSet(value)
    except InvalidSpecifier:
        raise _invalid(f"{where} is not a version specifier: {value!r}.",
                       "Write it as e.g. requires-python = \">=3.10\" or \">=3.10,<3.13\".")
    return str(specifiers) or None


def _string_list(table: dict[str, Any], key: str, where: str,
                 text: str) -> list[tuple[str, str]]:
    value = table.get(key, [])
    if not isinstance(value, list):
        raise _invalid(
            f"'{key}' in {where} (line {_line_of_value(text, key)}) must be a list of "
            f"strings, got {value!r}.",
            f"Write it as {key} = [\"ledgerlib==1.0\", \"tomli>=2\"].",
        )
    result: list[tuple[str, str]] = []
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise _invalid(
                f"{key}[{index}] in {where} must be a string, got {item!r}.",
                f"Quote each requirement, e.g. {key} = [\"ledgerlib==1.0\"].",
            )
        line = _line_of_value(text, item)
        result.append((f"{key}[{index}] in {where} (line {line})", item))
    return result


def _load_toml(content: str, where: str, line_offset: int) -> dict[str, Any]:
    try:
        data: dict[str, Any] = tomllib.loads(content)
        return data
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = _TOML_LINE.search(message)
        if found is None:
            raise _invalid(f"{where[0].upper()}{where[1:]} is not valid TOML: {message}.",
                           "Fix the TOML syntax; strings need double quotes, lists brackets.")
        inner = int(found.group(1))
        line = inner + line_offset
        lines = content.splitlines()
        quoted = lines[inner - 1] if 0 < inner <= len(lines) else ""
        raise _invalid(
            f"{where[0].upper()}{where[1:]} is not valid TOML at line {line}: {quoted!r} "
            f"({message}).",
            "Fix that line: keys are written key = value, strings in double quotes, "
            "lists as [\"a\", \"b\"], e.g. dependencies = [\"ledgerlib==1.0\"].",
        )


def _strip_comment(line: str) -> str:
    # pip's rule: '#' starts a comment at line start or after whitespace; a '#' inside a
    # URL (``…whl#sha256=…``) is kept.
    if line.startswith("#"):
        return ""
    found = re.search(r"\s#", line)
    return line[: found.start()] if found else line


def _requirement_hint(value: str) -> str:
    stripped = value.strip()
    if re.match(r"^[A-Za-z0-9._\-\[\], ]+=[^=]", stripped) and "==" not in stripped:
        fixed = re.sub(r"(?<![=<>!~])=(?!=)", "==", stripped, count=1)
        return f"Pin versions with '==': write {fixed!r}. Valid examples: {_EXAMPLE}."
    if re.match(r"^(file|https?)://|^[./~]|\.whl$|\.tar\.gz$", stripped):
        return (f"Name the package before a URL: 'name @ URL', e.g. {_EXAMPLE}; local files "
                "need an absolute file:/// URL.")
    return f"Write one PEP 508 requirement per line, e.g. {_EXAMPLE}."


def _option_hint(line: str) -> str:
    if line.startswith(("-e", "--editable")):
        return f"Install a local package by URL instead: {_EXAMPLE}."
    if line.startswith(("-i", "--index-url", "--extra-index-url", "-f", "--find-links")):
        return ("Drop the line and set the index in the host's environment (UV_INDEX_URL, "
                "UV_EXTRA_INDEX_URL or UV_FIND_LINKS), or name packages by URL: "
                f"{_EXAMPLE}.")
    return f"Drop the option and list requirements only, one per line, e.g. {_EXAMPLE}."


def _line_of_offset(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _line_of_value(text: str, needle: str) -> int | str:
    found = text.find(needle)
    return "?" if found < 0 else _line_of_offset(text, found)


def _invalid(error: str, suggestion: str) -> CoordexError:
    return CoordexError("validation", error, suggestion)


__all__ = ["NORMAL_FORM_VERSION", "PEP723_BLOCK", "EnvironmentSpec", "SpecKind", "parse_spec"]


# -- resources a spec asks for on a cluster ([tool.coordex]) ----------------------------

RESOURCE_KEYS = ("num_cpus", "num_gpus", "memory")


def spec_resources(text: str) -> dict[str, float]:
    """What a pyproject spec's ``[tool.coordex]`` table asks of a cluster node.

    Reads ``num_cpus``, ``num_gpus`` (numbers >= 0) and ``memory`` (bytes, a number >=
    0); other shapes and other keys of the table are not resources and are ignored here.
    Resources change where a session runs, not what is installed, so they are not part
    of the spec hash.

    Raises:
        CoordexError: ``validation`` for a resource that is not a non-negative number.
    """
    if not isinstance(text, str) or _PEP723_OPEN.search(text) or not _TOML_TABLE.search(text):
        return {}
    data = _load_toml(text, "the pyproject.toml text", line_offset=0)
    tool = data.get("tool")
    table = tool.get("coordex") if isinstance(tool, dict) else None
    if not isinstance(table, dict):
        return {}
    resources: dict[str, float] = {}
    for key in RESOURCE_KEYS:
        if key not in table:
            continue
        value = table[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise _invalid(
                f"[tool.coordex] {key} (line {_line_of_value(text, key)}) must be a number "
                f">= 0, got {value!r}.",
                f"Write it as {key} = 1" + (" (bytes, e.g. memory = 2147483648 for 2 GiB)"
                                             if key == "memory" else "") + ", or remove it.")
        if value:
            resources[key] = float(value)
    return resources
