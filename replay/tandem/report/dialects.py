"""Each OS's dialect: the report kinds its console may hold and the one search that says a
line starts none of them (built once per OS: parse() makes a Scanner per console)."""
from __future__ import annotations

import re
from types import SimpleNamespace

from .freebsd import FREEBSD
from .linux import LINUX
from .netbsd import NETBSD
from .openbsd import OPENBSD
from .userland import USERLAND
from .model import OSES

_DIALECTS: dict[str, SimpleNamespace] = {}


# Texts that many TOKENS hold ("BUG" is in "BUG:", "kernel BUG", "BUG kmalloc-"): searched
# for in their stead, a line holding a token still holds one of these, and the search
# tries fewer alternatives at each character (linux: 17 for 32, 2.5x as fast over noise).
_COVER = ("BUG", "panic", "fault", "error:", "ERROR: ", "SYZFA", "VFS: ")


# The characters most frequent in the lines of syzkaller's reports, most frequent first.
_COMMON = " 0f18ex2436ac\nd579_[]trs.onil:bp/+umk=RCTygh-vS?PIw,)(A"


def rare_tail(text: str) -> str:
    """The end of `text` (3 characters at least) that starts with its least frequent
    character: `re` tries an alternation's branches at each character that starts one, so
    "ult" in place of "fault" (a line holding one holds the other) makes the Scanner's
    search of report lines about 1.4x as fast (_bulk's: 20.5 -> 14.2 ms on the corpus);
    a line it stops at that holds the tail only goes through _line(), which finds nothing
    there."""
    if len(text) <= 3:
        return text
    rank = {c: i for i, c in enumerate(_COMMON)}
    at = max(range(len(text) - 2), key=lambda k: (rank.get(text[k], len(_COMMON)), -k))
    return text[at:]


def _fewer(tokens) -> list[str]:
    """Texts one of which every line holding one of `tokens` holds: the covers a token
    holds, and the tokens that hold no cover."""
    tokens = set(tokens)
    covers = {c for c in _COVER if any(c in t for t in tokens)}
    return sorted(covers | {t for t in tokens if not any(c in t for c in covers)})


def dialect(os: str) -> SimpleNamespace:
    """The report kinds recognized on one OS's console (built once per OS: parse() makes a
    Scanner per console)."""
    if os not in _DIALECTS:
        _DIALECTS[os] = _dialect(os)
    return _DIALECTS[os]


def _dialect(os: str) -> SimpleNamespace:
    tables = {"linux": [LINUX, USERLAND], "freebsd": [FREEBSD, USERLAND], "openbsd": [OPENBSD],
              "netbsd": [NETBSD], "userland": [USERLAND]}
    if os not in tables:
        raise ValueError(f"unknown OS {os!r}: expected one of {', '.join(OSES)}")

    # Every start pattern holds one of its table's tokens: one search of them all says
    # that a line starts no report (most lines), before each table's patterns in turn;
    # the Scanner searches raw console text for them (may_start) to pass over such lines.
    texts = _fewer(t for table in tables[os] for t in table.tokens)
    tokens = "|".join(re.escape(t) for t in texts)
    any_token = re.compile(tokens)

    def start(text: str):
        if not any_token.search(text):
            return None
        for table in tables[os]:
            kind = table.start(text)
            if kind:
                return kind
        return None
    # In raw console text a token may also be split by a "\r" that make_line() drops.
    # Searched for by rare_tail(): a line holding a tail but no token only goes through
    # _line(), which finds nothing there.
    tails = "|".join(re.escape(rare_tail(t)) for t in texts)
    return SimpleNamespace(start=start, may_start=re.compile(tails + r"|\r[^\r\n]"), texts=tuple(texts),
                           longest=max(2, *(len(t) for table in tables[os] for t in table.tokens)))
