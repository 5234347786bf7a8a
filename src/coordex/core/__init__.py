"""The pure core: coordinates, errors, the session registry, result shaping.

Nothing in this package starts a process or touches the disk; every function is
deterministic given its arguments (time is passed in, never read).
"""
