"""Import every top-level module of the named distributions; report what failed.

Run by the environment builder in a freshly built environment, before it is kept:

    python -I _coordex_import_check.py NAME [NAME ...]

A distribution's top-level modules come from its ``top_level.txt`` where it has one
(setuptools writes it), else from the first component of each file in its RECORD. A
name that is not installed (a marker excluded it) is skipped. The last line of stdout is
``MARKER`` followed by JSON: ``{"checked": [[dist, module]...], "failed": [{"dist",
"module", "error", "traceback"}...]}``; whatever the imports print comes before it.

Standard library only, CPython >= 3.8: it runs in the environment's own interpreter.
"""

import json
import re
import sys
import traceback

try:
    import importlib.metadata as metadata
except ImportError:  # pragma: no cover - Python < 3.8 is not supported by coordex
    metadata = None  # type: ignore[assignment]

MARKER = "::coordex-import-check::"
_NATIVE = (".so", ".pyd")


def top_level_modules(dist):
    text = dist.read_text("top_level.txt")
    if text:
        names = [line.strip().replace("/", ".") for line in text.splitlines()]
    else:
        names = []
        for path in dist.files or ():
            parts = path.parts
            first = parts[0]
            if first in ("..", "__pycache__") or first.endswith((".dist-info", ".data",
                                                                 ".egg-info")):
                continue
            if len(parts) == 1:
                if first.endswith(".py"):
                    names.append(first[:-3])
                elif first.endswith(_NATIVE):
                    names.append(first.split(".")[0])
            else:
                names.append(first)
    seen = []
    for name in names:
        if name and name.isidentifier() and not name.startswith("_") and name not in seen:
            seen.append(name)
    return seen


def _normal(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def installed():
    """Installed distributions by normalised name (3.8 and 3.9 do not normalise lookups)."""
    found = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(_normal(name), dist)
    return found


def main(names):
    checked, failed = [], []
    dists = installed()
    for name in names:
        dist = dists.get(_normal(name))
        if dist is None:  # a marker excluded it
            continue
        for module in top_level_modules(dist):
            checked.append([name, module])
            try:
                __import__(module)
            except BaseException as exc:  # SystemExit at import is a failure too
                failed.append({
                    "dist": name, "module": module,
                    "error": "{}: {}".format(type(exc).__name__, exc),
                    "traceback": "".join(traceback.format_exception(
                        type(exc), exc, exc.__traceback__))[-4000:],
                })
    sys.stdout.flush()
    sys.stdout.write("\n" + MARKER + json.dumps({"checked": checked, "failed": failed}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
