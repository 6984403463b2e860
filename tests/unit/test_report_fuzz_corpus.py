"""Every input of the parser's fuzz corpus (tests/fuzz/report-corpus: seeds, what the fuzzer
found interesting, and every crash it found, minimized) replayed through the fuzz target:
parse() and the live Scanner in chunks, on every OS, agree and never raise.
A crash the fuzzer saves fails here until it is fixed; one listed in known-crashes.txt (in a
module another change owns) is expected to fail, and its test fails once it passes, until the
line is removed."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"
sys.path.insert(0, str(FUZZ))

from report_target import CORPUS, check  # noqa: E402

INPUTS = sorted(CORPUS.iterdir())
KNOWN = dict(line.split(None, 1) for line in (FUZZ / "known-crashes.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#"))


def _param(path: Path):
    if path.name in KNOWN:
        return pytest.param(path, marks=pytest.mark.xfail(strict=True, reason=KNOWN[path.name]))
    return path


def test_corpus_has_the_seeds():
    assert sum(p.name.startswith("seed-") for p in INPUTS) >= 100


def test_known_crashes_are_in_the_corpus():
    assert set(KNOWN) <= {p.name for p in INPUTS}


@pytest.mark.parametrize("path", [_param(p) for p in INPUTS], ids=lambda p: p.name)
def test_fuzz_input(path):
    check(path.read_bytes())
