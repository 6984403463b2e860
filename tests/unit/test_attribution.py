"""What a divergence or finding is attributed to: the input delivered last before
it on its own connection (with several clients at once, the last input of all is some other
client's), described with what it said: a request's first line, escaped (the client's bytes,
or hostile ones), a datagram's addresses."""
from __future__ import annotations

import pytest

from tandem.formats import netpkt
from tandem.semantic.inputs import Input
from tandem.semantic.model import AnalysisRun, Delivered

GUEST_MAC, HOST_MAC = b"\x52\x54\x00\x12\x34\x56", b"\x52\x55\x0a\x00\x02\x02"


@pytest.mark.parametrize("inp, says", [
    (Input("tcp-data", 12_345_678_900, b"GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n", flow=3, seq=99),
     'tcp-data at VM 12.345679s (flow 3 offset 0, devlog event 99) "GET /index.html HTTP/1.1..."'),
    (Input("tcp-data", 0, b"*1\r\n$4\r\nPING\r\n", flow=0),
     'tcp-data at VM 0.000000s (flow 0 offset 0, devlog event 0) "*1..."'),
    (Input("tcp-data", 0, b"PING\r\n", flow=0), 'tcp-data at VM 0.000000s (flow 0 offset 0, devlog event 0) "PING"'),
    (Input("tcp-data", 0, b"\x1b[31m\"x\"\\\x00\xff", flow=1),
     r'tcp-data at VM 0.000000s (flow 1 offset 0, devlog event 0) "\x1b[31m\"x\"\\\x00\xff"'),
    (Input("frame", 1_000_000_000, netpkt.udp(HOST_MAC, GUEST_MAC, bytes([10, 0, 2, 2]), bytes([10, 0, 2, 15]),
                                              5555, 4444, b"boom" * 4), seq=7),
     "frame at VM 1.000000s (frame, devlog event 7) [udp 10.0.2.2:5555 -> 10.0.2.15:4444, 16 bytes of payload]"),
    (Input("frame", 0, b"\x00" * 20), "frame at VM 0.000000s (frame, devlog event 0) [20-byte frame]"),
    (Input("rng", 0, b"\x01\x02"), "rng at VM 0.000000s (rng, devlog event 0)"),
])
def test_an_input_is_described_with_what_it_said(inp, says):
    assert inp.describe() == says


def test_a_long_line_is_cut_and_said_so():
    said = Input("tcp-data", 0, b"A" * 500, flow=0).gist()
    assert said == '"' + "A" * 80 + '..."'


def test_output_on_a_connection_is_attributed_to_that_connections_last_input():
    run = AnalysisRun("kasan")
    run.delivered = [Delivered(t, Input("tcp-data", t, d, flow=f)) for t, f, d in
                     ((10, 0, b"GET /a"), (20, 1, b"SET k v"), (30, 0, b"GET /b"), (40, 1, b"GET k"),
                      (42, 0, b""), (45, None, b""))]
    run.delivered[-2].input.kind = "tcp-fin"
    run.delivered[-1].input.kind = "rng"
    assert run.input_before(43, flow=0).input.data == b"GET /b"     # the client's FIN after its request
    assert run.input_before(35, flow=0).input.data == b"GET /b"
    assert run.input_before(35, flow=1).input.data == b"SET k v"
    assert run.input_before(50).input.kind == "tcp-fin"         # entropy is no one's request
    assert run.input_before(15, flow=1).input.data == b"GET /a"  # none on the flow yet: the last of all
    assert run.input_before(5) is None


def test_a_finding_names_the_inputs_before_its_last_one_a_connection_once():
    """The datagram that reached the bug, then two connections a user network had held
    (open, request and FIN each, 6 inputs): the 4 named before the last input are the
    other connection's request, the datagram and what came before it, not 4 pieces of
    2 requests."""
    from tandem.semantic.findings import BEFORE_KEPT, of_report
    from tandem.report import Report
    datagram = netpkt.udp(HOST_MAC, GUEST_MAC, bytes([10, 0, 2, 2]), bytes([10, 0, 2, 15]), 5555, 4444, b"oob")
    inputs = [Input("tcp-data", 1, b"GET /old HTTP/1.1\r\n", flow=0), Input("tcp-fin", 2, flow=0, offset=19),
              Input("serial", 3, b"root\n"), Input("frame", 4, datagram, seq=40),
              Input("tcp-open", 5, flow=1), Input("tcp-open", 6, flow=2),
              Input("tcp-data", 7, b"GET / HTTP/1.1\r\n", flow=1), Input("tcp-fin", 8, flow=1, offset=16),
              Input("tcp-data", 9, b"GET / HTTP/1.1\r\n", flow=2), Input("tcp-fin", 10, flow=2, offset=16)]
    run = AnalysisRun("kasan")
    run.delivered = [Delivered(i.vm_ns, i) for i in inputs]
    run.console, run.console_times = bytearray(b"x" * 10), [(0, 20)]
    f = of_report(run, Report("linux", "KASAN", "KASAN: slab-out-of-bounds Write in tb_note_store", [], "", 0, 10))
    assert f.after_input == inputs[-1].describe() and len(f.before) == BEFORE_KEPT
    assert f.before == [inputs[6].describe(), inputs[3].describe(), inputs[2].describe(), inputs[0].describe()]
