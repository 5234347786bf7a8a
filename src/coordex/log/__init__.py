"""The call log (SPEC section 11): every call recorded under ``root``, and rebuilding a
session from it. ``store`` is the SQLite file, ``calls`` turns results into rows and
answers ``history``, ``rebuild`` holds the pure rules of what a rebuild replays,
``replay`` runs it, ``stats`` counts for ``coordex log --stats``."""

from .store import LOG_FILE, CallLog

__all__ = ["LOG_FILE", "CallLog"]
