"""FreeBSD, OpenBSD and NetBSD report rules that tandem's corpus files do not pin one by one:
WITNESS lock names, the two FreeBSD backtrace styles, where a BSD report ends, and that no
hostile line costs more than its length."""
from __future__ import annotations

from pathlib import Path

import pytest

from tandem.report import Scanner, parse
from tandem.report.freebsd import witness_name
from tandem.report.openbsd import first_frame

CORPUS = Path(__file__).resolve().parents[1] / "report-corpus"


@pytest.mark.parametrize("described, name", [
    ("ufs (ufs, lockmgr)", "ufs"),
    ("vm map (user) (vm map (user), sx)", "vm map (user)"),
    ("bufwait (bufwait)", "bufwait"),
    ("em0 (network driver, sleep mutex)", "network driver"),
    ("a (b (c)", "c"),
    ("a) (b))", "a) (b))"),
    ("no parentheses", "no parentheses"),
])
def test_witness_name_is_the_lock_type(described, name):
    assert witness_name(described) == name


TRAP = "Fatal trap 12: page fault while in kernel mode\ncpuid = 0\nKDB: stack backtrace:\n"


def test_fatal_trap_title_follows_the_backtrace_style():
    ddb = TRAP + ("db_trace_self_wrapper() at db_trace_self_wrapper+0x2b/frame 0x1\n"
                  "trap() at trap+0x2b/frame 0x1\n--- trap 0xc, rip = 0x1, rsp = 0x2, rbp = 0x3 ---\n"
                  "m_copydata() at m_copydata+0x1/frame 0x1\nfoo() at foo+0x1/frame 0x1\n")
    short = TRAP + "#0 0x1 at kdb_backtrace+0x1\n#1 0x1 at trap+0x1\n#2 0x1 at m_copydata+0x1\n#3 0x1 at foo+0x1\n"
    assert parse(ddb, "freebsd")[0].title == "Fatal trap NUM: page fault in m_copydata"
    assert parse(short, "freebsd")[0].title == "Fatal trap NUM: page fault while in kernel mode in foo"
    bare = parse("Fatal trap 9: general protection fault while in kernel mode\n", "freebsd")[0]
    assert (bare.title, bare.corrupted) == ("Fatal trap NUM: general protection fault while in kernel mode", True)


def test_a_kassert_with_its_own_message_is_found_by_kassert_panic():
    rep = parse("panic: vm_fault: fault on nofault entry, addr: 0xdeadc000\ncpuid = 0\n"
                "KDB: stack backtrace:\n#0 0x1 at kdb_backtrace+0x1\n#1 0x1 at vpanic+0x1\n"
                "#2 0x1 at kassert_panic+0x1\n#3 0x1 at vm_fault+0x1\n#4 0x1 at trap_pfault+0x1\n", "freebsd")[0]
    assert (rep.type, rep.title, rep.frames[0]) == ("KASSERT", "panic: vm_fault: fault on nofault entry, addr: ADDR",
                                                   "vm_fault")


def test_a_lor_with_only_the_established_order_names_no_frame():
    rep = parse("lock order reversal:\n 1st 0x1 a (a, sx) @ /s/sys/x.c:1\n 2nd 0x2 b (b, sx) @ /s/sys/y.c:2\n"
                "lock order b -> a established at:\n#0 0x1 at witness_checkorder+0x1\n#1 0x1 at other+0x1\n",
                "freebsd")[0]
    assert (rep.title, rep.corrupted) == ("WITNESS: lock order reversal: a -> b", True)


def test_openbsd_frame_past_the_trap_plumbing():
    lines = ["uvm_fault(0x1, 0x2, 0, 1) -> e", "ddb> trace", "panic(1) at panic+0x1", "kerntrap(2) at kerntrap+0x2",
             "foo(3) at foo+0x3", "end trace frame: 0x1"]
    assert first_frame(lines) == (4, "foo")
    # A run of plumbing that ends in no frame: its last frame-shaped member (syzkaller's backtracking).
    assert first_frame(["x", "panic(1) at panic+0x1", "savectx() at 0x12", "end of kernel"]) == (1, "panic")


def _lines(n: int) -> str:
    return "".join(f"boot message {i}\n" for i in range(n))


def test_openbsd_a_warning_ends_and_a_later_panic_is_a_report_of_its_own():
    text = ("witness: lock order reversal:\n 1st 0x1 a (a)\n 2nd 0x2 b (b)\n" + _lines(40) +
            "panic: pool_do_put: mbufpl: double pool_put: 0x1\nStopped at db_enter+0x18\n")
    assert [r.title for r in parse(text, "openbsd")] == ["witness: reversal: a b", "pool: double put: mbufpl"]


def test_openbsd_ddb_session_headers_belong_to_the_first_report():
    text = ("kernel: page fault trap, code=0\nStopped at      foo+0x1:  movq\nddb{0}> show panic\n"
            "uvm_fault(0xffff, 0x2, 0, 1) -> e\nddb{0}> trace\nfoo(1) at foo+0x1\nend trace frame: 0x1\n")
    assert [r.title for r in parse(text, "openbsd")] == ["uvm_fault: foo"]


def test_netbsd_a_reboot_ends_the_report():
    panic = ('panic: kernel diagnostic assertion "x == 0" failed: file "/s/sys/kern/a.c", line 1\n'
             "cpu0: Begin traceback...\nvpanic() at netbsd:vpanic+0x1\nfoo() at netbsd:foo+0x1\nrebooting...\n")
    reports = parse(panic + _lines(40) + panic, "netbsd")  # a boot's worth of lines between
    assert [r.title for r in reports] == ["assert failed: x == NUM"] * 2
    assert reports[0].frames[0] == "foo"


N = 64 * 1024 - 2
HOSTILE = {  # a line the guest fills with what one rule retries on
    "freebsd": ["lock order reversal:\nlock order " + "a -> " * (N // 5) + " attempted at:",
                "Fatal trap 1: " * (N // 14), "panic: " + " at a/" * (N // 6),
                "lock order reversal:\n 1st 0x1 a " + "()" * (N // 2) + " @ x"],
    "openbsd": ["panic: kqueue " + "a" * N, "panic: kqueue " + " a" * (N // 2), "uvm_fault(0x1, " * (N // 15),
                "panic: kernel diagnostic assertion " + 'x failed: file "/' * (N // 20),
                "witness: userret: returning with the following locks held:\n" + "sys_" * (N // 4),
                "uvm_fault(0x1, 0, 0, 1) -> e\n" + "Stopped at " * (N // 11) + "\nend trace frame",
                "uvm_fault(0x1, 0, 0, 1) -> e\n" + "panic() at 0\n" * 20000,
                "panic: x\n" + "ddb{0}> show panic\n" * 20000, "panic: x\n" + "Caught invalid memory access\n" * 20000],
    "netbsd": ["fatal page fault in supervisor mode\n" + "Stopped in netbsd:" * (N // 18),
               "panic: ASan: Unauthorized Access\n" + "kasan\n" * 20000,
               "panic: lock error\nBegin traceback\n" + "panic\n" * 20000, "UBSan:\n" * 20000],
}


@pytest.mark.parametrize("os, text", [(os, t) for os, texts in HOSTILE.items() for t in texts],
                         ids=lambda v: v if v in HOSTILE else repr(v[:24]))
def test_hostile_lines_are_parsed(os, text):
    """Lines that made quadratic rules take 3 s and more (now milliseconds). Their time is
    watched by `./tandem bench report`, not by a timed test: here they must parse."""
    parse(text, os)


@pytest.mark.parametrize("path", sorted(p for d in ("freebsd", "openbsd", "netbsd") for p in (CORPUS / d).iterdir()),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_live_scanner_finds_what_parse_finds(path):
    data = path.read_bytes()
    scanner, got = Scanner(path.parent.name), []
    for i in range(0, len(data), 7):
        got += scanner.feed(data[i:i + 7])
    got += scanner.flush()
    assert [(r.title, r.start, r.end) for r in got] == [(r.title, r.start, r.end) for r in parse(data, path.parent.name)]


def test_freebsd_kassert_warn_only_is_a_report_and_the_kernel_runs_on():
    text = ("KASSERT failed: Assertion so->so_count > 0 failed at /usr/src/sys/kern/uipc_socket.c:1234\n"
            "KDB: stack backtrace:\n#0 0x1 at kdb_backtrace+0x1\n#1 0x1 at kassert_panic+0x1\n#2 0x1 at sorele+0x1\n"
            "#3 0x1 at soclose+0x1\nStarting sshd.\n")
    rep = parse(text, "freebsd")
    assert [(r.type, r.title, r.frames[0]) for r in rep] == [
        ("KASSERT", "KASSERT failed: Assertion so->so_count > NUM failed at sys/kern/uipc_socket.c:LINE", "sorele")]
    assert not rep[0].text.endswith("sshd.")


def test_netbsd_fault_without_ddb_is_named_by_the_frame_under_the_trap():
    text = ("fatal page fault in supervisor mode\ntrap type 6 code 0 rip 0xffffffff80a1b2c3 cs 0x8\n"
            "panic: trap\ncpu0: Begin traceback...\nvpanic() at netbsd:vpanic+0x1\npanic() at netbsd:panic+0x1\n"
            "trap() at netbsd:trap+0x1\n--- trap (number 6) ---\nfoo() at netbsd:foo+0x1\nbar() at netbsd:bar+0x1\n"
            "cpu0: End traceback...\nrebooting...\n")
    rep = parse(text, "netbsd")[0]
    assert (rep.title, rep.frames[:2], rep.corrupted) == ("page fault in foo", ["foo", "bar"], False)


def test_netbsd_assertion_without_its_closing_quote():
    rep = parse('panic: kernel diagnostic assertion "' + 'panic: kernel diagnostic assertion "x' * 1700, "netbsd")[0]
    assert rep.type == "KASSERT"


def test_openbsd_a_reboot_from_ddb_ends_the_report():
    crash = "panic: unhandled af 1\nStopped at      db_enter+0x10:  popq    %rbp\nddb{0}> boot reboot\nrebooting...\n"
    reports = parse(crash + _lines(40) + crash, "openbsd")
    assert [r.title for r in reports] == ["panic: unhandled af"] * 2
    assert reports[0].text.endswith("rebooting...")
