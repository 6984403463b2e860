"""UDP exchanges the guest starts (DHCP, DNS, NTP, a UDP backend), answered from the
recording by the guest's request, not at their recorded time.

An ordinary guest's first traffic is its own: networkd's DHCP DISCOVER, a resolver's
query. The native's network answered it; an analysis guest asks again, with its own
transaction ID (drawn from its own random numbers), maybe earlier or later in VM time
(a KASAN kernel boots slower). A reply re-sent at its recorded time, as a datagram the
remote side started is, would carry the native's ID and be dropped: the analysis guest
would never get an address. So each datagram the native's guest sent is a *request*,
and the datagrams that came back from where it went, to the port it came from, before
its next request there, are its *replies* (inputs.InputExtractor builds them). When the
analysis guest sends a request, the next recorded request with the same key (what it
asks, not its IDs: `request_key`) is taken, and its replies go to the analysis guest
rewritten to its request (its transaction ID, hardware address, port and address):
`Answers.on_request`. A request with no recorded match is reported once per key; one
that repeats the last answered request of its key (the same transaction from the same
port: a client's retransmission, which a slower analysis kernel makes where the native
did not) is answered as it was, as the native's server would have.

Keys: DHCP by message type (DISCOVER, REQUEST, ...), DNS by question (name and type),
NTP by port, anything else by its payload (a UDP backend answers the same request the
same way).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ...formats import netpkt
from ...formats.wire import DHCP_CLIENT, DHCP_SERVER, DHCP_TYPES, DNS, dhcp_type, dns_question

NTP = 123
BROADCAST = b"\xff\xff\xff\xff"


@dataclass
class Exchange:
    """A request the native's guest sent, and what came back for it."""
    index: int
    key: tuple
    vm_ns: int                  # when the native's guest sent it
    request: bytes              # its UDP payload
    dst: tuple[bytes, int]      # where it went (ip, port)
    replies: list[tuple[int, bytes]] = field(default_factory=list)   # (ns after the request, frame)

    def describe(self) -> str:
        return f"udp {netpkt.ip_str(self.dst[0])}:{self.dst[1]} {describe_key(self.key)}"


def request_key(dport: int, payload: bytes) -> tuple:
    """What a guest's request asks, without what differs between two guests asking it."""
    if dport == DHCP_SERVER and (t := dhcp_type(payload)) is not None:
        return ("dhcp", t)
    if dport == DNS and (q := dns_question(payload)) is not None:
        return ("dns", (q[0].lower(), q[1]))
    if dport == NTP:
        return ("ntp",)
    return ("udp", dport, payload)


def describe_key(key: tuple) -> str:
    if key[0] == "dhcp":
        return f"DHCP {DHCP_TYPES.get(key[1], key[1])}"
    if key[0] == "dns":
        return f"DNS query {key[1][0]!r} type {key[1][1]}"
    if key[0] == "ntp":
        return "NTP request"
    return f"request of {len(key[2])} bytes {key[2][:24]!r}"


def answers(reply: netpkt.Frame, sent: tuple[bytes, int, bytes, int]) -> bool:
    """Is `reply` (a datagram to the guest) an answer to a request `sent` as (src ip,
    src port, dst ip, dst port)? From where it went, to the port it came from; a request
    broadcast (DHCP) is answered from any address."""
    _, sport, dst_ip, dport = sent
    return reply.sport == dport and reply.dport == sport and (reply.ip_src == dst_ip or dst_ip == BROADCAST)


def rewrite(reply: bytes, request: netpkt.Frame) -> bytes:
    """A recorded reply to the native's request, made the answer to the analysis guest's
    `request`: to its MAC, port and address (unless the reply was broadcast), with its
    transaction ID (DHCP xid and client hardware address, DNS ID)."""
    f = netpkt.parse(reply)
    if f is None or f.proto != netpkt.PROTO_UDP:
        return reply
    payload = bytearray(f.payload)
    ask = request.payload
    if request.dport == DHCP_SERVER and len(payload) >= 44 and len(ask) >= 44:
        payload[4:8] = ask[4:8]             # xid
        payload[28:44] = ask[28:44]         # chaddr
    elif request.dport == DNS and len(payload) >= 2 and len(ask) >= 2:
        payload[0:2] = ask[0:2]             # ID
    dst_ip = f.ip_dst if f.ip_dst == BROADCAST or request.ip_src == b"\0\0\0\0" else request.ip_src
    dst_mac = f.dst if f.dst == b"\xff" * 6 else request.src
    return netpkt.udp(f.src, dst_mac, f.ip_src, dst_ip, f.sport, request.sport, bytes(payload))


def without_ids(dport: int, payload: bytes) -> bytes:
    """A guest's datagram as the comparator sees it: a DHCP or DNS message without what
    each guest draws at random or counts by itself (DHCP's transaction ID and seconds
    elapsed, DNS's query ID), which two guests asking the same never agree on; and a DHCP
    client identifier's value (option 61): systemd-networkd makes its IAID from the
    interface's name, which a kernel without the PCI slot information Debian's has names
    enp0s3, not ens3 (on the reference VM)."""
    if dport in (DHCP_SERVER, DHCP_CLIENT) and len(payload) >= 12 and dhcp_type(payload) is not None:
        out = bytearray(payload[:4] + bytes(6) + payload[10:])
        i = 240
        while i + 1 < len(out) and out[i] != 255:
            if out[i] == 0:
                i += 1
                continue
            n = out[i + 1]
            if out[i] == 61:
                out[i + 2:i + 2 + n] = bytes(len(out[i + 2:i + 2 + n]))
            i += 2 + n
        return bytes(out)
    if dport == DNS and len(payload) >= 2:
        return bytes(2) + payload[2:]
    return payload


def transaction(request: netpkt.Frame) -> tuple:
    """What stays the same when a client sends a request again: its port and its DHCP
    transaction or DNS query ID (RFC 2131 4.1, RFC 1035 7.2), or the whole payload."""
    ask = request.payload
    if request.dport == DHCP_SERVER and len(ask) >= 8:
        return (request.sport, ask[4:8])
    if request.dport == DNS and len(ask) >= 2:
        return (request.sport, ask[0:2])
    return (request.sport, ask)


class Answers:
    """The recorded exchanges, taken in order per key as the analysis guest asks."""

    def __init__(self) -> None:
        self.by_key: dict[tuple, deque[Exchange]] = {}
        self.unmatched: dict[tuple, str] = {}       # key -> the first such request, described
        self.last: dict[tuple, tuple[tuple, Exchange]] = {}    # key -> (transaction, exchange) answered last
        self.answered = 0
        self.retransmissions = 0

    def add(self, ex: Exchange) -> None:
        self.by_key.setdefault(ex.key, deque()).append(ex)

    def on_request(self, request: netpkt.Frame, now: int) -> list[tuple[int, bytes]] | None:
        """The analysis guest's request: its replies as (VM time to deliver, frame), or
        None when the recording holds no request like it (not taken yet, or none)."""
        key = request_key(request.dport, request.payload)
        q = self.by_key.get(key)
        if q:
            ex = q.popleft()
            self.last[key] = (transaction(request), ex)
            self.answered += 1
        elif (last := self.last.get(key)) is not None and last[0] == transaction(request):
            ex = last[1]                    # sent again, all recorded ones taken: answered again
            self.retransmissions += 1
        else:
            return None
        return [(now + delay, rewrite(frame, request)) for delay, frame in ex.replies]

    def miss(self, request: netpkt.Frame) -> str | None:
        """Note a request nothing in the recording answers: the line to report, the first
        time for its key (None after)."""
        key = request_key(request.dport, request.payload)
        if key in self.unmatched:
            return None
        self.unmatched[key] = line = (f"udp {netpkt.ip_str(request.ip_dst)}:{request.dport}: the guest's "
                                      f"{describe_key(key)} from port {request.sport} has no answer in the "
                                      "recording (the native's guest never asked it, or not that often)")
        return line
