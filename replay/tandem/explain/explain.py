"""`tandem explain`: did the native make the bad access an analysis VM reported?

    e = explain(bundle, finding)        # a Finding of findings.jsonl
    print(render(e)); json.dumps(e.to_json())

The native's recording is replayed exactly. The tandem-stop plugin stops it at the first
entry, at or after the VM time of the input the finding is attributed to, of the kernel
function the report names (its address from the native's own vmlinux and modules); from
there Unicorn re-executes the function until it returns (explain/window.py), hooking every
memory access. The tandem-calls plugin, in the same replay, records every slab allocation
and free of the native (explain/heap.py), so each access is placed as KASAN places it: in
or past which object, live or freed, allocated and freed by whom and when. The verdict
compares the native's accesses with the report's (kasan.py). When the first call makes no
such access, the next calls are looked at, up to MAX_WINDOWS.
"""
from __future__ import annotations

import json
import re
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import artifacts
import tandem.assertions.trace as trace
from ..assertions.kernel import Kernel
from ..errors import InfraError, TandemError
from ..exact.replay import Verdict
from ..machine import ICOUNT_SHIFT
from ..semantic import inputs
from ..semantic.findings import Finding
from . import kasan, native, window
from .heap import ALLOCS, FREES, Heap, Place
from .stop import StopClient, StopError

MAX_WINDOWS = 8          # calls of the function looked at after the input
CONNECT_S = 120          # QEMU's start, until the plugin listens


class ExplainError(TandemError):
    """A finding tandem cannot explain on the native (said why, in one line)."""


@dataclass
class Matched:
    """An access of the native's window, placed in its heap."""
    step: int
    pc: int
    where: str               # symbol+offset
    line: str                # file:line
    kind: str
    addr: int
    size: int
    icount: int
    place: str               # Place.describe(), "" when not in a heap object
    offset: int | None = None
    region: int | None = None
    state: str = ""
    allocated_by: str = ""
    allocated_icount: int | None = None
    freed_by: str = ""
    freed_icount: int | None = None
    freed_vm_ns: int | None = None


@dataclass
class Explanation:
    bundle: str
    finding: int
    title: str
    analysis: str
    function: str
    input: str
    input_ns: int
    expected: dict                     # what the report says (kasan.Expected), {} when not KASAN
    windows: list[dict] = field(default_factory=list)
    same: bool | None = None           # the native made the same kind of access
    verdict: str = ""
    access: Matched | None = None
    replay: str = ""                   # the exact replay's verdict
    replay_ok: bool = False
    to_stop_s: float = 0.0             # from QEMU's start until the replay reached the window
    explain_s: float = 0.0             # from the stop until the last window was done
    emulated: int = 0
    emulate_s: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


# --- the finding -----------------------------------------------------------------


def load_finding(path: Path, n: int) -> Finding:
    """Finding n (1-based, in file order) of a findings.jsonl."""
    try:
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    except OSError as e:
        raise TandemError(f"{path}: cannot read the findings ({e.strerror})") from None
    if not 1 <= n <= len(lines):
        raise TandemError(f"{path}: no finding {n} (it has {len(lines)}: 1 to {len(lines)})")
    try:
        d = json.loads(lines[n - 1])
        d["locations"] = [tuple(x) for x in d.get("locations", [])]
        return Finding(**d)
    except (ValueError, TypeError) as e:
        raise TandemError(f"{path}: finding {n} is not a finding ({e})") from None


_IN = re.compile(r" in ([A-Za-z_][A-Za-z0-9_.]*)")


def function_of(f: Finding) -> str:
    """The kernel function the report names: its first symbolized frame, else the title's."""
    if f.locations:
        return f.locations[0][0]
    m = _IN.search(f.title)
    if m is None or f.type in ("VM-CRASH", "ASAN"):
        raise ExplainError(f"finding {f.title!r} names no kernel function (nothing of the native's "
                           f"kernel to stop at)")
    return m.group(1)


def input_time(bundle: Path, f: Finding) -> int:
    """The native's VM time from which the function is looked for: that of the earliest of
    the inputs the finding came after (after_input, and those delivered just before it: an
    analysis kernel slower than the native takes several inputs in a row, and the one that
    reached the bug need not be the last; the calls in between are looked at in turn)."""
    if f.input_flow is None and f.input_channel is None:
        return 0
    said = [f.after_input, *f.before]
    times = {i.describe(): i.vm_ns for i in inputs.load(bundle).inputs}
    found = [times[x] for x in said if x in times]
    for x in said:
        m = re.search(r"at VM ([0-9.]+)s", x)
        if x not in times and m:
            found.append(int(float(m.group(1)) * 1e9) - 1000)     # printed to the microsecond
    if not found:
        raise ExplainError(f"{bundle}: the input {f.after_input!r} is not in this recording")
    return min(found)


# --- running -----------------------------------------------------------------------


def _heap_plan(kern: Kernel) -> trace.Plan:
    needed = {name: {"return"} for name in ALLOCS if name in kern.function_names}
    needed.update({name: {"call"} for name in FREES if name in kern.function_names})
    return trace.plan(kern, needed)


def explain(bundle: Path, f: Finding, n: int = 0, progress=None, vmlinux: Path | None = None) -> Explanation:
    """Explain finding f (number n) of an analysis of the recording `bundle` on its native
    (vmlinux: the native's kernel, when tandem did not build it)."""
    bundle = Path(bundle)
    name = function_of(f)
    nat = native.find(bundle, vmlinux)
    kern = nat.load()
    module = None           # the module, not placed yet, that holds the function
    if name not in kern.function_names:
        module = nat.module_of(name)
        if module is None:
            raise ExplainError(f"{name}: not a function of the native's kernel or its modules: the native "
                               f"cannot have run it (the analysis kernel's config or code has it, the "
                               f"native's has not)")
    func = kern.function(native.LOADER if module else name)
    t_in = input_time(bundle, f)
    e = Explanation(str(bundle), n, f.title, f.analysis, name, f.after_input, t_in,
                    asdict(x) if (x := kasan.expected(f.text)) else {})
    plan = _heap_plan(kern)
    tmp = Path(tempfile.mkdtemp(prefix="tandem-explain-"))
    sock = tmp / "stop.sock"
    stop_args = ",".join([artifacts.plugin_stop()["plugin"], f"entry={func.addr:#x}", f"size={func.size}",
                          f"after={0 if module else t_in}", f"shift={ICOUNT_SHIFT}", f"sock={sock}"])
    client = StopClient(sock)
    out: dict = {}
    done = threading.Event()

    def replaying() -> None:
        try:
            out["trace"] = trace.run(bundle, kern, plan, scan=1, extra=["-plugin", stop_args],
                                     progress=progress)
        except (TandemError, OSError) as ex:        # carried to the caller's thread
            out["error"] = ex
        finally:
            done.set()

    t0 = time.monotonic()
    th = threading.Thread(target=replaying, name="explain-replay", daemon=True)
    th.start()
    stop_error: StopError | None = None
    try:
        client.connect(CONNECT_S, alive=lambda: not done.is_set())
        stop = client.first()
        if module is not None and stop is not None:
            kern, stop = _place(client, stop, nat, module, kern)
            func = kern.function(name)
            stop = client.arm(func.addr, func.size, t_in)
        e.to_stop_s = time.monotonic() - t0
        t1 = time.monotonic()
        wins = _windows(client, stop, func, kern, e.expected)
        e.explain_s = time.monotonic() - t1
    except StopError as err:      # the replay's own failure, when it has one, says why
        stop_error = err
    finally:
        client.detach()
        th.join()
        shutil.rmtree(tmp, ignore_errors=True)
    if "error" in out:
        raise out["error"]
    if stop_error is not None:
        raise stop_error
    if "trace" not in out:
        raise InfraError("the exact replay's thread failed (its traceback is above)")
    tr: trace.Trace = out["trace"]
    _judge(e, wins, tr, kern)
    v: Verdict = tr.verdict
    e.replay_ok, e.replay = v.ok, v.summary()
    return e


def _place(client: StopClient, stop, nat: native.Native, module: str, kern: Kernel):
    """Run the replay through the module loader until `module` is initialised; the kernel
    with it placed, and the stop there."""
    offsets = native.module_offsets(nat.vmlinux, kern)
    loader = kern.function(native.LOADER)
    while stop is not None:
        secs = native.placed_module(client, client.regs()["rdi"], module, nat.kos[module], offsets)
        if secs:
            return nat.load(((module, str(nat.kos[module]), secs),)), stop
        stop = client.go([(loader.addr, 0)])
    raise ExplainError(f"module {module}: the native never loaded it (its function cannot have run)")


def _windows(client: StopClient, stop, func, kern: Kernel, expected: dict) -> list[window.Window]:
    """The function's calls from the first stop on, each re-executed, until one made an access
    that may be the report's (any access at all, for a report that is not KASAN's), up to
    MAX_WINDOWS, or the replay's end."""
    wins: list[window.Window] = []
    while stop is not None and len(wins) < MAX_WINDOWS:
        w = window.run(client, stop, func.addr, func.addr + func.size, func.name, kern.return_thunk)
        wins.append(w)
        if _plausible(w, expected) if expected else w.accesses:
            break           # the heap is known once the replay has ended: judged then
        stop = client.go([(func.addr, 0)])
    return wins


STACK_NEAR = 16 << 10           # a kernel thread's stack is 16 KiB on x86-64
KERNEL_IMAGE = 0xFFFFFFFF80000000


def _plausible(w: window.Window, exp: dict) -> bool:
    """Could an access of the window be the report's: its kind and size, and neither on the
    thread's stack nor in the kernel's or a module's image (a slab object is in neither)?"""
    return any(a.kind == exp["kind"] and a.size == exp["size"] and a.addr < KERNEL_IMAGE
               and abs(a.addr - w.entry_rsp) >= STACK_NEAR for a in w.accesses)


def _caller(kern: Kernel):
    def caller(ev) -> str:
        return kern.describe(ev.stack[0]) if ev.stack else ""
    return caller


def _judge(e: Explanation, wins: list[window.Window], tr: trace.Trace, kern: Kernel) -> None:
    heap = Heap(tr.events, _caller(kern))
    lines = kern.lines(sorted({s.pc for w in wins for s in w.steps}))
    best: Matched | None = None
    for w in wins:
        placed = []
        for a in w.accesses:
            step = w.steps[a.step] if 0 <= a.step < len(w.steps) else None
            icount = step.icount if step and step.icount is not None else w.entry.icount
            p = heap.at(a.addr, icount)
            m = _matched(a, p, icount, kern, lines)
            placed.append(m)
            if best is None and e.expected and kasan.same(e.expected, m):
                best = m
        e.windows.append(_window_json(w, placed, kern, lines))
        e.emulated += w.emulated
        e.emulate_s += w.emulate_s
    if not wins:
        e.same = False
        e.verdict = (f"the native did not make it: {e.function} did not run after the input "
                     f"(VM {e.input_ns / 1e9:.6f}s) before the recording ended")
        return
    if not e.expected:
        e.verdict = f"not a KASAN report: the native's {e.function} is traced, not judged"
        return
    exp = e.expected
    if best is not None:
        e.same, e.access = True, best
        e.verdict = (f"the native made the same access: a {best.size}-byte {best.kind} at "
                     f"{best.where} ({best.line}), {best.place}, at instruction {best.icount} "
                     f"(VM {_vm_of(wins, best):.6f}s); KASAN: {kasan.describe(exp)}")
        return
    bad = [m for w in e.windows for m in w["accesses"] if m["state"] == "freed" or
           (m["region"] is not None and m["offset"] is not None and m["offset"] >= m["region"])]
    e.same = False
    first = wins[0]
    e.verdict = (f"the native did not make it: {len(wins)} call(s) of {e.function} after the input "
                 f"(the first at instruction {first.entry.icount}, VM {first.entry.vm_ns / 1e9:.6f}s) "
                 f"made {sum(len(w.accesses) for w in wins)} memory accesses, "
                 + (f"{len(bad)} of them to memory KASAN would flag, none of them the report's" if bad
                    else "none out of bounds or to freed memory")
                 + f"; KASAN: {kasan.describe(exp)}: the analysis diverged from the native before it")


def _vm_of(wins: list[window.Window], m: Matched) -> float:
    """The VM time of an access, from its window's entry: a running vCPU's clock moves with its
    instructions (no idle warp happens inside a window)."""
    w = max((w for w in wins if w.entry.icount <= m.icount), key=lambda w: w.entry.icount, default=None)
    return 0.0 if w is None else (w.entry.vm_ns + ((m.icount - w.entry.icount) << ICOUNT_SHIFT)) / 1e9


def _line(lines: dict, pc: int) -> str:
    loc = lines.get(pc) or []
    if not loc:
        return ""
    _, path, ln = loc[0]
    return f"{Path(path).name}:{ln}"


def _matched(a: window.Access, p: Place | None, icount: int, kern: Kernel, lines: dict) -> Matched:
    m = Matched(a.step, a.pc, kern.describe(a.pc), _line(lines, a.pc), a.kind, a.addr, a.size, icount,
                p.describe() if p else "")
    if p is not None:
        o = p.obj
        m.offset, m.region, m.state = p.offset, o.size, p.state
        m.allocated_by, m.allocated_icount = o.by, o.icount
        m.freed_by, m.freed_icount, m.freed_vm_ns = o.freed_by, o.freed_icount, o.freed_vm_ns
    return m


_TARGET = re.compile(r"\b0x(ffffffff[0-9a-f]{8})\b")


def _named(text: str, kern: Kernel) -> str:
    """An instruction's text with a kernel address it names followed by its symbol."""
    m = _TARGET.search(text)
    if m is None:
        return text
    where = kern.describe(int(m.group(1), 16))
    name = where.split("/")[0].removesuffix("+0x0")
    return text if where.startswith("0x") else f"{text} <{name}>"


def _window_json(w: window.Window, placed: list[Matched], kern: Kernel, lines: dict) -> dict:
    return {"entry": asdict(w.entry), "end": _named(w.end, kern), "exit": asdict(w.exit) if w.exit else None,
            "emulated": w.emulated, "stepped_over": w.stepovers, "outside": w.outside, "pages": w.pages,
            "emulate_s": w.emulate_s,
            "mismatches": w.mismatches,
            "steps": [{"pc": s.pc, "where": kern.describe(s.pc), "line": _line(lines, s.pc), "text": _named(s.text, kern),
                       "icount": s.icount, "stepped": s.stepped} for s in w.steps],
            "accesses": [asdict(m) for m in placed]}


def explain_all(bundle: Path, findings: Path, progress=None) -> list[dict]:
    """The summary's section: each distinct finding (by title, its first line in findings)
    that names a kernel function, explained on the native; what could not be, with why."""
    out: list[dict] = []
    seen: set[str] = set()
    try:
        lines = [ln for ln in findings.read_text().splitlines() if ln.strip()]
    except OSError:
        return out
    for n in range(1, len(lines) + 1):
        f = load_finding(findings, n)
        if f.title in seen:
            continue
        seen.add(f.title)
        try:
            name = function_of(f)
        except ExplainError:
            continue            # no kernel function: nothing of the native's kernel to look at
        if progress:
            progress(n, f.title)
        entry = {"finding": n, "title": f.title, "analysis": f.analysis, "function": name}
        try:
            e = explain(bundle, f, n)
            entry.update(same=e.same, verdict=e.verdict, replay_ok=e.replay_ok)
        except TandemError as err:
            entry.update(same=None, verdict=f"not explained: {err}", replay_ok=None)
        out.append(entry)
    return out

