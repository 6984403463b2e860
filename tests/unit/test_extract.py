"""Extracting a recording's inputs from the native's device log (semantic.inputs.InputExtractor),
against scripted events: each scenario is what the device log holds (frames both ways,
console output and input, entropy, as pcapng.DevlogReader yields them) and the inputs,
flows and limits a semantic replay must get from it. tests/test_semantic.py and
tests/test_live.py extract the same way from real recordings."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tandem.formats import netpkt, pcapng
from tandem.formats.netpkt import ACK, FIN, PSH, RST, SYN
from tandem.semantic.inputs import CLOSED_GRACE_NS, PRE_RECORDING, InputExtractor, RecordedInputs, from_events

from ipv6_frames import ALL_NODES, ALL_ROUTERS, CLIENT_IP6, GUEST_IP6, MLD_ROUTERS, ROUTER6, nd6

CMAC, GMAC = bytes.fromhex("52550a000202"), bytes.fromhex("525400123456")
CLIENT_IP, GUEST_IP, GUEST_PORT = bytes([10, 0, 2, 2]), bytes([10, 0, 2, 15]), 7
C_ISN, G_ISN = 1000, 5000               # client's and guest's initial sequence numbers
S = 1_000_000_000
CHANNELS = {"net": (0, "net0"), "serial": (1, "serial0"), "rng": (2, "rng0")}


class Log:
    """A device log's events, built one at a time. TCP segments carry the next sequence
    number of their side unless `rel` (bytes after the side's initial one) says otherwise
    (a retransmission, an overlap, a gap); only the default advances it."""

    def __init__(self, client_isn: int = C_ISN, ip: tuple[bytes, bytes] = (CLIENT_IP, GUEST_IP)):
        self.ip = ip
        self.events: list[pcapng.Event] = []
        self.next: dict[tuple[str, int], int] = {}
        self.isn = {"in": client_isn, "out": G_ISN}

    def add(self, kind: str, direction: str, ns: int, data: bytes) -> Log:
        iface, channel = CHANNELS[kind]
        self.events.append(pcapng.Event(len(self.events), iface, channel, kind, direction, ns, ns, data, 0))
        return self

    def tcp(self, direction: str, ns: int, flags: int, payload: bytes = b"", *, port: int = 40000,
            rel: int | None = None) -> Log:
        isn = self.isn[direction]
        if rel is None:
            seq = self.next.get((direction, port), isn)
            self.next[(direction, port)] = seq + len(payload) + (1 if flags & (SYN | FIN) else 0)
        else:
            seq = isn + rel
        peer = self.next.get(("out" if direction == "in" else "in", port), 0)
        client, guest = (self.ip[0], port), (self.ip[1], GUEST_PORT)
        (smac, src), (dmac, dst) = ((CMAC, client), (GMAC, guest)) if direction == "in" else \
            ((GMAC, guest), (CMAC, client))
        return self.add("net", direction, ns, netpkt.tcp(smac, dmac, src[0], dst[0], src[1], dst[1], seq, peer,
                                                          flags, 64240, payload))

    def open(self, ns: int, port: int = 40000) -> Log:
        """The three-way handshake, the client's SYN at ns."""
        return self.tcp("in", ns, SYN, port=port).tcp("out", ns + 1, SYN | ACK, port=port) \
            .tcp("in", ns + 2, ACK, port=port)

    def console(self, ns: int, text: bytes) -> Log:
        return self.add("serial", "out", ns, text)


def summary(rec: RecordedInputs) -> list[tuple]:
    return [(i.kind, i.vm_ns, i.data, i.flow, i.offset, i.needs_bytes, i.needs_line) for i in rec.inputs]


def udp_in() -> bytes:
    return netpkt.udp(CMAC, GMAC, CLIENT_IP, GUEST_IP, 53, 514, b"datagram")


def icmp_in() -> bytes:
    """An echo request (the frame is re-sent whole, so only its headers matter here)."""
    l4 = bytes([8, 0, 0, 0, 0, 1, 0, 1]) + b"ping"
    return GMAC + CMAC + b"\x08\x00" + netpkt._ipv4(CLIENT_IP, GUEST_IP, netpkt.PROTO_ICMP, l4, 1)


def fragment(frame: bytes) -> bytes:
    """The frame with IPv4's more-fragments flag set."""
    return frame[:20] + bytes([frame[20] | 0x20]) + frame[21:]


# name -> (the log, the inputs as (kind, ns, data, flow, offset, needs_bytes, needs_line), limits)
SCENARIOS = {
    "open": (Log().open(10), [("tcp-open", 10, b"", 0, 0, {}, None)], []),
    "retransmitted SYN": (Log().tcp("in", 10, SYN).tcp("in", 20, SYN, rel=0).tcp("out", 21, SYN | ACK),
                          [("tcp-open", 10, b"", 0, 0, {}, None)], []),
    "data in order": (
        Log().open(10).tcp("in", 20, ACK | PSH, b"GET a\n").tcp("in", 30, ACK | PSH, b"GET b\n"),
        [("tcp-open", 10, b"", 0, 0, {}, None), ("tcp-data", 20, b"GET a\n", 0, 0, {}, None),
         ("tcp-data", 30, b"GET b\n", 0, 6, {}, None)], []),
    # Only new bytes: a retransmission is no input, an overlap gives its tail.
    "retransmission and overlap": (
        Log().open(10).tcp("in", 20, ACK | PSH, b"GET a\n").tcp("in", 25, ACK | PSH, b"GET a\n", rel=1)
        .tcp("in", 30, ACK | PSH, b"a\nGET b\n", rel=5),
        [("tcp-open", 10, b"", 0, 0, {}, None), ("tcp-data", 20, b"GET a\n", 0, 0, {}, None),
         ("tcp-data", 30, b"GET b\n", 0, 6, {}, None)], []),
    # A segment beyond the expected byte is taken whole (a virtual link loses nothing);
    # the one it skipped then reads as a retransmission.
    "out of order": (
        Log().open(10).tcp("in", 20, ACK | PSH, b"GET b\n", rel=7).tcp("in", 30, ACK | PSH, b"GET a\n", rel=1),
        [("tcp-open", 10, b"", 0, 0, {}, None), ("tcp-data", 20, b"GET b\n", 0, 0, {}, None)], []),
    "sequence numbers wrap": (      # "ab" at 2^32 - 1, "cd" at 1
        Log(client_isn=2**32 - 2).open(10).tcp("in", 20, ACK | PSH, b"ab").tcp("in", 30, ACK | PSH, b"cd"),
        [("tcp-open", 10, b"", 0, 0, {}, None), ("tcp-data", 20, b"ab", 0, 0, {}, None),
         ("tcp-data", 30, b"cd", 0, 2, {}, None)], []),
    "client FIN with data": (
        Log().open(10).tcp("in", 20, ACK | PSH | FIN, b"QUIT\n"),
        [("tcp-open", 10, b"", 0, 0, {}, None), ("tcp-data", 20, b"QUIT\n", 0, 0, {}, None),
         ("tcp-fin", 20, b"", 0, 5, {}, None)], []),
    "client FIN past a gap is not the end": (
        Log().open(10).tcp("in", 20, ACK | FIN, rel=9),
        [("tcp-open", 10, b"", 0, 0, {}, None)], []),
    "guest FIN is no input": (
        Log().open(10).tcp("out", 20, ACK | FIN).tcp("in", 30, ACK | FIN),
        [("tcp-open", 10, b"", 0, 0, {}, None), ("tcp-fin", 30, b"", 0, 0, {}, None)], []),
    "client RST": (
        Log().open(10).tcp("in", 20, ACK | PSH, b"x").tcp("in", 30, RST),
        [("tcp-open", 10, b"", 0, 0, {}, None), ("tcp-data", 20, b"x", 0, 0, {}, None),
         ("tcp-rst", 30, b"", 0, 1, {}, None)], []),
    # The reset freed the 4-tuple at once: the next SYN on it is a new flow.
    "port reused after a reset": (
        Log().open(10).tcp("in", 20, RST).tcp("in", 30, ACK | PSH, b"late", rel=1).tcp("in", 40, SYN, rel=500),
        [("tcp-open", 10, b"", 0, 0, {}, None), ("tcp-rst", 20, b"", 0, 0, {}, None),
         ("tcp-open", 40, b"", 1, 0, {}, None)], [PRE_RECORDING]),
    "connection opened before the recording": (
        Log().tcp("in", 10, ACK | PSH, b"GET a\n").tcp("in", 20, ACK), [], [PRE_RECORDING]),
    "bare ACK of an unknown connection": (Log().tcp("in", 10, ACK), [], [PRE_RECORDING]),
    # A connection the guest opens (nginx to its backend): no tcp-open, the analysis guest
    # opens its own; the server's bytes are inputs needing the request the guest had sent
    # by then, its FIN too; a refusal is no input (the peer refuses the SYN itself).
    "guest opens a connection": (Log().tcp("out", 10, SYN), [], []),
    "guest-opened: the server answers the request": (
        Log().tcp("out", 10, SYN).tcp("in", 11, SYN | ACK).tcp("in", 12, SYN | ACK, rel=0).tcp("out", 13, ACK)
        .tcp("out", 20, ACK | PSH, b"GET /a HTTP/1.0\r\n").tcp("out", 21, ACK | PSH, b"\r\n")
        .tcp("in", 30, ACK | PSH, b"HTTP/1.0 200 OK\r\n\r\nhi").tcp("in", 31, ACK | FIN).tcp("out", 32, ACK | FIN),
        [("tcp-data", 30, b"HTTP/1.0 200 OK\r\n\r\nhi", 0, 0, {0: 19}, None), ("tcp-fin", 31, b"", 0, 21, {}, None)],
        []),
    "guest-opened: the server speaks first": (
        Log().tcp("out", 10, SYN).tcp("in", 11, SYN | ACK).tcp("in", 20, ACK | PSH, b"220 ready\r\n")
        .tcp("out", 30, ACK | PSH, b"HELO\r\n").tcp("in", 40, ACK | PSH, b"250 hi\r\n"),
        [("tcp-data", 20, b"220 ready\r\n", 0, 0, {}, None), ("tcp-data", 40, b"250 hi\r\n", 0, 11, {0: 6}, None)],
        []),
    "guest-opened: refused, then tried again": (
        Log().tcp("out", 10, SYN).tcp("in", 11, RST | ACK).tcp("out", 20, SYN, rel=100).tcp("in", 21, SYN | ACK)
        .tcp("in", 30, ACK | PSH, b"late"),
        [("tcp-data", 30, b"late", 1, 0, {}, None)], []),
    "guest-opened: a reset by the server is an input": (
        Log().tcp("out", 10, SYN).tcp("in", 11, SYN | ACK).tcp("out", 20, ACK | PSH, b"x").tcp("in", 30, RST),
        [("tcp-rst", 30, b"", 0, 0, {0: 1}, None)], []),
    "UDP, ICMP, ARP, LLDP, fragments": (
        Log().add("net", "in", 10, udp_in()).add("net", "in", 20, icmp_in())
        .add("net", "in", 30, netpkt.arp_reply(CMAC, CLIENT_IP, GMAC, GUEST_IP))
        .add("net", "in", 40, GMAC + CMAC + b"\x88\xcc" + bytes(40))
        .add("net", "in", 50, fragment(udp_in())).add("net", "in", 60, b"\x00" * 10),
        [("frame", 10, udp_in(), None, 0, {}, None), ("frame", 20, icmp_in(), None, 0, {}, None)],
        ["frames of ethertype 0x88cc", "IPv4 fragments"]),
    # IPv6 as an ordinary guest's network has it from boot (QEMU's user network): the
    # network's answers to the guest's solicitations are the replayer's to give, as ARP's
    # are; a router's periodic advertisement, its neighbour solicitation, an echo request
    # are inputs; UDP and TCP over IPv6 as over IPv4.
    "IPv6 neighbour discovery": (
        Log().add("net", "out", 10, nd6("out", netpkt.ND_RS, ALL_ROUTERS))
        .add("net", "in", 11, nd6("in", netpkt.ND_RA, ALL_NODES))
        .add("net", "out", 20, nd6("out", netpkt.ND_NS, ROUTER6, target=ROUTER6))
        .add("net", "in", 21, nd6("in", netpkt.ND_NA, GUEST_IP6, target=ROUTER6))
        .add("net", "out", 25, nd6("out", 143, MLD_ROUTERS))            # an MLDv2 report: output only
        .add("net", "in", 30 * S, nd6("in", netpkt.ND_RA, ALL_NODES))      # unsolicited, 30 s on
        .add("net", "in", 31 * S, nd6("in", netpkt.ND_NS, GUEST_IP6, target=GUEST_IP6))
        .add("net", "in", 32 * S, nd6("in", 128, GUEST_IP6)),             # an echo request
        [("frame", 30 * S, nd6("in", netpkt.ND_RA, ALL_NODES), None, 0, {}, None),
         ("frame", 31 * S, nd6("in", netpkt.ND_NS, GUEST_IP6, target=GUEST_IP6), None, 0, {}, None),
         ("frame", 32 * S, nd6("in", 128, GUEST_IP6), None, 0, {}, None)], []),
    "TCP and UDP over IPv6": (
        Log(ip=(CLIENT_IP6, GUEST_IP6)).open(10).tcp("in", 20, ACK | PSH, b"GET a\n")
        .tcp("out", 30, ACK | PSH, b"VALUE 1\n").tcp("in", 40, ACK | FIN)
        .add("net", "in", 50, netpkt.udp(CMAC, GMAC, CLIENT_IP6, GUEST_IP6, 53, 514, b"datagram")),
        [("tcp-open", 10, b"", 0, 0, {}, None), ("tcp-data", 20, b"GET a\n", 0, 0, {}, None),
         ("tcp-fin", 40, b"", 0, 6, {0: 8}, None),
         ("frame", 50, netpkt.udp(CMAC, GMAC, CLIENT_IP6, GUEST_IP6, 53, 514, b"datagram"), None, 0, {}, None)], []),
    # A serial input depends on the native's last userland console line, counted per
    # text; kernel lines and a line not yet ended do not count.
    "serial input and its line": (
        Log().add("serial", "in", 5, b"x\n").console(10, b"READY\n").console(11, b"[    1.000000] eth0 up\n")
        .add("serial", "in", 20, b"ls\n").console(30, b"READY\nREA").add("serial", "in", 40, b"id\n"),
        [("serial", 5, b"x\n", None, 0, {}, None), ("serial", 20, b"ls\n", None, 2, {}, (b"READY", 1)),
         ("serial", 40, b"id\n", None, 5, {}, (b"READY", 2))], []),
    # ... and so does a new connection (a client that waited for the guest to be ready),
    # not data on an open one.
    "a connection waits for a line": (
        Log().console(5, b"TANDEM-READY\n").open(10).tcp("in", 20, ACK | PSH, b"x"),
        [("tcp-open", 10, b"", 0, 0, {}, (b"TANDEM-READY", 1)), ("tcp-data", 20, b"x", 0, 0, {}, None)], []),
    # Entropy is a pool, no request: it carries no dependency and leaves the pending ones
    # to the next input.
    "entropy": (
        Log().open(10).tcp("in", 20, ACK | PSH, b"GET a\n").tcp("out", 30, ACK | PSH, b"VALUE 1\n")
        .add("rng", "in", 40, b"\x42" * 16).add("rng", "out", 45, b"\x01").tcp("in", 50, ACK | PSH, b"GET b\n"),
        [("tcp-open", 10, b"", 0, 0, {}, None), ("tcp-data", 20, b"GET a\n", 0, 0, {}, None),
         ("rng", 40, b"\x42" * 16, None, 0, {}, None), ("tcp-data", 50, b"GET b\n", 0, 6, {0: 8}, None)], []),
    # An input needs the guest's bytes per flow as they were when it arrived, only for the
    # flows whose output grew since the input before; a retransmission is not output twice.
    "needs_bytes grows with the guest's output": (
        Log().open(10).open(13, port=40001).tcp("in", 20, ACK | PSH, b"GET a\n")
        .tcp("out", 21, ACK | PSH, b"VALUE ").tcp("out", 22, ACK | PSH, b"VALUE ", rel=1)
        .tcp("out", 23, ACK | PSH, b"1\n").tcp("in", 30, ACK | PSH, b"GET b\n")
        .tcp("in", 40, ACK | PSH, b"GET c\n", port=40001).tcp("out", 41, ACK | PSH, b"X\n", port=40001)
        .tcp("out", 42, ACK | PSH, b"NOT FOUND\n").tcp("in", 50, ACK | PSH, b"GET d\n"),
        [("tcp-open", 10, b"", 0, 0, {}, None), ("tcp-open", 13, b"", 1, 0, {}, None),
         ("tcp-data", 20, b"GET a\n", 0, 0, {}, None), ("tcp-data", 30, b"GET b\n", 0, 6, {0: 8}, None),
         ("tcp-data", 40, b"GET c\n", 1, 0, {}, None), ("tcp-data", 50, b"GET d\n", 0, 12, {0: 18, 1: 2}, None)],
        []),
    # A closed flow's parse state is kept CLOSED_GRACE_NS for its last ACKs and
    # retransmissions (a retransmitted FIN is no second input), then forgotten: the same
    # segment is then one of a connection the recording does not know.
    "a closed flow is retired": (
        Log().open(10).tcp("in", 20, ACK | FIN).tcp("out", 30, ACK | FIN)
        .tcp("in", 40, ACK | FIN, rel=1).add("serial", "out", 30 + CLOSED_GRACE_NS + 1, b".")
        .tcp("in", 30 + CLOSED_GRACE_NS + 2, ACK | FIN, rel=1),
        [("tcp-open", 10, b"", 0, 0, {}, None), ("tcp-fin", 20, b"", 0, 0, {}, None)], [PRE_RECORDING]),
    # The guest's last bytes on a flow that then closes are still needed by the next
    # input, however long after the flow was retired it comes (it raised KeyError).
    "output of a flow retired before the next input": (
        Log().open(10).tcp("in", 20, ACK | PSH | FIN, b"QUIT\n").tcp("out", 30, ACK | PSH, b"BYE\n")
        .tcp("out", 31, ACK | FIN).console(40 + CLOSED_GRACE_NS, b"$ ")
        .add("serial", "in", 50 + CLOSED_GRACE_NS, b"ls\n"),
        [("tcp-open", 10, b"", 0, 0, {}, None), ("tcp-data", 20, b"QUIT\n", 0, 0, {}, None),
         ("tcp-fin", 20, b"", 0, 5, {}, None), ("serial", 50 + CLOSED_GRACE_NS, b"ls\n", None, 0, {0: 4}, None)], []),
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_inputs_of_scripted_events(name):
    log, want, limits = SCENARIOS[name]
    rec = from_events(log.events, end_ns=99)
    assert summary(rec) == want
    assert rec.limits == limits
    assert rec.end_ns == 99


@pytest.mark.parametrize("name", SCENARIOS)
def test_events_fed_in_two_parts_give_the_same_inputs(name):
    """The live path feeds the events as the native's log grows: any split must give
    what the whole log gives (the extractor keeps every flow's state between calls)."""
    events = SCENARIOS[name][0].events
    whole = from_events(events)
    for cut in range(len(events) + 1):
        ex = InputExtractor(RecordedInputs([], [], None, []))
        ex.feed(iter(events[:cut]))
        rec = ex.feed(iter(events[cut:]))
        assert (rec.inputs, rec.flows, rec.limits, rec.known_ns, rec.serial_out, rec.udp_out) == \
            (whole.inputs, whole.flows, whole.limits, whole.known_ns, whole.serial_out, whole.udp_out), cut


def test_a_flow_records_both_ends_and_the_guests_ordered_output():
    rec = from_events(Log().console(1, b"READY\n").open(10).tcp("out", 20, ACK | PSH, b"VALUE ")
                      .tcp("out", 21, ACK | PSH, b"VALUE ", rel=1).tcp("out", 22, ACK | PSH, b"1\n")
                      .tcp("in", 30, ACK | FIN).tcp("out", 31, ACK | FIN)
                      .add("net", "out", 40, netpkt.udp(GMAC, CMAC, GUEST_IP, CLIENT_IP, 514, 53, b"log"))
                      .events)
    (fl,) = rec.flows
    assert (fl.index, fl.client, fl.server, fl.client_mac, fl.guest_mac, fl.opened_ns) == \
        (0, (CLIENT_IP, 40000), (GUEST_IP, GUEST_PORT), CMAC, GMAC, 10)
    assert list(fl.guest_data) == [(20, b"VALUE "), (22, b"1\n")] and fl.guest_bytes == 8 and fl.client_bytes == 0
    assert fl.closed and fl.name() == "10.0.2.2:40000->10.0.2.15:7"
    assert list(rec.serial_out) == [(1, b"READY\n")] and rec.udp_out == [(40, (CLIENT_IP, 53), b"log")]


@pytest.mark.parametrize("closing, closed", [
    ([("in", ACK | FIN)], False), ([("out", ACK | FIN)], False),
    ([("in", ACK | FIN), ("out", ACK | FIN)], True), ([("out", ACK | FIN), ("in", ACK | FIN)], True),
    ([("in", RST)], True), ([("out", RST)], True), ([("out", ACK | RST)], True)],
    ids=["client FIN", "guest FIN", "client then guest FIN", "guest then client FIN", "client RST",
         "guest RST", "guest ACK RST"])
def test_a_flow_is_closed_by_a_fin_from_each_side_or_a_reset(closing, closed):
    log = Log().open(10)
    for k, (direction, flags) in enumerate(closing):
        log.tcp(direction, 20 + k, flags)
    ex = InputExtractor(RecordedInputs([], [], None, []))
    ex.feed(log.events)
    assert ex.rec.flows[0].closed == closed
    assert [c[2] for c in ex.closing] == ([0] if closed else [])
    # Forgotten once CLOSED_GRACE_NS has passed since the close, and only then.
    ex.feed(Log().console(20 + CLOSED_GRACE_NS, b".").events)
    assert ex.client_next == {0: C_ISN + 1 + sum(1 for d, f in closing if d == "in" and f & FIN)}
    ex.feed(Log().console(22 + CLOSED_GRACE_NS, b".").events)
    assert (ex.by_tuple == {}, ex.client_next == {}, ex.guest_next == {}, ex.fins == {}) == (closed,) * 4


def test_a_guest_opened_flow_says_who_opened_it_what_it_asked_and_how_it_was_answered():
    log = Log().tcp("out", 10, SYN).tcp("in", 11, SYN | ACK).tcp("out", 20, ACK | PSH, b"*1\r\n$4\r\nPING\r\n")
    log.tcp("in", 30, ACK | PSH, b"+PONG\r\n").tcp("out", 40, ACK | PSH, b"*1\r\n$4\r\nQUIT\r\n")
    log.tcp("out", 50, SYN, port=40001).tcp("in", 51, RST | ACK, port=40001)
    rec = from_events(log.events)
    fl, refused = rec.flows
    assert (fl.guest_opened, fl.client, fl.server, fl.client_mac, fl.guest_mac, fl.opened_ns) == \
        (True, (CLIENT_IP, 40000), (GUEST_IP, GUEST_PORT), CMAC, GMAC, 10)
    # the guest is the client: its first bytes say the protocol, and its request is what
    # it sent before the server's first byte
    assert (fl.answer, fl.protocol, fl.request) == ("accepted", "resp", b"*1\r\n$4\r\nPING\r\n")
    assert fl.guest_bytes == 28 and fl.client_bytes == 7 and fl.name() == "10.0.2.15:7->10.0.2.2:40000"
    assert (refused.answer, refused.closed, refused.closed_ns, refused.guest_opened) == ("refused", True, 51, True)


def test_the_live_recording_fills_in_as_events_come():
    """What a replayer following a live native sees between two feeds."""
    rec = RecordedInputs([], [], None, [], finished=False)
    ex = InputExtractor(rec)
    log = Log().console(5, b"READY\n").open(10).tcp("in", 20, ACK | PSH, b"GET a\n")
    ex.feed(iter(log.events))
    assert [i.kind for i in rec.inputs] == ["tcp-open", "tcp-data"] and rec.known_ns == 20
    fed = len(log.events)
    log.tcp("out", 30, ACK | PSH, b"OK\n").tcp("in", 40, ACK | PSH, b"GET b\n").tcp("in", 50, ACK)
    log.tcp("in", 60, ACK, port=40009)
    ex.feed(iter(log.events[fed:]))
    assert summary(rec)[2:] == [("tcp-data", 40, b"GET b\n", 0, 6, {0: 3}, None)]
    assert rec.known_ns == 60 and rec.limits == [PRE_RECORDING] and not rec.finished


def test_the_device_logs_own_events_give_the_scripted_inputs(tmp_path):
    """The scripted events are what pcapng.DevlogReader yields from a written log."""
    log = SCENARIOS["needs_bytes grows with the guest's output"][0]
    w = pcapng.PcapngWriter(tmp_path / "devices.pcapng")
    ifaces = {kind: w.add_interface(channel, kind) for kind, (_, channel) in CHANNELS.items()}
    for e in log.events:
        w.event(ifaces[e.kind], e.direction, e.vm_ns, e.data, icount=e.icount)
    w.close(end_vm_ns=100)
    read = from_events(pcapng.DevlogReader(tmp_path / "devices.pcapng"))
    scripted = from_events(log.events)
    assert summary(read) == summary(scripted) and len(summary(read)) == 6
    assert [dataclasses.astuple(i) for i in read.inputs] == [dataclasses.astuple(i) for i in scripted.inputs]


ACTIONS = ["open", "request", "reply", "retransmit", "gap", "client FIN", "guest FIN", "client RST",
           "guest RST", "segment", "console", "serial in", "rng", "udp", "wait"]
STEPS = st.lists(st.tuples(st.sampled_from(ACTIONS), st.sampled_from([40000, 40001]),
                           st.sampled_from([SYN, ACK, ACK | PSH, ACK | FIN, RST]), st.sampled_from(["in", "out"])),
                 min_size=10, max_size=80)


def scripted(steps) -> Log:
    """A log of these actions, each on one of two client ports: whole exchanges (a flow
    opened, a request and its reply, either side closing or resetting) and raw segments."""
    log, ns = Log(), 0
    for what, port, flags, direction in steps:
        ns += CLOSED_GRACE_NS + 1 if what == "wait" else 1000
        sent = log.next.get((direction, port), log.isn[direction]) - log.isn[direction]
        if what == "open":
            log.open(ns, port)
        elif what in ("request", "reply"):
            log.tcp("in" if what == "request" else "out", ns, ACK | PSH, b"GET a\n", port=port)
        elif what in ("retransmit", "gap"):        # the last 4 bytes again, or 4 bytes past a hole
            log.tcp(direction, ns, ACK | PSH, b"abcd", port=port, rel=max(0, sent - 4) if what == "retransmit"
                    else sent + 4)
        elif what.endswith(("FIN", "RST")):
            log.tcp("in" if what.startswith("client") else "out", ns, ACK | FIN if what.endswith("FIN") else RST,
                    port=port)
        elif what == "segment":
            log.tcp(direction, ns, flags, b"" if flags & SYN else b"x", port=port)
        elif what == "udp":
            log.add("net", "in", ns, udp_in())
        elif what != "wait":
            kind, d = {"console": ("serial", "out"), "serial in": ("serial", "in"), "rng": ("rng", "in")}[what]
            log.add(kind, d, ns, b"READY\n" if port == 40000 else b"ls\n")
    return log


@settings(max_examples=300, deadline=None)
@given(STEPS, st.data())
def test_any_log_fed_in_parts_gives_what_the_whole_log_gives(steps, data):
    """Any traffic (flows opened, reset and reused, retransmissions, gaps, flows retired
    between inputs), cut anywhere: the live path's inputs are the offline path's."""
    events = scripted(steps).events
    whole = from_events(events)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(events)), max_size=3)))
    ex = InputExtractor(RecordedInputs([], [], None, []))
    for a, b in zip([0] + cuts, cuts + [len(events)]):
        ex.feed(iter(events[a:b]))
    rec = ex.rec
    assert (rec.inputs, rec.flows, rec.limits, rec.known_ns, rec.serial_out) == \
        (whole.inputs, whole.flows, whole.limits, whole.known_ns, whole.serial_out)
    assert all(i.flow is None or 0 <= i.flow < len(rec.flows) for i in rec.inputs)


@pytest.mark.parametrize("answer, flags", [("accepted", SYN | ACK), ("refused", ACK | RST), (None, None)],
                         ids=["SYN-ACK", "RST", "not yet"])
def test_the_natives_answer_to_a_syn_is_kept_on_its_flow(answer, flags):
    log = Log().tcp("in", 10, SYN)
    if flags is not None:
        log.tcp("out", 11, flags)
    (fl,) = from_events(log.events).flows
    assert fl.answer == answer


def test_a_reset_after_the_handshake_leaves_the_flow_accepted():
    (fl,) = from_events(Log().open(10).tcp("out", 20, ACK | RST).events).flows
    assert fl.answer == "accepted" and fl.closed


def test_the_last_router_advertisement_is_kept_as_the_answer_to_give():
    rec = from_events(SCENARIOS["IPv6 neighbour discovery"][0].events)
    assert rec.router_advert == nd6("in", netpkt.ND_RA, ALL_NODES)
    assert from_events(SCENARIOS["entropy"][0].events).router_advert is None
