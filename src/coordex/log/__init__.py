"""The call log (SPEC section 11): every call recorded under ``root``, and rebuilding a
session from it. ``store`` is the SQLite file and the :class:`~coordex.log.store.RowWriter`
a row goes through, ``journal`` the file a finished call's row is in before the call
returns (moved into the SQLite file just after), ``calls`` turns results into rows and
answers ``history``, ``running`` holds the calls in flight for the page,
``rebuild`` the pure rules of what a rebuild replays, ``replay`` runs it, ``stats``
counts for ``coordex log --stats`` and ``show`` words what ``coordex log`` prints."""

from .store import LOG_FILE, CallLog

__all__ = ["LOG_FILE", "CallLog"]
