"""Run one cell of Python the way a notebook does, with the standard library only.

``run_cell`` compiles the code, executes it in a namespace, evaluates the last
top-level expression (IPython's rule: not when the cell ends with ``;``, and ``None``
is not shown), and returns a plain dict: ``result`` (a repr, shortened in the middle),
``error`` (exception type name, message and a traceback without this module's frames),
``interrupted`` (coordex's :class:`Interrupt` stopped it) and ``images`` (matplotlib figures
left open, as PNG). Output capture is the caller's job: it swaps ``sys.stdout``.

Used by the host (agent's own interpreter, and its fork for read-only) and by the
worker program inside environments, so both give the same semantics.
"""

from __future__ import annotations

import ast
import base64
import io
import linecache
import sys
import traceback
from itertools import compress, filterfalse, repeat
from operator import is_not

_THIS_FILE = __file__
_CELL_SOURCES = []  # type: list[str]  # filenames registered in linecache, oldest first (bounded)
_MAX_CELLS_IN_LINECACHE = 200
_counter = [0]


class Interrupt(KeyboardInterrupt):
    """What coordex raises into running code to stop it (a timeout or a cancel).

    A KeyboardInterrupt, so code that cleans up on Ctrl-C does so here too; a
    ``raise KeyboardInterrupt`` of the code's own is an ordinary error, not a timeout.
    """


def changed_names(before, after):
    """``(rebound, deleted)``: the names of ``after`` that are new or bound to another
    object than in ``before`` (a copy of the namespace from before the cell), and the
    names of ``before`` that ``after`` lost.

    Every name is compared on every call, so the loops run in C (``map``/``compress``
    over the values, no Python frame per name): a session of 10,000 names pays a few
    hundred microseconds a call for it, not a millisecond and more."""
    missing = _MISSING
    olds = map(before.get, after, repeat(missing))
    rebound = list(compress(after, map(is_not, olds, after.values())))
    if len(after) - len(rebound) == len(before):  # every old name is still there
        return rebound, []
    return rebound, list(filterfalse(after.__contains__, before))


_MISSING = object()


def shorten(text, limit):
    """Cut ``text`` in the middle to about ``limit`` characters."""
    if limit is None or len(text) <= limit:
        return text
    half = limit // 2
    dropped = len(text) - limit
    return text[:half] + "\n... [%d characters truncated] ...\n" % dropped + text[-(limit - half):]


def escape_text(text):
    """``text`` with lone surrogates written as backslash escapes (``\\udce9``).

    A file name with a byte that is not UTF-8 (``os.listdir`` gives ``'caf\\udce9'``), or
    a string built from one, cannot be encoded, and JSON or a UTF-8 pipe would fail on
    it. Every place escapes such text this way (the worker's streams use the same rule:
    ``errors="backslashreplace"``), so the same print reads the same everywhere.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def safe_repr(value, limit=None):
    """repr(value), never raising, shortened in the middle past ``limit``."""
    try:
        text = repr(value)
    except BaseException as exc:  # a broken __repr__ is the user's bug, not ours
        text = "<%s object; repr() raised %s>" % (type(value).__name__, type(exc).__name__)
    return shorten(escape_text(text), limit)


def _register_source(filename, code):
    lines = code.splitlines(True)
    linecache.cache[filename] = (len(code), None, lines, filename)
    _CELL_SOURCES.append(filename)
    while len(_CELL_SOURCES) > _MAX_CELLS_IN_LINECACHE:
        linecache.cache.pop(_CELL_SOURCES.pop(0), None)


def compile_cell(code, filename):
    """Return (body, last_expression) code objects; last_expression may be None.

    A cell compiled before (a stored function's code, a repeated cell) is not parsed
    again: its code objects are kept (a bounded table, keyed by the source) and given
    this call's ``filename``, so a traceback names this cell as ever.
    """
    kept = _COMPILED.get(code)
    if kept is not None:
        body, last = kept
        return _renamed(body, filename), (None if last is None else _renamed(last, filename))
    tree = ast.parse(code, filename, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr) and not code.rstrip().endswith(";"):
        expr = tree.body.pop()
        last = compile(ast.Expression(expr.value), filename, "eval")
    body = compile(tree, filename, "exec")
    if len(code) <= _MAX_KEPT_SOURCE:
        if len(_COMPILED) >= _MAX_KEPT_CELLS:
            _COMPILED.pop(next(iter(_COMPILED)))  # the oldest goes
        _COMPILED[code] = (body, last)
    return body, last


# Compiled cells by source, oldest first: parsing costs ~20 us a call even for ``x = 1``.
_COMPILED = {}  # type: dict[str, tuple]
_MAX_KEPT_CELLS = 256
_MAX_KEPT_SOURCE = 4096


def _renamed(code, filename):
    """``code`` (and the code objects it holds: functions, classes) as if compiled
    from ``filename``."""
    if code.co_filename == filename:
        return code
    consts = code.co_consts
    if any(type(c) is _CodeType for c in consts):
        consts = tuple(_renamed(c, filename) if type(c) is _CodeType else c for c in consts)
        return code.replace(co_filename=filename, co_consts=consts)
    return code.replace(co_filename=filename)


_CodeType = type(compile_cell.__code__)


def format_error(exc, limit=None):
    """The exception as the model should see it: our own frames removed."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == _THIS_FILE:
        tb = tb.tb_next
    try:
        lines = traceback.format_exception(type(exc), exc, tb)
        text = "".join(lines)
    except BaseException:
        text = "%s: %s\n" % (type(exc).__name__, safe_repr(exc, 500))
    try:
        message = str(exc)
    except BaseException:
        message = "<str() of the exception failed>"
    record = {
        "exception": type(exc).__name__,
        "message": shorten(escape_text(message), 2000),
        "traceback": shorten(escape_text(text), limit or 20000),
    }
    # An exception that already is a coordex error (coordex.CallError from a stored
    # function call) says so through these attributes; the host keeps its type.
    for attr in ("coordex_error_type", "coordex_error", "coordex_suggestion"):
        value = getattr(exc, attr, None)
        if isinstance(value, str):
            record[attr] = shorten(escape_text(value), 4000)
    return record


def collect_figures():
    """PNG of every matplotlib figure left open, then close them (never imports pyplot)."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return []
    images = []
    try:
        for num in plt.get_fignums():
            fig = plt.figure(num)
            buf = io.BytesIO()
            fig.savefig(buf, format="png")
            images.append({"mime": "image/png",
                           "data": base64.b64encode(buf.getvalue()).decode("ascii")})
        plt.close("all")
    except Exception:
        pass
    return images


def run_cell(code, namespace, result_limit=65536, filename=None):
    """Execute ``code`` in ``namespace``; never raises for anything the code does.

    Returns ``{"result", "error", "interrupted", "images"}``; ``error`` is None or the
    dict from :func:`format_error`.
    """
    if filename is None:
        _counter[0] += 1
        filename = "<cell-%d>" % _counter[0]
    outcome = {"result": None, "error": None, "interrupted": False, "images": []}
    try:
        try:
            body, last = compile_cell(code, filename)
        except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError) as exc:
            # ValueError: source with NUL bytes; RecursionError: absurdly nested input
            outcome["error"] = format_error(exc.with_traceback(None))
            return outcome
        _register_source(filename, code)
        exec(body, namespace)
        if last is not None:
            value = eval(last, namespace)
            if value is not None:
                namespace["_"] = value
                text = safe_repr(value)
                if result_limit is not None and len(text) > result_limit:
                    outcome["result_truncated"] = True
                    text = shorten(text, result_limit)
                outcome["result"] = text
    except KeyboardInterrupt as exc:
        outcome["interrupted"] = isinstance(exc, Interrupt)
        outcome["error"] = format_error(exc)
    except BaseException as exc:  # SystemExit included: it must never end the host/worker
        outcome["error"] = format_error(exc)
    finally:
        try:
            outcome["images"] = collect_figures()
        except BaseException:
            pass
    return outcome
