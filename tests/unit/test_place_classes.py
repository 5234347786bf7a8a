"""No code outside ``backends/`` asks which place a session or place is.

A feature reaches a place through the protocols of ``backends/base.py`` (``Session``,
``Place``, and the capabilities ``Kept``, ``Forkable``, ``Checkpointable``,
``RunsNested``): ``isinstance(session, Kept)``, never ``isinstance(session, OwnSession)``.
So a new place is one sub-package of ``backends/`` and one branch where places are made,
and every feature that asks for a capability finds it there.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "coordex"
BACKENDS = SRC / "backends"


def place_classes() -> set[str]:
    """Every class defined in a place's package (``backends/<place>/``)."""
    names: set[str] = set()
    for path in BACKENDS.glob("*/*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                names.add(node.name)
    return names


def _named(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Tuple):
        return [name for item in node.elts for name in _named(item)]
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    return []


def asked(source: str, classes: set[str]) -> list[tuple[int, str]]:
    """``(line, class)`` for each ``isinstance``/``issubclass``/``type(x) is`` on one of
    ``classes`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("isinstance", "issubclass") and len(node.args) == 2:
            found += [(node.lineno, name) for name in _named(node.args[1]) if name in classes]
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Call) and \
                isinstance(node.left.func, ast.Name) and node.left.func.id == "type":
            found += [(node.lineno, name) for other in node.comparators
                      for name in _named(other) if name in classes]
    return found


def test_the_finder_sees_each_way_of_asking() -> None:
    classes = {"OwnSession", "ShellSession"}
    code = ("isinstance(s, OwnSession)\nisinstance(s, (int, own.ShellSession))\n"
            "type(s) is OwnSession\nisinstance(s, Kept)\n")
    assert asked(code, classes) == [(1, "OwnSession"), (2, "ShellSession"), (3, "OwnSession")]


def test_the_places_classes_are_found() -> None:
    assert {"OwnSession", "WorkerSession", "ShellSession", "RaySession", "OwnPlace",
            "EnvironmentPlace", "ShellPlace", "RayPlace"} <= place_classes()


def test_no_isinstance_on_a_place_class_outside_backends() -> None:
    classes = place_classes()
    found = [f"{path.relative_to(SRC)}:{line}: {name}"
             for path in sorted(SRC.rglob("*.py")) if BACKENDS not in path.parents
             for line, name in asked(path.read_text(encoding="utf-8"), classes)]
    assert not found, ("isinstance on a place's class outside backends/ (ask for a "
                       "protocol of backends/base.py instead):\n" + "\n".join(found))
