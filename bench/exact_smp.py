#!/usr/bin/env python3
"""Benchmark: exact record/replay of a guest on two vCPUs against one.

qemu-patches/0038 logs the turns of QEMU's round-robin TCG, so a machine with several
vCPUs records and replays exactly, its vCPUs still run in turns on one host thread. What
that costs: the demo guest on Debian's SMP kernel (catalog.DEFAULT_KERNEL), recorded
from power-on with the same client traffic on 1 and 2 vCPUs, the two alternating round by
round (which goes first alternating too), medians over --runs rounds:
  record     wall time of the recording (boot, --rounds of demo traffic, poweroff)
  replay     wall time of its exact replay (verified byte for byte; the run fails if not)
  VM time    VM time the recording covers
  log        the record log's bytes (replay.tdrs, compressed) and, of the raw log, the
             vCPU switches (EVENT_CPU) it holds
Ratios are 2 vCPUs over 1, per round, then the median.

Usage: python bench/exact_smp.py --runs 3 [--rounds 5] [--out docs/benchmarks.md]
"""
from __future__ import annotations

import argparse
import os
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "replay"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_replay import publish  # noqa: E402

from tandem import catalog  # noqa: E402
from tandem.exact.replay import replay  # noqa: E402
from tandem.formats import bundle, rrstream  # noqa: E402
from tandem.machine import Guest  # noqa: E402
from tandem.record.recording import Recording  # noqa: E402
from tandem.record.workload import demo_traffic  # noqa: E402

SECTION = "exact_smp"


# replay/replay-internal.h's event kinds (with qemu-patches/0030's FEED and 0038's CPU) and
# the bytes that follow each, big-endian: enough to walk a log of tandem's guests, which
# send no keyboard or mouse input (REPLAY_ASYNC_EVENT_INPUT is refused).
_ASYNC = ("BH", "BH_ONESHOT", "INPUT", "INPUT_SYNC", "CHAR_READ", "BLOCK", "NET", "FEED")
EVENT_ASYNC, EVENT_SHUTDOWN, EVENT_CHAR_WRITE, EVENT_RANDOM, EVENT_CLOCK, EVENT_CHECKPOINT = 3, 11, 23, 28, 29, 31
EVENT_END, EVENT_CPU = 41, 42


def vcpu_switches(stream: Path) -> int:
    """The EVENT_CPU records of a record log, its events walked one by one."""
    raw = b"".join(rrstream.iter_raw(stream))
    i, n = 0, 0

    def u32(at: int) -> int:
        return struct.unpack_from(">I", raw, at)[0]
    while i < len(raw):
        k = raw[i]
        i += 1
        if k == 0 or k == EVENT_CPU:                      # INSTRUCTION count, CPU index
            n += k == EVENT_CPU
            i += 4
        elif EVENT_ASYNC <= k < EVENT_SHUTDOWN:
            kind = _ASYNC[k - EVENT_ASYNC]
            if kind in ("BH", "BH_ONESHOT", "BLOCK"):
                i += 8
            elif kind == "CHAR_READ":
                i += 1 + 4 + u32(i + 1)
            elif kind == "NET":
                i += 5 + 4 + u32(i + 5)
            elif kind == "FEED":
                i += 10 + 4 + u32(i + 10)
            elif kind == "INPUT":
                raise SystemExit(f"exact_smp: {stream}: an input device event, which this walker does not read")
        elif k == EVENT_CHAR_WRITE:
            i += 8
        elif k in (EVENT_CHAR_WRITE + 1, EVENT_RANDOM):     # CHAR_READ_ALL: array; RANDOM: ret + array
            i += (4 if k == EVENT_RANDOM else 0) + 4 + u32(i + (4 if k == EVENT_RANDOM else 0))
        elif k in (EVENT_CHAR_WRITE + 2, EVENT_CHAR_WRITE + 3):   # CHAR_READ_ALL_ERROR, AUDIO_OUT
            i += 4
        elif EVENT_CLOCK <= k < EVENT_CHECKPOINT:
            i += 8
        elif not (k < EVENT_CHAR_WRITE or EVENT_CHECKPOINT <= k <= EVENT_END):
            raise SystemExit(f"exact_smp: {stream}: event kind {k} at {i - 1}, which this walker does not read")
    return n


def one(tmp: Path, vcpus: int, rounds: int) -> dict[str, float]:
    guest = Guest.default(catalog.DEFAULT_KERNEL)
    guest.vcpus = vcpus
    path = tmp / f"smp{vcpus}-{time.monotonic_ns()}.tdm"
    t = time.monotonic()
    with Recording(path, guest=guest) as rec:
        rec.wait_ready()
        demo_traffic(rec.port, rounds=rounds)
        rec.serial.type("poweroff")
        rec.wait(timeout=600)
    record_s = time.monotonic() - t
    m = bundle.load_manifest(path)
    v = replay(path)
    if not v.ok:
        raise SystemExit(f"exact_smp: the {vcpus}-vCPU recording did not replay: {v.summary()}")
    stream = path / bundle.STREAM
    row = {"record": record_s, "replay": v.replay_wall_s, "vm": m.stop.vm_ns / 1e9,
           "log": stream.stat().st_size, "switches": vcpu_switches(stream), "events": v.events}
    for f in path.iterdir():
        if f.is_file():
            f.unlink()
    path.rmdir()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5, help="demo traffic rounds per recording (default 5)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory(prefix="tandem-exact-smp-") as tmp:
        for r in range(args.runs):
            for n in ((1, 2) if r % 2 == 0 else (2, 1)):
                rows[n].append(one(Path(tmp), n, args.rounds))
                print(f"round {r + 1}/{args.runs}: {n} vCPU(s) {rows[n][-1]}", file=sys.stderr)
    med = {n: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for n, rs in rows.items()}
    ratio = {k: statistics.median(b[k] / a[k] for a, b in zip(rows[1], rows[2]) if a[k])
             for k in ("record", "replay", "vm", "log")}
    load = os.getloadavg()[0]
    text = "\n".join([
        "## Exact record/replay on two vCPUs",
        "",
        f"Command: `python bench/exact_smp.py --runs {args.runs} --rounds {args.rounds}` (this 2-core "
        f"machine, TCG; load average {load:.1f} at the end). The demo guest on Debian's kernel, booted, "
        f"{args.rounds} rounds of demo traffic, powered off; recorded and replayed exactly on 1 and on 2 "
        "vCPUs, alternating; medians, ratios per round (2 over 1).",
        "",
        "| vCPUs | record (s) | exact replay (s) | VM time (s) | record log (KB) | vCPU switches | device events |",
        "|---|---|---|---|---|---|---|",
        *(f"| {n} | {m['record']:.1f} | {m['replay']:.1f} | {m['vm']:.1f} | {m['log'] / 1e3:.0f} | "
          f"{m['switches']:.0f} | {m['events']:.0f} |" for n, m in med.items()),
        f"| 2 over 1 | {ratio['record']:.2f}x | {ratio['replay']:.2f}x | {ratio['vm']:.2f}x | "
        f"{ratio['log']:.2f}x | | |",
    ])
    return publish(text, args.out, SECTION)


if __name__ == "__main__":
    sys.exit(main())
