import hashlib
import io
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tandem.errors import BundleError
from tandem.formats.pcapng import EPB, IDB, ISB, PIECE, SNAPLEN, DevlogReader, PcapngWriter, _block, _opt, _opts, block_record, iter_events, read_devlog

EVENTS = [  # (iface, direction, vm_ns, data, icount)
    (0, "out", 1_000, b"hello\n", 10),
    (1, "in", 2_000, b"\xff" * 61, 20),
    (2, "out", 3_000, struct.pack("<B7xQQ", 1, 4096, 3) + b"abc", None),
    (3, "in", (1 << 33) + 5, b"\x01\x02\x03\x04", 1 << 40),
]


def build(close=True, events=EVENTS, fmt: int = 2) -> bytes:
    buf = io.BytesIO()
    w = PcapngWriter(buf, format=fmt)
    for name, kind in [("serial0", "serial"), ("net0", "net"), ("disk0", "block"), ("rng0", "rng")]:
        w.add_interface(name, kind)
    for ev in events:
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


@pytest.mark.parametrize("written_before", [0, 1, 3])
def test_what_the_writer_wrote_while_the_follower_waited_is_read(tmp_path, written_before):
    """A follower asked whether the writer goes on (follow=) may wait there a long while
    (live/shadow.py, yielding): the writer may write the rest and finish meanwhile, and
    what it wrote is still read, from an empty file on."""
    data = build()
    offs = block_offsets(data) + [len(data)]
    p = write(tmp_path, data[:offs[written_before]])
    asked = []

    def follow() -> bool:       # the first time, the writer finishes as the follower waits
        if not asked:
            p.write_bytes(data)
        asked.append(True)
        return False

    r = DevlogReader(p, follow=follow)
    got = [(e.iface, e.direction, e.vm_ns, e.data, e.icount) for e in r]
    assert got == EVENTS and r.torn_at is None and len(asked) == 1


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
    # serial, block and rng records carry format 2's 16-byte record header
    assert out.split() == ["serial0", "22", "net0", "61", "disk0", "43", "rng0", "20"]


# --- format 2: long events in continued records ---------------------------------------

def _blockw(offset: int, payload: bytes, op: int = 1) -> bytes:
    return struct.pack("<B7xQQ", op, offset, len(payload)) + payload


LONG = [  # events longer than a record: a multi-MiB disk write, a long serial run, a huge
          # rng delivery and a net "frame" past Wireshark's cap (a hostile guest's)
    (2, "out", 1_000, _blockw(0x100000, bytes(range(256)) * (3 * 4096 + 7)), 5),
    (0, "out", 2_000, b"x" * (PIECE * 2 + 1), 6),
    (3, "in", 3_000, b"\x07" * (PIECE + 5), None),
    (1, "in", 4_000, b"\xee" * (SNAPLEN + 100), 8),
    (2, "out", 5_000, struct.pack("<B7xQQ", 2, 0, 0), 9),        # a flush: no data
    (2, "out", 6_000, _blockw(4096, b"z" * PIECE), 10),          # exactly one piece
]


def build_long(fmt: int = 2, close: bool = True) -> bytes:
    return build(close, LONG, fmt)


def epb_lengths(data: bytes) -> list[int]:
    return [struct.unpack_from("<I", data, o + 20)[0] for o in block_offsets(data)
            if struct.unpack_from("<I", data, o)[0] == EPB]


@pytest.mark.parametrize("fmt", [1, 2])
def test_long_events_read_back_whole(tmp_path, fmt):
    """Format 2 splits them (every record within Wireshark's cap), format 1 did not; the
    reader gives the same events from both."""
    data = build_long(fmt)
    log = read_devlog(write(tmp_path, data))
    assert [(e.iface, e.direction, e.vm_ns, e.data, e.icount) for e in log.events] == LONG
    assert [e.seq for e in log.events] == list(range(len(LONG)))
    assert log.format == fmt and log.closed_cleanly
    if fmt == 2:
        assert max(epb_lengths(data)) <= SNAPLEN
        assert log.records == [3, 2, 51, 2]    # disk: 49 pieces of the 3 MiB write, a flush, 1
        assert [s.count for s in log.stats] == log.records
    else:
        assert log.records == [1, 1, 3, 1] and max(epb_lengths(data)) > SNAPLEN


def test_the_vcpu_of_an_event_reads_back_where_the_log_has_one(tmp_path):
    """The vCPU rides in the record header of tandem's own link types (the fast path
    reads a single record's, the general path a long event's first piece's); a frame
    (Ethernet, no header) and an event no vCPU made have none, nor has format 1."""
    serial, net, disk, rng = range(4)
    written = [(serial, "out", 1_000, b"from vcpu 1\n", 10, 1), (serial, "out", 2_000, b"from vcpu 0\n", 20, 0),
               (net, "out", 3_000, b"\xff" * 60, 30, 1), (rng, "in", 4_000, b"\x01" * 8, 40, None),
               (disk, "out", 5_000, struct.pack("<B7xQQ", 1, 0, 3 * PIECE) + b"\x07" * (3 * PIECE), 50, 1)]
    for fmt, want in ((2, [1, 0, None, None, 1]), (1, [None] * 5)):
        buf = io.BytesIO()
        w = PcapngWriter(buf, format=fmt)
        for name, kind in [("serial0", "serial"), ("net0", "net"), ("disk0", "block"), ("rng0", "rng")]:
            w.add_interface(name, kind)
        for iface, direction, ns, data, icount, vcpu in written:
            w.event(iface, direction, ns, data, icount, vcpu=vcpu if iface != net else None)
        w.close(end_vm_ns=9_000, icount=99)
        log = read_devlog(write(tmp_path, buf.getvalue(), f"f{fmt}.pcapng"))
        assert [e.vcpu for e in log.events] == want, fmt
        assert [e.data for e in log.events] == [x[3] for x in written]


def test_block_pieces_carry_their_own_offset(tmp_path):
    data = build_long()
    offs = [o for o in block_offsets(data) if struct.unpack_from("<II", data, o)[0] == EPB
            and struct.unpack_from("<I", data, o + 8)[0] == 2]
    # the record header (16 bytes), then the block header of the piece
    heads = [struct.unpack_from("<B7xQQ", data, o + 28 + 16) for o in offs]
    assert heads[:2] == [(1, 0x100000, PIECE), (1, 0x100000 + PIECE, PIECE)]
    assert sum(n for op, _, n in heads if op == 1) == len(LONG[0][3]) - 24 + PIECE


def test_torn_between_pieces_is_a_torn_tail_at_the_event(tmp_path):
    data = build_long(close=False)
    first = [o for o in block_offsets(data) if struct.unpack_from("<I", data, o)[0] == EPB][0]
    second = block_offsets(data)[block_offsets(data).index(first) + 1]
    p = write(tmp_path, data[:second])  # the writer died after the first piece
    log = read_devlog(p)
    assert log.events == [] and log.torn_at == first
    with pytest.raises(BundleError, match=rf"torn .* at offset {first}$"):
        read_devlog(p, allow_torn=False)


def test_continued_event_cut_by_another_block_is_corruption(tmp_path):
    data = build_long(close=False)
    offs = block_offsets(data)
    first = [o for o in offs if struct.unpack_from("<I", data, o)[0] == EPB][0]
    second = offs[offs.index(first) + 1]
    isb = _block(ISB, struct.pack("<3I", 0, 0, 1) + _opts())     # a clock mark between pieces
    p = write(tmp_path, data[:second] + isb + data[second:])
    with pytest.raises(BundleError, match=rf"continued from offset {first} is cut by a block of type 0x5"):
        read_devlog(p)
    other = io.BytesIO()                 # a record of another channel between pieces
    w = PcapngWriter(other)
    w.add_interface("serial0", "serial")
    w.add_interface("disk0", "block")
    w.event(1, "out", 10, _blockw(0, b"a" * (PIECE + 1)), 1)
    w.event(0, "out", 10, b"b\n", 1)
    pieces = block_offsets(other.getvalue())
    d = other.getvalue()
    swapped = d[:pieces[4]] + d[pieces[5]:] + d[pieces[4]:pieces[5]]   # serial record before piece 2
    with pytest.raises(BundleError, match=r"cut by another event \(channel serial0\)"):
        read_devlog(write(tmp_path, swapped, "x.pcapng"))


def test_newer_format_is_refused(tmp_path):
    buf = io.BytesIO()
    PcapngWriter(buf, format=3)
    with pytest.raises(BundleError, match=r"format 3, newer than this tandem reads \(2\) at offset 0"):
        read_devlog(write(tmp_path, buf.getvalue()))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0))
def test_cut_anywhere_in_pieces_never_crashes(tmp_path, cut):
    data = build_long(close=False)
    cut %= len(data) + 1
    full = read_devlog(write(tmp_path, data, "full.pcapng"))
    log = read_devlog(write(tmp_path, data[:cut]))
    offs = block_offsets(data)
    starts = [e.file_offset for e in full.events] + [len(data)]
    complete = [e for e, nxt in zip(full.events, starts[1:]) if nxt <= cut]
    assert log.events == complete      # an event is read once all its records are whole
    later_pieces = {o for o in offs if o > starts[0] and o not in starts}
    assert (log.torn_at is None) == (cut in (set(offs) | {len(data)}) - later_pieces - {0})
    if log.torn_at is not None:       # torn at the event's first record, or at a cut block
        assert log.torn_at in set(offs) - later_pieces


@pytest.mark.skipif(not shutil.which("capinfos"), reason="capinfos not installed")
def test_wireshark_reads_long_events_to_the_end(tmp_path):
    p = write(tmp_path, build_long())
    r = subprocess.run(["capinfos", "-M", "-c", str(p)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert f"Number of packets:   {sum(read_devlog(p).records)}" in r.stdout
    r = subprocess.run(["capinfos", "-M", "-c", str(write(tmp_path, build_long(1), "v1.pcapng"))],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "larger than 262144" in r.stderr   # what format 1 did


FORMAT1 = Path(__file__).resolve().parent / "data" / "format1-devices.pcapng"


def test_a_real_format_1_log_reads_as_it_did():
    """A device log the QEMU before qemu-patches/0015's format 2 wrote (the demo guest: boot, two
    rounds of client traffic, a console line, poweroff). The digest is of the events the
    format-1 reader (2c78cf1) gave for it: channel, direction, VM time, icount, offset, data."""
    log = read_devlog(FORMAT1)
    digest = hashlib.sha256()
    for e in log.events:
        digest.update(repr((e.channel, e.direction, e.vm_ns, e.icount, e.file_offset)).encode() + e.data)
    assert log.format == 1 and log.closed_cleanly and len(log.events) == 286
    assert digest.hexdigest() == "f8dd4fddf2d3fc7c5e2838d1f2a6fdb41fb156d0a6ad3943e25ea170a76c6e28"
    assert log.records == [s.count for s in log.stats] == [43, 217, 24, 2]
