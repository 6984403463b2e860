"""What a crash report is: the closed set of report types, the OSes whose consoles have a
dialect, and the Report itself. The package's modules import it; it imports none of them
(so a module that needs these never needs the package's __init__: no cycle)."""
from __future__ import annotations

from dataclasses import dataclass, field

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
