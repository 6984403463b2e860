"""IPv6 on the replayer's side (formats/netpkt.py, semantic/network/peer.py): what it builds is
what Wireshark reads as valid (checksums over IPv6's pseudo header, neighbour discovery
as RFC 4861 has it), and it answers an analysis guest's neighbour and router
solicitations as QEMU's user network answered the native's."""
from __future__ import annotations

import subprocess

import pytest

from tandem.formats import netpkt
from tandem.formats.pcapng import PcapngWriter
from tandem.semantic.network.peer import Peer

from ipv6_frames import ALL_NODES, ALL_ROUTERS, CLIENT_IP6, CMAC, GMAC, GUEST_IP6, ROUTER6, nd6

NA = netpkt.neighbour_advert(netpkt.GATEWAY_MAC, ROUTER6, GMAC, GUEST_IP6)
FRAMES = {
    "tcp": netpkt.tcp(CMAC, GMAC, CLIENT_IP6, GUEST_IP6, 40000, 80, 1000, 2000, netpkt.ACK | netpkt.PSH, 5000,
                      b"GET / HTTP/1.1\r\n\r\n"),
    "tcp-syn-mss": netpkt.tcp(CMAC, GMAC, CLIENT_IP6, GUEST_IP6, 40001, 80, 7, 0, netpkt.SYN, 5000, mss=1440),
    "udp": netpkt.udp(CMAC, GMAC, CLIENT_IP6, GUEST_IP6, 53, 5353, b"\x12\x34" + bytes(10)),
    "na": NA,
    "ra": nd6("in", netpkt.ND_RA, ALL_NODES),
}


def tshark_fields(tmp_path, frame: bytes, *fields: str) -> list[str]:
    path = tmp_path / "f.pcapng"
    w = PcapngWriter(path)
    w.event(w.add_interface("net0", "net"), "in", 1_000, frame, 1)
    w.close(end_vm_ns=2_000, icount=2)
    r = subprocess.run(["tshark", "-r", str(path), "-o", "tcp.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE",
                        "-T", "fields", *[x for f in fields for x in ("-e", f)]],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split("\t")


@pytest.mark.parametrize("name", FRAMES)
def test_what_the_replayer_builds_is_valid_ipv6_for_wireshark(tmp_path, name):
    frame = FRAMES[name]
    proto = {"tcp": "tcp", "tcp-syn-mss": "tcp", "udp": "udp"}.get(name, "icmpv6")
    status, src, dst = tshark_fields(tmp_path, frame, f"{proto}.checksum.status", "ipv6.src", "ipv6.dst")
    assert status == "1", f"{name}: checksum status {status!r} (1: good)"
    f = netpkt.parse(frame)
    assert (f.ip_src, f.ip_dst) == (netpkt.parse(frame).ip_src, netpkt.parse(frame).ip_dst)
    assert src == netpkt.ip_str(f.ip_src).strip("[]") and dst == netpkt.ip_str(f.ip_dst).strip("[]")


def test_parse_reads_what_was_built():
    f = netpkt.parse(FRAMES["tcp-syn-mss"])
    assert (f.eth_type, f.proto, f.sport, f.dport, f.seq, f.flags, f.mss) == \
        (netpkt.ETH_IP6, netpkt.PROTO_TCP, 40001, 80, 7, netpkt.SYN, 1440)
    f = netpkt.parse(FRAMES["udp"])
    assert (f.proto, f.sport, f.dport, f.payload) == (netpkt.PROTO_UDP, 53, 5353, b"\x12\x34" + bytes(10))
    f = netpkt.parse(NA)
    assert (f.icmp6_type, f.nd_target, f.src) == (netpkt.ND_NA, ROUTER6, netpkt.GATEWAY_MAC)
    # an MLD report: past its hop-by-hop header (router alert) to ICMPv6
    mld = bytes([58, 0, 5, 2, 0, 0, 1, 0]) + bytes([143, 0, 0, 0, 0, 0, 0, 0])
    frame = GMAC + CMAC + b"\x86\xdd" + netpkt._ipv6_packet(GUEST_IP6, ALL_ROUTERS, netpkt.IP6_HOP_BY_HOP, mld, 1)
    assert netpkt.parse(frame).icmp6_type == 143


def test_the_peer_answers_a_neighbour_solicitation_but_not_a_duplicate_address_check():
    p = Peer()
    (na,) = p.on_frame(nd6("out", netpkt.ND_NS, ROUTER6, target=ROUTER6), 10)
    f = netpkt.parse(na)
    assert (f.icmp6_type, f.nd_target, f.ip_src, f.ip_dst, f.dst) == (netpkt.ND_NA, ROUTER6, ROUTER6, GUEST_IP6, GMAC)
    assert na[-6:] == netpkt.GATEWAY_MAC                    # its link-layer address option
    dad = netpkt.icmp6(GMAC, b"\x33\x33\xff\x12\x34\x56", netpkt.IP6_ANY, GUEST_IP6,
                       bytes([netpkt.ND_NS, 0, 0, 0, 0, 0, 0, 0]) + GUEST_IP6)
    assert p.on_frame(dad, 11) == []
    assert p.on_frame(nd6("out", 143, ALL_ROUTERS), 12) == [] and p.out.unknown == []


def test_the_peer_answers_a_router_solicitation_with_the_natives_advertisement():
    advert = nd6("in", netpkt.ND_RA, ALL_NODES)
    known: list[bytes] = []
    p = Peer(router_advert=lambda: known[0] if known else None)
    rs = nd6("out", netpkt.ND_RS, ALL_ROUTERS)
    assert p.on_frame(rs, 10) == []             # not read from the native's log yet: asked again later
    known.append(advert)
    assert p.on_frame(rs, 20) == [advert]


def test_the_guests_udp_over_ipv6_is_kept_for_comparison_and_answered_as_a_request():
    p = Peer()
    q = netpkt.udp(GMAC, netpkt.GATEWAY_MAC, GUEST_IP6, bytes.fromhex("fec0" + "00" * 13 + "03"), 5353, 53, b"\x00\x01q")
    assert p.on_frame(q, 10) == []
    assert p.out.udp_out == [(10, (bytes.fromhex("fec0" + "00" * 13 + "03"), 53), b"\x00\x01q")]
    assert [r.dport for r in p.requests] == [53]


def test_no_release_rule_is_made_for_an_ipv6_connection():
    """QEMU's release rules (qemu-patches/0034) follow and patch IPv4 segments alone: an
    input on an IPv6 connection, or one waiting on an IPv6 connection's output, goes at a
    stop."""
    from tandem.semantic.network import rules
    from tandem.semantic.inputs import Input
    from tandem.semantic.network.peer import PeerFlow
    p = Peer()
    v6 = PeerFlow(0, (CLIENT_IP6, 40000), (GUEST_IP6, 80), CMAC, GMAC, isn=1, state="established")
    v4 = PeerFlow(1, (bytes([10, 0, 2, 2]), 40001), (bytes([10, 0, 2, 15]), 80), CMAC, GMAC, isn=1,
                  state="established")
    p.flows.update({0: v6, 1: v4})
    assert not v6.ipv4 and v4.ipv4
    waits_on_v6 = Input("tcp-data", 10, b"GET /\n", flow=1, needs_bytes={0: 5})
    assert rules.conditions(waits_on_v6, p, lambda flow, need: False, {}) is None
    waits_on_v4 = Input("tcp-data", 10, b"GET /\n", flow=1, needs_bytes={1: 5})
    assert rules.conditions(waits_on_v4, p, lambda flow, need: False, {}) is not None
