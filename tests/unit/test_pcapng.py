import io
import shutil
import subprocess
import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tandem.errors import BundleError
from tandem.pcapng import (EPB, IDB, DevlogReader, PcapngWriter, _block, _opt, _opts,
                           block_record, iter_events, read_devlog)

EVENTS = [  # (iface, direction, vm_ns, data, icount)
    (0, "out", 1_000, b"hello\n", 10),
    (1, "in", 2_000, b"\xff" * 61, 20),
    (2, "out", 3_000, struct.pack("<B7xQQ", 1, 4096, 3) + b"abc", None),
    (3, "in", (1 << 33) + 5, b"\x01\x02\x03\x04", 1 << 40),
]


def build(close=True) -> bytes:
    buf = io.BytesIO()
    w = PcapngWriter(buf)
    for name, kind in [("serial0", "serial"), ("net0", "net"), ("disk0", "block"), ("rng0", "rng")]:
        w.add_interface(name, kind)
    for ev in EVENTS:
        w.event(*ev)
    w.close(end_vm_ns=9_000 if close else None, icount=99)
    return buf.getvalue()


def write(tmp_path, data: bytes, name="devices.pcapng"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def block_offsets(data: bytes) -> list[int]:
    offs, off = [], 0
    while off < len(data):
        offs.append(off)
        off += struct.unpack_from("<I", data, off + 4)[0]
    return offs


def test_round_trip(tmp_path):
    log = read_devlog(write(tmp_path, build()))
    assert [(i.name, i.kind, i.linktype, i.tsresol) for i in log.interfaces] == [
        ("serial0", "serial", 147, 9), ("net0", "net", 1, 9),
        ("disk0", "block", 148, 9), ("rng0", "rng", 149, 9)]
    got = [(e.iface, e.direction, e.vm_ns, e.data, e.icount) for e in log.events]
    assert got == EVENTS
    assert [e.seq for e in log.events] == [0, 1, 2, 3]
    assert [e.channel for e in log.events] == ["serial0", "net0", "disk0", "rng0"]
    assert log.closed_cleanly and log.torn_at is None
    assert [tuple(s) for s in log.stats] == [(9_000, 1, 99)] * 4
    assert block_record(log.events[2].data) == (1, 4096, 3, b"abc")
    assert list(iter_events(tmp_path / "devices.pcapng")) == log.events


def test_no_isb_means_not_closed(tmp_path):
    log = read_devlog(write(tmp_path, build(close=False)))
    assert not log.closed_cleanly and log.stats == [None] * 4 and len(log.events) == 4


def test_clock_marks_are_not_events_nor_a_close(tmp_path):
    buf = io.BytesIO()
    w = PcapngWriter(buf)
    w.add_interface("serial0", "serial")
    w.add_interface("net0", "net")
    w.event(1, "in", 1_000, b"frame", 7)
    w.clock_mark(5_000, icount=9)
    w.event(0, "out", 6_000, b"x\n", 11)
    w.clock_mark(8_000)
    w.close()
    r = DevlogReader(write(tmp_path, buf.getvalue()))
    seen = []
    for e in r:
        seen.append((e.vm_ns, r.clock_ns))     # the mark is read once the next block is asked for
    assert seen == [(1_000, 0), (6_000, 5_000)]
    assert r.clock_ns == 8_000 and r.stats == [None, None]
    log = read_devlog(tmp_path / "devices.pcapng")
    assert len(log.events) == 2 and not log.closed_cleanly


def test_tsresol_default_us_and_unknown_block_skipped(tmp_path):
    data = build(close=False)
    shb_len = struct.unpack_from("<I", data, 4)[0]
    idb = _block(IDB, struct.pack("<HHI", 1, 0, 0) + _opts(_opt(2, b"eth")))  # no tsresol: us
    epb = _block(EPB, struct.pack("<5I", 0, 0, 7, 2, 2) + b"hi" + b"\0\0" + _opts())
    unknown = _block(0x0BAD, b"whatever")
    log = read_devlog(write(tmp_path, data[:shb_len] + idb + unknown + epb))
    assert log.interfaces[0].kind == "net"  # from the link type
    assert log.events[0].vm_ns == 7_000 and log.events[0].direction is None


def test_torn_tail(tmp_path):
    data = build()
    offs = block_offsets(data)
    cut = offs[-2] + 10  # inside the second-to-last ISB
    p = write(tmp_path, data[:cut])
    log = read_devlog(p)
    assert log.torn_at == offs[-2] and len(log.events) == 4 and not log.closed_cleanly
    with pytest.raises(BundleError, match=rf"^{p}: torn .* at offset {offs[-2]}$"):
        read_devlog(p, allow_torn=False)


@pytest.mark.parametrize("what,mutate,msg", [
    ("bad shb magic", lambda d, o: b"\x01\0\0\0" + d[4:], r"bad SHB magic .*at offset 0"),
    ("big endian", lambda d, o: d[:8] + struct.pack(">I", 0x1A2B3C4D) + d[12:], r"big-endian .*at offset 0"),
    ("len not mult 4", lambda d, o: d[:o[1] + 4] + struct.pack("<I", 33) + d[o[1] + 8:], r"bad block length 33 at offset {o1}"),
    ("len < 12", lambda d, o: d[:o[1] + 4] + struct.pack("<I", 8) + d[o[1] + 8:], r"bad block length 8 at offset {o1}"),
    ("trailer", lambda d, o: d[:o[2] - 4] + struct.pack("<I", 12) + d[o[2]:], r"trailing block length .* at offset {o1}"),
    ("unknown iface", lambda d, o: d[:o[5] + 8] + struct.pack("<I", 7) + d[o[5] + 12:], r"unknown interface 7 at offset {o5}"),
])
def test_corruption(tmp_path, what, mutate, msg):
    data = build()
    o = block_offsets(data)
    p = write(tmp_path, mutate(data, o))
    with pytest.raises(BundleError, match="^" + str(p) + ": " + msg.format(o1=o[1], o5=o[5]) + "$"):
        read_devlog(p)


def test_block_record_short():
    with pytest.raises(BundleError, match="24-byte header"):
        block_record(b"\x01" * 10)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0))
def test_cut_anywhere_never_crashes(tmp_path, cut):
    data = build()
    cut %= len(data) + 1
    full = read_devlog(write(tmp_path, data, "full.pcapng"))
    log = read_devlog(write(tmp_path, data[:cut]))  # a cut is never corruption
    complete = [e for e in full.events if e.file_offset + struct.unpack_from("<I", data, e.file_offset + 4)[0] <= cut]
    assert log.events == complete
    ends = (set(block_offsets(data)) | {len(data)}) - {0}  # empty file: torn at 0
    assert (log.torn_at is None) == (cut in ends)
    if log.torn_at is not None:
        assert all(e.file_offset < log.torn_at for e in log.events)


@pytest.mark.skipif(not shutil.which("tshark"), reason="tshark not installed")
def test_wireshark_reads_writer_output(tmp_path):
    p = write(tmp_path, build())
    out = subprocess.run(["tshark", "-r", str(p), "-T", "fields", "-e", "frame.interface_name",
                          "-e", "frame.len"], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["serial0", "6", "net0", "61", "disk0", "27", "rng0", "4"]
