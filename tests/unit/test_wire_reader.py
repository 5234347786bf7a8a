"""The worker's line reader on a non-blocking pipe: it tries a moment, then sleeps, and
still reads every line and the end, whenever they come."""

from __future__ import annotations

import os
import threading
import time

from coordex import protocol as wire


def _reader(spin: float) -> tuple[wire.LineReader, int]:
    r, w = os.pipe()
    os.set_blocking(r, False)
    return wire.LineReader(r, spin=spin), w


def test_a_line_that_comes_after_the_spin_is_read() -> None:
    reader, w = _reader(spin=0.001)
    try:
        writer = threading.Timer(0.2, lambda: os.write(w, b'{"a": 1}\n{"b"'))
        writer.start()
        assert reader.read_line() == b'{"a": 1}'  # slept in poll, woke on the line
        os.write(w, b": 2}\n")
        assert reader.read_line() == b'{"b": 2}'
        writer.join()
    finally:
        os.close(w)
        os.close(reader.fd)


def test_the_end_of_the_pipe_is_seen_after_the_spin() -> None:
    reader, w = _reader(spin=0.001)
    closer = threading.Timer(0.2, os.close, (w,))
    closer.start()
    try:
        started = time.monotonic()
        assert reader.read_line() is None
        assert time.monotonic() - started >= 0.15
    finally:
        closer.join()
        os.close(reader.fd)


def test_a_line_waiting_already_is_read_without_a_wait() -> None:
    reader, w = _reader(spin=60.0)  # a spin that never ends before the line is there
    try:
        os.write(w, b'{"a": 1}\n')
        assert reader.read_line() == b'{"a": 1}'
        os.close(w)
        assert reader.read_line() is None  # the end, not a minute of spinning
    finally:
        os.close(reader.fd)
