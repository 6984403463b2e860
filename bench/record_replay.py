#!/usr/bin/env python3
"""Benchmark: recording overhead, replay speed and bundle size (issue: record + exact replay).

Same guest workload in every configuration, interleaved round by round in one run
(the machine is shared and noisy), medians over --runs rounds:
  plain         tandem's QEMU, no icount, no recording
  icount        tandem's QEMU, -icount alone
  stock-record  stock QEMU 10.0 (same Debian source, same device set, no tandem code
                patches), -icount rr=record
  tandem        tandem record (rr=record + device tap)
then the replays: tandem's exact replay of its bundle (verified byte for byte) and
stock rr=replay of the stock recording, each against its own recording's wall time.

Heavy part: one client hammering the guest with SETs, as fast as replies come:
  complete      a recording of HEAVY_VM_S of VM time, replayed exactly and with --partial
  torn          a recording killed (SIGKILL) TORN_AFTER_S seconds into the load, --partial
  follow        `replay --follow` started beside a recording like the complete one
each replay against its own recording's wall time.

Usage: ./tandem bench   (or: python bench/record_replay.py --runs 5 --out docs/benchmarks.md)
       ./tandem bench heavy   (= python bench/record_replay.py --only heavy --heavy-runs 3 --out docs/benchmarks.md)
The results replace this benchmark's sections of --out; other sections are kept.
"""
from __future__ import annotations

import argparse
import gzip
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "replay"))

from tandem import artifacts
from tandem.formats import bundle, rrstream  # noqa: E402
from tandem.record.recording import Recording  # noqa: E402
from tandem.errors import TandemError  # noqa: E402
from tandem.exact.replay import Verdict, replay  # noqa: E402
from tandem.qemu.vm import VM, free_port
from tandem.qemu.image import make_overlay
from tandem.machine import RR, Guest, Host, Run, UserNet  # noqa: E402
from tandem.record.workload import Hammer, demo_traffic  # noqa: E402

ROUNDS = 20
HEAVY_VM_S = 15       # the followed recording: 15 s under one client hammering SET
TORN_AFTER_S = 7      # the torn one: QEMU killed 7 s into the load
PARTS = ("light", "heavy", "freebsd")
DEFAULT_PARTS = ("light", "heavy")      # freebsd: with a FreeBSD tree (TANDEM_FREEBSD_SRC) and its builds


def workload(port: int, serial) -> None:
    serial.wait_for(b"TANDEM-READY", 120)
    demo_traffic(port, rounds=ROUNDS)
    serial.type("poweroff")


def run_plain(tmp: Path, icount: bool, rr: bool, qemu: dict | None = None,
              guest: Guest | None = None) -> tuple[float, Path | None]:
    g = guest or Guest.default()
    d = Path(tempfile.mkdtemp(dir=tmp))
    make_overlay(g.disk.base, d / "o.qcow2")
    port = free_port()
    run = Run(d, net=UserNet(port), overlay=d / "o.qcow2", icount=icount,
              rr=RR("record", d / "replay.bin") if rr else None, host=Host(qemu=qemu))
    t0 = time.monotonic()
    with VM(g, run) as vm:
        workload(port, vm.serial)
        vm.wait(120)
    return time.monotonic() - t0, (d if rr else None)


def run_tandem(tmp: Path, guest: Guest | None = None) -> tuple[float, Path]:
    path = Path(tempfile.mkdtemp(dir=tmp)) / "b.tdm"
    t0 = time.monotonic()
    with Recording(path, guest=guest) as rec:
        workload(rec.port, rec.serial)
        rec.wait(timeout=120)
    return time.monotonic() - t0, path


def replay_stock(rrdir: Path, qemu: dict) -> float:
    """Stock rr=replay of the stock recording (no device tap, nothing verified)."""
    g = Guest.default()
    d = Path(tempfile.mkdtemp(dir=rrdir))
    make_overlay(g.disk.base, d / "o.qcow2")
    run = Run(d, rr=RR("replay", rrdir / "replay.bin"), overlay=d / "o.qcow2", host=Host(qemu=qemu))
    t0 = time.monotonic()
    with VM(g, run) as vm:
        vm.wait(600)
    return time.monotonic() - t0


class Follower(threading.Thread):
    """`replay --follow` of a recording in progress; `ended` is when its verdict came."""

    def __init__(self, path: Path):
        super().__init__(daemon=True)
        self.path = path
        self.verdict: Verdict | None = None
        self.error: BaseException | None = None
        self.ended = 0.0

    def run(self) -> None:
        try:
            self.verdict = replay(self.path, follow=True)
        except BaseException as e:      # handed to the benchmark by result(): nothing is lost
            self.error = e
        self.ended = time.monotonic()

    def result(self) -> Verdict:
        self.join(900)
        if self.error is not None or self.verdict is None:
            raise RuntimeError(f"follow replay of {self.path} failed: {self.error}")
        return self.verdict


def record_heavy(tmp: Path, *, torn: bool = False, follow: bool = False) -> tuple[Path, Follower | None, float]:
    """A recording under one client hammering SET: HEAVY_VM_S of VM time, or killed with
    SIGKILL TORN_AFTER_S into the load. Returns the bundle, the follower if asked, and
    the host's clock when QEMU ended."""
    path = Path(tempfile.mkdtemp(dir=tmp)) / "heavy.tdm"
    rec = Recording(path, duration_ns=0 if torn else HEAVY_VM_S * 10**9).start()
    follower = Follower(path) if follow else None
    if follower:
        follower.start()
    try:
        rec.wait_ready()
        hammer = Hammer(rec.port)
        load = threading.Thread(target=hammer.run, daemon=True)
        load.start()
        if torn:
            time.sleep(TORN_AFTER_S)
            os.kill(rec.started().process().pid, signal.SIGKILL)
        rec.wait(timeout=600)
        ended = time.monotonic()
        hammer.stop.set()
        load.join(60)
    finally:
        try:
            rec.finish()
        except TandemError:
            if not torn:
                raise
    return path, follower, ended


def run_heavy(runs: int) -> str:
    """The heavy part's section: each case's replay against its recording, medians."""
    res: dict[str, list[tuple[float, float, int]]] = {k: [] for k in ("exact", "partial", "torn", "follow")}
    lag: list[float] = []
    tmp = Path(tempfile.mkdtemp(prefix="tandem-bench-heavy-"))
    try:
        for i in range(runs):
            b, _, _ = record_heavy(tmp)
            for case, partial in (("exact", False), ("partial", True)):
                v = replay(b, partial=partial)
                assert v.ok, v.summary()
                res[case].append((v.record_wall_s or 0.0, v.replay_wall_s, v.events))
            b, _, _ = record_heavy(tmp, torn=True)
            v = replay(b, partial=True)
            assert v.ok, v.summary()
            res["torn"].append((v.record_wall_s or 0.0, v.replay_wall_s, v.events))
            b, follower, ended = record_heavy(tmp, follow=True)
            assert follower is not None
            v = follower.result()
            assert v.ok, v.summary()
            res["follow"].append((v.record_wall_s or 0.0, v.replay_wall_s, v.events))
            lag.append(follower.ended - ended)
            print(f"heavy round {i + 1}/{runs}: " + ", ".join(
                f"{k} {x[-1][1]:.1f}s/{x[-1][0]:.1f}s" for k, x in res.items()) + f", follower done {lag[-1]:.1f}s after",
                file=sys.stderr)
            shutil.rmtree(tmp)
            tmp.mkdir()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    label = {"exact": f"complete ({HEAVY_VM_S} s of VM time), exact replay",
             "partial": "the same, replayed with `--partial`",
             "torn": f"torn: QEMU killed (SIGKILL) {TORN_AFTER_S} s into the load, `--partial`",
             "follow": "`replay --follow` started beside a recording like the complete one"}
    lines = [
        "## Exact replay of heavy recordings: complete, torn, followed",
        "",
        f"Command: `./tandem bench heavy` (runs `bench/record_replay.py --only heavy --heavy-runs {runs}`). "
        "Workload: boot the demo guest to TANDEM-READY, then one client sends SET after SET to "
        "kvd, each waiting for its reply, until the recording ends. Wall times as tandem reports "
        f"them (the recording's from QEMU start to exit or kill, the replay's likewise), median of {runs} "
        "rounds, TCG on this 2-core machine; every replay verified (events compared byte for byte).",
        "",
        "| case | recording wall (s) | replay wall (s) | replay / recording | events verified |",
        "|---|---|---|---|---|",
    ]
    for k, rows in res.items():
        rec_s, rep_s = statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)
        ratio = statistics.median(r[1] / r[0] for r in rows if r[0])
        lines.append(f"| {label[k]} | {rec_s:.1f} | {rep_s:.1f} | {ratio:.2f}x | {statistics.median(r[2] for r in rows):.0f} |")
    lines += ["", f"The follower's verdict came {statistics.median(lag):.1f} s (median; "
              f"{min(lag):.1f}-{max(lag):.1f}) after the recording's QEMU exited.", ""]
    return "\n".join(lines)


SECTION = "record_replay"


def record_hammered(path: Path, seconds: int, lead_s: float, **recording) -> int:
    """A recording of the demo guest on the native kernel, `seconds` of VM time long, with
    a client hammering its service for half of it from `lead_s` on; how many requests the
    client had answered. recording: more of Recording's options."""
    with Recording(path, Guest.default("native"), duration_ns=seconds * 10**9, **recording) as rec:
        rec.wait_ready()
        time.sleep(lead_s)
        hammer = Hammer(rec.port)
        t = threading.Thread(target=hammer.run, daemon=True)
        t.start()
        time.sleep(seconds / 2)
        hammer.stop.set()
        t.join(30)
        rec.wait(timeout=600)
    return hammer.replies


def publish(text: str, out: Path | None, section: str) -> int:
    """Print a benchmark's results and, given --out, put them in their section of it."""
    print(text)
    if out:
        replace_section(out, text, section)
    return 0


def replace_section(path: Path, text: str, section: str = SECTION) -> None:
    """Put TEXT between a benchmark's markers in PATH, keeping everything else."""
    begin, end = f"<!-- bench:{section} -->", f"<!-- /bench:{section} -->"
    block = f"{begin}\n{text}\n{end}"
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in old and end in old:
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(new)


def replace_part(path: Path, section: str, title: str, parts: tuple[str, ...], part: str, text: str) -> None:
    """Put TEXT in one part's block inside a benchmark's section (so a part can be rerun
    alone and the others' results stay); a part new to the file gets its block after the
    parts before it, a section new to the file starts with TITLE."""
    begin = f"<!-- bench:{section}-{part} -->"
    old = path.read_text() if path.exists() else ""
    if f"<!-- bench:{section} -->" not in old:
        replace_section(path, f"{title}\n\n{begin}\n<!-- /bench:{section}-{part} -->", section)
    elif begin not in old:
        marks = [f"<!-- /bench:{section}-{p} -->" for p in parts[:parts.index(part)]]
        start = old.index(f"<!-- bench:{section} -->") + len(f"<!-- bench:{section} -->")
        if old[start:].lstrip("\n").startswith(title):     # after the section's title, not before it
            start = old.index(title, start) + len(title)
        at = max((old.index(m) + len(m) for m in marks if m in old), default=start)
        path.write_text(old[:at] + f"\n\n{begin}\n<!-- /bench:{section}-{part} -->" + old[at:])
    replace_section(path, text, f"{section}-{part}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path, help="replace this benchmark's section of this markdown file")
    ap.add_argument("--only", action="append", choices=PARTS, help="run only this part (repeatable)")
    ap.add_argument("--heavy-runs", type=int, default=3, help="rounds of the heavy part (default 3)")
    args = ap.parse_args()
    only = args.only or list(DEFAULT_PARTS)
    if "light" in only:
        run_light(args)
    if "heavy" in only:
        text = run_heavy(args.heavy_runs)
        print(text)
        if args.out:
            replace_section(args.out, text, SECTION_HEAVY)
    if "freebsd" in only:
        publish(run_freebsd(args.runs), args.out, SECTION_FREEBSD)
    return 0


SECTION_HEAVY = "record_replay_heavy"
SECTION_FREEBSD = "record_replay_freebsd"


def run_freebsd(runs: int) -> str:
    """The FreeBSD demo guest (docs/freebsd.md) under the light workload: -icount alone
    against tandem record, and the exact replay against its recording, interleaved."""
    g = Guest.default("freebsd-native")
    tmp = Path(tempfile.mkdtemp(prefix="tandem-bench-freebsd-"))
    res: dict[str, list[float]] = {"icount": [], "tandem": [], "replay": []}
    try:
        for i in range(runs):
            res["icount"].append(run_plain(tmp, icount=True, rr=False, guest=g)[0])
            t, b = run_tandem(tmp, guest=g)
            res["tandem"].append(t)
            v = replay(b)
            assert v.ok, v.summary()
            res["replay"].append(v.replay_wall_s)
            print(f"freebsd round {i + 1}/{runs}: " + ", ".join(f"{k} {x[-1]:.1f}s" for k, x in res.items()),
                  file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(x) for k, x in res.items()}
    rec_ratio = statistics.median(t / i for t, i in zip(res["tandem"], res["icount"]))
    rep_ratio = statistics.median(r / t for r, t in zip(res["replay"], res["tandem"]))
    return "\n".join([
        "## Record and exact replay: the FreeBSD demo guest",
        "",
        f"Command: `python bench/record_replay.py --only freebsd --runs {runs} --out docs/benchmarks.md` "
        "(a FreeBSD tree set: `TANDEM_FREEBSD_SRC`). Workload: boot the FreeBSD demo guest "
        f"(TANDEM-NATIVE, booted directly) to TANDEM-READY, {ROUNDS} rounds of the demo's client traffic, "
        f"`poweroff`. Wall time from QEMU's start to its exit, median of {runs} interleaved rounds "
        "(the ratios: median of each round's), TCG on this 2-core machine; every replay verified.",
        "",
        "| configuration | wall (s) | ratio |",
        "|---|---|---|",
        f"| tandem's QEMU, `-icount` alone | {med['icount']:.1f} | 1.00x |",
        f"| `tandem record` | {med['tandem']:.1f} | {rec_ratio:.3f}x of -icount alone (target: within 1.03x) |",
        f"| `tandem replay` (exact) | {med['replay']:.1f} | {rep_ratio:.2f}x of its recording (target: at most 1x) |",
        ""])


def run_light(args) -> None:
    """The recording overhead, replay speed and bundle size of the demo workload."""
    stock = artifacts.qemu_stock()
    tmp = Path(tempfile.mkdtemp(prefix="tandem-bench-"))
    res: dict[str, list[float]] = {k: [] for k in
                                   ("plain", "icount", "stock-record", "tandem", "replay-tandem", "replay-stock")}
    sizes = []
    try:
        for i in range(args.runs):
            res["plain"].append(run_plain(tmp, icount=False, rr=False)[0])
            res["icount"].append(run_plain(tmp, icount=True, rr=False)[0])
            t, rrdir = run_plain(tmp, icount=True, rr=True, qemu=stock)
            res["stock-record"].append(t)
            t, b = run_tandem(tmp)
            res["tandem"].append(t)
            v = replay(b)
            assert v.ok, v.summary()
            res["replay-tandem"].append(v.replay_wall_s)
            res["replay-stock"].append(replay_stock(rrdir, stock))
            m = bundle.load_manifest(b)
            info = rrstream.scan(b / bundle.STREAM)
            rrstream.to_stock(b / bundle.STREAM, tmp / "stock.bin")
            devlog = (b / bundle.DEVLOG).stat().st_size
            devlog_gz = len(gzip.compress((b / bundle.DEVLOG).read_bytes()))
            sizes.append({"vm_s": m.stop.vm_ns / 1e9, "ginsn": m.stop.icount / 1e9,
                          "stock_qemu_log": (rrdir / "replay.bin").stat().st_size,
                          "same_run_stock_format": (tmp / "stock.bin").stat().st_size,
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
    rec = med["tandem"] / med["icount"]
    rep = med["replay-tandem"] / med["tandem"]
    size = (s["tdrs"] + s["devlog"]) / s["stock_qemu_log"]
    yes = lambda ok: "yes" if ok else "no"  # noqa: E731
    lines = [
        "## Record and exact replay",
        "",
        f"Command: `./tandem bench` (runs `bench/record_replay.py --runs {args.runs}`). "
        f"Workload: boot the demo guest to TANDEM-READY, {ROUNDS} rounds of SET/GET from two "
        "Python clients, a SYNC, one `nc` session, serial `poweroff`. Wall time from QEMU "
        f"start to exit, median of {args.runs} interleaved rounds, TCG on this 2-core machine. "
        "\"stock\" is QEMU 10.0 built from the same Debian source with the same device set "
        "and none of tandem's code patches (`qemu-patches/stock-series`).",
        "",
        "| target | measured | met |",
        "|---|---|---|",
        f"| tandem record <= 1.10x `-icount` alone | {rec:.3f}x | {yes(rec <= 1.10)} |",
        f"| exact replay at least as fast as the recording | {rep:.2f}x the recording's wall time | {yes(rep <= 1.0)} |",
        f"| bundle <= 1/4 of stock QEMU's record log | 1/{1 / size:.0f} | {yes(size <= 0.25)} |",
        "",
        "| configuration | wall (s) | vs -icount alone |",
        "|---|---|---|",
    ]
    for k in ("plain", "icount", "stock-record", "tandem"):
        lines.append(f"| {k} | {med[k]:.2f} | {med[k] / med['icount']:.3f}x |")
    lines += [
        "",
        "| replay | wall (s) | vs its recording's wall |",
        "|---|---|---|",
        f"| tandem exact replay (verified) | {med['replay-tandem']:.2f} | {rep:.2f}x |",
        f"| stock rr=replay | {med['replay-stock']:.2f} | {med['replay-stock'] / med['stock-record']:.2f}x |",
        "",
        f"Bundle size (median run: {s['vm_s']:.2f} s of VM time, {s['ginsn']:.3f} G instructions):",
        "",
        "| part | bytes | per VM second | per G instructions |",
        "|---|---|---|---|",
    ]
    for label, k in (("stock QEMU's record log, same workload", "stock_qemu_log"),
                     ("tandem's log of this run in stock format (uncompressed)", "same_run_stock_format"),
                     ("tandem replay.tdrs (zstd segments)", "tdrs"),
                     ("devices.pcapng", "devlog"), ("devices.pcapng gzipped", "devlog_gz")):
        lines.append(f"| {label} | {s[k]:.0f} | {s[k] / s['vm_s']:.0f} | {s[k] / s['ginsn']:.0f} |")
    same = (s["tdrs"] + s["devlog"]) / s["same_run_stock_format"]
    lines += ["", f"tandem record log + device log = 1/{1 / size:.0f} of stock QEMU's log for the same "
              f"workload; against tandem's own events in stock format (which already lack stock "
              f"QEMU's PAUSE checkpoints) 1/{1 / same:.1f}.", ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        replace_section(args.out, text)


if __name__ == "__main__":
    sys.exit(main())
