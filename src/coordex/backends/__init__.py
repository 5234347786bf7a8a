"""Backends: one per place code runs. Each does I/O; none validates coordinates."""
