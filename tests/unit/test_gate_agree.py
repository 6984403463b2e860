"""The release gate's equivalence decision (gate.agree): a held native output against
an analysis's output on the same connection, under the analysis's spec."""
from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st
from tandem.equivalence import ChannelRules
from tandem.gate import agree

PLAIN = ChannelRules()


@given(st.binary(min_size=1, max_size=64), st.data())
def test_bytes_mode_is_equality_of_the_frame_once_the_analysis_got_that_far(stream, data):
    a = data.draw(st.integers(0, len(stream) - 1))
    b = data.draw(st.integers(a + 1, len(stream)))
    assert agree(stream, a, b, stream, PLAIN, 0, closed=False) is True
    assert agree(stream, a, b, stream[:a], PLAIN, 0, closed=False) is None     # not yet
    assert agree(stream, a, b, stream[:a], PLAIN, 0, closed=True) is False     # never will
    i = data.draw(st.integers(a, b - 1))
    other = bytearray(stream)
    other[i] ^= 0xFF
    assert agree(stream, a, b, bytes(other), PLAIN, 0, closed=False) is False


def test_byte_ranges_of_the_flow_are_masked():
    rules = ChannelRules(byte_ranges=[(3, 4, 8)])
    assert agree(b"id: 1234 ok\n", 0, 12, b"id: 9876 ok\n", rules, 3, closed=False) is True
    assert agree(b"id: 1234 ok\n", 0, 12, b"id: 9876 ok\n", rules, 2, closed=False) is False


def test_line_masks_and_ignored_lines():
    rules = ChannelRules(mask=[re.compile(rb"conn \d+")], ignore=[re.compile(rb"^debug")])
    native = b"hello conn 12\nOK\n"
    assert agree(native, 0, len(native), b"hello conn 3\ndebug x\nOK\n", rules, 0, closed=False) is True
    assert agree(native, 0, len(native), b"hello conn 3\nERR\n", rules, 0, closed=False) is False
    assert agree(native, 0, len(native), b"hello conn 3\n", rules, 0, closed=False) is None
    assert agree(native, 0, len(native), b"hello conn 3\n", rules, 0, closed=True) is False
    # The native's frame ends inside a line: a prefix of the analysis's line agrees.
    assert agree(b"OK\npro", 3, 6, b"OK\nprompt> ", rules, 0, closed=False) is True
    assert agree(b"OK\npro", 3, 6, b"OK\nerr", rules, 0, closed=False) is None
