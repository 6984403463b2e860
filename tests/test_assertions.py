"""Temporal assertions on real exact replays: the tandem-calls TCG plugin watching the
real guest kernel and the planted-bug module, the automata on its events, `tandem assert`.

One recording (module-scoped) carries clean traffic, checked table updates and the
planted violation (`BUG update-nocheck 7`, docs/planted-bugs.md) and declares the Linux
pack; the session's clean demo recording is the clean-traffic case. Each check is one
exact replay (seconds).
"""
from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pytest
from helpers import assert_one_line_error, record_demo, run_cli
from tandem import catalog
from tandem.formats import bundle
from tandem.assertions import check, trace
from tandem.assertions.events import Event
from tandem.record.recording import Recording
from tandem.record.workload import KV, PLANTED_BUGS, demo_traffic

PACKS = Path(__file__).resolve().parents[1] / "guest-kernel" / "assertions"
LINUX_PACK, LSM_PACK = PACKS / "linux-6.12.tesla", PACKS / "linux-6.12-lsm.tesla"

# Requests after the clean traffic, in order, with kvd's replies.
REQUESTS = [("BUG update 5", "OK"),             # audit hook allows, then the update
            ("BUG update 2000", "ERR"),         # the hook refuses (-EACCES): no update
            (PLANTED_BUGS["assert-nocheck"][0], "OK"),   # the planted violation: no hook
            ("BUG lock-ab", "OK")]              # hook, then the update of key 0



@pytest.fixture(scope="module")
def asserted_bundle(built, tmp_path_factory) -> Path:
    """Declares the Linux pack (tandem record --assertions): the CLI test uses that."""
    path = tmp_path_factory.mktemp("assert") / "bugs.tdm"
    with Recording(path, assertions=check.declare_pack(LINUX_PACK)) as rec:
        rec.wait_ready()
        demo_traffic(rec.port, rounds=3)
        with KV(rec.port) as kv:
            for line, reply in REQUESTS:
                assert kv.request(line) == reply, line
        rec.serial.type("poweroff")
        rec.wait(timeout=120)
    return path


@pytest.fixture(scope="module")
def traced(asserted_bundle, tmp_path_factory):
    """The module's functions traced on one replay, with a site 2 instructions into
    tb_table_update; the raw event stream is kept."""
    kern = trace.kernel_for_bundle(asserted_bundle)
    f = kern.function("tb_table_update")
    insns = kern.instructions(f)
    assert not any(i.mnemonic.startswith(("j", "call", "ret")) for i in insns[:2]), insns[:3]
    site_off = insns[2].address - f.addr
    needs = {"tb_proc_write": {"call", "return"}, "tb_audit_check": {"call", "return"},
             "tb_table_update": {"call", "return"}, "tb_table_lock_acquire": {"call", "return"},
             "tb_table_lock_release": {"call", "return"}}
    p = trace.plan(kern, needs, [("tb_table_update", site_off)])
    raw = tmp_path_factory.mktemp("raw") / "events.bin"
    return trace.run(asserted_bundle, kern, p, keep=raw), kern, site_off, raw


def writes(events: list[Event]) -> list[list[Event]]:
    """The events of each tb_proc_write call, from its call to its return."""
    out, cur = [], None
    for e in events:
        if e.func == "tb_proc_write" and e.kind == "call":
            cur = [e]
        elif cur is not None:
            cur.append(e)
            if e.func == "tb_proc_write" and e.kind == "return":
                out.append(cur)
                cur = None
    return out


def test_replay_with_the_plugin_still_verifies(traced):
    t, *_ = traced
    assert t.verdict.ok, t.verdict.summary()
    assert t.stats["read_failures"] == 0 and t.stats["abandoned_frames"] == 0, t.stats
    assert t.stats["events"] == len(t.events)


def test_plugin_emits_calls_and_returns_with_arguments_and_values(traced):
    t, kern, site_off, _ = traced
    w = writes(t.events)
    assert len(w) == len(REQUESTS), [[(e.kind, e.func) for e in x] for x in w]
    seq = [[(e.kind, e.func) for e in x[1:-1]] for x in w]
    checked = [("call", "tb_audit_check"), ("return", "tb_audit_check"), ("call", "tb_table_update"),
               ("site", f"tb_table_update+{site_off:#x}"),
               ("call", "tb_table_lock_acquire"), ("return", "tb_table_lock_acquire"),
               ("call", "tb_table_lock_release"),
               # tb_table_update ends in a tail call to tb_table_lock_release, which ends in
               # one to mutex_unlock: both return at mutex_unlock's ret, innermost first
               ("return", "tb_table_lock_release"), ("return", "tb_table_update")]
    assert seq[0] == checked
    assert seq[1] == checked[:2]                  # refused: no update
    assert seq[2] == checked[2:]                  # update-nocheck: no hook
    assert seq[3] == checked
    # arguments (edi: the key) and return values (rax), returns carrying their call's args
    keys = [5, 2000, 7, 0]
    for x, key, (line, _) in zip(w, keys, REQUESTS):
        for e in x[1:-1]:
            if e.func in ("tb_audit_check", "tb_table_update") or e.kind == "site":
                assert e.arg(0) & 0xFFFFFFFF == key, (line, e)
        ret = {e.func: e.ret for e in x if e.kind == "return"}
        count = len(line.split(" ", 1)[1])        # kvd writes "OP ARG": the write returns its length
        assert ret["tb_proc_write"] == (count if key != 2000 else (-13) & (2**64 - 1)), (line, ret)
        if "tb_audit_check" in ret:
            assert ret["tb_audit_check"] & 0xFFFFFFFF == (0 if key < 1000 else (-13) & 0xFFFFFFFF)
        assert x[0].ret is None and x[-1].args == x[0].args
    # one thread (kvd), time and instruction count strictly increasing
    assert {e.task for x in w for e in x} == {w[0][0].task}
    assert {t.comms[t.events.index(x[0])] for x in w} == {"kvd"}
    flat = [e for x in w for e in x]
    assert all(a.icount < b.icount and a.vm_ns < b.vm_ns for a, b in pairwise(flat)
               if a.pc != b.pc)
    # the per-instruction count: the site is the 3rd instruction of tb_table_update
    for x in w:
        call = next((e for e in x if e.kind == "call" and e.func == "tb_table_update"), None)
        if call:
            site = x[x.index(call) + 1]
            assert site.icount - call.icount == 2 and site.vm_ns - call.vm_ns == 2 << 2, (call, site)
            assert site.pc == call.pc + site_off
    # the stack, unwound with the kernel's ORC data from the words the plugin read:
    # tb_proc_write's caller chain down to the syscall entry, complete (no "?" guesses)
    audit = next(e for e in w[0] if e.func == "tb_audit_check" and e.kind == "call")
    frames = [kern.describe(a).split("+")[0] for a in audit.stack]
    assert frames[:4] == ["tb_proc_write", "proc_reg_write", "vfs_write", "ksys_write"], frames
    assert frames[-1].startswith("entry_SYSCALL_64"), frames
    assert t.exact[t.events.index(audit)] == (len(frames), True)
    assert all(x == (len(e.stack), True) for e, x in zip(t.events, t.exact))     # all syscalls


def test_event_stream_cut_short_is_detected(traced, tmp_path):
    t, _, _, raw = traced
    data = raw.read_bytes()
    cut = tmp_path / "cut.bin"
    cut.write_bytes(data[:len(data) - trace.RECORD.size // 2])     # inside the END record
    with pytest.raises(trace.TraceError, match="cut short"):
        trace.decode(cut, t.plan)
    first = trace.HEADER.size + trace.RECORD.size + 8 * data[trace.HEADER.size + 1]   # + its stack words
    cut.write_bytes(data[:first + 3])
    with pytest.raises(trace.TraceError, match=r"cut short at offset \d+ after 1 events"):
        trace.decode(cut, t.plan)
    events, _, _, end = trace.decode(raw, t.plan)
    assert len(events) == end["events"] == len(t.events)


def test_linux_packs_hold_on_clean_traffic(built, tmp_path):
    """The Linux pack and the LSM pack (the kernels have CONFIG_SECURITY=y) on one replay
    of clean traffic, recorded on tandem's native kernel (the assertions read its vmlinux)."""
    clean = record_demo(tmp_path / "clean.tdm", flavor=catalog.ASSERTIONS_KERNEL)
    both = tmp_path / "both.tesla"
    both.write_text(LINUX_PACK.read_text() + "\n" + LSM_PACK.read_text())
    res = check.check(clean, both)
    assert len(res.aset) == len(check.parse_file(LINUX_PACK)) + len(check.parse_file(LSM_PACK))
    assert res.trace.verdict.ok
    assert [str(r.violation) for r in res.reports] == []
    st = res.checker_stats
    assert st["events_seen"] == len(res.trace.events) > 0
    assert st["sites_reached"] > 0 and st["instances_created"] > 0    # the pack was exercised
    assert res.trace.stats["abandoned_frames"] == 0


def test_planted_violation_is_caught_and_attributed(asserted_bundle):
    res = check.check(asserted_bundle, LINUX_PACK)
    assert res.checker_stats["sites_reached"] >= 3          # the checked updates held
    (r,) = res.reports
    v = r.violation
    assert (v.assertion, v.fatal) == ("tb-audit-before-table-update", True)
    assert v.event.kind == "call" and v.event.func == "tb_table_update" and v.event.arg(0) == 7
    assert r.request is not None and r.request.text == PLANTED_BUGS["assert-nocheck"][0]
    assert r.request.icount <= v.icount
    assert r.comm == "kvd"
    assert r.stack[0].symbol.startswith("tb_table_update+0x0/")
    assert r.stack[1].symbol.startswith("tb_proc_write+") and r.stack[1].reliable
    assert any(f[0] == "tb_unchecked_update" for f in r.stack[1].lines), r.stack[1].lines
    here = [t for _, t, h in r.code if h]
    assert len(here) == 1 and here[0].startswith("call") and "<tb_table_update+0x0/" in here[0]


# Rules crafted for the recorded requests (update 5, update 2000 refused, update-nocheck 7,
# lock-ab = update 0), each on its own automaton, all checked on one replay:
# name -> (violations expected, of which fatal, what breaks it)
RULES = {
    # previously + a variable bound at the site (the key) + a return value
    "prev-bound-key": ("""per-thread conditional at tb_table_update(key):
        within(tb_proc_write, previously(returnfrom(tb_audit_check(key)) == 0))""", 1, 1, 7),
    # the same with the key of another request: an unbound key never matches -> all fail
    "prev-wrong-literal": ("""per-thread conditional at tb_table_update(key):
        within(tb_proc_write, previously(returnfrom(tb_audit_check(5)) == 0))""", 2, 2, None),
    # eventually within the bound
    "eventually-release": ("""per-thread conditional at tb_table_lock_acquire:
        within(tb_proc_write, eventually(call(tb_table_lock_release)))""", 0, 0, None),
    # a negative return value: -13 (-EACCES) from an int function (eax, zero-extended)
    "refusal-or-ok": ("""per-thread conditional at tb_audit_check(k):
        within(tb_proc_write, eventually(returnfrom(tb_audit_check(k)) == 0
                                         || returnfrom(tb_audit_check(k)) == -13))""", 0, 0, None),
    "always-ok": ("""per-thread conditional at tb_audit_check(k):
        within(tb_proc_write, eventually(returnfrom(tb_audit_check(k)) == 0))""", 1, 1, 2000),
    # optional event before the site, a required one after
    "optional-then-acquire": ("""per-thread conditional at tb_table_update:
        within(tb_proc_write, sequence(optional(call(tb_audit_check)), site,
                                       call(tb_table_lock_acquire)))""", 0, 0, None),
    # global automaton and guideline mode (reported, not fatal)
    "global-audit": ("""global conditional at tb_table_update:
        within(tb_proc_write, previously(call(tb_audit_check)))""", 1, 1, 7),
    "guideline-audit": ("""per-thread guideline at tb_table_update:
        within(tb_proc_write, previously(call(tb_audit_check)))""", 1, 0, 7),
    # strict: the automaton's events must lead to the site: the refused update (2000)
    # calls the hook and returns without an update, and 7 updates without the hook
    "strict-audit": ("""per-thread strict at tb_table_update:
        within(tb_proc_write, previously(call(tb_audit_check)))""", 2, 2, None),
}


def test_semantic_rules_on_a_crafted_workload(asserted_bundle, tmp_path):
    kern = trace.kernel_for_bundle(asserted_bundle)
    f = kern.function("tb_table_update")
    site_off = kern.instructions(f)[2].address - f.addr     # rdi is still the key there
    rules = dict(RULES, **{"offset-site": (
        f"""per-thread conditional at tb_table_update+{site_off:#x}(key):
        within(tb_proc_write, previously(returnfrom(tb_audit_check(key)) == 0))""", 1, 1, 7)})
    pack = tmp_path / "rules.tesla"
    pack.write_text("".join(f'assert "{n}" {text}\n\n' for n, (text, *_) in rules.items()))
    res = check.check(asserted_bundle, pack)
    got: dict[str, list] = {}
    for r in res.reports:
        got.setdefault(r.violation.assertion, []).append(r.violation)
    for name, (_, n, fatal, key) in rules.items():
        vs = got.get(name, [])
        assert len(vs) == n, (name, [str(v) for v in vs])
        assert sum(v.fatal for v in vs) == fatal, name
        if key is not None:     # the site's bound key, else the breaking event's first argument
            keys = [next(iter(v.bindings.values()), v.event.arg(0) & 0xFFFFFFFF) for v in vs]
            assert keys == [key], (name, [str(v) for v in vs])
    assert res.fatal == sum(f for _, _, f, _ in rules.values())


def test_cli_reports_the_violation_and_exits_1(asserted_bundle):
    """No --assertions: the pack the recording declared is used."""
    r = run_cli("assert", str(asserted_bundle), "--json")
    assert r.returncode == 1, r.stderr
    assert "VIOLATION tb-audit-before-table-update" in r.stderr
    assert "after input: tcp-data" in r.stderr and "BUG update-nocheck 7" in r.stderr
    out = json.loads(r.stdout)
    assert out["replay"]["ok"] and len(out["violations"]) == 1
    assert out["violations"][0]["request"]["text"] == "BUG update-nocheck 7"
    declared = bundle.load_manifest(asserted_bundle).assertions
    assert declared.sha256 == check.pack_identity(LINUX_PACK).sha256
    assert "tb-audit-before-table-update" in declared.names
    r = run_cli("assert", str(asserted_bundle), "--select", "tb-table-lock-released")
    assert r.returncode == 0, r.stderr
    assert "HELD: 0 violation(s)" in r.stderr


def test_bad_pack_is_a_one_line_error(asserted_bundle, tmp_path):
    bad = tmp_path / "bad.tesla"
    bad.write_text('# a comment line\n'
                   'assert "a" per-thread conditional at tb_table_update:\n'
                   '    within(tb_proc_write, previously(call(no_such_function)))\n')
    assert_one_line_error(run_cli("assert", str(asserted_bundle), "--assertions", str(bad)),
                          "bad.tesla:3:", "unknown symbol 'no_such_function'")
    # a site offset inside an instruction
    kern = trace.kernel_for_bundle(asserted_bundle)
    f = kern.function("tb_table_update")
    inside = next(i.address - f.addr + 1 for i in kern.instructions(f) if i.size > 1)
    bad.write_text(f'assert "a" per-thread conditional at tb_table_update+{inside:#x}:\n'
                   '    within(tb_proc_write, previously(call(tb_audit_check)))\n')
    assert_one_line_error(run_cli("assert", str(asserted_bundle), "--assertions", str(bad)),
                          "bad.tesla:1:", f"tb_table_update+{inside:#x}", "not at an instruction boundary")


def test_missing_bundle_and_pack_are_one_line_errors(asserted_bundle, tmp_path):
    assert_one_line_error(run_cli("assert", str(tmp_path / "nope.tdm"), "--assertions", str(LINUX_PACK)),
                          "nope.tdm")
    assert_one_line_error(run_cli("assert", str(asserted_bundle), "--assertions", str(tmp_path / "x.tesla")),
                          "x.tesla", "cannot read")
    assert_one_line_error(run_cli("assert", str(asserted_bundle), "--assertions", str(LINUX_PACK),
                                  "--select", "nope"), "no assertion named 'nope'")


def test_record_refuses_a_broken_pack_before_starting(built, tmp_path):
    bad = tmp_path / "bad.tesla"
    bad.write_text('assert "a" per-thread conditional at tb_table_update:\n'
                   '    within(tb_proc_write, previously(call(tb_no_such_hook)))\n')
    out = tmp_path / "never.tdm"
    assert_one_line_error(run_cli("record", str(out), "--assertions", str(bad)),
                          "bad.tesla:2:", "unknown symbol 'tb_no_such_hook'")
    assert not out.exists()
