"""Python in the agent's own interpreter: namespaces in this process."""

from .place import OwnPlace, OwnSession

__all__ = ["OwnPlace", "OwnSession"]
