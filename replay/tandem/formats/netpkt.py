"""Ethernet/ARP/IPv4/IPv6/TCP/UDP/ICMP/ICMPv6: parse and build the frames a guest NIC sees.

Only what the replayer and the comparator need, with struct for speed (the
comparator's throughput target is hundreds of MB/s): no options beyond TCP MSS
and window scale, no IPv4 fragments (reported by the caller as a replay limit); of
IPv6's extension headers, hop-by-hop options alone (every MLD report carries one), and
of ICMPv6, neighbour discovery (RFC 4861) as QEMU's user network speaks it.
"""
from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

ETH_IP, ETH_ARP, ETH_IP6 = 0x0800, 0x0806, 0x86DD
PROTO_ICMP, PROTO_TCP, PROTO_UDP, PROTO_ICMP6 = 1, 6, 17, 58
IP6_HOP_BY_HOP = 0
# ICMPv6 neighbour discovery (RFC 4861): router and neighbour solicitations, advertisements.
ND_RS, ND_RA, ND_NS, ND_NA = 133, 134, 135, 136
ND_OPT_SOURCE_LLA, ND_OPT_TARGET_LLA = 1, 2
IP6_ANY = bytes(16)
FIN, SYN, RST, PSH, ACK = 0x01, 0x02, 0x04, 0x08, 0x10

# QEMU user networking's addresses: tandem's analysis VMs meet the same network.
GATEWAY_MAC = bytes.fromhex("52550a000202")   # slirp's virtual host (10.0.2.2)


def ip_str(b: bytes) -> str:
    """An IPv4 address dotted, an IPv6 one as RFC 5952 writes it (in brackets, as a port follows)."""
    if len(b) == 16:
        return f"[{ipaddress.IPv6Address(b)}]"
    return ".".join(str(x) for x in b)


@dataclass
class Frame:
    """A parsed frame. Fields beyond `eth_type` are set for the protocols present."""
    dst: bytes
    src: bytes
    eth_type: int
    # IPv4
    ip_src: bytes = b""
    ip_dst: bytes = b""
    proto: int = 0
    fragment: bool = False
    # TCP/UDP
    sport: int = 0
    dport: int = 0
    seq: int = 0
    ack: int = 0
    flags: int = 0
    window: int = 0
    mss: int | None = None
    wscale: int | None = None
    payload: bytes = b""
    # ARP
    arp_op: int = 0
    arp_sha: bytes = b""
    arp_spa: bytes = b""
    arp_tpa: bytes = b""
    # ICMPv6 (ip_src/ip_dst are then 16 bytes): its type, and a neighbour message's target
    icmp6_type: int = 0
    nd_target: bytes = b""

    def flow(self) -> tuple[bytes, int, bytes, int]:
        """(src ip, src port, dst ip, dst port) for TCP/UDP."""
        return (self.ip_src, self.sport, self.ip_dst, self.dport)


def parse(frame: bytes) -> Frame | None:
    """Parse an Ethernet frame; None if it is too short to be one."""
    if len(frame) < 14:
        return None
    dst, src, et = frame[:6], frame[6:12], struct.unpack_from("!H", frame, 12)[0]
    f = Frame(dst, src, et)
    if et == ETH_ARP and len(frame) >= 42:
        f.arp_op = struct.unpack_from("!H", frame, 20)[0]
        f.arp_sha, f.arp_spa, f.arp_tpa = frame[22:28], frame[28:32], frame[38:42]
    elif et == ETH_IP and len(frame) >= 34:
        ihl = (frame[14] & 0x0F) * 4
        total, frag = struct.unpack_from("!H2xH", frame, 16)
        f.proto = frame[23]
        f.ip_src, f.ip_dst = frame[26:30], frame[30:34]
        f.fragment = bool(frag & 0x3FFF)
        l4 = 14 + ihl
        end = min(len(frame), 14 + total)
        if f.fragment:
            return f
        if f.proto == PROTO_TCP and end >= l4 + 20:
            f.sport, f.dport, f.seq, f.ack, off, f.flags, f.window = struct.unpack_from(
                "!HHIIBBH", frame, l4)
            hl = (off >> 4) * 4
            _tcp_options(f, frame[l4 + 20:l4 + hl])
            f.payload = frame[l4 + hl:end]
        elif f.proto == PROTO_UDP and end >= l4 + 8:
            f.sport, f.dport = struct.unpack_from("!HH", frame, l4)
            f.payload = frame[l4 + 8:end]
        elif f.proto == PROTO_ICMP:
            f.payload = frame[l4:end]
    elif et == ETH_IP6 and len(frame) >= 54:
        _ipv6(f, frame)
    return f


def _ipv6(f: Frame, frame: bytes) -> None:
    """An IPv6 packet's addresses and upper layer (past one hop-by-hop header)."""
    length, nxt = struct.unpack_from("!HB", frame, 18)
    f.ip_src, f.ip_dst = frame[22:38], frame[38:54]
    l4, end = 54, min(len(frame), 54 + length)
    if nxt == IP6_HOP_BY_HOP and end >= l4 + 8:
        nxt, l4 = frame[l4], l4 + 8 * (frame[l4 + 1] + 1)
    f.proto = nxt
    if nxt == PROTO_TCP and end >= l4 + 20:
        f.sport, f.dport, f.seq, f.ack, off, f.flags, f.window = struct.unpack_from("!HHIIBBH", frame, l4)
        _tcp_options(f, frame[l4 + 20:l4 + (off >> 4) * 4])
        f.payload = frame[l4 + (off >> 4) * 4:end]
    elif nxt == PROTO_UDP and end >= l4 + 8:
        f.sport, f.dport = struct.unpack_from("!HH", frame, l4)
        f.payload = frame[l4 + 8:end]
    elif nxt == PROTO_ICMP6 and end >= l4 + 4:
        f.icmp6_type, f.payload = frame[l4], frame[l4:end]
        if f.icmp6_type in (ND_NS, ND_NA) and end >= l4 + 24:
            f.nd_target = frame[l4 + 8:l4 + 24]


_IP4_TCP = struct.Struct("!2xH2xHBB2x4s4s")   # at offset 14: total length, frag, ttl, proto, src, dst
_TCP_HEAD = struct.Struct("!HHIIBB")            # ports, seq, ack, data offset, flags


# tcp4()'s answer: (ip src, sport, ip dst, dport, seq, flags, payload).
TcpSegment = tuple[bytes, int, bytes, int, int, int, bytes]


def tcp4(frame: bytes) -> TcpSegment | None:
    """The fields parse() would give an unfragmented IPv4 TCP segment with a complete
    header, without building a Frame: (ip src, sport, ip dst, dport, seq, flags,
    payload); None for anything else (use parse() for it). The MACs are frame[6:12]
    (source) and frame[:6]."""
    if len(frame) < 54 or frame[23] != PROTO_TCP or frame[12:14] != b"\x08\x00":
        return None
    total, frag, _ttl, _proto, ip_src, ip_dst = _IP4_TCP.unpack_from(frame, 14)
    if frag & 0x3FFF:
        return None
    l4 = 14 + (frame[14] & 0x0F) * 4
    end = min(14 + total, len(frame))
    if end < l4 + 20:
        return None
    sport, dport, seq, _ack, off, flags = _TCP_HEAD.unpack_from(frame, l4)
    return ip_src, sport, ip_dst, dport, seq, flags, frame[l4 + (off >> 4) * 4:end]


def _tcp_options(f: Frame, opts: bytes) -> None:
    i = 0
    while i < len(opts):
        kind = opts[i]
        if kind == 0:
            break
        if kind == 1:
            i += 1
            continue
        if i + 1 >= len(opts):
            break
        ln = opts[i + 1]
        if i + ln > len(opts):      # truncated option (a malformed frame): ignore the rest
            break
        if kind == 2 and ln == 4:
            f.mss = struct.unpack_from("!H", opts, i + 2)[0]
        elif kind == 3 and ln == 3:
            f.wscale = opts[i + 2]
        i += max(ln, 2)


_IP4_HEAD = struct.Struct("!BBHHHBBH4s4s")
_TCP_HEAD_OUT = struct.Struct("!HHIIBBHHH")
_PSEUDO = struct.Struct("!4s4sBBH")
_MSS_OPTION = struct.Struct("!BBH")
_ETH_IP = struct.pack("!H", ETH_IP)
_ETH_IP6 = struct.pack("!H", ETH_IP6)


def _checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of data. The ones' complement sum of its 16-bit
    words is the data read as one big-endian number modulo 0xFFFF (2**16 is 1 modulo
    0xFFFF), written 0xFFFF when that is 0 and the data is not all zeros: one modulo in
    C: a full 1460-byte segment takes 5.5-8 us to build, against 13-14 us summing the
    unpacked words; small segments take 3-5 us either way (timeit).
    tests/unit/test_netpkt.py checks it against the word sum."""
    if len(data) % 2:
        data += b"\0"
    n = int.from_bytes(data, "big")
    s = n % 0xFFFF or (0xFFFF if n else 0)
    return ~s & 0xFFFF


def _ipv4(src: bytes, dst: bytes, proto: int, l4: bytes, ident: int) -> bytes:
    hdr = _IP4_HEAD.pack(0x45, 0, 20 + len(l4), ident & 0xFFFF, 0x4000, 64, proto, 0, src, dst)
    return hdr[:10] + _checksum(hdr).to_bytes(2, "big") + hdr[12:] + l4


def tcp(src_mac: bytes, dst_mac: bytes, src: bytes, dst: bytes, sport: int, dport: int,
        seq: int, ack: int, flags: int, window: int, payload: bytes = b"",
        mss: int | None = None, ident: int = 0) -> bytes:
    opts = _MSS_OPTION.pack(2, 4, mss) if mss else b""
    hl = 20 + len(opts)
    head = (sport, dport, seq & 0xFFFFFFFF, ack & 0xFFFFFFFF, (hl // 4) << 4, flags, min(window, 0xFFFF))
    tail = opts + payload
    csum = _checksum(_pseudo(src, dst, PROTO_TCP, hl + len(payload)) + _TCP_HEAD_OUT.pack(*head, 0, 0) + tail)
    seg = _TCP_HEAD_OUT.pack(*head, csum, 0) + tail
    return dst_mac + src_mac + _ip(src, dst, PROTO_TCP, seg, ident)


def _pseudo(src: bytes, dst: bytes, proto: int, length: int) -> bytes:
    """The pseudo header a TCP or UDP checksum covers: IPv4's (RFC 793), or IPv6's
    (RFC 8200 8.1) when the addresses are 16 bytes."""
    if len(src) == 16:
        return struct.pack("!16s16sI3xB", src, dst, length, proto)
    return _PSEUDO.pack(src, dst, 0, proto, length)


def _ip(src: bytes, dst: bytes, proto: int, l4: bytes, ident: int) -> bytes:
    """The EtherType and IP packet around l4: IPv6 when the addresses are 16 bytes."""
    if len(src) == 16:
        return _ETH_IP6 + _ipv6_packet(src, dst, proto, l4, 64)
    return _ETH_IP + _ipv4(src, dst, proto, l4, ident)


def udp(src_mac: bytes, dst_mac: bytes, src: bytes, dst: bytes, sport: int, dport: int,
        payload: bytes, ident: int = 0) -> bytes:
    seg = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
    c = _checksum(_pseudo(src, dst, PROTO_UDP, len(seg)) + seg) or 0xFFFF
    seg = seg[:6] + c.to_bytes(2, "big") + seg[8:]
    return dst_mac + src_mac + _ip(src, dst, PROTO_UDP, seg, ident)


def _ipv6_packet(src: bytes, dst: bytes, nxt: int, l4: bytes, hop_limit: int = 255) -> bytes:
    return struct.pack("!IHBB16s16s", 6 << 28, len(l4), nxt, hop_limit, src, dst) + l4


def icmp6(src_mac: bytes, dst_mac: bytes, src: bytes, dst: bytes, body: bytes, hop_limit: int = 255) -> bytes:
    """An ICMPv6 message (type, code, a zero checksum, the rest) with its checksum over
    the IPv6 pseudo header (RFC 4443), in its frame."""
    c = _checksum(_pseudo(src, dst, PROTO_ICMP6, len(body)) + body[:2] + b"\0\0" + body[4:])
    body = body[:2] + c.to_bytes(2, "big") + body[4:]
    return dst_mac + src_mac + _ETH_IP6 + _ipv6_packet(src, dst, PROTO_ICMP6, body, hop_limit)


def neighbour_advert(my_mac: bytes, target: bytes, to_mac: bytes, to_ip: bytes) -> bytes:
    """The answer to a neighbour solicitation for `target`: the router (R), solicited (S),
    override (O), from target itself, with my_mac as its link-layer address."""
    body = struct.pack("!BBHI16sBB6s", ND_NA, 0, 0, 0xE0000000, target, ND_OPT_TARGET_LLA, 1, my_mac)
    return icmp6(my_mac, to_mac, target, to_ip, body)


def arp_reply(my_mac: bytes, my_ip: bytes, to_mac: bytes, to_ip: bytes) -> bytes:
    body = struct.pack("!HHBBH6s4s6s4s", 1, ETH_IP, 6, 4, 2, my_mac, my_ip, to_mac, to_ip)
    return to_mac + my_mac + struct.pack("!H", ETH_ARP) + body
