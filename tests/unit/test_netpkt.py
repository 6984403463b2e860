"""The frames the replayer builds (formats/netpkt.py): checksums a guest's stack accepts
and fields that parse back as built. A guest drops a segment whose checksum is wrong
without a word, so an error here shows up only as a replay that stalls."""
import struct

from hypothesis import given, settings, strategies as st

from tandem.formats import netpkt


def word_sum_checksum(data: bytes) -> int:
    """RFC 1071 as written: the ones' complement sum of the 16-bit words, complemented."""
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


ADDR = st.binary(min_size=4, max_size=4)
MAC = st.binary(min_size=6, max_size=6)
PORT = st.integers(0, 0xFFFF)


@settings(max_examples=500)
@given(st.one_of(st.binary(max_size=3000),
                 st.integers(1, 40).map(lambda n: b"\xff" * n),     # sums that are multiples of 0xFFFF
                 st.integers(1, 40).map(lambda n: b"\0" * n)))
def test_checksum_is_rfc1071s_word_sum(data):
    assert netpkt._checksum(data) == word_sum_checksum(data)


@settings(max_examples=200)
@given(MAC, MAC, ADDR, ADDR, PORT, PORT, st.integers(0, 1 << 33), st.integers(0, 1 << 33),
       st.integers(0, 0xFF), st.integers(0, 1 << 17), st.binary(max_size=1460),
       st.sampled_from([None, 536, 1460]), st.integers(0, 1 << 17))
def test_a_built_tcp_segment_verifies_and_parses_back(smac, dmac, src, dst, sport, dport, seq, ack,
                                                      flags, window, payload, mss, ident):
    frame = netpkt.tcp(smac, dmac, src, dst, sport, dport, seq, ack, flags, window, payload,
                       mss=mss, ident=ident)
    ip = frame[14:34]
    assert word_sum_checksum(ip) == 0                       # a header with its checksum sums to 0xFFFF
    seg = frame[34:]
    assert word_sum_checksum(struct.pack("!4s4sBBH", src, dst, 0, netpkt.PROTO_TCP, len(seg)) + seg) == 0
    f = netpkt.parse(frame)
    assert f is not None
    assert (f.dst, f.src, f.ip_src, f.ip_dst, f.sport, f.dport) == (dmac, smac, src, dst, sport, dport)
    assert (f.seq, f.ack, f.flags, f.window, f.payload, f.mss) == \
        (seq & 0xFFFFFFFF, ack & 0xFFFFFFFF, flags, min(window, 0xFFFF), payload, mss)


@settings(max_examples=100)
@given(MAC, MAC, ADDR, ADDR, PORT, PORT, st.binary(max_size=1472))
def test_a_built_udp_datagram_verifies(smac, dmac, src, dst, sport, dport, payload):
    frame = netpkt.udp(smac, dmac, src, dst, sport, dport, payload)
    seg = frame[34:]
    assert word_sum_checksum(frame[14:34]) == 0
    assert word_sum_checksum(struct.pack("!4s4sBBH", src, dst, 0, netpkt.PROTO_UDP, len(seg)) + seg) == 0
    assert netpkt.parse(frame).payload == payload
