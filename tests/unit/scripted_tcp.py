"""A scripted TCP peer's world for the semantic replay's loop: a native device log built
segment by segment, the analysis guest's end of a connection, and steps of what the
guest sends. Shared by test_guest_connections.py and test_rules.py (scripted_feed.py
plays QEMU)."""
from __future__ import annotations

from collections.abc import Callable

from tandem.formats import netpkt, pcapng
from tandem.formats.netpkt import ACK, FIN, SYN
from tandem.qemu.feed import NET, OUTPUT, Message
from tandem.semantic.inputs import RecordedInputs, from_events

from scripted_feed import ScriptedFeed, wait

GMAC, SMAC = bytes.fromhex("525400123456"), netpkt.GATEWAY_MAC
GUEST_IP, HOST_IP = bytes([10, 0, 2, 15]), bytes([10, 0, 2, 2])
BACKEND = (HOST_IP, 8081)
MS = 1_000_000
M32 = 0xFFFFFFFF

class Native:
    """The native's device log, one segment at a time."""

    def __init__(self) -> None:
        self.events: list[pcapng.Event] = []

    def frame(self, direction: str, ns: int, data: bytes) -> None:
        self.events.append(pcapng.Event(len(self.events), 0, "net0", "net", direction, ns, ns, data, 0))

    def conn(self, guest_port: int, remote: tuple[bytes, int] = BACKEND, g_isn: int = 5000,
             r_isn: int = 9000, guest_ip: bytes = GUEST_IP) -> Conn:
        return Conn(self, guest_port, remote, g_isn, r_isn, guest_ip)

    def recording(self, end_ns: int) -> RecordedInputs:
        return from_events(self.events, end_ns=end_ns)


class Conn:
    """One recorded connection; each side's sequence number advances with what it sends."""

    def __init__(self, log: Native, guest_port: int, remote: tuple[bytes, int], g_isn: int, r_isn: int,
                 guest_ip: bytes = GUEST_IP):
        self.log, self.guest_port, self.remote, self.guest_ip = log, guest_port, remote, guest_ip
        self.next = {"out": g_isn, "in": r_isn}

    def seg(self, direction: str, ns: int, flags: int, payload: bytes = b"") -> Conn:
        seq = self.next[direction]
        self.next[direction] = (seq + len(payload) + (1 if flags & (SYN | FIN) else 0)) & M32
        ack = self.next["in" if direction == "out" else "out"] if flags & ACK else 0
        g, r = (self.guest_ip, self.guest_port), self.remote
        (smac, src), (dmac, dst) = ((GMAC, g), (SMAC, r)) if direction == "out" else ((SMAC, r), (GMAC, g))
        self.log.frame(direction, ns, netpkt.tcp(smac, dmac, src[0], dst[0], src[1], dst[1], seq, ack, flags,
                                                 64240, payload, mss=1460 if flags & SYN else None))
        return self

    def guest_opens(self, ns: int) -> Conn:
        return self.seg("out", ns, SYN).seg("in", ns + 1, SYN | ACK).seg("out", ns + 2, ACK)

    def remote_opens(self, ns: int) -> Conn:
        return self.seg("in", ns, SYN).seg("out", ns + 1, SYN | ACK).seg("in", ns + 2, ACK)


class GuestEnd:
    """The analysis guest's end of a connection: its own port and initial sequence number.
    Its segments acknowledge everything the replayer has sent it so far (read off the feed)."""

    def __init__(self, port: int, remote: tuple[bytes, int] = BACKEND, isn: int = 0x7777_0000,
                 ip: bytes = GUEST_IP):
        self.port, self.remote, self.seq, self.ip = port, remote, isn, ip

    def segment(self, feed: ScriptedFeed, ns: int, flags: int, payload: bytes = b"") -> Message:
        frame = netpkt.tcp(GMAC, SMAC, self.ip, self.remote[0], self.port, self.remote[1], self.seq,
                           self.acked(feed) if flags & ACK else 0, flags, 64240, payload,
                           mss=1460 if flags & SYN else None)
        self.seq = (self.seq + len(payload) + (1 if flags & (SYN | FIN) else 0)) & M32
        return out(ns, frame)

    def acked(self, feed: ScriptedFeed) -> int:
        ends = [(f.seq + len(f.payload) + (1 if f.flags & (SYN | FIN) else 0)) & M32 for f in to_port(feed, self.port)]
        return max(ends, default=0)


def out(ns: int, frame: bytes) -> Message:
    return Message(OUTPUT, NET, ns, frame)


def to_port(feed: ScriptedFeed, port: int) -> list[netpkt.Frame]:
    """The TCP segments the replayer sent to this guest port, in order."""
    frames = [netpkt.parse(d) for ch, _, d in feed.inputs if ch == NET]
    return [f for f in frames if f is not None and f.proto == netpkt.PROTO_TCP and f.dport == port]


Step = Callable[[ScriptedFeed], list[Message]]


def at(ns: int, *sends: Callable[[ScriptedFeed], Message]) -> Step:
    """A step: the guest sends these (each made when the step runs, from what it got so
    far), then the VM stops at ns."""
    return lambda feed: [s(feed) for s in sends] + [wait(ns)]


def seg(end: GuestEnd, ns: int, flags: int, payload: bytes = b"") -> Callable[[ScriptedFeed], Message]:
    return lambda feed: end.segment(feed, ns, flags, payload)
