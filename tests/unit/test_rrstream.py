import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tandem.errors import BundleError
from tandem.formats.rrstream import SEG_HDR, StreamWriter, is_being_written, iter_raw, scan, to_stock, write_intact_prefix

PAYLOADS = [bytes([i]) * (100 + 37 * i) + b"event-%d" % i for i in range(5)]


def build(tmp_path, *, compress=False, finish=True, name="replay.tdrs"):
    p = tmp_path / name
    w = StreamWriter(p, version=0xE0200C, compress=compress)
    for i, payload in enumerate(PAYLOADS[:-1]):
        w.segment(payload, icount=1000 * (i + 1))
    w.close(icount=99_999 if finish else None, raw=PAYLOADS[-1])
    return p


def seg_offsets(data: bytes) -> list[int]:
    offs, off = [], 16
    while off < len(data):
        offs.append(off)
        off += SEG_HDR.size + struct.unpack_from("<I", data, off + 12)[0]
    return offs


@pytest.mark.parametrize("compress", [False, True])
def test_round_trip(tmp_path, compress):
    p = build(tmp_path, compress=compress)
    info = scan(p)
    assert info.version == 0xE0200C and info.finished and info.torn_at is None
    assert [s.seq for s in info.segments] == list(range(5))
    assert [s.icount for s in info.segments] == [1000, 2000, 3000, 4000, 99_999]
    assert info.last_icount == 99_999 and info.segments[-1].end
    assert info.raw_bytes == sum(map(len, PAYLOADS))
    assert (info.stored_bytes < info.raw_bytes) == compress
    assert list(iter_raw(p)) == PAYLOADS
    stock = tmp_path / "stock.bin"
    to_stock(p, stock)
    assert stock.read_bytes() == struct.pack(">I", 0xE0200C) + bytes(8) + b"".join(PAYLOADS)
    assert not is_being_written(p)


def test_unfinished_is_not_torn(tmp_path):
    info = scan(build(tmp_path, finish=False))
    assert not info.finished and info.torn_at is None and len(info.segments) == 4


def test_torn_tail_and_intact_prefix(tmp_path):
    p = build(tmp_path, compress=True)
    data = p.read_bytes()
    offs = seg_offsets(data)
    p.write_bytes(data[:offs[-1] + 50])  # header of the last segment complete, payload not
    info = scan(p)
    assert info.torn_at == offs[-1] and not info.finished and len(info.segments) == 4
    out = tmp_path / "prefix.tdrs"
    write_intact_prefix(p, out)
    assert out.read_bytes() == data[:offs[-1]]
    again = scan(out)
    assert again.torn_at is None and not again.finished and list(iter_raw(out)) == PAYLOADS[:4]


def test_zero_filled_tail_is_torn(tmp_path):
    p = build(tmp_path)
    data = p.read_bytes()
    p.write_bytes(data + bytes(4096))  # host crash: size updated, data blocks not
    info = scan(p)
    assert info.torn_at == len(data) and info.finished is True


def _patch(data, off, new):
    return data[:off] + new + data[off + len(new):]


def _rehdr(data, off, **fields):
    """Rewrite header fields of the segment at `off` and fix its header CRC."""
    import zlib
    names = ["magic", "seq", "flags", "stored", "raw", "crc", "icount", "rt", "res", "hcrc"]
    vals = dict(zip(names, SEG_HDR.unpack_from(data, off)), **fields)
    hdr = SEG_HDR.pack(*(vals[n] for n in names))[:44]
    return _patch(data, off, hdr + struct.pack("<I", zlib.crc32(hdr)))


@pytest.mark.parametrize("case", ["file magic", "header crc", "payload crc", "gap", "after end"])
def test_corruption(tmp_path, case):
    p = build(tmp_path)
    data = p.read_bytes()
    o = seg_offsets(data)
    if case == "file magic":
        data, msg = _patch(data, 0, b"XXXX"), rf"^{p}: bad file magic .*at offset 0$"
    elif case == "header crc":
        data, msg = _patch(data, o[2] + 24, b"\x01"), rf"^{p}: corrupt segment 2 at offset {o[2]}: header CRC mismatch$"
    elif case == "payload crc":
        data, msg = _patch(data, o[1] + 60, b"\xee"), rf"^{p}: corrupt segment 1 at offset {o[1]}: payload CRC mismatch$"
    elif case == "gap":
        data, msg = _rehdr(data, o[3], seq=7), rf"^{p}: corrupt segment 3 at offset {o[3]}: sequence gap \(found segment 7\)$"
    else:
        data, msg = _rehdr(data, o[1], flags=1), rf"^{p}: corrupt segment 2 at offset {o[2]}: segment after END$"
    p.write_bytes(data)
    with pytest.raises(BundleError, match=msg):
        scan(p)
    with pytest.raises(BundleError, match=msg):
        list(iter_raw(p))


def test_being_written(tmp_path):
    import fcntl
    p = build(tmp_path, finish=False)
    with open(p, "ab") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        assert is_being_written(p)


_FIXTURE = {}


def _fixture_bytes(tmp_path_factory, compress):
    if compress not in _FIXTURE:
        _FIXTURE[compress] = build(tmp_path_factory.mktemp("fx"), compress=compress).read_bytes()
    return _FIXTURE[compress]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0), compress=st.booleans())
def test_cut_anywhere(tmp_path_factory, cut, compress):
    data = _fixture_bytes(tmp_path_factory, compress)
    cut %= len(data) + 1
    p = tmp_path_factory.mktemp("cut") / "replay.tdrs"
    p.write_bytes(data[:cut])
    info = scan(p)  # a cut is never corruption
    offs = seg_offsets(data) + [len(data)]
    complete = [o for o in offs[1:] if o <= cut]
    assert len(info.segments) == len(complete)
    assert list(iter_raw(p)) == PAYLOADS[:len(complete)]
    if cut in offs:
        assert info.torn_at is None
    else:
        assert info.torn_at == (0 if cut < 16 else max([16] + complete))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pos=st.integers(min_value=0), bit=st.integers(0, 7), compress=st.booleans())
def test_flipped_payload_byte_names_segment(tmp_path_factory, pos, bit, compress):
    data = _fixture_bytes(tmp_path_factory, compress)
    offs = seg_offsets(data)
    stored = [struct.unpack_from("<I", data, o + 12)[0] for o in offs]
    seg = pos % len(offs)
    off = offs[seg] + SEG_HDR.size + (pos // len(offs)) % stored[seg]
    p = tmp_path_factory.mktemp("flip") / "replay.tdrs"
    p.write_bytes(_patch(data, off, bytes([data[off] ^ (1 << bit)])))
    with pytest.raises(BundleError, match=rf"corrupt segment {seg} at offset {offs[seg]}: payload CRC mismatch"):
        scan(p)
