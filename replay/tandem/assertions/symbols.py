"""Kernel symbol tables for checking that an assertion names real, instrumentable functions."""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path

from ..errors import TandemError

TEXT_TYPES = frozenset("tTW")   # code symbols; data, absolute and weak-undefined ones cannot be called


def load_symbols(path: str | os.PathLike) -> dict[str, int]:
    """Text symbols of a System.map (or `nm` output of a module): name -> address.

    A line holding a single word is a bare name (address 0): hand-written lists, such
    as a module's or another OS's function names, use that form. The first address
    wins for names defined twice (static functions of the same name in two files).
    """
    out: dict[str, int] = {}
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        raise TandemError(f"{path}: cannot read symbol table: {e.strerror}") from None
    for line in text.splitlines():
        f = line.split()
        if len(f) == 1 and not line.startswith("#"):
            out.setdefault(f[0], 0)
        elif len(f) >= 3 and f[1] in TEXT_TYPES:
            try:
                out.setdefault(f[2], int(f[0], 16))
            except ValueError:
                continue
    return out


SymbolSource = str | os.PathLike[str] | AbstractSet[str] | Mapping[str, object] | Iterable["SymbolSource"]


def symbol_names(source: SymbolSource | None) -> frozenset[str] | None:
    """The union of the names in source: a path to a symbol table, a set or mapping of
    names, or a list/tuple of those (e.g. System.map plus a module's symbol list).
    None means "do not check symbols"."""
    if source is None:
        return None
    if isinstance(source, (str, os.PathLike)):
        return frozenset(load_symbols(source))
    if isinstance(source, (AbstractSet, Mapping)):
        return frozenset(source)
    names: set[str] = set()
    for s in source:
        names |= symbol_names(s) or frozenset()
    return frozenset(names)
