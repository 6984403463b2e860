"""The parsed form of an assertion: what lang.py produces and automata.py compiles.

An assertion is normalised to one or more branches (a top-level OR is split into
separate automata, ThinTESLA 3.1.5); a branch is a linear list of steps, exactly
one of which is the assertion site. A step is one event, an OR block of events
(any order, at least one) or an optional event or block.
"""
from __future__ import annotations

from dataclasses import dataclass, field

MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class Pat:
    """An argument or return-value pattern: `_`, a literal integer or a variable."""
    kind: str                   # "any" | "lit" | "var"
    value: int | str | None = None      # the literal's int, the variable's name, None for "any"
    line: int = field(default=0, compare=False)
    col: int = field(default=0, compare=False)

    @property
    def number(self) -> int:
        """A literal's integer."""
        if not isinstance(self.value, int):
            raise TypeError(f"a {self.kind!r} pattern has no integer")
        return self.value

    @property
    def name(self) -> str:
        """A variable's name."""
        if not isinstance(self.value, str):
            raise TypeError(f"a {self.kind!r} pattern has no variable name")
        return self.value

    def text(self) -> str:
        if self.kind == "any":
            return "_"
        if self.kind == "lit":
            return str(self.number) if -4096 <= self.number <= 4096 else hex(self.number)
        return self.name

    def accepted(self) -> frozenset[int]:
        """The 64-bit values a literal matches. A negative literal also matches its
        32-bit two's complement zero-extended: an `int` result in eax leaves the upper
        half of rax zero (mov eax, -13), and the language does not know C types."""
        v = self.number
        out = {v & MASK64}
        if -(1 << 31) <= v < 0:
            out.add(v & 0xFFFFFFFF)
        return frozenset(out)


@dataclass(frozen=True)
class EventSpec:
    """call(f(args)) or returnfrom(f(args)) == ret."""
    kind: str                   # "call" | "return"
    func: str
    args: tuple[Pat, ...] = ()
    ret: Pat | None = None
    line: int = field(default=0, compare=False)
    col: int = field(default=0, compare=False)

    def text(self) -> str:
        call = self.func + ("(" + ", ".join(p.text() for p in self.args) + ")" if self.args else "")
        if self.kind == "call":
            return f"call({call})"
        ret = f" == {self.ret.text()}" if self.ret is not None and self.ret.kind != "any" else ""
        return f"returnfrom({call}){ret}"

    def patterns(self) -> list[Pat]:
        return list(self.args) + ([self.ret] if self.ret is not None else [])

    def variables(self) -> set[str]:
        return {p.name for p in self.patterns() if p.kind == "var"}

    def overlaps(self, other: EventSpec) -> bool:
        """Whether one runtime event could match both (variables may be equal at runtime)."""
        if (self.func, self.kind) != (other.func, other.kind):
            return False
        n = max(len(self.args), len(other.args))
        a = list(self.args) + [Pat("any")] * (n - len(self.args)) + [self.ret or Pat("any")]
        b = list(other.args) + [Pat("any")] * (n - len(other.args)) + [other.ret or Pat("any")]
        return all(not (x.kind == y.kind == "lit" and not (x.accepted() & y.accepted()))
                   for x, y in zip(a, b))


@dataclass(frozen=True)
class Step:
    alts: tuple[EventSpec, ...] = ()    # empty for the site step
    optional: bool = False
    site: bool = False

    def text(self) -> str:
        if self.site:
            return "site"
        body = " || ".join(a.text() for a in self.alts)
        return f"optional({body})" if self.optional else body


SITE_STEP = Step(site=True)


@dataclass(frozen=True)
class Site:
    """The assertion site: the entry of a function, or an instruction at symbol+offset.

    Variables in its argument patterns are bound when it is reached; literals there
    restrict which executions are the site."""
    func: str
    offset: int | None = None
    args: tuple[Pat, ...] = ()
    line: int = field(default=0, compare=False)
    col: int = field(default=0, compare=False)

    @property
    def event_kind(self) -> str:
        return "call" if self.offset is None else "site"

    @property
    def event_func(self) -> str:
        """Event.func of the site event ("f" or "f+0x1c", the event source's spelling)."""
        return self.func if self.offset is None else f"{self.func}+{self.offset:#x}"

    def as_spec(self) -> EventSpec | None:
        """The site as a call event (None for symbol+offset, which no other event can be)."""
        return EventSpec("call", self.func, self.args) if self.offset is None else None

    def variables(self) -> list[str]:
        """Bound variables in argument order, each once."""
        out: list[str] = []
        for p in self.args:
            if p.kind == "var" and p.name not in out:
                out.append(p.name)
        return out

    def text(self) -> str:
        loc = self.func if self.offset is None else f"{self.func}+{self.offset:#x}"
        return loc + ("(" + ", ".join(p.text() for p in self.args) + ")" if self.args else "")


SCOPES = ("per-thread", "global")
MODES = ("conditional", "strict", "guideline")


@dataclass(frozen=True)
class Assertion:
    name: str
    scope: str                  # "per-thread" | "global"
    mode: str                   # "conditional" | "strict" | "guideline"
    bound: str                  # within(bound, ...): its call and return delimit an instance
    site: Site
    branches: tuple[tuple[Step, ...], ...]
    line: int = field(default=0, compare=False)
    col: int = field(default=0, compare=False)
    file: str = field(default="<string>", compare=False)

    def to_text(self) -> str:
        """Canonical text; parsing it gives an equal Assertion."""
        body = " ||\n        ".join("sequence(" + ", ".join(s.text() for s in b) + ")"
                                    for b in self.branches)
        return (f'assert "{self.name}" {self.scope} {self.mode} at {self.site.text()}:\n'
                f"    within({self.bound}, {body})\n")

    def events(self) -> list[EventSpec]:
        return [a for b in self.branches for s in b for a in s.alts]

    def symbols(self) -> set[str]:
        return {self.bound, self.site.func} | {e.func for e in self.events()}
