"""Literal texts a pattern's every match holds, to find its lines with str.find.

Python's regex engine tries an alternation or an unanchored pattern at every character
(7-16 ns a character on syzkaller's report lines, 0.7 us a line for the Linux stack
starts); str.find runs at memory speed. A line that holds none of a pattern's needles
cannot match it, so a pattern is tried only on the lines a needle is found in.
"""
from __future__ import annotations

import importlib
import re

# CPython's own regex parser: typeshed has no stubs for these private modules (typed Any).
_sre = importlib.import_module("re._constants")
_sre_parse = importlib.import_module("re._parser")

_CACHE: dict[tuple[str, int], tuple[str, ...] | None] = {}


def needles(pattern: re.Pattern) -> tuple[str, ...] | None:
    """Texts one of which every match of `pattern` holds (None: no such texts): the
    longest run of literal characters it requires, or one such run per alternative."""
    key = (pattern.pattern, pattern.flags)
    if key not in _CACHE:
        found = None
        if not pattern.flags & re.IGNORECASE:
            found = _sequence(list(_sre_parse.parse(pattern.pattern, pattern.flags)))
        _CACHE[key] = found
    return _CACHE[key]


def _sequence(items: list) -> tuple[str, ...] | None:
    best, run = "", ""
    for op, av in items:
        if op is _sre.LITERAL:
            run += chr(av)
            continue
        if (op is _sre.MAX_REPEAT or op is _sre.MIN_REPEAT) and av[0] >= 1 and len(av[2]) == 1 \
                and av[2][0][0] is _sre.LITERAL:
            run += chr(av[2][0][1]) * av[0]     # "={20,}": twenty "=" at least
            if av[0] == av[1]:
                continue
        elif op is _sre.BRANCH and not best and not run:
            alts = [_sequence(list(alt)) for alt in av[1]]
            found = [alt for alt in alts if alt is not None]
            if len(found) == len(alts):
                return tuple(n for alt in found for n in alt)
        best, run = max(best, run, key=len), ""
    best = max(best, run, key=len)
    return (best,) if best else None


def lines_holding(texts: tuple[str, ...], joined: str) -> list[int]:
    """Indices of the lines of `joined` (lines joined by newlines) that hold one of
    `texts` (none holding a newline), in order; linear in len(joined) for any texts."""
    hits = set()
    for text in texts:
        at = joined.find(text)
        while at >= 0:
            hits.add(at)
            nl = joined.find("\n", at)
            at = joined.find(text, nl + 1) if nl >= 0 else -1    # one hit a line is enough
    out: list[int] = []
    line = prev = 0
    for at in sorted(hits):
        line += joined.count("\n", prev, at)
        prev = at
        if not out or out[-1] != line:
            out.append(line)
    return out
