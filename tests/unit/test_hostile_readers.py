"""Reproducers for the text and binary readers other than the console parser:
each input gives a result or the module's own one-line error, never another exception.

Equivalence specs and assertion files are written by whoever hands tandem a spec; replay
streams come in bundles. Before the fix: `max_lag_ms = 1e400` raised OverflowError, `nan`
ValueError, a 5,000-digit number ValueError, 500 nested parentheses RecursionError, and a
segment header claiming a small size made the reader decompress 1 GiB before checking it.
"""
from __future__ import annotations

import struct
import tracemalloc
import zlib

import pytest
import zstandard

from tandem import catalog
from tandem.semantic.comparison import equivalence
from tandem.formats import rrstream
from tandem.assertions.lang import AssertionLangError, parse_text
from tandem.errors import BundleError, TandemError


def short(value) -> str:
    """A test id: the first 30 characters of a reproducer that may be 5,000 long."""
    return value[:30] if isinstance(value, str) else str(value)


def spec_error(tmp_path, text: str) -> str:
    """The one-line TandemError the spec loader gives for a spec file holding `text`."""
    path = tmp_path / "spec.toml"
    path.write_text(text)
    with pytest.raises(TandemError) as e:
        equivalence.load(catalog.NATIVE, path)
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("text, says", [
    ("max_lag_ms = 1e400", "max_lag_ms"),
    ("max_lag_ms = nan", "max_lag_ms"),
    ("max_lag_ms = inf", "max_lag_ms"),
    ("max_lag_ms = -inf", "max_lag_ms"),
    ("max_lag_ms = true", "max_lag_ms"),
    ("max_lag_ms = 1e300", "max_lag_ms"),
    ("max_lag_ms = " + "9" * 5000, "4300 digits"),
    ("[serial]\nreorder_window = " + "9" * 40, "integer of 133 bits"),
    ("[serial]\nreorder_window = true", "reorder_window"),
    ("ignore_channels = 5", "ignore_channels"),
    ("ignore_channels = 'udp'", "ignore_channels"),
    ("serial = 5", "[serial] must be a table"),
    ("[tcp]\nbyte_ranges = 5", "byte_ranges"),
    ("[tcp]\nbyte_ranges = [{flow = true, start = 0, end = 1}]", "byte_ranges"),
    ("[tcp]\nbyte_ranges = [{flow = 0, start = 0, end = 99999999999999999999}]", "byte_ranges"),
    ("[serial]\nignore = ['" + "(" * 1000 + "']", "bad regular expression"),
    ("[serial]\nmask = ['a{4294967296}']", "bad regular expression"),
    ("[serial]\nignore = ['[[a]']", "FutureWarning: Possible nested set"),
    ("[serial]\nmask = ['(a+)+$']", "repeats a repeat"),            # ReDoS on a guest's "aaaa...b"
    ("[serial]\nignore = ['(?:\\\\d+\\\\s?)*x']", "repeats a repeat"),
    ("x = " + "[" * 1000 + "]" * 1000, "nested too deeply"),
    ("x = " + "{a = " * 1000 + "}" * 1000, "nested too deeply"),
], ids=short)
def test_spec_refuses_hostile_value(tmp_path, text, says):
    assert says in spec_error(tmp_path, text)


def test_spec_not_utf8(tmp_path):
    (tmp_path / "spec.toml").write_bytes(b"\xff")
    with pytest.raises(TandemError, match="not UTF-8 at byte 0"):
        equivalence.load(catalog.NATIVE, tmp_path / "spec.toml")


def test_spec_is_a_directory(tmp_path):
    with pytest.raises(TandemError, match="cannot read"):
        equivalence.load(catalog.NATIVE, tmp_path)


def test_spec_repeats_that_cannot_backtrack_load(tmp_path):
    """Possessive and atomic inner repeats, and one repeat of a fixed text, stay allowed."""
    (tmp_path / "spec.toml").write_text("[serial]\nmask = ['(a++)+$', '(?>a+)+', '(ab){2,}', 'conn \\\\d+$']\n")
    assert len(equivalence.load(catalog.NATIVE, tmp_path / "spec.toml").rules["serial"].mask) == 4


def test_spec_in_range_still_loads(tmp_path):
    (tmp_path / "spec.toml").write_text("max_lag_ms = 1e12\n[serial]\nreorder_window = 1048576\n")
    spec = equivalence.load(catalog.NATIVE, tmp_path / "spec.toml")
    assert spec.max_lag_ns == 10**18 and spec.rules["serial"].reorder_window == 1 << 20


SITE = 'assert "a" at f(x): within(g, previously(returnfrom(h(x)) == {}))'


@pytest.mark.parametrize("text, says", [
    ('assert "a" at f: within(g, ' + "(" * 500 + "site" + ")" * 500 + ")", "nested too deeply"),
    ('assert "a" at f: within(g, ' + "previously(" * 500 + "site" + ")" * 500 + ")", "nested too deeply"),
    ('assert "a" at f: within(g, ' + "optional(" * 500 + "site" + ")" * 500 + ")", "nested too deeply"),
    (SITE.format("9" * 5000), "integer out of range: 5000 digits"),
    (SITE.format("0x1" + "0" * 16), "integer out of range"),
    (SITE.format("18446744073709551616"), "integer out of range"),
    (SITE.format("-9223372036854775809"), "integer out of range"),
    ('assert "a" at f+' + "9" * 30 + ": within(g, site)", "integer out of range"),
    ('assert "a" at f: within(g, previously(' + ", ".join(f"call(h{i})" for i in range(300)) + "))",
     "more than 256 events"),
], ids=short)
def test_assertion_refuses_hostile_text(text, says):
    with pytest.raises(AssertionLangError, match=says) as e:
        parse_text(text)
    assert "\n" not in str(e.value)


def test_assertion_64bit_limits_still_parse():
    assert parse_text(SITE.format("0xffffffffffffffff")) and parse_text(SITE.format("-9223372036854775808"))
    assert parse_text('assert "a" at f: within(g, ' + "(" * 31 + "site" + ")" * 31 + ")")


def zstd_bomb(size: int) -> bytes:
    """One zstd frame of `size` zero bytes whose header records that size (32 KiB for 1 GiB),
    made in 1 MiB pieces so the test does not allocate `size` itself."""
    cobj = zstandard.ZstdCompressor().compressobj(size=size)
    zeros = bytes(1 << 20)
    return b"".join(cobj.compress(zeros) for _ in range(size >> 20)) + cobj.flush()


def one_segment(tmp_path, stored: bytes, raw: int):
    """A stream of one zstd END segment whose header says `raw` for `stored`."""
    hdr = struct.pack("<4sIIIIIQQI", rrstream.SEG_MAGIC, 0, rrstream.FLAG_END | rrstream.FLAG_ZSTD,
                      len(stored), raw, zlib.crc32(stored), 1, 0, 0)
    path = tmp_path / "replay.tdrs"
    path.write_bytes(rrstream.FILE_HDR.pack(rrstream.FILE_MAGIC, rrstream.DEFAULT_REPLAY_VERSION, 0) + hdr
                     + struct.pack("<I", zlib.crc32(hdr)) + stored)
    return path


def test_rrstream_small_header_big_frame_stops_at_the_declared_size(tmp_path):
    path = one_segment(tmp_path, zstd_bomb(1 << 30), raw=100)
    tracemalloc.start()
    try:
        with pytest.raises(BundleError, match="raw length 101, header says 100"):
            list(rrstream.iter_raw(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20       # not the 1 GiB the frame's header declares


def test_rrstream_declared_size_over_the_bound_is_refused_before_reading(tmp_path):
    path = one_segment(tmp_path, zstandard.ZstdCompressor().compress(b"x"), raw=rrstream.MAX_RAW + 1)
    with pytest.raises(BundleError, match="over the .*-byte bound"):
        rrstream.scan(path)


def test_assertion_branch_product_is_refused_before_it_is_built():
    """64 automata times an OR of 8,000 sequences (300 KB): refused before the product is
    built (0.7 s of CPU when it was built first, 0.28 s now, on a busy 2-core machine;
    the time is the benchmark's to watch, not this test's)."""
    a = " || ".join(f"sequence(call(a{i}), call(b{i}))" for i in range(64))
    b = " || ".join(f"sequence(call(c{i}), call(d{i}))" for i in range(8000))
    with pytest.raises(AssertionLangError, match="more than 64 automata"):
        parse_text(f'assert "a" at f(x): within(g, previously(({a}), ({b})))')
