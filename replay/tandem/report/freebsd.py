"""FreeBSD kernel reports: panics, failed KASSERTs, fatal traps, WITNESS, KASAN/KMSAN.

Titles follow syzkaller's (pkg/report/freebsd.go, commit 1e72964b, Apache-2.0), which
syzbot deduplicates FreeBSD bugs by; docs/reports.md lists where tandem differs and why.
WITNESS lock order reversals and the guilty frame of a failed KASSERT are tandem's own.
"""
from __future__ import annotations

import re

from .frames import bsd_frame, sanitize_title, useful
from .kind import Description, Kind, Table, matched

# Frames of the debugger, panic, trap and sanitizer machinery, above the code that failed.
_MACHINERY = re.compile(r"^(?:db_trace_self|db_trace_thread|kdb_|vpanic$|panic$|kassert_panic$|trap$|"
                        r"trap_fatal$|trap_pfault$|calltrap$|witness_|stack_save|stack_print|"
                        r"__asan_|kasan_|__msan_|kmsan_)")
# Lock primitives: a failed lock assertion or a reversal is the caller's doing.
_LOCKS = re.compile(r"^(?:_*mtx_|_*rw_|_*sx_|sx_destroy$|_*lockmgr|_*rm_|rms_|_*sleepq_|"
                    r"vop_stdlock$|vop_lock$|VOP_LOCK|_vn_lock$|vn_lock$|ffs_lock$|_vm_map_(?:try)?lock|"
                    r"m_copydata$|m_copym$)")
_KDB = re.compile(r"(?:KDB: )?stack backtrace:")


def _frames(lines: list[str], start: int = 0) -> list[str]:
    """Frame names from the first backtrace at or after line `start`, in order."""
    i = next((i for i in range(start, len(lines)) if _KDB.search(lines[i])), start)
    return [f for t in lines[i:] if (f := bsd_frame(t))]


def _guilty(frames: list[str]) -> list[str]:
    return [f for f in useful(frames, _MACHINERY) if not _LOCKS.search(f)]


# --- fatal traps ---------------------------------------------------------------------------

_TRAP = re.compile(r"Fatal trap (\d+): ")
_MODE = re.compile(r" while in (?:kernel|user) mode$")
_TRAP_MARK = re.compile(r"^--- trap ")
# In the short "#N 0x... at f+0x..." backtrace syzkaller names the first frame past these.
_KDB_TRAP_SKIP = frozenset({"kdb_backtrace", "vpanic", "panic", "trap_fatal", "trap_pfault", "trap",
                            "calltrap", "m_copydata", "__rw_wlock_hard", "db_trace_self_wrapper"})
_SHORT_FRAME = re.compile(r"^\s*#\d+ 0x")


def fatal_trap(lines: list[str]) -> Description:
    """syzkaller's two title forms, by backtrace style: ddb ("f() at f+0x.../frame"):
    "Fatal trap N: page fault in F", F the frame under the "--- trap" marker; short KDB
    ("#N 0x... at f+0x..."): "Fatal trap N: page fault while in kernel mode in F"."""
    m = matched(_TRAP.search(lines[0]))
    number, rest = m.group(1), lines[0][m.end():]
    mode_at = _MODE.search(rest)
    what, mode = (rest[:mode_at.start()], mode_at.group(0)) if mode_at else (rest, "")
    mark = next((i for i, t in enumerate(lines) if _TRAP_MARK.match(t)), None)
    if mark is not None:
        frames = [f for t in lines[mark + 1:] if (f := bsd_frame(t))]
        if frames:
            return _trap_title(number, what, frames)
    start = next((i for i, t in enumerate(lines) if _KDB.search(t)), 0)
    short = [f for t in lines[start:] if _SHORT_FRAME.match(t) and (f := bsd_frame(t))]
    past_kdb = [f for f in short if f not in _KDB_TRAP_SKIP]
    if past_kdb:
        return _trap_title(number, what + mode, past_kdb)
    frames = _guilty(_frames(lines))
    if frames:
        return _trap_title(number, what, frames)
    return Description("FATAL_TRAP", sanitize_title(f"Fatal trap {number}: {what}{mode}"), [],
                       "no frame to name the report by")


def _trap_title(number: str, what: str, frames: list[str]) -> Description:
    return Description("FATAL_TRAP", sanitize_title(f"Fatal trap {number}: {what} in {frames[0]}"), frames, None)


# --- panics ---------------------------------------------------------------------------------

_PANIC = re.compile(r"(?<![\w.])panic: (.*)")
# A source location in a panic message: MPASS's "failed at FILE:LINE", a lock's "@ FILE:LINE".
_SOURCE_AT = re.compile(r"(?: @ | at )(/?[\w./-]+\.[ch]):\d+")
_ASAN = re.compile(r"^(ASan: Invalid access, \d+-byte (?:read|write))")
# syzkaller's titles for panics whose message carries run-dependent numbers: (message, title).
_MESSAGES = [
    (re.compile(r"^ffs_write: type 0x[0-9a-f]+ \d+ \(\d+,\d+\)"), "panic: ffs_write: type ADDR X (Y,Z)"),
    (re.compile(r"^No chunks on the queues for sid \d+\."), "panic: sctp: no chunks on the queues"),
    (re.compile(r"^size_on_all_streams = \d+ smaller than control length \d+"),
     "panic: size_on_all_streams smaller than control length"),
    (re.compile(r"^sbflush_internal: ccc \d+ mb \d+ mbcnt \d+"), "panic: sbflush_internal: residual data"),
    (re.compile(r"^pfi_dynaddr_setup: dyn is 0x[0-9a-f]+"), "panic: pfi_dynaddr_setup: non-NULL dyn"),
]


def _source(path: str) -> str:
    """Build trees differ: keep the path from the source tree's "sys/" on."""
    return "sys/" + path.rsplit("/sys/", 1)[1] if "/sys/" in path else path.lstrip("/")


def _after(frames: list[str], helper: re.Pattern) -> list[str]:
    """The frames below the last of a run of `helper` frames (syzkaller's ASan and sx rules)."""
    last = max((i for i, f in enumerate(frames) if helper.search(f)), default=None)
    return frames[last + 1:] if last is not None else []


def panic(lines: list[str]) -> Description:
    """syzkaller's rules by message (ASan, sx, its fixed titles), else "panic: MESSAGE" with
    source paths cut to the tree; the guilty frame past the panic machinery and lock primitives."""
    msg = matched(_PANIC.search(lines[0])).group(1).strip()
    frames = _frames(lines)
    asan = _ASAN.search(msg)
    if asan or msg.startswith("ASan:"):
        below = _after(frames, re.compile(r"^__asan_")) or _guilty(frames)
        what = asan.group(1) if asan else msg
        if not below:
            return Description("KASAN", sanitize_title(f"panic: {what}"), [], "no frame to name the report by")
        return Description("KASAN", sanitize_title(f"panic: {what} in {below[0]}"), below, None)
    if msg.startswith("MSan:"):
        guilty = _guilty(frames)
        if not guilty:
            return Description("KMSAN", "KMSAN: uninit-value in corrupted", [], "no frame to name the report by")
        return Description("KMSAN", f"KMSAN: uninit-value in {guilty[0]}", guilty, None)
    if msg.startswith("sx lock still held"):
        below = _after(frames, re.compile(r"^sx_destroy$")) or _guilty(frames)
        title = f"panic: sx lock still held in {below[0]}" if below else "panic: sx lock still held"
        return Description("PANIC", title, below, None)
    for pattern, title in _MESSAGES:
        if pattern.search(msg):
            return Description("PANIC", title, _guilty(frames), None)
    # KASSERT/MPASS ("Assertion x failed at FILE:LINE") and lock assertions ("... @ FILE:LINE"),
    # or any panic raised through kassert_panic().
    kassert = bool(_SOURCE_AT.search(msg)) or "kassert_panic" in frames
    msg = _SOURCE_AT.sub(lambda m: f" at {_source(m.group(1))}:LINE", msg)
    return Description("KASSERT" if kassert else "PANIC", sanitize_title(f"panic: {msg}"), _guilty(frames), None)


_KASSERT_WARNING = re.compile(r"^KASSERT failed: (.*)")
_TRACE_LINE = re.compile(r"^\s*(?:(?:KDB: )?stack backtrace:|#\d+ 0x|[\w.]+\(\) at |--- )")


def kassert_warning(lines: list[str]) -> Description:
    """A KASSERT on a kernel with debug.kassert.warn_only=1: "KASSERT failed: MSG" and a
    backtrace, and the kernel runs on. Titled like the panic it would have been, by message."""
    msg = matched(_KASSERT_WARNING.match(lines[0])).group(1).strip()
    msg = _SOURCE_AT.sub(lambda m: f" at {_source(m.group(1))}:LINE", msg)
    return Description("KASSERT", sanitize_title(f"KASSERT failed: {msg}"), _guilty(_frames(lines)), None)


# --- KASAN that reports and goes on -----------------------------------------------------------

_ASAN_REPORT = re.compile(r"^(ASan: Invalid access, \d+-byte (?:read|write)) at ")


def asan_report(lines: list[str]) -> Description:
    """A KASAN violation on a kernel with debug.kasan.panic_on_violation=0: the message
    kasan_report() would have panicked with, then stack_print_ddb()'s "#N 0x.. at f+0x.."
    frames, and the kernel runs on. Titled as syzkaller titles the panic, without "panic: "
    (there was none): "ASan: Invalid access, N-byte write in F", F the first frame past the
    sanitizer's own."""
    what = matched(_ASAN_REPORT.match(lines[0])).group(1)
    frames = [f for t in lines[1:] if (f := bsd_frame(t))]
    below = _after(frames, re.compile(r"^(?:__asan_|kasan_)")) or _guilty(frames)
    if not below:
        return Description("KASAN", what, [], "no frame to name the report by")
    return Description("KASAN", sanitize_title(f"{what} in {below[0]}"), below, None)


# --- WITNESS --------------------------------------------------------------------------------

_LOCK = re.compile(r"^\s*(?:1st|2nd|3rd) 0x[0-9a-f]+ (.*) @ ")
_ESTABLISHED = re.compile(r"^lock order .* established at:")
_ATTEMPTED = re.compile(r"^lock order .* attempted at:")
_LOR_LINE = re.compile(r"^\s*(?:(?:1st|2nd|3rd) 0x|(?:KDB: )?stack backtrace:|lock order |#\d+ |"
                       r"[\w.]+\(\) at |--- |$)")


_PAREN_DEPTH = {")": 1, "(": -1}


def witness_name(described: str) -> str:
    """The witness (lock type) name in "NAME (WITNESS, CLASS)" or "NAME (WITNESS)": lock
    instance names can hold a unit number or parentheses of their own ("vm map (user)")."""
    if not described.endswith(")"):
        return described
    depth = 0
    for i in range(len(described) - 1, -1, -1):
        depth += _PAREN_DEPTH.get(described[i], 0)
        if depth == 0:
            inner = described[i + 1:-1]
            name, comma, cls = inner.rpartition(", ")
            return name if comma and " (" not in cls and "," not in cls else inner
    return described


def lor(lines: list[str]) -> Description:
    """A WITNESS lock order reversal, titled by the pair of locks and the function that took
    the second (the first frame below the lock primitives of the "attempted at" stack, or of
    the backtrace older kernels print)."""
    attempted = next((i for i, t in enumerate(lines) if _ATTEMPTED.match(t)), None)
    pair = _reversed_pair(lines, attempted)
    if attempted is not None:
        frames = _guilty(_stack(lines, attempted + 1))
    else:
        established = next((i for i, t in enumerate(lines) if _ESTABLISHED.match(t)), None)
        start = next((i for i, t in enumerate(lines) if _KDB.search(t)), None)
        frames = _guilty(_frames(lines, start)) if start is not None and established is None else []
    what = f"WITNESS: lock order reversal: {pair[0]} -> {pair[1]}" if pair else "WITNESS: lock order reversal"
    if not frames:
        return Description("WITNESS_LOR", sanitize_title(what), [], "no frame to name the report by")
    return Description("WITNESS_LOR", sanitize_title(f"{what} in {frames[0]}"), frames,
                       None if pair else "lock names missing")


def _reversed_pair(lines: list[str], attempted: int | None) -> tuple[str, str] | None:
    """(held, taken) witness names: from "lock order HELD -> TAKEN attempted at:" (FreeBSD 13+),
    else the lock lines: "1st" held and "2nd" taken, or with a "3rd", "2nd" held and "3rd" taken
    (the 1st is an earlier lock of the 3rd's type)."""
    if attempted is not None:
        order = lines[attempted][len("lock order "):].rpartition(" attempted at:")[0]
        held, arrow, taken = order.partition(" -> ")
        if arrow:
            return held, taken
    locks = [witness_name(m.group(1)) for t in lines if (m := _LOCK.match(t))]
    if len(locks) >= 3:
        return locks[1], locks[2]
    return (locks[0], locks[1]) if len(locks) == 2 else None


def _stack(lines: list[str], start: int) -> list[str]:
    """The frames of the stack printed from line `start` on, to its first non-frame line."""
    out = []
    for text in lines[start:]:
        frame = bsd_frame(text)
        if not frame:
            break
        out.append(frame)
    return out


# witness_warn(): "Sleeping on "sbwait" with the following non-sleepable locks held:", the
# locks ("exclusive sleep mutex so_rcv (so_rcv) r = 0 (0x..) locked @ FILE:LINE"), then a
# backtrace; "userret: returning" and a thread exiting with locks held panic after it.
_HELD = re.compile(r"^(.*) with the following (non-sleepable )?locks held:")
_HELD_LINE = re.compile(r"^\s*(?:(?:exclusive|shared) |(?:KDB: )?stack backtrace:|#\d+ |[\w.]+\(\) at |--- |"
                        r"panic: witness_warn\b|cpuid = |time = |KDB: |\[ thread pid |$)")
# The sleep and allocation calls that check for held locks: the caller holds them.
_SLEEPS = re.compile(r"^(?:_sleep$|msleep|sbwait$|_?sleepq_|_cv_|cv_|pause|tsleep|uma_zalloc|malloc|kmem_|_?vm_wait|"
                     r"userret$|thread_exit$|exit1$)")


def locks_held(lines: list[str]) -> Description:
    """witness_warn(): a lock held where the code may sleep, return to user space or exit,
    titled by its message and the function that called the sleep or allocation."""
    m = matched(_HELD.match(lines[0]))
    what = f"{m.group(1)} with {m.group(2) or ''}locks held"
    frames = [f for f in _guilty(_frames(lines)) if not _SLEEPS.search(f)]
    if not frames:
        return Description("WITNESS", sanitize_title(f"WITNESS: {what}"), [], "no frame to name the report by")
    return Description("WITNESS", sanitize_title(f"WITNESS: {what} in {frames[0]}"), frames, None)


_END = re.compile(r"^Stopped at |^Automatic reboot|^Rebooting\.\.\.|^cpu_reset")
KINDS = [
    Kind("fatal-trap", re.compile(r"Fatal trap \d+: "), fatal_trap, end=_END, absorbs=frozenset({"panic"})),
    Kind("lock-order-reversal", re.compile(r"^(?:witness: )?lock order reversal:"), lor,
         continues=lambda text: bool(_LOR_LINE.match(text))),
    # The panic witness_warn() raises after a warning of WARN_PANIC (userret, a process
    # exiting) is the warning's; any other panic after one is a report of its own.
    Kind("locks-held", _HELD, locks_held, absorbs=frozenset({"witness-warn-panic"}),
         continues=lambda text: bool(_HELD_LINE.match(text))),
    Kind("kassert-warning", _KASSERT_WARNING, kassert_warning, continues=lambda text: bool(_TRACE_LINE.match(text))),
    Kind("kasan-report", _ASAN_REPORT, asan_report, continues=lambda text: bool(_TRACE_LINE.match(text))),
    Kind("witness-warn-panic", re.compile(r"(?<![\w.])panic: witness_warn\b"), panic, end=_END),
    Kind("panic", _PANIC, panic, end=_END),
]
# Text every line that starts a report holds (the scanner skips lines with none of it).
TOKENS = ("Fatal trap ", "lock order reversal:", "locks held:", "KASSERT failed: ", "panic: ", "ASan: Invalid access")


def start(text: str) -> Kind | None:
    for kind in KINDS:
        if kind.start.search(text):
            return kind
    return None


FREEBSD = Table(TOKENS, start)
