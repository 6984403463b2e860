#!/usr/bin/env python3
"""Benchmark: the console report parser. It runs on every analysis console, live.

1. Throughput on real consoles: syzkaller's report test data (every OS directory, each
   console parsed with its OS) and tandem's tests/report-corpus; total bytes, consoles,
   CPU time of this process (time.process_time, one core), MB/s and consoles/s, for
   report.parse() and for the live Scanner fed 4 KiB at a time; best of --runs.
2. Worst cases at 1, 2, 4 and 8 MB: one synthetic console of report headers, stack lines
   and noise, one report that never ends, one line that never ends, and short lines (also
   10 MB of them): the MB/s must stay flat (linear time).
3. Fuzzing: tests/fuzz/report_target.py (atheris, coverage-guided) for --seconds; the
   corpus keeps the fewest inputs reaching all code reached so far; crashes and slow
   inputs are minimized and saved there (the unit test replaying the corpus fails until fixed).
   Then a scaling probe: every corpus input with its lines repeated, per-byte CPU flat.

The parser measured is the `tandem` package first on sys.path: set PYTHONPATH to measure
another checkout's (`--before COMMIT` writes the figures as that commit's, a block that
later runs leave alone).

Usage: ./tandem bench report [--seconds N]
   (or: PYTHONPATH=replay python bench/report.py --seconds 60 --out docs/benchmarks.md)
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "replay"))   # after PYTHONPATH: a --before checkout comes first
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests" / "fuzz"))

from tandem import report  # noqa: E402  (before record_replay, which puts ROOT/replay first)
from tandem.report import Scanner  # noqa: E402

import fuzzing  # noqa: E402
import report_target  # noqa: E402
from record_replay import replace_part  # noqa: E402

log = logging.getLogger("bench.report")
SECTION = "report"
TITLE = """## Console report parser

The parser runs on every analysis console, live (a Scanner per console, fed as the guest
writes): its throughput bounds how much console a farm node can watch per core, and no
console may make it slower than linear or make it raise."""
PARTS = ("before", "throughput", "fuzz")
# Beside the checkout (/work/main -> /work/shared) or beside its worktrees' directory
# (/work/wt/NAME -> /work/shared): else a worktree would measure tandem's corpus only.
SYZKALLER = next((d for d in (ROOT.parent / "shared" / "syzkaller-reports",
                              ROOT.parent.parent / "shared" / "syzkaller-reports") if d.is_dir()),
                 ROOT.parent / "shared" / "syzkaller-reports")
TARGET_MBS = 50.0   # the target: at least this many MB/s on one core, corpus and adversarial inputs
CHUNK = 4096                    # the live path: a Scanner fed what one read of the console gives
MB = 1e6
SIZES_MB = (1, 2, 4, 8)
PROBE_SMALL, PROBE_LARGE = 4, 32  # line repetitions of the scaling probe (~6 s on ~400 inputs)
PROBE_SUSPECT = 2.0


# --- the consoles -----------------------------------------------------------------------

def syzkaller_console(path: Path) -> bytes:
    """The console of one syzkaller test file: after the `KEY: value` header (absent when
    the file starts with an empty line), before a trailing `REPORT:` section, no "\\r"."""
    data = path.read_bytes().replace(b"\r", b"")
    body = data[1:] if data.startswith(b"\n") else data.partition(b"\n\n")[2]
    return body.split(b"\nREPORT:\n", 1)[0]


def tandem_console(path: Path) -> bytes:
    """The console of a tests/report-corpus file (after its expected-title header)."""
    data = path.read_bytes()
    return data[1:] if data.startswith(b"\n") else data.partition(b"\n\n")[2]


def parsed_as(os_dir: str) -> str:
    """The OS a directory's consoles are parsed as: its own when the parser knows it;
    else FreeBSD's (OpenBSD and NetBSD before they had dialects: still every line scanned)."""
    return os_dir if os_dir in report.OSES else "freebsd"


def corpora(syzkaller: Path) -> list[tuple[str, str, list[bytes]]]:
    """(label, OS parsed as, consoles) for each directory measured."""
    sets = []
    if not syzkaller.is_dir():
        log.warning("%s not found: measuring tests/report-corpus only", syzkaller)
    for d in sorted(p for p in syzkaller.iterdir() if p.is_dir()) if syzkaller.is_dir() else []:
        files = sorted(p for p in d.iterdir() if p.is_file())
        sets.append((f"syzkaller {d.name}", parsed_as(d.name), [syzkaller_console(p) for p in files]))
    for d in sorted(p for p in (ROOT / "tests" / "report-corpus").iterdir() if p.is_dir()):
        files = sorted(p for p in d.iterdir() if p.is_file())
        sets.append((f"tandem {d.name}", parsed_as(d.name), [tandem_console(p) for p in files]))
    return sets


# Real report lines (Linux, FreeBSD, userland sanitizers) and noise, for the synthetic
# console: fixed here, not read from the parser, so every version is timed on the same bytes.
HEADERS = [
    "BUG: KASAN: use-after-free in tcp_v4_rcv+0x1a2/0x2f0",
    "BUG: KASAN: slab-out-of-bounds in memcpy+0x20/0x60",
    "BUG: KASAN: ???",
    "WARNING: CPU: 1 PID: 4242 at net/core/dev.c:1234 dev_queue_xmit+0x3d/0x80",
    "general protection fault, probably for non-canonical address 0xdffffc0000000001: 0000 [#1] PREEMPT SMP KASAN",
    "BUG: unable to handle page fault for address: ffffffffff600000",
    "kernel BUG at mm/slub.c:321!",
    "Kernel panic - not syncing: panic_on_warn set ...",
    "INFO: task syz-executor.0:4242 blocked for more than 143 seconds.",
    "rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:",
    "watchdog: BUG: soft lockup - CPU#0 stuck for 22s! [syz-executor:4242]",
    "WARNING: possible circular locking dependency detected",
    "UBSAN: array-index-out-of-bounds in net/ipv4/route.c:42:7",
    "BUG: KCSAN: data-race in ext4_do_update_inode / ext4_mark_iloc_dirty",
    "BUG: KMSAN: uninit-value in __skb_flow_dissect+0x100/0x200",
    "Unable to handle kernel NULL pointer dereference at virtual address 0000000000000008",
    "panic: Assertion x != NULL failed at /usr/src/sys/kern/vfs_subr.c:1234",
    "Fatal trap 12: page fault while in kernel mode",
    "lock order reversal:",
    "==4242==ERROR: AddressSanitizer: heap-use-after-free on address 0x602000000010",
    "x.c:12:3: runtime error: signed integer overflow: 2147483647 + 1 cannot be represented",
]
TRACE = ["Call Trace:", " <TASK>", " dump_stack_lvl+0x1/0x2", " tcp_v4_rcv+0x1a2/0x2f0 net/ipv4/tcp_ipv4.c:2012",
         " ? kasan_report+0x10/0x20", "RIP: 0010:dev_queue_xmit+0x3d/0x80", " </TASK>",
         "---[ end trace 0000000000000000 ]---", "=" * 66, "Modules linked in:", "#0 0xffffffff80c1 at kdb_backtrace+0x60",
         "    #1 0x4f2a in main /src/x.c:12:3", "Code: 48 89 e5 41 57 41 56 <0f> 0b"]
PREFIXES = ["", "[   12.345678] ", "[   12.345678][ T4242] ", "[   12.345678][    C1] ", "<4>[  1.000000] "]


def synthetic(size: int, seed: int = 18) -> bytes:
    """`size` bytes of console: 1 line in 10 a report header, 3 in 10 stack lines, the rest
    noise (printable text and a little binary), under printk prefixes of every kind."""
    rnd = random.Random(seed)
    out, n = [], 0
    while n < size:
        r = rnd.random()
        if r < 0.1:
            text = rnd.choice(HEADERS)
        elif r < 0.4:
            text = rnd.choice(TRACE)
        else:
            text = "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz0123456789 :[]()=-_./\x1b\xff")
                           for _ in range(rnd.randint(0, 120)))
        line = (rnd.choice(PREFIXES) + text + "\n").encode("latin-1")
        out.append(line)
        n += len(line)
    return b"".join(out)[:size]


def endless_report(size: int) -> bytes:
    """`size` bytes of one report that never ends: a KASAN header, then stack lines (a guest
    in a loop printing frames): the open report keeps every line until the console ends."""
    head = b"BUG: KASAN: use-after-free in tcp_v4_rcv+0x1a2/0x2f0\nCall Trace:\n"
    lines = b"".join(b" f%d+0x1/0x2 net/x.c:%d\n" % (i, i) for i in range(size // 20))
    return (head + lines)[:size]


def long_line(size: int) -> bytes:
    """`size` bytes of one console line the guest never ends: every report header above,
    over and over (such a line can cost a parser seconds per MB: 4.8 s measured)."""
    unit = (" ".join(HEADERS) + " ").encode("latin-1")
    return (unit * (size // len(unit) + 1))[:size]


def short_lines(size: int, seed: int = 19) -> bytes:
    """`size` bytes of lines of 0 to 8 characters of noise: the per-line cost alone."""
    rnd = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 :[]()=-_./"
    out, n = [], 0
    while n < size:
        line = ("".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 8))) + "\n").encode()
        out.append(line)
        n += len(line)
    return b"".join(out)[:size]


# (name, console of N bytes, sizes in MB): the target names a 1 MB line and 10 MB of short lines.
WORST_CASES = (("mixed", synthetic, SIZES_MB), ("one open report", endless_report, SIZES_MB),
               ("one line", long_line, SIZES_MB), ("short lines", short_lines, SIZES_MB + (10,)))


# --- timing -----------------------------------------------------------------------------

def parse_all(consoles: list[bytes], os: str) -> int:
    return sum(len(report.parse(c, os)) for c in consoles)


def scan_all(consoles: list[bytes], os: str) -> int:
    n = 0
    for c in consoles:
        scanner = Scanner(os)
        for i in range(0, len(c), CHUNK):
            n += len(scanner.feed(c[i:i + CHUNK]))
        n += len(scanner.flush())
    return n


def best_cpu(fn, runs: int) -> tuple[float, int]:
    """(least CPU seconds of `runs` calls, what the call returned)."""
    best, got = float("inf"), 0
    for _ in range(runs):
        t = time.process_time()
        got = fn()
        best = min(best, time.process_time() - t)
    return best, got


def rate(nbytes: int, n: int, cpu: float) -> str:
    return f"{cpu:.3f} | {nbytes / MB / cpu:.2f} | {n / cpu:,.0f}"


def part_throughput(syzkaller: Path, runs: int) -> list[str]:
    rows, total = [], [0, 0, 0, 0.0, 0.0]
    target: dict[str, tuple[float, float]] = {}     # input set -> (parse() MB/s, Scanner MB/s)
    for label, os_name, consoles in corpora(syzkaller):
        size = sum(map(len, consoles))
        t_parse, reps = best_cpu(lambda: parse_all(consoles, os_name), runs)
        t_scan, reps_live = best_cpu(lambda: scan_all(consoles, os_name), runs)
        assert reps_live == reps, f"{label}: the Scanner found {reps_live} reports, parse() {reps}"
        rows.append(f"| {label} | {os_name} | {len(consoles)} | {size / MB:.3f} | {reps} | "
                    f"{rate(size, len(consoles), t_parse)} | {rate(size, len(consoles), t_scan)} |")
        for i, v in enumerate((len(consoles), size, reps, t_parse, t_scan)):
            total[i] += v
    n, size, reps, t_parse, t_scan = total
    rows.append(f"| **all** | | {n} | {size / MB:.3f} | {reps} | {rate(size, n, t_parse)} | {rate(size, n, t_scan)} |")
    target["the corpus (all)"] = (size / MB / t_parse, size / MB / t_scan)
    lines = [
        "| consoles | parsed as | consoles | MB | reports | parse() CPU s | MB/s | consoles/s | "
        "Scanner 4 KiB CPU s | MB/s | consoles/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|", *rows, "",
        "Worst cases, parsed as linux: the MB/s must not fall as the console grows. *mixed*: one "
        "synthetic console, 1 line in 10 a report header of some OS, 3 in 10 stack lines, the rest "
        "noise, under every printk prefix; *one open report*: a KASAN header and then only stack "
        "lines (a report that never ends, held until the console does); *one line*: a console "
        "line the guest never ends, every header above over and over; *short lines*: lines of 0 "
        "to 8 characters of noise.", "",
        "| console | size (MB) | reports | parse() CPU s | MB/s | Scanner 4 KiB CPU s | MB/s |",
        "|---|---|---|---|---|---|---|"]
    for name, make, sizes in WORST_CASES:
        big = make(sizes[-1] * 1_000_000)
        for mb in sizes:
            console = big[:mb * 1_000_000]
            t_parse, reps = best_cpu(lambda: parse_all([console], "linux"), min(runs, 3))
            t_scan, _ = best_cpu(lambda: scan_all([console], "linux"), min(runs, 3))
            lines.append(f"| {name} | {mb} | {reps:,} | {t_parse:.2f} | {len(console) / MB / t_parse:.2f} | "
                         f"{t_scan:.2f} | {len(console) / MB / t_scan:.2f} |")
            if (name, mb) in (("one line", 1), ("short lines", 10)):
                target[f"{'a 1 MB line' if mb == 1 else '10 MB of short lines'}"] = (
                    len(console) / MB / t_parse, len(console) / MB / t_scan)
    missed = [k for k, v in target.items() if min(v) < TARGET_MBS]
    lines += ["", f"The target, at least {TARGET_MBS:g} MB/s on one core (CPU time; parse() / "
              "Scanner 4 KiB): " + "; ".join(f"{k} {p:.1f} / {s:.1f}" for k, (p, s) in target.items()) +
              (f". Not met on {', '.join(missed)}." if missed else ". Met on each.")]
    return lines


def throughput_text(syzkaller: Path, runs: int, before: str | None) -> list[str]:
    parser = getattr(report, "PARSER", "pure Python")
    head = (f"**Before** (the parser at {before}, measured with `git archive {before} replay` "
            f"on PYTHONPATH, {parser}):" if before else
            f"**Now** (the parser of this checkout, {parser}: report/compiled.py):")
    if not syzkaller.is_dir():
        head += f" ({syzkaller} was not found: tandem's corpus only, not comparable with the totals above)"
    lines = [head, "", *part_throughput(syzkaller, runs)]
    return lines + (["", *both_parsers(syzkaller, runs)] if not before else [])


# --- the pure-Python parser and its mypyc build, side by side ------------------------------

def target_figures(syzkaller: Path, runs: int) -> dict:
    """The target's three figures for the parser this process imported (MB/s, parse() and the
    Scanner), and a digest of every report found on the corpora (all their fields)."""
    digest = hashlib.sha256()
    size = t_parse = t_scan = 0.0
    for _, os_, consoles in corpora(syzkaller):
        for c in consoles:
            for r in report.parse(c, os_):
                digest.update(repr(dataclasses.astuple(r)).encode())
        size += sum(map(len, consoles))
        t_parse += best_cpu(lambda: parse_all(consoles, os_), runs)[0]
        t_scan += best_cpu(lambda: scan_all(consoles, os_), runs)[0]
    out = {"parser": getattr(report, "PARSER", "pure Python"), "digest": digest.hexdigest()[:16],
           "the corpus (all)": (size / MB / t_parse, size / MB / t_scan)}
    for name, console in (("a 1 MB line", long_line(1_000_000)), ("10 MB of short lines", short_lines(10_000_000))):
        out[name] = (len(console) / MB / best_cpu(lambda: parse_all([console], "linux"), min(runs, 3))[0],
                     len(console) / MB / best_cpu(lambda: scan_all([console], "linux"), min(runs, 3))[0])
    return out


def both_parsers(syzkaller: Path, runs: int) -> list[str]:
    """The same figures for the pure-Python parser and its mypyc build, each measured in a
    process of its own (TANDEM_REPORT_PURE), one after the other; their reports must be equal."""
    got = []
    for pure in ("1", "0"):
        r = subprocess.run([sys.executable, __file__, "--figures", "--runs", str(runs), "--syzkaller", str(syzkaller)],
                           capture_output=True, text=True, check=True, env={**os.environ, "TANDEM_REPORT_PURE": pure})
        got.append(json.loads(r.stdout.splitlines()[-1]))
    pure_figures, built = got
    if built["parser"] == "pure Python":
        return ["The mypyc build: none for these sources (`./tandem build` makes it): pure Python only."]
    assert built["digest"] == pure_figures["digest"], "the compiled parser's reports differ from the pure Python one's"
    names = ("the corpus (all)", "a 1 MB line", "10 MB of short lines")
    lines = ["The parser as Python and as compiled by mypyc (report/compiled.py), each in a process "
             "of its own, MB/s parse() / Scanner 4 KiB (CPU time, one core, best of "
             f"{runs} runs); the two give the very same reports on the corpora (digest {built['digest']}).", "",
             "| parser | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for f in got:
        lines.append(f"| {f['parser']} | " + " | ".join(f"{f[n][0]:.1f} / {f[n][1]:.1f}" for n in names) + " |")
    return lines


# --- fuzzing ----------------------------------------------------------------------------

def tokens() -> list[bytes]:
    """libFuzzer tokens: the report and stack lines and printk prefixes above, and the literal
    text of the parser's start patterns, so mutations splice whole headers into consoles."""
    found = set(HEADERS) | set(TRACE) | set(PREFIXES)
    tables = [m for m in vars(report).values() if isinstance(getattr(m, "KINDS", None), (list, tuple))]
    for kind in (k for m in tables for k in m.KINDS):
        if isinstance(getattr(kind, "start", None), re.Pattern):
            # The pattern's literal runs: lookarounds, classes, escapes and quantifiers out,
            # each alternative a token of its own.
            text = re.sub(r"\(\?[!=<][^)]*\)|\[[^\]]*\]|\\[dswbDSWB]|\{[\d,]*\}|\?:|[\^$()?*+]", "",
                          kind.start.pattern)
            found.update(re.sub(r"\\(.)", r"\1", t) for t in text.split("|") if len(t) >= 4)
    return [t.encode() for t in found]


def repeat_lines(data: bytes, k: int) -> bytes:
    return b"".join(line * k for line in data.splitlines(keepends=True))


def scaling_probe() -> list[str]:
    """Super-linear time that a fuzzer's timeout cannot see on inputs of a few KiB: every
    corpus input on every OS with each line repeated SMALL and LARGE times (a report with
    8x the lines, as a guest in a loop writes); per-byte CPU must not grow. A suspect
    (ratio over PROBE_SUSPECT, usually noise on inputs parsed in under a millisecond) is
    timed again at LARGE * 8 repetitions, best of 3."""
    worst, slowest, suspects, n = (0.0, "", ""), (float("inf"), "", ""), [], 0
    for path in sorted(report_target.CORPUS.iterdir()):
        data = path.read_bytes()
        if len(data) < 200:
            continue
        for os_name in report.OSES:
            small, large = repeat_lines(data, PROBE_SMALL), repeat_lines(data, PROBE_LARGE)
            t_small, _ = best_cpu(lambda: report.parse(small, os_name), 1)
            t_large, _ = best_cpu(lambda: report.parse(large, os_name), 1)
            ratio = (t_large / len(large)) / max(t_small / len(small), 1e-9)
            n += 1
            if ratio > PROBE_SUSPECT:
                big = repeat_lines(data, PROBE_LARGE * 8)
                t_big, _ = best_cpu(lambda: report.parse(big, os_name), 3)
                t_large, _ = best_cpu(lambda: report.parse(large, os_name), 3)
                ratio = (t_big / len(big)) / max(t_large / len(large), 1e-9)
                if ratio > PROBE_SUSPECT:
                    suspects.append(f"`{path.name}` on {os_name} ({ratio:.1f}x)")
            worst = max(worst, (ratio, path.name, os_name))
            slowest = min(slowest, (len(large) / MB / max(t_large, 1e-9), path.name, os_name))
    line = (f"Scaling probe: the {n} (input, OS) pairs of the corpus (inputs of 200 B or more), "
            f"each line repeated {PROBE_SMALL} and {PROBE_LARGE} times: per-byte CPU grows at most "
            f"{worst[0]:.1f}x (`{worst[1]}` on {worst[2]}; a ratio over {PROBE_SUSPECT:g} is timed "
            f"again at {PROBE_LARGE * 8} repetitions, best of 3); slowest input {slowest[0]:.2f} MB/s "
            f"(`{slowest[1]}` on {slowest[2]}). ")
    return [line + (f"Super-linear: {'; '.join(suspects)}." if suspects else "None super-linear.")]


def part_fuzz(seconds: float) -> list[str]:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return ["Fuzzing: not run (atheris is not installed in this Python; `./tandem setup` "
                "installs replay/requirements.txt)."]
    r = fuzzing.fuzz(report_target.TARGET, seconds, tokens())
    lines = [
        f"Command: `./tandem bench report{'' if seconds == 60 else f' --seconds {seconds:g}'}` "
        f"(runs `bench/report.py --seconds {seconds:g}`).", "",
        f"Fuzzing: `tests/fuzz/report_target.py` under atheris (libFuzzer, fork mode), a "
        f"{seconds:.0f} s budget, inputs up to {report_target.TARGET.max_len} B, each parsed on every OS of "
        f"`report.OSES` ({', '.join(report.OSES)}) whole and in random chunks by the live Scanner: "
        f"{r.execs:,} inputs run ({r.rate:,.0f}/s, instrumented), coverage {r.cov} edges, {r.ft} "
        f"features. tests/fuzz/report-corpus (the seeds, then the fewest inputs reaching all the "
        f"code the fuzzer has reached, libFuzzer `-merge=1`): {r.added} input(s) added, {r.dropped} "
        f"made redundant and dropped ({r.before} files before, {r.after} after).", ""]
    if r.found:
        lines += [f"Found {len(r.found)}, saved (minimized) in tests/fuzz/report-corpus: " +
                  "; ".join(f"`{n}` ({s})" for s, n in r.found.items()) + "."]
    else:
        lines += ["Found nothing new: no new exception, no disagreement between parse() and the "
                  f"Scanner, no input slower than {report_target.TARGET.timeout_s} s."]
    lines += ["", *scaling_probe()]
    if r.known:
        lines += ["", "Known crashes still in the corpus (not fixed yet): " +
                  "; ".join(f"`{n}` ({s}{', met again' if s in r.again else ''})" for s, n in r.known.items()) + "."]
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60, help="fuzzing budget")
    ap.add_argument("--runs", type=int, default=5, help="throughput: best of this many runs")
    ap.add_argument("--only", action="append", choices=("throughput", "fuzz"), help="run only this part")
    ap.add_argument("--before", metavar="COMMIT", help="write the throughput as COMMIT's 'before' figures")
    ap.add_argument("--syzkaller", type=Path, default=SYZKALLER, help="syzkaller-reports directory")
    ap.add_argument("--out", type=Path, help="replace this benchmark's blocks in this markdown file")
    ap.add_argument("--figures", action="store_true", help=argparse.SUPPRESS)   # both_parsers()' child
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    if args.figures:
        print(json.dumps(target_figures(args.syzkaller, args.runs)))
        return 0
    print(f"parser: {Path(report.__file__).parent} ({getattr(report, 'PARSER', 'pure Python')})", file=sys.stderr)
    only = args.only or ["throughput", "fuzz"]
    parts: dict[str, list[str]] = {}
    if "throughput" in only:
        command = (f"`mkdir /tmp/before && git archive {args.before} replay | tar -x -C /tmp/before && "
                   "PYTHONPATH=/tmp/before/replay python bench/report.py --only throughput "
                   f"--runs {args.runs} --before {args.before} --out docs/benchmarks.md`" if args.before else
                   f"`./tandem bench report{' --only throughput' if only == ['throughput'] else ''}` (runs "
                   f"`bench/report.py{' --only throughput' if only == ['throughput'] else f' --seconds {args.seconds:g}'} "
                   f"--runs {args.runs}`)")
        body = [f"Command: {command}. CPU time of the benchmark process (`time.process_time`) on one "
                f"core, best of {args.runs} runs; MB = 10^6 bytes. The machine (2 cores) is shared "
                f"(load average {os.getloadavg()[0]:.1f} when this was measured); before and now are "
                "each the best of their runs. *parsed as*: the directory's own OS where "
                "`report.OSES` has it, else freebsd (OpenBSD and NetBSD before they had a dialect: "
                "every line is still scanned). The Scanner is checked to find as many reports as "
                "parse().", "", *throughput_text(args.syzkaller, args.runs, args.before)]
        parts["before" if args.before else "throughput"] = body
    if "fuzz" in only and not args.before:
        # atheris guides its mutations by the Python code each input runs: none in a compiled module
        os.environ["TANDEM_REPORT_PURE"] = "1"
        parts["fuzz"] = part_fuzz(args.seconds)
    for part, body in parts.items():
        print("\n".join(body) + "\n")
        if args.out:
            replace_part(args.out, SECTION, TITLE, PARTS, part, "\n".join(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
