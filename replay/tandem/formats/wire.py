"""What a guest's own network traffic says about its setup, for `tandem inspect`: the ARP,
DHCP and DNS it exchanged (an ordinary VM starts by asking for an address, resolving
names and finding its gateway). Everything here reads frames the guest wrote
or received: hostile input, parsed within bounds, summarised in counts and a few
printable examples, never trusted for a length."""
from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass, field

from . import netpkt

DHCP_SERVER, DHCP_CLIENT, DNS = 67, 68, 53
DHCP_MAGIC = b"\x63\x82\x53\x63"
DHCP_TYPES = {1: "DISCOVER", 2: "OFFER", 3: "REQUEST", 4: "DECLINE", 5: "ACK", 6: "NAK", 7: "RELEASE", 8: "INFORM"}
DNS_TYPES = {1: "A", 28: "AAAA", 5: "CNAME", 12: "PTR", 15: "MX", 16: "TXT", 33: "SRV", 65: "HTTPS"}
EXAMPLES = 8            # distinct names/addresses kept per kind


@dataclass
class WireSummary:
    """Counts per kind and a few examples, filled event by event (see()).
    arp: 'request'/'reply' counts; dhcp: message type counts; leased: the addresses
    DHCP offered or acknowledged; dns: 'query'/'answer' counts; names: the names queried
    with their type (e.g. 'deb.debian.org A')."""
    arp: Counter[str] = field(default_factory=Counter)
    dhcp: Counter[str] = field(default_factory=Counter)
    leased: list[str] = field(default_factory=list)
    dns: Counter[str] = field(default_factory=Counter)
    names: list[str] = field(default_factory=list)

    def see(self, frame: bytes) -> None:
        f = netpkt.parse(frame)
        if f is None:
            return
        if f.eth_type == netpkt.ETH_ARP and f.arp_op in (1, 2):
            self.arp["request" if f.arp_op == 1 else "reply"] += 1
        elif f.eth_type in (netpkt.ETH_IP, netpkt.ETH_IP6) and f.proto == netpkt.PROTO_UDP and not f.fragment:
            ports = {f.sport, f.dport}
            if ports == {DHCP_SERVER, DHCP_CLIENT}:
                self._dhcp(f.payload)
            elif DNS in ports:
                self._dns(f.payload, query=f.dport == DNS)

    def _dhcp(self, msg: bytes) -> None:
        if len(msg) < 240 or msg[236:240] != DHCP_MAGIC:
            return
        kind = dhcp_type(msg)
        self.dhcp[DHCP_TYPES.get(kind, f"type {kind}") if kind is not None else "BOOTP"] += 1
        yiaddr = netpkt.ip_str(msg[16:20])
        if kind in (2, 5) and yiaddr != "0.0.0.0" and yiaddr not in self.leased and len(self.leased) < EXAMPLES:
            self.leased.append(yiaddr)

    def _dns(self, msg: bytes, *, query: bool) -> None:
        if len(msg) < 12:
            return
        self.dns["query" if query else "answer"] += 1
        question = dns_question(msg) if query else None
        if question is not None:
            name, qtype = question
            shown = f"{name} {DNS_TYPES.get(qtype, f'type {qtype}')}"
            if shown not in self.names and len(self.names) < EXAMPLES:
                self.names.append(shown)

    def empty(self) -> bool:
        return not (self.arp or self.dhcp or self.dns)

    def as_dict(self) -> dict[str, object]:
        return {"arp": dict(self.arp), "dhcp": dict(self.dhcp), "leased": self.leased,
                "dns": dict(self.dns), "names": self.names}


def dhcp_type(msg: bytes) -> int | None:
    """The DHCP message type (option 53) of a BOOTP message, None if it is not DHCP."""
    if len(msg) < 240 or msg[236:240] != DHCP_MAGIC:
        return None
    return _dhcp_type(msg[240:])


def dns_question(msg: bytes) -> tuple[str, int] | None:
    """(name, type) of a DNS message's first question, None if it has none or is malformed."""
    if len(msg) < 12 or struct.unpack_from("!H", msg, 4)[0] < 1:
        return None
    parsed = _qname(msg, 12)
    if parsed is None or parsed[1] + 4 > len(msg):
        return None
    return parsed[0], struct.unpack_from("!H", msg, parsed[1])[0]


def _dhcp_type(options: bytes) -> int | None:
    """Option 53 (the DHCP message type) from a DHCP options field, or None."""
    i = 0
    while i < len(options):
        code = options[i]
        if code == 255:
            return None
        if code == 0:
            i += 1
            continue
        if i + 1 >= len(options):
            return None
        length = options[i + 1]
        if code == 53 and length >= 1 and i + 2 < len(options):
            return options[i + 2]
        i += 2 + length
    return None


def _qname(msg: bytes, at: int) -> tuple[str, int] | None:
    """A query's name (labels, no compression: a question's name has none) and where it
    ends; None if malformed. Printable: a label byte outside printable ASCII is escaped."""
    labels: list[str] = []
    while at < len(msg) and len(labels) < 128:
        n = msg[at]
        if n == 0:
            return (".".join(labels) or "."), at + 1
        if n & 0xC0 or at + 1 + n > len(msg):
            return None
        labels.append("".join(chr(b) if 0x21 <= b < 0x7F else f"\\{b:03d}" for b in msg[at + 1:at + 1 + n]))
        at += 1 + n
    return None
