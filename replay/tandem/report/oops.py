"""A table-driven report describer: oops headers with ordered title formats and stack specs.

The model is syzkaller's pkg/report (report.go: oops, oopsFormat, stackFmt,
extractDescription, extractStackFrame, dynamicTitleReplacement; google/syzkaller
commit 1e72964b, Apache-2.0), expressed as Python tables so that a title follows
the same rules as syzkaller's and deduplicates the same way. What differs, and why:

- syzkaller runs its regexes over the whole report text; here they run line by line
  (a console is the guest's: no pattern may backtrack across lines) on lines cut to
  WIDTH characters, and a title is looked for in the first TITLE_LINES lines that
  hold the header. Multi-line "report" patterns are chains of per-line steps.
- Nothing here can raise on any text: every capture a format names exists.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Callable

from .needles import lines_holding, needles
from .rustsym import demangle

# A describer looks at this many characters of a line: kernel report lines are
# under 1 KiB (syzkaller's corpus), and a bound keeps every pattern's cost bounded.
WIDTH = 1024
# Where the title may come from: the first lines that hold the oops header (the
# first of them is the report's own first line; syzkaller finds its title there
# in every corpus report).
TITLE_LINES = 50
TITLE_WIDTH = 512   # characters from the header a title pattern reads

# Go regexp placeholders of syzkaller's compile(), as Python patterns.
# ("(?:0x|)" is syzkaller's "(?:0x)?": the same greedy choice, cheaper in `re`, whose
# optional groups run through its general repeat machinery; see scanner._ROW.)
PC = r"\[<?(?:0x|)[0-9a-f]+>?\]"
FUNC = r"([a-zA-Z0-9_]+)(?:\.|\+)"
# A source location "net/core/dev.c:123". The look-behind starts a try only at a
# token's first character and the possessive [a-z]++ cannot backtrack: linear.
SRC = r"(?<![a-zA-Z0-9_/.-])([a-zA-Z0-9_/.-]+\.[a-z]++:[0-9]+)"
TASK = r"[\s\S]{0,100}?"


def compile(pattern: str) -> re.Pattern:
    """syzkaller's {{PC}}/{{FUNC}}/{{SRC}}/{{TASK}} placeholders, ASCII classes."""
    for name, value in (("{{PC}}", PC), ("{{FUNC}}", FUNC), ("{{SRC}}", SRC), ("{{TASK}}", TASK),
                        ("{{ADDR}}", "0x[0-9a-f]+")):
        pattern = pattern.replace(name, value)
    return re.compile(pattern, re.ASCII)


PARSE = "parse-stack-trace"   # a stack part: the frames of a stack trace from here


@dataclass(frozen=True)
class Step:
    """One line of a multi-line report pattern: searched in the lines after the
    previous step's line; `last` takes the line's last match (a greedy ".*X")."""
    pattern: re.Pattern
    last: bool = False


@dataclass(frozen=True)
class Stack:
    parts: tuple                               # patterns and PARSE, matched in order
    parts2: tuple = ()                         # tried when `parts` yields no frame
    skip: tuple[str, ...] = ()                 # more helpers to skip (regex, searched)
    extractor: Callable[[list[str]], tuple[str, int]] | None = None


@dataclass(frozen=True)
class Format:
    title: re.Pattern
    fmt: str                                   # "{1}": capture 1, then one per stack group
    report: tuple[Step, ...] = ()
    stack: Stack | None = None
    no_stack_trace: bool = False
    corrupted: bool = False


@dataclass(frozen=True)
class StackParams:
    stack_starts: tuple[re.Pattern, ...]
    frame_res: tuple[re.Pattern, ...]
    skip: tuple[str, ...]
    corrupted_lines: tuple[re.Pattern, ...]
    strip_prefixes: tuple[str, ...]
    skip_cache: dict = field(default_factory=dict, compare=False, hash=False)

    def any_of(self, name: str) -> re.Pattern:
        """One pattern for "any of" stack_starts or corrupted_lines (a search each, per line)."""
        if name not in self.skip_cache:
            parts = getattr(self, name)
            self.skip_cache[name] = re.compile("|".join(f"(?:{p.pattern})" for p in parts), re.ASCII)
        return self.skip_cache[name]

    def any_frame(self) -> re.Pattern | None:
        """frame_res as one pattern, when each is anchored at the line's start (then the
        first that matches there is the alternation's match: the same groups, each other
        pattern's None), else None. One search a stack line where a line no pattern
        matches (a register dump, "Code:") cost one each."""
        if "any_frame" not in self.skip_cache:
            anchored = all(p.pattern.startswith("^") for p in self.frame_res)
            self.skip_cache["any_frame"] = re.compile(
                "|".join(f"(?:{p.pattern})" for p in self.frame_res), re.ASCII) if anchored else None
        return self.skip_cache["any_frame"]

    def skip_re(self, extra: tuple[str, ...]) -> re.Pattern:
        if extra not in self.skip_cache:
            self.skip_cache[extra] = re.compile("|".join(self.skip + extra), re.ASCII)
        return self.skip_cache[extra]

    def skipped(self, extra: tuple[str, ...]) -> Callable[[str], bool]:
        """Whether a frame is a helper (skip_re), remembered for the last 2048 frames: the
        same frames recur in every report, and a search of the ~200 helper patterns took
        a sixth of the parser's CPU on syzkaller's consoles (half of them repeats)."""
        key = ("skipped", extra)
        if key not in self.skip_cache:
            self.skip_cache[key] = functools.lru_cache(maxsize=2048)(
                lambda frame, search=self.skip_re(extra).search: search(frame) is not None)
        return self.skip_cache[key]

    def strip(self, frame: str) -> str:
        """The shortest of the frame without one of the syscall prefixes."""
        if "strip" not in self.skip_cache:   # the longest prefix first: the shortest rest
            longest = sorted(self.strip_prefixes, key=len, reverse=True)
            self.skip_cache["strip"] = re.compile("|".join(map(re.escape, longest)))
        m = self.skip_cache["strip"].match(frame)
        return frame[m.end():] if m else frame


@dataclass
class Result:
    title: str = ""
    corrupted: str | None = None
    frames: list[str] = field(default_factory=list)
    format: Format | None = None


CORRUPTED_NO_FRAMES = "extracted no frames"
NO_REPORT_MATCH = "matched title but not report regexp"
FORMAT_CORRUPTED = "report format is marked as corrupted"


def extract_description(header: str, formats: tuple[Format, ...], lines: list[str], params: StackParams,
                        marks: Marks | None = None) -> Result:
    """syzkaller's extractDescription over a report's lines (its first line holds `header`);
    `marks`: those lines' Marks, when the caller has them."""
    best: Result | None = None
    best_pos: tuple[int, int] | None = None
    matched_title = False
    marks = marks or Marks(params, lines)
    holders = _header_lines(header, lines)
    for f in formats:
        pos = _title_pos(f.title, holders, lines)
        if pos is None or (best_pos is not None and pos > best_pos):
            continue
        if best_pos is not None and pos == best_pos and best is not None and best.title:
            continue
        if best_pos is None or pos < best_pos:
            best, best_pos = None, pos
        matched_title = True
        found = _report_match(f, lines, pos)
        if found is None:
            continue
        groups, start = found
        res = Result(format=f)
        if f.stack is not None:
            keys, frames, ok = extract_stack(params, f.stack, lines, start, marks)
            groups = groups + keys
            res.frames = frames
            if not ok:
                res.corrupted = CORRUPTED_NO_FRAMES
        res.title = _format(f.fmt, groups)
        best = res
    if best is None or not best.title:
        best = Result(corrupted=NO_REPORT_MATCH if matched_title else None)
        line = next((t for t in lines if header in t), "")
        best.title = line[line.find(header):] if header in line else header
    if best.corrupted is None and best.format is not None and best.format.corrupted:
        best.corrupted = FORMAT_CORRUPTED
    return best


def _format(fmt: str, groups: list[str]) -> str:
    return re.sub(r"\{(\d+)\}", lambda m: groups[int(m.group(1)) - 1] if int(m.group(1)) <= len(groups) else "",
                  fmt)


def _header_lines(header: str, lines: list[str]) -> list[tuple[int, int]]:
    """(line, column) of the header in the first TITLE_LINES lines that hold it."""
    out = []
    for i, text in enumerate(lines):
        at = text.find(header)
        if at >= 0:
            out.append((i, at))
            if len(out) >= TITLE_LINES:
                break
    return out


# Per title pattern (by id: the formats live as long as the module): whether it is
# anchored, and the literal texts one of which its every match holds (needles.needles).
_TITLES: dict[int, tuple[bool, tuple[str, ...] | None]] = {}


def _title_pos(title: re.Pattern, holders: list[tuple[int, int]], lines: list[str]) -> tuple[int, int] | None:
    info = _TITLES.get(id(title))
    if info is None:
        info = _TITLES[id(title)] = (title.pattern.startswith("^"), needles(title))
    anchored, texts = info
    for i, at in holders[:1] if anchored else holders:
        # a title starts at its header: look there (a line of repeated headers stays cheap);
        # not in a line that lacks all its texts there (most formats of a header are
        # another report's: a find says so, no search)
        line = lines[i]
        begin, end = (0 if anchored else at), at + TITLE_WIDTH
        if texts is not None and not any(line.find(t, begin, end) >= 0 for t in texts):
            continue
        m = title.search(line[:end], begin)
        if m:
            return i, m.start()
    return None


def _report_match(f: Format, lines: list[str], pos: tuple[int, int]) -> tuple[list[str], tuple[int, int]] | None:
    """The format's captures and where its match starts, or None: syzkaller's `report`
    regexp when there is one, else the title's own match."""
    if not f.report:
        i, col = pos
        m = f.title.search(lines[i][:col + TITLE_WIDTH], col)
        return ([g or "" for g in m.groups()], pos) if m else None   # found there by _title_pos
    first, *rest = f.report
    groups: list[str] = []
    start = None
    for i, text in enumerate(lines):
        m = first.pattern.search(text)
        if m:
            groups += [g or "" for g in m.groups()]
            start = (i, m.start())
            break
    if start is None:
        return None
    i = start[0]
    for step in rest:
        i += 1
        while i < len(lines):
            m = _search(step, lines[i])
            if m:
                groups += [g or "" for g in m.groups()]
                break
            i += 1
        else:
            return None
    return groups, start


def _search(step: Step, text: str) -> re.Match | None:
    if not step.last:
        return step.pattern.search(text)
    found = None
    for found in step.pattern.finditer(text):
        pass
    return found


class Marks:
    """The lines of a report that start a stack or are corrupted (params' stack_starts,
    corrupted_lines), found once per report by their literal texts (needles.lines_holding):
    a search of every line for the nine stack starts cost 0.7 us a line, a tenth of the
    parser's CPU on syzkaller's consoles."""

    def __init__(self, params: StackParams, lines: list[str]):
        self.params, self.lines = params, lines
        self._joined: str | None = None
        self._hits: dict[str, list[list[int]]] = {}
        self._found: dict[str, frozenset[int]] = {}

    def hits(self, name: str) -> list[list[int]]:
        """For each of params' `name` patterns, the indices of the lines it finds a match in."""
        if name not in self._hits:
            if self._joined is None:
                self._joined = "\n".join(self.lines)
            hits = []
            for p in getattr(self.params, name):   # each pattern on the lines holding its needles
                ns = needles(p)
                maybe = range(len(self.lines)) if ns is None else lines_holding(ns, self._joined)
                hits.append([i for i in maybe if p.search(self.lines[i])])
            self._hits[name] = hits
        return self._hits[name]

    def of(self, name: str) -> frozenset[int]:
        """Indices of the lines "any of" params' `name` patterns finds a match in."""
        if name not in self._found:
            self._found[name] = frozenset(i for hits in self.hits(name) for i in hits)
        return self._found[name]

    def at(self, name: str, start: tuple[int, int], first: str) -> frozenset[int]:
        """The lines of the text extract_stack() reads from `start` (its first line, `first`,
        cut at a column: searched itself) that match one of params' `name`, by position."""
        at = start[0]
        found = {i - at for i in self.of(name) if i > at}
        if self.params.any_of(name).search(first):
            found.add(0)
        return frozenset(found)


def extract_stack(params: StackParams, stack: Stack, lines: list[str],
                  start: tuple[int, int], marks: Marks | None = None) -> tuple[list[str], list[str], bool]:
    """syzkaller's extractStackFrame: the key frame of each stack group, the frames
    (guilty first) and whether every group gave one."""
    skip = params.skipped(stack.skip)
    marks = marks or Marks(params, lines)
    i, col = start
    text = [lines[i][col:]] + lines[i + 1:]
    tests = marks.at("corrupted_lines", start, text[0]), marks.at("stack_starts", start, text[0])
    keys, frames, ok = _extract(params, stack, stack.parts, text, skip, tests)
    if not ok and stack.parts2:
        keys, frames, ok = _extract(params, stack, stack.parts2, text, skip, tests)
    return keys, frames, ok


# Frames a Description keeps after the guilty one.
MAX_FRAMES = 64


def _key_frame(params: StackParams, stack: Stack, raw: list[str]) -> tuple[str, list[str]]:
    if not raw:
        return "", []
    if stack.extractor is None:
        stripped = [params.strip(f) for f in raw[:MAX_FRAMES]]
        return stripped[0], stripped
    stripped = [params.strip(f) for f in raw]
    frame, idx = stack.extractor(stripped)
    return (frame, [frame] + stripped[idx + 1:idx + MAX_FRAMES]) if frame else ("", [])


def _extract(params: StackParams, stack: Stack, parts: tuple, lines: list[str],
             skip: Callable[[str], bool], tests) -> tuple[list[str], list[str], bool]:
    keys: list[str] = []
    frames: list[str] = []
    raw: list[str] = []
    ok = True
    traces = 0
    pos = 0
    idx = 0
    corrupted, starts = tests       # positions in `lines`
    any_frame = params.any_frame()
    while True:
        if idx == len(parts) or (parts[idx] is PARSE and traces > 0):
            key, group = _key_frame(params, stack, raw)
            if not key:
                key, ok = "corrupted", False
            keys.append(key)
            if not frames:
                frames = group
            raw = []
        if idx == len(parts):
            break
        part = parts[idx]
        if part is PARSE:
            traces += 1
            while pos < len(lines):
                ln = lines[pos]
                if pos in corrupted:
                    ok = False
                    pos += 1
                    break
                if pos in starts:
                    pos += 1
                    break
                pos += 1
                if idx != len(parts) - 1:
                    m = parts[idx + 1].search(ln)
                    if m:
                        _append(raw, m, skip)
                        idx += 1
                        break
                if any_frame is not None:
                    m = any_frame.search(ln)
                    if m:
                        _append(raw, m, skip)
                    continue
                for fre in params.frame_res:
                    m = fre.search(ln)
                    if m:
                        _append(raw, m, skip)
                        break
        else:
            while pos < len(lines):
                ln = lines[pos]
                if pos in corrupted:
                    ok = False
                    pos += 1
                    break
                pos += 1
                m = part.search(ln)
                if m:
                    _append(raw, m, skip)
                    break
        idx += 1
    return keys, frames, ok


def _append(raw: list[str], m: re.Match, skip: Callable[[str], bool]) -> None:
    for frame in m.groups():
        if frame:
            frame = demangle(frame)
            if not skip(frame):
                raw.append(frame)


# --- titles: syzkaller's dynamicTitleReplacement and sanitizeTitle -----------------

# Each with a text it cannot match without (DIGIT: any digit): most titles hold none of
# them ("KASAN: use-after-free Read in tcp_v4_rcv"), and the search that says so cost more
# than the test (the corpus's 475 Linux titles: 5,262 substitutions, now 798; the compiled
# parser 0.0985 -> 0.0935 s). A replacement puts no digit in: a title without one keeps none.
DIGIT = "0123456789"
_REPLACEMENTS = [
    (re.compile(r"syz-executor\.?[0-9]+(?:[/:][0-9]+)?", re.ASCII), "syz-executor", "syz-executor"),
    (re.compile(r"syzkaller[0-9]+(?:[/:][0-9]+)?", re.ASCII), "syzkaller", "syzkaller"),
    (re.compile(r"([^a-zA-Z0-9])(?:0x)?[0-9a-f]{6,}", re.ASCII), r"\1ADDR", ""),
    (re.compile(r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}", re.ASCII), "IP", DIGIT),
    (re.compile(r"(\.\w+)(?::[0-9]+)+", re.ASCII), r"\1:LINE", DIGIT),
    (re.compile(r"([a-zA-Z][a-zA-Z0-9_.]+)\+0x[0-9a-z]+/0x[0-9a-z]+", re.ASCII), r"\1", "+0x"),
    (re.compile(r"CPU#[0-9]+", re.ASCII), "CPU", "CPU#"),
    (re.compile(r"(\W)(\d+)(\W|$)", re.ASCII), r"\1NUM\3", DIGIT),
    (re.compile(r"\d{7,}", re.ASCII), "NUM", DIGIT),
]
MAX_TITLE = 120
_UNPRINTABLE = re.compile(r"[^ -~]+")
_SPACES = re.compile(r"  +")
_PASSES = 8   # a replacement is repeated until nothing changes (overlaps: "0,1,2"); bounded


def stable_title(raw: str) -> str:
    """A title stable across runs: no executor numbers, addresses, IPs, line numbers,
    offsets, CPU or other numbers; printable, single-spaced, at most 120 characters."""
    text = raw[:WIDTH]
    digits = any(d in text for d in DIGIT)
    for pattern, repl, needle in _REPLACEMENTS:
        if (not digits) if needle == DIGIT else (needle != "" and needle not in text):
            continue
        for _ in range(_PASSES):
            new = pattern.sub(repl, text)
            if new == text:
                break
            text = new
    text = text[:MAX_TITLE].replace("\t", " ")
    if not (text.isascii() and text.isprintable()):    # [ -~] only
        text = _UNPRINTABLE.sub("", text)
    if "  " in text:
        text = _SPACES.sub(" ", text)
    return text.strip(" ")
