"""Where coordex keeps its data when no ``root`` is given: reads the environment, touches
no disk (so places, which may not import the Executor, can ask it too)."""

from __future__ import annotations

import os
from pathlib import Path


def default_root() -> Path:
    """``COORDEX_HOME`` if set, else the user data dir for "coordex"."""
    env = os.environ.get("COORDEX_HOME")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("coordex", appauthor=False))


__all__ = ["default_root"]
