#!/usr/bin/env python3
"""Where the time of a fresh-check run went, as a markdown table (scripts/fresh-check.sh).

    fresh-times.py RUN_LOG NINJA_LOG TOTAL_SECONDS

RUN_LOG: the run's output, each line prefixed with the seconds since its start.
NINJA_LOG: the build directory's .ninja_log (start and end in ms of every target).
Steps run in parallel (the builds two at a time, the analyses' kernels while the demo
records), so the rows add up to more than the total.
"""
import re
import sys


def main(run_log: str, ninja_log: str, total: str) -> None:
    lines = [(int(m.group(1)), m.group(2)) for m in
             (re.match(r"\s*(\d+) (.*)", l) for l in open(run_log, errors="replace")) if m]
    rows = []
    for pat, name in ((r"installed Debian packages in (\d+) s", "Debian packages"),
                      (r"created the Python environment in (\d+) s", "Python venv")):
        for _, text in lines:
            m = re.search(pat, text)
            if m:
                rows.append((name, int(m.group(1))))
    try:
        for l in open(ninja_log):
            if l.startswith("#"):
                continue
            start, end, _, out, *_ = l.split("\t")
            rows.append((out.removesuffix(".json"), (int(end) - int(start)) // 1000))
        # A target built again by a later ninja run (a dependency, a no-op) keeps its longest.
        longest = {}
        for name, s in rows:
            longest[name] = max(s, longest.get(name, 0))
        rows = list(longest.items())
    except FileNotFoundError:
        pass
    demo = [t for t, text in lines if "1. record" in text]
    # tandem demo replays into each analysis once its kernel is built: when that was
    ready = [(m.group(2), int(m.group(1))) for _, text in lines
             for m in [re.search(r"(\d+) s since the exact replay: kernels for (.+) built", text)] if m]
    if demo:
        rows.append(("demo (record to verdict, wall)", lines[-1][0] - demo[0]))
    for names, s in ready:
        rows.append((f"  kernels for {names} built, after the exact replay", s))
    print("| step | seconds |\n|---|---:|")
    for name, s in rows:
        print(f"| {name} | {s} |")
    print(f"| **total, `./tandem demo` on a fresh root** | **{total}** ({int(total) / 60:.1f} min) |")


if __name__ == "__main__":
    main(*sys.argv[1:])
