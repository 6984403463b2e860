"""IPv6 frames as QEMU's user network and an ordinary Linux guest exchange them, for the
extractor's and the replayer's unit tests (test_extract.py, test_ipv6.py)."""
from __future__ import annotations

from tandem.formats import netpkt

CMAC, GMAC = bytes.fromhex("52550a000202"), bytes.fromhex("525400123456")
GUEST_IP6 = bytes.fromhex("fec0000000000000505400fffe123456")     # fec0::5054:ff:fe12:3456 (EUI-64)
CLIENT_IP6 = bytes.fromhex("fec00000000000000000000000000002")    # fec0::2, QEMU's host
ROUTER6 = bytes.fromhex("fe800000000000000000000000000002")       # fe80::2, its router
ALL_NODES, ALL_ROUTERS = bytes.fromhex("ff020000000000000000000000000001"), bytes.fromhex("ff020000000000000000000000000002")
MLD_ROUTERS = bytes.fromhex("ff020000000000000000000000000016")


def nd6(direction: str, kind: int, dst: bytes, target: bytes = b"") -> bytes:
    """An ICMPv6 message of this type (with a neighbour message's target), to the guest
    from the router or from the guest."""
    body = bytes([kind, 0, 0, 0, 0, 0, 0, 0]) + target
    if direction == "in":
        return netpkt.icmp6(CMAC, GMAC, ROUTER6, dst, body)
    return netpkt.icmp6(GMAC, b"\x33\x33" + dst[-4:], GUEST_IP6, dst, body)
