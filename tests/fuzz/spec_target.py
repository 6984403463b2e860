#!/usr/bin/env python3
"""Fuzz target of the equivalence spec loader: no spec file can make it raise
anything but its one-line TandemError.

One input is a spec file's bytes: equivalence.parse_toml() then equivalence.check() (every
value checked by type and range, every regex compiled). Run by `./tandem bench fuzz
[--only spec]` (bench/fuzz.py) for a fixed budget, or by hand:

    python tests/fuzz/spec_target.py -max_total_time=60 WORKDIR tests/fuzz/spec-corpus
    python tests/fuzz/spec_target.py --make-seeds      (how seed-* were made)
"""
from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":     # run by hand or by bench/fuzz.py: tandem from this checkout
    sys.path.append(str(Path(__file__).resolve().parents[2] / "replay"))
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import fuzzing  # noqa: E402

INSTRUMENT = ("tandem.semantic.comparison.equivalence", "tomllib")


def check(data: bytes) -> None:
    """Load `data` as a spec; a TandemError must be one line. Raises anything else."""
    from tandem.semantic.comparison import equivalence
    from tandem.errors import TandemError
    try:
        equivalence.check(equivalence.parse_toml(data, "<fuzz>"), "<fuzz>")
    except TandemError as e:
        assert "\n" not in str(e), f"a spec error of {str(e).count(chr(10)) + 1} lines"


SEEDS = {
    "kvd": (fuzzing.ROOT / "agent" / "kvd.equiv.toml").read_bytes,
    "every-key": lambda: b"""ignore_channels = ["udp"]
max_lag_ms = 5000
[serial]
ignore_kernel_lines = true
ignore = ['^kvd: open conn', '^\\\\[ *\\\\d+\\\\.\\\\d+\\\\]']
mask = ['conn \\\\d+']
reorder_window = 8
[tcp]
ignore = []
mask = ['id=[0-9a-f]{8}']
byte_ranges = [{flow = 0, start = 0, end = 8}, {flow = 1, start = 4, end = 6}]
relaxed_flow_order = true
[udp]
reorder_window = 0
""",
    "float-lag": lambda: b"max_lag_ms = 2.5e3\n",
    "inline": lambda: b"serial = {ignore = ['a|b'], mask = ['(x)+']}\ntcp = {byte_ranges = []}\n",
}
TOKENS = (b"ignore_channels", b"max_lag_ms", b"[serial]", b"[tcp]", b"[udp]", b"ignore_kernel_lines",
          b"ignore", b"mask", b"reorder_window", b"byte_ranges", b"relaxed_flow_order", b"flow", b"start",
          b"end", b"true", b"false", b"inf", b"nan", b"1e400", b"-0", b"0x7fffffffffffffff", b"[[", b"{",
          b"'''", b'"""', b"\\u0000", b"(?P<", b"{4294967296}", b"1979-05-27T07:32:00Z")
TARGET = fuzzing.Target("spec", check, INSTRUMENT, "a spec file (TOML): parsed and every value checked",
                        max_len=4096, tokens=TOKENS)


def make_seeds() -> int:
    TARGET.corpus.mkdir(exist_ok=True)
    for name, data in SEEDS.items():
        (TARGET.corpus / f"seed-{name}").write_bytes(data())
    print(f"{len(SEEDS)} seeds in {TARGET.corpus}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--make-seeds"]:
        sys.exit(make_seeds())
    fuzzing.main(sys.argv, check, INSTRUMENT)
