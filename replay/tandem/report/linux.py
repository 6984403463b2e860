"""Linux kernel reports: sanitizers, lockdep, WARNING/BUG/Oops, panics, hangs and stalls."""
from __future__ import annotations

import re

from .frames import hang_frame, linux_frame, linux_rip, sanitize_title, stall_frame, useful
from .kind import Description, Kind

END_TRACE = re.compile(r"^---\[ end trace")
RULER = re.compile(r"^={20,}$")
# Where one stack of a report ends and the next part (another stack, memory state) begins.
SECTION = re.compile(r"^(?:Allocated by task|Freed by task|The buggy address|Last potentially related|"
                     r"Second to last|Uninit was (?:created|stored)|Local variable|Memory state|"
                     r"(?:read|write).* (?:by task|by interrupt|to 0x)|Bytes b4|Object 0x|kfence-#|"
                     r"---\[ end|Code: |Kernel Offset|-> #\d|other info that|Showing all locks|"
                     r"\d+ locks? held by|NMI backtrace|Sending NMI|</TASK>|Modules linked in)")
CALL_TRACE = re.compile(r"Call Trace:|^Backtrace:|^ *<TASK>|stack backtrace:")


def frames_after(lines: list[str], after: re.Pattern | None = None, stop: re.Pattern = SECTION,
                 start: int = 0) -> list[str]:
    """Reliable frame names of the first stack after a line matching `after`."""
    i = start
    if after is not None:
        while i < len(lines) and not after.search(lines[i]):
            i += 1
        i += 1
    out = []
    for text in lines[i:]:
        if out and stop.search(text.strip()):
            break
        frame = linux_frame(text)
        if frame and not frame[3] and not text.lstrip().startswith(("RIP:", "IP:")):
            out.append(frame[0])
    return out


def rip(lines: list[str]) -> list[str]:
    found = [linux_rip(t) for t in lines]
    return [f for f in found if f][:1]


def in_func(type_: str, prefix: str, candidates: list[str], skip: re.Pattern | None = None,
            pick=None, corrupted: str | None = None) -> Description:
    """"PREFIX in GUILTY": the first useful candidate frame (or what `pick` chooses)."""
    frames = useful(candidates, skip)
    frames = [f for i, f in enumerate(frames) if i == 0 or f != frames[i - 1]]
    guilty = pick(candidates) if pick else (frames[0] if frames else None)
    if guilty is None:
        return Description(type_, sanitize_title(f"{prefix} in corrupted"), frames,
                           corrupted or "no frame to name the report by")
    rest = frames[frames.index(guilty) + 1:] if guilty in frames else frames
    return Description(type_, sanitize_title(f"{prefix} in {guilty}"), [guilty] + rest, corrupted)


def header(lines: list[str], pattern: re.Pattern) -> re.Match | None:
    for text in lines:
        m = pattern.search(text)
        if m:
            return m
    return None


def _header_func(m: re.Match | None, group: int) -> list[str]:
    return [m.group(group).split("+", 1)[0].split(".", 1)[0]] if m and m.group(group) else []


# --- KASAN, KMSAN, KFENCE, KCSAN, UBSAN -------------------------------------------------

_KASAN = re.compile(r"BUG: KASAN: ([a-z-]+(?: or invalid-free)?)(?: in ([\w.]+))?")
_ACCESS = re.compile(r"^(Read|Write) (?:of size|at addr)")
_KASAN_FREE_SKIP = re.compile(r"^kfree|^vfree|^vunmap|^slab_|^__slab|^kmem_cache_free")


def kasan(lines: list[str]) -> Description:
    m = header(lines, _KASAN)
    bug = "invalid-free" if m.group(1) == "double-free or invalid-free" else m.group(1)
    candidates = _header_func(m, 2) + frames_after(lines, CALL_TRACE)
    if bug in ("double-free", "invalid-free"):
        return in_func("KASAN", f"KASAN: {bug}", candidates, _KASAN_FREE_SKIP)
    access = header(lines, _ACCESS)
    prefix = f"KASAN: {bug} {access.group(1)}" if access else f"KASAN: {bug}"
    return in_func("KASAN", prefix, candidates, corrupted=None if access else "no Read/Write line")


_KMSAN = re.compile(r"BUG: KMSAN: ([a-z-]+)(?: in ([\w.]+))?")


def kmsan(lines: list[str]) -> Description:
    m = header(lines, _KMSAN)
    # Newer KMSAN prints the stack right under the header, older after "Call Trace:".
    start = next(i for i, t in enumerate(lines) if _KMSAN.search(t))
    candidates = _header_func(m, 2) + frames_after(lines, start=start + 1)
    return in_func("KMSAN", f"KMSAN: {m.group(1)}", candidates, re.compile(r"^_?copy_|usercopy|^instrument_"))


_KFENCE = re.compile(r"BUG: KFENCE: ([a-z -]+?) (?:in )([\w.]+)")


def kfence(lines: list[str]) -> Description:
    m = header(lines, _KFENCE)
    start = next(i for i, t in enumerate(lines) if _KFENCE.search(t))
    candidates = _header_func(m, 2) + frames_after(lines, re.compile(r" at 0x[0-9a-f]+|^Corrupted memory"),
                                                   start=start)
    return in_func("KFENCE", f"KFENCE: {m.group(1)}", candidates)


_KCSAN = re.compile(r"BUG: KCSAN: ([a-z-]+) in ([\w.]+(?:\+0x[0-9a-f/x]+)?(?: / [\w.]+(?:\+0x[0-9a-f/x]+)?)?)")


def kcsan(lines: list[str]) -> Description:
    m = header(lines, _KCSAN)
    if not m:
        return Description("KCSAN", sanitize_title(header(lines, re.compile(r"BUG: (KCSAN: .*)")).group(1)),
                           [], "no racing functions")
    racers = [f.split("+", 1)[0] for f in m.group(2).split(" / ")]
    frames = useful(racers + frames_after(lines, re.compile(r"(?:read|write).* by ")))
    return Description("KCSAN", sanitize_title(f"KCSAN: {m.group(1)} in {' / '.join(racers)}"), frames, None)


_UBSAN = re.compile(r"UBSAN: (?:Undefined behaviour|([a-z-]+)) in")
_UBSAN_SKIP = re.compile(r"ubsan|overflow")


def ubsan(lines: list[str]) -> Description:
    m = header(lines, _UBSAN)
    what = m.group(1) if m and m.group(1) else "undefined-behaviour"
    return in_func("UBSAN", f"UBSAN: {what}", frames_after(lines, CALL_TRACE), _UBSAN_SKIP)


# --- lockdep ------------------------------------------------------------------------------

_AT = re.compile(r", at: (?:\[<[0-9a-f]+>\] )?([A-Za-z_][\w.]*)")
_WQ_SKIP = re.compile(r"^process_one_work|^(flush|drain|destroy)_workqueue")


def _at_funcs(lines: list[str], after: re.Pattern, count: int) -> tuple[list[str], int]:
    """Functions named by the first `count` ", at: func" lines after `after`, and where they end."""
    out, i = [], 0
    while i < len(lines) and not after.search(lines[i]):
        i += 1
    while i < len(lines) and len(out) < count:
        m = _AT.search(lines[i])
        if m:
            out.append(m.group(1).split(".", 1)[0])
        i += 1
    return out, i


def lockdep(title_prefix: str, after: str, count: int = 1, skip=None):
    after_re = re.compile(after)

    def describe(lines: list[str]) -> Description:
        funcs, i = _at_funcs(lines, after_re, count)
        # Then the frames of the dependency chain / the backtrace, as syzkaller does.
        chain = [f for t in lines[i:] if (f := linux_frame(t)) and not f[3]]
        return in_func("LOCKDEP", title_prefix, funcs + [f[0] for f in chain], skip)
    return describe


def lockdep_stack(title_prefix: str, skip: re.Pattern | None = None):
    """Lockdep reports named by the reporting task's own backtrace."""
    def describe(lines: list[str]) -> Description:
        return in_func("LOCKDEP", title_prefix, frames_after(lines, CALL_TRACE), skip)
    return describe


def inconsistent(lines: list[str]) -> Description:
    # Named by the task's backtrace; old kernels print none, only where the lock was taken.
    stack = frames_after(lines, CALL_TRACE)
    taken, _ = _at_funcs(lines, re.compile(r"\] takes:|takes:$"), 1)
    return in_func("LOCKDEP", "inconsistent lock state", stack + taken,
                   corrupted=None if stack else "no backtrace")


def bad_unlock(lines: list[str]) -> Description:
    m = header(lines, re.compile(r"is trying to release lock .* at:\s*(?:\[<[0-9a-f]+>\] )?([\w.]+)?"))
    first = _header_func(m, 1)
    if not first:
        i = next((i for i, t in enumerate(lines) if "is trying to release lock" in t), len(lines))
        frame = linux_frame(lines[i + 1]) if i + 1 < len(lines) else None
        first = [frame[0]] if frame else []
    prefix = "BUG" if header(lines, re.compile(r"^BUG: bad unlock")) else "WARNING"
    return in_func("LOCKDEP", f"{prefix}: bad unlock balance", first + frames_after(lines, CALL_TRACE))


def suspicious_rcu(lines: list[str]) -> Description:
    prefix = "INFO" if header(lines, re.compile(r"^INFO: suspicious RCU")) else "WARNING"
    return in_func("LOCKDEP", f"{prefix}: suspicious RCU usage", frames_after(lines, CALL_TRACE),
                   re.compile(r"rcu|^kmem|^slab"))


# --- WARNING, BUG, Oops, GPF, panic -------------------------------------------------------

_WARN_AT = re.compile(r"^WARNING: (?:CPU: \d+ PID: \d+ at |.*? at )?(\S+?\.\w+):\d+ (?:at )?([\w.]+)?")
_WARN_SPECIAL = [  # (source file, title prefix, type, extra helpers to skip)
    ("lib/refcount.c", "WARNING: refcount bug", "WARNING", re.compile(r"refcount")),
    ("lib/debugobjects.c", "WARNING: ODEBUG bug", "WARNING",
     re.compile(r"^debug_|rcu|^hrtimer_|^timer_|^work_|^percpu_|^__free_")),
    ("kernel/locking/lockdep.c", "WARNING: locking bug", "LOCKDEP", re.compile(r"^lock_sock|^release_sock")),
    ("mm/usercopy.c", "WARNING: bad usercopy", "WARNING", re.compile(r"usercopy|^__check")),
    ("lib/kobject.c", "WARNING: kobject bug", "WARNING", None),
]


def warning(lines: list[str]) -> Description:
    m = header(lines, _WARN_AT)
    if not m:
        return Description("WARNING", sanitize_title(lines[0]), [], "WARNING header without a location")
    candidates = rip(lines) + frames_after(lines, CALL_TRACE)
    for src, prefix, type_, skip in _WARN_SPECIAL:
        if m.group(1).endswith(src):
            return in_func(type_, prefix, candidates, skip)
    if not candidates:  # old kernels print no RIP; the header names the function
        candidates = _header_func(m, 2)
    return in_func("WARNING", "WARNING", candidates)


def fault(title_prefix: str, type_: str = "BUG", skip: re.Pattern | None = None, corrupted=None):
    """Reports named by the faulting RIP, then the call trace."""
    def describe(lines: list[str]) -> Description:
        return in_func(type_, title_prefix, rip(lines) + frames_after(lines, CALL_TRACE), skip, corrupted=corrupted)
    return describe


def page_fault(lines: list[str]) -> Description:
    null = header(lines, re.compile(r"NULL pointer dereference"))
    what = "NULL pointer dereference" if null else "paging request"
    return fault(f"BUG: unable to handle kernel {what}")(lines)


_KERNEL_BUG = re.compile(r"kernel BUG at ([^:!]+)")


def kernel_bug(lines: list[str]) -> Description:
    src = header(lines, _KERNEL_BUG).group(1)
    if src.endswith("lib/list_debug.c"):
        return fault("BUG: corrupted list")(lines)
    if src.endswith("mm/usercopy.c"):
        return fault("BUG: bad usercopy", skip=re.compile(r"usercopy|^__check"))(lines)
    return fault("kernel BUG", skip=re.compile(r"^skb_"))(lines)


def stack_named(type_: str, title_prefix: str, skip: re.Pattern | None = None, pick=None,
                with_rip: bool = False):
    def describe(lines: list[str]) -> Description:
        candidates = (rip(lines) if with_rip else []) + frames_after(lines, CALL_TRACE)
        return in_func(type_, title_prefix, candidates, skip, pick)
    return describe


_OOPS_NAMES = [("invalid opcode", "invalid opcode"), ("divide error", "divide error"),
               ("divide_error", "divide error"), ("stack segment", "stack segment fault"),
               ("double fault", "PANIC: double fault")]


def oops(lines: list[str]) -> Description:
    first = lines[0]
    for needle, name in _OOPS_NAMES:
        if needle in first:
            return fault(name, "OOPS")(lines)
    # A bare "Oops: 0000 [#1]": the "BUG: ..." line that explains it is missing.
    return fault("Oops", "OOPS", corrupted="Oops without the line saying why")(lines)


_PANIC = re.compile(r"Kernel panic - not syncing:? ?(.*)")
# Panics that only follow up on an earlier report; alone, that report was lost.
_AFTERMATH = re.compile(r"Fatal exception|panic_on_\w+ set|hung_task: blocked tasks|softlockup: hung tasks|"
                        r"RCU Stall|\bset \.\.\.")


def panic(lines: list[str]) -> Description:
    msg = _PANIC.search(lines[0]).group(1).strip()
    if msg.startswith("stack-protector:"):
        fn = re.search(r"corrupted in: ?([A-Za-z_]\w*)", msg)
        if fn:
            return Description("PANIC", f"kernel panic: stack is corrupted in {fn.group(1)}", [fn.group(1)], None)
        return in_func("PANIC", "kernel panic: stack is corrupted", frames_after(lines, CALL_TRACE),
                       re.compile("stack_chk"))
    frames = useful(frames_after(lines, CALL_TRACE))
    corrupted = "panic after a report that is missing" if _AFTERMATH.search(msg) else None
    return Description("PANIC", sanitize_title(f"kernel panic: {msg}"), frames, corrupted)


def generic_bug(lines: list[str]) -> Description:
    m = re.search(r"BUG: (.*)", lines[0])
    return Description("BUG", sanitize_title(f"BUG: {m.group(1).rstrip('!')}"),
                       useful(rip(lines) + frames_after(lines, CALL_TRACE)), None)


# --- hangs and stalls ---------------------------------------------------------------------

_STALL_STOP = re.compile(r"^(?:</TASK>|NMI backtrace|Sending NMI|---\[ end|Kernel Offset)")


def rcu_stall(lines: list[str]) -> Description:
    # The interrupted code is after the timer interrupt entry (its RIP, then the
    # frames below the register dump); the stall extractor walks up to the
    # function that dispatched the looping work.
    irq = [i for i, t in enumerate(lines) if "apic_timer_interrupt" in t or "</IRQ>" in t]
    i = irq[-1] if irq else 0
    candidates = rip(lines[i:]) + frames_after(lines, stop=_STALL_STOP, start=i + 1)
    return in_func("RCU_STALL", "INFO: rcu detected stall", candidates, re.compile(r"rcu|apic_timer_interrupt"),
                   pick=stall_frame)


def soft_lockup(lines: list[str]) -> Description:
    return in_func("BUG", "BUG: soft lockup", rip(lines) + frames_after(lines, CALL_TRACE), pick=stall_frame)


def _kind(name, start, describe, **kw) -> Kind:
    return Kind(name, re.compile(start), describe, **kw)


_OOPS_FOLLOWUP = frozenset({"oops", "gpf"})
KINDS = [
    # A start pattern is never looser than what its describer reads from the header line:
    # a console line is the guest's, and "BUG: KASAN: ???" must not reach kasan().
    _kind("kasan", _KASAN.pattern, kasan, end=RULER),
    _kind("kmsan", _KMSAN.pattern, kmsan, end=RULER),
    _kind("kfence", _KFENCE.pattern, kfence, end=RULER),
    _kind("kcsan", r"BUG: KCSAN: ", kcsan, end=RULER),
    _kind("ubsan", r"^UBSAN: ", ubsan, end=re.compile(r"^={20,}$|^---\[ end trace"), task_end=True),
    _kind("circular-locking", r"^\[? ?(?:WARNING|INFO): possible circular locking dependency detected",
          lockdep("possible deadlock", r"is trying to acquire lock", 2, _WQ_SKIP), task_end=True),
    _kind("recursive-locking", r"^\[? ?(?:WARNING|INFO): possible recursive locking detected",
          lockdep("possible deadlock", r"is trying to acquire lock"), task_end=True),
    _kind("irq-lock-inversion", r"^\[? ?(?:WARNING|INFO): possible irq lock inversion dependency detected",
          lockdep("possible deadlock", r"just changed the state of lock"), task_end=True),
    _kind("irq-unsafe-order", r"^\[? ?(?:WARNING|INFO): \S+-safe -> \S+-unsafe lock order detected",
          lockdep("possible deadlock", r"which became \S+ at:|is trying to acquire"), task_end=True),
    _kind("inconsistent-lock-state", r"^\[? ?(?:WARNING|INFO): inconsistent lock state",
          inconsistent, task_end=True),
    _kind("suspicious-rcu", r"^\[? ?(?:WARNING|INFO): suspicious RCU usage", suspicious_rcu, task_end=True),
    _kind("bad-unlock-balance", r"^(?:WARNING|BUG): bad unlock balance detected", bad_unlock, task_end=True),
    _kind("held-lock-freed", r"^(?:WARNING|BUG): held lock freed",
          lockdep("WARNING: held lock freed", r"held lock freed"), task_end=True),
    _kind("lock-held-returning", r"^(?:WARNING|BUG): lock held when returning to user space",
          lockdep("WARNING: lock held when returning to user space", r"leaving the kernel with locks"),
          task_end=True),
    _kind("still-has-locks", r"^(?:WARNING|BUG): .*still has locks held",
          lockdep("WARNING: still has locks held", r"still has locks held"), task_end=True),
    _kind("non-static-key", r"^INFO: trying to register non-static key",
          lockdep_stack("INFO: trying to register non-static key", re.compile(r"stack|lock|IRQ")), task_end=True),
    _kind("invalid-wait-context", r"^BUG: Invalid wait context", lockdep_stack("WARNING: locking bug"),
          task_end=True),
    _kind("sleeping-function", r"^BUG: sleeping function called from invalid context",
          stack_named("BUG", "BUG: sleeping function called from invalid context"), task_end=True),
    _kind("scheduling-while-atomic", r"^BUG: scheduling while atomic",
          stack_named("BUG", "BUG: scheduling while atomic", re.compile(r"schedule")), task_end=True),
    _kind("soft-lockup", r"(?:^|watchdog: )BUG: soft lockup", soft_lockup, task_end=True),
    _kind("spinlock", r"^BUG: (?:spinlock|rwlock) ",
          lambda ls: stack_named("BUG", "BUG: " + re.search(r"BUG: (\w+ [\w ]+?)(?: on| in|:|$)", ls[0]).group(1),
                                 re.compile(r"spin_|_lock|_unlock"))(ls), task_end=True),
    _kind("stack-guard", r"^BUG: .*stack guard page was hit",
          stack_named("BUG", "BUG: stack guard page was hit", with_rip=True), end=END_TRACE,
          absorbs=_OOPS_FOLLOWUP),
    _kind("page-fault", r"^BUG: (?:unable to handle|kernel NULL pointer dereference|Unable to handle)",
          page_fault, end=END_TRACE, absorbs=_OOPS_FOLLOWUP),
    _kind("kernel-bug", _KERNEL_BUG.pattern, kernel_bug, end=END_TRACE, absorbs=_OOPS_FOLLOWUP),
    _kind("bug", r"^BUG: (?!no syscalls)", generic_bug, end=END_TRACE, task_end=True),
    _kind("warning", r"^WARNING: (?!The mand mount|Unprivileged eBPF|See https|kernel not compiled|"
          r"/etc/ssh|workqueue cpumask)", warning, end=END_TRACE),
    _kind("gpf", r"general protection fault(?!.* error:\d+ in )", fault("general protection fault", "GPF"),
          end=END_TRACE),
    _kind("oops", r"^(?:Oops: |invalid opcode: |divide.error: |stack segment: |PANIC: double fault)", oops,
          end=END_TRACE),
    _kind("panic", r"Kernel panic - not syncing", panic, end=re.compile(r"^---\[ end Kernel panic"),
          task_end=True, tail=True),
    _kind("hung-task", r"^INFO: task .* blocked for more than \d+ seconds",
          stack_named("HUNG_TASK", "INFO: task hung", pick=hang_frame), task_end=True),
    _kind("task-cant-die", r"^INFO: task .* can't die for more than",
          stack_named("HUNG_TASK", "INFO: task can't die", re.compile(r"schedule")), task_end=True),
    _kind("rcu-stall", r"(?:^|rcu: )INFO: rcu_(?:preempt|sched|bh) (?:self-)?detected (?:expedited )?stall",
          rcu_stall, task_end=True),
]


def start(text: str) -> Kind | None:
    for kind in KINDS:
        if kind.start.search(text):
            return kind
    return None
