"""TCP connections the guest opens (nginx proxying to a backend at 10.0.2.2:8081) are
answered from the recording (semantic/network/connections.py, peer.py, driver.py): the
replayer plays the remote server. Each scenario is a native device log built
segment by segment (as tests/unit/test_extract.py builds one) and an analysis guest
scripted against the driver (as tests/unit/test_driver.py scripts one), opening its own
connections from other ports with other sequence numbers; what the replayer sends it,
when, and what is reported and compared."""
from __future__ import annotations


import pytest
from tandem.formats import netpkt
from tandem.formats.netpkt import ACK, FIN, PSH, RST, SYN
from tandem.semantic.comparison import compare, equivalence
from tandem.semantic.network import connections
from tandem.qemu.feed import NET, Message
from tandem.semantic.driving.driver import AnalysisDriver, DriveOptions
from tandem.semantic.inputs import RecordedInputs
from tandem.semantic.comparison.live_compare import LiveCompare
from tandem.semantic.model import DEP_TIMEOUT_NS, AnalysisRun
from tandem.semantic.network.peer import Peer

from scripted_feed import Clock, ScriptedFeed, ScriptedVM, wait
from scripted_tcp import BACKEND, GMAC, GUEST_IP, HOST_IP, M32, MS, SMAC, Conn, GuestEnd, Native, at, seg, to_port

WEB = 80
REQ_A = b"GET /a HTTP/1.0\r\nHost: backend\r\n\r\n"
REQ_B = b"GET /b HTTP/1.0\r\nHost: backend\r\n\r\n"
REPLY_A, REPLY_B = b"HTTP/1.0 200 OK\r\n\r\nfrom a\n", b"HTTP/1.0 200 OK\r\n\r\nfrom b\n"


def payload_times(feed: ScriptedFeed, port: int) -> list[tuple[int, bytes]]:
    """(VM time, payload) of what the replayer sent a guest port, first transmissions only
    (the scripted guest does not acknowledge it: the peer sends it again every RTO)."""
    frames = [(ns, netpkt.parse(d)) for ch, ns, d in feed.inputs if ch == NET]
    sent: dict[int, tuple[int, bytes]] = {}
    for ns, f in frames:
        if f is not None and f.proto == netpkt.PROTO_TCP and f.dport == port and f.payload:
            sent.setdefault(f.seq, (ns, f.payload))
    return list(sent.values())


def to_end(feed: ScriptedFeed) -> list[Message]:
    """The VM runs on to the horizon granted last."""
    return [wait(feed.horizons[-1][0])]


def drive(rec: RecordedInputs, script: list, rules: bool = False) -> tuple[AnalysisRun, ScriptedFeed]:
    res, feed, _ = drive_peer(rec, script, rules)
    return res, feed


def drive_peer(rec: RecordedInputs, script: list, rules: bool = False) -> tuple[AnalysisRun, ScriptedFeed, Peer]:
    """drive(), and the run's peer (the guest's end of each connection, those not bound yet)."""
    clock, vm = Clock(), ScriptedVM()
    feed = ScriptedFeed(list(script) + [to_end] * 8, vm, clock)
    res = AnalysisRun("scripted")
    d = AnalysisDriver(rec, res, vm, feed, DriveOptions(clock=clock, rules=rules))
    d.drive()    # inputs at stops unless rules
    return res, feed, d.remote.peer


def backend(native: Native, port: int, at_ns: int, request: bytes, reply: bytes, g_isn: int = 5000) -> Conn:
    """A connection the native's guest opened to the backend: request, reply, the
    server's FIN then the guest's."""
    c = native.conn(port, g_isn=g_isn).guest_opens(at_ns)
    c.seg("out", at_ns + 1 * MS, ACK | PSH, request).seg("in", at_ns + 2 * MS, ACK | PSH, reply)
    return c.seg("in", at_ns + 2 * MS + 1, ACK | FIN).seg("out", at_ns + 2 * MS + 2, ACK | FIN)


# -- a proxied request: the client's connection in, the guest's to its backend out ------------

def proxy_recording() -> RecordedInputs:
    native = Native()
    client = native.conn(WEB, remote=(HOST_IP, 40000), g_isn=100, r_isn=200).remote_opens(1 * MS)
    client.seg("in", 2 * MS, ACK | PSH, b"GET /backend/ HTTP/1.1\r\nHost: x\r\n\r\n")
    back = native.conn(33000).guest_opens(3 * MS).seg("out", 4 * MS, ACK | PSH, REQ_A)
    back.seg("in", 5 * MS, ACK | PSH, REPLY_A).seg("in", 5 * MS + 1, ACK | FIN).seg("out", 5 * MS + 2, ACK | FIN)
    client.seg("out", 6 * MS, ACK | PSH, b"HTTP/1.1 200 OK\r\n\r\nfrom a\n")
    client.seg("in", 7 * MS, ACK | FIN).seg("out", 7 * MS + 1, ACK | FIN)
    return native.recording(8 * MS)


def proxy_script(web: GuestEnd, back: GuestEnd) -> list:
    """What QEMU says as a proxy guest serves one request: it answers the client on `web`,
    then opens its backend connection `back` earlier than the native did (from another
    port, with an ISN that wraps), sends REQ_A, and answers the client once done."""
    def guest_answers_the_client(feed):
        return [web.segment(feed, 1 * MS + 10, SYN | ACK), wait(2 * MS)]
    return [[wait(0)], [wait(1 * MS)], guest_answers_the_client,
            at(2 * MS + 500, seg(back, 2 * MS + 500, SYN)),
            at(2 * MS + 600, seg(back, 2 * MS + 550, ACK), seg(back, 2 * MS + 600, ACK | PSH, REQ_A)),
            [wait(5 * MS)], [wait(5 * MS + 1)],
            at(7 * MS, seg(web, 5 * MS + 500, ACK | PSH, b"HTTP/1.1 200 OK\r\n\r\nfrom a\n"),
               seg(back, 5 * MS + 600, ACK | FIN)),
            at(7 * MS + 100, seg(web, 7 * MS + 50, ACK | FIN))]


def test_a_proxied_request_is_answered_by_the_recorded_backend_on_the_guests_own_port_and_isn():
    rec = proxy_recording()
    assert [(i.kind, i.flow) for i in rec.inputs] == [("tcp-open", 0), ("tcp-data", 0), ("tcp-data", 1),
                                                      ("tcp-fin", 1), ("tcp-fin", 0)]
    web, back = GuestEnd(WEB, remote=(HOST_IP, 40000), isn=0x1234_5678), GuestEnd(45000, isn=0xFFFF_FFF0)

    res, feed, peer = drive_peer(rec, proxy_script(web, back))

    synack, *rest = to_port(feed, 45000)
    assert synack.flags == SYN | ACK and synack.ack == 0xFFFF_FFF1 and synack.mss == 1460
    assert (synack.ip_src, synack.sport, synack.dst) == (HOST_IP, 8081, GMAC)
    # the backend's reply at its recorded time (the request came before it), then its FIN
    assert payload_times(feed, 45000) == [(5 * MS, REPLY_A)]
    assert [f.flags & FIN for f in rest if f.flags & FIN] == [FIN]
    pf = peer.flows[1]
    assert (pf.server, pf.state, pf.out.data.head(len(REQ_A))) == ((GUEST_IP, 45000), "done", REQ_A)
    assert res.net.flows[1] is pf.out
    assert res.limits == [] and res.net.unknown == [] and res.outcome == "finished"
    # compared like the client's connection, its protocol from the guest's first bytes
    assert rec.flows[1].protocol == "http" and compare.channel(rec.flows[1]) == \
        "tcp flow 1 (10.0.2.15:33000->10.0.2.2:8081)"
    assert compare.compare(rec, res, equivalence.Spec()) == []
    live = LiveCompare(rec, equivalence.Spec())
    live.finish(res)
    assert live.divergences == [] and live.not_analysed == []


def test_a_different_request_to_the_backend_is_a_divergence_of_that_flow():
    rec = proxy_recording()
    web, back = GuestEnd(WEB, remote=(HOST_IP, 40000)), GuestEnd(45000)
    other = REQ_A.replace(b"/a", b"/z")
    script = [[wait(0)], [wait(1 * MS)], at(2 * MS, seg(web, 1 * MS + 10, SYN | ACK)),
              at(2 * MS + 500, seg(back, 2 * MS + 500, SYN)),
              at(2 * MS + 600, seg(back, 2 * MS + 550, ACK), seg(back, 2 * MS + 600, ACK | PSH, other))]
    res, _ = drive(rec, script)
    divs = [d for d in compare.compare(rec, res, equivalence.Spec()) if d.channel.startswith("tcp flow 1")]
    assert [(d.kind, [l.text for l in d.native], [l.text for l in d.analysis]) for d in divs] == [
        ("differ", [b"GET /a HTTP/1.0"], [b"GET /z HTTP/1.0"])]


# -- the server's reply waits for the request bytes the native had sent ------------------------

def one_backend_call() -> RecordedInputs:
    native = Native()
    backend(native, 33000, 3 * MS, REQ_A, REPLY_A)
    return native.recording(6 * MS)


HEAD, TAIL = REQ_A[:17], REQ_A[17:]
# name -> (the request's parts as (VM ns, bytes), VM time the reply goes, the run's limits)
HELD = {
    "request before the reply's time: the reply at its time": ([(4 * MS, REQ_A)], 5 * MS, []),
    "request after it: the reply when the request is in": ([(8 * MS, REQ_A)], 8 * MS, []),
    "request in two parts: the reply after the second": ([(6 * MS, HEAD), (9 * MS, TAIL)], 9 * MS, []),
    "request cut short: the reply at the dependency timeout": (
        [(6 * MS, HEAD)], 6 * MS + DEP_TIMEOUT_NS,
        ["tcp-data at VM 0.005000s (flow 0 offset 0, devlog event 4) \"HTTP/1.0 200 OK...\": sent after waiting 5s of VM time for "
         f"flow 0: 17/{len(REQ_A)} guest bytes"]),
}


@pytest.mark.parametrize("name", HELD)
def test_the_servers_reply_waits_for_the_guests_request(name):
    parts, reply_ns, limits = HELD[name]
    back = GuestEnd(50000)
    script = [[wait(0)], at(2 * MS, seg(back, 2 * MS, SYN)), at(2 * MS + 1, seg(back, 2 * MS + 1, ACK))]
    script += [at(ns, seg(back, ns, ACK | PSH, data)) for ns, data in parts]
    res, feed = drive(one_backend_call(), script)
    assert payload_times(feed, 50000) == [(reply_ns, REPLY_A)]
    assert res.limits == limits


# -- several connections to one backend open at once: told apart by their first bytes ----------

def two_at_once() -> RecordedInputs:
    """Two requests proxied at once: /a on the first connection, /b on the second, answered
    in the other order."""
    native = Native()
    a = native.conn(33000, g_isn=1000).guest_opens(3 * MS)
    b = native.conn(33001, g_isn=2000).guest_opens(3 * MS + 100)
    a.seg("out", 4 * MS, ACK | PSH, REQ_A)
    b.seg("out", 4 * MS + 100, ACK | PSH, REQ_B)
    b.seg("in", 5 * MS, ACK | PSH, REPLY_B)
    a.seg("in", 5 * MS + 100, ACK | PSH, REPLY_A)
    return native.recording(6 * MS)


@pytest.mark.parametrize("first, second", [(REQ_A, REQ_B), (REQ_B, REQ_A)], ids=["same order", "swapped"])
def test_connections_open_at_once_are_matched_by_their_first_request(first, second):
    rec = two_at_once()
    assert [fl.request for fl in rec.flows] == [REQ_A, REQ_B]
    x, y = GuestEnd(50000), GuestEnd(50001, isn=0x100)
    script = [[wait(0)], at(2 * MS, seg(x, 2 * MS, SYN), seg(y, 2 * MS + 1, SYN)),
              at(2 * MS + 10, seg(x, 2 * MS + 5, ACK), seg(y, 2 * MS + 6, ACK)),
              at(3 * MS, seg(x, 2 * MS + 20, ACK | PSH, first), seg(y, 2 * MS + 30, ACK | PSH, second))]
    res, feed, peer = drive_peer(rec, script)
    reply = {REQ_A: REPLY_A, REQ_B: REPLY_B}
    assert [d for _, d in payload_times(feed, 50000)] == [reply[first]]
    assert [d for _, d in payload_times(feed, 50001)] == [reply[second]]
    assert {i: pf.server[1] for i, pf in peer.flows.items()} == \
        ({0: 50000, 1: 50001} if first == REQ_A else {0: 50001, 1: 50000})
    assert peer.unbound == [] and res.limits == []
    assert compare.compare(rec, res, equivalence.Spec()) == []


def test_connections_one_after_another_are_matched_by_order_at_their_syn():
    native = Native()
    backend(native, 33000, 3 * MS, REQ_A, REPLY_A)
    backend(native, 33000, 10 * MS, REQ_B, REPLY_B, g_isn=90000)      # the port reused after the close
    rec = native.recording(13 * MS)
    assert len(rec.flows) == 2 and rec.flows[0].closed_ns == 5 * MS + 2
    c = connections.Connections()
    for fl in rec.flows:
        c.add(fl)
    # not open at once: the first is the match, without waiting for bytes
    assert c.at_syn(BACKEND) == [rec.flows[0]] and c.at_syn((HOST_IP, 9)) == []
    x = GuestEnd(50000)
    res, feed, peer = drive_peer(rec, [[wait(0)], at(2 * MS, seg(x, 2 * MS, SYN))])
    assert peer.flows[0].server == (GUEST_IP, 50000) and peer.unbound == []


@pytest.mark.parametrize("requests, answers, closed_first, ambiguous", [
    ([REQ_A, REQ_B], ["accepted"] * 2, None, True),
    ([REQ_A, REQ_B], ["accepted"] * 2, 3 * MS + 2, True),        # the second opened before the first closed
    ([REQ_A, REQ_B], ["accepted"] * 2, 3 * MS + 1, False),       # ... not before: one after the other
    ([REQ_A, b""], ["accepted"] * 2, None, False),               # a server that spoke first: order alone
    ([REQ_A, REQ_B], ["accepted", "refused"], None, False),
], ids=["open at once", "overlapping", "one after the other", "a server spoke first", "one refused"])
def test_a_syn_waits_for_its_first_bytes_only_where_they_tell_connections_apart(requests, answers, closed_first,
                                                                               ambiguous):
    native = Native()
    for k, _ in enumerate(requests):
        native.conn(33000 + k).guest_opens(3 * MS + k)
    rec = native.recording(9 * MS)
    c = connections.Connections()
    for fl, req, answer in zip(rec.flows, requests, answers):
        fl.request, fl.answer = req, answer
        c.add(fl)
    rec.flows[0].closed_ns = closed_first
    assert c.at_syn(BACKEND) == (rec.flows if ambiguous else rec.flows[:1])


@pytest.mark.parametrize("requests, first, picked", [
    ([REQ_A, REQ_B], REQ_B, 1),
    ([REQ_A, REQ_B], REQ_A[:5], 0),                     # no byte tells them apart: the earlier one
    ([REQ_A, REQ_B], b"POST /x", 0),                    # like neither: the earlier one
    ([b"GET /b/1", b"GET /b/2", b"GET /b/1"], b"GET /b/1 HTTP", 0),
    ([b"", b"GET /b"], b"GET /b", 1),
], ids=["by bytes", "too short", "like neither", "a repeat", "one spoke no request"])
def test_pick_takes_the_longest_common_prefix_then_the_earliest(requests, first, picked):
    native = Native()
    for k, _ in enumerate(requests):
        native.conn(33000 + k).guest_opens(3 * MS + k)
    rec = native.recording(9 * MS)
    c = connections.Connections()
    for fl, req in zip(rec.flows, requests):
        fl.request = req
        c.add(fl)
    assert c.pick(BACKEND, first) is rec.flows[picked]


# -- what matches nothing, and what the native's server refused ---------------------------------

def test_a_connection_with_no_recorded_match_is_reset_and_reported_once():
    """The native's guest opened one connection to the backend; the analysis guest opens a
    second one, and one to a server the native never reached."""
    rec = one_backend_call()
    x, y, z = GuestEnd(50000), GuestEnd(50001), GuestEnd(50002, remote=(HOST_IP, 9999))
    script = [[wait(0)], at(2 * MS, seg(x, 2 * MS, SYN)), at(2 * MS + 1, seg(x, 2 * MS + 1, ACK)),
              at(4 * MS, seg(x, 3 * MS, ACK | PSH, REQ_A)), [wait(5 * MS)],
              at(7 * MS, seg(y, 6 * MS, SYN), seg(z, 6 * MS + 1, SYN))]
    res, feed = drive(rec, script)
    for end in (y, z):
        (rst,) = to_port(feed, end.port)
        assert rst.flags == RST | ACK and rst.ack == (end.seq - 1 + 1) & M32
    assert res.limits == [
        "tcp 10.0.2.15:50001->10.0.2.2:8081: the guest opened a connection the recording has no match for "
        "(the native's guest opened fewer to 10.0.2.2:8081, or none): reset",
        "tcp 10.0.2.15:50002->10.0.2.2:9999: the guest opened a connection the recording has no match for "
        "(the native's guest opened fewer to 10.0.2.2:9999, or none): reset"]
    assert payload_times(feed, 50000) == [(5 * MS, REPLY_A)] and set(res.net.flows) == {0}


def test_unmatched_connections_are_listed_up_to_a_bound():
    c = connections.Connections()
    lines = [c.miss((GUEST_IP, 50000 + k), BACKEND) for k in range(connections.MISSES_KEPT + 5)]
    assert all(lines[:connections.MISSES_KEPT]) and lines[connections.MISSES_KEPT:] == [None] * 5
    assert lines[connections.MISSES_KEPT - 1].endswith("; further ones are not listed")


def test_a_connection_the_native_s_server_refused_is_refused_and_the_next_one_served():
    native = Native()
    native.conn(33000).seg("out", 3 * MS, SYN).seg("in", 3 * MS + 1, RST | ACK)
    backend(native, 33001, 4 * MS, REQ_A, REPLY_A)
    rec = native.recording(7 * MS)
    assert [(fl.answer, fl.closed) for fl in rec.flows] == [("refused", True), ("accepted", True)]
    x, y = GuestEnd(50000), GuestEnd(50001)
    script = [[wait(0)], at(2 * MS, seg(x, 2 * MS, SYN)), at(3 * MS, seg(y, 3 * MS, SYN)),
              at(3 * MS + 1, seg(y, 3 * MS + 1, ACK)), at(4 * MS, seg(y, 4 * MS, ACK | PSH, REQ_A))]
    res, feed = drive(rec, script)
    assert [f.flags for f in to_port(feed, 50000)] == [RST | ACK]
    assert payload_times(feed, 50001) == [(6 * MS, REPLY_A)]
    assert res.limits == [] and res.net.not_opened == {0}


# -- the peer's side of it ---------------------------------------------------------------------

def guest_syn(port: int, seq: int) -> netpkt.Frame:
    return netpkt.parse(netpkt.tcp(GMAC, SMAC, GUEST_IP, HOST_IP, port, 8081, seq, 0, SYN, 29200, mss=1400))


def test_the_peer_answers_a_syn_as_recorded_and_again_if_the_guest_asks_again():
    peer = Peer()
    syn = guest_syn(50000, 10)
    assert peer.on_frame(netpkt.tcp(GMAC, SMAC, GUEST_IP, HOST_IP, 50000, 8081, 10, 0, SYN, 29200), 1) == []
    assert [f.flow() for f in peer.connects] == [syn.flow()]
    (synack,) = map(netpkt.parse, peer.answer_syn(3, syn, 2, "accepted"))
    pf = peer.flows[3]
    assert (synack.flags, synack.ack, pf.guest_mss, pf.state) == (SYN | ACK, 11, 1400, "syn-received")
    # the guest's SYN once more (our SYN-ACK lost): the same SYN-ACK, no new connection
    (again,) = map(netpkt.parse, peer.on_frame(netpkt.tcp(GMAC, SMAC, GUEST_IP, HOST_IP, 50000, 8081, 10, 0, SYN,
                                                          29200), 3))
    assert (again.flags, again.seq) == (SYN | ACK, synack.seq) and len(peer.connects) == 1
    # a server that never answered: nor does the peer, and its SYNs again take nothing more
    peer.connects.clear()
    assert peer.answer_syn(4, guest_syn(50001, 99), 4, None) == []
    assert peer.on_frame(netpkt.tcp(GMAC, SMAC, GUEST_IP, HOST_IP, 50001, 8081, 99, 0, SYN, 29200), 5) == []
    assert peer.connects == [] and peer.flows[4].state == "silent"


def test_an_unbound_connection_is_ready_to_bind_when_a_write_ends():
    peer = Peer()
    syn = guest_syn(50000, 10)
    (synack,) = map(netpkt.parse, peer.answer_syn(None, syn, 1, "accepted"))
    (pf,) = peer.unbound
    ack = synack.seq + 1

    def send(seq: int, flags: int, data: bytes) -> None:
        peer.on_frame(netpkt.tcp(GMAC, SMAC, GUEST_IP, HOST_IP, 50000, 8081, seq, ack, flags, 29200, data), 2)
    send(11, ACK, b"")
    send(11, ACK, b"GET /a")                # a write's first segment: not yet
    assert pf.state == "established" and peer.ready == []
    send(17, ACK | PSH, b" HTTP/1.0\r\n\r\n")
    assert peer.ready == [pf] and peer.first_bytes(pf) == b"GET /a HTTP/1.0\r\n\r\n"
    peer.bind(pf, 7)
    assert peer.flows[7] is pf and pf.index == 7 and peer.unbound == []


# -- the connections the recording opened to the guest: as before -------------------------------

def test_a_host_opened_connection_is_still_played_as_its_client():
    native = Native()
    client = native.conn(WEB, remote=(HOST_IP, 40000), g_isn=100, r_isn=200).remote_opens(1 * MS)
    client.seg("in", 2 * MS, ACK | PSH, b"GET / HTTP/1.1\r\n\r\n").seg("out", 3 * MS, ACK | PSH, b"HTTP/1.1 200 OK\r\n")
    client.seg("in", 4 * MS, ACK | FIN).seg("out", 4 * MS + 1, ACK | FIN)
    rec = native.recording(5 * MS)
    assert [(fl.guest_opened, fl.name()) for fl in rec.flows] == [(False, "10.0.2.2:40000->10.0.2.15:80")]
    web = GuestEnd(WEB, remote=(HOST_IP, 40000))
    script = [[wait(0)], [wait(1 * MS)], at(2 * MS, seg(web, 1 * MS + 10, SYN | ACK)),
              at(4 * MS, seg(web, 3 * MS, ACK | PSH, b"HTTP/1.1 200 OK\r\n")),
              at(4 * MS + 10, seg(web, 4 * MS + 5, ACK | FIN))]
    res, feed, peer = drive_peer(rec, script)
    syn, *_ = to_port(feed, WEB)
    assert (syn.flags, syn.sport, syn.seq) == (SYN, 40000, 0x1000_0000)    # the peer's own ISN, as before
    assert payload_times(feed, WEB) == [(2 * MS, b"GET / HTTP/1.1\r\n\r\n")]
    assert peer.connects == [] and res.limits == [] and res.net.unknown == []
    assert peer.flows[0].state == "done" and compare.compare(rec, res, equivalence.Spec()) == []


def test_the_run_ends_on_time_when_the_guest_never_opens_the_recorded_connection():
    """The server's bytes wait for the connection to be opened here, then are given up on
    at the dependency timeout, once: its FIN does not wait again."""
    rec = one_backend_call()
    res, feed = drive(rec, [[wait(0)]])
    assert res.limits == ["tcp-data at VM 0.005000s (flow 0 offset 0, devlog event 4) \"HTTP/1.0 200 OK...\": sent after waiting 5s of "
                          f"VM time for the guest to open its connection (flow 0), flow 0: 0/{len(REQ_A)} guest bytes"]
    assert feed.inputs == [] and res.outcome == "finished" and res.n_delivered == 2


def test_a_connection_reset_while_its_service_starts_is_retried_with_its_request():
    """Refused first (the service not listening yet), then accepted and reset before a
    byte of answer (a socket that took it, then closed, while the service started): tried
    again from its SYN with the whole request, as a refused one is; once answered, a
    reset is the guest's."""
    peer = Peer()
    client, server = (HOST_IP, 40000), (GUEST_IP, 80)
    (syn,) = map(netpkt.parse, peer.open(0, client, server, SMAC, GMAC, 0))
    pf = peer.flows[0]
    request = b"GET / HTTP/1.1\r\n\r\n"

    def guest(flags: int, seq: int, ack: int, data: bytes = b"", now: int = 0) -> list:
        return [netpkt.parse(f) for f in peer.on_frame(
            netpkt.tcp(GMAC, SMAC, GUEST_IP, HOST_IP, 80, 40000, seq, ack, flags, 29200, data), now)]
    guest(RST | ACK, 0, syn.seq + 1, now=1)
    assert pf.state == "refused"
    (again,) = map(netpkt.parse, peer.retransmit(60_000_000))
    guest(SYN | ACK, 500, syn.seq + 1, now=60_000_001)
    assert again.flags == SYN and pf.state == "established"
    sent = [netpkt.parse(f) for f in peer.send(0, request, 60_000_002)]
    assert [s.payload for s in sent] == [request]
    guest(ACK, 501, syn.seq + 1 + len(request), now=60_000_003)
    guest(RST | ACK, 501, syn.seq + 1 + len(request), now=60_000_004)      # reset before any answer
    assert pf.state == "refused" and pf.out.reset is None
    (third,) = map(netpkt.parse, peer.retransmit(120_000_000))
    replies = guest(SYN | ACK, 900, syn.seq + 1, now=120_000_001)
    assert third.flags == SYN and [r.payload for r in replies if r.payload] == [request]
    guest(ACK | PSH, 901, syn.seq + 1 + len(request), b"HTTP/1.1 200 OK\r\n", now=120_000_002)
    guest(RST | ACK, 918, syn.seq + 1 + len(request), now=120_000_003)    # answered: the guest's reset
    assert pf.state == "done" and pf.out.reset == "reset by the guest"


@pytest.mark.parametrize("stray", ["the request", "the FIN", "a second SYN"])
def test_resets_of_an_earlier_try_do_not_end_a_connection_being_retried(stray):
    """A listening socket that closes while its service starts (`nginx -t`) resets what it
    took; the request and FIN the peer had in flight then reach no socket and draw a
    reset each (sequence number: the ACK they carried), and two SYNs a slow guest answers
    late draw two refusals. Those resets answer an earlier try: the connection, refused
    and waiting to be tried again, goes on, and its answer is compared (ended there, the
    native's answer would read as a false "missing"). Resets are taken as RFC 9293 takes
    them: in SYN-SENT one that acknowledges the SYN, after it one in the receive window."""
    from tandem.semantic.network.peer import RTO_NS, SYN_RETRY_NS
    peer = Peer()
    (syn,) = map(netpkt.parse, peer.open(0, (HOST_IP, 40000), (GUEST_IP, 80), SMAC, GMAC, 0))
    pf = peer.flows[0]
    request = b"GET / HTTP/1.1\r\n\r\n"

    def guest(flags: int, seq: int, ack: int, now: int, data: bytes = b"") -> list:
        return [netpkt.parse(f) for f in peer.on_frame(
            netpkt.tcp(GMAC, SMAC, GUEST_IP, HOST_IP, 80, 40000, seq, ack, flags, 29200, data), now)]
    if stray == "a second SYN":
        peer.retransmit(RTO_NS)                                         # the SYN again, unanswered so far
        guest(RST | ACK, 0, syn.seq + 1, now=RTO_NS + 1)                # both refused
        guest(RST | ACK, 0, syn.seq + 1, now=RTO_NS + 2)
        assert pf.state == "refused" and pf.out.reset is None
        assert peer.send(0, request, RTO_NS + 3) == []                  # waits for the connection
        t = RTO_NS + 3 + SYN_RETRY_NS
    else:
        guest(SYN | ACK, 500, syn.seq + 1, now=1)
        peer.send(0, request, 2)
        peer.close(0, 3)
        guest(RST | ACK, 501, syn.seq + 1, now=4)                       # the listening socket closed
        assert pf.state == "refused" and pf.out.reset is None
        stray_ack = syn.seq + 1 + (len(request) if stray == "the FIN" else 0)
        guest(RST, stray_ack, 0, now=5)                                 # no socket: seq is the ACK it got
        assert pf.state == "refused" and pf.out.reset is None
        t = 5 + SYN_RETRY_NS
    (again,) = map(netpkt.parse, peer.retransmit(t))
    assert again.flags == SYN
    sent = guest(SYN | ACK, 900, syn.seq + 1, now=t + 1)
    assert [s.payload for s in sent if s.payload] == [request]
    guest(RST, 501, 0, now=t + 2)                                       # an earlier try's, out of the window
    assert pf.state == "established"
    guest(ACK | PSH | FIN, 901, syn.seq + 1 + len(request), now=t + 3, data=b"HTTP/1.1 200 OK\r\n")
    assert pf.out.data.head(100) == b"HTTP/1.1 200 OK\r\n" and pf.out.reset is None


def test_a_connection_whose_syn_went_unanswered_then_reset_before_an_answer_is_retried():
    """The guest's network not up yet (the SYN unanswered, sent again), then accepted and
    reset before a byte of answer while its service starts: tried again from its SYN
    with the whole request, as a refused one is (else the first request is a false
    "missing"). So is one answered at once and reset before its service has answered
    any connection here (a listening socket of `nginx -t`); once it has, a reset is
    the guest's."""
    from tandem.semantic.network.peer import RTO_NS
    request = b"GET / HTTP/1.1\r\n\r\n"

    def opened(peer: Peer, port: int):
        (syn,) = map(netpkt.parse, peer.open(port, (HOST_IP, port), (GUEST_IP, 80), SMAC, GMAC, 0))
        return syn, peer.flows[port]

    def guest(peer: Peer, port: int, flags: int, seq: int, ack: int, now: int) -> list:
        return [netpkt.parse(f) for f in peer.on_frame(
            netpkt.tcp(GMAC, SMAC, GUEST_IP, HOST_IP, 80, port, seq, ack, flags, 29200), now)]
    peer = Peer()
    syn, pf = opened(peer, 40000)
    (again,) = map(netpkt.parse, peer.retransmit(RTO_NS))           # no answer: the SYN again
    guest(peer, 40000, SYN | ACK, 500, syn.seq + 1, now=RTO_NS + 1)
    assert again.flags == SYN and pf.state == "established"
    peer.send(40000, request, RTO_NS + 2)
    guest(peer, 40000, ACK, 501, syn.seq + 1 + len(request), now=RTO_NS + 3)
    guest(peer, 40000, RST | ACK, 501, syn.seq + 1 + len(request), now=RTO_NS + 4)
    assert pf.state == "refused" and pf.out.reset is None
    (third,) = map(netpkt.parse, peer.retransmit(RTO_NS + 60_000_000))
    replies = guest(peer, 40000, SYN | ACK, 900, syn.seq + 1, now=RTO_NS + 60_000_001)
    assert third.flags == SYN and [r.payload for r in replies if r.payload] == [request]

    def answered_at_once_then_reset(peer: Peer, port: int):
        syn, pf = opened(peer, port)
        guest(peer, port, SYN | ACK, 500, syn.seq + 1, now=1)
        peer.send(port, request, 2)
        guest(peer, port, RST | ACK, 501, syn.seq + 1 + len(request), now=3)
        return pf
    pf = answered_at_once_then_reset(peer, 40001)                     # no answer on port 80 yet
    assert pf.state == "refused" and pf.out.reset is None
    first = peer.flows[40000]
    peer.on_frame(netpkt.tcp(GMAC, SMAC, GUEST_IP, HOST_IP, 80, 40000, 901, third.seq + 1 + len(request),
                             ACK | PSH, 29200, b"HTTP/1.1 200 OK\r\n"), RTO_NS + 60_000_002)
    assert first.guest_bytes == 17                                    # port 80 has answered
    pf = answered_at_once_then_reset(peer, 40002)
    assert pf.state == "done" and pf.out.reset == "reset by the guest"


def test_the_peer_acknowledges_as_a_client_does_with_its_next_bytes_or_after_the_delay():
    """A reply is acknowledged by the next request when one follows within DELACK_NS (a
    pipelining client: no frame of its own), else by a bare ACK at DELACK_NS; more than a
    full segment, a retransmission and a FIN are acknowledged at once."""
    from tandem.semantic.network.peer import DELACK_NS, PEER_MSS
    peer = Peer()
    client, server = (HOST_IP, 40000), (GUEST_IP, 6379)
    (syn,) = map(netpkt.parse, peer.open(0, client, server, SMAC, GMAC, 0))
    ack = syn.seq + 1

    def guest(seq: int, data: bytes = b"", flags: int = ACK | PSH, now: int = 0) -> list[netpkt.Frame]:
        return [netpkt.parse(f) for f in peer.on_frame(
            netpkt.tcp(GMAC, SMAC, GUEST_IP, HOST_IP, 6379, 40000, seq, ack, flags, 29200, data), now)]
    assert [f.flags for f in guest(100, flags=SYN | ACK, now=1)] == [ACK]         # the handshake's ACK
    assert guest(101, b"+OK\r\n", now=10) == []                                  # a reply: the ACK waits
    assert peer.next_timer() == 10 + DELACK_NS and peer.delayed_acks(10 + DELACK_NS - 1) == []
    (req,) = map(netpkt.parse, peer.send(0, b"GET k\r\n", 20))                    # the next request carries it
    assert (req.ack, req.payload) == (106, b"GET k\r\n") and peer.delayed_acks(10 + DELACK_NS) == []
    assert guest(106, b"$1\r\n1\r\n", now=30) == []
    (bare,) = map(netpkt.parse, peer.delayed_acks(30 + DELACK_NS))               # none followed: a bare ACK
    assert (bare.flags, bare.ack, bare.payload) == (ACK, 113, b"")
    assert peer.delayed_acks(30 + 2 * DELACK_NS) == []                            # once
    big = b"x" * (PEER_MSS + 1)
    (now_ack,) = guest(113, big, now=40)                                          # more than a full segment
    assert now_ack.ack == 113 + len(big)
    (dup,) = guest(101, b"+OK\r\n", now=50)                                      # a retransmission
    assert dup.ack == 113 + len(big)
    (fin_ack,) = guest(113 + len(big), flags=FIN | ACK, now=60)                  # a FIN
    assert fin_ack.ack == 113 + len(big) + 1


def test_a_guest_still_starting_is_waited_for_not_timed_out():
    """A guest that accepts the client's connection only after longer than the dependency
    timeout (its network or service still starting, silent meanwhile) still gets the
    client's FIN after its reply, not with the request: the wait is timed from when the
    connection opens (a KASAN kernel on a user's disk resets a connection that gets both
    at once)."""
    native = Native()
    client = native.conn(WEB, remote=(HOST_IP, 40000), g_isn=100, r_isn=200).remote_opens(1 * MS)
    client.seg("in", 2 * MS, ACK | PSH, REQ_A).seg("out", 3 * MS, ACK | PSH, REPLY_A)
    client.seg("in", 4 * MS, ACK | FIN).seg("out", 4 * MS + 1, ACK | FIN)
    rec = native.recording(5 * MS)
    web = GuestEnd(WEB, remote=(HOST_IP, 40000))
    up = DEP_TIMEOUT_NS + 3000 * MS
    silent = [[wait(t)] for t in range(0, up, 100 * MS)]
    script = [*silent, at(up, seg(web, up, SYN | ACK)),
              at(up + 2 * MS, seg(web, up + 1 * MS, ACK | PSH, REPLY_A))]
    res, feed = drive(rec, script)
    sent = [(ns, netpkt.parse(d)) for ch, ns, d in feed.inputs if ch == NET]
    fins = [ns for ns, f in sent if f is not None and f.dport == WEB and f.flags & FIN]
    assert fins and min(fins) >= up + 1 * MS, (fins, up)
    assert not [x for x in res.limits if "after waiting" in x], res.limits


def test_connections_over_ipv6_are_answered_and_compared_as_over_ipv4():
    """The same proxied request with every address IPv6 (QEMU's user network: the host is
    fec0::2, the guest a fec0::/64 address of its own): the client's connection in, the
    guest's to its backend out, both answered in IPv6 frames and compared clean."""
    guest6, host6 = bytes.fromhex("fec0000000000000505400fffe123456"), bytes.fromhex("fec0" + "00" * 13 + "02")
    native = Native()
    client = native.conn(WEB, remote=(host6, 40000), g_isn=100, r_isn=200, guest_ip=guest6).remote_opens(1 * MS)
    client.seg("in", 2 * MS, ACK | PSH, b"GET /backend/ HTTP/1.1\r\nHost: x\r\n\r\n")
    back = native.conn(33000, remote=(host6, 8081), guest_ip=guest6).guest_opens(3 * MS)
    back.seg("out", 4 * MS, ACK | PSH, REQ_A)
    back.seg("in", 5 * MS, ACK | PSH, REPLY_A).seg("in", 5 * MS + 1, ACK | FIN).seg("out", 5 * MS + 2, ACK | FIN)
    client.seg("out", 6 * MS, ACK | PSH, b"HTTP/1.1 200 OK\r\n\r\nfrom a\n")
    client.seg("in", 7 * MS, ACK | FIN).seg("out", 7 * MS + 1, ACK | FIN)
    rec = native.recording(8 * MS)
    assert [(i.kind, i.flow) for i in rec.inputs] == [("tcp-open", 0), ("tcp-data", 0), ("tcp-data", 1),
                                                      ("tcp-fin", 1), ("tcp-fin", 0)]
    web = GuestEnd(WEB, remote=(host6, 40000), isn=0x1234_5678, ip=guest6)
    back_end = GuestEnd(45000, remote=(host6, 8081), isn=0xFFFF_FFF0, ip=guest6)

    res, feed = drive(rec, proxy_script(web, back_end), rules=True)
    assert feed.rules == []         # QEMU's release rules patch IPv4 segments alone: stops here
    synack, *_ = to_port(feed, 45000)
    assert synack.eth_type == netpkt.ETH_IP6 and (synack.ip_src, synack.ip_dst, synack.sport) == (host6, guest6, 8081)
    assert synack.flags == SYN | ACK and synack.ack == 0xFFFF_FFF1
    assert payload_times(feed, 45000) == [(5 * MS, REPLY_A)]
    assert res.limits == [] and res.net.unknown == [] and res.outcome == "finished"
    assert compare.channel(rec.flows[1]) == "tcp flow 1 ([fec0::5054:ff:fe12:3456]:33000->[fec0::2]:8081)"
    assert compare.compare(rec, res, equivalence.Spec()) == []
