"""Python in a built environment: a worker process per session."""

from .place import EnvironmentPlace

__all__ = ["EnvironmentPlace"]
