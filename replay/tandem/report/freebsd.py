"""FreeBSD kernel reports: panics, failed KASSERTs, fatal traps, WITNESS, KASAN/KMSAN."""
from __future__ import annotations

import re

from .frames import bsd_frame, sanitize_title, useful
from .kind import Description, Kind

# Frames of the panic and trap machinery, above the code that failed.
_SKIP = re.compile(r"^(?:db_trace_self|kdb_|vpanic|panic|trap|trap_fatal|trap_pfault|calltrap|witness_|"
                   r"_*mtx_lock|_*mtx_unlock|_*rw_|_*sx_|sx_destroy|_*lockmgr|m_copydata|m_copym)")
_KDB = re.compile(r"(?:KDB: )?stack backtrace:")


def _frames(lines: list[str]) -> list[str]:
    i = next((i for i, t in enumerate(lines) if _KDB.search(t)), 0)
    return useful([f for t in lines[i:] if (f := bsd_frame(t))], _SKIP)


def _named(type_: str, title: str, frames: list[str]) -> Description:
    if not frames:
        return Description(type_, f"{title} in corrupted", [], "no frame to name the report by")
    return Description(type_, f"{title} in {frames[0]}", frames, None)


_TRAP = re.compile(r"Fatal trap (\d+): (.*?)(?: while in (?:kernel|user) mode)?$")


def fatal_trap(lines: list[str]) -> Description:
    m = _TRAP.search(lines[0])
    # The trap number is what went wrong, not a dynamic value: keep it.
    return _named("FATAL_TRAP", f"Fatal trap {m.group(1)}: {sanitize_title(m.group(2))}", _frames(lines))


_PANIC = re.compile(r"panic: (.*)")
_ASSERT_AT = re.compile(r"(?: @ | at )(\S+\.[ch]):\d+")
_ASAN = re.compile(r"ASan: Invalid access, \d+-byte (read|write)")


def _source(path: str) -> str:
    """Build trees differ: keep the path from the source tree's "sys/" on."""
    return "sys/" + path.rsplit("/sys/", 1)[1] if "/sys/" in path else path.lstrip("/")


def panic(lines: list[str]) -> Description:
    msg = _PANIC.search(lines[0]).group(1).strip()
    if msg.startswith("ASan:"):
        access = _ASAN.search(msg)
        rw = access.group(1).capitalize() if access else ""
        return _named("KASAN", sanitize_title(f"KASAN: invalid-access {rw}"), _frames(lines))
    if msg.startswith("MSan:"):
        return _named("KMSAN", "KMSAN: uninit-value", _frames(lines))
    if _ASSERT_AT.search(msg):  # KASSERT/MPASS: "... @ /usr/src/sys/kern/x.c:316"
        msg = _ASSERT_AT.sub(lambda m: f" at {_source(m.group(1))}:LINE", msg)
        return Description("KASSERT", sanitize_title(f"panic: {msg}"), _frames(lines), None)
    return Description("PANIC", sanitize_title(f"panic: {msg}"), _frames(lines), None)


_LOCK = re.compile(r"^\s*\d(?:st|nd|rd|th) 0x[0-9a-f]+ (.+?) \(")
_LOR_LINE = re.compile(r"^\s*(?:\d(?:st|nd|rd|th) 0x|(?:KDB: )?stack backtrace:|lock order |#\d+ |"
                       r"[\w.]+\(\) at |--- |$)")


def lor(lines: list[str]) -> Description:
    locks = [m.group(1) for t in lines if (m := _LOCK.match(t))]
    frames = _frames(lines)
    if len(locks) < 2:
        return Description("WITNESS_LOR", "WITNESS: lock order reversal", frames, "lock names missing")
    return Description("WITNESS_LOR", f"WITNESS: lock order reversal: {locks[0]} -> {locks[1]}", frames, None)


_END = re.compile(r"^Stopped at |^Automatic reboot|^Rebooting\.\.\.|^cpu_reset")
KINDS = [
    Kind("fatal-trap", re.compile(r"Fatal trap \d+: "), fatal_trap, end=_END, absorbs=frozenset({"panic"})),
    Kind("lock-order-reversal", re.compile(r"^(?:witness: )?lock order reversal:"), lor,
         continues=lambda text: bool(_LOR_LINE.match(text))),
    Kind("panic", re.compile(r"panic: "), panic, end=_END),
]


def start(text: str) -> Kind | None:
    for kind in KINDS:
        if kind.start.search(text):
            return kind
    return None
