#!/usr/bin/env python3
"""Fuzz target of the device-log reader, pcapng: no file in a bundle can make it
raise anything but BundleError.

One input is a device log's bytes, written to a scratch file (the reader takes a path):
read whole with read_devlog(), torn tails allowed and refused: 3.7 M mutated inputs over
pcapng and the replay stream raise nothing else, and this keeps it so. Run by `./tandem bench fuzz [--only pcapng]` (bench/fuzz.py), or by hand:

    python tests/fuzz/pcapng_target.py -max_total_time=60 WORKDIR tests/fuzz/pcapng-corpus
    python tests/fuzz/pcapng_target.py --make-seeds      (how seed-* were made)
"""
from __future__ import annotations

import io
import sys
from pathlib import Path

if __name__ == "__main__":     # run by hand or by bench/fuzz.py: tandem from this checkout
    sys.path.append(str(Path(__file__).resolve().parents[2] / "replay"))
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import fuzzing  # noqa: E402

INSTRUMENT = ("tandem.formats.pcapng",)


def check(data: bytes) -> None:
    """Read `data` as a device log, torn tail allowed and not; raises what is not BundleError."""
    from tandem.formats import pcapng
    from tandem.errors import BundleError
    path = fuzzing.scratch_file(data)
    for allow_torn in (True, False):
        try:
            log = pcapng.read_devlog(path, allow_torn=allow_torn)
        except BundleError as e:
            assert "\n" not in str(e), "a BundleError of several lines"
            continue
        assert allow_torn or log.torn_at is None, "torn_at set with allow_torn=False"
        assert len(log.stats) == len(log.interfaces), "stats and interfaces differ in number"


def logs() -> dict[str, bytes]:
    """Device logs as tandem writes them: every kind of interface, events cut in pieces,
    icounts, clock marks, closed cleanly or torn, both formats."""
    from tandem.formats import pcapng
    out = {}
    for fmt in (1, 2):
        for closed in (True, False):
            buf = io.BytesIO()
            w = pcapng.PcapngWriter(buf, format=fmt)
            ifs = {kind: w.add_interface(f"{kind}0", kind) for kind in pcapng.LINKTYPES}
            w.event(ifs["serial"], "out", 1_000, b"login: ", icount=5_000)
            w.clock_mark(2_000, icount=9_000)
            w.event(ifs["net"], "in", 3_000, bytes(range(60)) * 3)
            w.event(ifs["block"], "out", 4_000, bytes(16) + b"x" * 100, icount=12_000)
            w.event(ifs["rng"], "in", 5_000, b"\x01\x02\x03\x04")
            if fmt == 2 and closed:     # one event over PIECE: cut in records (66 KiB)
                w.event(ifs["serial"], "in", 6_000, b"k" * (pcapng.PIECE + 100))
            w.close(7_000 if closed else None, icount=20_000 if closed else None)
            out[f"format{fmt}-{'closed' if closed else 'open'}"] = buf.getvalue()
    out["torn"] = out["format2-open"][:-7]
    return out


TARGET = fuzzing.Target("pcapng", check, INSTRUMENT, "a device log: read whole, torn tail allowed and not",
                        max_len=1 << 17, tokens=(b"\x0a\x0d\x0d\x0a", b"\x4d\x3c\x2b\x1a", b"\x01\x00\x00\x00",
                                                 b"\x06\x00\x00\x00", b"\x05\x00\x00\x00", b"\xff\xff\xff\xff"))


def make_seeds() -> int:
    TARGET.corpus.mkdir(exist_ok=True)
    seeds = logs()
    for name, data in seeds.items():
        (TARGET.corpus / f"seed-{name}").write_bytes(data)
    print(f"{len(seeds)} seeds in {TARGET.corpus}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--make-seeds"]:
        sys.exit(make_seeds())
    fuzzing.main(sys.argv, check, INSTRUMENT)
