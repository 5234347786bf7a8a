"""Tiny pure-Python wheels built on the fly with the standard library only.

Environment tests must run offline, so instead of a registry they install wheels made
here by ``file://`` URL. A wheel is a zip with the package's modules plus a
``*.dist-info`` holding METADATA, WHEEL, RECORD (sha256 of every file, urlsafe base64
without padding, as the wheel spec asks) and optionally entry_points.txt.

``ledgerlib`` comes in two versions whose interfaces differ, so a test can prove that
two environments with incompatible pins never meet:

- 1.0: ``total(xs)`` returns the sum;
- 2.0: ``total(xs, *, currency)`` returns ``"<sum> <currency>"``.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Mapping
from pathlib import Path

LEDGERLIB_SOURCES = {
    "1.0": (
        '"""ledgerlib 1.0: plain totals."""\n'
        "VERSION = '1.0'\n\n\n"
        "def total(xs):\n"
        "    return sum(xs)\n\n\n"
        "def main():\n"
        "    print('ledgerlib', VERSION)\n"
    ),
    "2.0": (
        '"""ledgerlib 2.0: totals carry a currency (keyword-only, breaking 1.0 callers)."""\n'
        "VERSION = '2.0'\n\n\n"
        "def total(xs, *, currency):\n"
        "    return f'{sum(xs)} {currency}'\n\n\n"
        "def main():\n"
        "    print('ledgerlib', VERSION)\n"
    ),
}


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def build_wheel(
    dest: Path,
    name: str,
    version: str,
    files: Mapping[str, str | bytes],
    *,
    requires: tuple[str, ...] = (),
    console_scripts: Mapping[str, str] | None = None,
) -> Path:
    """Write ``{name}-{version}-py3-none-any.whl`` into ``dest`` and return its path.

    Args:
        files: archive paths (``"ledgerlib/__init__.py"``) to their contents.
        requires: ``Requires-Dist`` lines (PEP 508 strings).
        console_scripts: script name -> ``"module:function"``.
    """
    dest.mkdir(parents=True, exist_ok=True)
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    contents: dict[str, bytes] = {
        path: data.encode() if isinstance(data, str) else data for path, data in files.items()
    }
    contents[f"{info}/METADATA"] = metadata.encode()
    contents[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: coordex-tests\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n"
    )
    if console_scripts:
        lines = "".join(f"{k} = {v}\n" for k, v in console_scripts.items())
        contents[f"{info}/entry_points.txt"] = f"[console_scripts]\n{lines}".encode()
    record = "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d in contents.items())
    record += f"{info}/RECORD,,\n"
    contents[f"{info}/RECORD"] = record.encode()
    path = dest / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for member, data in contents.items():
            archive.writestr(member, data)
    return path


def ledgerlib_wheel(dest: Path, version: str) -> Path:
    """ledgerlib ``version`` ("1.0" or "2.0"), with a ``ledger`` console script."""
    return build_wheel(
        dest, "ledgerlib", version, {"ledgerlib/__init__.py": LEDGERLIB_SOURCES[version]},
        console_scripts={"ledger": "ledgerlib:main"},
    )


def bulky_wheel(dest: Path, name: str = "bulkylib", modules: int = 400) -> Path:
    """A wheel with many files, so installing it takes long enough to interrupt."""
    files = {f"{name}/__init__.py": "VALUE = 1\n"}
    for i in range(modules):
        files[f"{name}/m{i:04d}.py"] = f"X = {i}\n" + "# padding\n" * 200
    return build_wheel(dest, name, "1.0", files)


def requirement(name: str, wheel: Path) -> str:
    """A PEP 508 line installing ``wheel`` by URL: ``name @ file:///…``."""
    return f"{name} @ {wheel.resolve().as_uri()}"
