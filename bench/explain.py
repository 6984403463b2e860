#!/usr/bin/env python3
"""Benchmark: `tandem explain` on the demo guest (issue: explain findings with Unicorn).

The native kernel records the planted KASAN bugs; the KASAN analysis finds them; each
finding is explained ROUNDS times. Measured per finding:
- time to explain once the replay has reached the window (target: under 10 s), and the
  replay's time to get there and the whole command's;
- instructions per second in the Unicorn window (instructions Unicorn ran / its wall
  time in emu_start) against QEMU's in the same replay (the recording's final instruction
  count / the exact replay's wall time, plugins loaded).

Usage: python bench/explain.py [--rounds 3] [--out docs/benchmarks.md]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "replay"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_replay import publish  # noqa: E402
from tandem import catalog  # noqa: E402
from tandem.explain.explain import explain, load_finding  # noqa: E402
from tandem.machine import Guest  # noqa: E402
from tandem.record.recording import Recording  # noqa: E402
from tandem.record.workload import KV, bad_requests  # noqa: E402
from tandem.semantic.analyze import analyze  # noqa: E402

SECTION = "explain"


def record(path: Path) -> None:
    with Recording(path, Guest.default("native")) as rec:
        rec.wait_ready()
        bad_requests(rec.port, ["kasan-oob", "kasan-uaf", "lkdtm-uaf"])
        with KV(rec.port) as kv:
            kv.request("BUG dbg-note")
        rec.serial.type("poweroff")
        rec.wait(timeout=120)
    analyze(path, [catalog.ANALYSES["kasan"]], noise=False, workdir=path / "analysis")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-explain-"))
    b = tmp / "native.tdm"
    record(b)
    findings = b / "analysis" / "findings.jsonl"
    rows = []
    for n, line in enumerate(findings.read_text().splitlines(), 1):
        title = json.loads(line)["title"]
        f = load_finding(findings, n)
        runs = []
        for _ in range(args.rounds):
            t0 = time.monotonic()
            e = explain(b, f, n)
            total = time.monotonic() - t0
            final = int(e.replay.split("final instruction count ")[1].split(",")[0])
            wall = float(e.replay.split("replay took ")[1].split("s wall")[0])
            pages = sum(w["pages"] for w in e.windows)
            steps = sum(w["stepped_over"] for w in e.windows)
            runs.append((e.explain_s, e.to_stop_s, total, e.emulated / e.emulate_s if e.emulate_s else 0,
                         final / wall, e.emulated, "same" if e.same else "not made", pages, steps))
        med = [statistics.median(r[i] for r in runs) for i in range(5)]
        rows.append(f"| {title} | {runs[0][6]} | {med[0]:.3f} | {med[1]:.1f} | {med[2]:.1f} | "
                    f"{runs[0][5]} | {runs[0][7]} | {runs[0][8]} | {med[3] / 1e3:.0f} k/s | {med[4] / 1e6:.0f} M/s |")
    text = "\n".join([
        "## tandem explain (demo guest, native kernel)", "",
        f"`python bench/explain.py --rounds {args.rounds}`; medians of {args.rounds} rounds; one finding "
        "of the KASAN analysis per row. *explain*: from the replay's stop at the window to the verdict "
        "(target under 10 s); *to window*: QEMU's start until the replay reached the window; *whole*: "
        "the call, to the end of the verifying replay. Unicorn's rate is its instructions over its "
        "wall time in emu_start (step-overs through the replay excluded); QEMU's is the recording's "
        "instructions over the exact replay's wall time with both plugins loaded. *pages*: guest pages "
        "Unicorn fetched from the stopped replay; *run by the replay*: instructions stepped over "
        "(calls out of the window).", "",
        "| finding | verdict | explain s | to window s | whole s | Unicorn insns | pages | run by the replay "
        "| Unicorn rate | QEMU rate |",
        "|---|---|---|---|---|---|---|---|---|---|", *rows, "",
        "The windows are the planted functions, 5 to 34 instructions: Unicorn's rate over them is its "
        "start per emu_start (translation of a new block, the TLB fill that fetches a page over the "
        "socket), not its emulation speed; the time that matters is *explain s*, against the 10 s target."])
    return publish(text, args.out, SECTION)


if __name__ == "__main__":
    sys.exit(main())
