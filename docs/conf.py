"""Sphinx configuration for the coordex docs (built strictly: -W --keep-going -n).

The reference pages the code holds are written at build time by ``_ext/coordex_docs.py``
into ``generated/`` (git-ignored) and included by the pages that present them.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent / "src"))

import coordex  # noqa: E402

project = "coordex"
author = "The coordex authors"
copyright = "2026, The coordex authors"
release = coordex.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "coordex_docs",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "generated", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_typehints = "none"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "undoc-members": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# protocol.md keeps its message sections at ### under # parts (a test reads them so).
suppress_warnings = ["myst.header"]
# Docstrings name internal modules and objects that are not part of the public API's
# pages; every other reference must resolve.
nitpick_ignore_regex = [
    ("py:(mod|meth|data|class)", r"(records|identity|call|PASSED_ENV|session_id /)"),
    ("py:class", r"(?s)coordex\.(library|hosting)\..*"),
]

html_theme = "furo"
html_title = f"coordex {release}"
html_static_path: list[str] = []
