"""`tandem plan`: how much input buffer an analysis needs, by FreeDA's model.

FreeDA (Pina, Andronidis, Cadar; CF'18), section 3, equation 2. A native issues N_T
requests during a period T over which the analysis keeps up on average, each request
makes S_req buffer entries of N_sys slots each, and the analysis is F times slower than
the native. The analysis then needs

    B = (N_T * S_req - N_T / F * S_req + S_req) * N_sys

entries: the native's N_T requests, less the N_T / F the analysis has consumed
meanwhile, plus the one it is consuming.

In tandem the buffer holds the native's inputs that an analysis VM has not taken yet
(semantic.model.Buffer). That is one entry per input (N_SYS = 1): network, serial and
datagram inputs. Entropy goes to the analysis at once and never waits in the buffer.
From a recording, this module measures:

- S_req: inputs and bytes per request.
- N_T, unless given: the most requests the native issued before an analysis F times
  slower caught up.
- The boot backlog: the inputs that arrive while an analysis started with the native is
  still booting. The paper's model leaves this out; a live run from boot holds it on
  top.

F is given, or measured from a finished semantic replay. docs/plan.md has the details.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .formats import bundle
from .semantic import inputs
from .errors import TandemError

N_SYS = 1                   # buffer entries per input
EQUATION = "B = (N_T*S_req - N_T/F*S_req + S_req) * N_sys"
READY = b"TANDEM-READY"     # the guest agent's line once the service listens
BASE = "native"             # the null analysis: the native kernel, replayed as the analyses are


def equation2(n_t: float, s_req: float, f: float, n_sys: float = N_SYS) -> float:
    """FreeDA's equation 2, as printed. An analysis no slower than the native (F <= 1)
    consumes each request as it comes. At F = 1 the N_T terms cancel, and below it they
    would go negative, so the buffer is then one request: S_req * N_sys."""
    if n_t <= 0 or f <= 0:
        raise TandemError(f"the model needs N_T > 0 and F > 0 (got N_T={n_t}, F={f})")
    trailing = max(0.0, n_t * s_req - n_t / f * s_req)
    return (trailing + s_req) * n_sys


def entries(x: float) -> int:
    """Whole entries that hold x. Float error must not add one: 8.000000001 is 8."""
    return math.ceil(x - 1e-9)


@dataclass
class Request:
    """One request: a turn of client data on a connection, which the guest answers
    before the client sends more. Pipelined lines sent at once are one turn."""
    flow: int
    start_ns: int
    end_ns: int                 # the guest's last output before the flow's next request
    events: int = 0             # inputs
    bytes: int = 0              # their payload
    work_ns: float = 0.0        # the native's time spent on it: its share of [start, end]


@dataclass
class Workload:
    """What a recording says about its requests."""
    requests: list[Request]     # in order of arrival
    flows: int
    vm_ns: int
    ready_ns: int               # the native was booted and serving (TANDEM-READY)
    ready_source: str
    buffered: list[tuple[int, int]]     # (VM ns, bytes) of every input that waits in a buffer
    background_events: int      # serial and datagram inputs, outside any connection
    background_bytes: int
    entropy_events: int         # never buffered
    peak_concurrency: int       # requests the native had in progress at once

    def per_request(self, stat: str) -> tuple[float, float]:
        """(events, bytes) per request: 'mean' or 'max'."""
        ev = [r.events for r in self.requests]
        by = [r.bytes for r in self.requests]
        if stat == "max":
            return float(max(ev)), float(max(by))
        return sum(ev) / len(ev), sum(by) / len(by)

    def busy_period_requests(self, f: float) -> int:
        """N_T for an analysis F times slower than the native: the most requests the
        native issued within one busy period of the analysis. A busy period runs from a
        request that finds the analysis idle until the analysis has caught up. Each
        request costs the analysis F times the native's time for it (work_ns: not its
        latency, which counts the native's time on the requests in progress with it
        once for each of them). Boot is left out: that is the boot backlog."""
        free_at, n, most = -math.inf, 0, 0
        for r in self.requests:
            if r.start_ns >= free_at:
                n = 0               # caught up: a new period
            n += 1
            most = max(most, n)
            free_at = max(free_at, r.start_ns) + f * r.work_ns
        return max(1, most)

    def boot_backlog(self, f: float) -> tuple[int, int]:
        """(inputs, bytes) that arrive before an analysis started with the native has
        booted: F times the native's boot."""
        until = f * self.ready_ns
        got = [b for ns, b in self.buffered if ns < until]
        return len(got), sum(got)


def measure(rec: inputs.RecordedInputs) -> Workload:
    by_flow: dict[int, list[inputs.Input]] = {}
    background = background_bytes = entropy = 0
    buffered = []
    for i in rec.inputs:
        if i.kind == "rng":
            entropy += 1
            continue
        buffered.append((i.vm_ns, len(i.data)))
        if i.flow is None:
            background += 1
            background_bytes += len(i.data)
        else:
            by_flow.setdefault(i.flow, []).append(i)
    requests: list[Request] = []
    for index, ins in sorted(by_flow.items()):
        flow = rec.flows[index]     # a finished recording's (never retired: live.shadow)
        out_ns = [ns for ns, _ in flow.guest_data] if flow else []
        requests += _turns(index, ins, out_ns)
    requests.sort(key=lambda r: (r.start_ns, r.flow))
    _share_time(requests)
    end = rec.end_ns or max([r.end_ns for r in requests] + [i.vm_ns for i in rec.inputs] + [0])
    ready, source = _ready(rec, requests)
    return Workload(requests, len(by_flow), end, ready, source, buffered, background,
                    background_bytes, entropy, _peak(requests))


def _ready(rec: inputs.RecordedInputs, requests: list[Request]) -> tuple[int, str]:
    """When the native was booted: its agent's READY line, else its first request."""
    tail = b""
    for ns, data in rec.serial_out:
        tail = (tail + data)[-(len(READY) + len(data)):]
        if READY in tail:
            return ns, "the guest's TANDEM-READY line"
    if requests:
        return requests[0].start_ns, "its first request (no TANDEM-READY line on its console)"
    return 0, "unknown (no TANDEM-READY line, no request)"


def _turns(flow: int, ins: list[inputs.Input], out_ns: list[int]) -> list[Request]:
    """A flow's inputs cut into requests. The connection's opening counts with the
    first request and its close with the last; a connection without data is one request."""
    turns: list[Request] = []
    last_data: int | None = None
    pending: list[inputs.Input] = []   # inputs before the first data (the opening)
    for i in ins:
        if i.kind == "tcp-data":
            # Answered since the last data: an output at this input's own VM time came
            # before it (a reply takes instructions, and so VM time).
            answered = last_data is not None and any(last_data < t <= i.vm_ns for t in out_ns)
            if not turns or answered:
                turns.append(Request(flow, (pending[0] if pending else i).vm_ns, i.vm_ns))
                for p in pending:
                    turns[-1].events += 1
                    turns[-1].bytes += len(p.data)
                pending = []
            last_data = i.vm_ns
            cur = turns[-1]
        elif turns:
            cur = turns[-1]
        else:
            pending.append(i)
            continue
        cur.events += 1
        cur.bytes += len(i.data)
    if not turns and pending:
        turns.append(Request(flow, pending[0].vm_ns, pending[-1].vm_ns, len(pending),
                             sum(len(p.data) for p in pending)))
    # A request lasts until the guest's last output before the next one starts (an
    # output at the next one's VM time came before it, as above).
    for k, r in enumerate(turns):
        limit = turns[k + 1].start_ns if k + 1 < len(turns) else math.inf
        outs = [t for t in out_ns if r.start_ns < t <= limit]
        r.end_ns = max([r.end_ns, *outs])
    return turns


def _share_time(requests: list[Request]) -> None:
    """Each request's work_ns: its span [start, end] with every stretch of it split
    evenly among the requests in progress then (processor sharing). Together they are
    the time the native had any request in progress, counted once."""
    edges = sorted({t for r in requests for t in (r.start_ns, r.end_ns)})
    starts = sorted(requests, key=lambda r: r.start_ns)
    active: list[Request] = []
    k = 0
    for lo, hi in zip(edges, edges[1:]):
        while k < len(starts) and starts[k].start_ns <= lo:
            active.append(starts[k])
            k += 1
        active = [r for r in active if r.end_ns > lo]
        if active:
            share = (hi - lo) / len(active)
            for r in active:
                r.work_ns += share


def _peak(requests: list[Request]) -> int:
    """The most requests in progress at one VM time."""
    edges = sorted([(r.start_ns, 1) for r in requests] + [(r.end_ns, -1) for r in requests],
                   key=lambda e: (e[0], -e[1]))      # touching requests overlap
    now = peak = 0
    for _, d in edges:
        now += d
        peak = max(peak, now)
    return peak


@dataclass
class Slowdown:
    f: float
    source: str
    analysis: str | None = None
    analysis_wall_s: float | None = None
    base_wall_s: float | None = None
    base: str = ""


def slowdowns_from(workdir: Path, manifest: dict, analysis: str | None) -> list[Slowdown]:
    """F for each analysis of a finished semantic replay (`tandem replay --analysis`),
    from WORKDIR/summary.json. Only runs that reached the end count.

    The base is the replay's run of the native kernel (the `native` analysis), if it has
    one: same inputs, same replay, same skipping of idle time (sleep=off), so F is the
    analysis kernel's slowdown alone. Otherwise the base is the native recording's wall
    time from its manifest. The recording waited out its idle time and the analysis did
    not, so that F is too low for an idle-heavy recording.
    """
    path = Path(workdir) / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except FileNotFoundError:
        raise TandemError(f"{path}: not found (run tandem replay BUNDLE --analysis NAME --workdir DIR)") from None
    except json.JSONDecodeError as e:
        raise TandemError(f"{path}: unreadable ({e})") from None
    runs = summary.get("analyses", [])
    live_cpu = (summary.get("live") or {}).get("native_cpu_s")
    if live_cpu:
        # A live run (tandem shadow): every VM ran as long as the native, so wall times
        # say nothing; F is the analysis QEMU's CPU time over the native QEMU's, for the
        # same inputs (idle costs neither: the native sleeps, the analysis warps).
        rows = [a for a in runs if analysis is None or a.get("analysis") == analysis]
        if not rows:
            raise TandemError(f"{path}: no analysis {analysis!r}")
        out = []
        for a in rows:
            if a.get("outcome") not in ("finished", "poweroff") or not a.get("cpu_s"):
                raise TandemError(f"{path}: analysis {a.get('analysis')!r} did not finish "
                                  f"(outcome {a.get('outcome')!r}): no slowdown to measure")
            out.append(Slowdown(a["cpu_s"] / live_cpu, f"measured: {path}", a["analysis"], a["cpu_s"],
                                live_cpu, f"live run: {a['cpu_s']:.2f}s of CPU against the native "
                                          f"QEMU's {live_cpu:.2f}s"))
        return out
    done = [a for a in runs if a.get("outcome") in ("finished", "poweroff") and a.get("wall_s")]
    base = next((a for a in done if a.get("analysis") == BASE), None)
    if analysis is None:
        rows = [a for a in runs if not (base and a is base)]
    else:
        rows = [a for a in runs if a.get("analysis") == analysis]
    if not rows:
        known = ", ".join(a.get("analysis", "?") for a in runs)
        raise TandemError(f"{path}: no analysis {analysis or '(other than native)'!r} (it has: {known or 'none'})")
    if base and analysis != BASE:
        base_wall, how = base["wall_s"], f"the native kernel's replay took {base['wall_s']:.2f}s"
    else:
        base_wall = manifest.get("wall_time_s")
        if not base_wall:
            raise TandemError("the native bundle's manifest has no wall time (an unfinished recording?)")
        how = (f"the native recorded in {base_wall:.2f}s, idle included (replay --analysis "
               f"{BASE},... for a base without idle)")
    out = []
    for a in rows:
        if a not in done:
            raise TandemError(f"{path}: analysis {a.get('analysis')!r} did not finish "
                              f"(outcome {a.get('outcome')!r}): no slowdown to measure")
        out.append(Slowdown(a["wall_s"] / base_wall, f"measured: {path}", a["analysis"], a["wall_s"],
                            base_wall, how))
    return out


@dataclass
class Plan:
    bundle: str
    workload: dict
    s_req_events: float
    s_req_bytes: float
    stat: str
    boot: bool
    slowdowns: list[Slowdown]
    buffers: list[dict] = field(default_factory=list)   # one per slowdown

    @property
    def events(self) -> int:
        return max(b["events"] for b in self.buffers)

    @property
    def bytes(self) -> int:
        return max(b["bytes"] for b in self.buffers)

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(equation=EQUATION, n_sys=N_SYS, events=self.events, bytes=self.bytes)
        return d


def plan(bundle_dir: str | Path, *, slowdown: float | None = None, concurrency: int | None = None,
         from_workdir: str | Path | None = None, analysis: str | None = None,
         stat: str = "mean", boot: bool = True) -> Plan:
    bundle_dir = Path(bundle_dir)
    if (slowdown is None) == (from_workdir is None):
        raise TandemError("give the analysis slowdown: --slowdown F, or --from WORKDIR of a semantic replay")
    if slowdown is not None and slowdown <= 0:
        raise TandemError(f"--slowdown {slowdown}: must be positive")
    if concurrency is not None and concurrency < 1:
        raise TandemError(f"--concurrency {concurrency}: must be at least 1")
    manifest = bundle.load_manifest(bundle_dir)
    problems = [p for p in bundle.verify_files(bundle_dir, manifest) if p.file == bundle.DEVLOG]
    if problems:
        raise TandemError(problems[0].message)
    w = measure(inputs.load(bundle_dir))
    if not w.requests:
        raise TandemError(f"{bundle_dir}: no requests in the recording (no client connection to the guest)")
    ev, by = w.per_request(stat)
    if slowdown is not None:
        sds = [Slowdown(slowdown, "given", analysis)]
    elif from_workdir is not None:      # one of the two, checked above
        sds = slowdowns_from(Path(from_workdir), manifest, analysis)
    p = Plan(str(bundle_dir), {
        "requests": len(w.requests), "flows": w.flows, "vm_s": round(w.vm_ns / 1e9, 6),
        "ready_vm_s": round(w.ready_ns / 1e9, 6), "ready_source": w.ready_source,
        "events_per_request": {"mean": round(sum(r.events for r in w.requests) / len(w.requests), 3),
                               "max": max(r.events for r in w.requests)},
        "bytes_per_request": {"mean": round(sum(r.bytes for r in w.requests) / len(w.requests), 1),
                              "max": max(r.bytes for r in w.requests)},
        "peak_concurrency": w.peak_concurrency, "background_events": w.background_events,
        "background_bytes": w.background_bytes, "entropy_events": w.entropy_events},
        ev, by, stat, boot, sds)
    for sd in sds:
        n_t = concurrency or w.busy_period_requests(sd.f)
        eq_ev, eq_by = entries(equation2(n_t, ev, sd.f)), entries(equation2(n_t, by, sd.f))
        bl_ev, bl_by = w.boot_backlog(sd.f) if boot else (0, 0)
        p.buffers.append({"analysis": sd.analysis, "f": round(sd.f, 4), "n_t": n_t,
                          "n_t_source": "given" if concurrency else "measured",
                          "equation": {"events": eq_ev, "bytes": eq_by},
                          "boot_backlog": {"events": bl_ev, "bytes": bl_by,
                                           "until_vm_s": round(sd.f * w.ready_ns / 1e9, 6)},
                          "events": eq_ev + bl_ev, "bytes": eq_by + bl_by})
    return p


def render(p: Plan) -> str:
    w = p.workload
    lines = [f"tandem plan {p.bundle}: FreeDA equation 2, {EQUATION}",
             (f"  requests   {w['requests']} in {w['flows']} connection(s) over {w['vm_s']:.3f}s of VM time; "
             f"booted at {w['ready_vm_s']:.3f}s ({w['ready_source']})"),
             (f"  S_req      {p.s_req_events:.2f} inputs, {p.s_req_bytes:.1f} bytes per request ({p.stat}; "
              f"the largest: {w['events_per_request']['max']} inputs, {w['bytes_per_request']['max']} bytes)"),
             f"  N_sys      {N_SYS} (one buffer entry per input)",
             (f"  not in S_req: {w['background_events']} serial/datagram input(s) outside connections "
             f"({w['background_bytes']} bytes); {w['entropy_events']} entropy input(s), never buffered; "
             f"the native had at most {w['peak_concurrency']} request(s) in progress at once")]
    for sd, b in zip(p.slowdowns, p.buffers):
        who = f"{sd.analysis}: " if sd.analysis else ""
        if sd.source == "given":
            lines.append(f"{who}F {sd.f:.3f} (given)")
        else:
            took = "" if sd.base.startswith("live run") else f"replayed in {sd.analysis_wall_s:.2f}s wall; "
            lines.append(f"{who}F {sd.f:.3f} ({sd.source}: {took}{sd.base})")
        why = "given" if b["n_t_source"] == "given" else \
            "measured: the most requests the native issued before this analysis caught up"
        lines.append(f"  N_T        {b['n_t']} ({why})")
        lines.append(f"  equation 2 {b['equation']['events']} inputs, {b['equation']['bytes']} bytes")
        if p.boot:
            bl = b["boot_backlog"]
            lines.append(f"  boot       {bl['events']} inputs, {bl['bytes']} bytes arrive before it has booted "
                         f"(F x {w['ready_vm_s']:.3f}s = {bl['until_vm_s']:.3f}s of the native's VM time)")
        lines.append(f"  buffer needed: {b['events']} inputs, {b['bytes']} bytes")
    if len(p.buffers) > 1:
        lines.append(f"buffer for all of them (the largest): {p.events} inputs, {p.bytes} bytes")
    lines.append(f"  e.g. tandem shadow ... --buffer-events {p.events} --buffer-bytes {p.bytes}")
    return "\n".join(lines)
