"""Linux kernel reports: sanitizers, lockdep, WARNING/BUG/Oops, panics, hangs and stalls.

Titles follow syzkaller's Linux parser so that tandem and syzbot name a bug alike:
its oops headers, their ordered title formats, the stack each format takes its
guilty frame from, its frame-skip lists and corruption rules are the tables below,
read by the engine in oops.py. Source: google/syzkaller pkg/report/linux.go,
commit 1e72964b, Apache-2.0. Measured on the even half of syzkaller's Linux test
consoles (../shared/syzkaller-reports/linux): tests/unit/test_report_syzkaller.py.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Callable

from .kind import Description, Kind, Table
from .needles import lines_holding
from .oops import (CORRUPTED_NO_FRAMES, FORMAT_CORRUPTED, MAX_FRAMES, NO_REPORT_MATCH, PARSE, WIDTH, Format, Marks,
                   Stack, StackParams, Step, compile, extract_description, stable_title)

# --- stacks -------------------------------------------------------------------------

RIP_FRAME = (r"(?:IP|NIP|pc |PC is at):? (?:(?:[0-9]+:)?(?:{{PC}} +){0,2}{{FUNC}}|(?:[0-9]+:)?0x[0-9a-f]+|"
             r"(?:[0-9]+:)?{{PC}} +\[< *\(null\)>\] +\(null\)|[0-9]+: +\(null\))")
RIP = compile(RIP_FRAME)
CALL_TRACE = compile(r"(?:Call (?:T|t)race:)|(?:Backtrace:)")
RISCV_STACK_START = compile(r"status: [0-9a-f]{16} badaddr: [0-9a-f]{16} cause: [0-9a-f]{16}")

# Helpers: where a bug is detected or reported, never where it is (searched in the name).
SKIP = (
    "__sanitizer", "__asan", "kasan", "hwasan", "__msan", "kmsan", "kcsan_setup_watchpoint",
    "check_memory_region", "check_heap_object", "check_object", "read_word_at_a_time",
    "(read|write)_once_.*nocheck", "print_address_description", "panic", "invalid_op", "report_bug", "fixup_bug",
    "print_report", "print_usage_bug", "do_error", "invalid_op", r"_trap$|do_trap", "show_stack", "dump_stack",
    "walk_stack", "dump_backtrace", "warn_slowpath", "warn_alloc", "warn_bogus", "__warn", "alloc_page",
    "k?v?(?:m|z|c)alloc", "krealloc", "kmem_cache", "allocate_slab", "__alloc_frozen_pages_noprof",
    "folio_(?:alloc|unlock)", "filemap_alloc_folio", "__filemap_get_folio", "find_or_create_page",
    "do_read_cache_folio", "read_cache_page", "pagecache_get_page", "grab_cache_page_write_begin", "slab_",
    "debug_object", "timer_is_static_object", "work_is_static_object", "__might_fault", "print_unlock",
    "imbalance_bug", "lockdep", "bh_enable", "bh_disable", "perf_trace", "lock_acquire", "lock_release",
    "lock_class", "mark_lock", "(reacquire|mark)_held_locks", "raw_spin_rq", "spin_lock", "spin_trylock",
    "spin_unlock", "read_lock", "read_trylock", "write_lock", "write_trylock", "read_unlock", "write_unlock",
    "^down$", "down_read", "down_write", "down_read_trylock", "down_write_trylock", "down_trylock", "up_read",
    "up_write", "^mutex_", "^__mutex_", "^rt_mutex_", "owner_on_cpu", "osq_lock", "osq_unlock",
    "atomic(64)?_(dec|inc|read|set|or|xor|and|add|sub|fetch|xchg|cmpxchg|try)", "(set|clear|change|test)_bit",
    "__wake_up", "^refcount_", "^kref_", "ref_tracker", "seqprop_assert", "memcpy", "memcmp", "memset", "memchr",
    "memmove", "memdup", "strcmp", "strncmp", "strcpy", "strlcpy", "strncpy", "strscpy", "strlen", "strstr",
    "strnstr", "strnlen", "strchr", "strdup", "strndup", "copy_to_user", "copy_from_user", "copy_to_iter",
    "copy_from_iter", "copy_page_to_iter", "copy_page_from_iter", "copy_folio_to_iter", "^copyin$", "^copyout$",
    "put_user", "get_user", "might_fault", "might_sleep", "list_add", "list_del", "list_replace", "list_move",
    "list_splice", "^rb_", "^__rb_", "_indirect_thunk_", "string", "pointer", "snprintf", "scnprintf",
    "kasprintf", "kvasprintf", "printk", "va_format", "dev_info", "dev_notice", "dev_warn", "dev_err",
    "dev_alert", "dev_crit", "dev_emerg", "program_check_exception", "program_check_common", "del_timer",
    "flush_work", "__cancel_work_timer", "cancel_work_sync", "try_to_grab_pending", "flush_workqueue",
    "drain_workqueue", "destroy_workqueue", "queue_work", "finish_wait", "kthread_stop", "kobject_",
    "add_uevent_var", "get_device_parent", "device_add", "device_del", "device_unregister", "device_destroy",
    "device_release", "devres_release_all", "hwrng_unregister", "i2c_del_adapter", "__unregister_client",
    "device_for_each_child", "rollback_registered", "unregister_netdev", "sysfs_remove", "device_remove_file",
    "tty_unregister_device", "dummy_urb_enqueue", "usb_kill_urb", "usb_kill_anchored_urbs", "usb_control_msg",
    "usb_hcd_submit_urb", "usb_submit_urb", "^complete$", "wait_for_completion", "^kv?free$", "kfree_skb",
    "readb$", "readw$", "readl$", "readq$", "writeb$", "writew$", "writel$", "writeq$", "logic_in", "logic_out",
    r"^crc\d+", "crc_itu_t", "__might_resched", "assertfail", "^iput$", "^iput_final$", "^ihold$",
    "hex_dump_to_buffer", "print_hex_dump", "^klist_", "(trace|lockdep)_(hard|soft)irq", "^(un)?lock_page",
    "stack_trace_consume_entry", "arch_stack_walk", "stack_trace_save", "insert_work", "__queue_delayed_work",
    "queue_delayed_work_on", "ida_free", "do_(kernel|translation)_fault", "do_mem_abort", "el1_abort",
    "el1h_64_sync(?:_handler)?", "print_tainted", "xas_(?:start|load|find)", "find_lock_entries",
    "truncate_inode_pages_range", "__phys_addr", "__fortify_report", "cleanup_srcu_struct", "rhashtable_lookup",
    "extract_(user|iter)_to_sg", "drop_nlink", "^get_taint$", "^put_device$", "lock_timer_base",
    "__timer_delete_sync", "sk_stop_timer_sync", "__mod_timer", "fast_dput", "dput", "mark_buffer_dirty",
)

PARAMS = StackParams(
    stack_starts=(compile(r"Call (?:T|t)race"), compile(r"Allocated:"), compile(r"Allocated by task [0-9]+:"),
                  compile(r"Freed:"), compile(r"Freed by task [0-9]+:"),
                  # "backtrace:" but not lockdep's "stack backtrace:"; kmemleak's may carry a crc
                  compile(r"[^k] backtrace(?: \(crc [0-9a-fA-F]*\))?:"), compile(r"Backtrace:"),
                  compile(r"Uninit was stored to memory at"), RISCV_STACK_START),
    # "(?:{{PC}} (?:{{PC}} |)|)": syzkaller's "(?:{{PC}} ){0,2}", the same greedy choices
    # (two, one, none) without `re`'s repeat machinery: 8% off the search tried on every
    # stack line (micro-benchmark, the corpus's 42,133 report lines, the same matches)
    frame_res=(compile(r"^ *(?:{{PC}} (?:{{PC}} |)|){{FUNC}}"),
               # arm: "[<c0..>] (callee) from [<c0..>] (caller+0x..": both names, the top
               # frame is only in the LR register that is not parsed
               compile(r"^ *{{PC}} \(([a-zA-Z0-9_.]+)\) from {{PC}} \({{FUNC}}")),
    skip=SKIP,
    # fault injection stacks are often intermixed with a report
    corrupted_lines=(compile(r"^(?: \[<?(?:0x)?[0-9a-f]+>?\])? should_fail(?:slab)?(?:\.[a-z0-9.]+)?\+0x"),),
    strip_prefixes=("SYSC_", "SyS_", "sys_", "__x64_", "__ia32_", "__arm64_", "____sys_", "___sys_", "__sys_",
                    "__se_", "__se_sys_", "__do_sys_", "compat_SYSC_", "compat_SyS_", "ksys_"),
)

# Stalls loop across several functions; the frame just above where the work was
# dispatched (syscall entry, workqueue, timer, ...) is stable, the top one is not.
_STALL_ANCHORS = re.compile("|".join((
    "process_one_work", "do_syscall_", "do_fast_syscall_", "sysenter_dispatch", "tracesys_phase2",
    "el0_svc_handler", "invoke_syscall", "ret_fast_syscall", "netif_receive_skb", "do_softirq", "call_timer_fn",
    "_run_timers", "run_timer_softirq", "hrtimer_run", "run_ksoftirqd", "smpboot_thread_fn", "^kthread$",
    "start_secondary", "cpu_startup_entry", "ret_from_fork",
    "vfs_write", "vfs_read", "vfs_iter_read", "vfs_iter_write", "do_iter_read", "do_iter_write", "call_read_iter",
    "call_write_iter", "new_sync_read", "new_sync_write", "vfs_ioctl", "ksys_ioctl", "compat_ioctl",
    "compat_sys_ioctl", "blkdev_driver_ioctl", "blkdev_ioctl", "^call_read_iter", "^call_write_iter",
    "do_iter_readv_writev", "^call_mmap", "mmap_region", "do_mmap", "do_dentry_open", "vfs_open",
    "^sock_sendmsg", "^sock_recvmsg", "^sock_release", "^__sock_release", "^setsockopt$", "kernel_setsockopt",
    "sock_common_setsockopt", "^listen$", "kernel_listen", "sk_common_release", "^sock_mmap", "^accept$",
    "kernel_accept", "^sock_do_ioctl", "^sock_ioctl", "^compat_sock_ioctl", "^nfnetlink_rcv_msg",
    "^rtnetlink_rcv_msg", "^netlink_dump", "^(sys_)?(socketpair|connect|ioctl)",
    "__do_fault", "do_page_fault", "^page_fault$",
    "__fput", "task_work_run", "exit_to_usermode", "smp_call_function", "tasklet_action", "tasklet_hi_action",
)), re.ASCII)


# Whether a frame is a dispatcher, remembered for the last 2048 frames (as oops'
# StackParams.skipped: the same frames recur in every stall report, and the search of the
# 75 anchors tries them at every character of the frame).
_is_anchor: Callable[[str], bool] = functools.lru_cache(maxsize=2048)(
    lambda frame: _STALL_ANCHORS.search(frame) is not None)


def stall_frame(frames: list[str]) -> tuple[str, int]:
    """The frame above the first dispatcher of the looping work (or that frame if it is first)."""
    prev, prev_idx = frames[0], 0
    for i, frame in enumerate(frames):
        if _is_anchor(frame):
            if "smp_call_function" in frame:
                return "smp_call_function", i
            return prev, prev_idx
        prev, prev_idx = frame, i
    return "", -1


_HANG_ANCHORS = {"rtnl_lock": "", "synchronize_rcu": "synchronize_rcu", "synchronize_srcu": "synchronize_rcu",
                 "synchronize_net": "synchronize_rcu", "synchronize_sched": "synchronize_rcu"}
_HANG_SKIP = ("sched", "_lock", "_slowlock", "down", "rwsem", "completion", "kthread", "wait", "synchronize",
              "context_switch", "__switch_to", "cancel_delayed_work", "rcu_barrier")


def hang_frame(frames: list[str]) -> tuple[str, int]:
    """Hung tasks are victims: group the common waits (RCU, rtnl), else the first non-wait frame."""
    for i, frame in enumerate(frames):
        for anchor, bucket in _HANG_ANCHORS.items():
            if anchor in frame:
                return bucket or frame, i
    for i, frame in enumerate(frames):
        if not any(s in frame for s in _HANG_SKIP):
            return frame, i
    return "", -1


def stack(*parts, parts2=(), skip=(), extractor=None) -> Stack:
    return Stack(tuple(parts), tuple(parts2), tuple(skip), extractor)


def trace(*skip, extractor=None) -> Stack:
    """The frames after "Call Trace:"."""
    return stack(CALL_TRACE, PARSE, skip=skip, extractor=extractor)


def rip_trace(*skip, extractor=None) -> Stack:
    """The faulting RIP, then the frames after "Call Trace:"."""
    return stack(RIP, CALL_TRACE, PARSE, skip=skip, extractor=extractor)


def warning_stack(*skip) -> Stack:
    # Newer kernels trap and the stack starts at the RIP (powerpc: "--- interrupt:"), older print the stack.
    return stack(compile("(?:" + RIP_FRAME + r"|--- interrupt: [0-9]+ at {{FUNC}})"), PARSE,
                 parts2=(CALL_TRACE, PARSE), skip=skip)


def F(title: str, fmt: str, report=(), stack=None, no_stack=False, corrupted=False) -> Format:
    """A title format; fmt's {N} is capture N of the title (or report), then the stack's frame."""
    steps = tuple(s if isinstance(s, Step) else Step(compile(s)) for s in report)
    return Format(compile(title), fmt, steps, stack, no_stack, corrupted)


def later(pattern: str) -> Step:
    """A report step on a later line, its last match there (syzkaller's "(?:.*\\n)+?.*X")."""
    return Step(compile(pattern), last=True)


# --- the oops table ---------------------------------------------------------------------

@dataclass(frozen=True)
class Oops:
    header: str
    formats: tuple[Format, ...]
    suppressions: tuple[re.Pattern, ...] = ()


def O(header: str, formats: list[Format], suppressions: tuple[str, ...] = ()) -> Oops:
    return Oops(header, tuple(formats), tuple(compile(s) for s in suppressions))


_KMSAN_STACK = (PARSE, compile("(Local variable .* created at:|Uninit was created at:)"), PARSE)
_LOCKS_AT = "at: (?:{{PC}} +)?{{FUNC}}"

OOPSES = [
    O("BUG:", [
        F("BUG: KASAN:", "KASAN: {1} {3} in {4}",
          report=(r"BUG: KASAN: ([a-z\-]+) in {{FUNC}}", later(r"(Read|Write) (?:of size|at addr) (?:[0-9a-f]+)")),
          stack=stack(compile(r"BUG: KASAN: (?:[a-z\-]+) in {{FUNC}}"), CALL_TRACE, PARSE,
                      skip=("kernel_fault", "tag_check", "mem_abort", "^el1_", "^el1h_"))),
        F("BUG: KASAN:", "KASAN: invalid-free in {2}",
          report=(r"BUG: KASAN: (?:double-free or invalid-free|double-free|invalid-free) in {{FUNC}}",),
          stack=stack(compile(r"BUG: KASAN: (?:double-free or invalid-free|double-free|invalid-free) in {{FUNC}}"),
                      CALL_TRACE, PARSE, skip=("slab_", "kfree", "vunmap", "vfree"))),
        F(r"BUG: KASAN: ([a-z\-]+) on address", "KASAN: {1} {2}",
          report=(r"BUG: KASAN: ([a-z\-]+) on address", later(r"(Read|Write) of size ([0-9]+)"))),
        F(r"BUG: KASAN: (.*)", "KASAN: {1}", corrupted=True),
        F("BUG: KMSAN: kernel-usb-infoleak", "KMSAN: kernel-usb-infoleak in {2}",
          report=("BUG: KMSAN: kernel-usb-infoleak in {{FUNC}}",),
          stack=stack(*_KMSAN_STACK, skip=("alloc_skb", "usb_submit_urb", "usb_start_wait_urb", "usb_bulk_msg",
                                           "usb_interrupt_msg", "usb_control_msg")), no_stack=True),
        F("BUG: KMSAN:", "KMSAN: {1} in {3}", report=(r"BUG: KMSAN: ([a-z\-]+) in {{FUNC}}",),
          stack=stack(*_KMSAN_STACK, skip=("alloc_skb", "netlink_ack", "netlink_rcv_skb",
                                           # crypto is where the bug is hit, a poor title
                                           "_encrypt$", "^(?:crypto|cipher|drbg|rng)_")), no_stack=True),
        F("BUG: KCSAN: data-race", "KCSAN: {1}", report=("BUG: KCSAN: (.*)",), no_stack=True),
        F("BUG: KCSAN:", "KCSAN: {1}", report=("BUG: KCSAN: (.*)",), no_stack=True),
        F("BUG: KFENCE: (use-after-free|out-of-bounds) (read|write) in {{FUNC}}", "KFENCE: {1} {2} in {4}",
          stack=stack(compile(r"BUG: KFENCE: (?:[a-z\- ]+) in {{FUNC}}"), PARSE)),
        F("BUG: KFENCE: invalid free in {{FUNC}}", "KFENCE: invalid free in {2}", no_stack=True,
          stack=stack(compile(r"BUG: KFENCE: (?:[a-z\- ]+) in {{FUNC}}"), PARSE)),
        F("BUG: KFENCE: invalid (read|write) in {{FUNC}}", "KFENCE: invalid {1} in {3}",
          stack=stack(compile(r"BUG: KFENCE: (?:[a-z\- ]+) in {{FUNC}}"), PARSE)),
        F("BUG: KFENCE: memory corruption in {{FUNC}}", "KFENCE: memory corruption in {2}", no_stack=True,
          stack=stack(compile(r"BUG: KFENCE: (?:[a-z\- ]+) in {{FUNC}}"), PARSE)),
        F("BUG: (?:unable to handle kernel paging request|unable to handle page fault for address|"
          "Unable to handle kernel data access)", "BUG: unable to handle kernel paging request in {1}",
          stack=rip_trace()),
        F("BUG: (?:unable to handle kernel NULL pointer dereference|kernel NULL pointer dereference|"
          "Kernel NULL pointer dereference)", "BUG: unable to handle kernel NULL pointer dereference in {1}",
          stack=rip_trace()),
        # The two halves of this header are two printk()s: the second may be lost.
        F("BUG: (?:unable to handle kernel|Unable to handle kernel)", "BUG: unable to handle kernel", corrupted=True),
        F("BUG: (spinlock|rwlock) (lockup suspected|already unlocked|recursion|cpu recursion|bad magic|"
          "wrong owner|wrong CPU|trylock failure on UP)", "BUG: {1} {2} in {3}",
          stack=trace("spin_", "_lock", "_unlock")),
        F("BUG: soft lockup", "BUG: soft lockup in {1}", stack=rip_trace(extractor=stall_frame)),
        F("BUG: .*still has locks held!", "BUG: still has locks held in {1}",
          report=("BUG: .*still has locks held!", later("{{PC}} +{{FUNC}}"))),
        F("BUG: scheduling while atomic", "BUG: scheduling while atomic in {1}", stack=trace("schedule")),
        F("BUG: lock held when returning to user space", "BUG: lock held when returning to user space in {1}",
          report=("BUG: lock held when returning to user space", later("leaving the kernel with locks still held"),
                  later(_LOCKS_AT)), no_stack=True),
        F("BUG: bad unlock balance detected!", "BUG: bad unlock balance in {1}",
          stack=stack(compile("{{PC}} +{{FUNC}}"), CALL_TRACE, PARSE)),
        F("BUG: held lock freed!", "BUG: held lock freed in {1}",
          report=("BUG: held lock freed!", later("{{PC}} +{{FUNC}}"))),
        F("BUG: Bad rss-counter state", "BUG: Bad rss-counter state", no_stack=True),
        F("BUG: non-zero nr_ptes on freeing mm", "BUG: non-zero nr_ptes on freeing mm", no_stack=True),
        F("BUG: non-zero nr_pmds on freeing mm", "BUG: non-zero nr_pmds on freeing mm", no_stack=True),
        # The filesystem and block device (loop0/1/2) would split one bug into many.
        F("BUG: Dentry .* still in use", "BUG: Dentry still in use in {1}",
          report=(r"BUG: Dentry .* still in use \([0-9]+\) \[(unmount) of ([^\]]+)\]",)),
        F("BUG: Bad page (state|cache)", "BUG: Bad page {1} in {2}",
          stack=stack(compile("page last allocated"), PARSE,
                      skip=("(free|put|get|update|release)_page", "free_unref", "^_*folio", "truncate_inode_pages",
                            "page_frag_free", "alloc", "vmap", "page_owner"))),
        F("BUG: Bad page map", "BUG: Bad page map"),
        F("BUG: workqueue lockup", "BUG: workqueue lockup", no_stack=True),
        F("BUG: sleeping function called from invalid context at (.*)",
          "BUG: sleeping function called from invalid context in {2}", stack=trace()),
        F(r"BUG: using ([a-z_]+)\(\) in preemptible", "BUG: using {1}() in preemptible code in {2}",
          stack=trace("dump_stack", "preemption", "preempt", "debug_", "processor_id", "this_cpu")),
        F("BUG: workqueue leaked lock or atomic", "BUG: workqueue leaked lock or atomic in {1}",
          report=("BUG: workqueue leaked lock or atomic", Step(compile(r"last function: ([a-zA-Z0-9_]+)$"))),
          no_stack=True),
        F("BUG: memory leak", "memory leak in {1}",
          stack=stack(compile(r"backtrace(?: \(crc [0-9a-fA-F]*\))?:"), PARSE,
                      skip=("kmemleak", "mmap", "kmem", "slab", "alloc", "create_object", "idr_get",
                            "list_lru_init", "kasprintf", "kvasprintf", "pcpu_create", "strdup", "strndup",
                            "memdup"))),
        F("BUG: .*stack guard page was hit at", "BUG: stack guard page was hit in {1}",
          stack=rip_trace(extractor=stall_frame)),
        # arm/arm64 say this differently from amd64: one title for both.
        F("BUG: Invalid wait context", "WARNING: locking bug in {1}", stack=trace("lock_sock", "release_sock")),
        F(r"BUG:\s*$", "BUG: corrupted", corrupted=True),
    ], ("ODEBUG:", "Boot_DEBUG:", "xlog_status:", "DEBUG:", "BUG: no syscalls can create resource")),
    O("WARNING:", [
        F(r"WARNING: .*lib/debugobjects\.c.* (?:debug_print|debug_check|at)", "WARNING: ODEBUG bug in {1}",
          stack=warning_stack("debug_", "rcu", "hrtimer_", "timer_", "work_", "percpu_", "vunmap", "vfree",
                              "__free_", "debug_check", "kobject_")),
        F(r"WARNING: .*mm/usercopy\.c.* (?:usercopy_warn|at)", "WARNING: bad usercopy in {1}",
          stack=warning_stack("usercopy", "__check")),
        F(r"WARNING: .*lib/kobject\.c.* (?:kobject_|at)", "WARNING: kobject bug in {1}",
          stack=warning_stack("kobject_")),
        F(r"WARNING: .*fs/proc/generic\.c.* (?:proc_register|at)", "WARNING: proc registration bug in {1}",
          stack=warning_stack("proc_")),
        F(r"WARNING: .*lib/refcount\.c.* (?:refcount_|at)", "WARNING: refcount bug in {1}",
          stack=warning_stack("refcount", "kobject_")),
        F(r"WARNING: .*kernel/locking/lockdep\.c.*lock_", "WARNING: locking bug in {1}",
          stack=warning_stack("lock_sock", "release_sock")),
        F("WARNING: .*still has locks held!", "WARNING: still has locks held in {1}",
          report=("WARNING: .*still has locks held!", later("at: {{FUNC}}"))),
        F("WARNING: Nested lock was not taken", "WARNING: nested lock was not taken in {1}", stack=warning_stack()),
        F("WARNING: lock held when returning to user space",
          "WARNING: lock held when returning to user space in {1}",
          report=("WARNING: lock held when returning to user space",
                  later("leaving the kernel with locks still held"), later(_LOCKS_AT)), no_stack=True),
        F(r"WARNING: .*mm/.*\.c.* k?.?malloc", "WARNING: kmalloc bug in {1}",
          stack=warning_stack("kmalloc", "krealloc", "slab", "kmem")),
        F(r"WARNING: .*mm/vmalloc.c.*__vmalloc_node", "WARNING: zero-size vmalloc in {1}", stack=warning_stack()),
        F("WARNING: .* usb_submit_urb", "WARNING in {1}/usb_submit_urb",
          stack=warning_stack("usb_submit_urb", "usb_start_wait_urb", "usb_bulk_msg", "usb_interrupt_msg",
                              "usb_control_msg")),
        F(r"WARNING: {{SRC}} at 0x\d+, CPU#\d+", "WARNING in {2}", stack=warning_stack()),
        F("WARNING: .* at {{SRC}} {{FUNC}}", "WARNING in {3}", stack=warning_stack()),
        F("WARNING: {{SRC}} at {{FUNC}}", "WARNING in {3}", stack=warning_stack()),
        F(r"WARNING: \[.*\] {{SRC}} at {{FUNC}}.*", "WARNING in {3}", stack=warning_stack()),
        F("WARNING: possible circular locking dependency detected", "possible deadlock in {1}",
          report=("WARNING: possible circular locking dependency detected", later("is trying to acquire lock")),
          stack=stack(compile(_LOCKS_AT), compile(_LOCKS_AT), PARSE,
                      # workqueue functions take the locks of work items: not the culprit
                      skip=("process_one_work", "flush_workqueue", "drain_workqueue", "destroy_workqueue"))),
        F("WARNING: possible irq lock inversion dependency detected", "possible deadlock in {1}",
          report=("WARNING: possible irq lock inversion dependency detected",
                  later("just changed the state of lock"), later(_LOCKS_AT))),
        F("WARNING: .*-safe -> .*-unsafe lock order detected", "possible deadlock in {1}",
          stack=stack(compile("which became (?:.*) at:"), PARSE)),
        F("WARNING: possible recursive locking detected", "possible deadlock in {1}",
          report=("WARNING: possible recursive locking detected", later("is trying to acquire lock"),
                  later(_LOCKS_AT))),
        F("WARNING: inconsistent lock state", "inconsistent lock state in {2}",
          report=("WARNING: inconsistent lock state", later("takes"), later(_LOCKS_AT)), stack=trace()),
        F("WARNING: suspicious RCU usage", "WARNING: suspicious RCU usage in {2}",
          report=("WARNING: suspicious RCU usage", Step(compile("{{SRC}}"))), stack=trace("rcu", "kmem", "slab")),
        F("WARNING: kernel stack regs at [0-9a-f]+ in [^ ]* has bad '([^']+)' value",
          "WARNING: kernel stack regs has bad '{1}' value", no_stack=True),
        F("WARNING: kernel stack frame pointer at [0-9a-f]+ in [^ ]* has bad value",
          "WARNING: kernel stack frame pointer has bad value", no_stack=True),
        F("WARNING: bad unlock balance detected!", "WARNING: bad unlock balance in {1}",
          stack=stack(compile("{{PC}} +{{FUNC}}"), CALL_TRACE, PARSE)),
        F("WARNING: held lock freed!", "WARNING: held lock freed in {1}",
          report=("WARNING: held lock freed!", later("at:(?: {{PC}})? +{{FUNC}}"))),
        F("WARNING: kernel stack regs .* has bad 'bp' value", "WARNING: kernel stack regs has bad value",
          no_stack=True),
        F("WARNING: kernel stack frame pointer .* has bad value", "WARNING: kernel stack regs has bad value",
          no_stack=True),
        F(r"WARNING:\s*$", "WARNING: corrupted", corrupted=True),
    ], ("WARNING: /etc/ssh/moduli does not exist, using fixed modulus",
        "WARNING: workqueue cpumask: online intersect > possible intersect", "WARNING: [Tt]he mand mount option",
        r"WARNING: Unsupported flag value\(s\) of 0x%x in DT_FLAGS_1",
        "WARNING: Unprivileged eBPF is enabled with eIBRS",
        r"WARNING: fbcon: Driver '[^']*' missed to adjust virtual screen size \(\d+x\d+ vs\. \d+x\d+\)",
        r"WARNING: See https.* for mitigation options\.", "WARNING: kernel not compiled with CPU_SRSO",
        r"EXT4-[Ff][Ss](?: \(.*\))?:", r"(?i)warning: .* uses (deprecated v2 capabilities|wireless extensions)",
        r"XFS \(\w+\): WARNING")),
    O("INFO:", [
        F("INFO: possible circular locking dependency detected", "possible deadlock in {1}",
          report=(r"INFO: possible circular locking dependency detected \]", later("is trying to acquire lock"),
                  later("at: {{PC}} +{{FUNC}}"))),
        F("INFO: possible irq lock inversion dependency detected", "possible deadlock in {1}",
          report=(r"INFO: possible irq lock inversion dependency detected \]",
                  later("just changed the state of lock"), later("at: {{PC}} +{{FUNC}}"))),
        F("INFO: SOFTIRQ-safe -> SOFTIRQ-unsafe lock order detected", "possible deadlock in {1}",
          report=(r"INFO: SOFTIRQ-safe -> SOFTIRQ-unsafe lock order detected \]", later("is trying to acquire"),
                  later("at: {{PC}} +{{FUNC}}"))),
        F("INFO: possible recursive locking detected", "possible deadlock in {1}",
          report=(r"INFO: possible recursive locking detected \]", later("is trying to acquire lock"),
                  later("at: {{PC}} +{{FUNC}}"))),
        F("INFO: inconsistent lock state", "inconsistent lock state in {1}",
          report=(r"INFO: inconsistent lock state \]", later("takes"), later("at: {{PC}} +{{FUNC}}"))),
        F("INFO: rcu_(?:preempt|sched|bh|tasks) (?:self-)?detected(?: expedited)? stall",
          "INFO: rcu detected stall in {1}",
          stack=stack(compile("apic_timer_interrupt"), RIP, PARSE,
                      parts2=(compile("(?:apic_timer_interrupt|Exception stack|el1h_64_irq)"), PARSE),
                      skip=("apic_timer_interrupt", "rcu"), extractor=stall_frame)),
        F("INFO: trying to register non-static key", "INFO: trying to register non-static key in {1}",
          stack=trace("stack", "lock", "IRQ")),
        F("INFO: suspicious RCU usage", "INFO: suspicious RCU usage in {2}",
          report=("INFO: suspicious RCU usage", Step(compile("{{SRC}}"))), stack=trace("rcu", "kmem", "slab")),
        F("INFO: task {{TASK}} blocked (?:in I/O wait )?for more than [0-9]+ seconds", "INFO: task hung in {1}",
          stack=trace(extractor=hang_frame)),
        F("INFO: task {{TASK}} can't die for more than .* seconds", "INFO: task can't die in {1}",
          stack=trace("schedule")),
        # Corrupted old-style KASAN reports.
        F("INFO: (Freed|Allocated) in (.*)", "INFO: {1} in {2}", corrupted=True),
        F(r"INFO:\s*$", "INFO: corrupted", corrupted=True),
    ], ("INFO: lockdep is turned off", "INFO: Stall ended before state dump start", "INFO: NMI handler",
        "INFO: recovery required on readonly filesystem", "(handler|interrupt).*took too long",
        "INFO: sys_.* is not present in /proc/kallsyms", "INFO: no syscalls can create resource",
        "rmt_storage:INFO:", "_INFO:")),
    O("Unable to handle kernel", [
        F("Unable to handle kernel (paging request|NULL pointer dereference|access to user memory)",
          "BUG: unable to handle kernel {1} in {2}", stack=rip_trace()),
    ]),
    O("general protection fault", [
        F("general protection fault.*:", "general protection fault in {1}", stack=rip_trace()),
    ], (r"general protection fault .* error:\d+ in ",)),
    O("stack segment: ", [F("stack segment: ", "stack segment fault in {1}", stack=rip_trace())]),
    O("Kernel panic", [
        # For stack corruption the kernel may fail to name the function and/or to unwind.
        F("Kernel panic - not syncing: stack-protector:", "kernel panic: stack is corrupted in {1}",
          report=("Kernel panic - not syncing: stack-protector: Kernel stack is corrupted in: {{FUNC}}",),
          no_stack=True),
        F("Kernel panic - not syncing: stack-protector:", "kernel panic: stack is corrupted in {1}",
          report=("Kernel panic - not syncing: stack-protector: Kernel stack is corrupted in: [a-f0-9]+",),
          stack=trace("stack_chk")),
        F("Kernel panic - not syncing: corrupted stack end", "kernel panic: corrupted stack end in {1}",
          report=("Kernel panic - not syncing: corrupted stack end detected inside scheduler",),
          stack=trace("schedule", "retint_kernel", extractor=stall_frame)),
        F("Kernel panic - not syncing: kernel stack overflow", "kernel stack overflow in {1}",
          stack=trace("bad_stack", extractor=stall_frame)),
        F("Kernel panic - not syncing: Attempted to kill init!", "kernel panic: Attempted to kill init!"),
        F("Kernel panic - not syncing: Couldn't open N_TTY ldisc for [^ ]+ --- error -[0-9]+",
          "kernel panic: Couldn't open N_TTY ldisc"),
        # These follow a report (BUG, WARNING/KASAN with panic_on_warn, hung task): alone,
        # the report before them was lost.
        F("Kernel panic - not syncing: Fatal exception", "kernel panic: Fatal exception", corrupted=True),
        F("Kernel panic - not syncing: panic_on_warn set", "kernel panic: panic_on_warn set", corrupted=True),
        F("Kernel panic - not syncing: hung_task: blocked tasks", "kernel panic: hung_task: blocked tasks",
          corrupted=True),
        F("Kernel panic - not syncing: (.*)", "kernel panic: {1}"),
    ]),
    O("PANIC: double fault", [F("PANIC: double fault", "PANIC: double fault in {1}", stack=stack(RIP))]),
    O("rust_kernel: panicked", [
        F("rust_kernel: panicked", "{1} in {2}", report=("rust_kernel: panicked at ", Step(compile("^(.+)$"))),
          stack=trace(re.escape("__rustc::rust_begin_unwind"))),
    ]),
    O("kernel BUG", [
        F("kernel BUG at mm/usercopy.c", "BUG: bad usercopy in {1}", stack=trace("usercopy", "__check")),
        # also memory corruption or a race, sometimes
        F("kernel BUG at lib/list_debug.c", "BUG: corrupted list in {1}", stack=trace()),
        # Many skb wrappers BUG_ON(): the bug is almost always in the caller.
        F("kernel BUG at (.*)", "kernel BUG in {2}", stack=rip_trace("^skb_")),
    ]),
    O("Kernel BUG", [F("Kernel BUG (.*)", "kernel BUG {1}")]),
    O("BUG kmalloc-", [F("BUG kmalloc-.*: Object already free", "BUG: Object already free")]),
    O("divide error:", [F("divide error: ", "divide error in {1}", stack=stack(RIP))]),
    # The misspelling of 9d06c4027f21 ("x86/entry: Convert Divide Error to IDTENTRY").
    O("divide_error:", [F("divide_error: ", "divide error in {1}", stack=stack(RIP))]),
    O("invalid opcode:", [F("invalid opcode: ", "invalid opcode in {1}", stack=stack(RIP))]),
    O("int3:", [F("int3: ", "int3 in {1}", stack=rip_trace())]),
    O("UBSAN:", [
        F("UBSAN:", "UBSAN: undefined-behaviour in {1}", report=("UBSAN: Undefined behaviour in",),
          stack=trace("ubsan", "overflow")),
        F("UBSAN: array-index-out-of-bounds in", "UBSAN: array-index-out-of-bounds in {1}",
          stack=trace("ubsan", "overflow")),
        F("UBSAN:", "UBSAN: {1} in {2}", report=("UBSAN: (.*?) in",), stack=trace("ubsan", "overflow")),
    ]),
    # The fuzzer reads the boot messages back and passes them as a mount option: the
    # kernel prints them again inside an "invalid option" line.
    O("Booting the kernel.", [F("^Booting the kernel", "unexpected kernel reboot", no_stack=True)],
      ("Parsing ELF|Decompressing Linux|Unknown parameter '",)),
    O("unregister_netdevice: waiting for", [
        F("unregister_netdevice: waiting for (?:.*) to become free",
          "unregister_netdevice: waiting for DEV to become free", no_stack=True)]),
    O("VFS: Close: file count is 0", [
        F("VFS: Close: file count is 0", "VFS: Close: file count is zero (use-after-free)", no_stack=True)]),
    O("VFS: Busy inodes after unmount", [
        F("VFS: Busy inodes after unmount", "VFS: Busy inodes after unmount (use-after-free)", no_stack=True)]),
    O("Internal error:", [F("Internal error:", "Internal error in {1}", stack=rip_trace())]),
    O("Unhandled fault:", [F("Unhandled fault:", "Unhandled fault in {1}", stack=rip_trace())]),
    O("Alignment trap:", [F("Alignment trap:", "Alignment trap in {1}", stack=rip_trace())]),
    O("trusty: panic", [
        F("trusty: panic.* ASSERT FAILED", "trusty: ASSERT FAILED: {1}",
          report=(r"trusty: panic \([^)]*\):(?: DEBUG)? ASSERT FAILED at \([^)]*\): (.+)",), no_stack=True),
        F("trusty: panic.* ASSERT FAILED.*: *(.*)", "trusty: ASSERT FAILED: {1}", corrupted=True),
        F("trusty: panic", "trusty: panic: {1}", report=(r"trusty: panic \([^)]*\): (.+)",), no_stack=True),
    ]),
    O("fatal error:", [F("fatal error:", "go runtime error", no_stack=True)],
      ("ALSA", "fatal error: cannot create timer")),
    # Produced by syzkaller's executor and tools.
    O("SYZFAIL:", [F("SYZFAIL:(.*)", "SYZFAIL:{1}", no_stack=True)]),
    O("SYZFATAL:", [F("SYZFATAL:(.*)", "SYZFATAL:{1}", no_stack=True)]),
    O("panic:", [
        F("panic: Sentry detected .* stuck task", "panic: Sentry detected stuck tasks", no_stack=True),
        F("panic:(.*)", "panic:{1}", no_stack=True),
    ], ("_panic:", "xlog_status:", r"ddb\.onpanic:", "evtlog_status:")),
]

# These lines do not start a report inside another one: the aftermath of a report or
# a part of it.
REPORT_START_IGNORES = tuple(compile(p) for p in (
    "invalid opcode: 0000", "Kernel panic - not syncing", "unregister_netdevice: waiting for",
    # a double fault can happen while handling a page fault on badly corrupted memory
    "PANIC: double fault", "Internal error:"))
# Kernel messages with a stack that are no bug: inside a report, its end.
INFO_WITH_STACK = ("vmalloc: allocation failure:", "FAULT_INJECTION: forcing a failure",
                   "FAULT_FLAG_ALLOW_RETRY missing")
# Of a report this long, a later panic (panic_on_warn) or a lockdep report induced by
# the oops is left out: that stack repeats the report's.
_MIN_LINES, _MIN_LINES_KMSAN = 22, 16
_STOP_AT = ("Kernel panic - not syncing", "WARNING: possible circular locking dependency detected")


def _report_lines(lines: list[str], caller: bool) -> tuple[list[str], list[str]]:
    """syzkaller's findReport on a report's lines (other contexts already left out): the
    lines its title comes from (up to a message with a stack of its own, unless the lines
    carry a printk caller id) and all of them. Only the lines holding one of the texts
    it looks for are looked at one by one (found with str.find in the lines joined:
    checking every line would be a fifth of describing)."""
    cut = [text[:WIDTH] for text in lines]
    marked = _marked_lines(cut)
    if not marked:
        return cut, cut
    limit = _MIN_LINES_KMSAN if "BUG: KMSAN:" in lines[0] else _MIN_LINES
    out: list[str] = []
    title_end = None
    done = 0            # cut[:done] are in out or left out
    for i in marked:
        out += cut[done:i]
        done = i + 1
        text = cut[i]
        if "Disabling lock debugging due to kernel taint" in text:
            continue
        if i + 1 > limit and any(s in text for s in _STOP_AT):
            break
        if title_end is None and not caller and any(s in text for s in INFO_WITH_STACK):
            title_end = len(out)
        out.append(text)
    else:
        out += cut[done:]
    return out[:title_end] if title_end is not None else out, out


_MARKS = ("Disabling lock debugging due to kernel taint", *_STOP_AT, *INFO_WITH_STACK)


def _marked_lines(lines: list[str]) -> list[int]:
    """Indices of the lines after the first that hold one of _MARKS, in order."""
    return [i for i in lines_holding(_MARKS, "\n".join(lines)) if i > 0]


# --- types -----------------------------------------------------------------------------

_TYPES = [
    ("KASAN", ("KASAN:",)), ("KMSAN", ("KMSAN:",)), ("KFENCE", ("KFENCE:",)), ("KCSAN", ("KCSAN:",)),
    ("UBSAN", ("UBSAN:",)),
    ("LOCKDEP", ("possible deadlock", "inconsistent lock state", "WARNING: suspicious RCU", "INFO: suspicious RCU",
                 "BUG: bad unlock balance", "WARNING: bad unlock balance", "BUG: held lock freed",
                 "WARNING: held lock freed", "BUG: still has locks held", "WARNING: still has locks held",
                 "BUG: lock held when returning", "WARNING: lock held when returning",
                 "INFO: trying to register non-static key", "WARNING: locking bug", "WARNING: nested lock")),
    ("RCU_STALL", ("INFO: rcu detected stall",)),
    ("LEAK", ("memory leak in",)),
    ("HUNG_TASK", ("INFO: task hung", "INFO: task can't die", "unregister_netdevice: waiting for")),
    ("GPF", ("general protection fault",)),
    ("WARNING", ("WARNING",)),
    ("OOPS", ("invalid opcode", "divide error", "stack segment fault", "PANIC: double fault", "int3 in",
              "Internal error", "Unhandled fault", "Alignment trap")),
    ("PANIC", ("kernel panic", "kernel stack overflow", "panic:", "SYZFAIL", "SYZFATAL", "go runtime error",
               "trusty: panic", "trusty: ASSERT")),
]


def title_type(title: str) -> str:
    for type_, prefixes in _TYPES:
        if title.startswith(prefixes):
            return type_
    return "BUG"


# --- kinds: what the Scanner needs ------------------------------------------------------

END_TRACE = re.compile(r"^---\[ end trace")
RULER = re.compile(r"^={20,}$")
# Where a report of a class ends before the next report starts (a live console
# completes it there). After these lines nothing of syzkaller's title is read.
_ENDS = [
    (re.compile(r"BUG: (?:KASAN|KMSAN|KFENCE|KCSAN):"), RULER, False),
    (re.compile(r"UBSAN: "), re.compile(r"^={20,}$|^---\[ end trace"), True),
    (re.compile(r"(?:WARNING|INFO): (?:possible|inconsistent|suspicious|\S+-safe -> )|BUG: (?:bad unlock|held lock|"
                r"lock held|sleeping function|scheduling while|soft lockup|spinlock|rwlock|Invalid wait)|"
                r"WARNING: (?:bad unlock|held lock|lock held|.*still has locks)|INFO: (?:task|trying|rcu_)"),
     None, True),
    (re.compile(r"Kernel panic - not syncing"), re.compile(r"^---\[ end Kernel panic"), True),
    (re.compile(r"BUG: |WARNING: |general protection fault|kernel BUG|invalid opcode: |divide.error: |"
                r"stack segment: |Unable to handle kernel|Internal error:|Unhandled fault:|int3: "),
     END_TRACE, False),
]


def _describer(o: Oops):
    def describe(lines: list[str], ctx: str = "") -> Description:
        title_lines, all_lines = _report_lines(lines, ctx not in ("", "kernel"))
        marks = Marks(PARAMS, all_lines)
        res = extract_description(o.header, o.formats, title_lines, PARAMS,
                                  marks if title_lines is all_lines else None)
        text = stable_title(res.title)
        corrupted = res.corrupted or _corrupted(res.title, all_lines, res.format, marks)
        return Description(title_type(text), text, _frames(text, res.frames, all_lines), corrupted)
    return describe


_TITLE_FRAME = re.compile(r".* in ((?:<[a-zA-Z0-9_: ]+>)?[a-zA-Z0-9_:]+)", re.ASCII)


def _frames(title: str, frames: list[str], lines: list[str]) -> list[str]:
    """The guilty frame first: the one the title names (syzkaller's Report.Frame), then
    the stack it came from, or else the report's first frames that are no helpers."""
    m = _TITLE_FRAME.match(title)
    named = [m.group(1)] if m and m.group(1) != "corrupted" else []
    if not frames:
        skipped = PARAMS.skipped(())
        for text in lines[1:]:
            f = PARAMS.frame_res[0].search(text)
            if f and not skipped(f.group(1)):
                frames.append(PARAMS.strip(f.group(1)))
                if len(frames) >= MAX_FRAMES:
                    break
    return named + [f for f in frames if f not in named]


def _corrupted(title: str, lines: list[str], f: Format | None, marks: Marks) -> str | None:
    """syzkaller's isCorrupted: a timestamp in the (raw) title, or a stack that has no frame.
    A report with stack frames is whole though no "Call Trace:" line says so (KFENCE
    prints its stacks under its own headers; syzkaller calls that corrupted)."""
    if re.search(r"\[ *[0-9]+\.[0-9]+\]", title):
        return "title matches corrupted regexp"
    if f is None or f.no_stack_trace:
        return None
    has_stack = False
    starts = marks.hits("stack_starts")
    any_start = marks.of("stack_starts")
    for key, hits in zip(PARAMS.stack_starts, starts):
        if not hits:
            continue
        at = hits[0]
        # syzkaller's text ends with a newline: one more, empty line after the last
        if len(lines) - at + 1 < 4:
            return "call trace is missed"
        found = False
        for i in range(at + 1, min(at + 16, len(lines))):
            if i in any_start:
                break
            t = lines[i]
            if "(stack is not available)" in t or any(r.search(t) for r in PARAMS.frame_res):
                found = has_stack = True
                break
        if key is not RISCV_STACK_START and not found:
            return "no frames in a stack trace"
    if has_stack or _has_frames(lines[1:], 2):
        return None
    return "no stack trace in report"


def _has_frames(lines: list[str], n: int) -> bool:
    for text in lines:
        if any(r.search(text) for r in PARAMS.frame_res):
            n -= 1
            if n == 0:
                return True
    return False


# A title these leave "in corrupted" may find its frames after the report's end marker
# (interleaved output): syzkaller reads to the next report.
_INCOMPLETE = frozenset({CORRUPTED_NO_FRAMES, NO_REPORT_MATCH, FORMAT_CORRUPTED})


# Reports named by their first line alone (no format reads a stack): they end there, and
# a message the kernel repeats (unregister_netdevice every 10 s) is not one endless report.
_ONE_LINE = frozenset({"unregister_netdevice: waiting for", "VFS: Close: file count is 0",
                       "VFS: Busy inodes after unmount", "Booting the kernel.", "trusty: panic", "fatal error:",
                       "SYZFAIL:", "SYZFATAL:", "panic:"})


def _kinds_of(o: Oops) -> list[Kind]:
    describe = _describer(o)
    one_line = (lambda text: False) if o.header in _ONE_LINE else None
    out = []
    for inside in (False, True):
        for i, (when, end, task_end) in enumerate(_ENDS + [(None, None, False)]):
            out.append(Kind(f"{o.header}#{i}{'~' if inside else ''}", re.compile(re.escape(o.header)), describe,
                            end=end, task_end=task_end, inside=inside, strict_context=True,
                            drop_line=_questionable, reread=_INCOMPLETE, with_context=True, continues=one_line,
                            # a panic just after a report is its aftermath (panic_on_warn, Fatal exception)
                            tail=inside and o.header == "Kernel panic"))
    return out


def _questionable(text: str) -> bool:
    """A frame the unwinder is unsure of (x86 " ? ", powerpc " (unreliable)"): not a frame."""
    # " ? " first: most lines lack it (one test a line, not two)
    return (" ? " in text and "<EOI>" not in text) or text.endswith(" (unreliable)")


_KINDS = {o.header: _kinds_of(o) for o in OOPSES}
KINDS = [kinds[0] for kinds in _KINDS.values()]


# What of a line around its header the patterns read: what a suppression names before it
# ("EXT4-fs (sda): WARNING", "rmt_storage:INFO:") and the header's own message. A bound
# on the text keeps a line of repeated headers from costing its length squared.
_BEFORE, _AFTER = 128, 512
# Most console lines hold no header: one search says so.
_ANY_HEADER = re.compile("|".join(re.escape(o.header) for o in OOPSES))
# Text every line that starts a report holds (the scanner skips lines with none of it).
TOKENS = tuple(o.header for o in OOPSES)


def start(text: str) -> Kind | None:
    """The kind of report a console line starts, by syzkaller's oops headers."""
    if not _ANY_HEADER.search(text):
        return None
    for o in OOPSES:
        at = text.find(o.header)
        if at >= 0:
            probe = text[max(0, at - _BEFORE):at + _AFTER]
            if any(s.search(probe) for s in o.suppressions):
                continue
            inside = any(p.search(probe) for p in REPORT_START_IGNORES)
            kinds = _KINDS[o.header]
            n = len(_ENDS) + 1
            i = next((i for i, (when, _, _) in enumerate(_ENDS) if when.search(probe)), len(_ENDS))
            return kinds[i + (n if inside else 0)]
    return None


LINUX = Table(TOKENS, start)
