"""Cut a console into reports, incrementally: the same code serves parse() and live consoles."""
from __future__ import annotations

from dataclasses import dataclass, field

from .console import Line, decode, make_line, readable
from .kind import Kind

# A panic this close after a report is that report's aftermath (panic_on_warn, Fatal exception).
TAIL_LINES = 30
# A console line longer than this (the guest never ends it) is cut into lines of this
# length: the scanner's memory stays bounded whatever the guest writes. No kernel report
# line comes near it (the longest in syzkaller's corpus is under 1 KiB).
MAX_LINE = 64 * 1024
# printk's note that the line before was cut and is printed again.
REPLAYED = "** replaying previous printk message **"


@dataclass
class _Open:
    kind: Kind
    lines: list[Line]
    ctx: str
    absorbed: set = field(default_factory=set)
    in_trace: bool = False
    nmi: bool = False           # "Sending NMI from CPU" seen: other CPUs' lines are ours too


class Scanner:
    """Feed console output as it arrives; get each report once it is complete.

    A report is complete at its end marker, at the start of the next report, or
    at flush(). Offsets count bytes from the first byte ever fed.
    """

    def __init__(self, os: str = "linux"):
        from . import dialect  # the OS tables import this package's modules
        self.os = os
        self._dialect = dialect(os)
        self._buf = ""          # undecoded remainder: a partial last line
        self._pos = 0           # offset of _buf[0]
        self._open: _Open | None = None
        self._since_end = TAIL_LINES + 1

    @property
    def pending_start(self) -> int:
        """Offset of the first byte a report still to come may start at."""
        return self._open.lines[0].start if self._open else self._pos

    def feed(self, data: bytes | str) -> list:
        """Reports completed by `data`. Lines are cut in one pass over the buffer (a slice of
        the rest per line made an 8 MB console cost 23 s of CPU, 4x for 2x the input)."""
        buf = self._buf + decode(data)
        out, i = [], 0
        while True:
            nl = buf.find("\n", i, i + MAX_LINE)
            if nl < 0:
                if len(buf) - i < MAX_LINE:
                    break
                nl = i + MAX_LINE - 1      # a line the guest never ends: cut it here
            raw = buf[i:nl + 1]
            out += self._line(make_line(raw, self._pos, self._pos + len(raw)))
            self._pos += len(raw)
            i = nl + 1
        self._buf = buf[i:]
        return out

    def flush(self) -> list:
        out = []
        if self._buf:
            raw, self._buf = self._buf, ""
            out += self._line(make_line(raw, self._pos, self._pos + len(raw)))
            self._pos += len(raw)
        if self._open:
            out.append(self._close(None))
        return out

    def _line(self, line: Line) -> list:
        out = []
        cur = self._open
        if cur and cur.kind.continues and not cur.kind.continues(line.text):
            out.append(self._close(None))
            cur = None
        if cur and len(cur.lines) == 1 and REPLAYED in line.text:
            self._open = cur = None     # the kernel prints the cut header line again, whole
        if cur:
            kind = self._dialect.start(line.text)
            continued = kind and (kind.tail or kind.name in cur.kind.absorbs - cur.absorbed
                                  or self._other_task(cur, line))
            if kind and not continued:
                out.append(self._close(f"interrupted by {kind.name}" if cur.kind.end else None))
                cur = None
            else:
                if kind:
                    cur.absorbed.add(kind.name)
                if self._append(cur, line) and self._ends(cur, line):
                    out.append(self._close(None))
                return out
        self._since_end += 1
        kind = self._dialect.start(line.text)
        if kind and not (kind.tail and self._since_end <= TAIL_LINES):
            self._open = _Open(kind, [line], line.ctx)
            if kind.end is None and kind.continues is None and self._ends(self._open, line):
                out.append(self._close(None))
        return out

    @staticmethod
    def _other_task(cur: _Open, line: Line) -> bool:
        """With printk caller ids, a report of another task or CPU does not end this task's
        (syzkaller reads a task's report to its end; the other report is not read)."""
        return cur.kind.strict_context and cur.ctx.startswith("T") and line.ctx != cur.ctx

    def _append(self, cur: _Open, line: Line) -> bool:
        if cur.kind.strict_context:
            if line.ctx != cur.ctx and not (cur.nmi and line.ctx.startswith("C")):
                return False
            if line.ctx and cur.kind.drop_line and cur.kind.drop_line(line.text):
                return False
            if "Sending NMI from CPU" in line.text:
                cur.nmi = True
        # With printk caller ids, another task's lines are not this report's.
        elif cur.ctx not in ("", "kernel") and line.ctx not in (cur.ctx, ""):
            return False
        cur.lines.append(line)
        return True

    def _ends(self, cur: _Open, line: Line) -> bool:
        text = line.text
        if cur.kind.end is not None and len(cur.lines) > 1 and cur.kind.end.search(text):
            return True
        if cur.kind.task_end:
            if "Call Trace:" in text or "<TASK>" in text:
                cur.in_trace = True
            elif cur.in_trace and "</TASK>" in text:
                return True
        return False

    def _close(self, corrupted: str | None):
        from . import USERLAND_TYPES, Report
        cur, self._open = self._open, None
        self._since_end = 0
        lines = cur.lines
        desc = cur.kind.describe([l.text for l in lines])
        return Report(os="userland" if desc.type in USERLAND_TYPES else self.os, type=desc.type, title=desc.title, frames=desc.frames,
                      text="\n".join(readable(l.text) for l in lines),
                      start=lines[0].start, end=lines[-1].end,
                      corrupted=bool(corrupted or desc.corrupted),
                      corrupted_reason=corrupted or desc.corrupted or "")
