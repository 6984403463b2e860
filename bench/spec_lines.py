#!/usr/bin/env python3
"""Benchmark: a spec's patterns on hostile guest lines. The patterns of an
equivalence spec run on every line the guest writes, with Python's backtracking engine;
their time must stay linear in the output (docs/equivalence.md, "Patterns and long lines").

CPU time (time.process_time, one core) of the comparator's line rules (compare.kept_lines,
what semantic replay, the live comparison and the release gate apply) on:
1. one line of 1 MB of digits under `\\d+x` (ignore and mask): before the cap this was
   quadratic; the uncapped cost is measured on 4, 8 and 16 KB and extrapolated;
2. the worst a guest can do with the cap: 1 MB of lines of exactly MAX_RULED_LINE digits
   (each distinct, so the comparator's line cache does not help), under `\\d+x`, and under
   the worst anchored shape the loader accepts, `^a.*b.*c`, on lines of `abab...`.

Usage: PYTHONPATH=replay python bench/spec_lines.py [--out docs/benchmarks.md]
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "replay"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_replay import replace_section  # noqa: E402
from tandem.semantic.comparison import equivalence  # noqa: E402
from tandem.semantic.comparison.compare import kept_lines  # noqa: E402

SECTION = "spec-lines"


def cpu(fn) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def rules(**kinds):
    return equivalence.check({"serial": {k: list(v) for k, v in kinds.items()}}).rules["serial"]


def distinct_lines(total: int, length: int, kind: str) -> list[bytes]:
    """total bytes of distinct lines `length` long: all digits, or `abab...` ending in a number."""
    if kind == "digits":
        return [(f"{i:07d}".encode() + b"1" * length)[:length] for i in range(total // length)]
    return [(b"ab" * length)[:length - 8] + f"{i:08d}".encode() for i in range(total // length)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    cap = equivalence.MAX_RULED_LINE
    digit_rx = re.compile(rb"\d+x")
    uncapped = {n: cpu(lambda: (digit_rx.search(b"1" * n), digit_rx.sub(b"<*>", b"1" * n))) for n in (4000, 8000, 16000)}
    k = uncapped[16000] / 16000 ** 2
    before_1mb = k * 1e12
    line = [b"1" * 1_000_000]
    after = {kind: cpu(lambda: kept_lines(line, rules(**{kind: [r"\d+x"]}), True, {})) for kind in ("ignore", "mask")}
    worst = {}
    digits = distinct_lines(1 << 20, cap, "digits")
    abab = distinct_lines(1 << 20, cap, "abab")
    for name, lines, r in ((r"`\d+x` (ignore + mask)", digits, rules(ignore=[r"\d+x"], mask=[r"\d+x"])),
                           (r"`^a.*b.*c` (ignore)", abab, rules(ignore=[r"^a.*b.*c"]))):
        worst[name] = cpu(lambda: kept_lines(lines, r, True, {}))
    load = os.getloadavg()[0]
    text = "\n".join([
        "## Spec patterns on hostile guest lines",
        "",
        f"Command: `PYTHONPATH=replay python bench/spec_lines.py` (CPU time, one core; load average "
        f"{load:.1f} on the shared 2-core machine). A spec's patterns run on every line the guest "
        f"writes; patterns see lines of at most {cap} bytes (`equivalence.MAX_RULED_LINE`), a "
        "longer line is compared as it stands, and a pattern slower than quadratic on such a line "
        "is refused at load (docs/equivalence.md).",
        "",
        "| case | CPU |",
        "|---|---|",
        *(f"| `\\d+x` searched and substituted on one line of {n // 1000} KB of digits, no cap | {s * 1e3:.0f} ms |"
          for n, s in uncapped.items()),
        f"| the same on one line of 1 MB, no cap (quadratic: extrapolated from 16 KB) | about {before_1mb / 60:.0f} min |",
        *(f"| one line of 1 MB of digits, `\\d+x` as {kind}, with the cap | {s * 1e3:.1f} ms |"
          for kind, s in after.items()),
        *(f"| 1 MB of distinct {cap}-byte lines, {name}, with the cap | {s:.2f} s ({1 / s:.2f} MB/s) |"
          for name, s in worst.items()),
    ])
    print(text)
    if args.out:
        replace_section(args.out, text, SECTION)
    return 0


if __name__ == "__main__":
    sys.exit(main())
