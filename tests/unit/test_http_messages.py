"""HTTP/1.x framing of a connection's responses (http_messages.py): a body framed whole
or in chunks is the same body, and whatever the guest sends, framing ends (never raises,
never loops) and keeps every byte it does not understand for the line comparison."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from tandem.semantic.comparison import http_messages as hm


def whole(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n" % (len(body), extra) + body


def chunked(body: bytes, cuts: list[int]) -> bytes:
    out, pos = [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"], 0
    for c in sorted(set(cuts)) + [len(body)]:
        if pos < c <= len(body):
            out.append(b"%X\r\n" % (c - pos) + body[pos:c] + b"\r\n")
            pos = c
    return b"".join(out) + b"0\r\n\r\n"


def canonical(text: bytes, closed: bool = True) -> list[bytes]:
    f = hm.frame(text, closed)
    return [r.canonical_head() + r.body_bytes(text) for r in f.responses]


@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=6))
def test_a_body_whole_or_in_any_chunks_is_the_same(body, cuts):
    assert canonical(whole(body) + chunked(body, cuts)) == canonical(chunked(body, cuts) + whole(body))
    assert len(canonical(whole(body) + chunked(body, cuts))) == 2


def test_head_responses_no_body_codes_and_a_body_to_the_close():
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
    f = hm.frame(head + head + whole(b"hello"), closed=False)
    assert [r.body_length() for r in f.responses] == [0, 0, 5] and not f.bad
    assert hm.frame(head, closed=False).responses == []                 # HEAD or a body: not told yet
    assert len(hm.frame(head, closed=True).responses) == 1
    f = hm.frame(b"HTTP/1.1 304 Not Modified\r\nETag: x\r\n\r\n" + whole(b"a"), closed=False)
    assert [r.body_length() for r in f.responses] == [0, 1]
    to_close = b"HTTP/1.0 200 OK\r\n\r\nall of it"
    assert hm.frame(to_close, closed=False).responses == []
    assert hm.frame(to_close, closed=True).responses[0].body_length() == 9


@given(st.binary(max_size=200), st.integers(0, 200))
def test_a_stream_cut_anywhere_frames_what_is_complete(body, cut):
    text = whole(body) + chunked(body, [len(body) // 3])
    cut = min(cut, len(text))
    f = hm.frame(text[:cut], closed=False)
    assert not f.bad and f.end <= cut
    assert all(r.end <= cut for r in f.responses)


@settings(max_examples=300)
@given(st.binary(max_size=400))
def test_any_bytes_frame_without_raising(junk):
    for text in (junk, b"HTTP/1.1 200 OK\r\n" + junk, whole(b"x") + junk,
                 b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + junk):
        for closed in (False, True):
            f = hm.frame(text, closed)
            assert 0 <= f.end <= len(text)
            assert all(r.start < r.end and r.body_length() <= r.end - r.start for r in f.responses)


def test_not_a_response_stops_framing_there():
    f = hm.frame(whole(b"ok") + b"garbage\n", closed=True)
    assert len(f.responses) == 1 and f.bad and f.end == len(whole(b"ok"))
    for bad in (b"HTTP/1.1 2000 OK\r\n\r\n", b"HTTP/1.1 200 OK\r\n folded\r\n\r\n",
                b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"):
        assert hm.frame(bad, closed=False).bad, bad


def test_hostile_sizes_are_bounded():
    """A header block that never ends, a chunk line that never ends, a length of 10^18:
    framing gives up within its bounds, and reads a stream once."""
    big = b"HTTP/1.1 200 OK\r\n" + b"X: " + b"a" * (hm.MAX_HEAD + 10)
    assert hm.frame(big, closed=False).bad
    endless = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1" * (hm.MAX_CHUNK_LINE + 5)
    assert hm.frame(endless, closed=False).bad
    huge = b"HTTP/1.1 200 OK\r\nContent-Length: 999999999999999999\r\n\r\nabc"
    assert hm.frame(huge, closed=False).responses == [] and not hm.frame(huge, closed=False).bad
    many = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1\r\na\r\n" * 200_000 + b"0\r\n\r\n")
    (r,) = hm.frame(many, closed=True).responses     # 1.4 MB of 1-byte chunks: 0.2 s (linear)
    assert r.body_length() == 200_000 and r.chunked == b"a" * 200_000
