"""bash: a kept shell per session, a fresh shell per stateless call.

:mod:`.wire` is the text protocol a shell is driven with (pure, tested without bash),
:mod:`.process` one bash process and its pipes, :mod:`.session` the kept sessions and
the stateless place, :mod:`.copies` the protected read-only copy of a session made
ahead, :mod:`.launcher` the small server that starts those copies.
"""

from .session import ShellPlace, ShellSession, run_stateless

__all__ = ["ShellPlace", "ShellSession", "run_stateless"]
