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

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import TandemError
from ..formats import bundle
from ..semantic import inputs
from .slowdown import Slowdown, slowdowns_from
from .workload import Request, Workload, measure

N_SYS = 1                   # buffer entries per input
EQUATION = "B = (N_T*S_req - N_T/F*S_req + S_req) * N_sys"


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


__all__ = ["EQUATION", "N_SYS", "Plan", "Request", "Slowdown", "Workload", "entries", "equation2", "measure",
           "plan", "render", "slowdowns_from"]
