"""Release policy "agreed": a native output leaves only once every analysis agrees.

QEMU's filter-gate (qemu-patches/0012) holds every frame the native guest sends and
offers it here (HELD); this decides RELEASE or DROP. Frames without TCP payload (ACKs,
handshakes, ARP, ...) go at once. A TCP payload frame of the guest's service is the
native's bytes [a, b) of that connection's output stream; it is released when every
live analysis has produced bytes [a, b) on the same connection and they are
equivalent under that analysis's equivalence spec (N-variant execution; `agree`
below: equal bytes, or with the spec's tcp rules, equal after its byte ranges, line
masks and ignored lines); dropped, and reported, when an analysis produced different
output or closed the connection short of b (the divergence never reaches the client).
An analysis that has crashed, hung or been detached no longer has a say. An analysis
that has taken the connection's last input but still has not answered after
`timeout_vm_ns` of its own VM time does not hold the native forever: the frame is
released and that is reported. Frames of one connection leave in order.

The same gate holds the native's *inputs* for the overflow policy "block": while
`hold()` says so (an analysis's buffer is full), frames towards the guest wait in
QEMU (HOLD_INPUT) and are delivered in order when it has room again (PASS_INPUT).
With release "now" the gate holds no outputs (filter-gate outputs=off).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from . import equivalence, netpkt
from .compare import kept_lines
from .feedproto import FeedServer

HELD, RELEASE, DROP, HOLD_INPUT, PASS_INPUT = 32, 33, 34, 35, 36
SYN, ACK = 0x02, 0x10


@dataclass
class Held:
    id: int
    vm_ns: int
    frame: bytes
    key: tuple | None = None        # (client ip, port, server ip, port) for TCP payload frames
    a: int = 0
    b: int = 0
    payload: bytes = b""
    since: float = field(default_factory=time.monotonic)


@dataclass
class GateEvent:
    kind: str                       # "dropped" (a divergence caught) | "timeout" (released anyway)
    analysis: str
    flow: int
    offset: int
    native: bytes
    analysis_bytes: bytes
    vm_ns: int

    def describe(self) -> str:
        if self.kind == "dropped":
            return (f"native output held and dropped: flow {self.flow} bytes {self.offset}.."
                    f"{self.offset + len(self.native)} {self.native[:60]!r}, {self.analysis} produced "
                    f"{self.analysis_bytes[:60]!r}")
        return (f"native output released without {self.analysis}'s agreement (no answer within the "
                f"timeout): flow {self.flow} bytes {self.offset}..{self.offset + len(self.native)}")


def _lines(data: bytes) -> tuple[list[bytes], bytes]:
    """Complete lines (without \n, trailing \r dropped) and the unfinished rest."""
    end = data.rfind(b"\n") + 1
    return [x.rstrip(b"\r") for x in data[:end].split(b"\n")[:-1]], bytes(data[end:])


def agree(native: bytes, a: int, b: int, theirs: bytes, rules, flow: int, closed: bool) -> bool | None:
    """Is the native's output [a, b) on a flow matched by an analysis's output `theirs`
    on it, under the spec's tcp `rules`? True, False (a divergence), or None (not yet
    known: the analysis has not got that far, or the line it ends in is unfinished).
    `native` is the native's stream so far (at least b bytes); `closed`: the analysis
    will produce no more on this flow."""
    ranges = [(s, e) for f, s, e in rules.byte_ranges if f == flow]
    if ranges:
        native, theirs = bytearray(native), bytearray(theirs)
        for s, e in ranges:
            for buf in (native, theirs):
                hi = min(e, len(buf))
                if s < hi:
                    buf[s:hi] = b"*" * (hi - s)
    if not (rules.ignore or rules.mask):
        if len(theirs) >= b:
            return bytes(theirs[a:b]) == bytes(native[a:b])
        if bytes(theirs[a:]) != bytes(native[a:len(theirs)]):
            return False
        return False if closed else None
    # Line rules: lines of the native up to b, after ignores and masks, against the
    # analysis's; a line the native has not finished is compared as a prefix.
    cache: dict = {}
    n_lines, n_tail = _lines(bytes(native[:b]))
    t_lines, t_tail = _lines(bytes(theirs))
    n_kept, _ = kept_lines(n_lines, rules, False, cache)
    t_kept, _ = kept_lines(t_lines, rules, False, cache)
    k = min(len(n_kept), len(t_kept))
    if n_kept[:k] != t_kept[:k]:
        return False
    if len(t_kept) < len(n_kept):
        return False if closed else None
    if not n_tail:
        return True
    nxt = t_kept[k] if len(t_kept) > k else t_tail
    if nxt.startswith(n_tail):
        return True
    return False if closed else None       # masks may match only once the line is whole


class Gate:
    def __init__(self, server: FeedServer, rec, followers, *, timeout_vm_ns: int = 2_000_000_000,
                 hold=None, specs: dict | None = None):
        self.server, self.rec, self.followers = server, rec, followers
        self.hold = hold                # () -> bool: hold the native's inputs now
        # Each analysis's equivalence spec (live.Shadow loads them; default: the built-in ones)
        self.specs = specs or {f.analysis: equivalence.load(f.analysis) for f in followers}
        self.native_out: dict[tuple, bytearray] = {}   # per connection: the native's output so far
        self.holding = False
        self.holds = 0
        self.timeout_vm_ns = timeout_vm_ns
        self.queues: dict[tuple, list[Held]] = {}     # per connection, in order
        self.isn: dict[tuple, int] = {}               # the guest's initial sequence number
        self.dropped_flows: set[tuple] = set()
        self.events: list[GateEvent] = []
        self.released = self.dropped = 0
        self._streams: dict[tuple[str, int], bytearray] = {}   # (analysis, flow) -> its output so far
        self._index: dict[tuple, int] = {}                     # connection -> flow index
        self._flows_seen = 0
        self._retired: dict[tuple, object] = {}                 # retired with frames still held
        self.stop = False
        self.thread = threading.Thread(target=self._loop, name="tandem-gate", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop:
            msgs = self.server.receive(0.05)
            if msgs is None:
                return                                  # the native has exited
            for m in msgs:
                if m.type == HELD:
                    self._held(Held(m.vm_ns, int.from_bytes(m.data[:8], "little"), m.data[8:]))
            for key in list(self.queues):
                self._decide(key)
            want = bool(self.hold and self.hold())
            if want != self.holding:
                self.server.send(HOLD_INPUT if want else PASS_INPUT, 0, 0)
                self.holding = want
                self.holds += want
            self.server.flush()

    def _held(self, h: Held) -> None:
        seg = netpkt.tcp4(h.frame)
        if seg is None:
            return self._release(h)
        ip_src, sport, ip_dst, dport, seq, flags, payload = seg
        key = (ip_dst, dport, ip_src, sport)            # as the recording names the connection
        if flags & SYN and flags & ACK:
            self.isn[key] = seq
        if payload and key in self.isn:
            h.key, h.payload = key, payload
            h.a = (seq - self.isn[key] - 1) & 0xFFFFFFFF
            h.b = h.a + len(payload)
            out = self.native_out.setdefault(key, bytearray())
            if len(out) < h.b:
                out.extend(bytes(h.b - len(out)))
            out[h.a:h.b] = payload
        if key in self.queues or h.key is not None:
            self.queues.setdefault(key, []).append(h)   # behind this connection's held output
        else:
            self._release(h)

    def _flow(self, key: tuple) -> int | None:
        flows = self.rec.flows
        for fl in flows[self._flows_seen:]:
            if fl is not None:
                self._index[(fl.client[0], fl.client[1], fl.server[0], fl.server[1])] = fl.index
        self._flows_seen = len(flows)
        return self._index.get(key)

    def forget(self, fl) -> None:
        """A connection retired (compared to its end by every analysis, live.Shadow):
        what the gate kept of it goes, unless frames of it are still held."""
        key = (fl.client[0], fl.client[1], fl.server[0], fl.server[1])
        if key in self.queues:
            self._retired[key] = fl         # once its last held frame is decided
            return
        self._retired.pop(key, None)
        for d in (self.native_out, self.isn, self._index):
            d.pop(key, None)
        self.dropped_flows.discard(key)
        for f in self.followers:
            self._streams.pop((f.analysis, fl.index), None)

    def _decide(self, key: tuple) -> None:
        q = self.queues[key]
        while q:
            h = q[0]
            if h.key is None:
                self._release(h)
            elif key in self.dropped_flows:
                self._drop(h)
            else:
                verdict = self._agreement(h)
                if verdict is None:
                    return                              # wait for the analyses
                (self._release if verdict else self._drop)(h)
            q.pop(0)
        del self.queues[key]
        if key in self._retired:
            self.forget(self._retired[key])

    def _agreement(self, h: Held) -> bool | None:
        """True: every live analysis agrees; False: one diverged; None: not yet known."""
        flow = self._flow(h.key)
        if flow is None:
            return None                                 # the recording has not seen it yet
        waiting = False
        for f in self.followers:
            run = f.run
            if run is None or run.outcome not in ("running", "poweroff", "finished"):
                continue                                # crashed, hung, detached: no say
            spec = self.specs[f.analysis]
            if "tcp" in spec.ignore_channels:
                continue                                # its spec does not compare TCP
            pf = run.peer.flows.get(flow) if run.peer else None
            got = self._stream(f.analysis, flow, pf)
            # A connection the analysis has compared to its end (live_compare) is closed too.
            closed = bool(pf and (pf.reset or pf.guest_fin)) or run.outcome != "running" \
                or (pf is None and flow in f.cmp.done)
            verdict = agree(self.native_out[h.key], h.a, h.b, got, spec.rules["tcp"], flow, closed)
            if verdict is False:
                return self._diverged(h, f.analysis, flow, bytes(got[h.a:h.b]))
            if verdict:
                continue
            last = run.last_input_of.get(flow)
            if last is not None and run.end_ns - last > self.timeout_vm_ns \
                    and not (run.pending_of_flow and run.pending_of_flow(flow)):
                self.events.append(GateEvent("timeout", f.analysis, flow, h.a, h.payload, b"", h.vm_ns))
                continue
            waiting = True
        return None if waiting else True

    def _stream(self, analysis: str, flow: int, pf) -> bytearray:
        """An analysis's output on a flow so far, joined once: only new bytes are added.
        (A live analysis drops the part of its output it has matched with the native's
        as it goes; it keeps what this has not copied yet: `copied`.)"""
        buf = self._streams.setdefault((analysis, flow), bytearray())
        if pf is not None:
            with self.rec.lock:
                chunks, skip = pf.guest_data.since(len(buf))
                for i, (_, d) in enumerate(chunks):
                    buf += d[skip:] if i == 0 else d
        return buf

    def copied(self, analysis: str, flow: int) -> int:
        """How much of an analysis's output on a flow the gate has: it may be dropped."""
        return len(self._streams.get((analysis, flow), b""))

    def _diverged(self, h: Held, analysis: str, flow: int, theirs: bytes) -> bool:
        self.events.append(GateEvent("dropped", analysis, flow, h.a, h.payload, theirs, h.vm_ns))
        self.dropped_flows.add(h.key)
        return False

    def _release(self, h: Held) -> None:
        self.server.send(RELEASE, 0, h.id)
        self.released += 1

    def _drop(self, h: Held) -> None:
        self.server.send(DROP, 0, h.id)
        self.dropped += 1
