"""Protocol-aware acceptable differences (issue 24): a connection's protocol comes from
its client's first bytes, and the built-in HTTP and RESP rules allow what two servers
answering the same requests at different times differ in, and nothing more."""
from __future__ import annotations

import pytest

from tandem.formats import netpkt
from tandem.semantic import compare, equivalence, inputs
from tandem.semantic.inputs import protocol_of
from tandem.semantic.model import AnalysisRun
from tandem.semantic.peer import Peer, PeerFlow

GUEST, CLIENT = (bytes([10, 0, 2, 15]), 80), (bytes([10, 0, 2, 2]), 40000)
GMAC = bytes.fromhex("525400123456")


def response(date: str, body: bytes, etag: str = '"5f1-400"', status: str = "200 OK") -> bytes:
    return (f"HTTP/1.1 {status}\r\nServer: nginx/1.22.1\r\nDate: {date}\r\nContent-Type: application/octet-stream\r\n"
            f"Content-Length: {len(body)}\r\nLast-Modified: Fri, 27 Nov 2026 22:0{date[-5]}:00 GMT\r\n"
            f"Connection: keep-alive\r\nETag: {etag}\r\nAccept-Ranges: bytes\r\n\r\n").encode() + body


def divergences(native: bytes, theirs: bytes, protocol: str) -> list[compare.Divergence]:
    """Compare one connection's guest output, native against analysis, under kasan's spec."""
    fl = inputs.Flow(0, CLIENT, GUEST, netpkt.GATEWAY_MAC, GMAC, 0, protocol=protocol)
    fl.guest_data.append((1, native))
    rec = inputs.RecordedInputs([], [fl], None, [])
    run = AnalysisRun("kasan")
    run.peer = Peer()
    pf = run.peer.flows[0] = PeerFlow(0, CLIENT, GUEST, netpkt.GATEWAY_MAC, GMAC, isn=1)
    if theirs:
        pf.guest_data.append((2, theirs))
    return compare.compare(rec, run, equivalence.load("kasan"), only={compare.channel(fl)})


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


def test_a_spec_can_add_to_a_protocols_rules():
    s = equivalence.load("kasan")
    equivalence._merge(s, {"http": {"mask": ["(?<=^Server: ).*"]}}, "test")
    assert len(s.for_protocol("http").rules["tcp"].mask) == len(equivalence.load("kasan").for_protocol("http").rules["tcp"].mask) + 1
    assert s.for_protocol("line") is s and s.for_protocol(None) is s


def test_a_users_vm_console_is_compared_only_when_a_spec_asks(tmp_path):
    assert "serial" in equivalence.load("kasan", users_guest=True).ignore_channels
    assert "serial" not in equivalence.load("kasan").ignore_channels          # the demo guest's is
    asks = tmp_path / "s.toml"
    asks.write_text("[serial]\nignore = ['^systemd']\n")
    assert "serial" not in equivalence.load("kasan", asks, users_guest=True).ignore_channels
    other = tmp_path / "o.toml"
    other.write_text("[tcp]\nmask = ['x']\n")
    assert "serial" in equivalence.load("kasan", other, users_guest=True).ignore_channels
