"""Output capture stays bounded and keeps both ends."""

from __future__ import annotations

import json
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


# -- results that fit (SPEC 14) ------------------------------------------------------------

from coordex.core.results import RESULT_BUDGET, fit, json_bytes  # noqa: E402


def _record(**fields: object) -> dict[str, object]:
    base = {"stdout": "", "stderr": "", "truncated": False, "result": None, "exit_code": None,
            "images": [], "session": {"language": "python", "venv_id": None, "session_id": None,
                                      "session_name": None},
            "state_mode": "stateless", "duration_ms": 1.0}
    base.update(fields)
    return base


def test_a_result_that_fits_is_left_alone() -> None:
    record = _record(stdout="x" * 30_000, result="'y'")
    assert fit(record) == (record, [])


def test_three_big_fields_share_the_budget_and_each_keeps_head_and_tail() -> None:
    record = _record(stdout="o" * 60_000 + "END", stderr="e" * 60_000, result="'" + "v" * 60_000)
    fitted, cut = fit(record)
    assert cut == ["stdout", "stderr", "result"]
    assert json_bytes(fitted) <= RESULT_BUDGET and fitted["truncated"] is True
    assert fitted["stdout"].endswith("END") and "characters truncated" in fitted["stdout"]
    # Shared evenly: none of them was starved for the others.
    assert min(len(fitted[k]) for k in cut) > RESULT_BUDGET // 4


def test_a_small_field_keeps_all_and_leaves_its_share_to_the_others() -> None:
    fitted, cut = fit(_record(stdout="o" * 200_000, stderr="a warning\n"))
    assert cut == ["stdout"] and fitted["stderr"] == "a warning\n"
    assert RESULT_BUDGET - 4000 < json_bytes(fitted) <= RESULT_BUDGET


def test_the_value_is_cut_to_the_output_limit_first() -> None:
    fitted, cut = fit(_record(result="'" + "v" * 70_000 + "'"), value_limit=1000)
    assert cut == ["result"] and len(fitted["result"]) < 1100


def test_bytes_are_counted_as_the_wire_carries_them() -> None:
    # Three bytes a character in UTF-8, a lone surrogate as a seven-character escape.
    for text in ("€" * 60_000, "\udce9" * 30_000, "\x00" * 30_000):
        fitted, cut = fit(_record(stdout=text))
        assert cut == ["stdout"], text[:1]
        assert json_bytes(fitted) <= RESULT_BUDGET
        wire = json.dumps(fitted, ensure_ascii=False).encode("utf-8", "surrogatepass")
        assert len(wire) <= RESULT_BUDGET
