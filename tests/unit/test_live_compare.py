"""Comparing a live analysis as it goes (live_compare.py) on hand-built streams: what
is matched is dropped, and what is reported is what comparing the whole run reports."""
import tomllib

from hypothesis import given, settings, strategies as st

from tandem import catalog
from tandem.semantic.comparison import compare, equivalence
from tandem.semantic import inputs
from tandem.semantic.comparison import live_compare
from tandem.formats import netpkt
from tandem.semantic.comparison.live_compare import LiveCompare
from tandem.semantic.model import AnalysisRun, FlowOutput, NetOutput

KASAN = catalog.ANALYSES["kasan"]

GUEST = (bytes([10, 0, 2, 15]), 7000)
CLIENT = (bytes([10, 0, 2, 2]), 40000)
GMAC, CMAC = bytes.fromhex("525400123456"), netpkt.GATEWAY_MAC


def spec(text: str = "") -> equivalence.Spec:
    s = equivalence.Spec()
    equivalence._merge(s, tomllib.loads(text), "test")
    return s


class Pair:
    """A live native recording with one flow and a console, and an analysis run."""

    def __init__(self):
        self.rec = inputs.RecordedInputs([], [inputs.Flow(0, CLIENT, GUEST, CMAC, GMAC, 0)], None, [], finished=False)
        self.run = AnalysisRun("native")
        self.out = FlowOutput()             # the analysis guest's side of the connection
        self.run.net = NetOutput(flows={0: self.out})
        self.ns = 0

    def native(self, data: bytes, console: bytes = b"") -> None:
        self.ns += 1
        if data:
            self.rec.flows[0].guest_data.append((self.ns, data))
        if console:
            self.rec.serial_out.append((self.ns, console))

    def analysis(self, data: bytes, console: bytes = b"") -> None:
        self.ns += 1
        if data:
            self.out.data.append((self.ns, data))
        if console:
            self.run.console_times.append((self.run.console_base + len(self.run.console), self.ns))
            self.run.console += console

    def same_lines(self, lc: LiveCompare, n: int) -> None:
        """n equal lines on the connection, on both sides, compared as they come."""
        for i in range(n):
            self.native(f"VALUE {i}\n".encode())
            self.analysis(f"VALUE {i}\n".encode())
            lc.tick(self.run)

    def close(self) -> None:
        self.rec.flows[0].closed = True
        self.out.over = True


def test_chunks_drop_whole_chunks_and_find_offsets():
    c = inputs.Chunks([(1, b"abc"), (2, b"de"), (3, b"fgh")])
    assert (c.base, c.size, c.end) == (0, 8, 8)
    c.drop_to(4)                        # "de" ends at 5: only "abc" goes
    assert (c.base, c.dropped, list(c)) == (3, 1, [(2, b"de"), (3, b"fgh")])
    assert c.bytes_from(6) == b"gh" and c.bytes_from(0) == b"defgh" and c.head(3) == b"def"
    assert [c.time_at(o) for o in (3, 4, 5, 7)] == [2, 2, 3, 3]
    c.append((4, b"ij"))
    c.append((5, b""))                  # nothing: no chunk
    assert c.end == 10 and c.bytes_from(10) == b"" and len(c) == 3
    c.drop_to(10)
    assert (c.base, c.size, c.dropped, list(c)) == (10, 0, 4, [])


def matched(a: bytes, b: bytes, s=None, name="tcp flow 0 (x)"):
    return compare.matched(name, compare._Stream(a, chunks=[(7, a)]), compare._Stream(b, chunks=[(8, b)]),
                           s or spec(), {}, AnalysisRun("native"))


def test_matched_waits_at_a_difference_until_equal_lines_end_it():
    assert matched(b"OK\nVALUE 1\nVALUE 2\npart", b"OK\nVALUE 1\nVALUE 3\n") == (11, 11, [], False)
    assert matched(b"OK\nVALUE 1\n", b"OK\nVAL") == (3, 3, [], False)      # behind
    tail = b"".join(b"L%d\n" % i for i in range(compare.RESYNC_LINES))
    n_to, a_to, (d,), stuck = matched(b"OK\nVALUE 2\n" + tail, b"OK\nVALUE 3\nEXTRA\n" + tail)
    assert (n_to, a_to, stuck) == (11 + len(tail), 17 + len(tail), False)
    assert d.kind == "differ" and [l.text for l in d.native] == [b"VALUE 2"] \
        and [l.text for l in d.analysis] == [b"VALUE 3", b"EXTRA"] and d.native_ns == 7 and d.analysis_ns == 8
    # lines swapped within the spec's reorder window are no divergence
    swapped = spec("[tcp]\nreorder_window = 4\n")
    assert matched(b"A\nB\n" + tail, b"B\nA\n" + tail, swapped)[2:] == ([], False)
    # ... also among lines that repeat (a service logging its connections)
    oc = b"open\nclose\n" * 6
    assert matched(oc + b"open\nclose\n" + oc, oc + b"close\nopen\n" + oc, swapped) == \
        (len(oc) * 2 + 11, len(oc) * 2 + 11, [], False)
    # no end to a difference within RESYNC_MAX lines: compared whole, later
    long_a = b"".join(b"a%d\n" % i for i in range(compare.RESYNC_MAX + 10))
    long_b = b"".join(b"b%d\n" % i for i in range(compare.RESYNC_MAX + 10))
    assert matched(long_a, long_b) == (0, 0, [], True)


def test_matched_passes_over_lines_the_spec_drops():
    serial = spec("[serial]\nignore_kernel_lines = true\n")
    a = b"[    1.000000] kernel says\nkvd: ready\n"
    b = b"kvd: ready\n[    2.000000] other kernel\n"
    assert matched(a, b, serial, "serial") == (len(a), len(b), [], False)


def test_what_both_sides_agree_on_is_dropped_as_they_run():
    p = Pair()
    lc = LiveCompare(p.rec, spec("[serial]\nignore_kernel_lines = true\n"))
    for i in range(50):
        p.native(f"VALUE {i}\n".encode(), f"kvd: open conn {i}\n".encode())
        p.analysis(f"VALUE {i}\n".encode(), f"[    1.{i:06d}] noise\nkvd: open conn {i}\n".encode())
        lc.tick(p.run)
    fl = p.rec.flows[0]
    assert lc.native_at(compare.channel(fl)) == fl.guest_data.end
    assert p.out.data.size == 0 and len(p.run.console) == 0
    fl.guest_data.drop_to(lc.native_at(compare.channel(fl)))     # as live.shadow.ShadowRun does
    assert fl.guest_data.size == 0
    p.close()
    assert lc.tick(p.run) == {0}        # done with: the run's loop forgets it
    assert 0 in lc.done and lc.divergences == []
    p.run.outcome = "poweroff"
    lc.finish(p.run)
    assert lc.divergences == [] and lc.finished


def test_a_difference_is_reported_once_equal_lines_end_it_and_matching_goes_on():
    p = Pair()
    lc = LiveCompare(p.rec, spec())
    for i in range(30):
        p.native(f"VALUE {i}\n".encode())
        p.analysis(f"VALUE {i if i != 4 else 'x'}\n".encode())
        lc.tick(p.run)
        assert len(lc.divergences) == (i >= 4 + compare.RESYNC_LINES)
    tail = b"".join(b"L%d\n" % i for i in range(compare.RESYNC_LINES))
    (d,) = lc.divergences
    assert d.kind == "differ" and [l.text for l in d.native] == [b"VALUE 4"] \
        and [l.text for l in d.analysis] == [b"VALUE x"]
    assert not lc.stuck and p.out.data.size == 0
    p.native(b"", b"kvd: one\nkvd: two\n" + tail)           # on the console too, with its times
    p.analysis(b"", b"kvd: one\nkvd: 2\n" + tail)
    lc.tick(p.run)
    d = lc.divergences[-1]
    assert d.channel == "serial" and [(l.vm_ns, l.text) for l in d.analysis] == [(p.ns, b"kvd: 2")]
    p.close()
    lc.tick(p.run)
    assert len(lc.divergences) == 2 and 0 in lc.done


def test_output_past_a_clients_reset_is_no_divergence_live():
    """As compare.compare: a connection its client reset mid-response is compared only as
    far as the native's output went, once it has closed."""
    p = Pair()
    lc = LiveCompare(p.rec, spec())
    p.same_lines(lc, 20)
    p.native(b"VALUE 20 part")                  # the client reset here
    p.analysis(b"VALUE 20 part of a longer line\nVALUE 21\n")
    lc.tick(p.run)
    p.rec.flows[0].client_reset = True
    p.close()
    lc.tick(p.run)
    assert 0 in lc.done and lc.divergences == []


def _http(body: bytes, date: str, chunks: bool) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nDate: " + date.encode() + b"\r\n"
    if not chunks:
        return head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    half = len(body) // 2
    return (head + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % half + body[:half] + b"\r\n"
            + b"%x\r\n" % (len(body) - half) + body[half:] + b"\r\n0\r\n\r\n")


def test_http_is_matched_response_by_response_as_both_run():
    """An HTTP connection: chunked against whole bodies is no divergence, each response
    matched and dropped once both sides have it; a different body is reported at once."""
    p = Pair()
    p.rec.flows[0].protocol = "http"
    lc = LiveCompare(p.rec, equivalence.load(KASAN))
    name = compare.channel(p.rec.flows[0])
    for i in range(10):
        body = b"page %d\n" % i + b"x" * 3000
        native = _http(body, "Fri, 27 Nov 2026 22:01:07 GMT", False)
        p.native(native[:100])
        p.analysis(_http(body if i != 6 else body[:-1] + b"y", "Fri, 27 Nov 2026 22:09:59 GMT", True))
        lc.tick(p.run)
        p.native(native[100:])
        lc.tick(p.run)
        assert p.out.data.size == 0 and lc.native_at(name) == p.rec.flows[0].guest_data.end
        assert len(lc.divergences) == (i >= 6)
    assert name not in lc.as_lines
    (d,) = lc.divergences
    assert d.analysis[0].text.endswith(b"xy")
    p.native(b"HTTP/1.1 200 OK\r\nnot a header\r\n\r\n")     # not HTTP: as lines from here
    p.analysis(b"HTTP/1.1 200 OK\r\nnot a header\r\n\r\n")
    lc.tick(p.run)
    assert name in lc.as_lines
    p.close()
    lc.tick(p.run)
    assert len(lc.divergences) == 1 and 0 in lc.done


def test_redis_time_replies_are_matched_live():
    p = Pair()
    p.rec.flows[0].protocol, p.rec.flows[0].asks_time = "resp", True
    lc = LiveCompare(p.rec, equivalence.load(KASAN))
    for i in range(30):
        p.native(b"+OK\r\n*2\r\n$10\r\n%d\r\n$6\r\n%06d\r\n" % (1764301234 + i, 100000 + i))
        p.analysis(b"+OK\r\n*2\r\n$10\r\n%d\r\n$5\r\n%05d\r\n" % (1764309999 + i, 10000 + i))
        lc.tick(p.run)
    assert lc.divergences == [] and p.out.data.size == 0
    p.close()
    lc.tick(p.run)
    assert lc.divergences == [] and 0 in lc.done


def test_a_difference_without_end_is_compared_when_the_connection_closes():
    p = Pair()
    lc = LiveCompare(p.rec, spec())
    for i in range(compare.RESYNC_MAX + 20):
        p.native(f"VALUE {i}\n".encode())
        p.analysis(f"OTHER {i}\n".encode())
        lc.tick(p.run)
    assert compare.channel(p.rec.flows[0]) in lc.stuck and not lc.divergences
    p.close()
    lc.tick(p.run)
    (d,) = lc.divergences
    assert d.kind == "differ" and len(d.native) == compare.RESYNC_MAX + 20


def test_a_difference_without_end_is_compared_and_left_once_it_fills_stuck_max(monkeypatch):
    """A console that never resyncs must not keep the whole run: at STUCK_MAX bytes on a
    side it is compared whole, said to be compared no further, and dropped as it comes."""
    monkeypatch.setattr(live_compare, "STUCK_MAX", 4096)
    p = Pair()
    lc = LiveCompare(p.rec, spec())
    for i in range(compare.RESYNC_MAX + 20):
        p.native(b"", f"VALUE {i}\n".encode())
        p.analysis(b"", f"OTHER {i}\n".encode())
        lc.tick(p.run)
    assert "serial" in lc.stuck and not lc.divergences and not p.run.limits
    i = compare.RESYNC_MAX + 20
    while not lc.left:
        p.native(b"", f"VALUE {i}\n".encode())
        p.analysis(b"", f"OTHER {i}\n".encode())
        lc.tick(p.run)
        i += 1
    (d,) = lc.divergences
    assert d.kind == "differ" and len(d.native) == i
    (limit,) = p.run.limits
    assert limit.startswith("serial: the outputs differ from VM ") and "not after" in limit
    for j in range(1000):           # compared no further, and nothing of it kept
        p.native(b"", f"VALUE {i + j}\n".encode())
        p.analysis(b"", f"OTHER {i + j}\n".encode())
        lc.tick(p.run)
    assert len(p.run.console) == 0 and lc.native_at("serial") == p.rec.serial_out.end
    p.run.outcome = "poweroff"
    lc.finish(p.run)
    assert len(lc.divergences) == 1


lines = st.lists(st.sampled_from([b"OK", b"VALUE 1", b"VALUE 2", b"ERR", b""]), max_size=12)


@settings(max_examples=200, deadline=None)
@given(lines, lines, st.lists(st.integers(1, 40), max_size=6), st.booleans())
def test_live_and_whole_comparisons_agree_on_whether_outputs_differ(na, nb, cuts, ended_early):
    """Fed in pieces and ticked in between, the live comparison reports a divergence
    exactly when comparing the whole streams does, and never loses bytes it did not match."""
    a, b = b"".join(x + b"\n" for x in na), b"".join(x + b"\n" for x in nb)
    p = Pair()
    lc = LiveCompare(p.rec, spec())
    pa = pb = 0
    for c in cuts + [len(a) + len(b)]:
        p.native(a[pa:pa + c])
        p.analysis(b[pb:pb + c])
        pa, pb = min(len(a), pa + c), min(len(b), pb + c)
        lc.tick(p.run)
    p.close()
    p.run.outcome = "crashed" if ended_early else "poweroff"
    lc.tick(p.run)
    lc.finish(p.run)
    whole = compare.compare(
        inputs.RecordedInputs([], [inputs.Flow(0, CLIENT, GUEST, CMAC, GMAC, 0, guest_data=[(1, a)])], None, []),
        _run_with(b), spec())
    assert bool(lc.divergences) == bool(whole)


def _run_with(data: bytes) -> AnalysisRun:
    run = AnalysisRun("native")
    run.net = NetOutput(flows={0: FlowOutput(inputs.Chunks([(1, data)]))})
    return run


def test_an_analysis_that_ended_early_has_output_not_analysed_not_missing():
    # The analysis answered the first request and was stopped (detached) before the
    # second: the native's answer to it is output the analysis never reached.
    p = Pair()
    p.native(b"OK\n", b"kvd: conn 1\n")
    p.analysis(b"OK\n", b"kvd: conn 1\n")
    p.native(b"VALUE 2\nVALUE 3\n", b"kvd: close conn 1\n")
    p.run.outcome = "detached"
    lc = LiveCompare(p.rec, spec())
    lc.tick(p.run)
    lc.finish(p.run)
    assert lc.divergences == []
    by = {x.channel: x for x in lc.not_analysed}
    assert by["serial"].lines == 1 and by["serial"].first == b"kvd: close conn 1"
    (flow,) = [x for x in lc.not_analysed if x.channel.startswith("tcp")]
    assert (flow.lines, flow.first) == (2, b"VALUE 2")


def test_a_real_difference_before_an_early_end_is_still_a_divergence():
    p = Pair()
    p.native(b"OK\nVALUE 2\n")
    p.analysis(b"OK\nVALUE 9\n")
    p.run.outcome = "detached"
    lc = LiveCompare(p.rec, spec())
    lc.finish(p.run)
    (d,) = lc.divergences
    assert d.kind == "differ" and lc.not_analysed == []


def test_a_run_that_ended_cleanly_reports_missing_output_as_a_divergence():
    p = Pair()
    p.native(b"OK\nVALUE 2\n")
    p.analysis(b"OK\n")
    p.run.outcome = "poweroff"
    lc = LiveCompare(p.rec, spec())
    lc.finish(p.run)
    assert [d.kind for d in lc.divergences] == ["missing"] and lc.not_analysed == []


def test_connections_an_early_ended_analysis_never_opened_are_not_analysed():
    p = Pair()
    p.run.net.flows.clear()             # it never got to the connection
    p.native(b"OK\nOK\n")
    p.run.outcome = "lagging"
    lc = LiveCompare(p.rec, spec())
    lc.finish(p.run)
    assert lc.divergences == []
    (x,) = lc.not_analysed
    assert x.channel.startswith("tcp flow 0") and (x.lines, x.first) == (2, b"OK")


@given(st.binary(max_size=60), st.binary(max_size=30), st.binary(max_size=30))
def test_equal_lines_is_the_whole_lines_both_start_with(common, x, y):
    a, b = common + x, common + y
    naive = 0
    for i in range(min(len(a), len(b))):
        if a[i] != b[i]:
            break
        if a[i:i + 1] == b"\n":
            naive = i + 1
    assert compare.equal_lines(a, b) == naive


def test_a_line_an_early_ended_analysis_was_writing_is_not_a_divergence():
    """The analysis was stopped (hung, detached) while it wrote a line: on the console,
    byte by byte through the UART, or on a connection. What it wrote of that line is the
    start of the native's: the rest is output it never reached, not a difference. A cut
    line that is not the start of the native's is still a divergence."""
    for outcome in ("hung", "detached", "lagging"):
        p = Pair()
        p.native(b"OK\nVALUE 12345\nOK\n", b"kvd: conn 1\ntandem-init: module tandem_bugs .text=0x1\n")
        p.analysis(b"OK\nVALUE 12", b"kvd: conn 1\ntandem-init: mod")
        p.run.outcome = outcome
        lc = LiveCompare(p.rec, spec())
        lc.tick(p.run)
        lc.finish(p.run)
        assert lc.divergences == [], [d.diff for d in lc.divergences]
        by = {x.channel.split(" ")[0]: x for x in lc.not_analysed}
        assert (by["serial"].lines, by["serial"].first) == (1, b"tandem-init: module tandem_bugs .text=0x1")
        assert (by["tcp"].lines, by["tcp"].first) == (2, b"VALUE 12345")
    p = Pair()
    p.native(b"OK\nVALUE 12345\n")
    p.analysis(b"OK\nVALUE 99")
    p.run.outcome = "hung"
    lc = LiveCompare(p.rec, spec())
    lc.finish(p.run)
    (d,) = lc.divergences
    assert d.kind == "differ" and lc.not_analysed == []
    p = Pair()                      # an analysis that powered off with a line cut: a divergence
    p.native(b"OK\nVALUE 12345\n")
    p.analysis(b"OK\nVALUE 12")
    p.run.outcome = "poweroff"
    lc = LiveCompare(p.rec, spec())
    lc.finish(p.run)
    assert [d.kind for d in lc.divergences] == ["differ"]
