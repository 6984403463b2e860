"""Protocol-aware acceptable differences: a connection's protocol comes from
its client's first bytes, and the built-in HTTP and RESP rules allow what two servers
answering the same requests at different times differ in, and nothing more."""
from __future__ import annotations

import pytest

from tandem import catalog
from tandem.formats import netpkt
from tandem.semantic.comparison import compare, equivalence
from tandem.semantic import inputs
from tandem.semantic.inputs import protocol_of
from tandem.semantic.model import AnalysisRun, FlowOutput, NetOutput

KASAN = catalog.ANALYSES["kasan"]

GUEST, CLIENT = (bytes([10, 0, 2, 15]), 80), (bytes([10, 0, 2, 2]), 40000)
GMAC = bytes.fromhex("525400123456")


def response(date: str, body: bytes, etag: str = '"5f1-400"', status: str = "200 OK") -> bytes:
    return (f"HTTP/1.1 {status}\r\nServer: nginx/1.22.1\r\nDate: {date}\r\nContent-Type: application/octet-stream\r\n"
            f"Content-Length: {len(body)}\r\nLast-Modified: Fri, 27 Nov 2026 22:0{date[-5]}:00 GMT\r\n"
            f"Connection: keep-alive\r\nETag: {etag}\r\nAccept-Ranges: bytes\r\n\r\n").encode() + body


def divergences(native: bytes, theirs: bytes, protocol: str, reset: bool = False,
                asks_time: bool = False) -> list[compare.Divergence]:
    """Compare one connection's guest output, native against analysis, under kasan's spec
    (`reset`: the client reset the connection; `asks_time`: its client sent TIME)."""
    fl = inputs.Flow(0, CLIENT, GUEST, netpkt.GATEWAY_MAC, GMAC, 0, protocol=protocol, client_reset=reset,
                     asks_time=asks_time)
    fl.guest_data.append((1, native))
    rec = inputs.RecordedInputs([], [fl], None, [])
    run = AnalysisRun("kasan")
    out = FlowOutput()
    run.net = NetOutput(flows={0: out})
    if theirs:
        out.data.append((2, theirs))
    return compare.compare(rec, run, equivalence.load(KASAN), only={compare.channel(fl)})


@pytest.mark.parametrize("first, protocol", [
    (b"GET /1m.bin HTTP/1.1\r\nHost: x\r\n", "http"), (b"HEAD / HTTP/1.0\r\n", "http"),
    (b"*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n", "resp"), (b"SET k1 v1\n", "line"), (b"GETX", "line"), (b"", "line"),
    (b"*\r\n", "line"), (b"\xff" * 100, "line")])
def test_a_connections_protocol_is_what_its_client_sent_first(first, protocol):
    assert protocol_of(first) == protocol


def test_http_date_etag_and_last_modified_may_differ():
    a = response("Fri, 27 Nov 2026 22:01:07 GMT", b"x" * 10)
    b = response("Fri, 27 Nov 2026 22:03:41 GMT", b"x" * 10, etag='"5f2-400"')
    assert divergences(a + a, b + b, "http") == []
    # the same difference on a connection that carries lines is a divergence
    assert {d.kind for d in divergences(a, b, "line")} == {"differ"}


@pytest.mark.parametrize("theirs", [
    response("Fri, 27 Nov 2026 22:03:41 GMT", b"y" * 10),                  # a different body
    response("Fri, 27 Nov 2026 22:03:41 GMT", b"x" * 10, status="500 Internal Server Error"),
    b"",                                                                       # no response at all
])
def test_http_body_status_or_a_missing_response_still_diverge(theirs):
    native = response("Fri, 27 Nov 2026 22:01:07 GMT", b"x" * 10)
    assert divergences(native, theirs, "http")


@pytest.mark.parametrize("cut", [0, 17, 70, 200, 300, 348 + 70, 348 + 300])
def test_output_past_a_clients_reset_is_no_divergence(cut):
    """wrk ends its run by resetting connections mid-response: the analysis, on its own
    timing, sent more of the response before the reset reached it. Compared only as far
    as the native's output went, at any point of a reply (headers, Date, body)."""
    first = response("Fri, 27 Nov 2026 22:01:07 GMT", b"x" * 100)
    second = response("Fri, 27 Nov 2026 22:01:08 GMT", b"x" * 100)
    theirs = response("Fri, 27 Nov 2026 22:03:41 GMT", b"x" * 100) + \
        response("Fri, 27 Nov 2026 22:03:42 GMT", b"x" * 100)
    assert len(first) == 348 and first[62:72] == b"22:01:07 G"
    native = (first + second)[:cut]
    assert divergences(native, theirs, "http", reset=True) == []
    assert divergences(native, theirs, "http")      # without the reset: the analysis's extra is a divergence


def test_before_a_reset_a_different_body_still_diverges():
    native = response("Fri, 27 Nov 2026 22:01:07 GMT", b"x" * 100)[:-20]
    theirs = response("Fri, 27 Nov 2026 22:03:41 GMT", b"x" * 70 + b"y" * 30)
    (d,) = divergences(native, theirs, "http", reset=True)
    assert d.kind == "differ" and d.native[0].text == b"x" * 80 and d.analysis[0].text == b"x" * 70 + b"y" * 10


def chunked(date: str, body: bytes, sizes=(7, 1, 1000), reorder: bool = False) -> bytes:
    """The same response as response(), its body in chunks of `sizes` bytes, headers in
    another order if `reorder`."""
    head = [b"Server: nginx/1.22.1", b"Date: " + date.encode(), b"Content-Type: application/octet-stream",
            b"Transfer-Encoding: chunked", b"Last-Modified: Fri, 27 Nov 2026 22:0%s:00 GMT" % date[-5].encode(),
            b"Connection: keep-alive", b'ETag: "5f1-400"', b"Accept-Ranges: bytes"]
    if reorder:
        head = [h.split(b":", 1)[0].lower() + b":" + h.split(b":", 1)[1] if i % 2 else h
                for i, h in enumerate(reversed(head))]      # names in another case too
    out, pos = [b"HTTP/1.1 200 OK\r\n" + b"\r\n".join(head) + b"\r\n\r\n"], 0
    for n in sizes:
        if pos < len(body):
            part = body[pos:pos + n]
            out.append(b"%x;ext=1\r\n" % len(part) + part + b"\r\n")
            pos += n
    return b"".join(out) + b"0\r\nX-Trailer: t\r\n\r\n"


@pytest.mark.parametrize("reorder", [False, True])
def test_http_chunked_and_whole_bodies_and_header_order_may_differ(reorder):
    body = b"line one\nline two\n" + b"z" * 500
    a = response("Fri, 27 Nov 2026 22:01:07 GMT", body)
    b = chunked("Fri, 27 Nov 2026 22:03:41 GMT", body, reorder=reorder)
    assert divergences(a + a + a, b + a + b, "http") == []
    assert divergences(b, a, "http") == []


@pytest.mark.parametrize("theirs, says", [
    (chunked("Fri, 27 Nov 2026 22:03:41 GMT", b"line one\nline 2\n" + b"z" * 500), b"line 2"),     # body
    (chunked("Fri, 27 Nov 2026 22:03:41 GMT", b"line one\nline two\n" + b"z" * 499), b"z" * 499),  # one byte short
    (response("Fri, 27 Nov 2026 22:03:41 GMT", b"line one\nline two\n" + b"z" * 500,
              status="404 Not Found"), b"HTTP/1.1 404 Not Found"),                                    # status
])
def test_http_framing_never_hides_a_different_body_or_status(theirs, says):
    native = response("Fri, 27 Nov 2026 22:01:07 GMT", b"line one\nline two\n" + b"z" * 500)
    divs = divergences(native + native, theirs + native, "http")
    assert divs and any(says in l.text for d in divs for l in d.analysis), divs


def test_http_that_does_not_parse_is_compared_as_lines():
    ok = response("Fri, 27 Nov 2026 22:01:07 GMT", b"x" * 10)
    assert divergences(ok + b"garbage\nmore\n", ok + b"garbage\nmore\n", "http") == []
    (d,) = divergences(ok + b"garbage\nmore\n", ok + b"garbage\nMORE\n", "http")
    assert [l.text for l in d.analysis] == [b"MORE"]
    (d,) = divergences(ok + ok, ok, "http")              # a response missing at the end
    assert d.kind == "missing" and d.native[0].text == b"HTTP/1.1 200 OK"


def test_redis_info_server_fields_may_differ_but_values_may_not():
    def info(uptime: int, mem: int, keys: int) -> bytes:
        text = (f"# Server\r\nredis_version:7.0.15\r\nprocess_id:{300 + uptime}\r\nuptime_in_seconds:{uptime}\r\n"
                f"# Memory\r\nused_memory:{mem}\r\nused_memory_human:{mem // 1024}K\r\n# Keyspace\r\n"
                f"db0:keys={keys},expires=0\r\n").encode()
        return b"$%d\r\n" % len(text) + text
    assert divergences(b"+OK\r\n" + info(12, 900000, 5), b"+OK\r\n" + info(31, 912345, 5), "resp") == []
    (d,) = divergences(info(12, 900000, 5), info(31, 912345, 6), "resp")     # a key more: a real difference
    assert b"db0:keys=6" in d.analysis[0].text
    assert divergences(b"$5\r\nhello\r\n", b"$5\r\nworld\r\n", "resp")


def time_reply(seconds: int, micros: int) -> bytes:
    return b"*2\r\n$%d\r\n%d\r\n$%d\r\n%d\r\n" % (len(str(seconds)), seconds, len(str(micros)), micros)


def test_redis_time_replies_may_differ_on_a_connection_that_asked_for_the_time():
    native = b"+OK\r\n" + time_reply(1764301234, 123456) + b"$3\r\nabc\r\n" + time_reply(1764301235, 9)
    theirs = b"+OK\r\n" + time_reply(1764309999, 98765) + b"$3\r\nabc\r\n" + time_reply(1764310000, 100000)
    assert divergences(native, theirs, "resp", asks_time=True) == []
    assert divergences(native, theirs, "resp")          # a client that never asked: a real difference
    (d,) = divergences(native, theirs.replace(b"abc", b"abd"), "resp", asks_time=True)
    assert [l.text for l in d.analysis] == [b"abd"]
    # a two-element reply of another shape is compared as it is
    assert divergences(b"*2\r\n$1\r\na\r\n$1\r\nb\r\n", b"*2\r\n$1\r\na\r\n$1\r\nc\r\n", "resp",
                       asks_time=True)


@pytest.mark.parametrize("segments, asks", [
    ([b"*1\r\n$4\r\nTIME\r\n"], True), ([b"*1\r\n$4\r\nPING\r\n", b"*1\r\n$4\r\nti", b"me\r\n"], True),
    ([b"*2\r\n$3\r\nGET\r\n$8\r\ntimeouts\r\n"], False), ([b"*1\r\n$4\r\nPING\r\n"], False)])
def test_a_resp_client_that_sends_time_is_seen_across_segments(segments, asks):
    x = inputs.InputExtractor(inputs.RecordedInputs([], [], None, []))
    fl = inputs.Flow(0, CLIENT, GUEST, netpkt.GATEWAY_MAC, GMAC, 0, protocol="resp")
    for seg in segments:
        x._asks_time(fl, seg)
    assert fl.asks_time == asks


def test_a_spec_can_add_to_a_protocols_rules():
    s = equivalence.load(KASAN)
    equivalence._merge(s, {"http": {"mask": ["(?<=^Server: ).*"]}}, "test")
    assert len(s.for_protocol("http").rules["tcp"].mask) == len(equivalence.load(KASAN).for_protocol("http").rules["tcp"].mask) + 1
    assert s.for_protocol("line") is s and s.for_protocol(None) is s


def test_a_users_vm_console_is_compared_only_when_a_spec_asks(tmp_path):
    assert "serial" in equivalence.load(KASAN, users_guest=True).ignore_channels
    assert "serial" not in equivalence.load(KASAN).ignore_channels          # the demo guest's is
    asks = tmp_path / "s.toml"
    asks.write_text("[serial]\nignore = ['^systemd']\n")
    assert "serial" not in equivalence.load(KASAN, asks, users_guest=True).ignore_channels
    other = tmp_path / "o.toml"
    other.write_text("[tcp]\nmask = ['x']\n")
    assert "serial" in equivalence.load(KASAN, other, users_guest=True).ignore_channels
