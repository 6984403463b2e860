"""Console report parser: a corpus of real reports (tests/report-corpus), the
incremental scanner against parse(), offsets, and symbolization with a real vmlinux."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from tandem.report import TYPES, Report, Scanner, parse, symbolize
from tandem.report.console import decode

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "report-corpus"
CORPUS_FILES = sorted(p for p in CORPUS.glob("*/*") if p.is_file())


def load(path: Path) -> tuple[list[dict], bytes]:
    """A corpus file: header lines (TITLE starts each expected report), a blank line, raw console."""
    data = path.read_bytes()
    header, _, console = (b"", b"", data[1:]) if data.startswith(b"\n") else data.partition(b"\n\n")
    expected: list[dict] = []
    for line in header.decode().splitlines():
        key, _, value = line.partition(": ")
        if key == "TITLE":
            expected.append({"TITLE": value})
        else:
            assert expected and key in ("TYPE", "FRAME", "CORRUPTED"), f"{path}: bad header line {line!r}"
            expected[-1][key] = value
    return expected, console


def test_corpus_is_big_and_covers_every_type():
    assert len(CORPUS_FILES) >= 60
    seen = {e["TYPE"] for p in CORPUS_FILES for e in load(p)[0]}
    assert seen == set(TYPES), f"types without a corpus report: {set(TYPES) - seen}"


@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_corpus(path):
    expected, console = load(path)
    os_name = path.parent.name
    reports = parse(console, "linux" if os_name == "userland" else os_name)
    if os_name == "userland":  # a userland process's output also parses as itself
        assert [r.title for r in parse(console, "userland")] == [r.title for r in reports]
    assert [r.title for r in reports] == [e["TITLE"] for e in expected]
    for r, e in zip(reports, expected):
        assert r.type == e["TYPE"] and r.type in TYPES
        assert r.os == ("userland" if r.type in {"ASAN", "LSAN", "UBSAN_USER"} else os_name)
        assert r.corrupted == (e.get("CORRUPTED") == "Y"), r.corrupted_reason
        if "FRAME" in e:
            assert r.frames[0] == e["FRAME"]
        assert not re.search(r"0x[0-9a-f]|\+0x|\[ *\d+\.\d+\]", r.title), r.title


@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_offsets_slice_back_to_the_report(path):
    _, console = load(path)
    raw = decode(console)
    previous_end = 0
    for r in parse(console, path.parent.name):
        assert previous_end <= r.start < r.end <= len(console)
        span = raw[r.start:r.end]
        assert r.text.splitlines()[0] in span.splitlines()[0]
        assert all(line in span for line in r.text.splitlines())
        previous_end = r.end


def test_boot_logs_give_no_report():
    boots = [p for p in CORPUS_FILES if not load(p)[0]]
    assert len(boots) >= 3
    for p in boots:
        assert parse(load(p)[1], p.parent.name) == []


def test_several_reports_in_order():
    reports = parse(load(CORPUS / "linux" / "lkdtm-warning-null-deref-bug")[1])
    assert [r.type for r in reports] == ["WARNING", "BUG", "BUG"]
    assert [r.frames[0] for r in reports] == ["lkdtm_WARNING", "lkdtm_EXCEPTION", "lkdtm_BUG"]
    assert reports[0].end <= reports[1].start and reports[1].end <= reports[2].start


def test_concatenated_consoles_give_all_reports():
    a, b = (load(CORPUS / "linux" / n)[1] for n in ("lkdtm-kasan-slab-out-of-bounds", "syz-189"))
    titles = [r.title for r in parse(a + b"\n" + b)]
    assert titles == [r.title for r in parse(a)] + [r.title for r in parse(b)]


def test_end_marker_completes_a_report_before_flush():
    console = load(CORPUS / "linux" / "lkdtm-kasan-slab-out-of-bounds")[1]
    [kasan] = parse(console)
    assert console[:kasan.end].rstrip().endswith(b"=" * 66)   # KASAN's closing ruler
    scanner = Scanner("linux")
    assert [r.title for r in scanner.feed(console[:kasan.end])] == [kasan.title]
    assert scanner.flush() == []


def test_aftermath_panic_is_not_a_new_report():
    console = load(CORPUS / "linux" / "lkdtm-warning")[1]
    tail = b"[    0.634000] Kernel panic - not syncing: kernel: panic_on_warn set ...\n"
    assert [r.type for r in parse(console + tail)] == ["WARNING"]
    alone = parse(b"boot\n" * 40 + tail)
    assert [(r.type, r.corrupted) for r in alone] == [("PANIC", True)]


def test_printk_caller_filters_other_tasks():
    lines = ["[   1.0][ T10] BUG: sleeping function called from invalid context at mm/slab.h:1",
             "[   1.1][ T99] unrelated line from another task",
             "[   1.2][ T10] Call Trace:", "[   1.3][ T10]  <TASK>", "[   1.4][ T10]  foo_write+0x1/0x2",
             "[   1.5][ T10]  </TASK>"]
    [r] = parse("\n".join(lines) + "\n")
    assert r.title == "BUG: sleeping function called from invalid context in foo_write"
    assert "unrelated" not in r.text


def test_unknown_os_is_an_error():
    with pytest.raises(ValueError, match="unknown OS"):
        parse("", "plan9")


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([p for p in CORPUS_FILES if load(p)[0]]), st.data())
def test_scanner_in_random_chunks_matches_parse(path, data):
    console = load(path)[1]
    os_name = path.parent.name
    cuts = sorted(data.draw(st.lists(st.integers(0, len(console)), max_size=30)))
    scanner = Scanner(os_name)
    got: list[Report] = []
    for lo, hi in zip([0] + cuts, cuts + [len(console)]):
        got += scanner.feed(console[lo:hi])
    got += scanner.flush()
    assert got == parse(console, os_name)


def _kernel_build() -> dict:
    path = ROOT / "build" / "kernel-kasan.json"
    if not path.exists():
        pytest.skip("no kernel build (build/kernel-kasan.json): run ./tandem build")
    return json.loads(path.read_text())


def test_symbolize_real_vmlinux():
    build = _kernel_build()
    symbols = {}
    for line in Path(build["system_map"]).read_text().splitlines():
        addr, kind, name = line.split()[:3]
        symbols.setdefault(name, (int(addr, 16), kind))
    func = next(f for f in ("kmalloc_trace", "__kmalloc_noprof", "vfs_write", "do_sys_open") if f in symbols)
    text = f"Call Trace:\n <TASK>\n {func}+0x10/0x40\n </TASK>"
    rep = Report(os="linux", type="WARNING", title=f"WARNING in {func}", frames=[func], text=text, start=0, end=0)
    symbolize(rep, Path(build["vmlinux"]))
    assert rep.locations, "no location for a real function"
    name, file, line = rep.locations[-1]
    assert file.endswith((".c", ".h")) and line > 0
    assert any(loc[0] == func for loc in rep.locations)
    # A raw return address symbolizes too.
    raw = Report(os="linux", type="WARNING", title="t", frames=[], start=0, end=0,
                 text=f" [<{symbols[func][0] + 0x10:x}>]")
    assert symbolize(raw, Path(build["vmlinux"])).locations


def test_symbolize_without_debug_info_leaves_locations_empty(tmp_path):
    stripped = tmp_path / "vmlinux"
    stripped.write_bytes(b"\x7fELF not really an ELF file")
    rep = parse(load(CORPUS / "linux" / "lkdtm-warning")[1])[0]
    assert symbolize(rep, stripped).locations == []
    assert symbolize(rep, tmp_path / "missing").locations == []


# --- boundaries syzkaller's titles need ----------------------------------------

def test_header_mid_line_after_a_login_prompt():
    console = ("syzkaller login: [   10.1] BUG: KASAN: use-after-free in foo+0x1/0x2\n"
               "[   10.2] Read of size 8 at addr ffff888000000000 by task a/1\n"
               "[   10.3] Call Trace:\n[   10.4]  foo+0x1/0x2\n[   10.5]  bar+0x1/0x2\n")
    [r] = parse(console)
    assert r.title == "KASAN: use-after-free Read in foo"


def test_untimestamped_lines_are_not_a_timestamped_reports():
    console = ("[   10.1] WARNING: CPU: 0 PID: 1 at a/b.c:1 foo+0x1/0x2\n"
               "[   10.2] Call Trace:\n"
               " junk_from_userspace+0x1/0x2\n"
               "[   10.3]  ? helper+0x1/0x2\n"
               "[   10.4]  bar+0x1/0x2\n")
    [r] = parse(console)
    assert r.title == "WARNING in bar"  # no RIP line: the first frame of the trace
    assert r.frames[0] == "bar" and "junk_from_userspace" not in r.text and "helper" not in r.text


def test_a_task_report_reads_on_past_its_own_next_report():
    """With printk caller ids syzkaller reads a task's report to its end: a stall cut short
    by a WARNING of the same CPU is named by the stack after that WARNING."""
    ctx = "[  1.0][   C1] "
    lines = ["rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:", "WARNING: CPU: 1 PID: 1 at a/b.c:1 f+0x1/0x2",
             "Call Trace:", " <IRQ>", " __sysvec_apic_timer_interrupt+0x1/0x2", " </IRQ>",
             "RIP: 0010:spin_here+0x1/0x2", " looper+0x1/0x2", " do_syscall_64+0x1/0x2", " </TASK>"]
    reps = parse("".join(ctx + line + "\n" for line in lines))
    assert [r.title for r in reps] == ["INFO: rcu detected stall in looper", "WARNING in spin_here"]
    assert reps[0].end <= reps[1].start


def test_another_tasks_report_does_not_end_a_tasks_report():
    lines = ["[ 1.0][ T10] WARNING: CPU: 0 PID: 10 at a/b.c:1 foo+0x1/0x2",
             "[ 1.1][ T20] BUG: sleeping function called from invalid context at x.c:1",
             "[ 1.2][ T10] Call Trace:", "[ 1.3][ T10]  bar+0x1/0x2"]
    warning, sleeping = parse("\n".join(lines) + "\n")
    assert warning.title == "WARNING in bar" and "sleeping" not in warning.text
    assert sleeping.title.startswith("BUG: sleeping function called from invalid context")


def test_a_header_printk_cut_and_replayed_is_read_whole():
    console = ("[ 1.0][ T31] INFO: t\n** replaying previous printk message **\n"
               "[ 1.0][ T31] INFO: task a:1 blocked for more than 143 seconds.\n"
               "[ 1.1][ T31] Call Trace:\n[ 1.2][ T31]  read_cache_folio+0x1/0x2\n")
    assert [r.title for r in parse(console)] == ["INFO: task hung in read_cache_folio"]


def test_rust_v0_frames_are_named_by_their_paths():
    from tandem.report.rustsym import demangle
    assert demangle("_RNvMs3_NtCshgDM7dBCdno_11rust_binder7processNtB5_7Process10update_ref") == \
        "<rust_binder::process::Process>::update_ref"
    assert demangle("_RNvCscSpY9Juk0HT_7___rustc17rust_begin_unwind") == "__rustc::rust_begin_unwind"
    assert demangle("_RNvXs1b_NtCs9jEwPDbx20M_4core3fmtRNtNtNtB8_5panic10panic_info9PanicInfoNtB6_7Display3fmt"
                    "Cs43vyB533jt3_6kernel") == "<&core::panic::panic_info::PanicInfo as core::fmt::Display>::fmt"
    # the guest writes these names: anything else comes back as it is, quickly
    for name in ["vfs_write", "_RAX", "_R", "_RB_", "_RNvB_3foo", "_R" + "I" * 900, "_R" + "N" * 5000, "_RC9" + "9" * 50]:
        assert demangle(name) == name


def test_rust_back_references_cannot_blow_up():
    """Each level a tuple of two back references to the level before: 2^25 nodes unbounded."""
    from tandem.report import rustsym

    def b62(n):
        digits = ""
        while n:
            n, d = divmod(n - 1, 62)
            digits = rustsym._B62[d] + digits
            if n == 0:
                break
        return digits + "_"
    body, prev = "h", 0
    for _ in range(25):
        start = len(body)
        body += f"TB{b62(prev)}B{b62(prev)}E"
        prev = start
    p = rustsym._Parser(body + f"B{b62(prev)}")
    p.i, p.quiet = len(body), 1          # printed or not, the work is bounded
    with pytest.raises(rustsym._Bad):
        p.type()
    assert p.steps <= rustsym._MAX_STEPS + 1


def test_a_rust_panic_is_named_by_the_rust_frame():
    lines = ["rust_kernel: panicked at drivers/android/binder/node.rs:877:13:", "attempt to subtract with overflow",
             "Call Trace:", " <TASK>", " _RNvCscSpY9Juk0HT_7___rustc17rust_begin_unwind+0x15b/0x160",
             " _RNvNtCs9jEwPDbx20M_4core9panicking9panic_fmt+0x1/0x2",
             " _RNvMs3_NtCshgDM7dBCdno_11rust_binder7processNtB5_7Process10update_ref+0x1/0x2", " </TASK>"]
    [r] = parse("".join(f"[ 1.0][ T1] {line}\n" for line in lines))
    assert r.title == "attempt to subtract with overflow in <rust_binder::process::Process>::update_ref"


def test_a_title_lacking_its_frames_reads_past_the_end_marker_to_the_next_report():
    """Interleaved output may put another report's "---[ end trace" before this one's
    stack: syzkaller reads to the next report; the report's text still ends there."""
    lines = ["WARNING: CPU: 0 PID: 1 at a/b.c:1 foo+0x1/0x2", "---[ end trace 0000000000000000 ]---",
             "RIP: 0010:foo+0x1/0x2", "general protection fault: 0000 [#1]", "RIP: 0010:bar+0x1/0x2"]
    reps = parse("".join(f"[ 1.0] {line}\n" for line in lines))
    assert [r.title for r in reps] == ["WARNING in foo", "general protection fault in bar"]
    assert "RIP" not in reps[0].text
    # and a live console gets a whole report at its end marker
    kasan = load(CORPUS / "linux" / "lkdtm-kasan-slab-out-of-bounds")[1]
    scanner = Scanner("linux")
    assert len(scanner.feed(kasan[:parse(kasan)[0].end])) == 1


def test_corrupted_where_syzkaller_says_so():
    """The first report's corrupted flag agrees with syzkaller's CORRUPTED on its corpus
    (all 356 of its Linux reports)."""
    from helpers import SHARED
    if not (SHARED / "linux").is_dir():
        pytest.skip(f"{SHARED} (the project's shared data) is not beside this clone")
    differ = []
    for path in sorted((SHARED / "linux").iterdir()):
        head, _, body = path.read_bytes().replace(b"\r", b"").partition(b"\n\n")
        reps = parse(body.split(b"\nREPORT:\n", 1)[0])
        if b"TITLE: " in head and reps and reps[0].corrupted != (b"\nCORRUPTED: Y" in b"\n" + head):
            differ.append((path.name, reps[0].corrupted_reason))
    assert not differ


def test_a_message_the_kernel_repeats_is_a_report_each_time_and_bounded():
    line = "[ {}.0] unregister_netdevice: waiting for lo to become free. Usage count = 1\n"
    reps = parse("".join(line.format(i) for i in range(3)))
    assert [r.title for r in reps] == ["unregister_netdevice: waiting for DEV to become free"] * 3
    assert all(r.text.count("\n") == 0 for r in reps)
