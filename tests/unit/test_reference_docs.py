"""The docs' reference pages say what the code says, and no hand-written page copies it.

The tool reference, the error types, how a call ends, the command line and the
Executor's options are written at build time by ``docs/_ext/coordex_docs.py``; these
tests hold each page to the code it is made from, and keep figures and copied tables
out of the pages written by hand (jupyter_client's protocol doc drifted from its code;
ours are generated instead).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from coordex.cli import build_parser
from coordex.core import facts
from coordex.core.errors import ERROR_MEANINGS, ERROR_TYPES
from coordex.tools import FORMATS, TOOL_NAMES, tool_definitions

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import coordex_docs  # noqa: E402


def _sections(text: str, level: str = "##") -> dict[str, str]:
    parts = re.split(rf"^{level} (.+)$", text, flags=re.MULTILINE)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def test_every_tool_and_argument_is_in_the_tool_reference() -> None:
    sections = _sections(coordex_docs.tools_page())
    assert list(sections) == [f"`{name}`" for name in TOOL_NAMES]
    for tool in tool_definitions("mcp"):
        body = sections[f"`{tool['name']}`"]
        assert tool["description"] in body, tool["name"]
        for argument in tool["inputSchema"].get("properties", {}):
            assert f"| `{argument}` |" in body, f"{tool['name']}.{argument} undocumented"


def test_every_format_shows_every_tool_as_rendered() -> None:
    page = coordex_docs.tool_formats_page()
    formats = _sections(page)
    assert len(formats) == 2 * len(FORMATS) - 1  # strict or not; MCP has no strict mode
    for format in FORMATS:
        for strict in (False, True) if format != "mcp" else (False,):
            label = f"`format={format!r}, strict=True`" if strict else f"`format={format!r}`"
            blocks = re.findall(r"```json\n(.*?)\n```", formats[label], re.S)
            assert [json.loads(b) for b in blocks] == tool_definitions(format, strict=strict)


def test_every_error_type_has_its_meaning_and_a_real_case() -> None:
    assert set(ERROR_TYPES) <= set(ERROR_MEANINGS)
    page = coordex_docs.errors_page()
    for error_type in ERROR_TYPES:
        assert f"| `{error_type}` | {ERROR_MEANINGS[error_type]}" in page
    cases = _sections(page)
    assert set(cases) == {f"`{t}`" for t in ERROR_TYPES}
    for error_type in ERROR_TYPES:
        shown = json.loads(re.findall(r"```json\n(.*?)\n```", cases[f"`{error_type}`"], re.S)[0])
        assert shown["error_type"] == error_type and shown["suggestion"]


def test_how_a_call_ends_covers_every_event_in_every_mode() -> None:
    kinds = {type(event) for _, event in coordex_docs.EVENTS}
    assert kinds == set(facts.Event.__args__)  # type: ignore[attr-defined]
    page = coordex_docs.call_endings_page()
    sections = _sections(page)
    assert len(sections) == len(coordex_docs.EVENTS)
    for label, _event in coordex_docs.EVENTS:
        rows = [line for line in sections[f"`{label}`"].splitlines()
                if line.startswith("| `")]
        assert [row.split("|")[1].strip() for row in rows] == [
            f"`{mode}`" for mode in coordex_docs.MODES]


def test_a_stateless_call_never_reads_as_a_loss() -> None:
    page = coordex_docs.call_endings_page()
    for row in page.splitlines():
        if row.startswith("| `stateless` |"):
            assert row.split("|")[3].strip() == "false", row


def test_every_command_has_its_help_page() -> None:
    page = coordex_docs.cli_page()
    commands = {prog for prog, _ in coordex_docs._parsers(build_parser(), "coordex")}
    assert set(_sections(page)) == {f"`{prog}`" for prog in commands}
    assert {"`coordex mcp`", "`coordex serve`", "`coordex demo`"} <= set(_sections(page))


def test_the_executor_options_are_all_documented() -> None:
    import inspect

    from coordex import Executor

    page = coordex_docs.executor_options_page()
    for name in inspect.signature(Executor.__init__).parameters:
        if name != "self":
            assert re.search(rf"^\| `{name}` \| `.+` \| \S", page, re.M), name


def test_the_view_lists_what_the_jail_binds() -> None:
    from coordex.hosting import view

    page = coordex_docs.view_page()
    for item in (*view.SYSTEM_DIRS, *view.ETC_FILES, *view.DEVICE_NODES, *view.SYS_READ):
        assert f"`{item}`" in page, item


def test_the_generator_writes_every_page(tmp_path: Path) -> None:
    written = coordex_docs.write_all(tmp_path)
    assert {p.name for p in written} == set(coordex_docs.PAGES)
    included = {m for page in DOCS.glob("*.md")
                for m in re.findall(r"\{include\} generated/([\w.-]+)", page.read_text())}
    assert included == set(coordex_docs.PAGES), "a generated page no page includes, or back"


# --- the pages written by hand -------------------------------------------------------------

RUNNER_MARK = "Generated by `python benchmarks/run.py`"
# The performance page is written by benchmarks/run.py (tests/integration/
# test_performance_page.py holds it); every other page is written by hand.
HAND_WRITTEN = sorted(p for p in DOCS.glob("*.md") if p.name != "performance.md")


def test_the_performance_page_is_the_benchmark_runners() -> None:
    assert (DOCS / "performance.md").read_text().split("\n\n", 2)[1].startswith(RUNNER_MARK)
    run = coordex_docs._bench_runner()
    page = coordex_docs.benchmarks_page()
    for bench in run.BENCHES:
        assert f"| `{bench.script}.py" in page, bench.script
    for goal in run.GOALS:
        assert goal.goal() in page
# A measured figure: a time in ms or µs, a ratio, a size of memory measured.
MEASURED = re.compile(r"\b\d+(?:[.,]\d+)?(?:\u2013\d+(?:\.\d+)?)?\s?(?:ms|µs|us)\b"
                      r"|\d\u00d7|\bPSS\b")  # an en dash range; a multiplication sign


@pytest.mark.parametrize("page", [*HAND_WRITTEN, ROOT / "README.md"], ids=lambda p: p.name)
def test_no_hand_written_page_states_a_measured_figure(page: Path) -> None:
    text = page.read_text()
    # JSON keys and config names that merely end in _ms are not figures.
    found = [m.group(0) for m in MEASURED.finditer(text)
             if not text[max(0, m.start() - 1):m.start()].isalnum()]
    assert not found, f"{page.name} states measured figures {found[:5]}: generate them"


# The benchmarks page states goals (targets benchmarks/run.py holds), not measurements.
@pytest.mark.parametrize("name", sorted(set(coordex_docs.PAGES) - {"benchmarks.md"}))
def test_no_generated_page_states_a_measured_figure_either(name: str) -> None:
    # The generated pages quote docstrings and descriptions: a figure there is one too.
    found = MEASURED.findall(coordex_docs.PAGES[name]())
    assert not found, f"{name} quotes measured figures {found[:5]} from the code's words"


@pytest.mark.parametrize("page", HAND_WRITTEN, ids=lambda p: p.name)
def test_no_hand_written_page_copies_a_generated_table(page: Path) -> None:
    text = page.read_text()
    assert "| `validation` |" not in text, "the error types are generated (errors.md)"
    assert not re.search(r"^\| `(Ok|TimedOut|Died)", text, re.M), "events are generated"
    assert "nsswitch.conf" not in text, "the jail's view is generated (tenants.md)"


def test_every_page_is_in_the_toctree() -> None:
    index = (DOCS / "index.md").read_text()
    listed = set(re.findall(r"^([a-z][\w-]*)$", index, re.M))
    pages = {p.stem for p in DOCS.glob("*.md")} - {"index"}
    assert pages == listed, pages ^ listed


@pytest.mark.parametrize("name", ["long-work", "mcp-clients", "branches", "observability"])
def test_pages_other_parts_fill_have_their_place(name: str) -> None:
    assert (DOCS / f"{name}.md").read_text().startswith("# ")


def test_generated_pages_are_never_committed() -> None:
    ignored = (ROOT / ".gitignore").read_text().split()
    assert "docs/generated/" in ignored and "docs/_build/" in ignored
