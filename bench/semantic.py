#!/usr/bin/env python3
"""Benchmark: semantic replay into analysis VMs (issue: semantic replay).

1. Analysis replay wall time vs the same analysis kernel serving the same client
   workload live (no recording), side by side, medians over --runs rounds.
2. Comparator throughput on a recorded multi-flow workload: payload MB/s and
   device events/s on one core, for loading the inputs and for comparing outputs.
3. Three analyses (kasan, ubsan, lockdep) in parallel (--jobs 2) vs one after the other.

Usage: ./tandem bench   (or: python bench/semantic.py --runs 3 --out docs/benchmarks.md)
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "replay"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_replay import replace_section  # noqa: E402
from tandem import compare, equivalence, inputs, pcapng, replay_semantic  # noqa: E402
from tandem.record import Recording  # noqa: E402
from tandem.semantic import analyze  # noqa: E402
from tandem.vm import VM, Guest, Run, free_port, make_overlay  # noqa: E402
from tandem.workload import KV, demo_traffic  # noqa: E402

SECTION = "semantic"
CLIENTS, REQUESTS = 8, 150


def workload(port: int, serial) -> None:
    serial.wait_for(b"TANDEM-READY", 300)
    demo_traffic(port, rounds=20)
    serial.type("poweroff")


def multi_flow(port: int) -> None:
    """CLIENTS concurrent connections, REQUESTS SET/GET pairs each, 200-byte values."""
    def client(c: int):
        with KV(port) as kv:
            for i in range(REQUESTS):
                kv.request(f"SET c{c}k{i} {'v' * 200}")
                kv.request(f"GET c{c}k{i}")
    ts = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def live(tmp: Path, flavor: str) -> float:
    """The analysis kernel serving the workload live: QEMU start to exit, no recording."""
    g = Guest.default(flavor)
    d = Path(tempfile.mkdtemp(dir=tmp))
    make_overlay(g.disk_base, d / "o.qcow2")
    port = free_port()
    t0 = time.monotonic()
    with VM(g, Run("plain", d, overlay=d / "o.qcow2", hostfwd_port=port)) as vm:
        workload(port, vm.serial)
        vm.wait(300)
    return time.monotonic() - t0


def record(tmp: Path, multi: bool = False) -> Path:
    path = Path(tempfile.mkdtemp(dir=tmp)) / "b.tdm"
    with Recording(path) as rec:
        if multi:
            rec.wait_ready(300)
            multi_flow(rec.port)
            rec.serial.type("poweroff")
        else:
            workload(rec.port, rec.serial)
        rec.wait(timeout=300)
    return path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tandem-bench-sem-"))
    lines = ["## Semantic replay (issue 3)", "",
             f"Command: `./tandem bench` (runs `bench/semantic.py --runs {args.runs}`). TCG on this "
             "2-core machine; medians of interleaved rounds.", ""]
    try:
        # 1. replay vs live, per analysis kernel
        flavors = ["kasan", "lockdep"]
        res = {f: {"live": [], "replay": []} for f in flavors}
        for i in range(args.runs):
            b = record(tmp)
            rec = inputs.load(b)
            for f in flavors:
                res[f]["live"].append(live(tmp, f))
                r = replay_semantic.run(rec, f, tmp / f"an{i}{f}")
                assert r.outcome == "poweroff", (f, r.outcome, r.detail)
                res[f]["replay"].append(r.wall_s)
            print(f"round {i + 1}: " + ", ".join(f"{f} live {res[f]['live'][-1]:.2f}s replay "
                                                  f"{res[f]['replay'][-1]:.2f}s" for f in flavors),
                  file=sys.stderr)
        lines += ["Analysis replay vs the same kernel serving the same workload live (boot to "
                  "TANDEM-READY, 20 rounds of SET/GET from two clients, a SYNC, an `nc` session, "
                  "poweroff). Target: replay at most 1.1x live.", "",
                  "| analysis kernel | live (s) | semantic replay (s) | ratio | met |", "|---|---|---|---|---|"]
        for f in flavors:
            lv, rp = statistics.median(res[f]["live"]), statistics.median(res[f]["replay"])
            lines.append(f"| {f} | {lv:.2f} | {rp:.2f} | {rp / lv:.2f}x | {'yes' if rp / lv <= 1.1 else 'no'} |")

        # 2. comparator throughput
        b = record(tmp, multi=True)
        t0 = time.process_time()
        rec = inputs.load(b)
        t_load = time.process_time() - t0
        n_events = sum(1 for _ in pcapng.iter_events(b / "devices.pcapng"))
        run = replay_semantic.run(rec, "native", tmp / "mf")
        assert run.outcome == "poweroff", run.detail
        spec = equivalence.load("native")
        reps = 20
        t0 = time.process_time()
        for _ in range(reps):
            divs = compare.compare(rec, run, spec)
        t_cmp = (time.process_time() - t0) / reps
        payload = sum(len(d) for fl in rec.flows for _, d in fl.guest_data) + \
            sum(len(d) for _, d in rec.serial_out)
        lines += ["", f"Comparator on a recorded multi-flow workload ({CLIENTS} concurrent clients x "
                  f"{REQUESTS} SET/GET pairs, 200-byte values; {len(rec.flows)} flows, {n_events} device "
                  f"events, {payload / 1e6:.2f} MB of guest output), CPU time on one core. Target: "
                  f">= 500 MB/s and >= 200k events/s.", "",
                  "| step | CPU s | MB/s | events/s | met |", "|---|---|---|---|---|",
                  f"| load inputs from the device log | {t_load:.3f} | {payload / 1e6 / t_load:.0f} | "
                  f"{n_events / t_load:,.0f} | {'yes' if payload / 1e6 / t_load >= 500 and n_events / t_load >= 2e5 else 'no'} |",
                  f"| compare native vs analysis ({len(divs)} divergences) | {t_cmp:.4f} | "
                  f"{payload / 1e6 / t_cmp:.0f} | {n_events / t_cmp:,.0f} | "
                  f"{'yes' if payload / 1e6 / t_cmp >= 500 and n_events / t_cmp >= 2e5 else 'no'} |"]

        # 3. parallel vs sequential
        b = record(tmp)
        trio = ["kasan", "ubsan", "lockdep"]
        t0 = time.monotonic()
        analyze(b, trio, noise=False, jobs=1, workdir=tmp / "seq")
        seq = time.monotonic() - t0
        t0 = time.monotonic()
        analyze(b, trio, noise=False, jobs=2, workdir=tmp / "par")
        par = time.monotonic() - t0
        lines += ["", "Three analyses (kasan, ubsan, lockdep) of one recording, wall time:", "",
                  "| mode | wall (s) |", "|---|---|",
                  f"| one after the other (`--jobs 1`) | {seq:.2f} |",
                  f"| in parallel (`--jobs 2`, 2 cores) | {par:.2f} ({seq / par:.2f}x faster) |", ""]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = "\n".join(lines)
    print(text)
    if args.out:
        replace_section(args.out, text, SECTION)
    return 0


if __name__ == "__main__":
    sys.exit(main())
