#!/usr/bin/env python3
"""Benchmark: fuzzing the readers of what tandem is handed from outside: the
equivalence spec loader, the assertion language, the device log (pcapng), the replay
stream, the bundle's manifest, and the console parser (whose target also runs in
`./tandem bench report`, beside its throughput and scaling probe).

Each target (tests/fuzz/NAME_target.py) runs under atheris (libFuzzer, fork mode) for
--seconds; the run's executions per second (instrumented), coverage and findings go into
docs/benchmarks.md. What a run finds is minimized and kept in tests/fuzz/NAME-corpus as a
regression input (tests/unit/test_fuzz_targets.py replays every corpus file and fails
until it is fixed), and the corpus is merged down to the fewest inputs reaching every
feature reached so far.

Usage: ./tandem bench fuzz [--seconds N] [--only NAME]...
   (or: PYTHONPATH=replay python bench/fuzz.py --seconds 60 --out docs/benchmarks.md)
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "replay"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests" / "fuzz"))

import assertions_target  # noqa: E402
import fuzzing  # noqa: E402
import manifest_target  # noqa: E402
import pcapng_target  # noqa: E402
import report_target  # noqa: E402
import rrstream_target  # noqa: E402
import spec_target  # noqa: E402
from record_replay import replace_part  # noqa: E402

SECTION = "fuzz"
TITLE = """## Fuzzing the readers of specs, assertions and bundles

A spec file, an assertion file, a bundle's manifest, device log and replay stream, and a
guest's console are input from outside: each reader must give a result or its own one-line
error, whatever the bytes. A
coverage-guided fuzzer runs each for a fixed budget; executions per second bound how much
of that input space a budget explores."""
TARGETS = {t.TARGET.name: t.TARGET for t in (spec_target, assertions_target, pcapng_target, rrstream_target,
                                                     manifest_target, report_target)}
PARTS = ("about", "table", *TARGETS)    # one block per target: `--only NAME` leaves the others' figures
# Each target's last run, kept so the table holds every target whatever `--only` ran.
RESULTS = ROOT / "bench" / "fuzz-results.json"


def tokens_of(name: str):
    """The console parser's dictionary is bench/report.py's (its report and stack lines)."""
    if name == "report":
        import report
        return report.tokens()
    return None


def record(name: str, r: fuzzing.Result, command: str, load: float) -> dict:
    """This run of target `name` into RESULTS; all targets' last runs."""
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    results[name] = {"seconds": r.seconds, "elapsed": round(r.elapsed, 1), "execs": r.execs,
                     "rate": round(r.rate, 1), "cov": r.cov, "ft": r.ft, "corpus": r.after,
                     "found": len(r.found), "load": round(load, 2), "command": command, "commit": commit,
                     "date": datetime.date.today().isoformat()}
    RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return results


def table(results: dict) -> str:
    """One row per target: executions per second over a fixed budget, and what they ran on."""
    rows = ["| harness | reads | execs/s | inputs | budget | corpus files | coverage (edges) | new findings "
            "| load (1 min) | measured | command |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for name, target in TARGETS.items():
        if name not in results:
            rows.append(f"| {name} | {target.what} | - | - | - | - | - | - | - | not run | "
                        f"`./tandem bench fuzz --only {name}` |")
            continue
        x = results[name]
        rows.append(f"| {name} | {target.what} | **{x['rate']:,.0f}** | {x['execs']:,} | {x['seconds']:g} s "
                    f"({x['elapsed']:.0f} s wall) | {x['corpus']} | {x['cov']} | {x['found']} | {x['load']:.1f} "
                    f"| {x['date']} at {x['commit']} | `{x['command']}` |")
    return "\n".join(rows)


def paragraph(target: fuzzing.Target, r: fuzzing.Result, command: str) -> str:
    found = ("found " + "; ".join(f"`{n}` ({s})" for s, n in r.found.items()) + ", minimized into the corpus"
             if r.found else "found nothing new")
    known = f"; known, not fixed: {', '.join(f'`{n}`' for n in r.known.values())}" if r.known else ""
    return (f"**{target.name}** (`tests/fuzz/{target.script.name}`: {target.what}; `{command}`): "
            f"{r.execs:,} inputs in {r.elapsed:.0f} s, **{r.rate:,.0f} per second**, coverage {r.cov} "
            f"edges / {r.ft} features; corpus {r.before} -> {r.after} files (+{r.added}, -{r.dropped}); "
            f"{found}{known}.")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60, help="fuzzing budget per target")
    ap.add_argument("--only", action="append", choices=sorted(TARGETS), help="run only this target")
    ap.add_argument("--out", type=Path, help="replace this benchmark's block in this markdown file")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        import atheris  # noqa: F401
    except ImportError:
        print("bench/fuzz.py: atheris is not installed in this Python; `./tandem setup` installs "
              "replay/requirements.txt", file=sys.stderr)
        return 1
    command = f"./tandem bench fuzz{'' if args.seconds == 60 else f' --seconds {args.seconds:g}'}"
    about = (f"Command: `{command}` (runs `bench/fuzz.py`; `--only NAME` runs one target and "
             "leaves the others' figures). Each target under atheris (libFuzzer, fork mode, one worker) "
             "for the budget; executions per second are wall-clock and instrumented (coverage tracing "
             f"costs most of it), on a shared 2-core machine (load average {os.getloadavg()[0]:.1f} when "
             "this was written). Corpus: tests/fuzz/NAME-corpus, seeds then the fewest inputs reaching "
             "every feature reached so far (libFuzzer `-merge=1`); a crash is minimized into it and "
             "replayed by tests/unit/test_fuzz_targets.py until fixed; the same test runs 4,000 seeded "
             "mutations per target inside `./tandem test`.")
    blocks = {"about": about}
    for name in args.only or list(TARGETS):
        print(f"fuzzing {name} for {args.seconds:g} s", file=sys.stderr)
        load = os.getloadavg()[0]
        r = fuzzing.fuzz(TARGETS[name], args.seconds, tokens_of(name))
        blocks[name] = paragraph(TARGETS[name], r, f"{command} --only {name}")
        print(blocks[name], file=sys.stderr)
        if args.out:
            blocks["table"] = table(record(name, r, f"{command} --only {name}", load))
    for part, text in blocks.items():
        print(text + "\n")
        if args.out:
            replace_part(args.out, SECTION, TITLE, PARTS, part, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
