#!/usr/bin/env python3
"""Benchmark: fuzzing the readers of what tandem is handed from outside (issue 19): the
equivalence spec loader, the assertion language, the device log (pcapng), the replay
stream and the bundle's manifest. (The console parser's target runs in `./tandem bench report`, beside its throughput.)

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
import logging
import os
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
import rrstream_target  # noqa: E402
import spec_target  # noqa: E402
from record_replay import replace_part  # noqa: E402

SECTION = "fuzz"
TITLE = """## Fuzzing the readers of specs, assertions and bundles (issue 19)

A spec file, an assertion file and a bundle's device log and replay stream are input from
outside: each reader must give a result or its own one-line error, whatever the bytes. A
coverage-guided fuzzer runs each for a fixed budget; executions per second bound how much
of that input space a budget explores."""
TARGETS = {t.TARGET.name: t.TARGET for t in (spec_target, assertions_target, pcapng_target, rrstream_target,
                                                     manifest_target)}
PARTS = ("about", *TARGETS)    # one block per target: `--only NAME` leaves the others' figures


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
        r = fuzzing.fuzz(TARGETS[name], args.seconds)
        blocks[name] = paragraph(TARGETS[name], r, f"{command} --only {name}")
        print(blocks[name], file=sys.stderr)
    for part, text in blocks.items():
        print(text + "\n")
        if args.out:
            replace_part(args.out, SECTION, TITLE, PARTS, part, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
