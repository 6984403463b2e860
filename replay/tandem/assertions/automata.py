"""ThinTESLA automata over the event stream (semantics: docs/assertions.md).

Checker indexes every automaton by the (function, kind) of the events it consumes,
so an event no assertion mentions costs one dict lookup. Per automaton and bound
activation an instance keeps, per branch (top-level OR split):
  - history: the automaton's events seen since the last pass, before the site binds
    the variables that decide which of them are relevant (non-static events);
  - passes: one per binding of the site's variables, from the site to the end of
    the sequence; after the site every event is judged as it happens.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypedDict

from .events import Event
from .lang import AssertionSet, parse_text
from .model import MASK64, Assertion, EventSpec, Pat, Step

HISTORY_MAX = 4096      # pre-site observations kept per branch; the oldest half goes first

Sigma = dict[str, int]          # the site's variables, bound
Key = tuple[int, ...]           # a binding's values in the site's variable order: a pass's key


def _value(ev: Event, i: int) -> int | None:
    if i < 0:
        return ev.ret
    return ev.args[i] if i < len(ev.args) else 0


class _Spec:
    """An EventSpec compiled for matching: literal checks first (they decide whether
    an event belongs to the automaton at all), variable checks once a site bound them."""
    __slots__ = ("alt", "lits", "static", "step", "text", "vars")

    def __init__(self, spec: EventSpec, step: int, alt: int) -> None:
        self.text, self.step, self.alt = spec.text(), step, alt
        pats = [(i, p) for i, p in enumerate(spec.args)] + ([(-1, spec.ret)] if spec.ret else [])
        self.lits = tuple((i, p.accepted()) for i, p in pats if p.kind == "lit")
        self.vars = tuple((i, p.name) for i, p in pats if p.kind == "var")
        self.static = not self.vars

    def lit_ok(self, ev: Event) -> bool:
        for i, acc in self.lits:
            v = _value(ev, i)
            if v is None or v & MASK64 not in acc:
                return False
        return True

    def var_ok(self, ev: Event, sigma: Sigma) -> bool:
        for i, name in self.vars:
            v = _value(ev, i)
            if v is None or v & MASK64 != sigma[name]:
                return False
        return True


Obs = tuple[_Spec, Event]       # an event an automaton consumed, with the spec it matched


class _Site:
    __slots__ = ("lits", "names", "text", "vars")

    def __init__(self, a: Assertion) -> None:
        s = a.site
        self.text = "site " + s.text()
        self.lits = tuple((i, p.accepted()) for i, p in enumerate(s.args) if p.kind == "lit")
        self.vars = tuple((i, p.name) for i, p in enumerate(s.args) if p.kind == "var")
        self.names = tuple(s.variables())

    def bind(self, ev: Event) -> tuple[Key, Sigma] | None:
        """(key, bindings) if ev is the site (its literals match), else None. A site's
        patterns are all arguments (no return value): ev.arg, never None."""
        for i, acc in self.lits:
            if ev.arg(i) & MASK64 not in acc:
                return None
        sigma: Sigma = {}
        for i, name in self.vars:
            v = ev.arg(i) & MASK64
            if sigma.setdefault(name, v) != v:
                return None         # at f(x, x): both arguments must be equal
        return tuple(sigma[n] for n in self.names), sigma


class _Branch:
    """One automaton: the steps of a branch with its successor relation precomputed."""

    def __init__(self, steps: tuple[Step, ...]) -> None:
        self.steps = steps
        self.n = len(steps)
        self.site_idx = next(i for i, s in enumerate(steps) if s.site)
        self.is_or = [len(s.alts) > 1 for s in steps]
        # nreq[i]: the first required step at or after i (n if none): from position p
        # the successors are the steps p+1 .. nreq[p+1] (ThinTESLA 3.1.3)
        self.nreq = [self.n] * (self.n + 1)
        for i in range(self.n - 1, -1, -1):
            self.nreq[i] = i if not steps[i].optional else self.nreq[i + 1]
        self.specs = [[_Spec(e, i, k) for k, e in enumerate(s.alts)] for i, s in enumerate(steps)]

    def complete(self, pos: int) -> bool:
        return self.nreq[pos + 1] == self.n

    def expected(self, pos: int, seen: int = 0) -> list[str]:
        """What may come next from position pos (unseen alternatives of an OR block in
        progress, then the steps up to the next required one)."""
        out = [c.text for c in self.specs[pos] if not seen & (1 << c.alt)] if 0 <= pos and self.is_or[pos] else []
        for j in range(pos + 1, min(self.nreq[pos + 1], self.n - 1) + 1):
            out += ["site"] if self.steps[j].site else [c.text for c in self.specs[j]]
        return out

    def verify_pre(self, obs: list[Obs], strict: bool) -> tuple[bool, list[Obs], list[str], Obs | None]:
        """Check the relevant observations before the site against the steps before it,
        walking backwards from the site (ThinTESLA Algorithm 3.2). Conditional: the
        most recent observations must form the sequence, older ones are discarded;
        strict: all of them must. Returns (ok, window, expected, found)."""
        j, k = self.site_idx - 1, len(obs) - 1
        window: list[Obs] = []
        while j >= 0:
            if k >= 0 and obs[k][0].step == j:
                seen = 0
                while k >= 0 and obs[k][0].step == j and not seen & (1 << obs[k][0].alt):
                    seen |= 1 << obs[k][0].alt
                    window.append(obs[k])
                    k -= 1
                    if not self.is_or[j]:
                        break
                j -= 1
            elif self.steps[j].optional:
                j -= 1
            else:
                window.reverse()
                return False, window, [c.text for c in self.specs[j]], obs[k] if k >= 0 else None
        window.reverse()
        if strict and k >= 0:
            return False, window, [], obs[k]
        return True, window, [], None


class _Pass:
    """One traversal from the site on, for one binding of the site's variables."""
    __slots__ = ("complete", "hit", "matched", "pos", "seen", "sigma")

    def __init__(self, sigma: Sigma, pos: int, matched: list[tuple[str, Event]], hit: int, complete: bool) -> None:
        self.sigma, self.pos, self.seen, self.matched, self.hit, self.complete = sigma, pos, 0, matched, hit, complete


class _State:
    """A branch's state in one instance."""
    __slots__ = ("dead", "history", "passes", "sigmas", "site_reached")

    def __init__(self) -> None:
        self.history: list[Obs] = []
        self.passes: dict[Key, _Pass] = {}
        self.sigmas: list[Sigma] = []
        self.site_reached = False
        self.dead = False       # strict after a violation, guideline after its one check


class _Instance:
    __slots__ = ("depth", "fails", "hits", "states")

    def __init__(self, nbranches: int) -> None:
        self.depth = 1
        self.hits = 0           # site hits so far: OR branches are judged per hit
        self.states: list[_State | None] = [None] * nbranches
        self.fails: dict[int, dict[int, Violation]] = {}


class Observed(TypedDict):
    """An observation as a violation reports it (_obs)."""
    event: str                  # the spec it matched, as text
    kind: str
    func: str
    icount: int
    vm_ns: int
    task: int


class AutomatonState(TypedDict):
    """Violation.state: where the automaton was when it failed."""
    matched: list[Observed]
    expected: list[str]
    bindings: Sigma
    found: Observed | None
    branch: int | None


@dataclass
class Violation:
    """An assertion that did not hold: which, why, the automaton state and the event
    at which it was detected (the site, an out-of-order event or the bound's return)."""
    assertion: str
    mode: str
    scope: str
    fatal: bool                 # False for guideline assertions: report, do not fail
    reason: str
    event: Event
    task: int
    vm_ns: int
    icount: int
    matched: list[Observed] = field(default_factory=list)   # events matched so far, oldest first
    expected: list[str] = field(default_factory=list)   # what the automaton waited for
    bindings: dict[str, int] = field(default_factory=dict)
    found: Observed | None = None   # the observation that was out of order, if not `event`
    branch: int | None = None   # which automaton of a top-level OR
    alternatives: list[dict[str, object]] = field(default_factory=list)  # the other OR branches' failures

    @property
    def state(self) -> AutomatonState:
        return {"matched": self.matched, "expected": self.expected, "bindings": self.bindings,
                "found": self.found, "branch": self.branch}

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["event"] = _event_dict(self.event)
        return d

    def __str__(self) -> str:
        b = ", ".join(f"{k}={v:#x}" for k, v in self.bindings.items())
        return (f"{'VIOLATION' if self.fatal else 'guideline'} {self.assertion}: {self.reason}"
                f"{' [' + b + ']' if b else ''} at {self.event.kind} {self.event.func} "
                f"task={self.task:#x} vm_ns={self.vm_ns} icount={self.icount}")


def _event_dict(ev: Event) -> dict[str, object]:
    return {"kind": ev.kind, "func": ev.func, "args": list(ev.args), "ret": ev.ret, "task": ev.task,
            "vm_ns": ev.vm_ns, "icount": ev.icount, "pc": ev.pc, "stack": list(ev.stack)}


def _obs(text: str, ev: Event) -> Observed:
    return {"event": text, "kind": ev.kind, "func": ev.func, "icount": ev.icount, "vm_ns": ev.vm_ns,
            "task": ev.task}


@dataclass
class CheckerStats:
    events_seen: int = 0
    events_matched: int = 0         # of a (function, kind) some automaton consumes
    instances_created: int = 0
    sites_reached: int = 0
    sites_outside_bound: int = 0    # the site ran outside every bound: not checked
    violations: int = 0
    history_dropped: int = 0        # pre-site observations dropped past HISTORY_MAX
    open_at_finish: int = 0         # instances whose bound had not returned at finish()

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class _Rule:
    """The runtime of one assertion: its branches and live instances."""

    def __init__(self, a: Assertion, stats: CheckerStats) -> None:
        self.a, self.stats = a, stats
        self.strict, self.guideline = a.mode == "strict", a.mode == "guideline"
        self.per_thread = a.scope == "per-thread"
        self.site = _Site(a)
        self.branches = [_Branch(b) for b in a.branches]
        # live instances: per-thread task -> instance; global None -> the one instance.
        # Checker.feed skips a rule whose dict is empty without calling it.
        self.insts: dict[int | None, _Instance] = {}
        self.gdepth: dict[int, int] = {}            # global: open bound activations per task
        self.gtotal = 0

    # bounds: an instance lives from the outermost call of the bound to its return
    def bound_call(self, ev: Event, out: list[Violation], _a: object, _b: object) -> None:
        if self.per_thread:
            inst = self.insts.get(ev.task)
            if inst is not None:
                inst.depth += 1
                return
            self.insts[ev.task] = _Instance(len(self.branches))
        else:
            self.gdepth[ev.task] = self.gdepth.get(ev.task, 0) + 1
            self.gtotal += 1
            if self.gtotal > 1:
                return
            self.insts[None] = _Instance(len(self.branches))
        self.stats.instances_created += 1

    def bound_return(self, ev: Event, out: list[Violation], _a: object, _b: object) -> None:
        if self.per_thread:
            inst = self.insts.get(ev.task)
            if inst is None:
                return              # the trace began inside the bound
            inst.depth -= 1
            if inst.depth:
                return
            del self.insts[ev.task]
        else:
            d = self.gdepth.get(ev.task, 0)
            if not d:
                return
            if d == 1:
                del self.gdepth[ev.task]
            else:
                self.gdepth[ev.task] = d - 1
            self.gtotal -= 1
            if self.gtotal:
                return
            inst = self.insts.pop(None)
        self.close(inst, ev, out)

    def close(self, inst: _Instance, ev: Event, out: list[Violation]) -> None:
        bound = self.a.bound
        for bi, br in enumerate(self.branches):
            st = inst.states[bi]
            if st is None:
                if not self.strict:
                    continue    # no event of this branch in the bound
                st = inst.states[bi] = _State()
            if st.dead:
                continue
            for p in list(st.passes.values()):
                if not p.complete:
                    self._fail(inst, bi, p.hit, f"{bound} returned before {_one_of(br.expected(p.pos, p.seen))}",
                               ev, p.matched, br.expected(p.pos, p.seen), p.sigma, None, out)
                    if st.dead:
                        break
            if self.strict and not st.dead:
                if not st.site_reached:
                    first = st.history[0] if st.history else None
                    self._fail(inst, bi, 0, f"{bound} returned without reaching the assertion site (strict)",
                               ev, [], br.expected(-1), {}, _obs(first[0].text, first[1]) if first else None, out)
                else:
                    left = [o for o in st.history
                            if o[0].static or any(o[0].var_ok(o[1], s) for s in st.sigmas)]
                    if left:
                        self._fail(inst, bi, inst.hits, f"{left[0][0].text} was not followed by the "
                                   "assertion site (strict)", ev, [], ["site"], st.sigmas[-1],
                                   _obs(left[0][0].text, left[0][1]), out)

    # the assertion site
    def site_hit(self, ev: Event, out: list[Violation], _a: object, _b: object) -> None:
        inst = self.insts.get(ev.task if self.per_thread else None)
        if inst is None:
            self.stats.sites_outside_bound += 1
            return
        bound = self.site.bind(ev)
        if bound is None:
            return
        key, sigma = bound
        self.stats.sites_reached += 1
        inst.hits += 1
        for bi, br in enumerate(self.branches):
            st = inst.states[bi]
            if st is None:
                st = inst.states[bi] = _State()
            if not st.dead:
                self._site(inst, bi, br, st, key, sigma, ev, out)

    def _site(self, inst: _Instance, bi: int, br: _Branch, st: _State, key: Key, sigma: Sigma, ev: Event,
              out: list[Violation]) -> None:
        p = st.passes.get(key)
        if p is not None:
            if p.complete and not self.strict:
                del st.passes[key]      # conditional: the sequence starts over
            else:
                del st.passes[key]
                exp = br.expected(p.pos, p.seen)
                why = "the assertion site was reached again" + (
                    " (strict: one pass per bound)" if p.complete else f" before {_one_of(exp)}")
                self._fail(inst, bi, p.hit, why, ev, p.matched, exp, sigma, None, out)
                return
        st.site_reached = True
        if self.strict:
            st.sigmas.append(sigma)
        if st.history:
            rel = [o for o in st.history if o[0].var_ok(o[1], sigma)]
            if rel:
                st.history = [o for o in st.history if not o[0].var_ok(o[1], sigma)]
            ok, window, exp, found = br.verify_pre(rel, self.strict)
        elif br.site_idx == 0:
            ok, window, exp, found = True, [], [], None     # eventually(...): nothing to check before the site
        else:
            ok, window, exp, found = br.verify_pre([], self.strict)
        matched = [(s.text, e) for s, e in window]
        if not ok:
            if found is None:
                why = f"reached the assertion site but {_one_of(exp)} did not happen before it"
            elif exp:
                why = f"reached the assertion site but {_one_of(exp)} did not happen before it ({found[0].text} did)"
            else:
                why = f"{found[0].text} happened before the sequence began (strict)"
            self._fail(inst, bi, inst.hits, why, ev, matched, exp, sigma,
                       _obs(found[0].text, found[1]) if found else None, out)
            return
        matched.append((self.site.text, ev))
        pos = br.site_idx
        if br.complete(pos):
            if self.guideline:
                st.dead = True  # checked once per bound (ThinTESLA 3.1.4)
                st.passes.clear()
                return
            if pos == br.n - 1 and not self.strict:
                return          # nothing can follow: a later event starts a new pass anyway
        st.passes[key] = _Pass(sigma, pos, matched, inst.hits, br.complete(pos))

    # the events of the sequence
    def event(self, ev: Event, out: list[Violation], bi: int, c: _Spec) -> None:
        inst = self.insts.get(ev.task if self.per_thread else None)
        if inst is None or not c.lit_ok(ev):
            return
        st = inst.states[bi]
        if st is None:
            st = inst.states[bi] = _State()
        elif st.dead:
            return
        br = self.branches[bi]
        taken = False
        if st.passes:
            j = c.step
            for key, p in list(st.passes.items()):
                if c.vars and not c.var_ok(ev, p.sigma):
                    continue
                if (j == p.pos and br.is_or[j] and not p.seen & (1 << c.alt)) or p.pos < j <= br.nreq[p.pos + 1]:
                    if j != p.pos:
                        p.pos, p.seen = j, 0
                    p.seen |= 1 << c.alt
                    p.matched.append((c.text, ev))
                    p.complete = br.complete(j)
                    taken = True
                    if p.complete:
                        if self.guideline:
                            st.dead = True
                            st.passes.clear()
                            return
                        if j == br.n - 1 and not br.is_or[j] and not self.strict:
                            del st.passes[key]
                elif p.complete and not self.strict:
                    del st.passes[key]  # conditional: this event begins the next pass
                else:
                    del st.passes[key]
                    exp = br.expected(p.pos, p.seen)
                    why = (f"{c.text} happened after the sequence was complete (strict)" if p.complete
                           else f"{c.text} happened while waiting for {_one_of(exp)}")
                    self._fail(inst, bi, p.hit, why, ev, p.matched, exp, p.sigma, None, out)
                    taken = True
                    if st.dead:
                        return
        if not taken:
            h = st.history
            h.append((c, ev))
            if len(h) > HISTORY_MAX:
                drop = HISTORY_MAX // 2
                del h[:drop]
                self.stats.history_dropped += drop

    def _fail(self, inst: _Instance, bi: int, hit: int, reason: str, ev: Event, matched: list[tuple[str, Event]],
              expected: list[str], sigma: Sigma, found: Observed | None, out: list[Violation]) -> None:
        a = self.a
        v = Violation(a.name, a.mode, a.scope, a.mode != "guideline", reason, ev, ev.task, ev.vm_ns,
                      ev.icount, [_obs(t, e) for t, e in matched], list(expected), dict(sigma), found,
                      bi if len(self.branches) > 1 else None)
        st = inst.states[bi]       # made by the caller, which judged this branch
        if st is not None and (self.strict or self.guideline):
            st.dead = True
            st.passes.clear()
        if len(self.branches) == 1:
            out.append(v)
            self.stats.violations += 1
            return
        # top-level OR: the assertion fails for a site hit only when every branch failed for it
        fails = inst.fails.setdefault(hit, {})
        fails.setdefault(bi, v)
        if len(fails) == len(self.branches):
            v.alternatives = [{k: w.to_dict()[k] for k in ("branch", "reason", "matched", "expected", "found")}
                              for b, w in sorted(fails.items()) if b != bi]
            del inst.fails[hit]
            out.append(v)
            self.stats.violations += 1

_SITE = object()     # marks a site op in Checker's index
# An op's handler: a _Rule method called with the event, the violations found so far and
# the op's own two arguments (a branch index and its _Spec for an event of a sequence;
# unused by the bound's call and return and by the site), whose types differ per handler.
Handler = Callable[[Event, list[Violation], Any, Any], None]
Live = dict[int | None, _Instance]  # a rule's instances: the op runs only while one lives


def _one_of(texts: list[str]) -> str:
    return texts[0] if len(texts) == 1 else "one of " + ", ".join(texts) if texts else "nothing"


class Checker:
    """Feed events in trace order; get the violations each one reveals."""

    def __init__(self, assertion_set: AssertionSet) -> None:
        self._stats = CheckerStats()
        self._seen = self._matched = 0     # plain attributes: feed() is the hot path
        self.rules = [_Rule(a, self._stats) for a in assertion_set.assertions]
        self._last: Event | None = None
        # func -> kind -> ops; per rule the bound's call goes first (a site at the
        # bound's entry is inside the bound) and its return last
        # op: (handler, arg, arg, live) where live is the rule's instance dict, or None
        # for the bound's call and return, which run whether or not an instance lives
        ops: dict[tuple[str, str], list[tuple[int, Handler, object, object, Live | None]]] = {}
        for r in self.rules:
            a = r.a
            ops.setdefault((a.bound, "call"), []).append((0, r.bound_call, None, None, None))
            ops.setdefault((a.site.event_func, a.site.event_kind), []).append((1, r.site_hit, _SITE, None, r.insts))
            for bi, br in enumerate(r.branches):
                for specs in br.specs:
                    for c in specs:
                        e = br.steps[c.step].alts[c.alt]
                        ops.setdefault((e.func, e.kind), []).append((2, r.event, bi, c, r.insts))
            ops.setdefault((a.bound, "return"), []).append((3, r.bound_return, None, None, None))
        self._index: dict[str, dict[str, tuple[tuple[Handler, object, object, Live | None], ...]]] = {}
        for (func, kind), lst in ops.items():
            lst.sort(key=lambda o: o[0])
            self._index.setdefault(func, {})[kind] = tuple(o[1:] for o in lst)

    @property
    def stats(self) -> CheckerStats:
        s = self._stats
        s.events_seen, s.events_matched = self._seen, self._matched
        return s

    def feed(self, event: Event) -> list[Violation]:
        self._seen += 1
        by_kind = self._index.get(event.func)
        if by_kind is None:
            return []
        ops = by_kind.get(event.kind)
        if ops is None:
            return []
        self._matched += 1
        self._last = event
        out: list[Violation] = []
        for f, x, y, live in ops:
            if live is not None and not live:   # no thread inside this rule's bound
                if x is _SITE:
                    self._stats.sites_outside_bound += 1
                continue
            f(event, out, x, y)
        return out

    def finish(self, close_open: bool = False) -> list[Violation]:
        """End of the trace. A bound that has not returned is not judged (ThinTESLA
        judges at the second bound; a task blocked in a syscall at poweroff is not a
        violation); it is counted in stats.open_at_finish. Violations found earlier
        were already returned by feed(). close_open=True judges open instances as if
        their bound returned at the last event (for traces cut at a quiescent point)."""
        out: list[Violation] = []
        for r in self.rules:
            self._stats.open_at_finish += len(r.insts)
            if close_open and self._last is not None:
                for task, inst in list(r.insts.items()):
                    # the last event, on the instance's own thread for a per-thread rule
                    r.close(inst, self._last if task is None else replace(self._last, task=task), out)
            r.insts.clear()
            r.gdepth, r.gtotal = {}, 0
        return out


# --- micro-benchmark --------------------------------------------------------------

BENCH_ASSERTIONS = """
assert "bench-prev" per-thread conditional at use(obj, _):
    within(syscall, previously(returnfrom(check(obj)) == 0))
assert "bench-next" per-thread conditional at lock(l):
    within(syscall, eventually(call(unlock(l))))
assert "bench-or" per-thread conditional at emit:
    within(syscall, previously(call(path_a) || call(path_b)))
assert "bench-global" global conditional at commit:
    within(txn, sequence(call(begin), optional(call(log)), site, call(end)))
"""


Scripted = tuple[str, str, tuple[int, ...], int | None]     # (kind, func, args, ret) of an event


def synthetic_events(aset: AssertionSet, n: int, tasks: int = 2, noise: int = 1) -> list[Event]:
    """A stream that satisfies every assertion's first branch, repeated until n events:
    per-thread assertions run on `tasks` interleaved tasks, global ones on one task at
    a time; `noise` events of an unrelated function follow each related one."""
    def args_for(pats: tuple[Pat, ...]) -> tuple[int, ...]:
        return tuple(p.number & MASK64 if p.kind == "lit" else 0x1000 for p in pats) + (0,) * (6 - len(pats))

    def script(a: Assertion) -> list[Scripted]:
        out: list[Scripted] = [("call", a.bound, (0,) * 6, None)]
        for s in a.branches[0]:
            if s.site:
                out.append((a.site.event_kind, a.site.event_func, args_for(a.site.args), None))
            elif not s.optional:
                e = s.alts[0]
                ret = (0 if e.ret is None else e.ret.number & MASK64 if e.ret.kind == "lit" else 0x1000)
                out.append((e.kind, e.func, args_for(e.args), ret if e.kind == "return" else None))
        return out + [("return", a.bound, (0,) * 6, 0)]

    order: list[tuple[int, Scripted]] = []     # (task, event fields)
    for a in aset.assertions:
        sc = script(a)
        if a.scope == "per-thread":
            order += [(t, e) for e in sc for t in range(tasks)]
        else:
            order += [(t, e) for t in range(tasks) for e in sc]
    out: list[Event] = []
    while len(out) < n:
        for t, (kind, func, args, ret) in order:
            task = 0x1000 * (t + 1)
            out.append(Event(kind, func, args, ret, task, len(out) * 10, len(out), 0))
            out += [Event("call", "unrelated_function", (0,) * 6, None, task, len(out) * 10, len(out), 0)
                    for _ in range(noise)]
    return out[:n]


def bench_ns_per_event(n: int = 200_000, assertion_set: AssertionSet | None = None,
                       events: list[Event] | None = None) -> float:
    """Nanoseconds per event fed to a Checker (best of 3). By default a synthetic stream
    (synthetic_events: every assertion satisfied, half the events unrelated) over a
    set of four assertions of different shapes."""
    aset = assertion_set or parse_text(BENCH_ASSERTIONS, "<bench>")
    synthetic = events is None
    if events is None:
        events = synthetic_events(aset, n)
    best = float("inf")
    for _ in range(3):
        chk = Checker(aset)
        feed = chk.feed
        t0 = time.perf_counter_ns()
        for ev in events:
            feed(ev)
        best = min(best, (time.perf_counter_ns() - t0) / max(1, len(events)))
    if chk.stats.violations and synthetic:
        raise ValueError(f"the synthetic stream violates {chk.stats.violations} times: pass events=")
    return best
