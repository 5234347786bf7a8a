"""The cell engine keeps compiled cells: a repeated cell must read exactly as a new one."""

from __future__ import annotations

import linecache

from coordex.core.bindings import bound_names
from coordex.worker import _coordex_engine as engine

CELL = ("def f(n):\n"
        "    class C:\n"
        "        def g(self):\n"
        "            return 1 / n\n"
        "    return C().g()\n"
        "f(0)\n")


def test_a_repeated_cell_names_its_own_cell_in_the_traceback() -> None:
    tracebacks = []
    for _ in range(3):
        ns: dict[str, object] = {}
        out = engine.run_cell(CELL, ns, filename=None)
        error = out["error"]
        assert error is not None and error["exception"] == "ZeroDivisionError"
        tracebacks.append(error["traceback"])
        # Every code object of this run (functions, nested classes) is this cell's.
        f = ns["f"]
        filename = f.__code__.co_filename  # type: ignore[attr-defined]
        assert filename in tracebacks[-1]
        assert linecache.getline(filename, 4).strip() == "return 1 / n"
        nested = [c for c in f.__code__.co_consts if hasattr(c, "co_filename")]  # type: ignore[attr-defined]
        assert nested and all(c.co_filename == filename for c in nested)
    names = [t.split('File "')[1].split('"')[0] for t in tracebacks]
    assert len(set(names)) == 3  # each run is its own cell, as before


def test_a_repeated_cell_gives_the_same_result_and_last_expression() -> None:
    ns: dict[str, object] = {}
    first = engine.run_cell("x = 41\nx + 1", ns)
    second = engine.run_cell("x = 41\nx + 1", ns)
    assert first["result"] == second["result"] == "42"
    assert engine.run_cell("x + 1;", ns)["result"] is None
    assert engine.run_cell("x + 1;", ns)["result"] is None


def test_kept_cells_are_bounded() -> None:
    for i in range(engine._MAX_KEPT_CELLS + 50):
        engine.compile_cell(f"y = {i}", "<t>")
    assert len(engine._COMPILED) <= engine._MAX_KEPT_CELLS
    big = "z = 1\n" * (engine._MAX_KEPT_SOURCE // 6 + 10)
    engine.compile_cell(big, "<t>")
    assert big not in engine._COMPILED


def test_bound_names_of_a_repeated_cell_are_a_fresh_list() -> None:
    first = bound_names("a, b = 1, 2\nimport os.path")
    first.append("mutated")
    assert bound_names("a, b = 1, 2\nimport os.path") == ["a", "b", "os"]
    long_cell = "q = 1\n" * 1000
    assert bound_names(long_cell) == ["q"]


def test_changed_names_are_the_rebound_and_the_deleted_by_identity() -> None:
    """What a stateful call reports it changed (the log's ``changed``, the names'
    ``bound_at_call``): new names and names bound to another object, in the namespace's
    order, then the names it lost; an equal but other object is a rebinding."""
    import random

    def plain(before: dict[str, object], after: dict[str, object]) -> tuple[list[str], list[str]]:
        return ([k for k, v in after.items() if k not in before or before[k] is not v],
                [k for k in before if k not in after])

    rng = random.Random(7)
    for _ in range(2000):
        objects = [object(), 1, "a", [], None]
        before = {f"k{i}": rng.choice(objects) for i in range(rng.randint(0, 30))}
        after = dict(before)
        for _ in range(rng.randint(0, 6)):
            key, roll = f"k{rng.randint(0, 40)}", rng.random()
            if roll < 0.4:
                after[key] = rng.choice(objects)
            elif roll < 0.7:
                after.pop(key, None)
            else:
                after[key] = after.get(key, objects[0])
        assert engine.changed_names(before, after) == plain(before, after), (before, after)
    assert engine.changed_names({"x": [1]}, {"x": [1]}) == (["x"], [])
    assert engine.changed_names({"x": 1, "y": 2}, {"y": 2, "z": 3}) == (["z"], ["x"])
