#!/usr/bin/env python3
"""Fuzz target of the replay stream reader: no replay.tdrs in a bundle can make
it raise anything but BundleError, nor decompress more than a segment declares.

One input is a replay stream's bytes, written to a scratch file (the reader takes a path):
scan() (headers and CRCs) and iter_raw() (zstd payloads, bounded by the declared raw
length), which must agree on the segments; each input is read as it is and again with its
segments' CRCs repaired (random mutation alone stops at the first changed CRC).
Run by `./tandem bench fuzz [--only rrstream]` (bench/fuzz.py), or:

    python tests/fuzz/rrstream_target.py -max_total_time=60 WORKDIR tests/fuzz/rrstream-corpus
    python tests/fuzz/rrstream_target.py --make-seeds      (how seed-* were made)
"""
from __future__ import annotations

import io
import sys
import zlib
from pathlib import Path

if __name__ == "__main__":     # run by hand or by bench/fuzz.py: tandem from this checkout
    sys.path.append(str(Path(__file__).resolve().parents[2] / "replay"))
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import fuzzing  # noqa: E402

INSTRUMENT = ("tandem.formats.rrstream",)


def with_crcs(data: bytes) -> bytes:
    """`data` with every segment's payload and header CRC made right (segments found by
    their stored lengths, whatever their magic): random mutation changes a CRC-checked
    byte in nearly every input, and the reader stops there; with the CRCs repaired the
    mutations reach the sequence, flag, length and zstd checks behind them."""
    from tandem.formats import rrstream
    out = bytearray(data)
    offset = rrstream.FILE_HDR.size
    while offset + rrstream.SEG_HDR.size <= len(out):
        stored = int.from_bytes(out[offset + 12:offset + 16], "little")
        payload = out[offset + rrstream.SEG_HDR.size:offset + rrstream.SEG_HDR.size + stored]
        out[offset + 20:offset + 24] = zlib.crc32(payload).to_bytes(4, "little")
        out[offset + 44:offset + 48] = zlib.crc32(out[offset:offset + 44]).to_bytes(4, "little")
        offset += rrstream.SEG_HDR.size + stored
    return bytes(out)


def check(data: bytes) -> None:
    """check_as_is() of `data` and of `data` with its CRCs repaired."""
    check_as_is(data)
    repaired = with_crcs(data)
    if repaired != data:
        check_as_is(repaired)


def check_as_is(data: bytes) -> None:
    """scan() and iter_raw() of `data`: BundleError or the same segments, raw lengths as declared."""
    from tandem.formats import rrstream
    from tandem.errors import BundleError
    path = fuzzing.scratch_file(data)
    try:
        info = rrstream.scan(path)
    except BundleError as e:
        assert "\n" not in str(e), "a BundleError of several lines"
        info = None
    got = rrstream.StreamInfo()
    try:
        raws = [len(raw) for raw in rrstream.iter_raw(path, got)]
    except BundleError as e:
        assert "\n" not in str(e), "a BundleError of several lines"
        return
    assert info is not None, "iter_raw read a stream that scan refused"
    assert raws == [s.raw for s in got.segments] and got.segments == info.segments, \
        "iter_raw and scan disagree on the segments"


def streams() -> dict[str, bytes]:
    from tandem.formats import rrstream
    out = {}
    for compress in (False, True):
        for finish in (True, False):
            buf = io.BytesIO()
            w = rrstream.StreamWriter(buf, compress=compress)
            for i in range(3):
                w.segment(bytes([i]) * (50 + 40 * i) + b"event-%d" % i, icount=1_000 * (i + 1))
            w.close(icount=9_999 if finish else None, raw=b"end" if finish else b"")
            out[f"{'zstd' if compress else 'raw'}-{'finished' if finish else 'open'}"] = buf.getvalue()
    out["torn"] = out["zstd-finished"][:-5]
    return out


TARGET = fuzzing.Target("rrstream", check, INSTRUMENT,
                        "a replay stream, as is and with its CRCs repaired: scanned, then every segment decompressed",
                        max_len=1 << 16, tokens=(b"TDMRRLG1", b"SEG1", b"\x28\xb5\x2f\xfd", b"\xff\xff\xff\x7f"))


def make_seeds() -> int:
    TARGET.corpus.mkdir(exist_ok=True)
    seeds = streams()
    for name, data in seeds.items():
        (TARGET.corpus / f"seed-{name}").write_bytes(data)
    print(f"{len(seeds)} seeds in {TARGET.corpus}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--make-seeds"]:
        sys.exit(make_seeds())
    fuzzing.main(sys.argv, check, INSTRUMENT)
