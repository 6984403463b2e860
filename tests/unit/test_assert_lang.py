"""The assertion language: syntax, every error kind with its position, round trips,
what the event source must instrument."""
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tandem.assertions.lang import AssertionLangError, load_symbols, parse_file, parse_text
from tandem.assertions.model import EventSpec, Pat, Step
from tandem.errors import TandemError

OPEN = """# the DAC check passed for the path vfs_open opens
assert "open-checked" per-thread conditional at vfs_open(path, _):
    within(do_sys_openat2, previously(returnfrom(may_open(_, path, _, _)) == 0))
"""

SYMS = {"do_sys_openat2", "may_open", "vfs_open", "f", "g", "h", "k", "s", "b"}


def error(text, symbols=None, name="t.tesla"):
    with pytest.raises(AssertionLangError) as e:
        parse_text(text, name, symbols)
    msg = str(e.value)
    assert "\n" not in msg
    m = re.match(r"^(.+):(\d+):(\d+): (.+)$", msg)
    assert m, msg
    assert isinstance(e.value, TandemError)
    return int(m.group(2)), int(m.group(3)), m.group(4)


# --- what parses ----------------------------------------------------------------------

def test_parses_the_example():
    s = parse_text(OPEN, symbols=SYMS)
    (a,) = s.assertions
    assert (a.name, a.scope, a.mode, a.bound, a.line) == ("open-checked", "per-thread", "conditional",
                                                           "do_sys_openat2", 2)
    assert a.site.func == "vfs_open" and a.site.offset is None and a.site.variables() == ["path"]
    (b,) = a.branches
    assert b[1].site and b[0].alts == (EventSpec("return", "may_open", (Pat("any"), Pat("var", "path"),
                                                                          Pat("any"), Pat("any")), Pat("lit", 0)),)


def test_defaults_comments_and_shorthand():
    s = parse_text("""assert "a" at f:   # per-thread conditional by default
        within(g, previously(k(_) == -13))   # TESLA: k(...) == v is returnfrom
    """)
    a = s.assertions[0]
    assert (a.scope, a.mode) == ("per-thread", "conditional")
    assert a.branches[0][0].alts[0] == EventSpec("return", "k", (Pat("any"),), Pat("lit", -13))


def test_sequence_optional_or_block_and_distribution():
    a = parse_text("""assert "a" global strict at s+0x1c(x, 3):
        within(g, sequence(call(f) || returnfrom(h(x)) == 0, site, optional(call(k)),
                           call(b) || sequence(call(q), call(r))))""").assertions[0]
    assert (a.scope, a.mode, a.site.offset, a.site.event_func, a.site.event_kind) == (
        "global", "strict", 0x1c, "s+0x1c", "site")
    assert len(a.branches) == 2             # the OR holding a sequence is split
    b0, b1 = a.branches
    assert len(b0[0].alts) == 2 and not b0[0].optional     # OR of events: one block
    assert b0[2] == Step((EventSpec("call", "k"),), optional=True)
    assert [s.alts[0].func for s in b1[3:]] == ["q", "r"]


def test_eventually_and_explicit_site():
    a = parse_text('assert "a" at f: within(g, eventually(call(h), call(k)))').assertions[0]
    assert a.branches[0][0].site and [s.alts[0].func for s in a.branches[0][1:]] == ["h", "k"]
    b = parse_text('assert "a" at f: within(g, sequence(call(h), site, call(k)))').assertions[0]
    assert b.branches[0][1].site


def test_site_at_the_bound_entry_is_allowed():
    parse_text('assert "a" at g: within(g, eventually(call(h)))')


# --- round trips ----------------------------------------------------------------------

def test_round_trip_of_a_file():
    text = OPEN + """
assert "x" global guideline at f+16(a, -1):
    within(g, previously(call(h(a, 0x10)) || returnfrom(k) == 3) || eventually(optional(call(b)), call(s)))
"""
    s = parse_text(text)
    again = parse_text(s.to_text())
    assert again.assertions == s.assertions
    assert again.to_text() == s.to_text()


names = st.sampled_from(["f1", "f2", "f3", "f4", "f5", "f6"])
vals = st.one_of(st.just("_"), st.just("x"), st.integers(-2**31, 2**40).map(str))


@st.composite
def event_texts(draw):
    f = draw(names)
    args = draw(st.lists(vals, max_size=3))
    call = f + ("(" + ", ".join(args) + ")" if args else "")
    if draw(st.booleans()):
        return f"call({call})"
    return f"returnfrom({call})" + (f" == {draw(vals)}" if draw(st.booleans()) else "")


@st.composite
def assertion_texts(draw):
    evs = draw(st.lists(event_texts(), min_size=1, max_size=4, unique_by=lambda t: t.split("(")[1]))
    parts = [f"optional({e})" if draw(st.booleans()) else e for e in evs]
    cut = draw(st.integers(0, len(parts)))
    parts.insert(cut, "site")
    mode = draw(st.sampled_from(["conditional", "strict", "guideline"]))
    scope = draw(st.sampled_from(["per-thread", "global"]))
    return f'assert "r" {scope} {mode} at s(x, _): within(b, sequence({", ".join(parts)}))'


@settings(max_examples=150, deadline=None)
@given(assertion_texts())
def test_round_trip_random(text):
    try:
        s = parse_text(text)
    except AssertionLangError as e:
        assert "used twice" in str(e)       # two events that can match one call
        return
    again = parse_text(s.to_text())
    assert again.assertions == s.assertions


# --- what the event source instruments -------------------------------------------------

def test_needed_sites_and_select():
    s = parse_text(OPEN + """
assert "lock" at tb_lock+0x10: within(tb_write, eventually(call(tb_unlock)))
assert "ret" at f: within(g, previously(returnfrom(k) == 0))
""")
    assert s.needed() == {"do_sys_openat2": {"call", "return"}, "vfs_open": {"call"}, "may_open": {"return"},
                          "tb_write": {"call", "return"}, "tb_unlock": {"call"},
                          "g": {"call", "return"}, "f": {"call"}, "k": {"return"}}
    assert s.sites() == [("tb_lock", 0x10)]
    sub = s.select(["ret", "open-checked"])
    assert sub.names() == ["open-checked", "ret"]       # file order
    assert s.select([]).needed() == {} and len(s.select([])) == 0
    with pytest.raises(TandemError, match="no assertion named 'nope'"):
        s.select(["nope"])


# --- symbols ---------------------------------------------------------------------------

def test_load_symbols(tmp_path):
    m = tmp_path / "System.map"
    m.write_text("ffffffff81000000 T _text\nffffffff81103940 t do_sys_openat2\n"
                 "ffffffff82000000 D some_data\nffffffff81200000 W weak_fn\n"
                 "ffffffff81103940 t do_sys_openat2\nffffffff81300000 r rodata_thing\n")
    assert load_symbols(m) == {"_text": 0xffffffff81000000, "do_sys_openat2": 0xffffffff81103940,
                               "weak_fn": 0xffffffff81200000}
    names = tmp_path / "module.syms"
    names.write_text("# hand-written\ntb_proc_write\ntb_audit_check\n")
    assert load_symbols(names) == {"tb_proc_write": 0, "tb_audit_check": 0}
    with pytest.raises(TandemError, match="cannot read symbol table"):
        load_symbols(tmp_path / "missing")


def test_symbol_check_accepts_a_path_a_set_or_a_union(tmp_path):
    m = tmp_path / "System.map"
    m.write_text("1 T do_sys_openat2\n2 t vfs_open\n3 t may_open\n")
    parse_text(OPEN, symbols=m)
    parse_text(OPEN, symbols=str(m))
    text = OPEN + 'assert "tb" at tb_table_update: within(tb_proc_write, previously(returnfrom(tb_audit_check) == 0))'
    parse_text(text, symbols=[m, {"tb_table_update", "tb_proc_write", "tb_audit_check"}])
    line, col, msg = error(text, symbols=m)
    assert (line, col) == (4, 16) and "unknown symbol 'tb_table_update'" in msg


# --- every error kind: one line, FILE:LINE:COL ------------------------------------------

@pytest.mark.parametrize("text,pos,fragment", [
    ('assert "a" at f: within(g, previously(call(h))', (1, 47), "syntax error: expected ')' closing within("),
    ('assert "a" at f: within(g, previously(call(h)))\nassert', (2, 7), "expected an assertion name"),
    ('assert "a at f', (1, 8), "unterminated string"),
    ('assert "a" at f: within(g, previously(call(h) ; ))', (1, 47), "unexpected character ';'"),
    ('assert "a" at f within(g, previously(call(h)))', (1, 17), "expected ':' after the assertion site"),
    ('assert "a" at f: within(g, previously(h))', (1, 40), "write call(h) or returnfrom(h) == value"),
    ('assert "a" at f: within(g, previously(call(h) == 0))', (1, 47), "a call has no return value"),
    ('assert "a" at f: within(g, previously(call(h(1,2,3,4,5,6,7))))', (1, 58), "only the first 6 arguments"),
    ('assert "a" at f: within(g, within(h, site))', (1, 28), "within(...) can only be the outermost"),
    ('assert "" at f: within(g, site)', (1, 8), "name cannot be empty"),
])
def test_syntax_errors(text, pos, fragment):
    line, col, msg = error(text)
    assert (line, col) == pos and fragment in msg, msg


def test_unknown_symbol_with_position_and_hint():
    line, col, msg = error('assert "a" at vfs_open(p, _):\n  within(do_sys_openat2,\n'
                           '    previously(returnfrom(may_opn(_, p)) == 0))', symbols=SYMS)
    assert (line, col) == (3, 27)
    assert msg == "unknown symbol 'may_opn': not a function of this kernel (did you mean 'may_open'?)"
    assert error('assert "a" at nope: within(g, site)', symbols=SYMS)[:2] == (1, 15)
    assert error('assert "a" at f: within(nope, site)', symbols=SYMS)[:2] == (1, 25)


PREFIX = 'assert "a" at f(x, y): within(g, '


@pytest.mark.parametrize("body,second,fragment", [
    ("previously(call(h), call(h))", "call(h))", "event call(h) is used twice in one automaton: call(h) at 1:45"),
    ("previously(call(h(1)), call(h(_)))", "call(h(_))", "call(h(1)) at 1:45 can match the same event"),
    ("previously(call(h(x)), call(h(y)))", "call(h(y))", "call(h(x)) at 1:45 can match the same event"),
    ("previously(returnfrom(h) == 0 || returnfrom(h))", "returnfrom(h))", "returnfrom(h) == 0 at 1:45"),
    ("previously(call(g))", "call(g)", "the bound's call(g) at 1:31"),
    ("eventually(returnfrom(g))", "returnfrom(g)", "the bound's returnfrom(g) at 1:31"),
    ("previously(call(f))", "call(f)", "the assertion site f(x, y) at 1:15 can match the same event"),
])
def test_event_used_twice(body, second, fragment):
    text = PREFIX + body + ")"
    line, col, msg = error(text)
    assert (line, col) == (1, text.rindex(second) + 1) and fragment in msg, msg


def test_distinct_literals_are_different_events():
    parse_text('assert "a" at f: within(g, previously(returnfrom(h) == 0, returnfrom(h) == 1))')
    parse_text('assert "a" at f: within(g, previously(call(h(1)), call(h(2))))')


def test_variable_not_bound_at_the_site():
    line, col, msg = error('assert "a" at f(x):\n    within(g, previously(call(h(x, y))))')
    assert (line, col) == (2, 36)
    assert msg == "variable 'y' is not bound at the assertion site (at f(x) binds x)"
    assert "binds none" in error('assert "a" at f: within(g, eventually(returnfrom(h) == r))')[2]


@pytest.mark.parametrize("mods,pos,fragment", [
    ("strickt", (1, 12), "unknown mode 'strickt' (expected one of per-thread, global, conditional, strict, guideline)"),
    ("strict guideline", (1, 19), "conflicting modes 'strict' and 'guideline'"),
    ("global per-thread", (1, 19), "conflicting scopes 'global' and 'per-thread'"),
])
def test_unknown_or_conflicting_mode(mods, pos, fragment):
    line, col, msg = error(f'assert "a" {mods} at f: within(g, site)')
    assert (line, col) == pos and msg == fragment


@pytest.mark.parametrize("text,pos,fragment", [
    ('assert "a" at f: within(g, call(h))', (1, 28), "no assertion site in this sequence"),
    ('assert "a" at f: within(g, sequence(site, previously(call(h))))', (1, 43), "appears twice"),
    ('assert "a" at f: within(g, optional(site))', (1, 37), "cannot be optional"),
    ('assert "a" at f: within(g, site)\nassert "a" at f: within(g, site)', (2, 1), 'defined twice (first at line 1)'),
    ('assert "a" at f+-1: within(g, site)', (1, 15), "offset cannot be negative"),
])
def test_structural_errors(text, pos, fragment):
    line, col, msg = error(text)
    assert (line, col) == pos and fragment in msg, msg


def test_parse_file_names_the_file(tmp_path):
    p = tmp_path / "bad.tesla"
    p.write_text('# header\n\nassert "a" at f: within(g, previously(call(h) call(k)))\n')
    with pytest.raises(AssertionLangError) as e:
        parse_file(p)
    assert str(e.value) == f"{p}:3:47: syntax error: expected ')' or ',', found 'call'"
    with pytest.raises(TandemError, match="cannot read assertions"):
        parse_file(tmp_path / "missing.tesla")


TOKENS = ['assert', '"a"', '"', 'at', 'f', 'f+0x10', '(', ')', ',', ':', 'within', 'sequence', 'previously',
          'eventually', 'optional', 'call', 'returnfrom', 'site', '||', '==', '_', 'x', '-', '3', '0x1f', 'strict',
          'global', 'bogus', '#', '\n', ';', '+']


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=60).map(" ".join))
def test_any_text_parses_or_gives_a_positioned_error(text):
    try:
        parse_text(text)
    except AssertionLangError as e:
        assert "\n" not in str(e) and re.match(r"<string>:\d+:\d+: ", str(e))


@settings(max_examples=200, deadline=None)
@given(assertion_texts(), st.integers(0, 200), st.sampled_from(["", ")", "(", ",", "||", "==", "site", "x"]))
def test_mangled_assertions_give_a_positioned_error(text, cut, junk):
    mangled = text[:cut] + junk + text[cut:]
    try:
        parse_text(mangled)
    except AssertionLangError as e:
        line, col = map(int, re.match(r"<string>:(\d+):(\d+): ", str(e)).groups())
        assert line == 1 and 1 <= col <= len(mangled) + 1
