#!/usr/bin/env python3
"""Fuzz target of the console report parser: no console can crash it.

One input is a console as a guest wrote it (raw bytes, the files of report-corpus/ beside
this file). For every OS the parser knows (report.OSES, read when the target runs, so an
OS added later is fuzzed without touching this file) it is parsed whole with
report.parse() and fed to a live report.Scanner in chunks; the Scanner's reports must
equal parse()'s, field for field, none may start before the Scanner's pending_start at any
earlier point (live analyses drop the console before it), and nothing may raise. The
chunk boundaries are drawn from a generator seeded by the input's CRC-32, so a saved input
replays the same cuts: the unit test (tests/unit/test_report_fuzz_corpus.py) replays every
corpus file through check() and fails until what the fuzzer found is fixed.

Coverage-guided with atheris (libFuzzer for CPython; a manylinux wheel for Python 3.11
on x86_64, no compiler needed; pinned in replay/requirements.txt). Run by
`./tandem bench report` (bench/report.py) for a fixed budget, or by hand:

    python tests/fuzz/report_target.py -max_total_time=60 WORKDIR tests/fuzz/report-corpus
    python tests/fuzz/report_target.py --make-seeds [SYZKALLER_REPORTS_DIR]   (how seed-* were made)
"""
from __future__ import annotations

import random
import sys
import zlib
from pathlib import Path

if __name__ == "__main__":     # run by hand or by bench/report.py: tandem from this checkout
    sys.path.append(str(Path(__file__).resolve().parents[2] / "replay"))
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import fuzzing  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).resolve().parent / "report-corpus"
SYZKALLER = ROOT.parent / "shared" / "syzkaller-reports"
# Seeds: every SAMPLE-th console of each syzkaller OS dir, all of tests/report-corpus, each
# cut to SEED_BYTES around its first report, so one execution stays near a millisecond.
SAMPLE = {"linux": 6, "freebsd": 1, "openbsd": 3, "netbsd": 1}
SEED_BYTES = 2048
SEED_LEAD_LINES = 5


def chunks(data: bytes, seed: int) -> list[bytes]:
    """`data` cut at points drawn from `seed`: single bytes (a cut inside a UTF-8 character
    or between "\\r" and "\\n"), short runs, and large pieces, as a live console arrives."""
    rnd = random.Random(seed)
    if len(data) <= 256 and rnd.random() < 0.25:
        return [data[i:i + 1] for i in range(len(data))]
    cuts = sorted({rnd.randrange(len(data) + 1) for _ in range(rnd.randint(0, 24))})
    return [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]


def check(data: bytes) -> None:
    """Parse `data` on every OS, whole and in chunks. Raises what the parser raises, or
    AssertionError when the live Scanner and parse() disagree or a report is malformed."""
    from tandem import report
    seed = zlib.crc32(data)
    for k, os in enumerate(report.OSES):
        whole = report.parse(data, os)
        for rep in whole:
            assert rep.type in report.TYPES, f"{os}: type {rep.type!r} not in TYPES"
            assert rep.title and isinstance(rep.title, str), f"{os}: empty title"
            assert 0 <= rep.start <= rep.end <= len(data), f"{os}: offsets {rep.start}-{rep.end}"
        scanner, live, kept, fed = report.Scanner(os), [], 0, 0
        for piece in chunks(data, seed + k) + [None]:
            got = scanner.feed(piece) if piece is not None else scanner.flush()
            # Live analyses drop console bytes before pending_start (live.py): no report
            # completed later may start there.
            assert all(rep.start >= kept for rep in got), f"{os}: a report starts before pending_start"
            live += got
            fed += len(piece or b"")
            kept = scanner.pending_start
            assert kept <= fed, f"{os}: pending_start {kept} past the {fed} bytes fed"
        assert live == whole, f"{os}: the live Scanner's reports differ from parse()'s"


def cut(console: bytes, os: str) -> bytes:
    """At most SEED_BYTES of whole lines, from a few lines before the first report."""
    from tandem import report
    reps = report.parse(console, os if os in report.OSES else "linux")
    start = reps[0].start if reps else 0
    for _ in range(SEED_LEAD_LINES):
        start = console.rfind(b"\n", 0, max(start - 1, 0)) + 1
    piece = console[start:start + SEED_BYTES]
    return piece[:piece.rfind(b"\n") + 1] or piece


def make_seeds(syzkaller: Path = SYZKALLER) -> int:
    """Write the seed inputs into CORPUS: seed-syz-OS-NAME (syzkaller's test data, Apache-2.0,
    see tests/fuzz/README.md) and seed-tandem-OS-NAME (tests/report-corpus)."""
    CORPUS.mkdir(exist_ok=True)
    n = 0
    for os, step in SAMPLE.items():
        for path in sorted((syzkaller / os).iterdir())[::step]:
            data = path.read_bytes().replace(b"\r", b"")
            body = data[1:] if data.startswith(b"\n") else data.partition(b"\n\n")[2]
            (CORPUS / f"seed-syz-{os}-{path.name}").write_bytes(cut(body.split(b"\nREPORT:\n", 1)[0], os))
            n += 1
    for path in sorted((ROOT / "tests" / "report-corpus").glob("*/*")):
        data = path.read_bytes()
        body = data[1:] if data.startswith(b"\n") else data.partition(b"\n\n")[2]
        (CORPUS / f"seed-tandem-{path.parent.name}-{path.name}").write_bytes(cut(body, path.parent.name))
        n += 1
    print(f"{n} seeds in {CORPUS}")
    return 0


INSTRUMENT = ("tandem.report",)
TARGET = fuzzing.Target("report", check, INSTRUMENT,
                        "a console: parsed on every OS whole and by the live Scanner in chunks")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--make-seeds"]:
        sys.exit(make_seeds(*map(Path, sys.argv[2:3])))
    fuzzing.main(sys.argv, check, INSTRUMENT)
