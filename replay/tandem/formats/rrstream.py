"""Reader/validator (and a test writer) for the segmented replay stream `replay.tdrs`.

See docs/formats.md. Each segment carries its own header CRC and payload CRC, so
a crash leaves an intact prefix plus at most one incomplete segment at the end
(the torn tail). Damage anywhere else is corruption and raises BundleError.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import struct
import time
import zlib
from dataclasses import dataclass, field
from typing import BinaryIO, Iterator, NamedTuple

import zstandard

from .. import private
from ..errors import BundleError
from . import bundle

FILE_MAGIC = b"TDMRRLG1"
SEG_MAGIC = b"SEG1"
FILE_HDR = struct.Struct("<8sII")
SEG_HDR = struct.Struct("<4sIIIIIQQII")
FLAG_END, FLAG_ZSTD = 1, 2
DEFAULT_REPLAY_VERSION = 0xE0200F   # qemu-patches/0003 added a checkpoint kind, 0030 an async event kind, 0038 EVENT_CPU
# The largest raw payload a segment may declare. QEMU's writer (qemu-patches/0012) ends a
# segment once it holds FLUSH_BYTES = 256 KiB, so a segment is 256 KiB plus one event; the
# bound leaves 256 times that. A bundle is input from outside: the declared size is
# checked before anything is allocated, and decompression stops at it (a 32 KiB zstd
# frame may say 1 GiB in its own header).
MAX_RAW = 64 << 20
DECOMPRESS_CHUNK = 1 << 20


class Segment(NamedTuple):
    seq: int
    flags: int
    stored: int
    raw: int
    icount: int
    offset: int       # of the segment header
    realtime_ns: int
    crc: int

    @property
    def end(self) -> bool:
        return bool(self.flags & FLAG_END)


@dataclass
class StreamInfo:
    version: int | None = None
    segments: list[Segment] = field(default_factory=list)
    finished: bool = False
    torn_at: int | None = None

    @property
    def raw_bytes(self) -> int:
        return sum(s.raw for s in self.segments)

    @property
    def stored_bytes(self) -> int:
        return sum(s.stored for s in self.segments)

    @property
    def last_icount(self) -> int | None:
        return self.segments[-1].icount if self.segments else None


def _corrupt(path: str, seq: int, offset: int, why: str) -> BundleError:
    return BundleError(f"{path}: corrupt segment {seq} at offset {offset}: {why}")


def _zeros_to_eof(f: BinaryIO) -> bool:
    while chunk := f.read(1 << 20):
        if chunk.strip(b"\0"):
            return False
    return True


def _walk(path: str | os.PathLike[str], info: StreamInfo) -> Iterator[tuple[Segment, bytes]]:
    """Yield (segment, stored payload) of each intact segment, filling `info`."""
    path = os.fspath(path)
    with bundle.open_path(path, buffering=1 << 20) as f:    # no link, FIFO or directory
        size = os.fstat(f.fileno()).st_size
        head = f.read(FILE_HDR.size)
        if len(head) < FILE_HDR.size and FILE_MAGIC.startswith(head[:8]):
            info.torn_at = 0  # died while writing the file header
            return
        magic, version, _flags = FILE_HDR.unpack(head) if len(head) == 16 else (head, 0, 0)
        if magic != FILE_MAGIC:
            raise BundleError(f"{path}: bad file magic (not a tandem replay stream) at offset 0")
        info.version = version
        offset, seq = FILE_HDR.size, 0
        while offset < size:
            raw_hdr = f.read(SEG_HDR.size)
            # An incomplete header, or a zero-filled tail (what a host crash can
            # leave after the file size was updated but not the data), is torn.
            if len(raw_hdr) < SEG_HDR.size or not raw_hdr.strip(b"\0") and _zeros_to_eof(f):
                info.torn_at = offset
                return
            (magic, hseq, flags, stored, raw, crc, icount, rt, _res,
             hcrc) = SEG_HDR.unpack(raw_hdr)
            if magic != SEG_MAGIC:
                raise _corrupt(path, seq, offset, "bad segment magic")
            if zlib.crc32(raw_hdr[:44]) != hcrc:
                raise _corrupt(path, seq, offset, "header CRC mismatch")
            if info.finished:
                raise _corrupt(path, hseq, offset, "segment after END")
            if hseq != seq:
                raise _corrupt(path, seq, offset, f"sequence gap (found segment {hseq})")
            if flags & ~(FLAG_END | FLAG_ZSTD):
                raise _corrupt(path, seq, offset, f"unknown flags {flags:#x}")
            if raw > MAX_RAW:
                raise _corrupt(path, seq, offset, f"raw length {raw} over the {MAX_RAW}-byte bound")
            if not flags & FLAG_ZSTD and stored != raw:
                raise _corrupt(path, seq, offset, f"uncompressed but stored {stored} != raw {raw}")
            if offset + SEG_HDR.size + stored > size:
                info.torn_at = offset  # header made it to disk, payload did not
                return
            payload = f.read(stored)
            if zlib.crc32(payload) != crc:
                raise _corrupt(path, seq, offset, "payload CRC mismatch")
            seg = Segment(seq, flags, stored, raw, icount, offset, rt, crc)
            info.segments.append(seg)
            info.finished = seg.end
            yield seg, payload
            offset += SEG_HDR.size + stored
            seq += 1


def scan(path: str | os.PathLike[str]) -> StreamInfo:
    """Validate the whole stream (CRCs, sequence) without decompressing."""
    info = StreamInfo()
    for _ in _walk(path, info):
        pass
    return info


def iter_raw(path: str | os.PathLike[str], info: StreamInfo | None = None) -> Iterator[bytes]:
    """Yield the decompressed payload of each intact segment in order."""
    info = StreamInfo() if info is None else info
    dctx = zstandard.ZstdDecompressor()
    for seg, payload in _walk(path, info):
        if seg.flags & FLAG_ZSTD:
            try:
                payload = _decompress(dctx, payload, seg.raw)
            except zstandard.ZstdError as e:
                raise _corrupt(os.fspath(path), seg.seq, seg.offset, f"zstd: {e}") from None
        if len(payload) != seg.raw:
            raise _corrupt(os.fspath(path), seg.seq, seg.offset,
                           f"raw length {len(payload)}, header says {seg.raw}")
        yield payload


def _decompress(dctx: zstandard.ZstdDecompressor, payload: bytes, raw: int) -> bytes:
    """At most raw + 1 bytes of the frames in `payload`: enough to tell that they hold more
    than the header's `raw`, never more. A streaming reader, because
    ZstdDecompressor.decompress(max_output_size=) allocates whatever content size the frame
    header claims (1 GiB measured), and decompressobj has no bound at all."""
    reader = dctx.stream_reader(payload, read_across_frames=True)
    out = bytearray()
    while len(out) <= raw:
        chunk = reader.read(min(raw + 1 - len(out), DECOMPRESS_CHUNK))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def _atomic_write(out_path: str | os.PathLike[str], chunks: Iterator[bytes]) -> None:
    tmp = f"{os.fspath(out_path)}.tmp"
    with open(tmp, "wb", opener=private.opener) as out:
        for chunk in chunks:
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, out_path)


def write_intact_prefix(path: str | os.PathLike[str], out_path: str | os.PathLike[str]) -> StreamInfo:
    """Copy the file header and the intact segments verbatim (drops a torn tail).

    For --partial replay of a torn log; the copy then has no END segment. A
    finished log is copied whole.
    """
    info = StreamInfo()

    def chunks() -> Iterator[bytes]:
        segments = _walk(path, info)
        first = next(segments, None)  # validates the file header
        if info.version is None:
            return  # torn inside the file header: nothing intact
        with bundle.open_path(path) as f:
            yield f.read(FILE_HDR.size)
            for seg, payload in itertools.chain([first] if first else [], segments):
                f.seek(seg.offset)
                yield f.read(SEG_HDR.size) + payload

    _atomic_write(out_path, chunks())
    return info


def to_stock(path: str | os.PathLike[str], out_path: str | os.PathLike[str]) -> StreamInfo:
    """Write a stock QEMU replay log (12-byte header + raw events) for size comparison."""
    info = StreamInfo()

    def chunks() -> Iterator[bytes]:
        raws = iter_raw(path, info)
        first = next(raws, None)  # reads the file header, so info.version is known
        yield struct.pack(">IQ", info.version or 0, 0)
        if first is not None:
            yield first
            yield from raws

    _atomic_write(out_path, chunks())
    return info


def is_being_written(path: str | os.PathLike[str]) -> bool:
    """True if a writer holds its exclusive flock (an unfinished log is live, not torn)."""
    with bundle.open_path(path) as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return False


class StreamWriter:
    """Writes the docs/formats.md layout (tests and tools; QEMU has its own writer)."""

    def __init__(self, out: str | os.PathLike[str] | BinaryIO, *,
                 version: int = DEFAULT_REPLAY_VERSION, compress: bool = False, level: int = 3):
        self._own = isinstance(out, str | os.PathLike)
        self.f: BinaryIO = open(out, "wb") if isinstance(out, str | os.PathLike) else out
        self.seq = 0
        self.cctx = zstandard.ZstdCompressor(level=level) if compress else None
        self.f.write(FILE_HDR.pack(FILE_MAGIC, version, 0))

    def segment(self, raw: bytes, icount: int, *, end: bool = False) -> None:
        flags = FLAG_END if end else 0
        stored = raw
        if self.cctx is not None:
            stored, flags = self.cctx.compress(raw), flags | FLAG_ZSTD
        hdr = SEG_HDR.pack(SEG_MAGIC, self.seq, flags, len(stored), len(raw),
                           zlib.crc32(stored), icount, time.time_ns(), 0, 0)[:44]
        self.f.write(hdr + struct.pack("<I", zlib.crc32(hdr)) + stored)
        self.seq += 1

    def close(self, icount: int | None = None, raw: bytes = b"") -> None:
        """With icount, finish the log with an END segment; without, just stop (torn/unfinished)."""
        if icount is not None:
            self.segment(raw, icount, end=True)
        self.f.flush()
        if self._own:
            self.f.close()
