"""The assertion language: a small text format close to TESLA's (docs/assertions.md).

    # VFS: the DAC check passed for the path that vfs_open opens
    assert "open-checked" per-thread conditional at vfs_open(path, _):
        within(do_sys_openat2, previously(returnfrom(may_open(_, path, _, _)) == 0))

parse_text/parse_file give an AssertionSet; every error is an AssertionLangError whose
message is one line, `FILE:LINE:COL: message`.
"""
from __future__ import annotations

import difflib
import itertools
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..errors import TandemError
from .model import MODES, SCOPES, SITE_STEP, Assertion, EventSpec, Pat, Site, Step
from .symbols import SymbolSource, load_symbols, symbol_names

__all__ = ["AssertionLangError", "AssertionSet", "load_symbols", "parse_file", "parse_text"]

MAX_ARGS = 6            # the event source reports rdi, rsi, rdx, rcx, r8, r9
MAX_BRANCHES = 64       # OR distribution is a product; keep automata countable
# An assertion file is input from outside. The parser recurses once per nested
# (...), sequence/previously/eventually(...) or optional(...): 500 nested parentheses
# would raise RecursionError. The shipped assertions nest 4 deep.
MAX_NESTING = 32
MAX_EVENTS = 256        # per automaton; the shipped assertions have at most 6
# Literals are compared with 64-bit registers: a signed or an unsigned 64-bit value.
# Longer digit strings are refused before int() (which raises ValueError past 4,300 digits).
LIT_MIN, LIT_MAX = -(1 << 63), (1 << 64) - 1


class AssertionLangError(TandemError):
    """A malformed assertion file; the message is `FILE:LINE:COL: message`."""

    def __init__(self, file: str, line: int, col: int, msg: str):
        self.file, self.line, self.col, self.msg = file, line, col, msg
        super().__init__(f"{file}:{line}:{col}: {msg}")


# --- lexer ----------------------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r]+) | (?P<nl>\n) | (?P<comment>\#[^\n]*)
  | (?P<str>"[^"\n]*") | (?P<badstr>"[^"\n]*)
  | (?P<int>0[xX][0-9a-fA-F]+|[0-9]+)
  | (?P<id>[A-Za-z_][A-Za-z0-9_.]*(?:-[A-Za-z][A-Za-z0-9_.]*)*)
  | (?P<op>==|\|\||[(),:+\-])
""", re.VERBOSE)


@dataclass(frozen=True)
class Tok:
    kind: str       # "str" | "int" | "id" | an operator | "eof"
    text: str
    line: int
    col: int


def _tokens(text: str, file: str) -> list[Tok]:
    out, pos, line, start = [], 0, 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        col = pos - start + 1
        if m is None:
            raise AssertionLangError(file, line, col, f"syntax error: unexpected character {text[pos]!r}")
        kind = m.lastgroup
        if kind == "badstr":
            raise AssertionLangError(file, line, col, "syntax error: unterminated string")
        if kind == "nl":
            line, start = line + 1, m.end()
        elif kind in ("str", "int", "id"):
            out.append(Tok(kind, m.group(), line, col))
        elif kind == "op":
            out.append(Tok(m.group(), m.group(), line, col))
        pos = m.end()
    out.append(Tok("eof", "end of file", line, pos - start + 1))
    return out


class Positioned(Protocol):
    """What an error can point at: a token, a node, a pattern, an event, a site."""
    @property
    def line(self) -> int: ...
    @property
    def col(self) -> int: ...


# --- syntax tree (before OR distribution) -------------------------------------------

@dataclass
class _Node:
    kind: str           # "ev" | "site" | "seq" | "opt" | "or"
    line: int
    col: int
    spec: EventSpec | None = None   # "ev" only
    items: list[_Node] = field(default_factory=list)   # what a "seq", "opt" or "or" holds

    @property
    def event(self) -> EventSpec:
        """An "ev" node's event."""
        if self.spec is None:
            raise TypeError(f"a {self.kind!r} node has no event")
        return self.spec


SEQ_WORDS = {"sequence": "seq", "previously": "prev", "eventually": "next"}


class _Parser:
    def __init__(self, text: str, file: str, symbols: frozenset[str] | None):
        self.toks, self.i, self.file, self.symbols = _tokens(text, file), 0, file, symbols
        self.depth = 0      # nesting of term() inside term(), at most MAX_NESTING

    # token helpers
    @property
    def tok(self) -> Tok:
        return self.toks[self.i]

    def err(self, tok_or_pos: Positioned, msg: str) -> AssertionLangError:
        return AssertionLangError(self.file, tok_or_pos.line, tok_or_pos.col, msg)

    def take(self, kind: str, what: str | None = None) -> Tok:
        t = self.tok
        if t.kind != kind:
            raise self.err(t, f"syntax error: expected {what or repr(kind)}, found {self._show(t)}")
        self.i += 1
        return t

    def word(self, text: str) -> Tok:
        t = self.tok
        if t.kind != "id" or t.text != text:
            raise self.err(t, f"syntax error: expected '{text}', found {self._show(t)}")
        self.i += 1
        return t

    def accept(self, kind: str) -> Tok | None:
        if self.tok.kind == kind:
            self.i += 1
            return self.toks[self.i - 1]
        return None

    @staticmethod
    def _show(t: Tok) -> str:
        return "end of file" if t.kind == "eof" else repr(t.text)

    def symbol(self) -> Tok:
        t = self.take("id", "a function name")
        if self.symbols is not None and t.text not in self.symbols:
            near = [s for s in self.symbols if s[:3] == t.text[:3]]
            hint = difflib.get_close_matches(t.text, near, 1, 0.8)
            raise self.err(t, f"unknown symbol '{t.text}': not a function of this kernel"
                           + (f" (did you mean '{hint[0]}'?)" if hint else ""))
        return t

    def integer(self) -> int:
        neg = self.accept("-")
        t = self.take("int", "an integer")
        hexa = t.text[:2] in ("0x", "0X")
        digits = (t.text[2:] if hexa else t.text).lstrip("0")
        if len(digits) > (16 if hexa else 20):     # 2**64 has 20 decimal digits
            raise self.err(t, f"integer out of range: {len(digits)} digits (64-bit values only)")
        v = int(digits or "0", 16 if hexa else 10)
        v = -v if neg else v
        if not LIT_MIN <= v <= LIT_MAX:
            raise self.err(t, "integer out of range (64-bit values only)")
        return v

    # grammar
    def file_(self) -> list[Assertion]:
        out: list[Assertion] = []
        names: dict[str, int] = {}     # assertion -> the line it is defined at
        while self.tok.kind != "eof":
            a = self.assertion()
            if a.name in names:
                raise AssertionLangError(self.file, a.line, a.col,
                                         f"assertion \"{a.name}\" is defined twice (first at line {names[a.name]})")
            names[a.name] = a.line
            out.append(a)
        return out

    def assertion(self) -> Assertion:
        kw = self.word("assert")
        name_tok = self.take("str", "an assertion name in double quotes")
        name = name_tok.text[1:-1]
        if not name:
            raise self.err(name_tok, "an assertion name cannot be empty")
        scope = mode = None
        while self.tok.kind == "id" and self.tok.text != "at":
            t = self.take("id")
            if t.text in SCOPES:
                if scope is not None:
                    raise self.err(t, f"conflicting scopes '{scope}' and '{t.text}'")
                scope = t.text
            elif t.text in MODES:
                if mode is not None:
                    raise self.err(t, f"conflicting modes '{mode}' and '{t.text}'")
                mode = t.text
            else:
                raise self.err(t, f"unknown mode '{t.text}' (expected one of {', '.join(SCOPES + MODES)})")
        self.word("at")
        site = self.site()
        self.take(":", "':' after the assertion site")
        self.word("within")
        self.take("(", "'('")
        bound = self.symbol()
        self.take(",", "',' after the bounding function")
        tree = self.expr()
        self.take(")", "')' closing within(")
        branches = self._branches(tree, site, bound)
        return Assertion(name, scope or "per-thread", mode or "conditional", bound.text, site,
                         branches, kw.line, kw.col, self.file)

    def site(self) -> Site:
        t = self.symbol()
        offset = self.integer() if self.accept("+") else None
        if offset is not None and offset < 0:
            raise self.err(t, "a site offset cannot be negative")
        args = self.arglist(t) if self.tok.kind == "(" else ()
        return Site(t.text, offset, args, t.line, t.col)

    def arglist(self, fn: Tok) -> tuple[Pat, ...]:
        self.take("(", "'('")
        args: list[Pat] = []
        if not self.accept(")"):
            args.append(self.pattern())
            while self.accept(","):
                args.append(self.pattern())
            self.take(")", "')' or ','")
        if len(args) > MAX_ARGS:
            raise self.err(args[MAX_ARGS], f"only the first {MAX_ARGS} arguments of {fn.text} are visible")
        return tuple(args)

    def pattern(self) -> Pat:
        t = self.tok
        if t.kind in ("int", "-"):
            return Pat("lit", self.integer(), t.line, t.col)
        self.take("id", "'_', an integer or a variable")
        if t.text == "_":
            return Pat("any", None, t.line, t.col)
        if t.text in ("site", "call", "returnfrom") or t.text in SEQ_WORDS:
            raise self.err(t, f"'{t.text}' cannot be a variable name")
        return Pat("var", t.text, t.line, t.col)

    def expr(self) -> _Node:
        first = self.term()
        if self.tok.kind != "||":
            return first
        items = [first]
        while self.accept("||"):
            items.append(self.term())
        return _Node("or", first.line, first.col, items=items)

    def term(self) -> _Node:
        if self.depth >= MAX_NESTING:
            raise self.err(self.tok, f"expression nested too deeply (at most {MAX_NESTING} levels)")
        self.depth += 1
        try:
            return self._term()
        finally:
            self.depth -= 1

    def _term(self) -> _Node:
        t = self.tok
        if self.accept("("):
            e = self.expr()
            self.take(")", "')'")
            return e
        if t.kind != "id":
            raise self.err(t, f"syntax error: expected an event, found {self._show(t)}")
        w = t.text
        if w == "site":
            self.i += 1
            return _Node("site", t.line, t.col)
        if w in SEQ_WORDS:
            self.i += 1
            self.take("(", "'('")
            items = [self.expr()]
            while self.accept(","):
                items.append(self.expr())
            self.take(")", "')' or ','")
            here = _Node("site", t.line, t.col)
            items = {"seq": items, "prev": items + [here], "next": [here] + items}[SEQ_WORDS[w]]
            return _Node("seq", t.line, t.col, items=items)
        if w == "optional":
            self.i += 1
            self.take("(", "'('")
            e = self.expr()
            self.take(")", "')'")
            if e.kind == "site":
                raise self.err(e, "the assertion site cannot be optional")
            return _Node("opt", t.line, t.col, items=[e])
        if w in ("call", "returnfrom"):
            self.i += 1
            self.take("(", "'('")
            fn = self.symbol()
            args = self.arglist(fn) if self.tok.kind == "(" else ()
            self.take(")", "')'")
            ret = None
            if self.tok.kind == "==":
                eq = self.take("==")
                if w == "call":
                    raise self.err(eq, "a call has no return value: use returnfrom(...) == value")
                ret = self.pattern()
                ret = None if ret.kind == "any" else ret    # == _ says nothing
            kind = "call" if w == "call" else "return"
            return _Node("ev", t.line, t.col, spec=EventSpec(kind, fn.text, args, ret, t.line, t.col))
        if w == "within":
            raise self.err(t, "within(...) can only be the outermost expression of an assertion")
        # TESLA shorthand: f(args) == value means returnfrom(f(args)) == value
        fn = self.symbol()
        args = self.arglist(fn) if self.tok.kind == "(" else ()
        if self.tok.kind != "==":
            raise self.err(self.tok, f"syntax error: write call({fn.text}) or returnfrom({fn.text}) == value")
        self.take("==")
        ret = self.pattern()
        ret = None if ret.kind == "any" else ret
        return _Node("ev", t.line, t.col, spec=EventSpec("return", fn.text, args, ret, t.line, t.col))

    # normalisation and static checks
    def _branches(self, tree: _Node, site: Site, bound: Tok) -> tuple[tuple[Step, ...], ...]:
        branches = _expand(tree, self)
        if len(branches) > MAX_BRANCHES:
            raise self.err(tree, f"this expression expands to {len(branches)} automata (at most {MAX_BRANCHES})")
        bound_vars = set(site.variables())
        out = []
        for b in branches:
            steps = [s for s, _ in b]
            sites = [pos for s, pos in b if s.site]
            if not sites:
                raise self.err(tree, "no assertion site in this sequence: use previously(...), "
                                     "eventually(...) or site")
            if len(sites) > 1:
                raise self.err(sites[1], "the assertion site appears twice in one sequence")
            self._check_events(steps, site, bound, bound_vars)
            out.append(tuple(steps))
        return tuple(dict.fromkeys(out))    # identical branches (from a || a) are one automaton

    def _check_events(self, steps: list[Step], site: Site, bound: Tok, bound_vars: set[str]) -> None:
        # Only events of one function and kind can overlap: seen is indexed by them, so
        # the check is linear in the events unless many are on one function (bounded by
        # MAX_EVENTS).
        seen: dict[tuple[str, str], list[tuple[EventSpec, str]]] = {
            (bound.text, "call"): [(EventSpec("call", bound.text, (), None, bound.line, bound.col),
                                    f"the bound's call({bound.text})")],
            (bound.text, "return"): [(EventSpec("return", bound.text, (), None, bound.line, bound.col),
                                      f"the bound's returnfrom({bound.text})")]}
        site_spec = site.as_spec()
        events = [e for s in steps for e in s.alts]
        if len(events) > MAX_EVENTS:
            raise self.err(events[MAX_EVENTS], f"more than {MAX_EVENTS} events in one automaton")
        for s in steps:
            for e in s.alts:
                for p in e.patterns():
                    if p.kind == "var" and p.name not in bound_vars:
                        where = f"at {site.text()} binds " + (", ".join(sorted(bound_vars)) or "none")
                        raise self.err(p, f"variable '{p.name}' is not bound at the assertion site ({where})")
                same = seen.setdefault((e.func, e.kind), [])
                for other, what in same:
                    if e.overlaps(other):
                        raise self.err(e, f"event {e.text()} is used twice in one automaton: {what} "
                                          f"at {other.line}:{other.col} can match the same event")
                if site_spec is not None and e.overlaps(site_spec):
                    raise self.err(e, f"event {e.text()} is used twice in one automaton: the assertion "
                                      f"site {site.text()} at {site.line}:{site.col} can match the same event")
                same.append((e, e.text()))


def _expand(n: _Node, p: _Parser) -> list[list[tuple[Step, _Node]]]:
    """All branches of a node, each a list of (step, node for positions). An OR of
    plain events is one OR-block step; any other OR is distributed into branches."""
    if n.kind == "ev":
        return [[(Step((n.event,)), n)]]
    if n.kind == "site":
        return [[(SITE_STEP, n)]]
    if n.kind == "seq":
        out: list[list[tuple[Step, _Node]]] = [[]]
        for item in n.items:
            tails = _expand(item, p)
            # checked before the product is built: 64 x 8,000 branches took 0.7 s
            if len(out) * len(tails) > MAX_BRANCHES:
                raise p.err(n, f"this expression expands to more than {MAX_BRANCHES} automata")
            out = [a + b for a, b in itertools.product(out, tails)]
        return out
    alts = _or_events(n)
    if n.kind == "opt":
        inner = n.items[0]
        ev = [inner.event] if inner.kind == "ev" else _or_events(inner)
        if ev is not None:
            return [[(Step(tuple(ev), optional=True), n)]]
        return _expand(inner, p) + [[]]     # optional(sequence(...)): with or without it
    if alts is not None:
        return [[(Step(tuple(alts)), n)]]
    return [b for item in _flatten_or(n) for b in _expand(item, p)]


def _flatten_or(n: _Node) -> list[_Node]:
    return [x for item in n.items for x in (_flatten_or(item) if item.kind == "or" else [item])]


def _or_events(n: _Node) -> list[EventSpec] | None:
    """The events of an OR of plain events (nested ORs flattened), else None."""
    if n.kind != "or":
        return None
    items = _flatten_or(n)
    return [i.event for i in items] if all(i.kind == "ev" for i in items) else None


# --- public API ---------------------------------------------------------------------

class AssertionSet:
    """The assertions of one file (or a selection of them)."""

    def __init__(self, assertions: list[Assertion], name: str = "<string>"):
        self.assertions = list(assertions)
        self.name = name

    def __len__(self) -> int:
        return len(self.assertions)

    def __iter__(self) -> Iterator[Assertion]:
        return iter(self.assertions)

    def names(self) -> list[str]:
        return [a.name for a in self.assertions]

    def needed(self) -> dict[str, set[str]]:
        """symbol -> the subset of {"call", "return"} events the automata consume. A
        "return" event carries the arguments of its call: the event source tracks that
        call itself. Symbol+offset sites are in sites(), not here."""
        out: dict[str, set[str]] = {}
        for a in self.assertions:
            out.setdefault(a.bound, set()).update(("call", "return"))
            if a.site.offset is None:
                out.setdefault(a.site.func, set()).add("call")
            for e in a.events():
                out.setdefault(e.func, set()).add(e.kind)
        return out

    def sites(self) -> list[tuple[str, int]]:
        """(symbol, offset) of every symbol+offset assertion site, for the event source."""
        return sorted({(a.site.func, a.site.offset) for a in self.assertions if a.site.offset is not None})

    def select(self, names: Iterable[str]) -> AssertionSet:
        """The named assertions, in this set's order (for benchmarks: 0, 10 or all)."""
        want = list(names)
        missing = [n for n in want if n not in set(self.names())]
        if missing:
            raise TandemError(f"{self.name}: no assertion named {', '.join(repr(m) for m in missing)}")
        keep = set(want)
        return AssertionSet([a for a in self.assertions if a.name in keep], self.name)

    def symbols(self) -> set[str]:
        return set().union(*(a.symbols() for a in self.assertions)) if self.assertions else set()

    def to_text(self) -> str:
        return "\n".join(a.to_text() for a in self.assertions)


def parse_text(text: str, name: str = "<string>", symbols: SymbolSource | None = None) -> AssertionSet:
    """Parse assertion text. symbols: None (no symbol check), a System.map path, a set
    of names, or a list of those (their union, e.g. the kernel's and a module's)."""
    names = symbol_names(symbols)
    return AssertionSet(_Parser(text, name, names).file_(), name)


def parse_file(path: str | os.PathLike[str], symbols: SymbolSource | None = None) -> AssertionSet:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise TandemError(f"{path}: cannot read assertions: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise TandemError(f"{path}: not a text file ({e.reason})") from None
    return parse_text(text, str(path), symbols)


def main(argv: list[str] | None = None) -> int:
    """Check assertion files (syntax, and symbols when --symbols is given):
    python -m tandem.assertions.lang FILE... [--symbols MAP_OR_NAME_LIST ...]"""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m tandem.assertions.lang", description=main.__doc__)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--symbols", action="append", default=None,
                    help="System.map, `nm` output or a list of names (repeat for a union)")
    args = ap.parse_args(argv)
    try:
        for f in args.files:
            s = parse_file(f, symbols=args.symbols)
            print(f"{f}: {len(s)} assertions, {len(s.needed())} functions instrumented, "
                  f"{len(s.sites())} symbol+offset sites" + ("" if args.symbols else " (symbols not checked)"))
    except TandemError as e:
        print(e, file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
