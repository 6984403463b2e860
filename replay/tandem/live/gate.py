"""Release policy "agreed": a native output leaves only once every analysis agrees.

QEMU's filter-gate (qemu-patches/0033) holds every frame the native guest sends and
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

QEMU bounds what it holds each way (filter-gate max-frames, max-bytes: a guest that
sends fast while the analyses lag must not grow QEMU without limit, qemu-patches/0033).
A frame past the bound meets the overflow policy, the same as the analyses' buffers:
"detach" (the held frames leave without agreement and the gate holds nothing from then
on: the native no longer waits for its analyses) or "block" (the frame is refused, as a
full link refuses it; the guest's TCP sends it again). QEMU says so (OVERFLOW), and that
is reported as a limit of the run (`GateEvent` "overflow"), not as a finding about the
guest. At its shutdown QEMU sends its counters (STATS: the peaks held each way, overflows,
frames the policy passed or refused), kept in `qemu_stats` for gate.json: how full the
gate got, to size max-frames/max-bytes by.
"""
from __future__ import annotations

import logging
import struct
import threading
import time
from dataclasses import dataclass, field

from ..formats import netpkt
from ..lifecycle import Lifecycle
from ..semantic.comparison import equivalence
from ..semantic.comparison.compare import kept_lines
from ..semantic.model import FlowOutput
from ..qemu.feed import FeedServer

HELD, RELEASE, DROP, HOLD_INPUT, PASS_INPUT, OVERFLOW, STATS = 32, 33, 34, 35, 36, 37, 38
SYN, ACK = 0x02, 0x10
# OVERFLOW's payload: frames and bytes held, max-frames, max-bytes, policy (0 detach, 1 block)
OVERFLOW_BODY = struct.Struct("<QQQQQ")
# STATS (at QEMU's shutdown): its counters, as qom-get names them
STATS_NAMES = ("held_peak_frames", "held_peak_bytes", "input_peak_frames", "input_peak_bytes",
               "overflows", "overflow_frames", "released", "dropped")
STATS_BODY = struct.Struct("<" + "Q" * len(STATS_NAMES))
POLICIES = ("detach", "block")
DIRECTIONS = ("outputs", "inputs")          # OVERFLOW's channel
CLOSE_WAIT_S = 5.0          # close(): the loop's last pass (a receive is 0.05 s) ends well within this

log = logging.getLogger(__name__)


FlowKey = tuple[bytes, int, bytes, int]     # (client ip, port, server ip, port)


@dataclass
class Held:
    id: int
    vm_ns: int
    frame: bytes
    key: FlowKey | None = None      # (client ip, port, server ip, port) for TCP payload frames
    a: int = 0
    b: int = 0
    payload: bytes = b""
    since: float = field(default_factory=time.monotonic)
    timed_out: set = field(default_factory=set)     # analyses it was released without (reported once)


@dataclass
class GateEvent:
    kind: str                       # "dropped" (a divergence caught) | "timeout" (released anyway)
    analysis: str                   # | "overflow" (QEMU's bound reached: `qemu` says how)
    flow: int
    offset: int
    native: bytes
    analysis_bytes: bytes
    vm_ns: int
    qemu: dict | None = None        # overflow: direction, frames, bytes, max_frames, max_bytes, policy

    def describe(self) -> str:
        if self.kind == "overflow":
            q = self.qemu or {}         # an overflow event carries QEMU's report
            then = ("detached: the held frames left without the analyses' agreement and it holds "
                    "nothing from then on" if q["policy"] == "detach" else
                    "frames past it refused until there was room (the guest's TCP sends them again)")
            return (f"QEMU held the native's {q['direction']} up to its bound at VM time "
                    f"{self.vm_ns / 1e9:.3f}s ({q['frames']} frames, {q['bytes']} bytes held; max-frames "
                    f"{q['max_frames']}, max-bytes {q['max_bytes']}): {then}")
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


class Stream:
    """A connection's output from stream offset `base` on: the part before `base` is
    decided and dropped (what a long-lived connection sends must not stay)."""
    __slots__ = ("base", "data")

    def __init__(self):
        self.base, self.data = 0, bytearray()

    @property
    def end(self) -> int:
        return self.base + len(self.data)

    def put(self, a: int, payload: bytes) -> None:
        """Bytes [a, a + len(payload)) of the stream (a retransmission rewrites them)."""
        b = a + len(payload)
        if b <= self.base:
            return
        if a < self.base:
            payload, a = payload[self.base - a:], self.base
        if self.end < b:
            self.data.extend(bytes(b - self.end))
        self.data[a - self.base:b - self.base] = payload

    def trim(self, to: int) -> None:
        """Drop what comes before stream offset `to` (at most all of it)."""
        to = min(to, self.end)
        if to > self.base:
            del self.data[:to - self.base]
            self.base = to

    def window(self, lo: int, hi: int | None = None) -> bytes:
        hi = self.end if hi is None else min(hi, self.end)
        return bytes(self.data[max(lo, self.base) - self.base:max(hi - self.base, 0)])


class Agreement:
    """One analysis's agreement with the native on one connection, carried forward
    from the last point both are known to agree to: (n0, t0), the native's and the
    analysis's stream offsets there, each at the start of a line (with line rules) or
    at the end of the native's last frame decided (bytes). Each decision looks only at
    what comes after it, so it costs the new bytes, not the connection's length."""
    __slots__ = ("flow", "n0", "rules", "t0")

    def __init__(self, rules, flow: int):
        self.rules, self.flow = rules, flow
        self.n0 = self.t0 = 0

    @property
    def lines(self) -> bool:
        return bool(self.rules.ignore or self.rules.mask)

    def check(self, native: Stream, a: int, b: int, theirs: Stream, closed: bool) -> bool | None:
        """Is the native's output [a, b) matched by the analysis's output, under the
        spec's tcp `rules`? True, False (a divergence), or None (not yet known: the
        analysis has not got that far, or the line it ends in is unfinished).
        `closed`: the analysis will produce no more on this flow."""
        if b <= self.n0:
            return True                             # agreed before (a retransmission)
        if self.lines:
            lo, t_lo = self.n0, self.t0
        else:                                       # aligned: the analysis's byte i is the native's
            lo = t_lo = max(a, self.n0, native.base, theirs.base)
        nat = self._masked(native.window(lo, b), lo)
        # Bytes: only the frame's own bytes count; lines: all the analysis has after t0.
        got = self._masked(theirs.window(t_lo, b if not self.lines else None), t_lo)
        verdict: bool | None
        if not self.lines:
            if len(got) >= len(nat):
                verdict = got[:len(nat)] == nat
            else:
                verdict = False if got != nat[:len(got)] or closed else None
            if verdict:
                self.n0 = self.t0 = b
            return verdict
        # Line rules: the native's lines up to b, after ignores and masks, against the
        # analysis's; a line the native has not finished is compared as a prefix.
        cache: dict = {}
        n_lines, n_tail = _lines(nat)
        t_lines, t_tail = _lines(got)
        n_kept, _ = kept_lines(n_lines, self.rules, False, cache)
        t_kept, t_index = kept_lines(t_lines, self.rules, False, cache)
        k = min(len(n_kept), len(t_kept))
        if n_kept[:k] != t_kept[:k]:
            return False
        if len(t_kept) < len(n_kept):
            return False if closed else None
        if n_tail:
            nxt = t_kept[k] if len(t_kept) > k else t_tail
            if not nxt.startswith(n_tail):
                return False if closed else None   # masks may match only once the line is whole
        # Agreed: move past the native's complete lines and the analysis's lines they matched.
        self.n0 += len(nat) - len(n_tail)
        if k:
            self.t0 += sum(len(x) + 1 for x in _raw_lines(got, t_index[k - 1] + 1))
        return True

    def _masked(self, data: bytes, at: int) -> bytes:
        """`data` (stream offsets from `at`) with the flow's byte ranges masked."""
        ranges = [(s, e) for f, s, e in self.rules.byte_ranges if f == self.flow and s < at + len(data) and e > at]
        if not ranges:
            return data
        buf = bytearray(data)
        for s, e in ranges:
            lo, hi = max(s, at) - at, min(e, at + len(data)) - at
            buf[lo:hi] = b"*" * (hi - lo)
        return bytes(buf)


def _raw_lines(data: bytes, n: int) -> list[bytes]:
    """The first n lines of data as sent (with their \r, without \n)."""
    return data.split(b"\n", n)[:n]


def agree(native: bytes, a: int, b: int, theirs: bytes, rules, flow: int, closed: bool) -> bool | None:
    """Agreement.check on whole streams, from their starts."""
    n, t = Stream(), Stream()
    n.put(0, native)
    t.put(0, theirs)
    return Agreement(rules, flow).check(n, a, b, t, closed)


class Gate(Lifecycle):
    """Decides, in a thread of its own (start() to close()), on what QEMU's filter-gate
    holds: offered on `server`, which its owner starts before the native and closes."""

    def __init__(self, server: FeedServer, rec, followers, *, timeout_vm_ns: int = 2_000_000_000,
                 hold=None, specs: dict | None = None):
        self.server, self.rec, self.followers = server, rec, followers
        self.hold = hold                # () -> bool: hold the native's inputs now
        # Each analysis's equivalence spec (live.shadow.ShadowRun loads them; default: the built-in ones)
        self.specs = specs or {f.analysis: equivalence.load(f.of) for f in followers}
        self.native_out: dict[tuple, Stream] = {}      # per connection: the native's output not decided yet
        self.holding = False
        self.holds = 0
        self.timeout_vm_ns = timeout_vm_ns
        self.queues: dict[tuple, list[Held]] = {}     # per connection, in order
        self.isn: dict[tuple, int] = {}               # the guest's initial sequence number
        self.dropped_flows: set[tuple] = set()
        self.events: list[GateEvent] = []
        self.released = self.dropped = 0
        self.detached = False           # QEMU's gate let go (overflow policy detach)
        self.qemu_stats: dict | None = None     # QEMU's counters, sent as it shuts down
        self._streams: dict[tuple[str, int], Stream] = {}      # (analysis, flow) -> its output not agreed yet
        self._agreements: dict[tuple[str, int], Agreement] = {}
        self._index: dict[tuple, int] = {}                     # connection -> flow index
        self._flows_seen = 0
        self._retired: dict[tuple, object] = {}                 # retired with frames still held
        self.stop = False
        self.thread = threading.Thread(target=self._loop, name="tandem-gate", daemon=True)

    @property
    def started(self) -> bool:
        return self.thread.ident is not None

    def start(self) -> Gate:
        self.thread.start()
        return self

    def join(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the loop to end by itself, as it does once the
        native's QEMU has closed the gate (its last counters read); True if it has."""
        if self.started:
            self.thread.join(timeout)
        return not self.thread.is_alive()

    def close(self) -> None:
        """Stop deciding: the loop ends at its next receive (within 0.05 s) and is waited for."""
        self.stop = True
        self.join(CLOSE_WAIT_S)

    def _loop(self) -> None:
        while not self.stop:
            msgs = self.server.receive(0.05)
            if msgs is None:
                return                                  # the native has exited
            for m in msgs:
                if m.type == HELD and not self.detached:
                    self._held(Held(m.vm_ns, int.from_bytes(m.data[:8], "little"), m.data[8:]))
                elif m.type == OVERFLOW:
                    self._overflow(m)
                elif m.type == STATS:
                    self._stats(m)
            for key in list(self.queues):
                self._decide(key)
            want = bool(self.hold and self.hold())
            if want != self.holding:
                self.server.send(HOLD_INPUT if want else PASS_INPUT, 0, 0)
                self.holding = want
                self.holds += want
            self.server.flush()

    def _overflow(self, m) -> None:
        """QEMU's gate reached its bound (m.vm_ns: the VM time). A message QEMU wrote is
        input like any other: a malformed one is logged, not trusted."""
        if len(m.data) != OVERFLOW_BODY.size or m.channel > 1:
            log.warning("gate: malformed OVERFLOW message (%d bytes, channel %d) ignored", len(m.data), m.channel)
            return
        frames, nbytes, max_frames, max_bytes, policy = OVERFLOW_BODY.unpack(m.data)
        q = {"direction": DIRECTIONS[m.channel], "frames": frames, "bytes": nbytes, "max_frames": max_frames,
             "max_bytes": max_bytes, "policy": POLICIES[policy] if policy < 2 else str(policy)}
        self.events.append(GateEvent("overflow", "", -1, 0, b"", b"", m.vm_ns, q))
        if q["policy"] == "detach":
            # Every frame QEMU held has left: nothing is left here to decide, and a
            # DROP now would come too late. What comes later is not held.
            self.detached = True
            self.queues.clear()

    def _stats(self, m) -> None:
        if len(m.data) != STATS_BODY.size:
            log.warning("gate: malformed STATS message (%d bytes) ignored", len(m.data))
            return
        self.qemu_stats = dict(zip(STATS_NAMES, STATS_BODY.unpack(m.data)))

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
            self.native_out.setdefault(key, Stream()).put(h.a, payload)
        if key in self.queues or h.key is not None:
            self.queues.setdefault(key, []).append(h)   # behind this connection's held output
        else:
            self._release(h)

    def _flow(self, key: FlowKey) -> int | None:
        flows = self.rec.flows
        for fl in flows[self._flows_seen:]:
            if fl is not None:
                self._index[(fl.client[0], fl.client[1], fl.server[0], fl.server[1])] = fl.index
        self._flows_seen = len(flows)
        return self._index.get(key)

    def forget(self, fl) -> None:
        """A connection retired (compared to its end by every analysis, live.shadow.ShadowRun):
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
            self._agreements.pop((f.analysis, fl.index), None)

    def _decide(self, key: tuple) -> None:
        q = self.queues[key]
        decided = 0
        while q:
            h = q[0]
            if h.key is None:
                self._release(h)
            elif key in self.dropped_flows:
                self._drop(h)
            else:
                verdict = self._agreement(h)
                if verdict is None:
                    break                               # wait for the analyses
                (self._release if verdict else self._drop)(h)
            q.pop(0)
            decided += 1
        if decided:
            self._trim(key)
        if q:
            return
        del self.queues[key]
        if key in self._retired:
            self.forget(self._retired[key])

    def _trim(self, key: tuple) -> None:
        """Drop what every analysis that has or may yet have a say has agreed to, on
        both sides: what stays is what frames still held, or yet to come, are compared
        with. (With bytes equality only the held frames' bytes are needed; with line
        rules, the native's from the oldest point an analysis agreed to.)"""
        out, flow = self.native_out.get(key), self._index.get(key)
        if out is None or flow is None:
            return
        need = out.end
        if key not in self.dropped_flows:
            need = min((h.a for h in self.queues.get(key, ()) if h.key is not None), default=need)
            for f in self.followers:
                if self._say(f) is not None or self._starting(f):
                    ag = self._agreement_of(f, flow)
                    if ag.lines:
                        need = min(need, ag.n0)
        out.trim(need)
        for f in self.followers:
            theirs, got = self._agreements.get((f.analysis, flow)), self._streams.get((f.analysis, flow))
            if got is not None:
                got.trim(got.end if theirs is None or key in self.dropped_flows else theirs.t0 if theirs.lines else need)

    def _say(self, f):
        """A follower's equivalence spec if it has a say on TCP output (it runs, or ended
        well, and its spec compares TCP); None: crashed, hung, detached or not comparing."""
        run = f.run
        if run is None or run.outcome not in ("running", "poweroff", "finished"):
            return None
        spec = self.specs[f.analysis]
        return None if "tcp" in spec.ignore_channels else spec

    def _starting(self, f) -> bool:
        """Not running yet, but it will (its QEMU is starting): it will have a say."""
        return f.run is None and not f.cmp.finished and "tcp" not in self.specs[f.analysis].ignore_channels

    def _agreement_of(self, f, flow: int) -> Agreement:
        ag = self._agreements.get((f.analysis, flow))
        if ag is None:
            fl = self.rec.flows[flow] if flow < len(self.rec.flows) else None     # its protocol's rules too
            spec = self.specs[f.analysis].for_protocol(fl.protocol if fl is not None else None)
            ag = self._agreements[(f.analysis, flow)] = Agreement(spec.rules["tcp"], flow)
        return ag

    def _agreement(self, h: Held) -> bool | None:
        """True: every live analysis agrees; False: one diverged; None: not yet known."""
        key = h.key
        flow = self._flow(key) if key is not None else None
        if key is None or flow is None or (self.rec.known_ns < h.vm_ns and not self.rec.finished):
            # Not before tandem has read the device log up to the frame (its clock marks
            # come every 100 ms of VM time): QEMU offers the frame at once, and what the
            # client sent before it says the connection's protocol, whose rules (HTTP's
            # Date mask) the agreement is made with, once; made before, it would compare
            # that connection byte for byte.
            return None
        waiting = False
        for f in self.followers:
            if self._starting(f):
                waiting = True
                continue
            if self._say(f) is None:
                continue                                # crashed, hung, detached, or not comparing TCP
            run = f.run
            out = run.net.flows.get(flow) if run.net else None
            got = self._stream(f.analysis, flow, out)
            # A connection the analysis has compared to its end (live_compare) is closed too.
            closed = bool(out and (out.reset or out.fin)) or run.outcome != "running" \
                or (out is None and flow in f.cmp.done)
            verdict = self._agreement_of(f, flow).check(self.native_out[key], h.a, h.b, got, closed)
            if verdict is False:
                return self._diverged(h, key, f.analysis, flow, got.window(h.a, h.b))
            if verdict or f.analysis in h.timed_out:
                continue
            last = run.last_input_of.get(flow)
            if last is not None and run.end_ns - last > self.timeout_vm_ns and not run.waits_on(flow, self.rec):
                h.timed_out.add(f.analysis)
                self.events.append(GateEvent("timeout", f.analysis, flow, h.a, h.payload, b"", h.vm_ns))
                continue
            waiting = True
        return None if waiting else True

    def _stream(self, analysis: str, flow: int, out: FlowOutput | None) -> Stream:
        """An analysis's output on a flow not agreed yet, joined once: only new bytes are
        added. (A live analysis drops the part of its output it has matched with the
        native's as it goes; it keeps what this has not copied yet: `copied`.)"""
        buf = self._streams.setdefault((analysis, flow), Stream())
        if out is not None:
            with self.rec.lock:
                buf.data += out.data.bytes_from(buf.end)
        return buf

    def copied(self, analysis: str, flow: int) -> int:
        """How far the gate has copied an analysis's output on a flow: before that it may be dropped."""
        got = self._streams.get((analysis, flow))
        return got.end if got else 0

    def _diverged(self, h: Held, key: FlowKey, analysis: str, flow: int, theirs: bytes) -> bool:
        self.events.append(GateEvent("dropped", analysis, flow, h.a, h.payload, theirs, h.vm_ns))
        self.dropped_flows.add(key)
        return False

    def _release(self, h: Held) -> None:
        self.server.send(RELEASE, 0, h.id)
        self.released += 1

    def _drop(self, h: Held) -> None:
        self.server.send(DROP, 0, h.id)
        self.dropped += 1
