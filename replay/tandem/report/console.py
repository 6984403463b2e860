"""Console lines with their byte offsets, and the prefixes consoles add to them.

The console is handled as bytes decoded as latin-1, so one character is one
byte and every offset is a byte offset into the raw console output.
"""
from __future__ import annotations

import re
from typing import NamedTuple

# printk: optional "<4>" level, "[   12.345678]" timestamp, optional caller
# "[  T123]" / "[    C0]" (CONFIG_PRINTK_CALLER); FreeBSD's msgbuf: "[19] ".
# A kernel line may follow a login prompt or a dropped-messages note on the same
# console line (syzkaller's consoleOutputRe).
# (Optional groups as "(?:X|)", the same as "(?:X)?" but cheaper in `re`: see scanner._ROW.)
_PRINTK = re.compile(r"^(?:<\d+>|)\[ *\d+\.\d+\](?:\[ *([CT]\d+)\]|) ?")
_PRINTK_AFTER = re.compile(r"^(?:\*\* \d+ printk messages dropped \*\* )?(?:.* login: )?"
                           r"(?:<\d+>)?\[ *\d+\.\d+\](?:\[ *([CT]\d+)\])? ?")
_BSD_UPTIME = re.compile(r"^\[\d+\] ")


class Line(NamedTuple):
    start: int      # offset of the line's first byte
    end: int        # offset just past the line's newline (or its last byte at EOF)
    text: str       # the line without its prefix, "\r" and "\n"
    ctx: str        # printk caller ("T123"/"C0"), "kernel" for other printk lines, "" if none


def decode(text: str | bytes) -> str:
    """Console text as one character per byte (see the module doc)."""
    if isinstance(text, str):
        text = text.encode("utf-8", "surrogateescape")
    return text.decode("latin-1")


def readable(text: str) -> str:
    """Undo decode() for display: latin-1 characters back to UTF-8 text."""
    return text.encode("latin-1").decode("utf-8", "replace")


# A Line without NamedTuple's Python-level __new__: make_line() runs once per console line
# inside a report, and NamedTuple's would take a third of the parser's per-line time.
_new_line = tuple.__new__


def make_line(raw: str, start: int, end: int) -> Line:
    text = raw.rstrip("\r\n")      # raw holds one "\n", at its end, if any
    if "\r" in text:
        text = text.replace("\r", "")
    # Both prefix patterns start with "<" or "[", but for the rare login/dropped-messages forms.
    m = _PRINTK.match(text) if text.startswith(("<", "[")) else None
    if not m and (" login: " in text or text.startswith("** ")):
        m = _PRINTK_AFTER.match(text)
    if m:
        return _new_line(Line, (start, end, text[m.end():], m.group(1) or "kernel"))
    m = _BSD_UPTIME.match(text) if text.startswith("[") else None
    if m:
        return _new_line(Line, (start, end, text[m.end():], "kernel"))
    return _new_line(Line, (start, end, text, ""))
