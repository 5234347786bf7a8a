"""The environment every process a build starts runs with (SPEC 5).

Three layers, later ones winning: the environment coordex was started with, then
``[build.env]`` of ``root/coordex.toml`` (:mod:`coordex.core.settings`), so a desktop MCP
client that passes only HOME and PATH still builds with the user's index, proxies and
certificates. Last, unless either layer chose otherwise, uv is told to trust the
system's certificate store as well as its own bundled roots: a company proxy or mirror
whose authority is installed on the machine then works as it does for curl or pip.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from ..core.settings import SETTINGS_FILE, Settings, parse_settings

# Where the system certificate store is on Linux distributions (rustls-native-certs and
# OpenSSL look in these); macOS and Windows always have one.
_SYSTEM_STORES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                  "/etc/ssl/ca-bundle.pem", "/etc/ssl/cert.pem", "/etc/pki/tls/cacert.pem")
# The name uv reads: UV_SYSTEM_CERTS since 0.13 (UV_NATIVE_TLS before, now deprecated).
_CERT_SETTINGS = ("UV_SYSTEM_CERTS", "UV_NATIVE_TLS")


def settings_file(root: Path) -> Path:
    return root / SETTINGS_FILE


def read_settings(path: Path | None) -> Settings:
    """The settings in ``path``; empty when there is no such file.

    Raises:
        CoordexError: ``validation`` for a file coordex cannot read as meant.
    """
    if path is None:
        return Settings()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Settings()
    except (OSError, UnicodeDecodeError) as exc:
        from ..core.errors import CoordexError

        raise CoordexError("validation", f"Could not read {path}: {exc}.",
                           f"Make {path} a readable UTF-8 file, or remove it.")
    return parse_settings(text, str(path))


def build_environ(build_env: Mapping[str, str], uv_version: str,
                  base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for uv and its build backends: ``base`` (default: this
    process's), then ``build_env``, then system certificates trusted (see the module doc)."""
    env = dict(os.environ if base is None else base)
    env.update(build_env)
    if not any(name in env for name in _CERT_SETTINGS) and _system_store():
        env[_cert_setting(uv_version)] = "1"
    return env


def _cert_setting(uv_version: str) -> str:
    try:
        major, minor = (int(part) for part in uv_version.split()[1].split(".")[:2])
    except (IndexError, ValueError):
        return _CERT_SETTINGS[0]
    return _CERT_SETTINGS[0] if (major, minor) >= (0, 13) else _CERT_SETTINGS[1]


@functools.lru_cache(maxsize=1)
def _system_store() -> bool:
    # Without a store uv's system-certs mode has no roots at all: keep its bundled ones.
    if sys.platform in ("darwin", "win32"):
        return True
    return any(os.path.isfile(path) for path in _SYSTEM_STORES)


__all__ = ["build_environ", "read_settings", "settings_file"]
