"""No import circle among coordex's modules (docs/architecture.md: dependencies point one way).

Read with ``ast`` over src/coordex: the imports a module makes when it is imported — at
its top level, including under ``try`` / ``if`` — but not those under ``if TYPE_CHECKING``
(types only). A package's ``__init__`` counts as a module of its own. Among those there
is no circle at all. Counting the imports made inside functions too (made when called),
there is none either: ``KNOWN`` is empty, and none may appear.
"""

from __future__ import annotations

import ast
from pathlib import Path

import coordex

SRC = Path(coordex.__file__).parent


def _name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_package(name: str) -> bool:
    return (SRC.parent / name.replace(".", "/") / "__init__.py").exists()


def _top_level(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If):
            test = ast.unparse(node.test)
            if test not in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                found += _top_level(node.body)
            found += _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody,
                          *[h.body for h in node.handlers]):
                found += _top_level(block)
        elif isinstance(node, (ast.With,)):
            found += _top_level(node.body)
    return found


def _anywhere(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """Every import but those under ``if TYPE_CHECKING``, inside functions as well."""
    found: list[ast.Import | ast.ImportFrom] = []

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                for child in node.orelse:
                    self.visit(child)
            else:
                self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.append(node)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            found.append(node)

    Visitor().visit(ast.Module(body=body, type_ignores=[]))
    return found


def imports_of(path: Path, modules: set[str], *, in_functions: bool = False) -> set[str]:
    """The coordex modules ``path`` imports when it is imported (``in_functions``: or
    when one of its functions runs)."""
    name = _name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    read = _anywhere if in_functions else _top_level
    for node in read(ast.parse(path.read_text(encoding="utf-8")).body):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # "from pkg import mod" imports the module pkg.mod; "from mod import name", mod.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                       for a in node.names]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
                # importing a.b.c runs a/__init__ and a/b/__init__ first
                parent = target.rpartition(".")[0]
                while parent:
                    if parent in modules and parent != name and not name.startswith(parent + "."):
                        found.add(parent)
                    parent = parent.rpartition(".")[0]
    return found


def graph(*, in_functions: bool = False) -> dict[str, set[str]]:
    paths = {_name(p): p for p in SRC.rglob("*.py")}
    modules = set(paths)
    return {name: imports_of(path, modules, in_functions=in_functions)
            for name, path in paths.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of more than one module, as one cycle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [_cycle(edges, set(g)) for g in groups]


def groups(edges: dict[str, set[str]]) -> list[set[str]]:
    """The modules of each circle (a strongly connected group)."""
    found: list[set[str]] = []
    for cycle in circles(edges):
        reach = set(cycle)
        grown = True
        while grown:  # every module on some cycle through the first
            grown = False
            for v in edges:
                if v not in reach and edges[v] & reach and _reaches(edges, cycle[0], v):
                    reach.add(v)
                    grown = True
        found.append(reach)
    return found


def _reaches(edges: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, frontier = {start}, [start]
    while frontier:
        v = frontier.pop()
        if v == goal:
            return True
        for w in edges.get(v, ()):
            if w not in seen:
                seen.add(w)
                frontier.append(w)
    return False


def _cycle(edges: dict[str, set[str]], group: set[str]) -> list[str]:
    """One shortest path from the group's first module back to itself."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & group):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    return sorted(group)


def test_the_finder_finds_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_coordex_has_no_import_circle() -> None:
    found = circles(graph())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


# The circles through imports made inside functions (a lower module reaching up when
# called), each a set of modules: none left. Never add one.
KNOWN: list[set[str]] = []  # none left; keep it so


def test_no_new_circle_through_imports_made_when_called() -> None:
    new = [sorted(g) for g in groups(graph(in_functions=True))
           if not any(g <= known for known in KNOWN)]
    assert not new, "new import circles (imports inside functions counted):\n" + \
        "\n".join(" -> ".join(c) for c in new)
