"""Terminal query sequences are taken out of output; everything else stays (pure)."""

from __future__ import annotations

import pytest

from coordex.core.terminal import QueryFilter, strip_queries

QUERIES = [
    "\x1b[6n", "\x1b[?6n", "\x1b[5n", "\x1b[c", "\x1b[0c", "\x1b[>c", "\x1b[>0c", "\x1b[=c",
    "\x1b]11;?\x07", "\x1b]10;?\x1b\\", "\x1b]4;1;?\x07", "\x1b]52;c;?\x07", "\x1b[14t",
    "\x1b[18t", "\x1b[21t", "\x1b[?2004$p", "\x1b[4$p", "\x1bP$qm\x1b\\", "\x1bP+q544e\x1b\\",
    "\x1b[>q", "\x1b[>0q", "\x1b[?u", "\x05", "\x9b6n", "\x9d11;?\x9c",
]
KEPT = ["\x1b[31mred\x1b[0m", "\x1b[2J\x1b[H", "\x1b]0;title\x07", "\x1b[?25l", "\x1b[8;24;80t",
        "plain ? text; 6n c", "\x1b]8;;https://x.org\x1b\\link\x1b]8;;\x1b\\"]


@pytest.mark.parametrize("query", QUERIES)
def test_queries_are_removed(query: str) -> None:
    assert strip_queries(f"a{query}b") == "ab"


@pytest.mark.parametrize("text", KEPT)
def test_other_sequences_are_kept(text: str) -> None:
    assert strip_queries(text) == text


@pytest.mark.parametrize("query", QUERIES)
def test_a_query_split_across_chunks_is_removed(query: str) -> None:
    text = f"one{query}two\x1b[1mbold"
    for cut in range(len(text) + 1):
        f = QueryFilter()
        assert f.feed(text[:cut]) + f.feed(text[cut:]) + f.feed("", final=True) == \
            "onetwo\x1b[1mbold", cut


def test_an_unfinished_sequence_is_released_at_the_end() -> None:
    f = QueryFilter()
    assert f.feed("x\x1b]0;never ends") == "x"
    assert f.feed("", final=True) == "\x1b]0;never ends"
