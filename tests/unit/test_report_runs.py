"""Inside an open report the Scanner takes the lines up to the next one that may matter as
one run (Scanner._bulk): a speed-up only. Every console gives the very reports it gives
a line at a time (type, title, offsets, text, frames, corrupted), whole or in chunks."""
from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from tandem.report.scanner import MAX_LINE, MAX_REPORT_LINES, Scanner

ROOT = Path(__file__).resolve().parents[1]
OSES = ("linux", "freebsd", "openbsd", "netbsd", "userland")


def _reports(console: bytes, os: str, chunk: int | None, runs: bool = True) -> list[tuple]:
    s = Scanner(os)
    s._runs = runs
    if chunk is None:
        out = s.feed(console)
    else:
        out = [r for i in range(0, len(console), chunk) for r in s.feed(console[i:i + chunk])]
    return [dataclasses.astuple(r) for r in out + s.flush()]


def _both(console: bytes, os: str, chunk: int | None) -> tuple[list, list]:
    return _reports(console, os, chunk), _reports(console, os, chunk, runs=False)   # runs, a line at a time


KASAN = b"[   10.000000][ T100] BUG: KASAN: use-after-free in f+0x1/0x2\n[   10.000000][ T100] Call Trace:\n"
FRAME = b"[   10.000000][ T100]  g+0x1/0x2 net/x.c:1\n"
OTHER = b"[   10.000000][ T200] other task noise\n"
CONSOLES = {
    "other task's lines end runs": KASAN + (FRAME * 5 + OTHER * 3) * 20 + b"[   10.000000][ T100] " + b"=" * 30 + b"\n",
    "CRLF lines": (KASAN + FRAME * 50).replace(b"\n", b"\r\n") + b"trailing",
    "a \\r inside lines": KASAN + b"[   10.000000][ T100]  h+0x1/\r0x2\n" * 10 + FRAME * 10,
    "no prefixes and BSD uptime prefixes": b"BUG: KASAN: use-after-free in f+0x1/0x2\nCall Trace:\n" +
                                           b" g+0x1/0x2\n" * 30 + b"[12] h+0x1/0x2\n" * 30,
    "questionable frames": KASAN + b"[   10.000000][ T100]  ? kasan_report+0x1/0x2\n" * 20 + FRAME * 20,
    "a line longer than MAX_LINE": KASAN + FRAME * 10 + b"[   10.000000][ T100] " + b"x" * (MAX_LINE + 5) + b"\n" + FRAME * 10,
    "a report of more than MAX_REPORT_LINES": KASAN + FRAME * (MAX_REPORT_LINES + 50) + KASAN + FRAME,
    "a report that ends, then noise": KASAN + FRAME * 30 + b"[   10.000000][ T100] ---[ end trace 0 ]---\n" + b"noise\n" * 50,
}


@pytest.mark.parametrize("name", CONSOLES)
@pytest.mark.parametrize("chunk", [None, 4096, 7])
def test_runs_equal_line_at_a_time(name, chunk):
    console = CONSOLES[name]
    if chunk == 7 and len(console) > 100_000:
        chunk = 997
    runs, lines = _both(console, "linux", chunk)
    assert runs == lines and runs


def test_runs_equal_line_at_a_time_on_the_corpora():
    files = sorted(p for p in (ROOT / "report-corpus").rglob("*") if p.is_file())
    rnd = random.Random(19)
    for path in files:
        data = path.read_bytes()
        os = path.parent.name if path.parent.name in OSES else "linux"
        for chunk in (None, rnd.randint(1, 4096)):
            runs, lines = _both(data, os, chunk)
            assert runs == lines, (path.name, chunk)
