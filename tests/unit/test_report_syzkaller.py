"""tandem's titles against syzkaller's, on syzkaller's own report test data.

`../shared/syzkaller-reports/` (its README: format, licence, commit) holds half of
syzkaller's Linux consoles and all its BSD ones, each with the title syzkaller's parser
gives it. The test prints how often tandem finds a report where syzkaller does, finds
none where it finds none, and gives its title (or an ALT), and fails below the targets
(98% found, no false positive, 95% of titles) or below the floors: the figures
reached so far, so a change can only move them up.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers import SHARED
from tandem import report

# (found, false positives at most, titles agreeing): the figures reached, a ratchet.
# The targets hold for every OS: 98% found, no false positive, 95% of titles.
FLOORS = {"linux": (356, 0, 356), "freebsd": (16, 0, 16), "openbsd": (42, 0, 42),
          "netbsd": (12, 0, 12)}
TARGET_FOUND, TARGET_TITLES = 0.98, 0.95


@dataclass
class Console:
    name: str
    title: str | None
    alts: list[str]
    text: bytes


@dataclass
class Score:
    have: int = 0
    found: int = 0
    agree: int = 0
    false_positives: list[str] = field(default_factory=list)
    differ: list[tuple[str, str, str | None]] = field(default_factory=list)


def load(path: Path) -> Console:
    """A corpus file: `KEY: value` lines to the first empty line, then the console; a
    trailing `REPORT:` section is syzkaller's extract, not console."""
    raw = path.read_bytes().replace(b"\r", b"")
    head, _, body = raw.partition(b"\n\n")
    meta = defaultdict(list)
    for line in head.decode(errors="replace").splitlines():
        key, _, value = line.partition(":")
        meta[key.strip()].append(value.strip())
    # An empty "TITLE:" is no title: syzkaller's report_test.go reads it as "no report".
    return Console(path.name, (meta.get("TITLE") or [""])[0] or None, meta.get("ALT", []),
                   body.split(b"\nREPORT:\n", 1)[0])


def score(os_dir: str, os: str) -> Score:
    s = Score()
    for path in sorted((SHARED / os_dir).iterdir(), key=lambda p: p.name):
        c = load(path)
        reps = report.parse(c.text, os)
        if c.title is None:
            if reps:
                s.false_positives.append(f"{c.name}: {reps[0].title}")
            continue
        s.have += 1
        if not reps:
            s.differ.append((c.name, c.title, None))
            continue
        s.found += 1
        if reps[0].title == c.title or reps[0].title in c.alts:
            s.agree += 1
        else:
            s.differ.append((c.name, c.title, reps[0].title))
    return s


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} (the project's shared data) is not beside this clone")
@pytest.mark.parametrize("os", sorted(FLOORS))
def test_titles_against_syzkaller(os, capsys):
    s = score(os, os)
    with capsys.disabled():
        print(f"\n{os}: {s.found}/{s.have} reports found ({s.found / s.have:.1%}), "
              f"{s.agree}/{s.have} titles as syzkaller's ({s.agree / s.have:.1%}), "
              f"{len(s.false_positives)} false positives")
    assert s.found >= TARGET_FOUND * s.have and not s.false_positives and s.agree >= TARGET_TITLES * s.have, (
        s.false_positives, s.differ[:20])
    found, fp, agree = FLOORS[os]
    assert s.found >= found and len(s.false_positives) <= fp and s.agree >= agree, (
        s.false_positives, s.differ[:20])
