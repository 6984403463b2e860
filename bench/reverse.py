#!/usr/bin/env python3
"""Benchmark: seeking in a replay under gdb (`tandem replay --gdb`; issue: the QEMU series,
reverse debugging).

A 60 s recording of the demo guest (native kernel) with a client hammering its service for
the middle 30 s; then `exact.debug.debug`: the replay from power-on to the end taking
snapshots every --spacing s of host time, and SEEKS seeks (QMP replay-seek) to VM times
spread over the recording in a shuffled order, each timed from the command to the replay
paused at the instruction. Target: any VM time in 1 s or less.

Usage: python bench/reverse.py [--seeks 20] [--spacing 0.5] [--out docs/benchmarks.md]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "replay"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_replay import publish, record_hammered  # noqa: E402
from tandem.exact.debug import debug  # noqa: E402
from tandem.qemu.vm import free_port  # noqa: E402

SECTION = "reverse"
SECONDS = 60


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeks", type=int, default=20)
    ap.add_argument("--spacing", type=float, default=0.5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    b = Path(tempfile.mkdtemp(prefix="bench-reverse-")) / "demo.tdm"
    requests = record_hammered(b, SECONDS, 5)
    t0 = time.monotonic()
    with debug(b, free_port(), spacing_s=args.spacing) as s:
        index_s = time.monotonic() - t0
        end_ns, end_icount = s.end
        assert end_ns is not None and end_icount is not None
        rng = random.Random(1)
        times = [end_ns * (i + rng.random()) // args.seeks for i in range(args.seeks)]
        rng.shuffle(times)
        took, missed = [], 0
        for t in times:
            target = s.icount_at(t)
            t1 = time.monotonic()
            s.seek(target)
            took.append(time.monotonic() - t1)
            missed += s.icount() != target
        size = sum(int(i.get("actual-size", 0)) for i in s.images())
        shots = len(s.snapshots)
    text = "\n".join([
        "## Seeking a replay under gdb (demo guest, native kernel)", "",
        f"`python bench/reverse.py --seeks {args.seeks} --spacing {args.spacing}`: a {SECONDS} s recording "
        f"({requests} requests from one client in its middle 30 s, {end_icount} instructions); the "
        f"replay under gdb took {index_s:.1f} s from power-on to its end, taking {shots} snapshots "
        f"({size / 2**30:.2f} GiB in the run's qcow2 overlay). Then {args.seeks} seeks (QMP replay-seek) "
        "to VM times spread over the recording, in a shuffled order, each from the command to the replay "
        "paused at the instruction. Target: 1 s or less.", "",
        "| seeks | median s | max s | landed on the instruction |",
        "|---|---|---|---|",
        f"| {len(took)} | {statistics.median(took):.2f} | {max(took):.2f} | {len(took) - missed}/{len(took)} |"])
    return publish(text, args.out, SECTION)


if __name__ == "__main__":
    sys.exit(main())
