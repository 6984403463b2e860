"""NetBSD kernel reports: panics, kernel assertions, LOCKDEBUG lock errors, supervisor-mode
faults, KASAN/KMSAN/UBSan.

Titles follow syzkaller's (pkg/report/netbsd.go, commit 1e72964b, Apache-2.0), which syzbot
deduplicates NetBSD bugs by. A panic is followed by its traceback and, on a kernel with DDB,
a ddb session: a report runs to "rebooting..." or the end of the console, and the headers
in that session are part of it (the kinds are `tail`).
"""
from __future__ import annotations

import re

from .frames import base_name, sanitize_title, useful
from .kind import Description, Kind, Table

# "name() at netbsd:name+0x12 [file:line]"
_FRAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*)\(\) at (?:netbsd:)?[A-Za-z_]")
_FAULT = re.compile(r"fatal (page|protection|integer divide) fault in supervisor mode")
_STOPPED_IN = re.compile(r"Stopped in ")
_TRAP_MARK = re.compile(r"^--- trap ")
_BEGIN_TRACE = re.compile(r"Begin traceback")
# LOCKDEBUG's own frames under a "lock error" panic (syzkaller's list).
_LOCK_ERROR_SKIP = re.compile(r"panic|printf|lockdebug|abort|mutex")


# The panic, trap and sanitizer machinery above the code that failed.
_MACHINERY = re.compile(r"^(?:vpanic|panic|kern_assert|snprintf|breakpoint|lockdebug_|kasan_|__asan_|"
                        r"kmsan_|__msan_|Handle|__ubsan|isAlreadyReported)")


def _frames(lines: list[str], start: int = 0) -> list[str]:
    """Useful frame names from line `start` on, a symbolized frame's repeats ([inline]) once."""
    out: list[str] = []
    for text in lines[start:]:
        m = _FRAME.match(text)
        if m and (not out or out[-1] != base_name(m.group(1))):
            out.append(base_name(m.group(1)))
    return useful(out, _MACHINERY)


def _name(text: str) -> str:
    """A frame line's function: the text before its last "(" (syzkaller's greedy capture)."""
    return text[:text.rfind("(")].strip()


def fault(lines: list[str]) -> Description:
    """"page fault in F": F where ddb stopped ("Stopped in pid N (comm) at netbsd:F+0x..")."""
    m = _FAULT.search(lines[0])
    if not m:
        return Description("FATAL_TRAP", "fault in supervisor mode", [], "no fault kind in the header")
    for i in range(1, len(lines)):
        if _STOPPED_IN.search(lines[i]):
            at = lines[i].rfind("netbsd:")
            if at >= 0:
                func = lines[i][at + len("netbsd:"):].split("+", 1)[0].split("\\", 1)[0]
                if func:
                    return Description("FATAL_TRAP", sanitize_title(f"{m.group(1)} fault in {func}"),
                                       [func] + [f for f in _frames(lines, i + 1) if f != func], None)
    # Without DDB the kernel panics ("panic: trap") and prints a traceback: the frame under
    # the "--- trap (number N) ---" marker faulted. syzkaller has no title for this.
    mark = next((i for i, t in enumerate(lines) if _TRAP_MARK.match(t)), None)
    below = _frames(lines, mark + 1) if mark is not None else []
    if below:
        return Description("FATAL_TRAP", sanitize_title(f"{m.group(1)} fault in {below[0]}"), below, None)
    return Description("FATAL_TRAP", "fault in supervisor mode", _frames(lines), "no ddb stop to name it by")


def _below_last(lines: list[str], helper: re.Pattern) -> str | None:
    """The function on the line under the last line that starts with a sanitizer frame."""
    last = max((i for i, t in enumerate(lines) if helper.match(t)), default=None)
    if last is None or last + 1 >= len(lines) or "(" not in lines[last + 1]:
        return None
    return _name(lines[last + 1]) or None


_SANITIZERS = [  # (panic message, frames it comes through, title, type)
    ("ASan: Unauthorized Access", re.compile(r"kasan|__asan"), "ASan: Unauthorized Access in {}", "KASAN"),
    ("MSan: Uninitialized", re.compile(r"kmsan|__msan"), "MSan: Uninitialized Memory in {}", "KMSAN"),
    ("UBSan: Undefined Behavior", re.compile(r"Handle|__ubsan"), "UBSan: Undefined Behavior in {}", "UBSAN"),
]
_ASSERTION = re.compile(r'panic: kernel diagnostic assertion "(.*?)"')


def panic(lines: list[str]) -> Description:
    head = lines[0][lines[0].index("panic: "):]
    if head.startswith("panic: kernel diagnostic assertion"):
        m = _ASSERTION.match(head)
        if m:
            return Description("KASSERT", sanitize_title(f"assert failed: {m.group(1)}"), _frames(lines), None)
        return Description("KASSERT", sanitize_title(head), _frames(lines), "assertion text cut")
    if head.startswith("panic: lock error"):
        begin = next((i for i, t in enumerate(lines) if _BEGIN_TRACE.search(t)), None)
        guilty = None
        if begin is not None:
            guilty = next((t for t in lines[begin + 1:] if not _LOCK_ERROR_SKIP.search(t)), None)
        func = guilty.split("(", 1)[0].strip() if guilty and "(" in guilty else ""
        if func:
            return Description("PANIC", sanitize_title(f"lock error in {func}"), [func], None)
        return Description("PANIC", sanitize_title(head), _frames(lines), "no traceback")
    for message, helper, title, type_ in _SANITIZERS:
        if message in head:
            below = _below_last(lines, helper)
            if below:
                return Description(type_, sanitize_title(title.format(below)), [below], None)
            return Description(type_, sanitize_title(head), _frames(lines), "no frame under the sanitizer's")
    return Description("PANIC", sanitize_title(head), _frames(lines), None)


def ubsan(lines: list[str]) -> Description:
    """A UBSan report that did not panic: syzkaller gives every one the same title."""
    return Description("UBSAN", "UBSan: Undefined behavior", [], None)


def _not_ours(text: str) -> bool:
    # postfix's "panic: event_init: unable to initialize" is a user program's; ddb.onpanic a sysctl.
    return "event_init: unable to initialize" in text or "ddb.onpanic:" in text


_END = re.compile(r"^rebooting\.\.\.")
KINDS = [
    Kind("supervisor-fault", re.compile(r"fault in supervisor mode"), fault, end=_END, tail=True),
    Kind("panic", re.compile(r"panic: "), panic, end=_END, tail=True),
    Kind("ubsan", re.compile(r"UBSan:"), ubsan, continues=lambda text: False),
]
# Text every line that starts a report holds (the scanner skips lines with none of it).
TOKENS = ("fault in supervisor mode", "panic: ", "UBSan:")


def start(text: str) -> Kind | None:
    if _not_ours(text):
        return None
    for kind in KINDS:
        if kind.start.search(text):
            return kind
    return None


NETBSD = Table(TOKENS, start)
