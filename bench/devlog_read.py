#!/usr/bin/env python3
"""Benchmark: how fast the device-log reader reads (tandem.formats.pcapng.read_devlog).

Every stage that takes a bundle starts here: inspect, semantic replay, the farm's pairs,
explain, the live comparison's catch-up. The reader parses each block in place from a
large buffer; an EPB in the layout QEMU's devlog writes takes a fast path, anything else
the general one (docs/formats.md). Logs made with the writer in a temporary directory:
  serial       150k serial records of 16-96 bytes, from vCPUs 0 and 1 (format 2's record
               header, which carries the vCPU, read on the fast path)
  serial, f1   the same records in format 1 (no record header), as older bundles have them
  net          150k Ethernet frames of 60-1514 bytes (no record header)
  mixed        the demo guest's mix: serial, frames, disk writes of 4 KiB, entropy of 64 bytes
  long         2,000 serial events of 200 KiB, split into continued records (general path)
Each log is read in rounds, the logs alternating within a round; medians. Beside each,
the bare walk: the same file read and its blocks stepped over by length, nothing parsed,
the floor any reader of pcapng in Python pays. The ratio reader/walk is what to watch:
it says what parsing an event costs over finding it.

Usage: PYTHONPATH=replay python bench/devlog_read.py [--rounds 7] [--out docs/benchmarks.md]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "replay"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_replay import publish  # noqa: E402
from tandem.formats.pcapng import PcapngWriter, read_devlog  # noqa: E402

SECTION = "devlog_read"
N = 150_000


def write_log(path: Path, kind: str) -> int:
    """One benchmark log at PATH; the number of events written."""
    rnd = random.Random(kind)
    fmt = 1 if kind == "serial, f1" else 2
    w = PcapngWriter(path, format=fmt)
    ser = w.add_interface("serial0", "serial")
    net = w.add_interface("net0", "net")
    blk = w.add_interface("disk0", "block")
    rng = w.add_interface("rng0", "rng")
    t, n = 0, 0
    sector = bytes(range(256)) * 16
    for k in range(2_000 if kind == "long" else N):
        t += rnd.randrange(1_000, 200_000)
        if kind in ("serial", "serial, f1"):
            w.event(ser, "out", t, b"x" * rnd.randrange(16, 97), icount=t // 3, vcpu=k & 1)
        elif kind == "net":
            w.event(net, rnd.choice(("in", "out")), t, os.urandom(rnd.randrange(60, 1515)), icount=t // 3)
        elif kind == "long":
            w.event(ser, "out", t, b"y" * 200_000, icount=t // 3, vcpu=0)
        else:
            pick = k % 10
            if pick < 5:
                w.event(ser, "out", t, b"z" * rnd.randrange(16, 97), icount=t // 3, vcpu=k & 1)
            elif pick < 8:
                w.event(net, "in" if pick == 5 else "out", t, os.urandom(rnd.randrange(60, 1515)), icount=t // 3)
            elif pick == 8:
                w.event(blk, "out", t, struct.pack("<B7xQQ", 1, k * 8, 4096) + sector, icount=t // 3)
            else:
                w.event(rng, "in", t, os.urandom(64), icount=t // 3)
        n += 1
    w.close(end_vm_ns=t + 1)
    return n


def bare_walk(path: Path) -> int:
    """Step over every block by its length (the floor): the number of blocks."""
    data = path.read_bytes()
    hdr = struct.Struct("<II").unpack_from
    i, blocks = 0, 0
    while i + 8 <= len(data):
        i += hdr(data, i)[1]
        blocks += 1
    return blocks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    kinds = ("serial", "serial, f1", "net", "mixed", "long")
    with tempfile.TemporaryDirectory(prefix="tandem-devlog-read-") as tmp:
        logs = {k: Path(tmp, f"{i}.pcapng") for i, k in enumerate(kinds)}
        events = {k: write_log(p, k) for k, p in logs.items()}
        reads: dict[str, list[float]] = {k: [] for k in kinds}
        walks: dict[str, list[float]] = {k: [] for k in kinds}
        for r in range(args.rounds):
            for k in kinds:
                for fn, into in ((lambda p=logs[k]: read_devlog(p, allow_torn=False), reads),
                                 (lambda p=logs[k]: bare_walk(p), walks))[::1 if r % 2 else -1]:
                    t = time.perf_counter()
                    fn()
                    into[k].append(time.perf_counter() - t)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        got = {k: len(read_devlog(p).events) for k, p in logs.items()}
        sizes = {k: p.stat().st_size for k, p in logs.items()}
    for k in kinds:
        if got[k] != events[k]:
            raise SystemExit(f"devlog_read: the {k} log read back {got[k]} events of {events[k]} written")
    load = os.getloadavg()[0]
    rows = []
    for k in kinds:
        rd, wk = statistics.median(reads[k]), statistics.median(walks[k])
        rows.append(f"| {k} | {events[k]:,} | {sizes[k] / 1e6:.1f} | {rd * 1e3:.0f} | "
                    f"{events[k] / rd / 1e3:.0f}k | {sizes[k] / rd / 1e6:.0f} | {wk * 1e3:.0f} | {rd / wk:.1f}x |")
    text = "\n".join([
        "## Reading device logs",
        "",
        f"Command: `PYTHONPATH=replay python bench/devlog_read.py --rounds {args.rounds}` (wall time, "
        f"medians of {args.rounds} rounds, the logs alternating; load average {load:.1f} at the end, "
        f"on {os.cpu_count()} cores, Python {sys.version.split()[0]}). The logs are written by the "
        "test writer in the layout QEMU's devlog writes (docs/formats.md); the bare walk reads the "
        "same file and steps over its blocks by length, parsing nothing.",
        "",
        "| log | events | MB | read (ms) | events/s | MB/s | bare walk (ms) | read / walk |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
    ])
    return publish(text, args.out, SECTION)


if __name__ == "__main__":
    sys.exit(main())
