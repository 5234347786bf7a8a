"""bash: a kept shell per session, a fresh shell per stateless call.

:mod:`.wire` is the text protocol a shell is driven with (pure, tested without bash),
:mod:`.session` the shells themselves, :mod:`.launcher` the small server that starts
protected read-only copies of a session.
"""

from .session import ShellPlace, ShellSession, run_stateless

__all__ = ["ShellPlace", "ShellSession", "run_stateless"]
