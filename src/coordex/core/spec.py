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

A spec is read as its author meant it or refused, never half-read (SPEC section 5):
CRLF line endings are read as LF; a ``# /// TYPE`` block other than ``script``, a second
``script`` block, ``[tool.uv]`` settings (indexes, sources: coordex builds with uv's
configuration switched off) and ``${VAR}`` in a requirement (uv would expand it from the
host's environment, and its value would end up in error messages) are refused.
``[tool.coordex]`` asks for cluster resources (``num_cpus``, ``num_gpus``, ``memory``):
they are kept in :attr:`EnvironmentSpec.resources` and are not part of the
environment's identity (the same packages on a bigger node are the same environment).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name

from .coordinates import is_valid_text
from .errors import CoordexError, nearest

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
# Any line that opens a PEP 723 block, whatever its TYPE (or a near-miss spelling).
_BLOCK_OPEN = re.compile(r"(?m)^#[ \t]*///[ \t]*(?P<type>\S+)[ \t]*$")
# uv expands ${VAR} in requirements (and URLs) from the environment it runs in.
_ENV_REFERENCE = re.compile(r"\$\{[^}]*\}")
# [tool.coordex] keys: what a session in the environment needs of a cluster node.
RESOURCE_KEYS = ("num_cpus", "num_gpus", "memory")
_MEMORY = re.compile(r"^\s*(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[KMGT]i?B?|B)?\s*$",
                     re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "KIB": 2**10, "M": 10**6, "MB": 10**6,
          "MIB": 2**20, "G": 10**9, "GB": 10**9, "GIB": 2**30, "T": 10**12, "TB": 10**12,
          "TIB": 2**40}
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
        resources: what ``[tool.coordex]`` asks of a cluster node - ``num_cpus`` and
            ``num_gpus`` (numbers), ``memory`` (bytes, an int) - only the keys given;
            not part of the identity or the hash.
    """

    requirements: tuple[str, ...]
    requires_python: str | None
    kind: SpecKind
    resources: Mapping[str, float | int] = field(default_factory=dict, hash=False,
                                                 compare=False)

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
    if not is_valid_text(text):
        raise _invalid("The environment spec contains a character that is not valid text "
                       "(a lone surrogate, as from undecodable bytes).",
                       "Write the spec in plain UTF-8 text: package names and versions only.")
    # Windows line endings: PEP 723's block pattern (and people) mean the same lines.
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    _check_block_markers(text)
    try:
        if _PEP723_OPEN.search(text):
            return _parse_script(text)
        if _TOML_TABLE.search(text):
            return _parse_pyproject(text)
        return _parse_requirements(text)
    except RecursionError:  # tomllib recurses once per nesting level
        raise _invalid("The environment spec nests tables or lists too deeply to read.",
                       "Flatten the TOML: a spec needs only [project] with dependencies = "
                       "[\"name==1.0\", ...] and requires-python.") from None


# -- the three shapes ---------------------------------------------------------------------


def _check_block_markers(text: str) -> None:
    """Refuse ``# /// TYPE`` blocks coordex would not read, and a second script block."""
    scripts: list[int] = []
    for found in _BLOCK_OPEN.finditer(text):
        line = _line_of_offset(text, found.start())
        if _PEP723_OPEN.fullmatch(found.group(0)):
            scripts.append(line)
        else:  # another TYPE, or a spelling PEP 723 readers skip ('#/// script')
            raise _invalid(
                f"Line {line} opens a {found.group(0).strip()!r} block; coordex reads only "
                "'# /// script' blocks (PEP 723 inline script metadata), so this one would "
                "be ignored.",
                "Write the dependencies in a '# /// script' block: '# /// script\\n"
                "# dependencies = [\"ledgerlib==1.0\"]\\n# ///', or pass pyproject.toml text "
                "without the '# ' prefixes.",
            )
    if len(scripts) > 1:
        raise _invalid(
            f"The spec has {len(scripts)} '# /// script' blocks (at lines "
            f"{', '.join(map(str, scripts))}); PEP 723 allows one.",
            "Merge them into a single '# /// script' … '# ///' block.",
        )


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
    resources = _tool_tables(data, text)
    return _build(deps, requires_python, "script", resources)


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
    resources = _tool_tables(data, text)
    return _build(deps, requires_python, "pyproject", resources)


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
           kind: SpecKind, resources: Mapping[str, float | int]) -> EnvironmentSpec:
    requirements = [_normalise_requirement(value, where) for where, value in deps]
    return _finish(requirements, requires_python, kind, resources)


def _finish(requirements: list[str], requires_python: str | None,
            kind: SpecKind, resources: Mapping[str, float | int] | None = None) -> EnvironmentSpec:
    unique = sorted(set(requirements), key=lambda r: (Requirement(r).name, r))
    return EnvironmentSpec(tuple(unique), requires_python, kind, dict(resources or {}))


def _tool_tables(data: dict[str, Any], text: str) -> dict[str, float | int]:
    """Refuse ``[tool.uv]``; read ``[tool.coordex]`` resources. Other tools' tables are
    theirs (a linter's settings do not change the environment)."""
    tool = data.get("tool")
    if not isinstance(tool, dict):
        return {}
    if "uv" in tool:
        raise _uv_settings(tool["uv"], text)
    table = tool.get("coordex", {})
    if not isinstance(table, dict):
        raise _invalid(f"tool.coordex (line {_line_of_value(text, 'tool.coordex')}) must be a "
                       f"table, got {table!r}.",
                       "Write it as [tool.coordex] with num_cpus, num_gpus or memory keys.")
    resources: dict[str, float | int] = {}
    for key, value in table.items():
        line = _line_of_value(text, key)
        if key not in RESOURCE_KEYS:
            guess = nearest(key, RESOURCE_KEYS)
            hint = f" Did you mean {guess!r}?" if guess else ""
            raise _invalid(
                f"[tool.coordex] key {key!r} (line {line}) is not one coordex knows.",
                f"Use only num_cpus, num_gpus and memory (e.g. num_gpus = 1, "
                f"memory = \"8GiB\").{hint}",
            )
        resources[key] = _resource(key, value, line)
    return resources


def _resource(key: str, value: Any, line: int | str) -> float | int:
    """One ``[tool.coordex]`` value: a non-negative number; memory in bytes or '8GiB'."""
    if key == "memory" and isinstance(value, str):
        found = _MEMORY.match(value)
        if found is not None:
            unit = (found.group("unit") or "").upper()
            unit = unit if unit in _UNITS else unit + "B"
            if unit in _UNITS:
                return int(float(found.group("number")) * _UNITS[unit])
    elif not isinstance(value, bool) and isinstance(value, (int, float)) and value >= 0:
        return int(value) if key == "memory" else value
    example = 'memory = "8GiB" (or a number of bytes)' if key == "memory" else f"{key} = 2"
    raise _invalid(f"[tool.coordex] {key} (line {line}) must be a number >= 0, got {value!r}.",
                   f"Write it as {example}.")


def _uv_settings(settings: Any, text: str) -> CoordexError:
    """``[tool.uv]`` would be silently dropped (builds run uv with --no-config): refuse it."""
    keys = sorted(settings) if isinstance(settings, dict) else []
    line = _line_of_value(text, "tool.uv")
    shown = f" ({', '.join(keys)})" if keys else ""
    if any(key in ("index", "index-url", "extra-index-url", "find-links", "no-index")
           for key in keys):
        fix = ("To use another index, set it in the host's environment (UV_INDEX_URL, "
               "UV_EXTRA_INDEX_URL or UV_FIND_LINKS) before starting coordex, or name "
               f"packages by URL: {_EXAMPLE}.")
    elif "sources" in keys:
        fix = ("Name each package by URL in the dependencies instead of in [tool.uv.sources]: "
               f"{_EXAMPLE}.")
    else:
        fix = "Remove the [tool.uv] table and list requirements in the dependencies only."
    return _invalid(
        f"The spec has [tool.uv] settings{shown} at line {line}; coordex does not apply "
        "them (environments are built from the dependencies alone, the same on every "
        "machine), so the spec would not be read as written.",
        fix + " Then create the environment again.",
    )


def _normalise_requirement(value: str, where: str) -> str:
    reference = _ENV_REFERENCE.search(value)
    if reference is not None:
        raise _invalid(
            f"{where} refers to the environment variable {reference.group(0)!r}: {value!r}. "
            "uv would expand it from the host's environment, so the spec would not say "
            "what it installs (and the value could appear in error messages).",
            "Write the value itself, e.g. 'ledgerlib @ file:///abs/path/"
            "ledgerlib-1.0-py3-none-any.whl' instead of '${WHEELS}/ledgerlib-1.0-…'.",
        )
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


__all__ = ["NORMAL_FORM_VERSION", "PEP723_BLOCK", "RESOURCE_KEYS", "EnvironmentSpec", "SpecKind",
           "parse_spec"]
