"""Release rules (semantic/network/rules.py, qemu-patches/0034): a client's next request, which
waits only for the guest's reply, goes to QEMU ahead with the sequence numbers the
guest's output must reach; QEMU fires it and says FIRED. Scripted as
test_guest_connections.py scripts a guest (scripted_tcp.py): here the recorded client opens a connection to
the guest's port 7000 and sends three requests, each after the guest's reply to the one
before. Real QEMU fires them in tests/test_semantic.py."""
from __future__ import annotations

import struct

from tandem.formats import netpkt
from tandem.formats.netpkt import ACK, PSH
from tandem.qemu.feed import FIRED, HEADER, NET, RULE, FeedServer, Message
from tandem.semantic.network import rules
from tandem.semantic.driving.driver import AnalysisDriver, DriveOptions
from tandem.semantic.inputs import RecordedInputs
from tandem.semantic.model import DEP_TIMEOUT_NS, AnalysisRun
from tandem.semantic.network.peer import PEER_MSS, Peer

from scripted_feed import Clock, ScriptedFeed, ScriptedVM, wait
from scripted_tcp import GUEST_IP, HOST_IP, MS, GuestEnd, Native, at, seg, to_port

CLIENT = (HOST_IP, 40000)
REQS = [b"SET a 1\r\n", b"GET a\r\n", b"GET b\r\n"]
REPLIES = [b"+OK\r\n", b"$1\r\n1\r\n", b"$-1\r\n"]


def recording() -> RecordedInputs:
    """Three requests on one connection the client opens at 10 ms, each after the reply."""
    log = Native()
    c = log.conn(7000, remote=CLIENT, g_isn=5000, r_isn=9000)
    c.seg("in", 10 * MS, netpkt.SYN).seg("out", 10 * MS + 1, netpkt.SYN | ACK).seg("in", 10 * MS + 2, ACK)
    for i, (req, rep) in enumerate(zip(REQS, REPLIES)):
        c.seg("in", (20 + 10 * i) * MS, ACK | PSH, req).seg("out", (21 + 10 * i) * MS, ACK | PSH, rep)
    return log.recording(end_ns=100 * MS)


def fired(ns: int, guest: GuestEnd) -> Message:
    """QEMU firing the oldest rule at ns: its segment acknowledges what the guest sent."""
    return Message(FIRED, 1, ns, struct.pack("<I", guest.seq))


def opened(guest: GuestEnd) -> list:
    """The peer's SYN at 10 ms; the guest, slower than the native, answers at 50 ms, when
    every request's recorded time has come: the first goes at that stop, the others wait
    for the guest's replies."""
    return [[wait(10 * MS)], at(50 * MS, seg(guest, 50 * MS, netpkt.SYN | ACK))]


def test_requests_that_wait_for_replies_go_as_rules_and_are_delivered_when_they_fire():
    guest = GuestEnd(7000, remote=CLIENT, isn=0x5000_0000)

    def replies(feed: ScriptedFeed) -> list[Message]:
        msgs = [guest.segment(feed, 51 * MS, ACK | PSH, REPLIES[0]), fired(52 * MS, guest)]
        return msgs + [guest.segment(feed, 53 * MS, ACK | PSH, REPLIES[1]), fired(54 * MS, guest), wait(60 * MS)]
    clock, vm = Clock(), ScriptedVM()
    feed = ScriptedFeed(opened(guest) + [replies], vm, clock)
    res = AnalysisRun("scripted")
    d = AnalysisDriver(recording(), res, vm, feed, DriveOptions(clock=clock))
    d.drive()

    key = struct.pack("!4s4sHH", GUEST_IP, HOST_IP, 7000, 40000)
    after = [(0x5000_0000 + 1 + n) & 0xFFFFFFFF for n in (len(REPLIES[0]), len(REPLIES[0] + REPLIES[1]))]
    (nb1, conds1, acks1, (frame1,)), (nb2, conds2, acks2, (frame2,)) = feed.rules[:2]
    assert (nb1, nb2) == (30 * MS, 40 * MS)                    # the requests' recorded times
    assert conds1 == [(key, after[0], True)] and conds2 == [(key, after[1], True)]
    assert acks1 == (key, after[0]) and acks2 == (key, after[1])
    f1, f2 = netpkt.parse(frame1), netpkt.parse(frame2)
    assert (f1.payload, f2.payload) == (REQS[1], REQS[2])
    first = [f for f in to_port(feed, 7000) if f.payload == REQS[0]][0]
    assert (f1.seq, f2.seq) == (first.seq + len(REQS[0]), first.seq + len(REQS[0] + REQS[1]))
    delivered = [(x.vm_ns, x.input.data) for x in res.delivered if x.input.kind == "tcp-data"]
    assert delivered == [(50 * MS, REQS[0]), (52 * MS, REQS[1]), (54 * MS, REQS[2])]
    assert res.rules_fired == 2
    pf = d.remote.peer.flows[0]
    assert pf.snd_nxt == 1 + len(b"".join(REQS))
    assert pf.ack_owed_ns is None                          # the rules' segments acknowledged the replies
    assert not any(f.payload == REQS[1] for f in to_port(feed, 7000))   # QEMU sent it, not a stop


def test_a_rule_that_waits_past_the_dependency_timeout_is_dropped_and_its_input_sent_as_a_limit():
    guest = GuestEnd(7000, remote=CLIENT, isn=0x5000_0000)
    script = opened(guest) + [lambda feed: [wait(feed.horizons[-1][0])]] * 40   # the guest never replies
    clock, vm = Clock(), ScriptedVM()
    feed = ScriptedFeed(script, vm, clock)
    res = AnalysisRun("scripted")
    AnalysisDriver(recording(), res, vm, feed, DriveOptions(clock=clock)).drive()
    # Both waiting requests as rules, dropped once; the third again after the second went.
    assert [netpkt.parse(r[3][0]).payload for r in feed.rules] == [REQS[1], REQS[2], REQS[2]]
    assert feed.unrules == 1
    assert any("after waiting" in lim and "GET a" in lim for lim in res.limits), res.limits
    sent = [ns for ns, f in ((ns, netpkt.parse(d)) for ch, ns, d in feed.inputs if ch == NET)
            if f is not None and f.payload == REQS[1]]
    assert sent and sent[0] >= 50 * MS + DEP_TIMEOUT_NS    # at a stop, once the rules were gone


def test_conditions_are_the_unmet_dependencies_as_sequence_numbers():
    peer = Peer()
    peer.open(3, CLIENT, (GUEST_IP, 7000), b"\x02" * 6, b"\x04" * 6, 0)
    fl = peer.flows[3]
    fl.state, fl.guest_isn, fl.guest_bytes = "established", 1000, 40
    from tandem.semantic.inputs import Input
    inp = Input("tcp-data", 0, b"x", flow=3, needs_bytes={3: 50})
    have = {3: 40}.get
    assert rules.conditions(inp, peer, lambda f, n: have(f, 0) >= n, {}) == [(fl.guest_key(), 1000 + 1 + 50, True)]
    assert rules.conditions(inp, peer, lambda f, n: 50 >= n, {}) == []          # met already: no condition
    assert rules.conditions(inp, peer, lambda f, n: 40 >= n, {3: 5}) == [(fl.guest_key(), 1000 + 1 + 45, True)]
    inp.needs_bytes = {3: 50, 4: 10}                       # a connection the peer has not opened
    assert rules.conditions(inp, peer, lambda f, n: False, {}) is None
    peer.open(4, (HOST_IP, 40001), (GUEST_IP, 7000), b"\x02" * 6, b"\x04" * 6, 0)
    other = peer.flows[4]
    other.state, other.guest_isn = "established", 9000
    assert rules.conditions(inp, peer, lambda f, n: False, {}) == [        # another client's bytes: order only
        (fl.guest_key(), 1000 + 1 + 50, True), (other.guest_key(), 9000 + 1 + 10, False)]


def test_a_rule_on_the_wire_is_what_qemu_reads(tmp_path):
    """qemu-patches/0034: u16 entries, u16 frames; per entry the 12-byte 4-tuple, u32
    sequence number, u32 flags (1: where the frames' ACK reaches, 2: own connection);
    per frame u32 length and the bytes."""
    feed = FeedServer(tmp_path / "feed.sock")
    key = bytes(range(12))
    feed.rule(7, [(key, 0x01020304, True), (key[::-1], 5, False)], (key, 9), [b"frame"])
    ln, typ, ch, ns = HEADER.unpack_from(feed.out)
    body = bytes(feed.out[HEADER.size:])
    assert (typ, ns, ln) == (RULE, 7, len(body)) and len(body) == 4 + 3 * 20 + 4 + 5
    assert struct.unpack_from("<HH", body) == (3, 1)
    assert body[4:24] == key + struct.pack("<II", 0x01020304, 2)
    assert body[24:44] == key[::-1] + struct.pack("<II", 5, 0)
    assert body[44:64] == key + struct.pack("<II", 9, 1)
    assert body[64:] == struct.pack("<I", 5) + b"frame"
    feed.close()


def test_a_prebuilt_segment_is_the_one_the_peer_would_send_and_none_past_the_window_or_mss():
    def established() -> Peer:
        p = Peer()
        p.open(0, CLIENT, (GUEST_IP, 7000), b"\x02" * 6, b"\x04" * 6, 0)
        fl = p.flows[0]
        fl.state, fl.snd_una, fl.guest_isn, fl.rcv_nxt = "established", 1, 77, 78
        fl.guest_window, fl.guest_mss = 3000, 1460
        return p
    a, b = established(), established()
    built = a.prebuilt(a.flows[0], b"next", queued=0)
    (sent,) = b.send(0, b"next", 0)
    assert built == sent
    later = netpkt.parse(a.prebuilt(a.flows[0], b"after", queued=4))
    assert later.seq == a.flows[0].seq(1 + 4)
    assert a.prebuilt(a.flows[0], b"y" * (PEER_MSS + 1), 0) is None         # two segments
    assert a.prebuilt(a.flows[0], b"y" * 100, queued=2950) is None          # past the window
