"""A console is written by the guest: no console can crash the parser or the live Scanner.
Every input gives reports or none, never an exception."""
from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from helpers import SHARED
from tandem import report
from tandem.report import freebsd, linux, netbsd, openbsd, userland
from tandem.report.scanner import MAX_LINE, Scanner

CORPUS = Path(__file__).resolve().parents[1] / "report-corpus"


def _literal(pattern: str) -> str:
    """A kind's start pattern as plain text, near enough to reach its describer."""
    text = re.sub(r"\(\?[!=<][^)]*\)", "", pattern)
    text = re.sub(r"\\(.)", r"\1", text)
    return re.sub(r"[\^$\[\]()?*+|{}]|\?:", "", text)


HEADERS = sorted({_literal(k.start.pattern) for mod in (linux, freebsd, openbsd, netbsd, userland)
                  for k in getattr(mod, "KINDS", [])}) + [
    "Call Trace:", "<TASK>", "</TASK>", "RIP: 0010:", " foo+0x1/0x2", "=" * 30, "---[ end trace 0 ]---",
    "Read of size 8", "Kernel panic - not syncing: x", "panic: x", "KDB: stack backtrace:", "db> ",
    # BSD report bodies: ddb frames, trap markers, WITNESS lock lines and stacks, ddb commands
    "f() at f+0x1/frame 0x2", "--- trap 0xc, rip = 0x1 ---", " 1st 0x1 a (a, sx) @ /x/sys/y.c:1",
    " 2nd 0x2 b (b) @ x.c:2", "lock order a -> b attempted at:", "#0 0x1 at f+0x2", "#1  f+0x2",
    "f(1,2) at f+0x3", "ddb{0}> show panic", "*cpu0: x", "ddb{0}> trace", "end trace frame: 0x1",
    "Stopped at      f+0x1:", "Stopped in pid 1.1 (x) at netbsd:f+0x1:", "cpu0: Begin traceback...",
    "kasan_report() at netbsd:kasan_report+0x1", "HandleTypeMismatch() at netbsd:x", "rebooting...",
    "lock order data w1 -> w2 missing", "exclusive rwlock x r = 0 (0x1) locked @ x.c:1",
    "panic: kernel diagnostic assertion \"x\" failed: file \"/a/b.c\", line 1",
    "panic: Assertion x failed at /a/sys/b.c:1", "panic: ASan: Invalid access, 1-byte read at 0x1"]
PREFIXES = ["", "[    1.234567] ", "[ T1] ", "[   12.0][ C0] ", "login: "]
TAILS = ["", " ???", " in foo", " at x.c:1", "+0x1/0x2", ": \xff\x00", "(", " [" * 50]

line = st.builds(lambda p, h, t, junk: p + h + t + junk, st.sampled_from(PREFIXES), st.sampled_from(HEADERS),
                 st.sampled_from(TAILS), st.text(max_size=12))
console = st.lists(st.one_of(line, st.text(max_size=40)), max_size=25).map("\n".join)


@pytest.mark.parametrize("text", [
    "BUG: KASAN: ???\n", "BUG: KASAN: ???", "[  1.0] BUG: KMSAN: \n", "BUG: KFENCE: \n",
    "kernel BUG at \n", "Kernel panic - not syncing\n", "Kernel panic - not syncing"])
@pytest.mark.parametrize("os", report.OSES)
def test_headers_with_nothing_after_them(text, os):
    """What the fuzzing found: a header line its describer could not read raised."""
    for rep in report.parse(text, os):
        assert rep.title and rep.type in report.TYPES


@settings(max_examples=400, deadline=None)
@given(text=console, os=st.sampled_from(report.OSES))
def test_any_console_gives_reports_or_none(text, os):
    for rep in report.parse(text, os):
        assert rep.type in report.TYPES and rep.title
        assert 0 <= rep.start <= rep.end <= len(text.encode("utf-8", "surrogatepass"))


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=2000), os=st.sampled_from(report.OSES))
def test_any_bytes_give_reports_or_none(data, os):
    report.parse(data, os)


@settings(max_examples=150, deadline=None)
@given(text=console, os=st.sampled_from(report.OSES), cuts=st.lists(st.integers(min_value=0), max_size=12))
def test_scanner_fed_in_any_chunks_finds_what_parse_finds(text, os, cuts):
    data = text.encode("utf-8", "surrogatepass")
    points = sorted({c % (len(data) + 1) for c in cuts})
    scanner, got = Scanner(os), []
    for a, b in zip([0] + points, points + [len(data)]):
        got += scanner.feed(data[a:b])
    got += scanner.flush()
    want = report.parse(data, os)
    assert [(r.title, r.start, r.end) for r in got] == [(r.title, r.start, r.end) for r in want]


def _corpus_files() -> list[Path]:
    files = [p for d in sorted(report.OSES) if (CORPUS / d).is_dir() and d != "userland"
             for p in sorted((CORPUS / d).iterdir()) if p.is_file()]
    if SHARED.is_dir():
        files += [p for d in ("linux", "freebsd", "openbsd", "netbsd") for p in sorted((SHARED / d).iterdir())]
    return files


def _os_of(path: Path) -> str:
    """A corpus file's OS: its directory's name."""
    return path.parent.name if path.parent.name in report.OSES else "linux"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pick=st.integers(min_value=0), seed=st.integers(min_value=0, max_value=2**32))
def test_mutated_real_consoles(pick, seed):
    """A real console with lines deleted, cut, duplicated or swapped (a guest that
    interleaves or loses output) still parses."""
    files = _corpus_files()
    path = files[pick % len(files)]
    lines = path.read_bytes().split(b"\n")
    rnd = random.Random(seed)
    for _ in range(rnd.randint(1, 12)):
        if not lines:  # a short console deleted to nothing (openbsd/syz-0 has 4 lines)
            break
        i = rnd.randrange(len(lines))
        op = rnd.randrange(4)
        if op == 0:
            del lines[i]
        elif op == 1:
            lines[i] = lines[i][:rnd.randint(0, len(lines[i]))]
        elif op == 2:
            lines.insert(i, lines[rnd.randrange(len(lines))])
        else:
            j = rnd.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
    report.parse(b"\n".join(lines), _os_of(path))


@pytest.mark.parametrize("path", _corpus_files()[:400:7], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_consoles_cut_at_every_line(path):
    lines = path.read_bytes().split(b"\n")
    for k in range(0, len(lines), max(1, len(lines) // 40)):
        report.parse(b"\n".join(lines[:k]), _os_of(path))


def test_a_line_the_guest_never_ends_is_bounded():
    scanner = Scanner("linux")
    for _ in range(64):
        scanner.feed(b"x" * 16384)
    assert len(scanner._buf) < MAX_LINE
    reps = scanner.feed(b"\nBUG: KASAN: use-after-free in foo\n") + scanner.flush()
    assert [r.title for r in reps] == ["KASAN: use-after-free in foo"]


def _every_line(os: str) -> Scanner:
    """The scanner without its skip of lines no report may start or read: every line cut,
    stripped and tried, as before the skip (the reference it must agree with)."""
    scanner = Scanner(os)
    scanner._skip_lines = False
    return scanner


def _scan(make, data: bytes, os: str, points: list[int]) -> list[tuple]:
    scanner, got = make(os), []
    for a, b in zip([0] + points, points + [len(data)]):
        got += scanner.feed(data[a:b])
    got += scanner.flush()
    return [(r.type, r.title, r.start, r.end, r.corrupted, r.text) for r in got]


# Lines of the skip's hard cases: a header split by a "\r" (make_line() drops it), a
# header across the MAX_LINE cut of a line the guest never ends, blank and "\r\n" lines.
_SPLIT = st.builds(lambda h, at: h[:at] + "\r" + h[at:], st.sampled_from(HEADERS), st.integers(0, 40))
_LONG = st.builds(lambda h, back: "y" * (MAX_LINE - back) + h, st.sampled_from(HEADERS), st.integers(0, 40))
skip_console = st.lists(st.one_of(line, _SPLIT, _LONG, st.sampled_from(["", "\r", "x\r", "\r\r"]),
                                  st.text(max_size=40)), max_size=40).map("\n".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=skip_console, os=st.sampled_from(report.OSES), cuts=st.lists(st.integers(min_value=0), max_size=8))
def test_skipping_lines_changes_no_report(text, os, cuts):
    data = text.encode("utf-8", "surrogatepass")
    points = sorted({c % (len(data) + 1) for c in cuts})
    assert _scan(Scanner, data, os, points) == _scan(_every_line, data, os, points)


@pytest.mark.parametrize("path", _corpus_files()[::5], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_skipping_lines_changes_no_report_on_real_consoles(path):
    data = path.read_bytes()
    assert _scan(Scanner, data, _os_of(path), [4096]) == _scan(_every_line, data, _os_of(path), [4096])


@pytest.mark.parametrize("back", [0, 3, 100, 5000])
def test_a_header_fed_in_pieces_at_the_end_of_a_long_line(back):
    """The part of a partial line already searched is not searched again (Scanner._clean):
    a header that arrives a few bytes at a time still starts its report."""
    data = ("y" * (MAX_LINE // 2 - back) + "BUG: KASAN: use-after-free in foo\nCall Trace:\n bar+0x1/0x2\n").encode()
    assert _scan(Scanner, data, "linux", list(range(1, len(data), 7))) == _scan(_every_line, data, "linux", [])


def test_a_report_whose_task_goes_quiet_does_not_hold_back_the_live_findings():
    """A report cut by another task's report reads on for its title in its own task's lines;
    if that task never prints again, the reports after it still come out of feed() (they
    waited for flush(): a live run saw no finding at all)."""
    scanner = Scanner("linux")
    head = ["[   10.000000][ T100] BUG: KASAN: use-after-free in foo+0x1/0x2",
            "[   10.000001][ T100] Read of size 8 at addr ffff888000000000 by task a/100",
            "[   10.000002][ T200] WARNING: CPU: 0 PID: 200 at net/x.c:1 bar+0x1/0x2",
            "[   10.000003][ T200] Call Trace:", "[   10.000003][ T200]  bar+0x1/0x2",
            "[   10.000004][ T200] ---[ end trace 0000000000000000 ]---"]
    out = scanner.feed("\n".join(head) + "\n")
    for i in range(6000):
        out += scanner.feed(f"[   11.{i:06d}][ T300] noise line {i}\n")
    assert [r.title.split(" in ")[0] for r in out] == ["KASAN: use-after-free Read", "WARNING"]
