"""Rust v0 symbol names ("_RNvMs0_NtCs..._11rust_binder4node...") as Rust paths.

Kernel Rust code is built with the v0 mangling, and syzkaller names Rust frames by
their demangled paths ("<rust_binder::process::Process>::update_ref"), so the same
must be done before skipping helpers or naming a report. Written from the grammar in
the Rust symbol-mangling RFC 2603. The name comes from the guest's console: depth,
back references (only backwards) and output length are bounded, and a name that does
not parse is returned as it is.
"""
from __future__ import annotations

_BASIC = {"a": "i8", "b": "bool", "c": "char", "d": "f64", "e": "str", "f": "f32", "h": "u8", "i": "isize",
          "j": "usize", "l": "i32", "m": "u32", "n": "i128", "o": "u128", "p": "_", "s": "i16", "t": "u16",
          "u": "()", "v": "...", "x": "i64", "y": "u64", "z": "!"}
_MAX_DEPTH = 64
_MAX_OUT = 1024
_MAX_STEPS = 4096
_B62 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


class _Bad(Exception):
    pass


class _Parser:
    def __init__(self, text: str):
        self.s, self.i, self.depth, self.quiet = text, 0, 0, 0
        self.out: list[str] = []
        self.size = 0
        self.steps = 0

    # -- reading
    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def take(self, ch: str | None = None) -> str:
        c = self.peek()
        if not c or (ch is not None and c != ch):
            raise _Bad
        self.i += 1
        return c

    def b62(self) -> int:
        if self.peek() == "_":
            self.i += 1
            return 0
        n, start = 0, self.i
        while self.peek() != "_":
            c = self.take()
            if c not in _B62 or self.i - start > 16:
                raise _Bad
            n = n * 62 + _B62.index(c)
        self.i += 1
        return n + 1

    def decimal(self) -> int:
        start = self.i
        while self.peek().isdigit():
            self.i += 1
        if start == self.i or (self.s[start] == "0" and self.i - start > 1) or self.i - start > 6:
            raise _Bad
        return int(self.s[start:self.i])

    def disambiguator(self) -> int:
        if self.peek() == "s":
            self.i += 1
            return self.b62() + 1
        return 0

    def ident(self) -> tuple[int, str]:
        dis = self.disambiguator()
        if self.peek() == "u":
            raise _Bad              # punycode identifiers: not in kernel code
        n = self.decimal()
        if self.peek() == "_":
            self.i += 1
        if self.i + n > len(self.s):
            raise _Bad
        name = self.s[self.i:self.i + n]
        self.i += n
        return dis, name

    # -- writing
    def w(self, text: str) -> None:
        if not self.quiet:
            self.size += len(text)
            if self.size > _MAX_OUT:
                raise _Bad
            self.out.append(text)

    def nest(self):
        self.depth += 1
        self.steps += 1     # back references can repeat a part many times, even unprinted
        if self.depth > _MAX_DEPTH or self.steps > _MAX_STEPS:
            raise _Bad

    def backref(self, parse) -> None:
        at = self.i
        self.take("B")
        to = self.b62()
        if to >= at:
            raise _Bad
        back, self.i = self.i, to
        parse()
        self.i = back

    # -- grammar
    def path(self, sep: bool = True) -> None:
        self.nest()
        c = self.take()
        if c == "C":
            self.w(self.ident()[1])
        elif c in "MX":
            self.quiet += 1
            self.disambiguator()
            self.path(False)
            self.quiet -= 1
            self.w("<")
            self.type()
            if c == "X":
                self.w(" as ")
                self.path(False)
            self.w(">")
        elif c == "Y":
            self.w("<")
            self.type()
            self.w(" as ")
            self.path(False)
            self.w(">")
        elif c == "N":
            ns = self.take()
            if not ns.isalpha():
                raise _Bad
            self.path(sep)
            dis, name = self.ident()
            if ns.isupper():
                kind = {"C": "closure", "S": "shim"}.get(ns, ns)
                self.w("::{" + kind + (":" + name if name else "") + f"#{dis}}}")
            else:
                self.w("::" + name)
        elif c == "I":
            self.path(sep)
            self.w("::<" if sep else "<")
            self.args()
            self.w(">")
        elif c == "B":
            self.i -= 1
            self.backref(lambda: self.path(sep))
        else:
            raise _Bad
        self.depth -= 1

    def args(self) -> None:
        first = True
        while self.peek() != "E":
            if not first:
                self.w(", ")
            first = False
            c = self.peek()
            if c == "L":
                self.i += 1
                self.b62()
                self.w("'_")
            elif c == "K":
                self.i += 1
                self.const()
            else:
                self.type()
        self.take("E")

    def type(self) -> None:
        self.nest()
        c = self.peek()
        if c in _BASIC:
            self.i += 1
            self.w(_BASIC[c])
        elif c in "CMXYNI":
            self.path(False)
        elif c in "AS":
            self.i += 1
            self.w("[")
            self.type()
            if c == "A":
                self.w("; ")
                self.const()
            self.w("]")
        elif c == "T":
            self.i += 1
            self.w("(")
            n = 0
            while self.peek() != "E":
                if n:
                    self.w(", ")
                self.type()
                n += 1
            self.take("E")
            self.w(",)" if n == 1 else ")")
        elif c in "RQ":
            self.i += 1
            self.w("&")
            if self.peek() == "L":
                self.i += 1
                self.b62()
            self.w("mut " if c == "Q" else "")
            self.type()
        elif c in "PO":
            self.i += 1
            self.w("*const " if c == "P" else "*mut ")
            self.type()
        elif c == "B":
            self.backref(self.type)
        else:
            raise _Bad                # fn and dyn types: not in kernel frame names
        self.depth -= 1

    def const(self) -> None:
        self.nest()
        c = self.peek()
        if c == "p":
            self.i += 1
            self.w("_")
        elif c == "B":
            self.backref(self.const)
        else:
            kind = self.take()
            neg = self.peek() == "n"
            if neg:
                self.i += 1
            start = self.i
            while self.peek() != "_":
                if self.take() not in "0123456789abcdef":
                    raise _Bad
            digits = self.s[start:self.i]
            self.i += 1
            value = int(digits, 16) if digits else 0
            if kind == "b":
                self.w("true" if value else "false")
            elif kind in "ahijlmnostxy":
                self.w(str(-value if neg else value))
            else:
                self.w(f"0x{digits}")
        self.depth -= 1


def demangle(name: str) -> str:
    """The Rust path of a v0-mangled name; any other name as it is."""
    if not name.startswith("_R") or len(name) > _MAX_OUT:
        return name
    p = _Parser(name[2:])
    try:
        if p.peek().isdigit():
            return name
        p.path()
        if p.i < len(p.s):          # the instantiating crate: not shown
            p.quiet += 1
            p.path(False)
            p.quiet -= 1
        if p.i != len(p.s):
            return name
    except (_Bad, RecursionError):
        return name
    return "".join(p.out)
