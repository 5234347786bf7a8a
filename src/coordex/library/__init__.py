"""Stored functions: source and environment spec held as data under ``root``.

``functions.py`` is the library (``ex.functions``) and how calls are made; ``store.py``
the SQLite table; ``errors.py`` the :class:`CallError` a failed call raises;
``_codec.py`` the plain-value rules shared with the processes that run the functions.
"""

from .errors import CallError

__all__ = ["CallError"]
