"""Output capture stays bounded and keeps both ends."""

from __future__ import annotations

import sys

from hypothesis import given
from hypothesis import strategies as st

from coordex.core.results import OutputBuffer, truncate_middle


def test_small_output_is_kept_whole() -> None:
    buf = OutputBuffer(100)
    buf.write("hello ")
    buf.write("world")
    assert buf.getvalue() == "hello world" and not buf.truncated


def test_huge_output_keeps_head_and_tail_in_bounded_memory() -> None:
    buf = OutputBuffer(1000)
    for i in range(100_000):
        buf.write(f"line {i}\n")
    text = buf.getvalue()
    assert buf.truncated
    assert text.startswith("line 0\nline 1\n")
    assert text.endswith("line 99999\n")
    assert len(text) < 1100
    assert sum(sys.getsizeof(c) for c in buf._tail) < 4000


@given(st.lists(st.text(max_size=300), max_size=60), st.integers(min_value=2, max_value=500))
def test_buffer_equals_the_middle_cut_of_everything_written(chunks: list[str], limit: int) -> None:
    buf = OutputBuffer(limit)
    for c in chunks:
        buf.write(c)
    whole = "".join(chunks)
    expected, cut = truncate_middle(whole, limit)
    assert buf.truncated == cut
    assert buf.getvalue() == expected
