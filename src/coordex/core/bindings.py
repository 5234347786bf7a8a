"""Which names a Python cell binds for certain, read from its code (pure).

Places report the names a stateful call rebound by comparing the namespace's objects
before and after, by identity; that misses a name bound again to the very same object
(``x = 41`` twice: small ints are cached), so the name would look stale although the
code just set it. The statements at the top level of the cell that bind a name whenever
the cell completes - assignments, imports, ``def`` and ``class`` - are read here and
counted as rebound when the call succeeded. Bindings inside ``if``/``for``/``try`` may
not have run, so they are left to the identity comparison.
"""

from __future__ import annotations

import ast
import functools

_TARGETS = (ast.Assign, ast.AugAssign, ast.AnnAssign)
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def bound_names(code: str) -> list[str]:
    """Names the top level of ``code`` binds whenever it runs to the end; [] if it does
    not parse (the place reports the syntax error)."""
    if len(code) > 4096:  # kept only for short cells
        return list(_bound_names.__wrapped__(code))
    return list(_bound_names(code))


@functools.lru_cache(maxsize=256)  # a repeated cell (a stored function's) is not parsed again
def _bound_names(code: str) -> tuple[str, ...]:
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return ()
    names: list[str] = []
    for statement in tree.body:
        if isinstance(statement, _TARGETS):
            if isinstance(statement, ast.AnnAssign) and statement.value is None:
                continue  # a bare annotation binds nothing
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for target in targets:
                names.extend(_names_in(target))
        elif isinstance(statement, (ast.Import, ast.ImportFrom)):
            names.extend((alias.asname or alias.name).split(".")[0] for alias in statement.names
                         if alias.name != "*")
        elif isinstance(statement, _DEFINITIONS):
            names.append(statement.name)
    return tuple(dict.fromkeys(names))


def _names_in(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for item in target.elts for name in _names_in(item)]
    if isinstance(target, ast.Starred):
        return _names_in(target.value)
    return []  # x.attr = ..., x[i] = ...: no name is bound


__all__ = ["bound_names"]
