"""What a recording's requests are, for `tandem plan`: S_req (inputs and bytes per request),
N_T (requests issued before an analysis F times slower caught up) and the boot backlog,
measured from the native's inputs (docs/plan.md)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..semantic import inputs

READY = b"TANDEM-READY"     # the guest agent's line once the service listens


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
        # A server's answer on a connection the guest opened (its backend) is part of the
        # request that made the guest ask, not a request of its own.
        if i.flow is None or _guest_opened(rec, i.flow):
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


def _guest_opened(rec: inputs.RecordedInputs, index: int) -> bool:
    flow = rec.flows[index]
    return flow is not None and flow.guest_opened


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
