"""Python in a built environment, behind the :class:`~..base.Place` protocol.

A worker process per session and a fork-server template for stateless calls
(:mod:`.workers`). The environment's interpreter (built on first use), its process
environment and the capability bridge come in as callables, so this module knows
nothing of the Executor.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...core import messages
from ...core.facts import Ran
from ...core.messages import PlaceKind
from ..base import CapabilityHost, ProgressCallback, RunRequest

if TYPE_CHECKING:
    from .workers import WorkerSession, WorkerTemplate


class EnvironmentPlace:
    """Python in one built environment: a worker per session, a template for stateless.

    A call whose worker (or fork) died is run once more (SPEC 6): ``retries``.

    ``python(on_progress)`` returns the environment's interpreter, building the
    environment on first use, its lines to the call's ``on_progress`` (a build is not
    counted against a call's timeout); ``env`` its process
    environment (``VIRTUAL_ENV`` and ``PATH`` set).
    """

    kind: PlaceKind = "worker"
    retries = True

    def __init__(self, python: Callable[[ProgressCallback | None], str | Path],
                 env: Callable[[], dict[str, str]],
                 capabilities: CapabilityHost) -> None:
        self._python = python
        self._env = env
        self._capabilities = capabilities
        self._lock = threading.Lock()
        self._template: Any = None
        self._closed = False

    def open_session(self, on_progress: ProgressCallback | None = None) -> WorkerSession:
        from .workers import WorkerSession

        return WorkerSession(self._python(on_progress), env=self._env(),
                             capabilities=self._capabilities)

    def run_stateless(self, request: RunRequest) -> Ran:
        ran: Ran = self._stateless_template(request.on_progress).run_stateless(request)
        return ran

    def _stateless_template(self, on_progress: ProgressCallback | None) -> WorkerTemplate:
        from .workers import WorkerTemplate

        with self._lock:
            if self._template is not None:
                return self._template
        python = self._python(on_progress)
        template = WorkerTemplate(python, env=self._env(), capabilities=self._capabilities)
        with self._lock:
            if self._template is None and not self._closed:
                self._template = template
                return template
            existing = self._template
        template.close()
        if existing is None:
            raise messages.executor_closed()
        return existing

    def capabilities_changed(self) -> None:
        """Workers ask for capability names on every call: nothing to do."""

    def close(self) -> None:
        with self._lock:
            self._closed = True
            template, self._template = self._template, None
        if template is not None:
            template.close()



__all__ = ["EnvironmentPlace"]
