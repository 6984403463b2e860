"""Cut a console into reports, incrementally: the same code serves parse() and live consoles."""
from __future__ import annotations

import re
import types
from collections import deque
from dataclasses import dataclass, field
from itertools import compress

from .console import Line, decode, make_line, readable
from .dialects import _COMMON, dialect, rare_tail
from .kind import Kind
from .model import USERLAND_TYPES, Report
from .needles import needles as _needles

# A panic this close after a report is that report's aftermath (panic_on_warn, Fatal exception).
TAIL_LINES = 30
# A console line longer than this (the guest never ends it) is cut into lines of this
# length: the scanner's memory stays bounded whatever the guest writes. No kernel report
# line comes near it (the longest in syzkaller's corpus is under 1 KiB).
MAX_LINE = 64 * 1024
# printk's note that the line before was cut and is printed again.
REPLAYED = "** replaying previous printk message **"
# A report cut by a later report of its own task (printk caller ids) still reads its
# task's next lines for its title, as syzkaller does, up to its end marker or this
# many lines, and so does a report whose title lacks lines at its end marker (up to
# the next report); at most READERS reports read at once (the oldest is then described).
READ_LINES = 1000
READERS = 8
# ... and for at most this many console lines of any task: a live run gives out a report
# only once every report before it is described, so a report whose task never prints
# again must not hold back every finding after it until the console ends. (No report of
# the shared half of syzkaller's corpus reads on over more than a few hundred lines.)
WAIT_LINES = 5000
# A report with no end marker ends at the next report: the guest may never print one.
# Its text is bounded here (the longest in the shared half of syzkaller's corpus has 261 lines).
MAX_REPORT_LINES = 20000
# Inside an open report, the lines up to the next one that may matter (see _bulk) are taken
# as a run: this many characters at most per run, so that a search for that line never
# reads much further than the lines it takes.
BULK_CHARS = 256 * 1024

# A console line inside a run (_bulk): its printk or msgbuf prefix with the printk caller
# id in it, and its text; make_line()'s rules in one pattern, run over many lines in one
# call (9 ns a character, where a line at a time cost 2 us a line). A run's "\r"s are only
# before newlines (a "\r" inside a line makes the line one that may matter): stripped after.
# Each optional group is written "(?:X|)", not "(?:X)?": the same greedy choice, but `re`
# runs an optional group through its general repeat machinery and a branch without it:
# the run's split 19.4 -> 11.4 ms on the corpus's 45,253 run lines (the same rows).
_ROW = re.compile(r"^((?:<\d+>|)\[ *\d+\.\d+\](?:\[ *([CT]\d+)\]|) ?|\[\d+\] |)(.*)", re.M)


# Characters rarer than _COMMON's in the lines of syzkaller's reports, most frequent first
# (counted over the corpus's 2.9 MB of run lines: "D" 2,643 times, "W" 208).
_RARER = "DzXq=AG<LEBO#FUN\rM}{YHjV'QW"


def _compiled() -> bool:
    """Whether this module runs compiled by mypyc (its functions are then not Python's)."""
    return not isinstance(_compiled, types.FunctionType)


class _Anchor:
    """One character of _Quiet's search and the texts it is the rarest character of."""

    def __init__(self, char: str):
        self.char = char
        self.ats: list[int] = []        # where in each text it is
        self.peeks: list[int] = []      # an offset from it, in each text, of another character...
        self.peeked: list[str] = []     # ... and that character: tested before the whole text
        self.texts: list[str] = []


class _Quiet:
    """The search for the first line of a run that holds one of `texts` (none holds a
    newline), or "\r" before anything but a newline. One `re` alternation of the texts
    cost 3.8 ns a character: `re` tests every character against the set of the texts'
    first characters through a generic set test, then tries the branches. Here each
    text is looked for by its rarest character (its anchor) with str.find (memchr, which
    mypyc calls directly) and checked where one is; the texts that share an anchor share
    its search, and each search stops at the first text found so far."""

    def __init__(self, texts: list[str]):
        rank = {c: i for i, c in enumerate(_COMMON + _RARER)}
        by_char: dict[str, _Anchor] = {"\r": _Anchor("\r")}
        for text in dict.fromkeys(texts):
            at = max(range(len(text)), key=lambda k: (rank.get(text[k], len(rank)), -k))
            anchor = by_char.setdefault(text[at], _Anchor(text[at]))
            peek = at + 1 if at + 1 < len(text) else max(0, at - 1)
            anchor.ats.append(at)
            anchor.peeks.append(peek - at)
            anchor.peeked.append(text[peek])
            anchor.texts.append(text)
        # rarest first: their searches are long and find little; the frequent ones' are
        # then bounded by what those found
        self.anchors = sorted(by_char.values(), key=lambda anchor: -rank.get(anchor.char, len(rank)))
        self.fallback = re.compile("|".join([*(re.escape(text) for text in texts), r"\r[^\r\n]"]))
        # as Python (not compiled: tandem.report's fallback) the loop over anchors costs
        # more than it saves: the corpus 31.8 -> 21-25 MB/s; there the alternation only
        self.by_anchor = _compiled()

    def first_line(self, buf: str, i: int, stop: int) -> int:
        """The start of the first line of buf[i:stop] (lines) that holds a text, or `stop`.
        Searched a window at a time, each twice the last: a text is most often a few lines
        on, and an anchor that is not there must not be looked for to `stop` (BULK_CHARS on).
        An anchor found where no text is, too often (a guest's line of "u"s), has the rest
        searched by the alternation: time stays linear, at most about twice its."""
        if not self.by_anchor:
            m = self.fallback.search(buf, i, stop)
            return buf.rfind("\n", i, m.start()) + 1 if m else stop
        budget = 64 + (stop - i) // 32     # anchors that start no text, before the fallback
        lo, width = i, 2048
        while lo < stop:
            end = min(stop, lo + width)     # the first anchor of a text found so far, or the window's end
            found = False
            for anchor in self.anchors:
                k = buf.find(anchor.char, lo, end)
                while k >= 0:
                    if self._holds(buf, k, anchor, i, stop):
                        end, found = k, True
                        break
                    budget -= 1
                    if budget < 0:
                        m = self.fallback.search(buf, buf.rfind("\n", i, lo) + 1, stop)
                        return buf.rfind("\n", i, m.start()) + 1 if m else stop
                    k = buf.find(anchor.char, k + 1, end)
            if found:
                return buf.rfind("\n", i, end) + 1
            lo, width = end, width * 2
        return stop

    @staticmethod
    def _holds(buf: str, k: int, anchor: _Anchor, i: int, stop: int) -> bool:
        """Whether one of `anchor`'s texts has it at buf[k] (within buf[i:stop]). (find over
        the text's own span: mypyc calls str.find directly, startswith with offsets as a
        Python method.)"""
        if not anchor.texts:     # "\r"
            return k + 1 < stop and buf[k + 1] != "\r" and buf[k + 1] != "\n"
        for n in range(len(anchor.texts)):
            start = k - anchor.ats[n]
            text = anchor.texts[n]
            peek = k + anchor.peeks[n]
            if start >= i and start + len(text) <= stop and buf[peek] == anchor.peeked[n] \
                    and buf.find(text, start, start + len(text)) == start:
                return True
        return False


@dataclass
class _Open:
    kind: Kind
    texts: list[str]            # its lines' texts (prefixes stripped), its first line's first
    start: int                  # offset of its first line
    end: int                    # offset just past its last line
    ctx: str
    absorbed: set[str] = field(default_factory=set)
    in_trace: bool = False
    nmi: bool = False           # "Sending NMI from CPU" seen: other CPUs' lines are ours too
    cut: str | None = None      # why its text ended, once it has
    more: list[str] = field(default_factory=list)  # lines after its text, for its title only
    report: Report | None = None    # once described
    ended: bool = False         # past its end marker, its title reads on to the next report
    waited: int = 0             # console lines seen since it began to read on (WAIT_LINES)


class Scanner:
    """Feed console output as it arrives; get each report once it is complete.

    A report is complete at its end marker, at the start of the next report, or
    at flush(); one whose title still reads later lines of its context (see
    READ_LINES, WAIT_LINES) is given out once it has, and the reports after it wait for it.
    Offsets count bytes from the first byte ever fed.
    """

    def __init__(self, os: str = "linux"):
        self.os = os
        self._dialect = dialect(os)
        self._buf = ""          # undecoded remainder: a partial last line
        # No header token starts in _buf before this offset: a line the guest never ends,
        # fed 4 KiB at a time, is searched once, not again from its start per read (which
        # held one 1 MB line to 45 MB/s).
        self._clean = 0
        self._pos = 0           # offset of _buf[0]
        self._open: _Open | None = None
        self._since_end = TAIL_LINES + 1
        # Reports whose text has ended, in order; a report is given out once it and all
        # before it are described. _readers: those whose titles still read lines.
        self._queue: deque[_Open] = deque()
        self._readers: list[_Open] = []
        # The two speed-ups, each a pass over many lines where _line() takes one at a time;
        # tests set them False to check them against line-at-a-time (the class is compiled
        # by mypyc: its methods cannot be patched or overridden from Python).
        self._skip_lines = True     # _skip(): lines that start no report, no report open
        self._runs = True           # _bulk(): an open report's lines that only it keeps

    @property
    def pending_start(self) -> int:
        """Offset of the first byte a report still to come may start at."""
        starts = [r.start for r in self._readers[:1]]
        starts += [self._open.start] if self._open else []
        return min(starts, default=self._pos)

    def feed(self, data: bytes | str) -> list[Report]:
        """Reports completed by `data`. Lines are cut in one pass over the buffer (a slice of
        the rest per line made an 8 MB console cost 23 s of CPU, 4x for 2x the input)."""
        buf = self._buf + decode(data)
        i = 0
        while True:
            if self._open is None:
                if not self._readers and self._skip_lines:
                    i = self._skip(buf, i)     # lines no report reads and none starts
            elif not self._readers and self._runs:
                i = self._bulk(self._open, buf, i)     # lines a report only keeps or leaves out
            nl = buf.find("\n", i, i + MAX_LINE)
            if nl < 0:
                if len(buf) - i < MAX_LINE:
                    break
                nl = i + MAX_LINE - 1      # a line the guest never ends: cut it here
            raw = buf[i:nl + 1]
            self._line(make_line(raw, self._pos, self._pos + len(raw)))
            self._pos += len(raw)
            i = nl + 1
        self._buf = buf[i:]
        self._clean = max(0, self._clean - i)
        return self._ready()

    def _skip(self, buf: str, i: int) -> int:
        """The start of the first line from `i` (a line start) that may start a report:
        one search of the buffer for the dialect's header tokens, where a line at a time
        (cut, prefix stripped, every kind's pattern tried) cost 100x as much on 10 MB of
        short lines (3.1 s of CPU, now 0.03 s). Only with no report open or reading: then
        a line that starts none is only counted, as _line() would have (the count only
        matters up to TAIL_LINES)."""
        m = self._dialect.may_start.search(buf, max(i, self._clean))
        # a token may start in the last characters and end in the next read
        self._clean = max(self._clean, m.start() if m else len(buf) - self._dialect.longest + 1)
        if m is None:
            nl = buf.rfind("\n", i)
            to = i if nl < 0 else nl + 1
            to += (len(buf) - to) // MAX_LINE * MAX_LINE    # a line never ended is cut
        else:
            nl = buf.rfind("\n", i, m.start())
            to = i if nl < 0 else nl + 1
            to += (m.start() - to) // MAX_LINE * MAX_LINE
        if to > i:
            self._since_end += self._lines_in(buf, i, to)
            self._pos += to - i
        return to

    def _quiet(self, kind: Kind) -> _Quiet | None:
        """What a line of the open report of `kind` holds when _line() would do more than
        keep it or leave it out (None: every line may): a header token (another report,
        or one this one absorbs), its end marker's text, a stack's start or end, the NMI
        note, a "\r" or a prefix form make_line() looks for; built once per kind."""
        cache = self._dialect.__dict__.setdefault("quiet", {})
        if id(kind) not in cache:
            needles = _needles(kind.end) if kind.end is not None else ()
            if needles is None or kind.continues is not None:
                cache[id(kind)] = None
            else:
                needles += ("Call Trace:", "<TASK>", "</TASK>") if kind.task_end else ()
                needles += ("Sending NMI from CPU",) if kind.strict_context else ()
                needles += ("login: ", "**")   # " login: ", "** ": a space first costs 1.6x
                cache[id(kind)] = _Quiet([rare_tail(t) for t in (*self._dialect.texts, *needles)])
        return cache[id(kind)]

    def _bulk(self, cur: _Open, buf: str, i: int) -> int:
        """Inside an open report (none reading on), take the lines from `i` (a line start)
        up to the next that holds what _quiet() names, as _line() would have: each is
        starts no report and ends none, so it is only kept or left out by its printk
        context. One search and one pass of _ROW over the run, where a line at a time
        (cut, stripped, every header token searched, kept, end checked) cost 2 us a line:
        83% of the lines of syzkaller's consoles are inside reports. Returns where the
        lines _line() must see (or a partial last line) start; `cur` is the open report."""
        if len(cur.texts) < 2:
            return i       # the header's reprint (REPLAYED) may follow it
        quiet = self._quiet(cur.kind)
        if quiet is None:
            return i
        # complete lines only: a line still being written is not searched again per read
        stop = buf.rfind("\n", i, min(len(buf), i + BULK_CHARS)) + 1
        if stop <= i:
            return i
        to = quiet.first_line(buf, i, stop)
        if to <= i:
            return i
        run = buf[i:to]
        room = MAX_REPORT_LINES - 1 - len(cur.texts)     # then _line() closes the report
        # (lines counted only when there may be more than room: a count per run would be 2%
        # of the parser's CPU on the corpus)
        lines = run.count("\n") if len(run) > room else 0
        if lines > room or len(run) >= MAX_LINE:
            # a run takes no line _line() would cut, nor the line that ends the report at
            # MAX_REPORT_LINES: it ends before them (returning without taking a line made
            # every line search again to the same place: quadratic)
            parts = run.split("\n")[:min(lines, room)]
            if parts and max(map(len, parts)) >= MAX_LINE:
                parts = parts[:next(j for j, part in enumerate(parts) if len(part) >= MAX_LINE)]
            if not parts:
                return i
            to = i + sum(map(len, parts)) + len(parts)
            run = buf[i:to]
        rows: list | None = None
        if run.startswith(("[", "<")) or "\n[" in run or "\n<" in run:
            rows = _ROW.findall(run)       # a row a line (`.` takes all but "\n"), one empty after
            rows.pop()
            raw = [row[2] for row in rows]
            ctxs = [caller or ("kernel" if prefix else "") for prefix, caller, _ in rows]
        else:
            # No line of the run has a prefix (each starts with "[" or "<"): its lines are its
            # texts, split 6x as fast as by _ROW (a quarter of the corpus's run bytes).
            raw = run.split("\n")
            raw.pop()
            ctxs = [""] * len(raw)
        texts = [t.rstrip("\r") for t in raw] if "\r" in run else raw
        keep = self._kept(cur, ctxs, texts)
        if keep is None:
            cur.texts += texts
            cur.end = self._pos + len(run)
        elif any(keep):
            last = len(keep) - 1 - keep[::-1].index(True)
            cur.texts.extend(compress(texts, keep))
            # the lines after the last kept one: a prefix, a text ("\r"s in it) and a newline each
            after = sum(len(t) + 1 for t in raw[last + 1:])
            cur.end = self._pos + len(run) - after - (sum(len(row[0]) for row in rows[last + 1:]) if rows else 0)
        self._pos += len(run)
        return to

    @staticmethod
    def _kept(cur: _Open, ctxs: list[str], texts: list[str]) -> list[bool] | None:
        """Which lines of a run are the open report's (_ours()), or None: all of them;
        `ctxs`: their printk contexts."""
        ctx = cur.ctx
        if cur.kind.strict_context:
            drop = cur.kind.drop_line
            if drop is None and ctxs.count(ctx) == len(ctxs):
                return None
            nmi = cur.nmi
            return [(c == ctx or (nmi and c.startswith("C"))) and not (c and drop and drop(t))
                    for c, t in zip(ctxs, texts)]
        if ctx in ("", "kernel"):
            return None
        return [c in (ctx, "") for c in ctxs]

    @staticmethod
    def _lines_in(buf: str, i: int, to: int) -> int:
        """How many lines (cut as feed() cuts them) buf[i:to] holds, or at least TAIL_LINES + 1."""
        if buf.count("\n", i, to) > TAIL_LINES:
            return TAIL_LINES + 1
        n = 0
        while i < to:
            nl = buf.find("\n", i, min(to, i + MAX_LINE))
            i = nl + 1 if nl >= 0 else i + MAX_LINE
            n += 1
        return n

    def flush(self) -> list[Report]:
        if self._buf:
            raw, self._buf, self._clean = self._buf, "", 0
            self._line(make_line(raw, self._pos, self._pos + len(raw)))
            self._pos += len(raw)
        if self._open:
            self._close(None)
        while self._readers:
            self._describe(self._readers[0])
        return self._ready()

    def _ready(self) -> list[Report]:
        """The reports done that no report before them still waits for."""
        out: list[Report] = []
        while self._queue and self._queue[0].report is not None:
            out.append(self._queue[0].report)
            self._queue.popleft()
        return out

    def _read_titles(self, line: Line, kind: Kind | None) -> None:
        """Give a line to the reports whose titles still read their task's lines."""
        for r in list(self._readers):
            r.waited += 1
            if r.waited >= WAIT_LINES:
                self._describe(r)
            elif r.ended and not self._caller(r) and kind and not (kind.inside or kind.tail):
                self._describe(r)       # the next report: syzkaller's reads no further
            elif self._ours(r, line):
                r.more.append(line.text)
                if len(r.more) >= READ_LINES:
                    self._describe(r)
                elif not r.ended and self._ends(r, line):
                    desc = self._text_desc(r)
                    if desc.corrupted in r.kind.reread:
                        r.ended = True      # its title lacks lines: read on
                    else:
                        self._describe(r, desc)

    def _line(self, line: Line) -> None:
        starts = self._dialect.start(line.text)
        if self._readers:
            self._read_titles(line, starts)
        cur = self._open
        if cur and cur.kind.continues and not cur.kind.continues(line.text):
            self._close(None)
            cur = None
        if cur and len(cur.texts) == 1 and REPLAYED in line.text:
            self._open = cur = None     # the kernel prints the cut header line again, whole
        if cur:
            kind = starts
            continued = kind and (kind.tail or kind.inside or kind.name in cur.kind.absorbs - cur.absorbed)
            if kind and not continued and self._other_task(cur, line):
                self._close(None, aside=True)   # both are read, each in its own context
                cur = None
            elif kind and not continued:
                # syzkaller's Linux parser does not call a report cut by another corrupted
                interrupted = cur.kind.end and not cur.kind.strict_context
                self._close(f"interrupted by {kind.name}" if interrupted else None,
                            reading=line if self._caller(cur) and line.ctx == cur.ctx else None)
                cur = None
            else:
                if kind:
                    cur.absorbed.add(kind.name)
                if self._append(cur, line) and self._ends(cur, line):
                    self._close(None, at_end=True)
                elif len(cur.texts) >= MAX_REPORT_LINES:
                    self._close(None)
                return
        self._since_end += 1
        kind = starts
        if kind and not (kind.tail and self._since_end <= TAIL_LINES):
            self._open = _Open(kind, [line.text], line.start, line.end, line.ctx)
            if kind.end is None and kind.continues is None and self._ends(self._open, line):
                self._close(None)

    @staticmethod
    def _caller(cur: _Open) -> bool:
        """A report whose lines carry a printk caller id (task or CPU) and that reads them
        as syzkaller does: to its end, whatever other reports come in between."""
        return cur.kind.strict_context and cur.ctx not in ("", "kernel")

    def _other_task(self, cur: _Open, line: Line) -> bool:
        """Another task's or CPU's report does not end this one's title (syzkaller reads
        a report with caller ids to its end, whatever comes in between)."""
        return self._caller(cur) and line.ctx != cur.ctx

    def _ours(self, cur: _Open, line: Line) -> bool:
        if cur.kind.strict_context:
            if line.ctx != cur.ctx and not (cur.nmi and line.ctx.startswith("C")):
                return False
            if line.ctx and cur.kind.drop_line and cur.kind.drop_line(line.text):
                return False
            if "Sending NMI from CPU" in line.text:
                cur.nmi = True
            return True
        # With printk caller ids, another task's lines are not this report's.
        return not (cur.ctx not in ("", "kernel") and line.ctx not in (cur.ctx, ""))

    def _append(self, cur: _Open, line: Line) -> bool:
        if not self._ours(cur, line):
            return False
        cur.texts.append(line.text)
        cur.end = line.end
        return True

    def _ends(self, cur: _Open, line: Line) -> bool:
        text = line.text
        if cur.kind.end is not None and len(cur.texts) > 1 and cur.kind.end.search(text):
            return True
        if cur.kind.task_end:
            if "Call Trace:" in text or "<TASK>" in text:
                cur.in_trace = True
            elif cur.in_trace and "</TASK>" in text:
                return True
        return False

    def _close(self, corrupted: str | None, reading: Line | None = None, at_end: bool = False,
               aside: bool = False) -> None:
        """End the open report's text; describe it now, or once its title has read on
        from `reading`, the line of the report that cut it, or past its end marker
        (`at_end`) when its title lacks what comes after, or (`aside`) once its task's
        lines end while another task's report is read."""
        cur, self._open = self._open, None
        if cur is None:
            return
        self._since_end = 0
        cur.cut = corrupted
        self._queue.append(cur)
        desc = None
        if at_end and cur.kind.reread:
            desc = self._text_desc(cur)
            cur.ended = desc.corrupted in cur.kind.reread
        if reading is not None or cur.ended or aside:
            cur.more += [reading.text] if reading is not None else []
            if len(self._readers) >= READERS:
                self._describe(self._readers[0])
            self._readers.append(cur)
        else:
            self._describe(cur, desc)

    @staticmethod
    def _text_desc(cur: _Open):
        texts = cur.texts + cur.more
        return cur.kind.describe(texts, cur.ctx) if cur.kind.with_context else cur.kind.describe(texts)

    def _describe(self, cur: _Open, desc=None) -> None:
        if cur in self._readers:
            self._readers.remove(cur)
        if desc is None:
            desc = self._text_desc(cur)
        corrupted = cur.cut
        cur.more = []
        cur.report = Report(os="userland" if desc.type in USERLAND_TYPES else self.os, type=desc.type, title=desc.title,
                      frames=desc.frames, text=readable("\n".join(cur.texts)),
                      start=cur.start, end=cur.end,
                      corrupted=bool(corrupted or desc.corrupted),
                      corrupted_reason=corrupted or desc.corrupted or "")
