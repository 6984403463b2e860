"""What the native guest received, as inputs a semantic replay can re-deliver.

From the native's device log (`devices.pcapng`) this builds the ordered list of
inputs for an analysis VM: serial bytes, entropy, the remote peers' TCP payload
per flow (not their packets: a different kernel gets its own sequence numbers),
UDP/ICMP datagrams. Each input carries what the native had already *output*
when the input arrived (its dependencies), because the remote client reacted to
those outputs: the replayer holds the input until the analysis guest has
produced them too.

A TCP flow is either side's. One the remote side opened (a client of a forwarded
port) starts with a tcp-open input. One the guest opened (nginx to its backend)
has none: the analysis guest opens its own, which the replayer matches to this one
(connections.py) and answers as the remote server did; the server's bytes, FIN or
RST are its inputs, each waiting for the request bytes the guest had sent by then.

Dependencies are counted per output stream: payload bytes per TCP flow, and,
for serial input, userland lines on the serial console (kernel printk lines,
which differ between kernels, are not counted). A dependency on a line is the
line's text and its occurrence number, so a sanitizer's extra lines do not
satisfy it early.
"""
from __future__ import annotations

import bisect
import functools
import re
import threading
import time
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from ..formats import bundle, netpkt, pcapng
from ..formats.netpkt import ACK, FIN, RST, SYN
from .network.exchanges import Exchange, answers, request_key

KERNEL_LINE = re.compile(rb"^\s*(<\d>)?\[\s*\d+\.\d+\]")
FIN_CLIENT, FIN_GUEST, FIN_BOTH = 1, 2, 3
CLOSED_GRACE_NS = 10_000_000_000    # a closed flow's last ACKs and retransmissions
GIST_BYTES = 80                     # of an input's first line, in what it is described by


class InputKind(StrEnum):
    """What an input is (Input.kind); its value is what findings and descriptions print."""
    TCP_OPEN = "tcp-open"       # the remote side opens a connection to the guest
    TCP_DATA = "tcp-data"       # its bytes on one
    TCP_FIN = "tcp-fin"         # it closes one
    TCP_RST = "tcp-rst"         # it resets one
    FRAME = "frame"             # a datagram (UDP, ICMP), re-sent as it came
    SERIAL = "serial"           # bytes typed on the console
    RNG = "rng"                 # entropy, drawn by the guest in order


@dataclass
class Input:
    kind: InputKind
    vm_ns: int                  # when the native received it
    data: bytes = b""
    flow: int | None = None     # index into RecordedInputs.flows
    offset: int = 0             # byte offset of data in the flow's client stream / serial input
    seq: int = 0                # devlog event number (attribution)
    needs_bytes: dict[int, int] = field(default_factory=dict)   # flow -> guest bytes (grown since the previous input)
    needs_line: tuple[bytes, int] | None = None                 # (serial line, occurrence)

    def describe(self) -> str:
        """What a finding or divergence came after, for a person: the input, where it is in
        the recording, and what it said (a request's first line, a datagram's addresses)."""
        where = f"flow {self.flow} offset {self.offset}" if self.flow is not None else \
            f"serial offset {self.offset}" if self.kind == InputKind.SERIAL else self.kind
        said = self.gist()
        return f"{self.kind} at VM {self.vm_ns / 1e9:.6f}s ({where}, devlog event {self.seq})" + \
            (f" {said}" if said else "")

    def gist(self) -> str:
        """The input's content in brief: the first line of bytes on a connection or the
        console (escaped: it is the client's, or hostile), a frame's protocol, addresses
        and size."""
        if self.kind in (InputKind.TCP_DATA, InputKind.SERIAL) and self.data:
            line = self.data.split(b"\n", 1)[0].rstrip(b"\r")[:GIST_BYTES]
            more = "..." if len(line) < len(self.data.rstrip(b"\r\n")) else ""
            return '"' + line.decode("latin-1").encode("unicode_escape").decode("ascii") \
                .replace('"', '\\"') + more + '"'
        if self.kind == InputKind.FRAME and self.data:
            f = netpkt.parse(self.data)
            if f is not None and f.proto in (netpkt.PROTO_UDP, netpkt.PROTO_TCP):
                kind = "udp" if f.proto == netpkt.PROTO_UDP else "tcp"
                return (f"[{kind} {netpkt.ip_str(f.ip_src)}:{f.sport} -> {netpkt.ip_str(f.ip_dst)}:{f.dport}, "
                        f"{len(f.payload)} bytes of payload]")
            return f"[{len(self.data)}-byte frame]"
        return ""


class Chunks:
    """A timed byte stream: its bytes in one buffer, and the stream offset and VM time at
    which each chunk (a segment's payload, a console write) began. A live run drops its
    front once every analysis has compared it (live_compare.py): `base` is the stream
    offset of the first byte kept, `dropped` how many chunks are gone, `size` the bytes
    kept.

    One buffer, not a list of (VM ns, bytes): the comparator reads a stream whole, and
    joining 88,000 5-byte redis replies chunk by chunk took 14 ms of a 14 ms comparison
    (40 MB/s, `bench semantic --only protocols`); a copy of the buffer takes 0.05 ms. It is
    also smaller: 16 bytes a chunk besides its bytes, where a tuple and a bytes object took
    about 90."""
    __slots__ = ("base", "buf", "dropped", "starts", "times")

    def __init__(self, chunks: Iterable[tuple[int, bytes]] = ()) -> None:
        self.buf = bytearray()
        self.starts = array("q")        # stream offset of each chunk kept
        self.times = array("q")         # its VM time
        self.base = self.dropped = 0
        for c in chunks:
            self.append(c)

    def append(self, chunk: tuple[int, bytes]) -> None:
        ns, data = chunk
        if data:
            _resize(self.buf.extend, data)
            self.starts.append(self.base + len(self.buf) - len(data))
            self.times.append(ns)

    @property
    def size(self) -> int:
        return len(self.buf)

    @property
    def end(self) -> int:
        return self.base + len(self.buf)

    def __len__(self) -> int:
        return len(self.times)

    def __bool__(self) -> bool:
        return bool(self.times)

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        """The chunks kept, as (VM ns, bytes) (a copy of each: for reading, not a hot path)."""
        starts, buf, base = self.starts, self.buf, self.base
        for i, ns in enumerate(self.times):
            stop = starts[i + 1] - base if i + 1 < len(starts) else len(buf)
            yield ns, bytes(buf[starts[i] - base:stop])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Chunks):
            return (self.base, self.buf, self.starts, self.times) == (other.base, other.buf, other.starts, other.times)
        return NotImplemented

    __hash__ = None     # type: ignore[assignment]     # mutable

    def __repr__(self) -> str:
        return f"Chunks({len(self)} chunks, bytes {self.base}..{self.end})"

    def drop_to(self, offset: int) -> None:
        """Drop the chunks that end at or before stream offset `offset`."""
        n = len(self.times) if offset >= self.end else max(0, bisect.bisect_right(self.starts, offset) - 1)
        if n:
            cut = self.starts[n] if n < len(self.starts) else self.end
            _resize(self.buf.__delitem__, slice(0, cut - self.base))
            del self.starts[:n]
            del self.times[:n]
            self.base, self.dropped = cut, self.dropped + n

    def bytes_from(self, offset: int) -> bytes:
        """The stream's bytes from stream offset `offset` (at least the first kept) on:
        one copy, through a memoryview (bytes(buf[lo:]) copies twice, and took 75 ms for
        13 MB here where this takes 3-18 ms)."""
        with memoryview(self.buf) as m:
            return bytes(m[max(0, offset - self.base):])

    def head(self, n: int) -> bytes:
        """The first n bytes kept."""
        with memoryview(self.buf) as m:
            return bytes(m[:n])

    def time_at(self, offset: int) -> int:
        """VM time of the chunk that stream offset `offset` came in."""
        return self.times[max(0, bisect.bisect_right(self.starts, offset) - 1)]


def _resize(change, arg) -> None:
    """change(arg) on a Chunks buffer, which another thread may be copying out of that
    moment (bytes_from: a live run's native stream is appended to by the thread that
    follows its log while an analysis's thread copies it). A bytearray cannot change
    size while a memoryview of it exists (BufferError); the copy is short and holds the
    GIL, so this waits for it by giving the GIL up."""
    while True:
        try:
            change(arg)
            return
        except BufferError:
            time.sleep(0)


@dataclass
class Flow:
    """A TCP connection of the guest's. `client` is the remote side's end and `server`
    the guest's, whoever opened it (guest_opened): the peer plays the remote side of both
    kinds, and an input's bytes are always the remote side's, an output's the guest's."""
    index: int
    client: tuple[bytes, int]   # remote ip, port
    server: tuple[bytes, int]   # guest ip, port
    client_mac: bytes
    guest_mac: bytes
    opened_ns: int
    client_bytes: int = 0
    guest_bytes: int = 0
    guest_data: Chunks = field(default_factory=Chunks)  # (VM ns, in-order payload)
    closed: bool = False        # both sides sent FIN, or one reset it
    # How the native's guest answered the client's SYN: None until it did, then
    # "accepted" (SYN-ACK) or "refused" (RST: nothing listened yet, the client retried
    # on a new connection). A refused connection is not opened in an analysis: one
    # whose service already listens would accept it, print what the native never did
    # and number its later connections one higher (as in a live attach under load).
    # Of a guest-opened flow: how the remote server answered the guest's SYN; the peer
    # answers the analysis guest's the same way.
    answer: str | None = None
    # What it carries, from the client's first bytes (protocol_of): "http", "resp" or
    # "line"; None until the client has sent any. The spec's rules for it apply. The
    # client of a guest-opened flow is the guest.
    protocol: str | None = None
    guest_opened: bool = False
    # Of a guest-opened flow: the guest's first bytes (at most REQUEST_KEPT) before the
    # remote side sent any, what tells it from the other connections to the same
    # server open at the same time (connections.py); b"" if the server spoke first.
    request: bytes = b""
    closed_ns: int | None = None    # when both sides had sent FIN, or one reset it
    # The remote side reset it (a client that stopped mid-response: wrk at its end): the
    # guest's output after what the native had sent by then never reached anyone, and
    # an analysis that sent more before its reset is compared only that far (compare.py).
    client_reset: bool = False
    # A RESP connection whose client sent redis's TIME: its replies of TIME's shape are
    # the server's clock (compare.py masks them).
    asks_time: bool = False
    # The native's guest accepted it and reset it before it answered a byte, while its
    # service had answered no connection on that port yet (nginx starting: a probe taken
    # by the listening socket, then reset). An analysis, on its own boot's timing, may
    # answer it: that is not compared (compare.py), as a refused connection is not opened.
    reset_starting: bool = False

    def name(self) -> str:
        """opener->acceptor, each as ip:port."""
        remote = f"{netpkt.ip_str(self.client[0])}:{self.client[1]}"
        guest = f"{netpkt.ip_str(self.server[0])}:{self.server[1]}"
        return f"{guest}->{remote}" if self.guest_opened else f"{remote}->{guest}"

    @functools.cached_property
    def channel(self) -> str:
        """The flow's channel name in reports, "tcp flow N (name)": fixed at its SYN, and
        kept, as the comparison and the trimming of the recording name every open flow
        at each step (formatting it each time was half the replayer's CPU time on a
        30 s recording of ab and redis-benchmark: 14 of 28 s)."""
        return f"tcp flow {self.index} ({self.name()})"


@dataclass
class RecordedInputs:
    inputs: list[Input]
    flows: list[Flow | None]
    end_ns: int | None
    limits: list[str]           # what cannot be replayed, said once each
    created: str = "2026-01-01T00:00:00"     # when the native started (UTC), for the RTC
    path: str = ""                            # the bundle it was loaded from
    # A live native (FreeDA's leader) fills these in as it runs: every input before
    # known_ns is in `inputs`; finished once the native's device log is complete.
    known_ns: int = 0
    finished: bool = True
    # The native is running now (a live shadow): what it did may not be in its log yet
    # (an answer to a SYN), so an analysis waiting on that waits on the native's clock.
    native_live: bool = False
    serial_out: Chunks = field(default_factory=Chunks)  # the native's console
    udp_out: list[tuple[int, tuple, bytes]] = field(default_factory=list)  # (ns, (dst ip, port), payload)
    # UDP exchanges the guest started (DHCP, DNS, ...): each request with its replies,
    # answered by request in an analysis (exchanges.py), not re-sent at their times.
    exchanges: list[Exchange] = field(default_factory=list)
    exchanges_dropped: int = 0      # taken by every analysis of a live run, dropped (trail.Trail.trim)
    # A live run drops inputs every analysis has taken: inputs[0] is input number
    # inputs_dropped, and a retired flow (compared by every analysis) is None in flows.
    # Dropping, and reading across threads what may be dropped, hold `lock`.
    inputs_dropped: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    # The native powered off (its stop reason; by itself or by its button): an analysis
    # may take POWEROFF_WAIT_NS after its last input to do so too, not just SETTLE_NS.
    powered_off: bool = False
    # The native ended by its ACPI power button (a user's VM powered off by
    # Recording.powerdown): an analysis gets the press too, after its last input.
    power_button: bool = False
    # The last router advertisement the network sent (a whole frame): the replayer's
    # answer to an analysis guest's router solicitation, as it answers ARP (peer.py).
    router_advert: bytes | None = None

    def made(self) -> int:
        """Inputs made so far, counted from the first (those dropped too; any thread)."""
        with self.lock:
            return len(self.inputs) + self.inputs_dropped


class SerialLines:
    """Userland lines of a console, counted per text: the native's to record line
    dependencies, an analysis guest's to check them. Over a long run (a service that
    numbers its connections) the texts seen first are forgotten past KEPT; both
    sides forget alike, as they see the same lines."""
    KEPT = 10_000

    def __init__(self) -> None:
        self.partial = b""
        self.counts: dict[bytes, int] = {}
        self.last: tuple[bytes, int] | None = None

    def feed(self, data: bytes) -> None:
        if b"\n" not in data:        # a console arrives a few bytes at a time
            self.partial += data
            return
        self.partial += data
        *lines, self.partial = self.partial.split(b"\n")
        for line in lines:
            line = line.rstrip(b"\r")
            if line.strip() and not KERNEL_LINE.match(line):
                n = self.counts.get(line, 0) + 1
                self.counts[line] = n
                self.last = (line, n)
                if n == 1 and len(self.counts) > self.KEPT:
                    del self.counts[next(iter(self.counts))]

    def has(self, need: tuple[bytes, int] | None) -> bool:
        return need is None or self.counts.get(need[0], 0) >= need[1]


def load(bundle_dir: str | Path) -> RecordedInputs:
    reader = pcapng.DevlogReader(Path(bundle_dir) / bundle.DEVLOG)
    rec = from_events(reader)       # streamed: the events are not kept
    rec.end_ns = next((s.end_vm_ns for s in reader.stats if s and s.end_vm_ns), None)
    rec.path = str(Path(bundle_dir))
    manifest = bundle.load_manifest(bundle_dir)
    if manifest.started_at is not None:
        rec.created = manifest.started_at
    rec.powered_off = manifest.stop.reason == "poweroff"
    return rec


def from_events(events: Iterable[pcapng.Event], end_ns: int | None = None) -> RecordedInputs:
    """The inputs of a whole device log's events."""
    return InputExtractor(RecordedInputs([], [], end_ns, [])).feed(events)


PRE_RECORDING = "TCP segments of connections opened before the recording"
REQUEST_KEPT = 512      # bytes of a guest-opened flow's first request kept to match it by
# What netpkt.tcp4 gives: (ip src, sport, ip dst, dport, seq, flags, payload); and a
# connection's (client ip, port, guest ip, port).
Segment = tuple[bytes, int, bytes, int, int, int, bytes]
FlowKey = tuple[bytes, int, bytes, int]


class InputExtractor:
    """Turns a device log's events into `rec`'s inputs, flows and limits. feed() may be
    called again with the events that follow (a live native's log as it grows): `rec` is
    filled in place as the events come, so a replayer can follow it, and the parse state
    of every flow is kept here between calls."""

    def __init__(self, rec: RecordedInputs):
        self.rec = rec
        self.by_tuple: dict[FlowKey, Flow] = {}     # the open flows
        self.client_next: dict[int, int] = {}   # flow -> next expected client seq
        self.guest_next: dict[int, int] = {}    # flow -> next expected guest seq
        # flow -> its guest bytes so far, for the flows whose output grew since the last
        # input: what the next input depends on. An input needs only those: inputs are
        # delivered in order and guest output only grows, so what earlier inputs needed
        # still holds (a full copy per input grew with inputs x flows: 15 KB per request
        # after a few hundred connections of a live run). Kept apart from the flows' parse
        # state, which a closed flow loses before the next input may come.
        self.changed: dict[int, int] = {}
        # Closed flows, (VM ns, 4-tuple, index): their parse state is forgotten CLOSED_GRACE_NS
        # later, when the last ACKs and retransmissions are over (a long run has many).
        self.closing: list[tuple[int, FlowKey, int]] = []
        self.fins: dict[int, int] = {}          # flow -> FIN_CLIENT | FIN_GUEST seen
        self.resp_tail: dict[int, bytes] = {}   # RESP flow -> its client's last bytes (_asks_time)
        self.answered: set[tuple[bytes, int]] = set()  # the guest's (ip, port) that answered a client's bytes
        self.serial = SerialLines()             # the native's console, for line dependencies
        self.serial_in = 0                      # serial input bytes so far
        self.limits: dict[str, None] = dict.fromkeys(rec.limits)
        # UDP: the guest's last request from each of its ports to each destination port,
        # (guest port, remote port) -> (exchange, (src ip, port, dst ip, port)); and the
        # datagrams the remote side started, (guest port, remote ip, remote port): the
        # guest's answers to those are no requests.
        self.asked: dict[tuple[int, int], tuple[Exchange, tuple[bytes, int, bytes, int]]] = {}
        self.served: set[tuple[int, bytes, int]] = set()
        self.solicited_ns: int | None = None    # when the guest last asked for a router (IPv6)

    def feed(self, events: Iterable[pcapng.Event]) -> RecordedInputs:
        """Extract the inputs of these events (the ones after the last call's)."""
        rec, limits, closing, by_tuple, tcp4 = self.rec, self.limits, self.closing, self.by_tuple, netpkt.tcp4
        guest_segment, client_segment = self._guest_segment, self._client_segment     # bound once: the hot path
        for e in events:
            _, _, _, kind, direction, vm_ns, _, data, _, _ = e
            if kind == "net":
                seg = tcp4(data)        # the common case, without building a Frame
                # A frame that is not a TCP segment, and the guest's own segments, leave the
                # bookkeeping below (limits, known_ns, retiring closed flows) to the next
                # event: known_ns may lag (clock marks raise it too), never lead, rec.inputs.
                if seg is None and (seg := self._parsed_segment(e)) is None:
                    continue
                if direction != "in":
                    guest_segment(seg, vm_ns, data)
                    continue
                # The remote side's segment: its new payload is an input of its flow.
                if seg[5] & (SYN | FIN | RST) or seg[6]:
                    client_segment(seg, e)
                elif (seg[0], seg[1], seg[2], seg[3]) not in by_tuple:      # a bare ACK
                    limits[PRE_RECORDING] = None
            elif kind == "serial":
                self._serial(e)
            elif kind == "rng" and direction == "in":
                rec.inputs.append(Input(InputKind.RNG, vm_ns, data, seq=e.seq))
            if len(limits) != len(rec.limits):
                rec.limits = list(limits)
            rec.known_ns = max(rec.known_ns, vm_ns)
            if closing and vm_ns - closing[0][0] > CLOSED_GRACE_NS:
                self._forget_closed(vm_ns)
        rec.limits = list(limits)
        return rec

    def _deps(self, inp: Input) -> Input:
        inp.needs_bytes = dict(sorted(self.changed.items()))
        self.changed.clear()
        # Serial lines gate serial input and new connections (a client that waited
        # for the guest to say it is ready), not data on open connections: kernel
        # messages can split a userland line mid-way, and a connection refused
        # because the service is not listening yet is retried by the peer anyway.
        inp.needs_line = self.serial.last if inp.kind in (InputKind.SERIAL, InputKind.TCP_OPEN) else None
        return inp

    def _serial(self, e: pcapng.Event) -> None:
        if e.direction == "out":
            self.serial.feed(e.data)
            self.rec.serial_out.append((e.vm_ns, e.data))
        elif e.direction == "in":
            self.rec.inputs.append(self._deps(Input(InputKind.SERIAL, e.vm_ns, e.data, offset=self.serial_in, seq=e.seq)))
            self.serial_in += len(e.data)

    def _fin(self, fl: Flow, side: int, vm_ns: int) -> None:
        """A FIN (side FIN_CLIENT or FIN_GUEST) or a reset (both) of a flow."""
        was = self.fins.get(fl.index, 0)
        self.fins[fl.index] = was | side
        if self.fins[fl.index] == FIN_BOTH and was != FIN_BOTH:
            fl.closed, fl.closed_ns = True, vm_ns
            self.closing.append((vm_ns, (fl.client[0], fl.client[1], fl.server[0], fl.server[1]), fl.index))

    def _forget_closed(self, vm_ns: int) -> None:
        closing, by_tuple = self.closing, self.by_tuple
        while closing and vm_ns - closing[0][0] > CLOSED_GRACE_NS:
            _, key, i = closing.pop(0)
            if (fl := by_tuple.get(key)) is not None and fl.index == i:
                del by_tuple[key]
            for d in (self.client_next, self.guest_next, self.fins, self.resp_tail):
                d.pop(i, None)

    def _guest_segment(self, seg: Segment, vm_ns: int, frame: bytes) -> None:
        ip_src, sport, ip_dst, dport, seq, flags, payload = seg
        fl = self.by_tuple.get((ip_dst, dport, ip_src, sport))
        if flags & SYN and not flags & ACK and (fl is None or (fl.closed and fl.guest_opened)):
            self._guest_open(seg, vm_ns, frame)     # (after a close: the port reused, a new flow)
            return
        if fl is None:
            return
        i = fl.index
        if fl.answer is None and flags & (SYN | RST) and not fl.guest_opened:
            fl.answer = "refused" if flags & RST and i not in self.guest_next else "accepted"
        elif flags & RST and fl.answer == "accepted" and not fl.closed and fl.guest_bytes == 0 \
                and fl.server not in self.answered:
            fl.reset_starting = True
        if flags & (FIN | RST):
            self._fin(fl, FIN_BOTH if flags & RST else FIN_GUEST, vm_ns)
        if flags & SYN:
            self.guest_next[i] = (seq + 1) & 0xFFFFFFFF
        elif payload and i in self.guest_next:
            # New guest bytes only: a retransmission is not output twice.
            new = _new_bytes(self.guest_next[i], seq, payload)
            if new:
                if fl.guest_opened:
                    self._request(fl, new)
                else:
                    self.answered.add(fl.server)
                fl.guest_bytes += len(new)
                fl.guest_data.append((vm_ns, new))
                self.guest_next[i] = (self.guest_next[i] + len(new)) & 0xFFFFFFFF
                self.changed[i] = fl.guest_bytes

    def _guest_open(self, seg: Segment, vm_ns: int, frame: bytes) -> None:
        """The guest's SYN: a new flow it opened. No input: the analysis guest opens its
        own, which the peer answers as the remote server did (connections.py)."""
        ip_src, sport, ip_dst, dport, seq = seg[:5]
        flows = self.rec.flows
        fl = Flow(len(flows), (ip_dst, dport), (ip_src, sport), frame[:6], frame[6:12], vm_ns, guest_opened=True)
        flows.append(fl)
        self.by_tuple[(ip_dst, dport, ip_src, sport)] = fl
        self.guest_next[fl.index] = (seq + 1) & 0xFFFFFFFF

    @staticmethod
    def _request(fl: Flow, new: bytes) -> None:
        """The guest's first bytes on a flow it opened: its protocol, and the request
        that tells it from others to the same server (until the server sends any)."""
        if fl.protocol is None:
            fl.protocol = protocol_of(new)
        if fl.client_bytes == 0 and len(fl.request) < REQUEST_KEPT:
            fl.request += new[:REQUEST_KEPT - len(fl.request)]

    def _client_segment(self, seg: Segment, e: pcapng.Event) -> None:
        ip_src, sport, ip_dst, dport, seq, flags, payload = seg
        key = (ip_src, sport, ip_dst, dport)
        fl = self.by_tuple.get(key)
        if flags & SYN and not flags & ACK:
            if fl is not None and fl.index in self.client_next and not fl.closed:
                return      # a retransmitted SYN (after a close: the port reused, a new flow)
            self._open(seg, e)
            return
        if fl is None:
            self.limits[PRE_RECORDING] = None
            return
        if fl.guest_opened and fl.index not in self.client_next:
            self._answer(fl, seg, e.vm_ns)
            return
        inputs = self.rec.inputs
        if flags & RST:
            inputs.append(self._deps(Input(InputKind.TCP_RST, e.vm_ns, flow=fl.index, offset=fl.client_bytes, seq=e.seq)))
            fl.client_reset = True
            del self.by_tuple[key]
            self._fin(fl, FIN_BOTH, e.vm_ns)
            return
        if flags & SYN:
            return      # a guest-opened flow's SYN-ACK again (its ACK was lost)
        nxt = self.client_next[fl.index]
        new = _new_bytes(nxt, seq, payload) if payload else b""
        if new and fl.protocol is None and not fl.guest_opened:
            fl.protocol = protocol_of(new)
        if new and fl.protocol == "resp" and not fl.asks_time and not fl.guest_opened:
            self._asks_time(fl, new)
        if new:
            inputs.append(self._deps(Input(InputKind.TCP_DATA, e.vm_ns, new, flow=fl.index, offset=fl.client_bytes,
                                           seq=e.seq)))
            fl.client_bytes += len(new)
            nxt = (nxt + len(new)) & 0xFFFFFFFF
        if flags & FIN and ((seq + len(payload)) & 0xFFFFFFFF) == nxt:
            inputs.append(self._deps(Input(InputKind.TCP_FIN, e.vm_ns, flow=fl.index, offset=fl.client_bytes, seq=e.seq)))
            nxt = (nxt + 1) & 0xFFFFFFFF
            self._fin(fl, FIN_CLIENT, e.vm_ns)
        self.client_next[fl.index] = nxt

    def _answer(self, fl: Flow, seg: Segment, vm_ns: int) -> None:
        """The remote server's answer to the SYN of a flow the guest opened: SYN-ACK
        (accepted) or RST (refused: nothing listened, the guest may try again on a new
        connection). No input either way: the peer answers the analysis guest's SYN the
        same way when it comes (connections.py). Anything else before it is ignored."""
        ip_src, sport, ip_dst, dport, seq, flags = seg[:6]
        if flags & RST:
            fl.answer = "refused"
            del self.by_tuple[(ip_src, sport, ip_dst, dport)]
            self._fin(fl, FIN_BOTH, vm_ns)
        elif flags & SYN and flags & ACK:
            fl.answer = "accepted"
            self.client_next[fl.index] = (seq + 1) & 0xFFFFFFFF

    def _open(self, seg: Segment, e: pcapng.Event) -> None:
        """The client's SYN: a new flow (also when it reuses a closed flow's ports)."""
        ip_src, sport, ip_dst, dport, seq = seg[:5]
        flows = self.rec.flows
        fl = Flow(len(flows), (ip_src, sport), (ip_dst, dport), e.data[6:12], e.data[:6], e.vm_ns)
        flows.append(fl)
        self.by_tuple[(ip_src, sport, ip_dst, dport)] = fl
        self.client_next[fl.index] = (seq + 1) & 0xFFFFFFFF
        self.rec.inputs.append(self._deps(Input(InputKind.TCP_OPEN, e.vm_ns, flow=fl.index, seq=e.seq)))

    def _parsed_segment(self, e: pcapng.Event) -> Segment | None:
        """A frame tcp4() did not take: its segment if it is an unfragmented TCP one
        after all (over IPv6, or a header parse() reads), else None once _other_frame
        has taken it."""
        f = netpkt.parse(e.data)
        if f is None:
            return None
        if not (f.eth_type in IP_TYPES and f.proto == netpkt.PROTO_TCP and not f.fragment):
            self._other_frame(f, e)
            return None
        return (f.ip_src, f.sport, f.ip_dst, f.dport, f.seq, f.flags, f.payload)

    def _other_frame(self, f: netpkt.Frame, e: pcapng.Event) -> None:
        """A frame that is not a TCP segment: UDP, ICMP, IPv6's neighbour discovery."""
        if e.direction == "out" and f.eth_type in IP_TYPES and f.proto == netpkt.PROTO_UDP:
            self.rec.udp_out.append((e.vm_ns, (f.ip_dst, f.dport), f.payload))
            if not f.fragment and (f.sport, f.ip_dst, f.dport) not in self.served:
                self._udp_request(f, e.vm_ns)
        elif e.direction == "out" and f.icmp6_type == netpkt.ND_RS:
            self.solicited_ns = e.vm_ns
        elif e.direction == "in" and f.eth_type == netpkt.ETH_IP6 and self._answered_discovery(f, e):
            return
        elif e.direction == "in" and f.eth_type in IP_TYPES:
            if f.fragment:
                self.limits["IPv4 fragments"] = None
                return
            if f.proto == netpkt.PROTO_UDP:
                asked = self.asked.get((f.dport, f.sport))
                if asked is not None and answers(f, asked[1]):
                    asked[0].replies.append((e.vm_ns - asked[0].vm_ns, e.data))
                    return      # a reply: answered by request (exchanges.py)
                self.served.add((f.dport, f.ip_src, f.sport))
            # UDP the remote side started, ICMP, ICMPv6 but the answers to the guest's own
            # solicitations (a router's periodic advertisement, the network's neighbour
            # solicitations): re-sent as datagrams at their recorded time.
            self.rec.inputs.append(self._deps(Input(InputKind.FRAME, e.vm_ns, e.data, seq=e.seq)))
        elif e.direction == "in" and f.eth_type not in (netpkt.ETH_ARP,):
            self.limits[f"frames of ethertype 0x{f.eth_type:04x}"] = None
        # ARP from the network is not replayed: the replayer answers the guest's own.

    def _answered_discovery(self, f: netpkt.Frame, e: pcapng.Event) -> bool:
        """Neighbour discovery from the network that answers the guest's own solicitation,
        as ARP replies do: not replayed, the replayer answers the analysis guest's (a
        neighbour advertisement; a router advertisement within SOLICITED_RA_NS of the
        guest's router solicitation, the last one kept as the answer to give)."""
        if f.proto != netpkt.PROTO_ICMP6:
            return False
        if f.icmp6_type == netpkt.ND_RA:
            self.rec.router_advert = e.data
            return self.solicited_ns is not None and e.vm_ns - self.solicited_ns <= SOLICITED_RA_NS
        return f.icmp6_type == netpkt.ND_NA


    def _asks_time(self, fl: Flow, new: bytes) -> None:
        """Whether a RESP client's bytes so far hold a TIME command (the command may
        straddle two segments: the last few bytes of the one before are kept)."""
        seen = self.resp_tail.get(fl.index, b"") + new
        if TIME_REQUEST.search(seen):
            fl.asks_time = True
            self.resp_tail.pop(fl.index, None)
        else:
            self.resp_tail[fl.index] = seen[-TIME_TAIL:]

    def _udp_request(self, f: netpkt.Frame, vm_ns: int) -> None:
        """A datagram the guest started: a request whose replies come next."""
        ex = Exchange(self.rec.exchanges_dropped + len(self.rec.exchanges), request_key(f.dport, f.payload), vm_ns,
                      f.payload, (f.ip_dst, f.dport))
        self.rec.exchanges.append(ex)
        self.asked[(f.sport, f.dport)] = (ex, f.flow())


IP_TYPES = (netpkt.ETH_IP, netpkt.ETH_IP6)
# A router advertisement this soon after the guest's solicitation answers it (QEMU's user
# network answers at once; its unsolicited ones come on a timer, minutes apart).
SOLICITED_RA_NS = 1_000_000_000


HTTP_REQUEST = re.compile(rb"(?:GET|HEAD|POST|PUT|DELETE|OPTIONS|PATCH|CONNECT|TRACE) \S")
RESP_REQUEST = re.compile(rb"\*\d{1,9}\r\n\$\d{1,9}\r\n")
# redis's TIME: a line "TIME", the command's array element ("*1\r\n$4\r\nTIME\r\n") or an
# inline command (an argument "TIME" too: that only lets TIME's reply shape be masked)
TIME_REQUEST = re.compile(rb"(?i)(?:^|\n)time\r?\n")
TIME_TAIL = 8       # bytes kept between segments: "\nTIME\r\n" less its last byte, and one more


def protocol_of(first: bytes) -> str:
    """What a connection carries, from the first bytes its client sent: an HTTP/1.x
    request line, a RESP (redis) command array, or else lines."""
    if HTTP_REQUEST.match(first):
        return "http"
    if RESP_REQUEST.match(first):
        return "resp"
    return "line"


def _new_bytes(expected: int, seq: int, payload: bytes) -> bytes:
    """The part of payload at or after the expected sequence number (mod 2^32)."""
    skip = (expected - seq) & 0xFFFFFFFF
    if skip >= 0x80000000:      # a gap: data beyond what was expected (not on a virtual link)
        return payload
    return payload[skip:] if skip < len(payload) else b""
