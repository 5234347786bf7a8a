"""``root/coordex.toml``: the settings coordex reads from its data folder (SPEC 5).

MCP clients start servers with a handful of environment variables (HOME, PATH, USER,
...), so what a build needs from the user's shell - an index, a wheelhouse, proxies, a
certificate bundle, offline mode - may never arrive. The data folder is the one thing
every front end shares, so build settings can live there::

    [build.env]
    UV_INDEX_URL = "https://mirror.example/simple"
    SSL_CERT_FILE = "/etc/ssl/certs/corporate.pem"
    UV_OFFLINE = true

Each ``[build.env]`` entry is set in the environment of every process a build starts
(uv, and the build backends it runs), over what coordex itself was started with.

Pure: :func:`parse_settings` reads text; the caller reads the file.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import CoordexError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10
    import tomli as tomllib

SETTINGS_FILE = "coordex.toml"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_EXAMPLE = '[build.env]\nUV_INDEX_URL = "https://mirror.example/simple"'


@dataclass(frozen=True)
class Settings:
    """What ``coordex.toml`` says; empty when the file does not exist."""

    build_env: Mapping[str, str] = field(default_factory=dict)


def parse_settings(text: str, source: str = SETTINGS_FILE) -> Settings:
    """The settings in ``text`` (the contents of ``source``), or a ``validation`` error.

    Raises:
        CoordexError: ``validation`` naming ``source`` and the line for text that is not
            TOML, a key coordex does not read, or a value that is not a string, number
            or boolean.
    """
    try:
        data = tomllib.loads(text.replace("\r\n", "\n"))
    except tomllib.TOMLDecodeError as exc:
        raise CoordexError(
            "validation", f"{source} is not valid TOML: {exc}.",
            f"Quote text values, as in:\n{_EXAMPLE}\nthen run the call again.")
    _only(data, ("build",), source, "")
    build = data.get("build", {})
    if not isinstance(build, dict):
        raise _not_table(source, "build")
    _only(build, ("env",), source, "build.")
    env = build.get("env", {})
    if not isinstance(env, dict):
        raise _not_table(source, "build.env")
    return Settings({key: _env_value(source, key, value) for key, value in env.items()})


def _only(table: dict[str, Any], known: tuple[str, ...], source: str, prefix: str) -> None:
    unknown = [key for key in table if key not in known]
    if unknown:
        raise CoordexError(
            "validation", f"{source} has {prefix}{unknown[0]!r}, which coordex does not read.",
            f"Build settings go under [build.env], one environment variable per line:\n"
            f"{_EXAMPLE}")


def _not_table(source: str, name: str) -> CoordexError:
    return CoordexError("validation", f"{source}: {name} must be a table ([{name}]).",
                        f"Write the settings as:\n{_EXAMPLE}")


def _env_value(source: str, key: str, value: Any) -> str:
    if not _ENV_NAME.fullmatch(key):
        raise CoordexError(
            "validation", f"{source}: [build.env] key {key!r} is not an environment variable "
            "name.", "Use names of letters, digits and '_' such as UV_INDEX_URL.")
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise CoordexError(
        "validation", f"{source}: [build.env] {key} must be text, a number or true/false, "
        f"got {type(value).__name__} {value!r:.80}.",
        f'Write it as {key} = "value".')


__all__ = ["SETTINGS_FILE", "Settings", "parse_settings"]
