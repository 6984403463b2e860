"""`tandem plan`: how much input buffer an analysis needs, by FreeDA's model.

FreeDA (Pina, Andronidis, Cadar; CF'18), section 3, equation 2: a native serving
N_T requests over a period T in which the load stays within what the analysis can
take, each request making S_req buffer entries of N_sys slots each, and an analysis
F times slower than the native, needs

    B = (N_T * S_req - N_T / F * S_req + S_req) * N_sys

entries: the native's N_T requests, less the N_T / F the analysis has consumed
meanwhile, plus the one it is consuming.

In tandem the buffer holds the native's inputs an analysis VM has not taken yet
(replay_semantic.Buffer): one entry per input (N_SYS = 1), the network, serial and
datagram inputs; entropy is handed to the analysis at once and never waits in it.
From a recording this measures S_req (inputs per request, and their bytes) and the
concurrency it saw; the slowdown F is given, or measured from a finished semantic
replay. docs/plan.md says what is measured and how.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import bundle, inputs
from .errors import TandemError

N_SYS = 1                   # buffer entries per input
EQUATION = "B = (N_T*S_req - N_T/F*S_req + S_req) * N_sys"
CONNECTION = ("tcp-open", "tcp-fin", "tcp-rst")


def equation2(n_t: float, s_req: float, f: float, n_sys: float = N_SYS) -> float:
    """FreeDA's equation 2, as printed. F <= 1 (an analysis no slower than the native)
    consumes each request as it comes: the N_T terms cancel at F = 1 and would go
    negative below it, so the buffer is then one request, S_req * N_sys."""
    if n_t <= 0 or f <= 0:
        raise TandemError(f"the model needs N_T > 0 and F > 0 (got N_T={n_t}, F={f})")
    trailing = max(0.0, n_t * s_req - n_t / f * s_req)
    return (trailing + s_req) * n_sys


@dataclass
class Request:
    """One request: a turn of client data on a connection that the guest answers
    before the client sends more (pipelined lines sent at once are one turn)."""
    flow: int
    start_ns: int
    end_ns: int                 # the guest's last output before the flow's next request
    events: int = 0             # inputs
    bytes: int = 0              # their payload


@dataclass
class Workload:
    """What a recording says about its requests."""
    requests: list[Request]
    flows: int
    vm_ns: int
    background_events: int      # serial and datagram inputs, outside any connection
    background_bytes: int
    entropy_events: int         # never buffered
    peak_concurrency: int

    def per_request(self, stat: str) -> tuple[float, float]:
        """(events, bytes) per request: 'mean' or 'max'."""
        ev = [r.events for r in self.requests]
        by = [r.bytes for r in self.requests]
        if stat == "max":
            return float(max(ev)), float(max(by))
        return sum(ev) / len(ev), sum(by) / len(by)


def measure(rec: inputs.Recording) -> Workload:
    by_flow: dict[int, list[inputs.Input]] = {}
    background = background_bytes = entropy = 0
    for i in rec.inputs:
        if i.kind == "rng":
            entropy += 1
        elif i.flow is None:
            background += 1
            background_bytes += len(i.data)
        else:
            by_flow.setdefault(i.flow, []).append(i)
    requests: list[Request] = []
    for index, ins in sorted(by_flow.items()):
        out_ns = [ns for ns, _ in rec.flows[index].guest_data]
        requests += _turns(index, ins, out_ns)
    end = rec.end_ns or max([r.end_ns for r in requests] + [i.vm_ns for i in rec.inputs] + [0])
    return Workload(requests, len(by_flow), end, background, background_bytes, entropy,
                    _peak(requests))


def _turns(flow: int, ins: list[inputs.Input], out_ns: list[int]) -> list[Request]:
    """A flow's inputs cut into requests. Connection set-up counts with the first
    request, the close with the last; a connection without data is one request."""
    turns: list[Request] = []
    last_data: int | None = None
    pending = []                # inputs before the first data (the open)
    for i in ins:
        if i.kind == "tcp-data":
            answered = last_data is not None and any(last_data < t < i.vm_ns for t in out_ns)
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
    # A request lasts until the guest's last output before the next one starts.
    for k, r in enumerate(turns):
        limit = turns[k + 1].start_ns if k + 1 < len(turns) else math.inf
        outs = [t for t in out_ns if r.start_ns <= t < limit]
        r.end_ns = max([r.end_ns] + outs)
    return turns


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
    analysis_vm_s: float | None = None
    native_wall_s: float | None = None
    native_vm_s: float | None = None


def slowdowns_from(workdir: Path, manifest: dict, analysis: str | None) -> list[Slowdown]:
    """F per analysis of a finished semantic replay (`tandem replay --analysis`): the
    wall time it took over the native recording's, from WORKDIR/summary.json and the
    native bundle's manifest. Only runs that reached the end count."""
    path = Path(workdir) / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except FileNotFoundError:
        raise TandemError(f"{path}: not found (run tandem replay BUNDLE --analysis NAME --workdir DIR)") from None
    except json.JSONDecodeError as e:
        raise TandemError(f"{path}: unreadable ({e})") from None
    native_wall, native_vm = manifest.get("wall_time_s"), (manifest.get("stop") or {}).get("vm_ns")
    if not native_wall or not native_vm:
        raise TandemError("the native bundle's manifest has no wall and VM time (an unfinished recording?)")
    rows = [a for a in summary.get("analyses", []) if analysis in (None, a.get("analysis"))]
    if not rows:
        known = ", ".join(a.get("analysis", "?") for a in summary.get("analyses", []))
        raise TandemError(f"{path}: no analysis {analysis!r} (it has: {known or 'none'})")
    out = []
    for a in rows:
        if a.get("outcome") not in ("finished", "poweroff") or not a.get("end_vm_ns") or not a.get("wall_s"):
            raise TandemError(f"{path}: analysis {a.get('analysis')!r} did not finish "
                              f"(outcome {a.get('outcome')!r}): no slowdown to measure")
        # The same inputs, start to end: the analysis took this many times the native's
        # wall time. (Not per VM second: VM time counts instructions under icount, and an
        # analysis kernel runs more of them for the same request.)
        f = a["wall_s"] / native_wall
        out.append(Slowdown(f, f"measured: {path}", a["analysis"], a["wall_s"], a["end_vm_ns"] / 1e9,
                            native_wall, native_vm / 1e9))
    return out


@dataclass
class Plan:
    bundle: str
    workload: dict
    n_t: int
    n_t_source: str
    s_req_events: float
    s_req_bytes: float
    stat: str
    slowdowns: list[Slowdown]
    buffers: list[dict] = field(default_factory=list)   # per slowdown: events, bytes

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
         stat: str = "mean") -> Plan:
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
    else:
        sds = slowdowns_from(Path(from_workdir), manifest, analysis)
    n_t = concurrency or w.peak_concurrency
    p = Plan(str(bundle_dir), {
        "requests": len(w.requests), "flows": w.flows, "vm_s": round(w.vm_ns / 1e9, 3),
        "events_per_request": {"mean": round(sum(r.events for r in w.requests) / len(w.requests), 3),
                               "max": max(r.events for r in w.requests)},
        "bytes_per_request": {"mean": round(sum(r.bytes for r in w.requests) / len(w.requests), 1),
                              "max": max(r.bytes for r in w.requests)},
        "peak_concurrency": w.peak_concurrency, "background_events": w.background_events,
        "background_bytes": w.background_bytes, "entropy_events": w.entropy_events},
        n_t, "given" if concurrency else "measured: the most requests in progress at once in the recording",
        ev, by, stat, sds)
    for sd in sds:
        p.buffers.append({"analysis": sd.analysis, "f": round(sd.f, 4),
                          "events": math.ceil(equation2(n_t, ev, sd.f)),
                          "bytes": math.ceil(equation2(n_t, by, sd.f))})
    return p


def render(p: Plan) -> str:
    w = p.workload
    lines = [f"tandem plan {p.bundle}: FreeDA equation 2, {EQUATION}",
             f"  requests   {w['requests']} in {w['flows']} connection(s) over {w['vm_s']:.3f}s of VM time",
             (f"  S_req      {p.s_req_events:.2f} inputs, {p.s_req_bytes:.1f} bytes per request ({p.stat}; "
             f"mean {w['events_per_request']['mean']:.2f} / {w['bytes_per_request']['mean']:.1f}, "
             f"max {w['events_per_request']['max']} / {w['bytes_per_request']['max']})"),
             f"  N_T        {p.n_t} ({p.n_t_source}; measured peak {w['peak_concurrency']})"]
    for sd in p.slowdowns:
        who = f" {sd.analysis}" if sd.analysis else ""
        if sd.source == "given":
            lines.append(f"  F{who:<10}{sd.f:.3f} (given)")
        else:
            lines.append(f"  F{who:<10}{sd.f:.3f} ({sd.source}: replayed in {sd.analysis_wall_s:.2f}s wall, "
                         f"the native recorded in {sd.native_wall_s:.2f}s)")
    lines.append(f"  N_sys      {N_SYS} (one buffer entry per input)")
    lines.append(f"  not in S_req: {w['background_events']} serial/datagram input(s) outside connections "
                 f"({w['background_bytes']} bytes); {w['entropy_events']} entropy input(s), never buffered")
    for b in p.buffers:
        who = f" for {b['analysis']}" if b["analysis"] else ""
        lines.append(f"buffer needed{who}: {b['events']} inputs, {b['bytes']} bytes")
    if len(p.buffers) > 1:
        lines.append(f"buffer for all of them (the largest): {p.events} inputs, {p.bytes} bytes")
    lines.append(f"  e.g. tandem shadow ... --buffer-events {p.events} --buffer-bytes {p.bytes}")
    return "\n".join(lines)
