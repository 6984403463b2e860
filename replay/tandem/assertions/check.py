"""`tandem assert`: check an assertion pack on an exact replay and report violations.

    result = check(bundle, pack_path, select=None)   # parse, trace, run the automata
    render(result) / result.to_json()

Each violation is reported with what the automata say (assertion, mode, automaton
state, the event that broke it) and what the replay knows about that moment: the
thread (task_struct address and comm), VM time and instruction count, the call stack
(the return addresses among the stack words the plugin read at the event, as the
kernel's own unwinder marks with `?`: a word is kept when a call precedes it;
symbolized with addr2line), the guest instructions around the call site (capstone,
from vmlinux or the relocated module), and the recorded input that came last before
it: the request that led there.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InfraError, TandemError
from ..formats import bundle, pcapng
from ..formats.manifest import DeclaredPack
from ..report.symbolize import short_path
from ..semantic import inputs
from . import trace
from .automata import Checker, Violation
from .events import Event
from .kernel import Kernel
from .lang import AssertionLangError, AssertionSet, parse_file


def pack_identity(path: str | Path) -> DeclaredPack:
    """The path and sha256 of an assertion pack: what `tandem record --assertions` declares."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise TandemError(f"{p}: cannot read assertions: {e.strerror}") from None
    return DeclaredPack(path=str(p.resolve()), sha256=hashlib.sha256(data).hexdigest())


def declare_pack(path: str | Path, flavor: str = "native") -> DeclaredPack:
    """What `tandem record --assertions` puts in the manifest: the pack's path, hash and
    assertion names, after parsing it against the kernel flavor's symbols and its
    modules' functions (their load addresses are only known once the guest boots)."""
    from .. import artifacts, catalog
    from .kernel import module_functions
    k = artifacts.kernel(flavor)
    mods = set()
    # Linux's modules come in a build of their own; FreeBSD's KLDs with their kernel
    kos = artifacts.modules(flavor).get("modules", []) if catalog.kernel(flavor).os == "linux" else k.get("klds", [])
    for ko in kos:
        mods |= module_functions(ko)
    aset = parse_file(path, symbols=[k["system_map"], mods])
    return dataclasses.replace(pack_identity(path), names=tuple(aset.names()))


def declared_pack(bundle_dir: str | Path) -> Path:
    """The pack a recording declared (tandem record --assertions), if still unchanged."""
    decl = bundle.load_manifest(bundle_dir).assertions
    if decl is None or decl.path is None:
        raise TandemError(f"{bundle_dir}: no --assertions given and the recording declared no pack")
    path = Path(decl.path)
    if not path.is_file():
        raise TandemError(f"{path}: the pack {bundle_dir} declared is gone (give --assertions)")
    if pack_identity(path).sha256 != decl.sha256:
        raise TandemError(f"{path}: changed since {bundle_dir} declared it "
                          f"(sha256 {(decl.sha256 or '')[:12]}...); give --assertions explicitly")
    return path


def symbol_sources(kern: Kernel) -> list:
    """What the parser checks names against: System.map's text symbols and the
    loaded modules' functions."""
    mods = {f.name for img in kern.images[1:] for f in img.funcs}
    return [kern.system_map, mods]


def load_pack(path: str | Path, kern: Kernel, select: list[str] | None = None) -> AssertionSet:
    try:
        aset = parse_file(path, symbols=symbol_sources(kern))
    except AssertionLangError as e:
        if "unknown symbol" in e.msg and len(kern.images) == 1:
            raise AssertionLangError(e.file, e.line, e.col, e.msg + " (the recording's console names "
                                     "no loaded module: its module symbols are unknown)") from None
        raise
    if select:
        aset = aset.select(select)
    for a in aset.assertions:          # a site must be an instruction of this kernel
        for f in (a.bound, a.site.func, *(e.func for e in a.events())):
            if f not in kern.function_names:
                raise TandemError(f"{a.file}:{a.line}:{a.col}: {f} is a symbol of this kernel "
                                  f"but not a function with a known size (cannot be watched)")
        if a.site.offset is not None:
            try:
                trace.site_address(kern, a.site.func, a.site.offset)
            except TandemError as e:
                raise TandemError(f"{a.file}:{a.site.line}:{a.site.col}: {e}") from None
    if not len(aset):
        raise TandemError(f"{path}: no assertions to check")
    return aset


# --- attribution to the recorded inputs -------------------------------------------


@dataclass
class Request:
    """The recorded input delivered last before an event."""
    kind: str
    vm_ns: int
    icount: int | None
    flow: int | None
    offset: int
    seq: int
    text: str                   # the client's line(s), for TCP data

    def describe(self) -> str:
        where = (f"flow {self.flow} offset {self.offset}" if self.flow is not None else self.kind)
        line = f": {self.text!r}" if self.text else ""
        return f"{self.kind} at VM {self.vm_ns / 1e9:.6f}s ({where}, devlog event {self.seq}){line}"


class Inputs:
    """The bundle's inputs with the instruction count at which each arrived."""

    def __init__(self, bundle_dir: str | Path):
        events = pcapng.read_devlog(Path(bundle_dir) / bundle.DEVLOG).events
        icount = {e.seq: e.icount for e in events}
        # entropy is not a request: skip it, as findings.py does
        self.items = [(icount.get(i.seq), i) for i in inputs.from_events(events).inputs if i.kind != "rng"]

    def before(self, ev: Event) -> Request | None:
        """The last input that arrived before the event's instruction ran (by instruction
        count; by VM time for an input logged without one)."""
        last = None
        for ic, i in self.items:
            if (ic > ev.icount) if ic is not None else (i.vm_ns > ev.vm_ns):
                break
            last = (ic, i)
        if last is None:
            return None
        ic, i = last
        text = i.data.decode(errors="replace").strip() if i.kind == "tcp-data" else ""
        return Request(i.kind, i.vm_ns, ic, i.flow, i.offset, i.seq, text[:200])


# --- a violation with its context --------------------------------------------------


@dataclass
class Frame:
    addr: int
    symbol: str
    lines: list[tuple[str, str, int]] = field(default_factory=list)
    reliable: bool = True       # found by the ORC unwinder (else a return-address-like word)

    def text(self) -> str:
        loc = ""
        if self.lines:
            _, file, line = self.lines[-1]          # the outermost: the function itself
            loc = f"  {short_path(file)}:{line}"
            inl = [f for f, _, _ in self.lines[:-1]]
            if inl:
                loc += f" (inlined: {', '.join(inl)})"
        return f"{'' if self.reliable else '? '}{self.symbol}{loc}"


@dataclass
class Report:
    violation: Violation
    comm: str
    stack: list[Frame]
    code_at: str                # where the disassembly is centred ("tb_proc_write+0x4d7")
    code: list[tuple[int, str, bool]]
    request: Request | None

    @property
    def fatal(self) -> bool:
        return self.violation.fatal

    def to_dict(self) -> dict:
        d = self.violation.to_dict()
        d.update(comm=self.comm,
                 stack=[{"addr": f.addr, "symbol": f.symbol, "reliable": f.reliable,
                         "lines": [list(x) for x in f.lines]} for f in self.stack],
                 code_at=self.code_at,
                 code=[{"addr": a, "insn": t, "here": h} for a, t, h in self.code],
                 request=self.request.__dict__ if self.request else None)
        return d


def _context(v: Violation, kern: Kernel, comm: str, exact: int, ins: Inputs) -> Report:
    ev = v.event
    # The event's own pc first (where it happened), then the return addresses.
    lines = kern.lines([ev.pc] + [a - 1 for a in ev.stack])
    stack = [Frame(ev.pc, kern.describe(ev.pc), lines[ev.pc])]
    stack += [Frame(a, kern.describe(a), lines[a - 1], k < exact) for k, a in enumerate(ev.stack)]
    # The call site: the call that entered the function (call and return events), or
    # the site instruction itself.
    center = ev.pc
    if ev.kind in ("call", "return") and ev.stack:
        call = kern.call_before(ev.stack[0])
        if call is not None:
            center = call.address
    return Report(v, comm, stack, kern.describe(center), kern.around(center), ins.before(ev))


# --- running ----------------------------------------------------------------------


@dataclass
class Result:
    bundle: Path
    pack: Path
    aset: AssertionSet
    reports: list[Report]
    trace: trace.Trace
    checker_stats: dict
    check_s: float

    @property
    def fatal(self) -> int:
        return sum(r.fatal for r in self.reports)

    def to_json(self) -> str:
        t = self.trace
        return json.dumps({
            "bundle": str(self.bundle), "pack": str(self.pack), "assertions": self.aset.names(),
            "replay": {"ok": t.verdict.ok, "summary": t.verdict.summary(), "wall_s": t.wall_s},
            "events": len(t.events), "plugin": t.stats, "checker": self.checker_stats,
            "violations": [r.to_dict() for r in self.reports]}, indent=2)


def check(bundle_dir: str | Path, pack: str | Path | None = None, *, select: list[str] | None = None,
          progress=None) -> Result:
    d = Path(bundle_dir)
    bundle.load_manifest(d)
    pack = Path(pack) if pack else declared_pack(d)
    kern = trace.kernel_for_bundle(d)
    aset = load_pack(pack, kern, select)
    p = trace.plan(kern, aset.needed(), aset.sites())
    t = trace.run(d, kern, p, progress=progress)
    if not t.verdict.ok:
        raise InfraError(f"{d}: the replay with the assertion plugin did not verify "
                         f"({t.verdict.summary()}): its events cannot be trusted")
    t0 = time.perf_counter()
    chk = Checker(aset)
    found: list[tuple[int, Violation]] = []
    for i, ev in enumerate(t.events):
        for v in chk.feed(ev):
            found.append((i, v))
    found += [(len(t.events) - 1, v) for v in chk.finish()]
    check_s = time.perf_counter() - t0
    ins = Inputs(d)
    index = {id(ev): i for i, ev in enumerate(t.events)}
    reports = []
    for i, v in found:
        j = index.get(id(v.event), i)     # finish() may report at the last event
        reports.append(_context(v, kern, t.comms[j], t.exact[j][0], ins))
    return Result(d, pack, aset, reports, t, chk.stats.to_dict(), check_s)


def render(res: Result, out) -> None:
    """Print violations, then a one-line summary, on a rich console."""
    for r in res.reports:
        v = r.violation
        ev = v.event
        head = "VIOLATION" if v.fatal else "guideline"
        color = "red" if v.fatal else "yellow"
        out.print(f"[bold {color}]{head}[/] [bold]{v.assertion}[/] ({v.scope} {v.mode}): {v.reason}",
                  markup=True, highlight=False)
        p = out.print
        args = ", ".join(f"{a:#x}" for a in ev.args)
        ret = f" = {ev.ret:#x}" if ev.ret is not None else ""
        p(f"  event: {ev.kind} {ev.func}({args}){ret} at {ev.pc:#x}", markup=False)
        st = v.state
        if st["matched"]:
            p("  automaton matched: " + "; ".join(m.get("event", "?") for m in st["matched"]), markup=False)
        if st["expected"]:
            p("  automaton expected: " + ", ".join(st["expected"]), markup=False)
        if st["bindings"]:
            p("  bindings: " + ", ".join(f"{k}={val:#x}" for k, val in st["bindings"].items()), markup=False)
        if st["found"]:
            p(f"  found instead: {st['found'].get('event')}", markup=False)
        p(f"  thread: task {v.task:#x}" + (f" ({r.comm})" if r.comm else ""), markup=False)
        p(f"  VM time {v.vm_ns / 1e9:.9f}s, instruction count {v.icount}", markup=False)
        p("  after input: " + (r.request.describe() if r.request else "none (before the first input)"),
          markup=False)
        p("  call stack:", markup=False)
        for k, f in enumerate(r.stack):
            p(f"    #{k} {f.text()}", markup=False)
        if r.code:
            p(f"  code around {r.code_at}:", markup=False)
            for a, text, here in r.code:
                p(f"    {'=>' if here else '  '} {a:#x}  {text}", markup=False)
    t = res.trace
    for note in t.plan.notes:
        out.print(f"  note: {note}", markup=False, highlight=False)
    lost = {k: t.stats[k] for k in ("abandoned_frames", "read_failures", "depth_overflows") if t.stats.get(k)}
    if lost:
        out.print("  note: the plugin " + ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in lost.items()) +
                  " (docs/assertions-running.md, Limits)", markup=False, highlight=False)
    n = len(res.reports)
    out.print(("[bold red]VIOLATED" if res.fatal else "[bold green]HELD") +
              f"[/]: {n} violation(s) ({res.fatal} fatal) of {len(res.aset)} assertion(s) over "
              f"{len(t.events)} events; replay {t.verdict.summary().split(':', 1)[0]} in {t.wall_s:.1f}s, "
              f"automata {res.check_s:.2f}s", markup=True, highlight=False)
