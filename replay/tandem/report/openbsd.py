"""OpenBSD kernel reports: panics, kernel assertions, UVM and protection faults, WITNESS, KASAN.

Titles follow syzkaller's (pkg/report/openbsd.go, commit 1e72964b, Apache-2.0), which syzbot
deduplicates OpenBSD bugs by. After a panic OpenBSD sits in ddb and prints what it is asked
("show panic", "trace", ...): a report runs to a reboot or the end of the console, and the
headers in that session ("panic:", "uvm_fault(") are part of it (the kinds are `tail`).
"""
from __future__ import annotations

import re

from .frames import sanitize_title
from .kind import Description, Kind, Table, matched

# A ddb frame: "name(args) at name+0x12" (possibly followed by a source location).
# One that "names nothing" ("fffffd80...(..) at 0xfffffd80...") is not a frame.
_FRAME = re.compile(r"^([A-Za-z0-9_]+)\([^\n]*\) at [A-Za-z_]")
# Trap plumbing, sanitizer trampolines and byte helpers: never the bug (syzkaller's list).
_SKIP = re.compile(r"^(?:panic|kerntrap|usertrap|alltraps\w*|savectx|db_enter|__asan_(?:load|store)\w*|"
                   r"kasan_mem\w+|memcpy|memmove|memset|memcmp|bcmp|bcopy|bzero|kcopy|strcmp|strncmp|"
                   r"strlcpy|strlcat|strlen|strnlen|strncpy|copyin\w*|copyout\w*)\(.*\) at ")
_END_TRACE = re.compile(r"end trace frame")
_STOPPED = re.compile(r"Stopped at +([^+]+)")
_STOPPED_ADDR = re.compile(r"Stopped at +0x[0-9a-f]+")


def _stopped(text: str) -> re.Match | None:
    """ddb's "Stopped at FUNC+0x..", matched once per line (a search would retry at every
    "Stopped at" of a hostile line, each time to its end)."""
    at = text.find("Stopped at")
    return _STOPPED.match(text, at) if at >= 0 else None


def first_frame(lines: list[str], start: int = 1) -> tuple[int, str] | None:
    """The frame syzkaller titles a trap by: from the first frame-shaped line on, walk past
    a run of plumbing frames to the frame under it; if the run ends in a line that is no
    frame, its last frame-shaped member. (Line index, name.)"""
    p = start
    while p < len(lines):
        end = p
        while end < len(lines) and _SKIP.match(lines[end]):
            end += 1
        for j in range(end, p - 1, -1):
            m = _FRAME.match(lines[j]) if j < len(lines) else None
            if m:
                return j, m.group(1)
        p = end + 1  # every start inside this run ends at the same line: none can match
    return None


def _frames_from(lines: list[str], index: int) -> list[str]:
    """Frame names from line `index` on, plumbing skipped, a symbolized frame's repeats once."""
    out: list[str] = []
    for text in lines[index:]:
        m = _FRAME.match(text)
        if m and not _SKIP.match(text) and (not out or out[-1] != m.group(1)):
            out.append(m.group(1))
    return out


def _trace(lines: list[str]) -> list[str]:
    """The frames of the first backtrace (for reports titled by their message)."""
    frame = first_frame(lines)
    return _frames_from(lines, frame[0]) if frame else []


def _later(lines: list[str], pattern: re.Pattern, after: int) -> bool:
    return any(pattern.search(t) for t in lines[after + 1:])


def uvm_fault(lines: list[str]) -> Description:
    frame = first_frame(lines)
    if frame and _later(lines, _END_TRACE, frame[0]):
        return Description("FATAL_TRAP", f"uvm_fault: {frame[1]}", _frames_from(lines, frame[0]), None)
    if any(_STOPPED_ADDR.search(t) for t in lines[1:]) and _later(lines, _END_TRACE, 0):
        return Description("FATAL_TRAP", "uvm_fault", [], None)
    stopped = next((i for i in range(1, len(lines)) if _stopped(lines[i])), None)
    if stopped is not None and _later(lines, _END_TRACE, stopped):
        name = matched(_stopped(lines[stopped])).group(1)
        return Description("FATAL_TRAP", sanitize_title(f"uvm_fault: {name}"), [name], None)
    return Description("FATAL_TRAP", "uvm_fault", [], "no frame or ddb stop to name the fault by")


_KERNEL_TRAP = re.compile(r"kernel: (page|protection) fault trap(, code=0)?")


def kernel_trap(lines: list[str]) -> Description:
    m = _KERNEL_TRAP.search(lines[0])
    if not m:  # another "kernel: ..." message: syzkaller titles it by the line
        return Description("FATAL_TRAP", sanitize_title(lines[0][lines[0].index("kernel:"):]), [], None)
    prefix = "uvm_fault" if m.group(1) == "page" else "protection_fault"
    frame = first_frame(lines)
    if frame:
        return Description("FATAL_TRAP", f"{prefix}: {frame[1]}", _frames_from(lines, frame[0]), None)
    stopped = _STOPPED.match(lines[1]) if m.group(2) and len(lines) > 1 else None
    if stopped:
        return Description("FATAL_TRAP", sanitize_title(f"{prefix}: {stopped.group(1)}"), [stopped.group(1)], None)
    return Description("FATAL_TRAP", sanitize_title(lines[0][m.start():]), [], None)


# --- panics -------------------------------------------------------------------------------

_CAUGHT = re.compile(r"Caught invalid memory access")
# The KASAN checks and byte helpers a KASAN panic comes through, named by the frame under them.
_KASAN_HELPER = re.compile(r" at (?:__asan_(?:load|store)(?:[0-9]+|N)+_noabort|kasan_mem(?:cpy|move|set|cmp)|"
                           r"memcpy|memmove|memset|memcmp|bcmp|bcopy|bzero|kcopy|strcmp|strncmp|strlcpy|"
                           r"strlcat|strlen|strnlen|strncpy|copyin|copyinstr|copyout|copyoutstr)\+0x[0-9a-f]+")
_IDENT = re.compile(r"^([A-Za-z0-9_]+)")
_SHOW_PANIC = re.compile(r"^ddb\{\d+\}> show panic")
_CPU_PANIC = re.compile(r"^\*cpu\d+: (.+)")
_TRACE_CMD = re.compile(r"^ddb\{\d+\}> trace")
# (message, title): syzkaller's table for panics whose message holds run-dependent words.
_MESSAGES = [
    (re.compile(r"panic: Data modified on freelist: .* previous type ([^ ]+)"), "malloc: free list modified: {0}", "PANIC"),
    (re.compile(r"panic: pool_cache_item_magic_check: ([^ ]+) cpu free list modified"),
     "pool: cpu free list modified: {0}", "PANIC"),
    (re.compile(r"panic: pool_do_put: ([^:]+): double pool_put"), "pool: double put: {0}", "PANIC"),
    (re.compile(r"panic: pool_do_get: ([^:]+) free list modified"), "pool: free list modified: {0}", "PANIC"),
    (re.compile(r"panic: pool_p_free: ([^:]+) free list modified"), "pool: free list modified: {0}", "PANIC"),
    (re.compile(r"panic: timeout_add: to_ticks \(.+\) < 0"), "panic: timeout_add: to_ticks < 0", "PANIC"),
    (re.compile(r"panic: attempt to execute user address 0x[0-9a-f]+ in supervisor mode"),
     "panic: attempt to execute user address", "PANIC"),
    (re.compile(r"panic: unhandled af"), "panic: unhandled af", "PANIC"),
    (re.compile(r"panic: receive ([0-9][a-z]*):"), "soreceive {0}", "PANIC"),
]


_ASSERTION = "panic: kernel diagnostic assertion "
_ASSERTION_FILE = ' failed: file "'
_KQUEUE = re.compile(r"panic: (?:kqueue|knote)")
_KQUEUE_WORDS = re.compile(r" (?=[a-z]+ )")


def _message(text: str) -> tuple[str, str] | None:
    """(type, title) by syzkaller's table for the first "panic:" of a line. Each rule is tried
    once, at that one place, so a hostile line costs its length per rule."""
    at = text.find("panic:")
    if at < 0:
        return None
    text = text[at:]
    if text.startswith(_ASSERTION):
        # syzkaller: the assertion up to the last ' failed: file "', then the file's base name.
        cond, found, path = text[len(_ASSERTION):].rpartition(_ASSERTION_FILE)
        name = path.split('"', 1)[0].rsplit("/", 1)
        if found and len(name) == 2 and name[1]:
            return "KASSERT", sanitize_title(f"assert {cond} failed in {name[1]}")
    if _KQUEUE.match(text):
        # "kqueue: WORD REST": the last " word " of the message on (syzkaller's greedy match).
        last = None
        for last in _KQUEUE_WORDS.finditer(text, 13):
            pass
        if last:
            return "PANIC", sanitize_title(f"kqueue: {text[last.end():]}")
    for pattern, title, type_ in _MESSAGES:
        m = pattern.match(text)
        if m:
            return type_, sanitize_title(title.format(*m.groups()))
    return None


def _kasan(lines: list[str], start: int) -> Description | None:
    """KASAN: the line under the first run of KASAN-check and byte-helper frames."""
    i = start + 1
    while i < len(lines):
        if _KASAN_HELPER.search(lines[i]):
            while i < len(lines) and _KASAN_HELPER.search(lines[i]):
                i += 1
            m = _IDENT.match(lines[i]) if i < len(lines) else None
            if m:
                return Description("KASAN", f"KASAN: invalid memory access in {m.group(1)}",
                                   [m.group(1)] + _frames_from(lines, i + 1), None)
            continue
        i += 1
    return None


def _show_panic(lines: list[str], start: int) -> str | None:
    """The panic message as ddb's "show panic" prints it ("*cpuN: MESSAGE"), when a
    "trace" command follows: on MP kernels the console's own panic line can be garbled."""
    cpu = next((i for i in range(start + 1, len(lines)) if _CPU_PANIC.match(lines[i])), None)
    if cpu is None or not _later(lines, _TRACE_CMD, cpu):
        return None
    return matched(_CPU_PANIC.match(lines[cpu])).group(1)


def panic(lines: list[str]) -> Description:
    """The earliest line a title rule matches, from the panic line on (syzkaller matches its
    rules against the whole rest of the console and takes the earliest). A forward search
    that fails once fails from every later line too: each is tried at most once."""
    kasan_failed = show_failed = False
    for i, text in enumerate(lines):
        if _SHOW_PANIC.match(text) and not show_failed:
            cpu = next((j for j in range(i + 1, len(lines)) if _CPU_PANIC.match(lines[j])), None)
            if cpu is not None and _CAUGHT.search(lines[cpu]) and not kasan_failed:
                desc = _kasan(lines, cpu)
                if desc:
                    return desc
                kasan_failed = True
            message = _show_panic(lines, i)
            if message is not None:
                return Description("PANIC", sanitize_title(f"panic: {message}"), _trace(lines), None)
            show_failed = True
        if not kasan_failed and _CAUGHT.search(text):
            desc = _kasan(lines, i)
            if desc:
                return desc
            kasan_failed = True
        found = _message(text)
        if found:
            return Description(found[0], found[1], _trace(lines), None)
    head = lines[0]
    return Description("PANIC", sanitize_title(head[head.index("panic:"):]), _trace(lines), None)


def cleaned_vnode(lines: list[str]) -> Description:
    return Description("PANIC", "panic: cleaned vnode isn't", [], None)


# --- WITNESS ------------------------------------------------------------------------------

_LOR_LOCK = re.compile(r"^\s*(1st|2nd) 0x[0-9a-f]+ ([^ ]+)")
_ORDER_DATA_MISSING = re.compile(r"^lock order data .* missing")
_SYSCALL_FRAME = re.compile(r"(?<![A-Za-z0-9_])sys_([a-z0-9_]+)\+")
_THREAD_EXIT = re.compile(r"witness: thread 0x[0-9a-f]+ exiting with the following locks held:")
_USERRET = re.compile(r"witness: userret: returning with the following locks held:")
# What WITNESS prints under its header: the locks, the lock-order stacks, blank lines.
_WITNESS_BODY = re.compile(r"^\s*(?:1st|2nd|3rd) 0x|^(?:exclusive|shared) |^lock order |^#\d+\s|^\s*$|"
                           r"^witness: ")


def lor(lines: list[str]) -> Description:
    if any(_ORDER_DATA_MISSING.match(t) for t in lines[1:]):
        return Description("WITNESS_LOR", "witness: reversal: lock order data missing", [], None)
    i = next((i for i in range(1, len(lines)) if lines[i].strip()), None)
    first = _LOR_LOCK.match(lines[i]) if i is not None else None
    second = _LOR_LOCK.match(lines[i + 1]) if i is not None and first and i + 1 < len(lines) else None
    if first and second and first.group(1) == "1st" and second.group(1) == "2nd":
        return Description("WITNESS_LOR", sanitize_title(f"witness: reversal: {first.group(2)} {second.group(2)}"),
                           [], None)
    return Description("WITNESS_LOR", "lock order reversal:", [], "lock names missing")


def witness(lines: list[str]) -> Description:
    head = lines[0][lines[0].index("witness: "):]
    if _THREAD_EXIT.search(head):
        return Description("WITNESS", "witness: thread exiting with locks held", [], None)
    if _USERRET.search(head):
        call = next((m for t in lines[1:] if (m := _SYSCALL_FRAME.search(t))), None)
        if call:
            return Description("WITNESS", f"witness: userret: {call.group(1)}", [f"sys_{call.group(1)}"], None)
    return Description("WITNESS", sanitize_title(head), [], None)


# A reboot from ddb ("boot reboot") or after a dump: the next boot is not this report's.
_END = re.compile(r"^rebooting\.\.\.|^>> OpenBSD/")
KINDS = [
    Kind("cleaned-vnode", re.compile(r"cleaned vnode: "), cleaned_vnode, end=_END, tail=True),
    Kind("panic", re.compile(r"panic:"), panic, end=_END, tail=True),
    Kind("lock-order-reversal", re.compile(r"lock order reversal:"), lor, tail=True,
         continues=lambda text: bool(_WITNESS_BODY.match(text))),
    Kind("witness", re.compile(r"witness: "), witness, tail=True,
         continues=lambda text: bool(_WITNESS_BODY.match(text))),
    # "uvm_fault(0xffff..., 0x50, 0, 1) -> e", not a ddb frame "uvm_fault(ba1c,5d8b,..) at ...".
    Kind("uvm-fault", re.compile(r"uvm_fault\((?:0x)?[0-9a-f]+, "), uvm_fault, end=_END, tail=True),
    Kind("kernel-trap", re.compile(r"kernel: "), kernel_trap, end=_END, tail=True),
]
_NOT_KERNEL_TRAP = re.compile(r"reorder_kernel")
# Text every line that starts a report holds (the scanner skips lines with none of it).
TOKENS = ("cleaned vnode: ", "panic:", "lock order reversal:", "witness: ", "uvm_fault(", "kernel: ")


def start(text: str) -> Kind | None:
    for kind in KINDS:
        if kind.start.search(text):
            if kind.name == "kernel-trap" and _NOT_KERNEL_TRAP.search(text):
                continue
            return kind
    return None


OPENBSD = Table(TOKENS, start)
