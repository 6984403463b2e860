"""ThinTESLA semantics, one rule at a time, over synthetic event streams."""
import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from tandem.assertions import automata
from tandem.assertions.automata import Checker, bench_ns_per_event
from tandem.assertions.events import Event
from tandem.assertions.lang import parse_file, parse_text

T1, T2 = 0xFFFF888000001000, 0xFFFF888000002000


class Trace:
    """Builds events in order with increasing time and instruction count."""

    def __init__(self):
        self.events = []

    def _add(self, kind, func, args, ret, task):
        n = len(self.events)
        args = tuple(args) + (0,) * (6 - len(args))
        self.events.append(Event(kind, func, args, ret, task, 1000 * n, 10 * n, 0xFFFFFFFF81000000 + n))
        return self

    def call(self, func, *args, task=T1):
        return self._add("call", func, args, None, task)

    def ret(self, func, value=0, *args, task=T1):
        return self._add("return", func, args, value, task)

    def site(self, func, *args, task=T1):
        return self._add("site", func, args, None, task)

    def within(self, bound, body, task=T1):
        self.call(bound, task=task)
        body(self)
        return self.ret(bound, 0, task=task)


def check(text, trace, close_open=False):
    chk = Checker(parse_text(text))
    out = [v for ev in trace.events for v in chk.feed(ev)]
    return out + chk.finish(close_open), chk


PREV = 'assert "p" {mode} at use(obj): within(sys, previously(returnfrom(check(obj)) == 0))'
NEXT = 'assert "n" {mode} at lock(l): within(sys, eventually(call(unlock(l))))'


# --- bounds --------------------------------------------------------------------------------

def test_events_outside_the_bound_are_ignored():
    t = Trace().call("use", 1).ret("check", 0, 1)                 # no bound open
    t.within("sys", lambda t: t.ret("check", 0, 1).call("use", 1))
    t.call("use", 2)                                              # outside again: not judged
    out, chk = check(PREV.format(mode="conditional"), t)
    assert out == [] and chk.stats.sites_outside_bound == 2 and chk.stats.instances_created == 1


def test_the_bound_closes_the_instance():
    t = Trace().within("sys", lambda t: t.ret("check", 0, 1))
    t.within("sys", lambda t: t.call("use", 1))                   # a new activation: history gone
    out, _ = check(PREV.format(mode="conditional"), t)
    assert [v.reason for v in out] == [
        "reached the assertion site but returnfrom(check(obj)) == 0 did not happen before it"]


def test_recursive_bound_is_one_instance_until_the_outermost_return():
    t = Trace().call("sys").call("lock", 7).call("sys").ret("sys").call("unlock", 7).ret("sys")
    out, chk = check(NEXT.format(mode="conditional"), t)
    assert out == [] and chk.stats.instances_created == 1
    t = Trace().call("sys").call("sys").call("lock", 7).ret("sys").ret("sys")
    out, _ = check(NEXT.format(mode="conditional"), t)
    assert [(v.reason, v.event.func, v.event.kind) for v in out] == [
        ("sys returned before call(unlock(l))", "sys", "return")]


def test_a_trace_that_starts_inside_the_bound_is_not_judged():
    t = Trace().call("lock", 7).ret("sys").within("sys", lambda t: t.call("lock", 8).call("unlock", 8))
    out, _ = check(NEXT.format(mode="conditional"), t)
    assert out == []


def test_an_open_bound_at_the_end_is_not_a_violation_unless_asked():
    t = Trace().call("sys").call("lock", 7)
    out, chk = check(NEXT.format(mode="conditional"), t)
    assert out == [] and chk.stats.open_at_finish == 1
    t.call("unlock", 9, task=T2)                                 # the last event, on another thread
    out, _ = check(NEXT.format(mode="conditional"), t, close_open=True)
    assert [(v.reason, v.task) for v in out] == [("sys returned before call(unlock(l))", T1)]


# --- previously / eventually relative to the site --------------------------------------------

def test_previously_pass_and_fail():
    ok = Trace().within("sys", lambda t: t.ret("check", 0, 5).call("use", 5))
    assert check(PREV.format(mode="conditional"), ok)[0] == []
    bad = Trace().within("sys", lambda t: t.call("use", 5))
    (v,) = check(PREV.format(mode="conditional"), bad)[0]
    assert v.event.func == "use" and v.expected == ["returnfrom(check(obj)) == 0"] and v.bindings == {"obj": 5}


def test_eventually_pass_and_fail():
    ok = Trace().within("sys", lambda t: t.call("lock", 7).call("unlock", 7))
    assert check(NEXT.format(mode="conditional"), ok)[0] == []
    bad = Trace().within("sys", lambda t: t.call("lock", 7))
    (v,) = check(NEXT.format(mode="conditional"), bad)[0]
    assert v.event.kind == "return" and v.event.func == "sys"
    assert [m["event"] for m in v.matched] == ["site lock(l)"] and v.expected == ["call(unlock(l))"]


def test_eventually_event_before_the_site_does_not_count():
    t = Trace().within("sys", lambda t: t.call("unlock", 7).call("lock", 7))
    (v,) = check(NEXT.format(mode="conditional"), t)[0]
    assert v.reason == "sys returned before call(unlock(l))"


def test_sequence_order():
    text = 'assert "s" at use: within(sys, sequence(call(a), call(b), site, call(c), call(d)))'
    ok = Trace().within("sys", lambda t: t.call("a").call("b").call("use").call("c").call("d"))
    assert check(text, ok)[0] == []
    swapped = Trace().within("sys", lambda t: t.call("b").call("a").call("use"))
    (v,) = check(text, swapped)[0]
    assert v.reason == "reached the assertion site but call(b) did not happen before it (call(a) did)"
    late = Trace().within("sys", lambda t: t.call("a").call("b").call("use").call("d").call("c"))
    (v,) = check(text, late)[0]
    assert v.reason == "call(d) happened while waiting for call(c)" and v.event.func == "d"
    assert [m["event"] for m in v.matched] == ["call(a)", "call(b)", "site use"]


# --- argument and return-value matching ---------------------------------------------------------

def test_return_value_literal():
    text = 'assert "r" at use: within(sys, previously(returnfrom(check) == 0))'
    assert check(text, Trace().within("sys", lambda t: t.ret("check", 0).call("use")))[0] == []
    assert len(check(text, Trace().within("sys", lambda t: t.ret("check", 1).call("use")))[0]) == 1


def test_negative_literal_matches_a_32_bit_int_result():
    text = 'assert "r" at use: within(sys, previously(returnfrom(check) == -13))'
    for rax in (0xFFFFFFFFFFFFFFF3, 0xFFFFFFF3, -13):
        assert check(text, Trace().within("sys", lambda t, r=rax: t.ret("check", r).call("use")))[0] == []
    assert len(check(text, Trace().within("sys", lambda t: t.ret("check", 0xF3).call("use")))[0]) == 1


def test_argument_literals_select_events():
    text = 'assert "a" at use: within(sys, previously(call(open(_, 3))))'
    assert check(text, Trace().within("sys", lambda t: t.call("open", 9, 3).call("use")))[0] == []
    # open(_, 4) is not an event of this automaton at all: the window is empty
    assert len(check(text, Trace().within("sys", lambda t: t.call("open", 9, 4).call("use")))[0]) == 1
    # ...and does not disturb a correct sequence around it
    t = Trace().within("sys", lambda t: t.call("open", 9, 3).call("open", 9, 4).call("use"))
    assert check(text, t)[0] == []


def test_variables_bound_at_the_site_select_relevant_events():
    text = PREV.format(mode="conditional")
    # check(1) does not count for use(2): a non-static event is judged with the site's values
    (v,) = check(text, Trace().within("sys", lambda t: t.ret("check", 0, 1).call("use", 2)))[0]
    assert v.bindings == {"obj": 2}
    # irrelevant observations in between do not break the sequence
    t = Trace().within("sys", lambda t: t.ret("check", 0, 2).ret("check", 0, 1).call("use", 2).call("use", 1))
    assert check(text, t)[0] == []


def test_site_literals_and_repeated_variables():
    text = 'assert "a" at use(x, x, 1): within(sys, previously(call(prep(x))))'
    t = Trace().within("sys", lambda t: t.call("use", 4, 5, 1).call("use", 4, 4, 2).call("prep", 4).call("use", 4, 4, 1))
    assert check(text, t)[0] == []       # the first two are not the site


def test_static_events_ignore_arguments():
    text = 'assert "a" at use(o): within(sys, previously(call(prep), call(check(o))))'
    t = Trace().within("sys", lambda t: t.call("prep", 1, 2, 3).call("check", 8).call("use", 8))
    assert check(text, t)[0] == []


def test_each_site_hit_consumes_its_own_pre_sequence():
    text = PREV.format(mode="conditional")
    t = Trace().within("sys", lambda t: t.ret("check", 0, 1).call("use", 1).call("use", 1))
    (v,) = check(text, t)[0]
    assert v.event.icount == 30


def test_lock_pairing_per_value():
    text = NEXT.format(mode="conditional")
    nested = Trace().within("sys", lambda t: t.call("lock", 1).call("lock", 2).call("unlock", 2).call("unlock", 1))
    assert check(text, nested)[0] == []
    twice = Trace().within("sys", lambda t: t.call("lock", 1).call("lock", 1))
    (v,) = check(text, twice)[0]        # the broken pass is reported once
    assert v.reason == "the assertion site was reached again before call(unlock(l))"
    repeat = Trace().within("sys", lambda t: t.call("lock", 1).call("unlock", 1).call("lock", 1).call("unlock", 1))
    assert check(text, repeat)[0] == []


# --- optional events and OR blocks -----------------------------------------------------------------

OPT = 'assert "o" {mode} at use: within(sys, sequence(call(a), optional(call(b)), site, optional(call(c)), call(d)))'


def test_optional_present_or_absent():
    for body in ("a use d", "a b use d", "a use c d", "a b use c d"):
        t = Trace().within("sys", lambda t, b=body: [t.call(f) for f in b.split()])
        assert check(OPT.format(mode="strict"), t)[0] == [], body


def test_optional_out_of_order():
    t = Trace().within("sys", lambda t: t.call("a").call("use").call("d").call("c"))
    (v,) = check(OPT.format(mode="strict"), t)[0]
    assert v.reason == "call(c) happened after the sequence was complete (strict)"
    t = Trace().within("sys", lambda t: t.call("b").call("a").call("use").call("d"))
    assert check(OPT.format(mode="conditional"), t)[0] == []     # older events are discarded
    (v,) = check(OPT.format(mode="strict"), t)[0]
    assert v.reason == "call(b) happened before the sequence began (strict)"


OR = 'assert "or" at use: within(sys, previously(call(a) || call(b), call(c)))'


def test_or_block_any_order_at_least_one():
    for body in ("a c", "b c", "a b c", "b a c"):
        t = Trace().within("sys", lambda t, b=body: [t.call(f) for f in b.split()] and t.call("use"))
        assert check(OR, t)[0] == [], body
    (v,) = check(OR, Trace().within("sys", lambda t: t.call("c").call("use")))[0]
    assert v.expected == ["call(a)", "call(b)"]
    assert "one of call(a), call(b)" in v.reason


def test_or_block_alternative_at_most_once():
    t = Trace().within("sys", lambda t: t.call("a").call("b").call("a").call("c").call("use"))
    assert check(OR, t)[0] == []            # conditional: the window is "b a c"
    strict = OR.replace('"or" at', '"or" strict at')
    (v,) = check(strict, t)[0]
    assert "happened before the sequence began" in v.reason


TOP = 'assert "top" at use: within(sys, previously(call(a)) || eventually(call(b)))'


def test_top_level_or_passes_if_one_branch_holds():
    assert check(TOP, Trace().within("sys", lambda t: t.call("a").call("use")))[0] == []
    assert check(TOP, Trace().within("sys", lambda t: t.call("use").call("b")))[0] == []
    # judged per site hit: each hit satisfied by a different branch
    t = Trace().within("sys", lambda t: t.call("a").call("use").call("use").call("b"))
    assert check(TOP, t)[0] == []


def test_top_level_or_fails_when_every_branch_fails():
    (v,) = check(TOP, Trace().within("sys", lambda t: t.call("use")))[0]
    assert v.branch == 1 and v.event.kind == "return"            # the last branch to fail
    assert [a["branch"] for a in v.alternatives] == [0]
    assert v.alternatives[0]["expected"] == ["call(a)"]
    assert v.to_dict()["alternatives"][0]["reason"].startswith("reached the assertion site")


def test_top_level_or_split_into_automata():
    a = parse_text(TOP).assertions[0]
    assert len(a.branches) == 2 and [len(b) for b in a.branches] == [2, 2]


# --- modes ---------------------------------------------------------------------------------------

def test_conditional_without_site_is_fine_strict_is_not():
    t = Trace().within("sys", lambda t: t.ret("check", 0, 1))
    assert check(PREV.format(mode="conditional"), t)[0] == []
    (v,) = check(PREV.format(mode="strict"), t)[0]
    assert v.reason == "sys returned without reaching the assertion site (strict)"
    assert v.found["event"] == "returnfrom(check(obj)) == 0"
    (v,) = check(PREV.format(mode="strict"), Trace().within("sys", lambda t: None))[0]
    assert v.found is None


def test_conditional_repeats_strict_does_not():
    body = lambda t: t.ret("check", 0, 1).call("use", 1).ret("check", 0, 1).call("use", 1)
    assert check(PREV.format(mode="conditional"), Trace().within("sys", body))[0] == []
    (v,) = check(PREV.format(mode="strict"), Trace().within("sys", body))[0]
    assert v.reason == "returnfrom(check(obj)) == 0 happened after the sequence was complete (strict)"
    assert v.fatal and v.mode == "strict"


def test_strict_leftover_events():
    t = Trace().within("sys", lambda t: t.ret("check", 0, 1).call("use", 1).ret("check", 0, 2))
    assert check(PREV.format(mode="strict"), t)[0] == []           # check(2) is not about obj=1
    t = Trace().within("sys", lambda t: t.call("use", 1).call("unlock", 1))
    text = 'assert "s" strict at use(o): within(sys, sequence(site, call(unlock(o)), optional(call(b))))'
    assert check(text, t)[0] == []


def test_strict_reports_once_per_instance():
    t = Trace().within("sys", lambda t: t.call("use", 1).call("use", 1).call("use", 1))
    out, _ = check(PREV.format(mode="strict"), t)
    assert len(out) == 1


def test_guideline_reports_without_failing_and_checks_once():
    bad = Trace().within("sys", lambda t: t.call("use", 1))
    (v,) = check(PREV.format(mode="guideline"), bad)[0]
    assert not v.fatal and v.mode == "guideline" and str(v).startswith("guideline p:")
    # after its first pass a guideline instance is disabled until the bound returns
    t = Trace().within("sys", lambda t: t.ret("check", 0, 1).call("use", 1).call("use", 1))
    assert check(PREV.format(mode="guideline"), t)[0] == []
    t.within("sys", lambda t: t.call("use", 1))                    # re-armed by the next bound
    assert len(check(PREV.format(mode="guideline"), t)[0]) == 1


# --- per-thread and global ------------------------------------------------------------------------

def test_per_thread_instances_do_not_see_other_threads():
    t = Trace().call("sys", task=T1).call("sys", task=T2)
    t.ret("check", 0, 1, task=T1).call("use", 1, task=T2).ret("sys", task=T1).ret("sys", task=T2)
    (v,) = check(PREV.format(mode="conditional"), t)[0]
    assert v.task == T2
    # the same stream is fine for a global automaton: one instance sees both threads
    assert check(PREV.format(mode="global conditional"), t)[0] == []


def test_global_instance_lives_while_any_thread_is_inside():
    text = NEXT.format(mode="global")
    t = Trace().call("sys", task=T1).call("lock", 3, task=T1).call("sys", task=T2).ret("sys", task=T1)
    t.call("unlock", 3, task=T2).ret("sys", task=T2)
    out, chk = check(text, t)
    assert out == [] and chk.stats.instances_created == 1
    t = Trace().call("sys", task=T1).call("lock", 3, task=T1).ret("sys", task=T1).call("unlock", 3, task=T2)
    (v,) = check(text, t)[0]
    assert v.task == T1 and v.scope == "global"


@st.composite
def interleavings(draw):
    """Two threads, each a sequence of bounded passes; a thread marked bad skips the
    check in one pass. Returns (events in a random interleaving, the bad threads)."""
    bad = draw(st.sets(st.sampled_from([T1, T2])))
    per = {}
    for task, obj in ((T1, 0x100), (T2, 0x200)):
        passes = draw(st.integers(1 if task in bad else 0, 3))
        evs, bad_pass = [], draw(st.integers(0, passes - 1)) if task in bad else -1
        for i in range(passes):
            evs.append(("call", "sys", (), None))
            if i != bad_pass:
                evs.append(("return", "check", (obj + i,), 0))
            evs.append(("call", "noise", (), None))
            evs.append(("call", "use", (obj + i,), None))
            evs.append(("return", "sys", (), 0))
        per[task] = evs
    order = draw(st.permutations([T1] * len(per[T1]) + [T2] * len(per[T2])))
    t, pos = Trace(), {T1: 0, T2: 0}
    for task in order:
        kind, func, args, ret = per[task][pos[task]]
        pos[task] += 1
        t._add(kind, func, args, ret, task)
    return t, bad


@settings(max_examples=200, deadline=None)
@given(interleavings())
def test_random_interleavings_of_two_threads_never_cross_talk(case):
    t, bad = case
    out, _ = check(PREV.format(mode="conditional"), t)
    assert {v.task for v in out} == bad
    assert all(v.bindings["obj"] >> 8 == (1 if v.task == T1 else 2) for v in out)


# --- sites ------------------------------------------------------------------------------------------

def test_symbol_plus_offset_site():
    text = 'assert "o" at tb_write+0x1c(buf): within(tb_write, previously(call(copy(buf))))'
    t = Trace().within("tb_write", lambda t: t.call("copy", 9).site("tb_write+0x1c", 9))
    assert check(text, t)[0] == []
    t = Trace().within("tb_write", lambda t: t.site("tb_write+0x1c", 9))
    (v,) = check(text, t)[0]
    assert v.event.kind == "site"


def test_site_at_the_bound_entry():
    text = 'assert "e" at tb_write(f): within(tb_write, eventually(call(audit(f))))'
    assert check(text, Trace().within("tb_write", lambda t: t.call("audit", 0)))[0] == []
    t = Trace().call("tb_write", 5).ret("tb_write")
    (v,) = check(text, t)[0]
    assert v.bindings == {"f": 5} and v.matched[0]["event"] == "site tb_write(f)"


# --- reports, stats, speed ---------------------------------------------------------------------------

def test_violation_report_fields_and_json():
    (v,) = check(PREV.format(mode="conditional"), Trace().within("sys", lambda t: t.call("use", 5)))[0]
    d = json.loads(json.dumps(v.to_dict()))
    assert d["assertion"] == "p" and d["mode"] == "conditional" and d["fatal"] is True
    assert d["event"]["func"] == "use" and d["event"]["args"][0] == 5
    assert (d["task"], d["vm_ns"], d["icount"]) == (T1, 1000, 10)
    assert v.state == {"matched": [], "expected": ["returnfrom(check(obj)) == 0"], "bindings": {"obj": 5},
                       "found": None, "branch": None}
    assert "obj=0x5" in str(v) and "icount=10" in str(v)


def test_stats():
    t = Trace().call("unrelated").within("sys", lambda t: t.ret("check", 0, 1).call("use", 1)).call("use", 2)
    _, chk = check(PREV.format(mode="conditional"), t)
    s = chk.stats.to_dict()
    assert (s["events_seen"], s["events_matched"], s["instances_created"], s["sites_reached"],
            s["sites_outside_bound"], s["violations"]) == (6, 5, 1, 1, 1, 0)


def test_history_is_bounded(monkeypatch):
    monkeypatch.setattr(automata, "HISTORY_MAX", 8)
    t = Trace().within("sys", lambda t: [t.ret("check", 0, i) for i in range(20)] and t.call("use", 19))
    out, chk = check(PREV.format(mode="conditional"), t)
    assert out == [] and chk.stats.history_dropped == 12


def test_unrelated_events_cost_a_lookup():
    chk = Checker(parse_text(PREV.format(mode="conditional")))
    ev = Event("call", "schedule", (0,) * 6, None, T1, 0, 0, 0)
    assert chk.feed(ev) == [] and chk.stats.events_matched == 0


def test_bench_ns_per_event():
    assert 0 < bench_ns_per_event(2000) < 1_000_000
    linux = Path(__file__).resolve().parents[2] / "guest-kernel" / "assertions" / "linux-6.12.tesla"
    assert bench_ns_per_event(2000, parse_file(linux)) > 0     # its synthetic stream satisfies the pack
    bad = [Event("call", "sys", (0,) * 6, None, T1, 0, 0, 0), Event("call", "use", (1,) + (0,) * 5, None, T1, 1, 1, 0)]
    assert bench_ns_per_event(assertion_set=parse_text(PREV.format(mode="conditional")), events=bad) > 0
