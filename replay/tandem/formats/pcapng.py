"""Reader (and a small writer) for the pcapng device log `devices.pcapng`.

See docs/formats.md. Only what tandem writes is supported: one little-endian
section with SHB, IDB, EPB and ISB blocks; any other block type is skipped by
its length. A file that ends mid-block is the normal result of a crash, so
the torn tail is reported (`torn_at`) rather than treated as corruption.

Format 2 keeps every record within what Wireshark and libpcap read (262144
bytes): an event with a longer payload is written as consecutive records, each
but the last marked continued, and this reader joins them back into the one
event format 1 had, so every consumer sees the same events in both formats. A
20 s heavy run of the demo guest wrote 8 disk writes over 256 KiB (up to
3,153,944 bytes); in format 1 capinfos and tshark stopped at the first.
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass, field
from typing import BinaryIO, Callable, Iterator, NamedTuple

from ..errors import BundleError
from . import bundle

SHB, IDB, EPB, ISB = 0x0A0D0D0A, 0x00000001, 0x00000006, 0x00000005
BYTE_ORDER_MAGIC = 0x1A2B3C4D

OPT_END, OPT_COMMENT = 0, 1
IF_NAME, IF_DESCRIPTION, IF_TSRESOL = 2, 3, 9
EPB_FLAGS = 2
ISB_ENDTIME, ISB_IFRECV = 3, 4
OPT_CUSTOM_BIN = 2989  # copyable custom binary option
TANDEM_PEN = 32473     # the PEN of tandem's custom options: 8 value bytes after it are the
                       # icount, 4 are record flags (EPB) or the format number (SHB)
FORMAT = 2             # what tandem's writers write; a file without the SHB option is format 1
SNAPLEN = 262144       # no record is longer: Wireshark's and libpcap's cap for these link types
PIECE = 65536          # data bytes per record of tandem's own link types (serial, block, rng)
REC_CONTINUED, REC_HAS_ICOUNT = 1, 2
# Format 2's record header on tandem's own link types: format, flags, header length, the
# vCPU, icount. It repeats the icount and the continuation mark for a Wireshark dissector,
# which cannot see custom options; the options stay what tandem reads. The vCPU field is
# the index of the vCPU whose access made the event, plus one: 0 where no vCPU did (a
# device's completion in QEMU's main loop or an iothread) and in logs written before it.
_REC_HDR = struct.Struct("<BBHIQ")
_VCPU = struct.Struct("<I")

LINKTYPES = {"net": 1, "serial": 147, "block": 148, "rng": 149, "state": 150}
KIND_OF_LINKTYPE = {v: k for k, v in LINKTYPES.items()}
OWN_LINKTYPES = frozenset((147, 148, 149, 150))  # tandem's payloads, and its record header in format 2
STATE = "state"     # state checkpoints (devlog state-every): Devlog.states, not its events
DIRECTIONS = {1: "in", 2: "out"}

_BLOCK_HDR = struct.Struct("<B7xQQ")
_HDR = struct.Struct("<II")                 # block type, block length
_U32 = struct.Struct("<I")
# An EPB's head: block type and length, interface, timestamp high/low, captured/original length.
_EPB = struct.Struct("<7I")
# The options of every EPB tandem writes (flags, the icount custom option, end), and the
# block's trailing length.
_EPB_OPTS = struct.Struct("<HHIHHIQHHI")
_CHUNK = 1 << 18                            # read size (blocks are parsed in place from it): small
                                            # enough to be reused by malloc, not mmapped afresh


class Interface(NamedTuple):
    id: int
    name: str
    kind: str
    linktype: int
    tsresol: int
    comment: str = ""   # opt_comment: a state interface's register names


class Event(NamedTuple):
    seq: int            # index of the event among the file's events
    iface: int
    channel: str
    kind: str
    direction: str | None  # 'in' | 'out' (None if the flags say neither)
    vm_ns: int
    icount: int | None
    data: bytes
    file_offset: int    # offset of its (first) EPB
    vcpu: int | None = None     # the vCPU whose access made it, where the log says (_REC_HDR)


class IfaceStats(NamedTuple):
    end_vm_ns: int | None
    count: int | None   # type: ignore[assignment]  # pcapng's isb_ name; hides tuple.count, unused on it
    icount: int | None


@dataclass
class Devlog:
    interfaces: list[Interface] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    stats: list[IfaceStats | None] = field(default_factory=list)  # indexed by interface id
    torn_at: int | None = None
    records: list[int] = field(default_factory=list)  # EPBs per interface (what pcapng tools count)
    format: int = 1
    states: list[Event] = field(default_factory=list)   # state checkpoints, in order

    @property
    def closed_cleanly(self) -> bool:
        return bool(self.stats) and all(s is not None for s in self.stats)


def block_record(data: bytes) -> tuple[int, int, int, bytes]:
    """Split a block-channel payload into (op, offset, nbytes, payload)."""
    if len(data) < _BLOCK_HDR.size:
        raise BundleError(f"block record of {len(data)} bytes, shorter than its 24-byte header")
    op, offset, nbytes = _BLOCK_HDR.unpack_from(data)
    return op, offset, nbytes, bytes(data[_BLOCK_HDR.size:])


def _join_block(pieces: list[bytes]) -> bytes:
    """One block request from its pieces, each `op, offset, bytes` of its own and its data:
    the first piece's op and offset, the total length, the data in order."""
    op, start, _ = _BLOCK_HDR.unpack_from(pieces[0])
    end = start
    for piece in pieces:
        if len(piece) < _BLOCK_HDR.size:
            raise ValueError(f"block piece of {len(piece)} bytes, shorter than its header")
        p_op, p_off, p_len = _BLOCK_HDR.unpack_from(piece)
        if p_op != op or p_off != end or p_len != len(piece) - _BLOCK_HDR.size:
            raise ValueError(f"block piece (op {p_op}, offset {p_off}, {p_len} bytes) does not "
                             f"continue the request at offset {start} (op {op}, next offset {end})")
        end += p_len
    return _BLOCK_HDR.pack(op, start, end - start) + b"".join(p[_BLOCK_HDR.size:] for p in pieces)


def _fill(f: BinaryIO, buf: bytes, base: int, offset: int, k: int) -> tuple[bytes, int]:
    """(buf, base) holding at least k bytes of the file from `offset` on, unless the
    file ends first; buf holds the file's bytes from offset `base` on."""
    if len(buf) - (offset - base) >= k:
        return buf, base
    buf = buf[offset - base:]
    while len(buf) < k:
        more = f.read(max(k - len(buf), _CHUNK))
        if not more:
            break
        buf += more
    return buf, offset


def _ts_to_ns(ts: int, tsresol: int) -> int:
    # if_tsresol: MSB clear -> units of 10^-n s, MSB set -> 2^-n s.
    n = tsresol & 0x7F
    if tsresol & 0x80:
        return (ts * 1_000_000_000) >> n
    if n <= 9:
        return ts * int(10 ** (9 - n))
    return ts // int(10 ** (n - 9))


def _options(body: bytes, start: int) -> Iterator[tuple[int, bytes]]:
    """Yield (code, value) of an options list; raises ValueError on overrun."""
    pos = start
    while pos + 4 <= len(body):
        code, length = struct.unpack_from("<HH", body, pos)
        pos += 4
        if code == OPT_END:
            return
        if pos + length > len(body):
            raise ValueError(f"option {code} overruns its block")
        yield code, body[pos:pos + length]
        pos += (length + 3) & ~3


def _icount_option(value: bytes) -> int | None:
    if len(value) >= 12 and struct.unpack_from("<I", value)[0] == TANDEM_PEN:
        icount: int = struct.unpack_from("<Q", value, 4)[0]
        return icount
    return None


def _flags_option(value: bytes) -> int | None:
    """A tandem custom option with a 4-byte value: record flags (EPB), format (SHB)."""
    if len(value) == 8 and struct.unpack_from("<I", value)[0] == TANDEM_PEN:
        flags: int = struct.unpack_from("<I", value, 4)[0]
        return flags
    return None


class _Pieces:
    """The records so far of an event continued in the next record."""
    __slots__ = ("iface", "direction", "vm_ns", "icount", "offset", "parts", "vcpu")

    def __init__(self, iface: int, direction: str | None, vm_ns: int, icount: int | None,
                 offset: int, vcpu: int | None):
        self.iface, self.direction, self.vm_ns, self.icount = iface, direction, vm_ns, icount
        self.offset, self.vcpu = offset, vcpu
        self.parts: list[bytes] = []


class DevlogReader:
    """Iterate the events of a device log; `interfaces`, `stats` and `torn_at`
    fill in as the file is read (complete once iteration is exhausted)."""

    def __init__(self, path: str | os.PathLike[str], *, allow_torn: bool = True,
                 follow: Callable[[], bool] | None = None):
        """follow: for a log still being written (a live native): while it returns
        True, the end of the file is waited on instead of ending the iteration."""
        self.path = os.fspath(path)
        self.allow_torn = allow_torn
        self.follow = follow
        self.interfaces: list[Interface] = []
        self.stats: list[IfaceStats | None] = []
        self.torn_at: int | None = None
        self.clock_ns = 0       # the latest clock mark read
        self.format = 1         # until the SHB says otherwise
        self.records: list[int] = []    # EPBs per interface
        self.states: list[Event] = []   # the state checkpoints read (not yielded as events)
        self._hdr_len: list[int] = []   # per interface: record header bytes before the payload

    def _fail(self, what: str, offset: int) -> BundleError:
        return BundleError(f"{self.path}: {what} at offset {offset}")

    def _more(self, f: BinaryIO) -> int | None:
        """Following a live log: wait for it to grow; its new size. Once the writer is
        done, its final size, once, then None: what it wrote while follow() was asked (a
        follower may wait there for a long while, and the writer may finish meanwhile)
        is read before the log is taken as finished."""
        if self.follow is None:
            return None
        if not self.follow():
            self.follow = None
            return os.fstat(f.fileno()).st_size
        time.sleep(0.02)
        return os.fstat(f.fileno()).st_size

    def _torn(self, offset: int) -> None:
        if not self.allow_torn:
            raise self._fail("torn (incomplete) block", offset)
        self.torn_at = offset

    def __iter__(self) -> Iterator[Event]:
        """The events; the state checkpoints go to `states` (an event's seq counts the
        events alone)."""
        return self._read()

    def _first_block(self, f: BinaryIO, buf: bytes, base: int, offset: int, btype: int) -> tuple[bytes, int] | None:
        """The first block is an SHB whose byte-order magic is checked before its length is
        trusted (a swapped one would be garbage): the buffer filled that far, or None if
        the file ends there."""
        if btype != SHB:
            raise self._fail("bad SHB magic (not a pcapng file)", offset)
        buf, base = _fill(f, buf, base, offset, 12)
        if len(buf) - (offset - base) < 12:
            return None
        order = _U32.unpack_from(buf, offset - base + 8)[0]
        if order == 0x4D3C2B1A:
            raise self._fail("big-endian pcapng section (unsupported)", offset)
        if order != BYTE_ORDER_MAGIC:
            raise self._fail("bad SHB byte-order magic", offset)
        return buf, base

    def _read(self) -> Iterator[Event]:
        """Blocks are parsed in place from a large read buffer with struct.unpack_from.
        A whole EPB in the layout tandem's writers produce (flags + icount options, not
        continued) takes the fast path below; anything else (first block, IDB, ISB, other
        option layouts, the pieces of a long event, errors, a torn tail) goes through the
        general path, which reads the file block by block as a stream would."""
        with bundle.open_path(self.path, buffering=0) as f:   # no link, FIFO or directory
            size = os.fstat(f.fileno()).st_size
            buf, base = b"", 0          # buf holds the file's bytes from offset `base` on
            offset, seq, seen_shb = 0, 0, False
            pieces: _Pieces | None = None   # an event continued in the next record
            ifaces, records, hdr_len, states = self.interfaces, self.records, self._hdr_len, self.states
            ns_resol: list[bool] = []   # per interface: timestamps already in ns
            hdr, u32, epb_head, epb_opts = _HDR.unpack_from, _U32.unpack_from, _EPB.unpack_from, _EPB_OPTS.unpack_from
            vcpu = _VCPU.unpack_from
            new_event = tuple.__new__

            while True:
                i = offset - base
                if i + 28 <= len(buf) and pieces is None:
                    btype, blen, iface_id, ts_hi, ts_lo, caplen, _origlen = epb_head(buf, i)
                    end = i + blen
                    o = i + 28 + ((caplen + 3) & ~3)
                    # Fast path: an EPB fully in the buffer, with tandem's option layout.
                    if (btype == EPB and o + 32 == end and end <= len(buf) and seen_shb
                            and offset + blen <= size and iface_id < len(ifaces)):
                        c1, l1, flags, c2, l2, pen, icount, c3, l3, trailer = epb_opts(buf, o)
                        h = hdr_len[iface_id]
                        if (c1 == EPB_FLAGS and l1 == 4 and c2 == OPT_CUSTOM_BIN and l2 == 12
                                and pen == TANDEM_PEN and c3 == OPT_END and l3 == 0 and trailer == blen
                                and (not h or (caplen >= h and buf[i + 28] == FORMAT
                                               and buf[i + 30] == h and not buf[i + 31]
                                               and not buf[i + 29] & REC_CONTINUED))):
                            iface = ifaces[iface_id]
                            ts = (ts_hi << 32) | ts_lo
                            ev = new_event(Event, (
                                seq, iface_id, iface.name, iface.kind, DIRECTIONS.get(flags & 3),
                                ts if ns_resol[iface_id] else _ts_to_ns(ts, iface.tsresol),
                                icount, buf[i + 28 + h:i + 28 + caplen], offset,
                                (v - 1 if h and (v := vcpu(buf, i + 32)[0]) else None)))
                            if iface.kind == STATE:
                                states.append(ev)
                            else:
                                yield ev
                                seq += 1
                            records[iface_id] += 1
                            offset += blen
                            continue
                # General path: the block at `offset`, checked as the format says.
                torn_here = offset if pieces is None else pieces.offset
                buf, base = _fill(f, buf, base, offset, 8)
                got = min(len(buf) - (offset - base), 8)
                if got < 8 and (grown := self._more(f)) is not None:
                    size = grown
                    continue
                if got == 0:
                    if not seen_shb:
                        self._torn(0)  # empty file: the writer died before its first block
                    elif pieces is not None:
                        self._torn(torn_here)  # the writer died between an event's records
                    return
                if got < 8:
                    return self._torn(torn_here)
                i = offset - base
                btype, blen = hdr(buf, i)
                if not seen_shb:
                    if (filled := self._first_block(f, buf, base, offset, btype)) is None:
                        return self._torn(offset)
                    buf, base = filled
                elif btype == SHB:
                    raise self._fail("second section header (tandem writes one section)", offset)
                if blen < 12 or blen % 4:
                    raise self._fail(f"bad block length {blen}", offset)
                if offset + blen > size:  # checked first: a garbage length must not drive a huge read
                    if (grown := self._more(f)) is not None:
                        size = grown
                        continue
                    return self._torn(torn_here)
                buf, base = _fill(f, buf, base, offset, blen)
                if len(buf) - (offset - base) < blen:  # file shrank since we looked
                    return self._torn(torn_here)
                i = offset - base
                if u32(buf, i + blen - 4)[0] != blen:
                    raise self._fail("trailing block length does not match", offset)
                if pieces is not None and btype != EPB:
                    raise self._fail(f"the event continued from offset {pieces.offset} is cut "
                                     f"by a block of type {btype:#x}", offset)
                body = buf[i + 8:i + blen - 4]
                try:
                    if btype == SHB:
                        seen_shb = True
                        self._shb(body)
                    elif btype == IDB:
                        self._idb(body)
                        ns_resol.append(self.interfaces[-1].tsresol == 9)
                    elif btype == EPB:
                        ev, continued = self._epb(body, seq, offset)
                        records[ev.iface] += 1
                        if pieces is not None:
                            if (ev.iface, ev.vm_ns) != (pieces.iface, pieces.vm_ns):
                                raise ValueError(f"the event continued from offset {pieces.offset} "
                                                 f"is cut by another event (channel {ev.channel})")
                            pieces.parts.append(ev.data)
                        elif continued:
                            pieces = _Pieces(ev.iface, ev.direction, ev.vm_ns, ev.icount, offset, ev.vcpu)
                            pieces.parts.append(ev.data)
                        if not continued:
                            if pieces is not None:
                                ev = self._joined(pieces, seq)
                                pieces = None
                            if ev.kind == STATE:
                                states.append(ev)
                            else:
                                seq += 1
                                yield ev
                    elif btype == ISB:
                        self._isb(body, offset)
                except (ValueError, struct.error) as e:
                    raise self._fail(str(e), offset) from None
                offset += blen

    def _shb(self, body: bytes) -> None:
        for code, value in _options(body, 16):
            if code == OPT_CUSTOM_BIN and (fmt := _flags_option(value)) is not None:
                if fmt > FORMAT:
                    raise ValueError(f"device log format {fmt}, newer than this tandem reads ({FORMAT})")
                self.format = fmt

    def _joined(self, p: _Pieces, seq: int) -> Event:
        iface = self.interfaces[p.iface]
        data = _join_block(p.parts) if iface.linktype == LINKTYPES["block"] else b"".join(p.parts)
        return Event(seq, p.iface, iface.name, iface.kind, p.direction, p.vm_ns, p.icount, data, p.offset, p.vcpu)

    def _idb(self, body: bytes) -> None:
        linktype, _snaplen = struct.unpack_from("<H2xI", body)
        name, kind, tsresol, comment = f"if{len(self.interfaces)}", None, 6, ""  # pcapng default: us
        for code, value in _options(body, 8):
            if code == IF_NAME:
                name = value.decode("utf-8", "replace")
            elif code == IF_DESCRIPTION:
                kind = value.decode("utf-8", "replace")
            elif code == IF_TSRESOL and value:
                tsresol = value[0]
            elif code == OPT_COMMENT:
                comment = value.decode("utf-8", "replace")
        kind = kind or KIND_OF_LINKTYPE.get(linktype, "unknown")
        if (kind == STATE) != (linktype == LINKTYPES[STATE]):
            raise ValueError(f"interface {name!r}: kind {kind!r} with link type {linktype}")
        self.interfaces.append(Interface(len(self.interfaces), name, kind, linktype, tsresol, comment))
        self.stats.append(None)
        self.records.append(0)
        self._hdr_len.append(_REC_HDR.size if self.format >= 2 and linktype in OWN_LINKTYPES else 0)

    def _iface(self, iface_id: int) -> Interface:
        if iface_id >= len(self.interfaces):
            raise ValueError(f"unknown interface {iface_id}")
        return self.interfaces[iface_id]

    def _epb(self, body: bytes, seq: int, offset: int) -> tuple[Event, bool]:
        """The record's event (its piece, if continued) and whether the next record continues it."""
        iface_id, ts_hi, ts_lo, caplen, _origlen = struct.unpack_from("<5I", body)
        iface = self._iface(iface_id)
        if 20 + caplen > len(body):
            raise ValueError(f"captured length {caplen} overruns its block")
        data = body[20:20 + caplen]
        direction, icount, flags = None, None, 0
        for code, value in _options(body, 20 + ((caplen + 3) & ~3)):
            if code == EPB_FLAGS and len(value) >= 4:
                direction = DIRECTIONS.get(struct.unpack_from("<I", value)[0] & 3)
            elif code == OPT_CUSTOM_BIN:
                icount = _icount_option(value) if icount is None else icount
                flags |= _flags_option(value) or 0
        continued = bool(flags & REC_CONTINUED)
        vcpu = None
        if h := self._hdr_len[iface_id]:
            if caplen < h:
                raise ValueError(f"record of {caplen} bytes, shorter than its {h}-byte header")
            fmt, hflags, hlen, vcpu_field, _ = _REC_HDR.unpack_from(data)
            vcpu = vcpu_field - 1 if vcpu_field else None
            if fmt != FORMAT or hlen != h:
                raise ValueError(f"record header says format {fmt}, {hlen} bytes (want {FORMAT}, {h})")
            if bool(hflags & REC_CONTINUED) != continued:
                raise ValueError("record header and options disagree on whether the event continues")
            data = data[h:]
        vm_ns = _ts_to_ns((ts_hi << 32) | ts_lo, iface.tsresol)
        return Event(seq, iface_id, iface.name, iface.kind, direction, vm_ns, icount, data, offset, vcpu), continued

    def _isb(self, body: bytes, offset: int) -> None:
        iface_id, ts_hi, ts_lo = struct.unpack_from("<3I", body)
        iface = self._iface(iface_id)
        end, count, icount = None, None, None
        for code, value in _options(body, 12):
            if code == ISB_ENDTIME and len(value) >= 8:
                hi, lo = struct.unpack_from("<II", value)
                end = _ts_to_ns((hi << 32) | lo, iface.tsresol)
            elif code == ISB_IFRECV and len(value) >= 8:
                count = struct.unpack_from("<Q", value)[0]
            elif code == OPT_CUSTOM_BIN:
                icount = _icount_option(value)
        if end is None:
            # A clock mark (devlog clock-marks=on): the VM clock when QEMU wrote it;
            # every event before it in time, but a serial output run still being
            # coalesced, is in the log before it. Not a close.
            self.clock_ns = max(self.clock_ns, _ts_to_ns((ts_hi << 32) | ts_lo, iface.tsresol))
            return
        self.stats[iface_id] = IfaceStats(end, count, icount)


def iter_events(path: str | os.PathLike[str], *, allow_torn: bool = True) -> Iterator[Event]:
    """Stream the events of a (possibly huge) device log."""
    return iter(DevlogReader(path, allow_torn=allow_torn))


def console(path: str | os.PathLike[str]) -> bytes:
    """Everything the guest wrote to its serial console, in order: what its kernel printed
    (module sections, its banner) for the readers that place its code."""
    return b"".join(e.data for e in iter_events(path) if e.kind == "serial" and e.direction == "out")


def read_devlog(path: str | os.PathLike[str], *, allow_torn: bool = True) -> Devlog:
    reader = DevlogReader(path, allow_torn=allow_torn)
    events = list(reader)
    return Devlog(reader.interfaces, events, reader.stats, reader.torn_at, reader.records, reader.format,
                  reader.states)


# --- writer (tests and tools; the real writer is the QEMU devlog object) ---

def _opt(code: int, value: bytes) -> bytes:
    return struct.pack("<HH", code, len(value)) + value + b"\0" * (-len(value) % 4)


def _opts(*opts: bytes) -> bytes:
    return b"".join(opts) + struct.pack("<HH", OPT_END, 0)


def _block(btype: int, body: bytes) -> bytes:
    body += b"\0" * (-len(body) % 4)
    n = len(body) + 12
    return struct.pack("<II", btype, n) + body + struct.pack("<I", n)


def _icount_opt(icount: int) -> bytes:
    return _opt(OPT_CUSTOM_BIN, struct.pack("<IQ", TANDEM_PEN, icount))


class PcapngWriter:
    """Writes the layout of docs/formats.md to a path or binary file object: format 2 by
    default, as the QEMU devlog does (long events split into continued records), or
    format 1 (`format=1`), as older bundles have it."""

    def __init__(self, out: str | os.PathLike[str] | BinaryIO, *, format: int = FORMAT):
        self._own = isinstance(out, str | os.PathLike)
        self.f: BinaryIO = open(out, "wb") if isinstance(out, str | os.PathLike) else out
        self.format = format
        self.counts: list[int] = []         # records per interface
        self._linktypes: list[int] = []
        fmt = [_opt(OPT_CUSTOM_BIN, struct.pack("<II", TANDEM_PEN, format))] if format >= 2 else []
        self.f.write(_block(SHB, struct.pack("<IHHq", BYTE_ORDER_MAGIC, 1, 0, -1)
                            + _opts(_opt(4, b"tandem"), *fmt)))

    def add_interface(self, name: str, kind: str, linktype: int | None = None, comment: str = "") -> int:
        linktype = LINKTYPES[kind] if linktype is None else linktype
        snaplen = SNAPLEN if self.format >= 2 else 0
        self.f.write(_block(IDB, struct.pack("<HHI", linktype, 0, snaplen) + _opts(
            _opt(IF_NAME, name.encode()), _opt(IF_DESCRIPTION, kind.encode()),
            _opt(IF_TSRESOL, bytes([9])), *([_opt(OPT_COMMENT, comment.encode())] if comment else []))))
        self.counts.append(0)
        self._linktypes.append(linktype)
        return len(self.counts) - 1

    def _pieces(self, iface: int, data: bytes) -> list[bytes]:
        """The payloads of the records an event is written as (format 2 splits)."""
        linktype = self._linktypes[iface]
        if self.format < 2:
            return [data]
        if linktype not in OWN_LINKTYPES:
            return [data[k:k + SNAPLEN] for k in range(0, len(data), SNAPLEN)] or [b""]
        if linktype != LINKTYPES["block"]:
            return [data[k:k + PIECE] for k in range(0, len(data), PIECE)] or [b""]
        op, offset, nbytes, payload = block_record(data)
        if not payload:     # flush, discard, write-zeroes: no data, one record
            return [data[:_BLOCK_HDR.size]]
        return [_BLOCK_HDR.pack(op, offset + k, len(payload[k:k + PIECE])) + payload[k:k + PIECE]
                for k in range(0, len(payload), PIECE)]

    def event(self, iface: int, direction: str, vm_ns: int, data: bytes,
              icount: int | None = None, vcpu: int | None = None) -> None:
        flags = {"in": 1, "out": 2}[direction]
        pieces = self._pieces(iface, data)
        for n, piece in enumerate(pieces):
            continued = n + 1 < len(pieces)
            opts = [_opt(EPB_FLAGS, struct.pack("<I", flags))]
            if icount is not None:
                opts.append(_icount_opt(icount))
            if continued:
                opts.append(_opt(OPT_CUSTOM_BIN, struct.pack("<II", TANDEM_PEN, REC_CONTINUED)))
            if self.format >= 2 and self._linktypes[iface] in OWN_LINKTYPES:
                rflags = (REC_CONTINUED if continued else 0) | (REC_HAS_ICOUNT if icount is not None else 0)
                piece = _REC_HDR.pack(self.format, rflags, _REC_HDR.size, 0 if vcpu is None else vcpu + 1,
                                      icount or 0) + piece
            body = struct.pack("<5I", iface, vm_ns >> 32, vm_ns & 0xFFFFFFFF, len(piece), len(piece))
            body += piece + b"\0" * (-len(piece) % 4) + _opts(*opts)
            self.f.write(_block(EPB, body))
            self.counts[iface] += 1

    def stats(self, iface: int, end_vm_ns: int, count: int | None = None,
              icount: int | None = None) -> None:
        count = self.counts[iface] if count is None else count
        opts = [_opt(ISB_ENDTIME, struct.pack("<II", end_vm_ns >> 32, end_vm_ns & 0xFFFFFFFF)),
                _opt(ISB_IFRECV, struct.pack("<Q", count))]
        if icount is not None:
            opts.append(_icount_opt(icount))
        body = struct.pack("<3I", iface, end_vm_ns >> 32, end_vm_ns & 0xFFFFFFFF) + _opts(*opts)
        self.f.write(_block(ISB, body))

    def clock_mark(self, vm_ns: int, icount: int | None = None) -> None:
        """A clock mark: an ISB of interface 0 without isb_endtime (docs/formats.md)."""
        opts = [_icount_opt(icount)] if icount is not None else []
        self.f.write(_block(ISB, struct.pack("<3I", 0, vm_ns >> 32, vm_ns & 0xFFFFFFFF) + _opts(*opts)))

    def close(self, end_vm_ns: int | None = None, icount: int | None = None) -> None:
        """With end_vm_ns, close cleanly (one ISB per interface); without, just stop."""
        if end_vm_ns is not None:
            for i in range(len(self.counts)):
                self.stats(i, end_vm_ns, icount=icount)
        self.f.flush()
        if self._own:
            self.f.close()
