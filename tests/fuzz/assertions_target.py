#!/usr/bin/env python3
"""Fuzz target of the assertion language: no assertion file can make the parser
raise anything but its one-line AssertionLangError, and what it accepts prints back
(AssertionSet.to_text) as text that parses to the same assertions.

One input is an assertion file's bytes (decoded as UTF-8 with replacement characters, as
parse_file refuses what is not UTF-8 before the parser sees it); symbols are not checked.
Run by `./tandem bench fuzz [--only assertions]` (bench/fuzz.py), or by hand:

    python tests/fuzz/assertions_target.py -max_total_time=60 WORKDIR tests/fuzz/assertions-corpus
    python tests/fuzz/assertions_target.py --make-seeds      (how seed-* were made)
"""
from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":     # run by hand or by bench/fuzz.py: tandem from this checkout
    sys.path.append(str(Path(__file__).resolve().parents[2] / "replay"))
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import fuzzing  # noqa: E402

INSTRUMENT = ("tandem.assertions.lang", "tandem.assertions.model")


def check(data: bytes) -> None:
    """Parse `data`; an error must be one line; what parses must print and parse back the same."""
    from tandem.assertions.lang import parse_text
    from tandem.errors import TandemError
    try:
        parsed = parse_text(data.decode(errors="replace"), "<fuzz>")
    except TandemError as e:
        assert "\n" not in str(e), f"an assertion error of {str(e).count(chr(10)) + 1} lines"
        return
    again = parse_text(parsed.to_text(), "<to_text>")
    assert [a.to_text() for a in again] == [a.to_text() for a in parsed], "to_text does not parse back the same"


TOKENS = (b"assert", b"at", b"within", b"previously", b"eventually", b"sequence", b"optional",
          b"call", b"returnfrom", b"site", b"per-thread", b"global", b"conditional", b"strict", b"guideline",
          b"==", b"||", b"_", b"0x", b"-", b"+0x10", b'"name"', b"(", b")", b",", b":",
          b"18446744073709551615", b"-9223372036854775808", b"# comment\n")
TARGET = fuzzing.Target("assertions", check, INSTRUMENT,
                        "an assertion file: parsed, then printed and parsed again", tokens=TOKENS)


def make_seeds() -> int:
    """Each assertion of guest-kernel/assertions/*.tesla alone, a seed of its own."""
    TARGET.corpus.mkdir(exist_ok=True)
    n = 0
    for path in sorted((fuzzing.ROOT / "guest-kernel" / "assertions").glob("*.tesla")):
        text = path.read_text()
        for k, piece in enumerate(text.split("\nassert ")[1:]):
            (TARGET.corpus / f"seed-{path.stem}-{k}").write_text("assert " + piece.split("\n\n")[0] + "\n")
            n += 1
    print(f"{n} seeds in {TARGET.corpus}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--make-seeds"]:
        sys.exit(make_seeds())
    fuzzing.main(sys.argv, check, INSTRUMENT)
