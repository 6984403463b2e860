"""Every input of the parser's fuzz corpus (tests/fuzz/report-corpus: seeds, what the fuzzer
found interesting, and every crash it found, minimized) replayed through the fuzz target:
parse() and the live Scanner in chunks, on every OS, agree and never raise (issue 18).
A crash the fuzzer saves fails here until it is fixed."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"
sys.path.insert(0, str(FUZZ))

from report_target import CORPUS, check  # noqa: E402

INPUTS = sorted(CORPUS.iterdir())


def test_corpus_has_the_seeds():
    assert sum(p.name.startswith("seed-") for p in INPUTS) >= 100


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: p.name)
def test_fuzz_input(path):
    check(path.read_bytes())
