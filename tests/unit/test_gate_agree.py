"""The release gate's equivalence decision (gate.agree): a held native output against
an analysis's output on the same connection, under the analysis's spec."""
from __future__ import annotations

import re
import threading
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st
from tandem.semantic.comparison.equivalence import ChannelRules
from tandem.semantic.comparison.compare import kept_lines
from tandem.live.gate import Agreement, Gate, Held, Stream, agree

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


# --- carried forward: each decision from the last point agreed to, the rest dropped ---

def _whole(native: bytes, a: int, b: int, theirs: bytes, rules, flow: int, closed: bool) -> bool | None:
    """The decision as first written (gate.py before Agreement): over both whole
    streams from their starts, at a cost that grows with the connection."""
    native, theirs = bytearray(native), bytearray(theirs)
    for f, s, e in rules.byte_ranges:
        for buf in (native, theirs):
            hi = min(e, len(buf))
            if f == flow and s < hi:
                buf[s:hi] = b"*" * (hi - s)
    if not (rules.ignore or rules.mask):
        if len(theirs) >= b:
            return theirs[a:b] == native[a:b]
        return False if theirs[a:] != native[a:len(theirs)] or closed else None

    def lines(d):
        end = d.rfind(b"\n") + 1
        return [x.rstrip(b"\r") for x in d[:end].split(b"\n")[:-1]], bytes(d[end:])
    n_lines, n_tail = lines(bytes(native[:b]))
    t_lines, t_tail = lines(bytes(theirs))
    n_kept, _ = kept_lines(n_lines, rules, False, {})
    t_kept, _ = kept_lines(t_lines, rules, False, {})
    k = min(len(n_kept), len(t_kept))
    if n_kept[:k] != t_kept[:k]:
        return False
    if len(t_kept) < len(n_kept):
        return False if closed else None
    if not n_tail or (t_kept[k] if len(t_kept) > k else t_tail).startswith(n_tail):
        return True
    return False if closed else None


RULES = [
    PLAIN,
    ChannelRules(mask=[re.compile(rb"id \d+")], ignore=[re.compile(rb"^dbg")]),
    ChannelRules(byte_ranges=[(0, 2, 9)]),
    ChannelRules(mask=[re.compile(rb"\d")], byte_ranges=[(0, 5, 7)]),
]
LINE = st.sampled_from([b"OK", b"id 12", b"id 7", b"dbg x", b"val 3", b"", b"ERR\r"])


def _stream(lines: list[bytes], tail: bytes) -> bytes:
    return b"".join(x + b"\n" for x in lines) + tail


@given(st.data())
def test_carried_forward_decides_as_over_the_whole_streams(data):
    """Frame by frame, with the analysis's output arriving in pieces and both sides
    dropped up to what was agreed, Agreement.check decides each frame as the decision
    over both whole streams does."""
    rules = data.draw(st.sampled_from(RULES))
    native = _stream(data.draw(st.lists(LINE, max_size=12)), data.draw(st.sampled_from([b"", b"pro"])))
    if not native:
        return
    theirs = data.draw(st.one_of(
        st.just(native),
        st.builds(_stream, st.lists(LINE, max_size=12), st.sampled_from([b"", b"prompt> "]))))
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(native) - 1), max_size=6)))) if len(native) > 1 else []
    frames = list(zip([0] + cuts, cuts + [len(native)]))
    n, t, ag = Stream(), Stream(), Agreement(rules, 0)
    got = 0                                      # how much of `theirs` the analysis has produced
    for a, b in frames:
        n.put(a, native[a:b])
        while True:
            closed = got == len(theirs)
            t.put(t.end, theirs[t.end:got])
            verdict = ag.check(n, a, b, t, closed)
            assert verdict == _whole(native[:b], a, b, theirs[:got], rules, 0, closed)
            if verdict is not None:
                break
            got = data.draw(st.integers(got + 1, len(theirs)))
        if verdict is False:
            return
        keep = ag.n0 if ag.lines else b        # what Gate._trim keeps once [a, b) is decided
        n.trim(keep)
        t.trim(ag.t0 if ag.lines else keep)
        assert n.base == keep or n.base == n.end


def test_a_frame_waits_until_the_recording_has_read_up_to_it():
    """QEMU offers the guest's frame before tandem has read the device log up to it: the
    client's request before it (the connection's protocol, and so its rules: HTTP's Date
    mask) may not be read yet. The gate decides nothing on it until the log's clock has
    passed the frame, or the recording has ended."""
    flow = SimpleNamespace(index=0, client=("192.168.122.1", 47486), server=("192.168.122.85", 80),
                           protocol=None)
    rec = SimpleNamespace(flows=[flow], known_ns=1_000, finished=False, lock=threading.Lock())
    g = Gate(None, rec, [])
    h = Held(7, 2_000, b"", key=("192.168.122.1", 47486, "192.168.122.85", 80), a=0, b=581)
    assert g._agreement(h) is None and not g._agreements
    rec.known_ns = 2_000
    assert g._agreement(h) is True          # no analysis with a say: nothing to wait for
    rec.known_ns, rec.finished = 0, True
    assert g._agreement(h) is True
