"""What the reference VM's tests read from an analysis's own device log."""
from __future__ import annotations

from tandem.formats import netpkt, pcapng
from tandem.semantic.network import exchanges


def dhcp_to_guest(devlog) -> list[int]:
    """The DHCP message types the analysis guest received, in order."""
    out = []
    for e in pcapng.read_devlog(devlog).events:
        f = netpkt.parse(e.data) if e.kind == "net" and e.direction == "in" else None
        if f is not None and f.proto == netpkt.PROTO_UDP and (f.sport, f.dport) == (67, 68):
            out.append(exchanges.dhcp_type(f.payload))
    return out


def offered_then_acked(types: list[int]) -> bool:
    """DHCP message types (dhcp_to_guest) that are an OFFER for each DISCOVER the guest
    sent (a slower kernel sends it again, answered again as a server would) and then an ACK."""
    return 5 in types and set(types[:types.index(5)]) == {2}


def arp_replies_to_guest(devlog) -> set[bytes]:
    """The addresses (IPv4) an ARP reply to the analysis guest gave the MAC of."""
    out = set()
    for e in pcapng.read_devlog(devlog).events:
        f = netpkt.parse(e.data) if e.kind == "net" and e.direction == "in" else None
        if f is not None and f.eth_type == netpkt.ETH_ARP and f.arp_op == 2:
            out.add(f.arp_spa)
    return out


def icmp6_types(devlog, direction: str) -> set[int]:
    """The ICMPv6 message types that went this way ('in': to the guest) in a device log."""
    out = set()
    for e in pcapng.read_devlog(devlog).events:
        f = netpkt.parse(e.data) if e.kind == "net" and e.direction == direction else None
        if f is not None and f.eth_type == netpkt.ETH_IP6 and f.proto == netpkt.PROTO_ICMP6:
            out.add(f.icmp6_type)
    return out
