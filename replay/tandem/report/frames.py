"""Stack frames in report text, helper frames to skip, and the guilty frame.

The guilty frame names a report (syzkaller's approach): the first frame of the
relevant stack that is not a sanitizer, locking, printing, allocation or
string helper, because those are where a bug is detected, not where it is.
"""
from __future__ import annotations

import re

# "[<ffffffff81234567>] func+0x12/0x40", " func+0x12/0x40 [module]", " ? func+...",
# symbolized " func+0x12/0x40 mm/x.c:12" and " inlined_func mm/x.c:12 [inline]".
_LINUX_FRAME = re.compile(
    r"^\s*(?:\[<?(?:0x)?[0-9a-f]+>?\]\s*){0,2}(\? )?([A-Za-z_][A-Za-z0-9_.$]*)"
    r"(?:\+0x([0-9a-f]+)/0x([0-9a-f]+)|(?= [\w./-]+:\d+ \[inline\]))")
# "RIP: 0010:func+0x12/0x40", "RIP: 0010:[<ffffffff...>]  [<ffffffff...>] func+0x24/0x30",
# "IP: [<ffffffff...>] func+0x24/0x30", "RIP: 0010:func mm/x.c:12".
_LINUX_RIP = re.compile(
    r"^(?:RIP|IP|NIP): (?:[0-9a-f]{4}:)?(?:\[<[0-9a-f]+>\]\s*){0,2}([A-Za-z_][A-Za-z0-9_.]*)(?:\+0x|\s)")
# FreeBSD ddb "func() at func+0x12/frame 0x...", KDB "#7 0xffffffff... at func+0xc".
_BSD_FRAME = re.compile(r"^\s*(?:([A-Za-z_][A-Za-z0-9_.]*)\(\) at |#\d+ 0x[0-9a-f]+ at )"
                        r"([A-Za-z_][A-Za-z0-9_.]*)\+0x[0-9a-f]+")
# Sanitizer runtimes: "    #1 0x55d5 in func /path/x.c:12" or "... in func (/lib/x.so+0x12)".
_USER_FRAME = re.compile(r"^\s*#\d+ 0x[0-9a-f]+ in ([^\s(]+)")

# Helpers: never the bug's location. Matched with re.search against the name.
SKIP = re.compile("|".join([
    r"^__sanitizer", r"^__asan", r"^__msan", r"^__ubsan", r"^__interceptor", r"kasan", r"kmsan",
    r"kcsan_setup_watchpoint", r"^check_memory_region", r"^check_heap_object", r"^print_address_description",
    r"panic", r"report_bug", r"fixup_bug", r"^do_error_trap", r"^do_trap", r"_trap$", r"^exc_", r"^asm_exc_",
    r"invalid_op", r"print_report", r"print_usage_bug", r"dump_stack", r"show_stack", r"^__warn",
    r"warn_slowpath", r"^warn_", r"^lockdep", r"lock_acquire", r"lock_release", r"lock_class", r"mark_lock",
    r"held_locks", r"spin_lock", r"spin_trylock", r"spin_unlock", r"read_lock", r"write_lock",
    r"read_unlock", r"write_unlock", r"^down$", r"^down_(read|write|trylock)", r"^up_(read|write)$",
    r"^_*mutex_", r"^_*rt_mutex_", r"^osq_", r"^__might_(sleep|resched|fault)", r"^might_(sleep|fault)",
    r"^atomic(64)?_", r"^(set|clear|test|change)_bit", r"^__wake_up", r"^refcount_", r"^kref_",
    r"^mem(cpy|set|move|cmp|chr|dup)", r"^str(n?cmp|l?cpy|ncpy|scpy|n?len|str|nstr|chr|n?dup)$",
    r"copy_(to|from)_user", r"copy_(page_)?(to|from)_iter", r"^_?(put|get)_user", r"^list_(add|del|replace|move|splice)",
    r"_indirect_thunk_", r"printk", r"^v?s?n?printf$", r"^v?k?asprintf", r"^dev_(info|notice|warn|err|alert|crit|emerg)",
    r"^k[mzc]?alloc", r"^kv[mz]alloc", r"^krealloc", r"^kmem_cache_", r"^slab_", r"^__slab_", r"^kfree$", r"^kvfree$",
    r"^kfree_skb", r"^__kmalloc", r"^alloc_pages", r"^__alloc_pages", r"^vmalloc", r"^__vmalloc",
    r"^debug_object", r"^(queue|flush|cancel)_(delayed_)?work", r"^__flush_work", r"^complete$",
    r"^wait_for_completion", r"^del_timer", r"^kobject_", r"^ubsan_", r"^handle_overflow", r"stack_trace_",
    r"^arch_stack_walk", r"^unwind_", r"^__dump_stack$", r"^check_slab_allocation$", r"^poison_slab_object$",
]))


def linux_frame(text: str) -> tuple[str, int | None, int | None, bool] | None:
    """(name, offset, size, questionable) of a Linux stack frame line, else None."""
    m = _LINUX_FRAME.match(text)
    if not m:
        return None
    off, size = (int(m.group(3), 16), int(m.group(4), 16)) if m.group(3) else (None, None)
    return base_name(m.group(2)), off, size, bool(m.group(1))


def linux_rip(text: str) -> str | None:
    m = _LINUX_RIP.match(text)
    return base_name(m.group(1)) if m else None


def bsd_frame(text: str) -> str | None:
    m = _BSD_FRAME.match(text)
    return base_name(m.group(2)) if m else None


def user_frame(text: str) -> str | None:
    m = _USER_FRAME.match(text)
    return m.group(1) if m else None


def base_name(name: str) -> str:
    """Drop compiler suffixes: "foo.isra.0", "foo.cold", "foo.constprop.3" -> "foo"."""
    return name.split(".", 1)[0] or name


def useful(frames: list[str], skip: re.Pattern | None = None) -> list[str]:
    """The frames that are not helpers, in order."""
    return [f for f in frames if not SKIP.search(f) and not (skip and skip.search(f))]


# Stalls loop across several functions; the frame just above where the work was
# dispatched (syscall entry, workqueue, timer, ...) is stable, the top one is not.
_STALL_ANCHOR = re.compile(
    r"^(do_syscall_|__do_fast_syscall|entry_SYSCALL|invoke_syscall|process_one_work|worker_thread|"
    r"call_timer_fn|__run_timers|run_timer_softirq|handle_softirqs|__do_softirq|do_softirq|run_ksoftirqd|"
    r"smpboot_thread_fn|kthread$|ret_from_fork|start_secondary|cpu_startup_entry|vfs_(read|write|ioctl)$|"
    r"__x64_sys_ioctl|__se_sys_ioctl|__do_sys_ioctl|sock_(sendmsg|recvmsg|ioctl)$|__sys_connect|"
    r"task_work_run|exit_to_user_mode|__fput$|tasklet_action|handle_mm_fault|do_user_addr_fault|"
    r"nfnetlink_rcv_msg|rtnetlink_rcv_msg|genl_rcv_msg|netlink_dump)")
_SYSCALL_PREFIX = re.compile(r"^(?:__(?:x64|ia32|arm64|se|do)_sys_|__sys_|ksys_|sys_)")


def stall_frame(frames: list[str]) -> str | None:
    prev = None
    for f in frames:
        if _STALL_ANCHOR.search(f):
            return _SYSCALL_PREFIX.sub("", prev) if prev else None
        prev = f
    return None


_HANG_BUCKETS = {"synchronize_rcu": "synchronize_rcu", "synchronize_srcu": "synchronize_rcu",
                 "synchronize_net": "synchronize_rcu", "synchronize_sched": "synchronize_rcu",
                 "rtnl_lock": "rtnl_lock"}
_HANG_SKIP = re.compile(r"sched|_lock|_slowlock|down|rwsem|completion|kthread|wait|synchronize|"
                        r"context_switch|__switch_to|schedule")


def hang_frame(frames: list[str]) -> str | None:
    """Hung tasks are victims: group the common waits (RCU, rtnl), else the first non-wait frame."""
    for f in frames:
        for anchor, bucket in _HANG_BUCKETS.items():
            if anchor in f:
                return bucket
    rest = [f for f in frames if not _HANG_SKIP.search(f)]
    return rest[0] if rest else None


_DYNAMIC = [
    (re.compile(r"\b0x[0-9a-f]+\b|\b[0-9a-f]{6,}\b"), "ADDR"),
    (re.compile(r"(\w)\+0x[0-9a-f]+/0x[0-9a-f]+"), r"\1"),
    (re.compile(r"(\.\w+):\d+(?::\d+)?"), r"\1:LINE"),
    (re.compile(r"\b\d+\.\d+\.\d+\.\d+\b"), "IP"),
    (re.compile(r"CPU#\d+"), "CPU"),
    (re.compile(r"(?<![\w.])\d+(?!\w)"), "NUM"),
]


def sanitize_title(title: str) -> str:
    """Titles must be equal for equal bugs: no addresses, numbers, offsets or line numbers."""
    for pattern, repl in _DYNAMIC:
        title = pattern.sub(repl, title)
    title = re.sub(r"[^\x20-\x7e]", "", title.replace("\t", " "))
    return re.sub(r" {2,}", " ", title).strip()[:120]
