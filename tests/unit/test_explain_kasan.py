"""explain/kasan.py over real KASAN consoles (tests/report-corpus, the syzkaller corpus),
table-driven: the offset it reads from "located N bytes inside of / to the right of" must be
the report's access address minus its region's start, both printed elsewhere in the report."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import SHARED
from tandem.explain import kasan

ROOT = Path(__file__).resolve().parents[2]
OWN = ROOT / "tests" / "report-corpus"
CORPORA = [OWN, SHARED]          # the syzkaller corpus when the project's shared data is beside the clone
CONSOLES = sorted(p for c in CORPORA if c.is_dir() for p in c.rglob("*")
                  if p.is_file() and b"The buggy address is located" in p.read_bytes())
_ADDR = re.compile(r"(?:Read|Write) of size \d+ at addr ([0-9a-f]+)")
_REGION = re.compile(r"region \[([0-9a-f]+), ([0-9a-f]+)\)")


def test_the_corpora_have_kasan_consoles():
    assert sum(OWN in p.parents for p in CONSOLES) >= 5, CONSOLES
    assert not SHARED.is_dir() or sum(SHARED in p.parents for p in CONSOLES) >= 20, CONSOLES


@pytest.mark.parametrize("path", CONSOLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_access_and_its_place_are_read(path):
    text = path.read_text(errors="replace")
    e = kasan.expected(text)
    if not _ADDR.search(text):
        # a double or invalid free (no access), or tag-based KASAN's "Read at addr" (arm64,
        # no size): not an access explain can look for
        assert e is None
        return
    assert e is not None
    assert e.kind in ("read", "write") and e.size > 0 and e.region > 0
    addr, region = _ADDR.search(text), _REGION.search(text)
    if addr and region:
        assert e.offset == int(addr.group(1), 16) - int(region.group(1), 16)
        assert e.region == int(region.group(2), 16) - int(region.group(1), 16)
    assert e.state in ("allocated", "freed", "")


def test_a_report_that_is_not_kasans_has_no_access():
    assert kasan.expected("WARNING: CPU: 0 PID: 1 at kernel/foo.c:1 foo+0x1/0x2\n") is None
