"""The fuzz targets of the readers of specs, assertions and bundles
(tests/fuzz/*_target.py, run for a budget by `./tandem bench fuzz`):

- every input of their corpora (tests/fuzz/NAME-corpus: seeds, what the fuzzer found
  interesting, every crash it found, minimized) replayed through the target's check();
  a crash the fuzzer saves fails here until it is fixed (or is listed in
  tests/fuzz/known-crashes.txt, and then is expected to fail);
- a short fuzzing run in this process: EXAMPLES inputs per target, each a seed with 1 to
  4 random edits (fuzzing.mutate) drawn from a generator seeded by the target's name, so
  the inputs are the same on every run (no flake) and the whole stays a few seconds.
"""
from __future__ import annotations

import random
import sys
import zlib
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"
sys.path.insert(0, str(FUZZ))

import assertions_target  # noqa: E402
import fuzzing  # noqa: E402
import manifest_target  # noqa: E402
import pcapng_target  # noqa: E402
import report_target  # noqa: E402
import rrstream_target  # noqa: E402
import spec_target  # noqa: E402

TARGETS = {t.TARGET.name: t.TARGET for t in (spec_target, assertions_target, pcapng_target, rrstream_target,
                                                     manifest_target)}
# The console parser's corpus is replayed by test_report_fuzz_corpus.py; its short run is here.
SHORT = {**TARGETS, report_target.TARGET.name: report_target.TARGET}
# Inputs per target: 0.2 to 1 s each (CPU) on this 2-core machine; the console parser
# checks every input on five OSes, whole and in chunks, so it gets fewer.
EXAMPLES = {"report": 500}
KNOWN = fuzzing.known_names()


def _param(target, path: Path):
    marks = [pytest.mark.xfail(strict=True, reason=KNOWN[path.name])] if path.name in KNOWN else []
    return pytest.param(target, path, marks=marks, id=f"{target.name}/{path.name}")


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_corpus_has_seeds(name):
    assert any(p.name.startswith("seed-") for p in TARGETS[name].corpus.iterdir())


@pytest.mark.parametrize("target, path", [_param(t, p) for t in TARGETS.values() for p in sorted(t.corpus.iterdir())])
def test_corpus_input(target, path):
    target.check(path.read_bytes())


@pytest.mark.parametrize("name", sorted(SHORT))
def test_short_fuzz(name):
    target = SHORT[name]
    seeds = [p.read_bytes() for p in sorted(target.corpus.glob("seed-*"))]
    rnd = random.Random(zlib.crc32(name.encode()))
    for _ in range(EXAMPLES.get(name, 4000)):
        data = rnd.choice(seeds)
        for _ in range(rnd.randint(1, 4)):
            data = fuzzing.mutate(data, rnd, target.tokens)
        sig = fuzzing.signature(target, data)
        assert sig is None, f"{name}: {sig} on {data[:300]!r}{'...' if len(data) > 300 else ''}"
