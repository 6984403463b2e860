"""Crash reports in guest console output (the model is syzkaller's pkg/report).

    parse(text, os)       every report in a console log, in order
    Scanner(os).feed(b)   the same, incrementally, for live consoles
    symbolize(rep, vmlinux)  source locations of a report's frames

OSes: "linux", "freebsd", "openbsd", "netbsd" (OSES). A Linux or FreeBSD console also
yields the sanitizer reports of guest userland processes (os "userland"). Report types are the closed set TYPES; titles follow
syzkaller's: stable across runs (no addresses, pids, numbers), naming the
guilty frame. docs/reports.md has the rules.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import SimpleNamespace

from . import freebsd, linux, netbsd, openbsd, userland
from .scanner import Scanner
from .symbolize import symbolize

TYPES = {
    # Linux
    "KASAN": "KASAN memory error (out-of-bounds, use-after-free, double/invalid free, wild access)",
    "KMSAN": "use of uninitialized memory or an infoleak found by KMSAN",
    "KFENCE": "memory error found by the sampling KFENCE allocator",
    "UBSAN": "kernel undefined behaviour (array index, shift, overflow, ...)",
    "KCSAN": "data race found by KCSAN",
    "LOCKDEP": "lockdep: deadlock, inconsistent lock state, suspicious RCU, unlock balance, held lock",
    "WARNING": "WARN_ON() and friends",
    "BUG": "BUG_ON(), bad page fault / NULL dereference, sleeping in atomic context, soft lockup",
    "OOPS": "other oopses: invalid opcode, divide error, stack segment, double fault",
    "GPF": "general protection fault",
    "PANIC": "Kernel panic - not syncing, with no report before it (Linux); panic() (BSDs)",
    "HUNG_TASK": "task blocked for too long",
    "RCU_STALL": "RCU grace period stall",
    "LEAK": "kernel memory leak found by kmemleak",
    # FreeBSD (also KASAN, KMSAN, PANIC)
    "KASSERT": "failed kernel assertion: KASSERT/MPASS (FreeBSD), kernel diagnostic assertion (OpenBSD, NetBSD)",
    "FATAL_TRAP": "fatal trap (page fault, protection fault) in kernel mode",
    "WITNESS_LOR": "WITNESS lock order reversal",
    # OpenBSD, NetBSD (also PANIC, KASSERT, FATAL_TRAP, WITNESS_LOR, KASAN, KMSAN, UBSAN)
    "WITNESS": "WITNESS: locks held where none may be (a thread exiting, a return to user space)",
    # guest userland processes
    "ASAN": "AddressSanitizer error in a guest process",
    "LSAN": "LeakSanitizer leak report in a guest process",
    "UBSAN_USER": "UndefinedBehaviorSanitizer runtime error in a guest process",
}
USERLAND_TYPES = frozenset({"ASAN", "LSAN", "UBSAN_USER"})
OSES = ("linux", "freebsd", "openbsd", "netbsd", "userland")


@dataclass
class Report:
    os: str                   # "linux" | "freebsd" | "openbsd" | "netbsd" | "userland"
    type: str                 # a key of TYPES
    title: str                # stable, for deduplication
    frames: list[str]         # function names, guilty frame first, helpers skipped
    text: str                 # the report's own lines, console prefixes stripped
    start: int                # byte offsets of the report in the console output
    end: int
    corrupted: bool = False
    corrupted_reason: str = ""
    locations: list[tuple[str, str, int]] = field(default_factory=list)  # (function, file, line)


_DIALECTS: dict[str, SimpleNamespace] = {}


# Texts that many TOKENS hold ("BUG" is in "BUG:", "kernel BUG", "BUG kmalloc-"): searched
# for in their stead, a line holding a token still holds one of these, and the search
# tries fewer alternatives at each character (linux: 17 for 32, 2.5x as fast over noise).
_COVER = ("BUG", "panic", "fault", "error:", "ERROR: ", "SYZFA", "VFS: ")


def _fewer(tokens) -> list[str]:
    """Texts one of which every line holding one of `tokens` holds: the covers a token
    holds, and the tokens that hold no cover."""
    tokens = set(tokens)
    covers = {c for c in _COVER if any(c in t for t in tokens)}
    return sorted(covers | {t for t in tokens if not any(c in t for c in covers)})


def dialect(os: str) -> SimpleNamespace:
    """The report kinds recognized on one OS's console (built once per OS: parse() makes a
    Scanner per console)."""
    if os not in _DIALECTS:
        _DIALECTS[os] = _dialect(os)
    return _DIALECTS[os]


def _dialect(os: str) -> SimpleNamespace:
    tables = {"linux": [linux, userland], "freebsd": [freebsd, userland], "openbsd": [openbsd],
              "netbsd": [netbsd], "userland": [userland]}
    if os not in tables:
        raise ValueError(f"unknown OS {os!r}: expected one of {', '.join(OSES)}")

    # Every start pattern holds one of its table's TOKENS: one search of them all says
    # that a line starts no report (most lines), before each table's patterns in turn;
    # the Scanner searches raw console text for them (may_start) to pass over such lines.
    tokens = "|".join(re.escape(t) for t in _fewer(t for table in tables[os] for t in table.TOKENS))
    any_token = re.compile(tokens)

    def start(text: str):
        if not any_token.search(text):
            return None
        for table in tables[os]:
            kind = table.start(text)
            if kind:
                return kind
        return None
    # In raw console text a token may also be split by a "\r" that make_line() drops.
    return SimpleNamespace(start=start, may_start=re.compile(tokens + r"|\r[^\r\n]"),
                           longest=max(2, *(len(t) for table in tables[os] for t in table.TOKENS)))


def parse(text: str | bytes, os: str = "linux") -> list[Report]:
    """All reports in a console log, in order."""
    scanner = Scanner(os)
    return scanner.feed(text) + scanner.flush()


__all__ = ["Report", "Scanner", "TYPES", "parse", "symbolize"]
