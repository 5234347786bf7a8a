"""Terminal query sequences taken out of command output (pure; no I/O).

A program that believes it talks to a terminal may ask that terminal something: where
the cursor is (DSR ``ESC [ 6 n``), what it is (DA ``ESC [ c``), its colours (OSC
``ESC ] 11 ; ? BEL``), a mode (DECRQM), a setting (DECRQSS), a capability (XTGETTCAP),
the clipboard (OSC 52 ``?``), its answerback (ENQ). A client that shows the output in a
real terminal would *answer*: the answer arrives as typed input the model never asked
for, and OSC 52 would hand over the user's clipboard. So these requests are removed
from bash output before anyone sees it, as OpenHands does; everything else - colours,
cursor movement, plain text - is kept exactly.

:class:`QueryFilter` works on decoded text as it streams: a sequence split across two
chunks is held back until it completes (at most :data:`MAX_HELD` characters).
"""

from __future__ import annotations

import re

# 7-bit and 8-bit (C1) introducers: CSI, OSC, DCS, and the string terminators.
_CSI = r"(?:\x1b\[|\x9b)"
_ST = r"(?:\x07|\x1b\\|\x9c)"
_CSI_QUERY = (
    _CSI + r"(?:"
    r"\??[0-9;]*n"  # DSR: status, cursor position (6n, ?6n), ?15n, ?26n...
    r"|[>=]?[0-9;]*c"  # DA1, DA2 (>c), DA3 (=c)
    r"|(?:1[1345689]|2[01])(?:;[0-9;]*)?t"  # window reports: position, size, title
    r"|\??[0-9;]*\$p"  # DECRQM: is mode N set?
    r"|>[0-9;]*q"  # XTVERSION
    r"|\?u"  # kitty keyboard flags
    r"|[01]?x"  # DECREQTPARM
    r"|\?[0-9;]*S"  # XTSMGRAPHICS
    r")"
)
_DCS_QUERY = r"(?:\x1bP|\x90)[$+]q[^\x07\x1b\x9c]*" + _ST  # DECRQSS, XTGETTCAP
# OSC whose fields include a lone "?": colour queries (4, 10-19), the clipboard (52)...
_OSC_QUERY = r"(?:\x1b\]|\x9d)[0-9]+(?:;[^;\x07\x1b\x9c]*)*;\?(?:;[^\x07\x1b\x9c]*)?" + _ST
_ENQ = r"\x05"
_QUERY = re.compile("|".join((_CSI_QUERY, _DCS_QUERY, _OSC_QUERY, _ENQ)))
_INTRODUCERS = re.compile(r"[\x05\x1b\x90\x9b\x9d]")
# A tail that may still become a query: a lone ESC, a CSI without its final byte, an
# OSC or DCS without its terminator.
_UNFINISHED = re.compile(
    r"(?:\x1b|" + _CSI + r"[0-?]*[ -/]*|(?:\x1b[\]P]|[\x9d\x90])[^\x07\x1b\x9c]*"
    r"|(?:\x1b[\]P]|[\x9d\x90])[^\x07\x1b\x9c]*\x1b)\Z")
MAX_HELD = 4096


def strip_queries(text: str) -> str:
    """``text`` without terminal query sequences (whole text, nothing held back)."""
    if _INTRODUCERS.search(text) is None:
        return text
    return _QUERY.sub("", text)


class QueryFilter:
    """Streams text through :func:`strip_queries`, holding back a split sequence."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held = ""

    def feed(self, text: str, final: bool = False) -> str:
        if self._held:
            text, self._held = self._held + text, ""
        elif _INTRODUCERS.search(text) is None:
            return text
        text = _QUERY.sub("", text)
        if not final:
            tail = _UNFINISHED.search(text[-MAX_HELD:])
            if tail is not None and tail.start() < tail.end():
                cut = len(text) - (tail.end() - tail.start())
                text, self._held = text[:cut], text[cut:]
        return text


__all__ = ["MAX_HELD", "QueryFilter", "strip_queries"]
