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
import os
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


def say(text: str) -> None:
    print(f"reverse: {text}", file=sys.stderr, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeks", type=int, default=20)
    ap.add_argument("--spacing", type=float, default=0.5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    b = Path(tempfile.mkdtemp(prefix="bench-reverse-")) / "demo.tdm"
    requests = record_hammered(b, SECONDS, 5)
    say(f"recorded {b}: {requests} requests")
    t0 = time.monotonic()
    with debug(b, free_port(), spacing_s=args.spacing) as s:
        index_s = time.monotonic() - t0
        say(f"replayed to the end in {index_s:.1f} s, {len(s.snapshots)} snapshots")
        end_ns, end_icount = s.end
        assert end_ns is not None and end_icount is not None
        rng = random.Random(1)
        times = [end_ns * (i + rng.random()) // args.seeks for i in range(args.seeks)]
        rng.shuffle(times)
        took, loads, runs, missed = [], [], [], 0
        for t in times:
            target = s.icount_at(t)
            t1 = time.monotonic()
            s.seek(target)
            took.append(time.monotonic() - t1)
            missed += s.icount() != target
            # The same seek in its two parts: to the snapshot it starts from (a load), then
            # on to the instruction (QEMU replays forward from there without a load).
            shot = max((x for x in s.snapshots if x.icount <= target), key=lambda x: x.icount)
            t1 = time.monotonic()
            s.seek(shot.icount)
            loads.append(time.monotonic() - t1)
            t1 = time.monotonic()
            s.seek(target)
            runs.append(time.monotonic() - t1)
            say(f"seek to {target}: {took[-1]:.2f} s; from snapshot {shot.name} ({target - shot.icount} "
                f"instructions before): load {loads[-1]:.2f} s, replay {runs[-1]:.2f} s")
        size = sum(int(i.get("actual-size", 0)) for i in s.images())
        shots = len(s.snapshots)
    text = "\n".join([
        "## Seeking a replay under gdb (demo guest, native kernel)", "",
        f"`python bench/reverse.py --seeks {args.seeks} --spacing {args.spacing}` on {os.cpu_count()} cores "
        f"(TCG): a {SECONDS} s recording "
        f"({requests} requests from one client in its middle 30 s, {end_icount} instructions); the "
        f"replay under gdb took {index_s:.1f} s from power-on to its end, taking {shots} snapshots "
        f"({size / 2**30:.2f} GiB in the run's qcow2 overlay). Then {args.seeks} seeks (QMP replay-seek) "
        "to VM times spread over the recording, in a shuffled order, each from the command to the replay "
        "paused at the instruction. Target: 1 s or less. Then each seek again in its two parts: "
        "to the snapshot it starts from (the load), and on from there to the instruction (the replay).", "",
        "| seeks | median s | max s | landed on the instruction | load median s | load max s "
        "| replay median s | replay max s |",
        "|---|---|---|---|---|---|---|---|",
        f"| {len(took)} | {statistics.median(took):.2f} | {max(took):.2f} | {len(took) - missed}/{len(took)} "
        f"| {statistics.median(loads):.2f} | {max(loads):.2f} | {statistics.median(runs):.2f} | {max(runs):.2f} |"])
    return publish(text, args.out, SECTION)


if __name__ == "__main__":
    sys.exit(main())
