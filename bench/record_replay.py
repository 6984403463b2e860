#!/usr/bin/env python3
"""Benchmark: recording overhead, replay speed and bundle size (issue: record + exact replay).

Same guest workload in every configuration, interleaved round by round in one run
(the machine is shared and noisy), medians over --runs rounds:
  plain        the same QEMU, no icount, no recording
  icount       -icount alone
  rr-no-tap    -icount rr=record without the device tap (tandem's QEMU; see docs)
  tandem       tandem record (rr=record + devlog)
then exact replay of the tandem bundle (with verification) and of the rr-no-tap log.

Usage: ./tandem bench   (or: python bench/record_replay.py --runs 5 --out docs/benchmarks.md)
"""
from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "replay"))

from tandem import bundle, rrstream  # noqa: E402
from tandem.record import Recording  # noqa: E402
from tandem.replay_exact import replay  # noqa: E402
from tandem.vm import VM, Guest, Run, free_port, make_overlay  # noqa: E402
from tandem.workload import demo_traffic  # noqa: E402

ROUNDS = 20


def workload(port: int, serial) -> None:
    serial.wait_for(b"TANDEM-READY", 120)
    demo_traffic(port, rounds=ROUNDS)
    serial.type("poweroff")


def run_plain(tmp: Path, icount: bool, rr: bool) -> tuple[float, Path | None]:
    g = Guest.default()
    d = Path(tempfile.mkdtemp(dir=tmp))
    make_overlay(g.disk_base, d / "o.qcow2")
    port = free_port()
    run = Run("record" if rr else "plain", d, overlay=d / "o.qcow2", hostfwd_port=port,
              icount=icount, rrfile=d / "replay.tdrs" if rr else None)
    t0 = time.monotonic()
    with VM(g, run) as vm:
        workload(port, vm.serial)
        vm.wait(120)
    return time.monotonic() - t0, (d if rr else None)


def run_tandem(tmp: Path) -> tuple[float, Path]:
    path = Path(tempfile.mkdtemp(dir=tmp)) / "b.tdm"
    t0 = time.monotonic()
    with Recording(path) as rec:
        workload(rec.port, rec.serial)
        rec.wait(timeout=120)
    return time.monotonic() - t0, path


def replay_rr_only(rrdir: Path) -> float:
    """Replay the rr-no-tap log (no devlog, nothing verified): the baseline replay."""
    g = Guest.default()
    d = Path(tempfile.mkdtemp(dir=rrdir))
    make_overlay(g.disk_base, d / "o.qcow2")
    run = Run("replay", d, rrfile=rrdir / "replay.tdrs", overlay=d / "o.qcow2")
    t0 = time.monotonic()
    with VM(g, run) as vm:
        vm.wait(600)
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path, help="write the markdown section here")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tandem-bench-"))
    res: dict[str, list[float]] = {k: [] for k in
                                   ("plain", "icount", "rr-no-tap", "tandem", "replay-tandem", "replay-rr")}
    sizes = []
    try:
        for i in range(args.runs):
            res["plain"].append(run_plain(tmp, icount=False, rr=False)[0])
            res["icount"].append(run_plain(tmp, icount=True, rr=False)[0])
            t, rrdir = run_plain(tmp, icount=True, rr=True)
            res["rr-no-tap"].append(t)
            t, b = run_tandem(tmp)
            res["tandem"].append(t)
            v = replay(b)
            assert v.ok, v.summary()
            res["replay-tandem"].append(v.replay_wall_s)
            res["replay-rr"].append(replay_rr_only(rrdir))
            m = bundle.load_manifest(b)
            info = rrstream.scan(b / bundle.STREAM)
            rrstream.to_stock(b / bundle.STREAM, tmp / "stock.bin")
            devlog = (b / bundle.DEVLOG).stat().st_size
            devlog_gz = len(gzip.compress((b / bundle.DEVLOG).read_bytes()))
            sizes.append({"vm_s": m["stop"]["vm_ns"] / 1e9, "ginsn": m["stop"]["icount"] / 1e9,
                          "stock_log": (tmp / "stock.bin").stat().st_size,
                          "tdrs": info.stored_bytes + 48 * len(info.segments) + 16,
                          "devlog": devlog, "devlog_gz": devlog_gz})
            print(f"round {i + 1}/{args.runs}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in res.items()),
                  file=sys.stderr)
            shutil.rmtree(tmp)
            tmp.mkdir()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    s = {k: statistics.median(x[k] for x in sizes) for k in sizes[0]}
    lines = [
        "## Record and exact replay (issue 2)",
        "",
        f"Command: `./tandem bench` (runs `bench/record_replay.py --runs {args.runs}`). "
        f"Workload: boot the demo guest to TANDEM-READY, {ROUNDS} rounds of SET/GET from two "
        "Python clients, a SYNC, one `nc` session, serial `poweroff`. Wall time from QEMU "
        f"start to exit, median of {args.runs} interleaved rounds, TCG on this 2-core machine.",
        "",
        "| configuration | wall (s) | vs -icount alone |",
        "|---|---|---|",
    ]
    for k in ("plain", "icount", "rr-no-tap", "tandem"):
        lines.append(f"| {k} | {med[k]:.2f} | {med[k] / med['icount']:.3f}x |")
    lines += [
        "",
        "| replay | wall (s) | vs recording wall |",
        "|---|---|---|",
        f"| tandem exact replay (verified) | {med['replay-tandem']:.2f} | {med['replay-tandem'] / med['tandem']:.2f}x |",
        f"| rr replay, no tap | {med['replay-rr']:.2f} | {med['replay-rr'] / med['rr-no-tap']:.2f}x |",
        "",
        f"Bundle size (median run: {s['vm_s']:.2f} s of VM time, {s['ginsn']:.3f} G instructions):",
        "",
        "| part | bytes | per VM second | per G instructions |",
        "|---|---|---|---|",
    ]
    for label, k in (("stock-format QEMU log (uncompressed events)", "stock_log"),
                     ("tandem replay.tdrs (zstd segments)", "tdrs"),
                     ("devices.pcapng", "devlog"), ("devices.pcapng gzipped", "devlog_gz")):
        lines.append(f"| {label} | {s[k]:.0f} | {s[k] / s['vm_s']:.0f} | {s[k] / s['ginsn']:.0f} |")
    both, alone = (s['tdrs'] + s['devlog']) / s['stock_log'], s['tdrs'] / s['stock_log']
    lines += ["", f"tandem record log + device log = {both:.4f}x the stock-format log (1/{1 / both:.0f}); "
              f"the record log alone {alone:.4f}x (1/{1 / alone:.0f}).", ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
