"""A spec's patterns run on every line the guest writes: their time must stay
linear in the guest's output. Patterns see lines of at most MAX_RULED_LINE bytes (a longer
line is compared as it stands), and a pattern that can take more than quadratic time on
such a line, or exponential time (a repeat of a choice), is refused at load. No timing
here: the results say which path a line took (bench/ and docs/benchmarks.md time it)."""
from __future__ import annotations

import re

import pytest

from tandem import catalog
from tandem.semantic.comparison import equivalence
from tandem.semantic.comparison.compare import MASKED, kept_lines
from tandem.semantic.comparison.equivalence import MAX_RULED_LINE, ChannelRules
from tandem.errors import TandemError

DIGITS = b"1" * 1_000_000


def rules(ignore=(), mask=()) -> ChannelRules:
    spec = equivalence.check({"serial": {"ignore": list(ignore), "mask": list(mask)}})
    return spec.rules["serial"]


def test_a_1mb_line_of_digits_against_digits_then_x_is_compared_as_it_stands():
    """`\\d+x` over 1 MB of digits takes over half an hour (quadratic); the line is over the
    cap, so neither the ignore nor the mask sees it: kept, unchanged."""
    assert kept_lines([DIGITS, b"12x", b"123"], rules(ignore=[r"\d+x"]), True, {}) == ([DIGITS, b"123"], [0, 2])
    assert kept_lines([DIGITS, b"12x", b"123"], rules(mask=[r"\d+x"]), True, {}) == ([DIGITS, MASKED, b"123"], [0, 1, 2])
    assert kept_lines([DIGITS + b"x"], rules(mask=[r"\d+x"]), True, {}) == ([DIGITS + b"x"], [0])


def test_a_long_line_that_would_match_is_kept_whole_and_a_short_one_is_ruled():
    r = rules(ignore=[r"^drop"], mask=[r"id=\d+"])
    long_drop, long_mask = b"drop" + b"." * MAX_RULED_LINE, b"id=7 " + b"." * MAX_RULED_LINE
    at_cap = b"id=7 " + b"." * (MAX_RULED_LINE - 5)
    assert kept_lines([long_drop, long_mask, b"drop me", b"id=42 x", at_cap], r, True, {}) == (
        [long_drop, long_mask, b"<*> x", b"<*> " + b"." * (MAX_RULED_LINE - 5)], [0, 1, 3, 4])


def test_masks_that_grow_a_line_past_the_cap_stop_there():
    """A mask matching the empty string puts <*> between every two bytes: the line grows
    4 times; the masks after it do not run on it."""
    line = b"a" * (MAX_RULED_LINE // 2)
    (out,), _ = kept_lines([line], rules(mask=[r"x*", r"a"]), True, {})
    assert out == re.sub(rb"x*", MASKED, line) and b"a" in out


def test_kernel_lines_are_still_dropped_whatever_their_length():
    line = b"[    1.234567] " + b"x" * 5 * MAX_RULED_LINE
    r = equivalence.load(catalog.NATIVE).rules["serial"]
    assert kept_lines([line, b"kept"], r, True, {}) == ([b"kept"], [1])


@pytest.mark.parametrize("pattern, says", [
    (r"(a|a)+b", "repeats a repeat or a choice"),        # exponential: doubles with each byte
    (r"(a?a)+b", "repeats a repeat or a choice"),
    (r"(?:ab|cd)*x", "repeats a repeat or a choice"),
    (r"(a)\1+", "repeats a repeat or a choice"),
    (r"a.*b.*c", "more than quadratic"),                 # cubic on "ababab..."
    (r"\d+\s+x", "more than quadratic"),
    (r"^\[ *\d+\.\d+\]", "more than quadratic"),         # anchored, but three repeats
    (r"(.*)\1", "more than quadratic"),
])
def test_patterns_slower_than_quadratic_on_a_line_are_refused(pattern, says):
    with pytest.raises(TandemError, match=re.escape(says)) as e:
        equivalence.check({"tcp": {"mask": [pattern]}}, "spec.toml")
    assert "\n" not in str(e.value) and str(e.value).startswith("spec.toml: tcp.mask: ")


@pytest.mark.parametrize("pattern", [
    r"\d+x", r"^a.*b.*c", r"\(conn \d+\)$", r"Date: .*", r"id=[0-9a-f]{8}",
    r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}", r"^\[ *+\d++\.\d++\]", r"(?<=^tandem-init: module ).*",
    r"(?:a|a)++b", r"^(Shadow|Address|  )", r"/usr/bin/kvd(-asan)? ", r"(ab){2,}",
    r"(a)?(?(1)|)", r"(a)?(?(1)b)", r"", r"(?>)", r"\b", r"(?<!a)b",     # (?(1)|) raised ValueError
])
def test_patterns_at_most_quadratic_on_a_line_load(pattern):
    assert equivalence.check({"serial": {"ignore": [pattern]}}).rules["serial"].ignore


def test_the_built_in_and_demo_specs_load():
    for analysis in catalog.ALL:
        assert equivalence.load(analysis, equivalence.DEMO_SPEC).sources
