"""Stack frames in BSD and userland report text, helper frames to skip, and titles.

The guilty frame names a report (syzkaller's approach): the first frame of the
relevant stack that is not a sanitizer, locking, printing, allocation or
string helper, because those are where a bug is detected, not where it is.
Linux reports follow syzkaller's own tables (linux.py, oops.py).
"""
from __future__ import annotations

import functools
import re
from typing import Callable

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


def bsd_frame(text: str) -> str | None:
    m = _BSD_FRAME.match(text)
    return base_name(m.group(2)) if m else None


def user_frame(text: str) -> str | None:
    m = _USER_FRAME.match(text)
    return m.group(1) if m else None


def base_name(name: str) -> str:
    """Drop compiler suffixes: "foo.isra.0", "foo.cold", "foo.constprop.3" -> "foo"."""
    return name.split(".", 1)[0] or name


# Whether a frame is a helper by SKIP, remembered for the last 2048 frames (the same
# frames recur in every report; oops.StackParams.skipped does the same for Linux).
_helper: Callable[[str], bool] = functools.lru_cache(maxsize=2048)(lambda frame: SKIP.search(frame) is not None)


def useful(frames: list[str], skip: re.Pattern | None = None) -> list[str]:
    """The frames that are not helpers, in order."""
    return [f for f in frames if not _helper(f) and not (skip and skip.search(f))]


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
