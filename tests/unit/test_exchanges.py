"""UDP exchanges the guest starts are answered from the recording by its request
(semantic/network/exchanges.py): DHCP with the analysis guest's own transaction ID,
DNS with its own query ID; datagrams the remote side starts stay timed inputs."""
from __future__ import annotations

import struct

from tandem.formats import netpkt, pcapng, wire
from tandem.semantic.network import exchanges
from tandem.semantic.inputs import from_events
from tandem.semantic.network.remote import Remote

GMAC, SMAC = bytes.fromhex("525400123456"), netpkt.GATEWAY_MAC
ZERO, BCAST = b"\0\0\0\0", b"\xff" * 4
GUEST, SERVER, DNS_IP = bytes([10, 0, 2, 15]), bytes([10, 0, 2, 2]), bytes([10, 0, 2, 3])
MS = 1_000_000


def dhcp(op: int, kind: int, xid: int, chaddr: bytes, yiaddr: bytes = ZERO) -> bytes:
    body = struct.pack("!BBBBIHH4s4s4s4s16s64s128s", op, 1, 6, 0, xid, 0, 0, ZERO, yiaddr, ZERO, ZERO,
                       chaddr + b"\0" * 10, b"", b"")
    return body + wire.DHCP_MAGIC + bytes([53, 1, kind, 255])


def dns(qid: int, name: str, qtype: int = 1, answer: bytes = b"") -> bytes:
    q = b"".join(bytes([len(x)]) + x.encode() for x in name.split(".")) + b"\0" + struct.pack("!HH", qtype, 1)
    return struct.pack("!HHHHHH", qid, 0x8180 if answer else 0x0100, 1, 1 if answer else 0, 0, 0) + q + answer


class Log:
    def __init__(self):
        self.events: list[pcapng.Event] = []

    def frame(self, direction: str, ns: int, data: bytes) -> "Log":
        self.events.append(pcapng.Event(len(self.events), 0, "net0", "net", direction, ns, ns, data, 0))
        return self


def discover(xid: int, mac: bytes = GMAC) -> bytes:
    return netpkt.udp(mac, b"\xff" * 6, ZERO, BCAST, 68, 67, dhcp(1, 1, xid, mac))


def native_log() -> Log:
    return (Log()
            .frame("out", 1 * MS, discover(0x1111))
            .frame("in", 2 * MS, netpkt.udp(SMAC, b"\xff" * 6, SERVER, BCAST, 67, 68, dhcp(2, 2, 0x1111, GMAC, GUEST)))
            .frame("out", 3 * MS, netpkt.udp(GMAC, SMAC, GUEST, DNS_IP, 40001, 53, dns(7, "Example.org")))
            .frame("in", 4 * MS, netpkt.udp(SMAC, GMAC, DNS_IP, GUEST, 53, 40001, dns(7, "example.org", answer=b"A")))
            # a datagram the remote side starts to a guest service, and the guest's answer
            .frame("in", 5 * MS, netpkt.udp(SMAC, GMAC, SERVER, GUEST, 5555, 9999, b"ping"))
            .frame("out", 6 * MS, netpkt.udp(GMAC, SMAC, GUEST, SERVER, 9999, 5555, b"pong"))
            .frame("in", 7 * MS, netpkt.udp(SMAC, GMAC, SERVER, GUEST, 5555, 9999, b"ping again")))


def test_replies_to_the_guests_requests_are_exchanges_not_timed_inputs():
    rec = from_events(native_log().events)
    # the guest's "pong" answers the remote side: no request
    assert [(e.key, len(e.replies)) for e in rec.exchanges] == [(("dhcp", 1), 1), (("dns", ("example.org", 1)), 1)]
    # what the remote side started stays a timed input, both datagrams of it
    assert [netpkt.parse(i.data).payload for i in rec.inputs if i.kind == "frame"] == [b"ping", b"ping again"]


def test_the_analysis_guest_gets_the_recorded_offer_with_its_own_transaction_id():
    rec = from_events(native_log().events)
    a = exchanges.Answers()
    for ex in rec.exchanges:
        a.add(ex)
    mine = netpkt.parse(discover(0x2222, mac=bytes.fromhex("525400abcdef")))
    ((at, frame),) = a.on_request(mine, 50 * MS)
    offer = netpkt.parse(frame)
    assert at == 51 * MS and (offer.sport, offer.dport) == (67, 68)
    assert struct.unpack_from("!I", offer.payload, 4)[0] == 0x2222
    assert offer.payload[28:34] == bytes.fromhex("525400abcdef")
    assert offer.payload[16:20] == GUEST and wire.dhcp_type(offer.payload) == 2
    # the native asked once; the analysis guest, slower, sends its DISCOVER again (the
    # same transaction): answered as it was, as the native's server would have
    ((again_at, again),) = a.on_request(mine, 60 * MS)
    assert again_at == 61 * MS and again == frame and a.retransmissions == 1
    # a new transaction (another xid, or from another port) has nothing left: reported once
    other = netpkt.parse(discover(0x3333, mac=bytes.fromhex("525400abcdef")))
    assert a.on_request(other, 70 * MS) is None
    assert "DHCP DISCOVER" in a.miss(other) and a.miss(other) is None     # said once


def test_a_dns_answer_goes_to_the_analysis_guests_port_with_its_query_id():
    rec = from_events(native_log().events)
    a = exchanges.Answers()
    for ex in rec.exchanges:
        a.add(ex)
    q = netpkt.parse(netpkt.udp(GMAC, SMAC, GUEST, DNS_IP, 51000, 53, dns(99, "example.ORG")))
    ((_, frame),) = a.on_request(q, 0)
    r = netpkt.parse(frame)
    assert (r.ip_src, r.ip_dst, r.sport, r.dport) == (DNS_IP, GUEST, 53, 51000)
    assert struct.unpack_from("!H", r.payload)[0] == 99 and r.payload.endswith(b"A")
    other = netpkt.parse(netpkt.udp(GMAC, SMAC, GUEST, DNS_IP, 51000, 53, dns(5, "example.net")))
    assert a.on_request(other, 0) is None


def test_the_peer_hands_over_requests_but_not_answers_to_the_remote_side():
    rec = from_events(native_log().events)
    remote = Remote(rec, [])
    remote.release(rec.inputs[0], 0)    # the remote "ping"
    peer = remote.peer
    peer.on_frame(netpkt.udp(GMAC, SMAC, GUEST, SERVER, 9999, 5555, b"pong"), 1)
    peer.on_frame(discover(3), 2)
    assert [f.dport for f in peer.requests] == [67]
    assert len(peer.out.udp_out) == 2       # both compared


def test_hostile_payloads_are_no_dhcp_nor_dns():
    for junk in (b"", b"\xff" * 300, wire.DHCP_MAGIC * 80, b"\0" * 12 + b"\x3f" * 40):
        assert exchanges.request_key(67, junk)[0] in ("udp", "dhcp")
        assert exchanges.request_key(53, junk)[0] in ("udp", "dns")
    assert wire.dns_question(struct.pack("!HHHHHH", 1, 0, 1, 0, 0, 0) + b"\xc0\x0c" + b"\0" * 4) is None


def test_the_comparator_sees_dhcp_and_dns_without_their_ids():
    a, b = dhcp(1, 7, 0x1111, GMAC), dhcp(1, 7, 0x2222, GMAC)      # two guests' RELEASEs
    assert a != b and exchanges.without_ids(67, a) == exchanges.without_ids(67, b)
    assert exchanges.without_ids(67, dhcp(1, 7, 1, GMAC)) != exchanges.without_ids(67, dhcp(1, 3, 1, GMAC))
    assert exchanges.without_ids(53, dns(1, "a.org")) == exchanges.without_ids(53, dns(2, "a.org"))
    assert exchanges.without_ids(53, dns(1, "a.org")) != exchanges.without_ids(53, dns(1, "b.org"))
    assert exchanges.without_ids(5000, b"ab") == b"ab" and exchanges.without_ids(67, b"short") == b"short"


def test_a_dhcp_client_identifier_is_not_compared():
    def with_id(ident: bytes) -> bytes:
        return dhcp(1, 3, 9, GMAC)[:-1] + bytes([61, len(ident)]) + ident + bytes([255])
    assert exchanges.without_ids(67, with_id(b"\xff\x01\x02")) == exchanges.without_ids(67, with_id(b"\xff\x07\x08"))
    assert exchanges.without_ids(67, with_id(b"\xff")) != exchanges.without_ids(67, with_id(b"\xff\x07"))
    # an option whose length runs past the end is cut, not overrun
    assert exchanges.without_ids(67, dhcp(1, 3, 9, GMAC)[:-1] + bytes([61, 200, 1])).endswith(b"\x00")
