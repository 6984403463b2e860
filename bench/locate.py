#!/usr/bin/env python3
"""Benchmark: state checkpoints and `tandem replay --locate` (issue: the QEMU series, a
failed replay located to the instruction).

Three recordings of the demo guest (native kernel), each SECONDS long with a client
hammering its service for the middle half, side by side in one run: without state
checkpoints, with them every 100 ms of VM time (tandem's default) and every 10 ms. For
each: the client's requests answered while recording (what checkpoints cost the native),
the device log's size, and the exact replay's wall time. Then one frame into the guest is
altered in a copy of the 100 ms recording (tests/helpers/tamper.py) and `locate` finds
where its replay departs: its wall time against the plain replay's.

Usage: python bench/locate.py [--seconds 30] [--out docs/benchmarks.md]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "replay"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers.tamper import alter_frame  # noqa: E402
from record_replay import publish, record_hammered  # noqa: E402
from tandem.exact.locate import locate  # noqa: E402
from tandem.exact.replay import replay  # noqa: E402
from tandem.explain.native import describe_pc  # noqa: E402
from tandem.formats import bundle, pcapng  # noqa: E402

SECTION = "locate"
PERIODS = (0, 100_000_000, 10_000_000)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-locate-"))
    rows, replay_s = [], {}
    for every in PERIODS:
        b = tmp / f"every-{every}.tdm"
        replies = record_hammered(b, args.seconds, args.seconds / 4, state_every_ns=every)
        log = pcapng.read_devlog(b / bundle.DEVLOG)
        t0 = time.monotonic()
        v = replay(b)
        replay_s[every] = time.monotonic() - t0
        assert v.ok, v.summary()
        rows.append(f"| {every // 10**6 if every else 'none'} | {replies} | {len(log.states)} | "
                    f"{(b / bundle.DEVLOG).stat().st_size / 2**20:.2f} | "
                    f"{(b / bundle.STREAM).stat().st_size / 2**20:.2f} | {replay_s[every]:.1f} |")
    altered = tmp / "altered.tdm"
    shutil.copytree(tmp / f"every-{PERIODS[1]}.tdm", altered)
    log = pcapng.read_devlog(altered / bundle.DEVLOG)
    ev = alter_frame(altered, after_ns=log.events[len(log.events) // 2].vm_ns, min_len=60)
    t0 = time.monotonic()
    dep = locate(altered, name=lambda pc: describe_pc(altered, pc))
    locate_s = time.monotonic() - t0
    assert dep is not None and dep.icount == ev.icount, dep
    text = "\n".join([
        "## State checkpoints and `tandem replay --locate` (demo guest, native kernel)", "",
        f"`python bench/locate.py --seconds {args.seconds}`, one run, side by side: three {args.seconds} s "
        "recordings, a client hammering the guest's service for the middle half, without state checkpoints "
        "and with them every 100 ms (the default) and every 10 ms of VM time; each replayed exactly.", "",
        "| checkpoints every (ms) | requests answered while recording | checkpoints | device log MiB | "
        "replay log MiB | exact replay s |",
        "|---|---|---|---|---|---|", *rows, "",
        f"One frame into the guest altered in a copy of the 100 ms recording (event #{ev.seq}, instruction "
        f"{ev.icount}): `locate` took {locate_s:.1f} s (the plain replay {replay_s[PERIODS[1]]:.1f} s) and "
        f"named instruction {dep.icount}, pc {dep.pc:#x} ({dep.symbol}); led to: {dep.led_to}."])
    shutil.rmtree(tmp, ignore_errors=True)
    return publish(text, args.out, SECTION)


if __name__ == "__main__":
    sys.exit(main())
