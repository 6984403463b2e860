"""The comparator and the input loader on hand-built streams (no VM): what the fast
paths (whole-stream equality, identical lines after the spec) must not change."""
import tomllib

from tandem import catalog
from tandem.semantic.comparison import compare, equivalence
from tandem.semantic import inputs
from tandem.formats import netpkt, pcapng
from tandem.semantic.model import AnalysisRun, Delivered, FlowOutput
from tandem.semantic.network.peer import Peer

GUEST = (bytes([10, 0, 2, 15]), 7000)
CLIENT = (bytes([10, 0, 2, 2]), 40000)
GMAC, CMAC = bytes.fromhex("525400123456"), netpkt.GATEWAY_MAC


def recording(native_flow: list[tuple[int, bytes]], console: list[tuple[int, bytes]]) -> inputs.RecordedInputs:
    fl = inputs.Flow(0, CLIENT, GUEST, CMAC, GMAC, 0)
    fl.guest_data = list(native_flow)
    fl.guest_bytes = sum(len(d) for _, d in native_flow)
    return inputs.RecordedInputs([], [fl], None, [], serial_out=list(console))


def analysis(flow: list[tuple[int, bytes]], console: list[tuple[int, bytes]], udp=()) -> AnalysisRun:
    run = AnalysisRun("native")
    for ns, data in console:
        run.console_times.append((len(run.console), ns))
        run.console += data
    peer = Peer()                       # it keeps the guest's datagrams as it parses each frame
    run.net = peer.out
    run.net.flows[0] = FlowOutput(inputs.Chunks(flow))
    for ns, payload in udp:
        frame = netpkt.udp(GMAC, CMAC, GUEST[0], CLIENT[0], 5000, 514, payload)
        run.net_out.append((ns, frame))
        peer.on_frame(frame, ns)
    run.delivered.append(Delivered(5, inputs.Input("tcp-data", 5, b"GET a\n", flow=0)))
    return run


def spec(text: str = "") -> equivalence.Spec:
    s = equivalence.Spec()
    equivalence._merge(s, tomllib.loads(text), "test")
    return s


def test_segmentation_and_console_writes_do_not_matter():
    rec = recording([(10, b"OK\nVAL"), (20, b"UE 1\n")], [(1, b"kvd: ready\n"), (2, b"hi\n")])
    run = analysis([(11, b"O"), (12, b"K\nVALUE 1\n")], [(3, b"k"), (4, b"vd: ready\nh"), (5, b"i\n")])
    assert compare.compare(rec, run, spec()) == []
    assert compare.compare(rec, run, equivalence.load(catalog.NATIVE)) == []


def test_a_different_line_is_reported_with_both_times():
    rec = recording([(10, b"OK\n"), (20, b"VALUE 1\n")], [])
    run = analysis([(11, b"OK\nVAL"), (31, b"UE 2\n")], [])
    (d,) = compare.compare(rec, run, spec())
    assert (d.channel.split(" (")[0], d.kind) == ("tcp flow 0", "differ")
    assert [(l.vm_ns, l.text) for l in d.native] == [(20, b"VALUE 1")]
    # the line's time is the time of the chunk its first byte came in
    assert [(l.vm_ns, l.text) for l in d.analysis] == [(11, b"VALUE 2")]
    assert d.after_input.startswith("tcp-data")
    assert "-VALUE 1" in d.diff and "+VALUE 2" in d.diff


def test_lines_the_analysis_lacks_follow_the_request_it_answered_there():
    """A missing run of lines has no analysis line of its own: it is placed after the
    input the analysis had taken at the line before the gap (a page of another length
    diffs as a changed part and a missing part, each after the request)."""
    rec = recording([(10, b"HEAD\nA\nB\nTAIL\n")], [])
    run = analysis([(11, b"HEAD\nTAIL\n")], [])
    (d,) = compare.compare(rec, run, spec())
    assert d.kind == "missing" and d.analysis_ns is None
    assert d.after_input.startswith("tcp-data") and "GET a" in d.after_input, d.after_input
    # an analysis that wrote nothing on the connection: after the request it had taken by
    # the time the native answered
    (d,) = compare.compare(rec, analysis([], []), spec())
    assert d.kind == "missing" and "GET a" in d.after_input, d.after_input
    # ... taken later on its own clock than the native answered it: still after that
    # request (the native's time is the recorded inputs' clock), not the connection's open
    late = analysis([], [])
    late.delivered[:] = [Delivered(3, inputs.Input("tcp-open", 3, b"", flow=0)),
                         Delivered(40, inputs.Input("tcp-data", 5, b"GET a\n", flow=0))]
    (d,) = compare.compare(rec, late, spec())
    assert d.kind == "missing" and "GET a" in d.after_input, d.after_input


def test_console_line_times_follow_the_writes():
    rec = recording([], [(1, b"a\n"), (2, b"b\n")])
    run = analysis([], [(7, b"a\nb"), (9, b"x\n"), (12, b"c\n")])
    divs = compare.compare(rec, run, spec())
    assert [(d.kind, [(l.vm_ns, l.text) for l in d.analysis]) for d in divs] == [
        ("differ", [(7, b"bx"), (12, b"c")])]


def test_masks_ignores_and_byte_ranges_apply_before_comparing():
    rec = recording([(1, b"ID 1234 OK\n")], [(1, b"[    1.000] kernel says\n"), (2, b"conn 1\n")])
    run = analysis([(1, b"ID 9876 OK\n")], [(3, b"[    2.500] other kernel\n"), (4, b"conn 2\n")])
    assert len(compare.compare(rec, run, spec())) == 2
    s = spec('[serial]\nignore_kernel_lines = true\nmask = ["conn \\\\d+"]\n'
             '[tcp]\nbyte_ranges = [{flow = 0, start = 3, end = 7}]\n')
    assert compare.compare(rec, run, s) == []
    s = spec('[serial]\nignore = ["^\\\\[", "^conn"]\n[tcp]\nmask = ["\\\\d+"]\n')
    assert compare.compare(rec, run, s) == []


def test_lag_bound_applies_to_equal_streams():
    rec = recording([(1_000, b"OK\n")], [])
    run = analysis([(5_000_000_000, b"OK\n")], [])
    assert compare.compare(rec, run, spec()) == []
    (d,) = compare.compare(rec, run, spec("max_lag_ms = 1000"))
    assert d.kind == "lag" and d.native[0].vm_ns == 1_000 and d.analysis[0].vm_ns == 5_000_000_000


def test_udp_datagrams_compared_in_order():
    rec = recording([], [])
    rec.udp_out = [(1, (CLIENT[0], 514), b"one"), (2, (CLIENT[0], 514), b"two")]
    run = analysis([], [], udp=[(3, b"one"), (4, b"two")])
    assert run.net.udp_out == [(3, (CLIENT[0], 514), b"one"), (4, (CLIENT[0], 514), b"two")]
    assert compare.compare(rec, run, spec()) == []
    run = analysis([], [], udp=[(3, b"one"), (4, b"TWO")])
    (d,) = compare.compare(rec, run, spec())
    assert d.channel == "udp 10.0.2.2:514" and d.kind == "differ"
    # a datagram again, right after itself, is a retransmission: compared once
    run = analysis([], [], udp=[(3, b"one"), (4, b"one"), (5, b"one"), (6, b"two")])
    assert compare.compare(rec, run, spec()) == []
    run = analysis([], [], udp=[(3, b"one"), (4, b"two"), (5, b"one")])      # not right after: a datagram more
    (d,) = compare.compare(rec, run, spec())
    assert d.kind == "extra"


def test_loader_reassembles_flows_and_dependencies(tmp_path):
    path = tmp_path / "devices.pcapng"
    w = pcapng.PcapngWriter(path)
    net = w.add_interface("net0", "net")
    ser = w.add_interface("serial0", "serial")
    c, g = 1000, 5000                   # client and guest sequence numbers

    def seg(direction, ns, seq, ack, flags, payload=b""):
        src, dst = (CLIENT, GUEST) if direction == "in" else (GUEST, CLIENT)
        smac, dmac = (CMAC, GMAC) if direction == "in" else (GMAC, CMAC)
        w.event(net, direction, ns, netpkt.tcp(smac, dmac, src[0], dst[0], src[1], dst[1], seq, ack, flags,
                                               64240, payload), icount=ns)
    w.event(ser, "out", 1, b"READY\n", icount=1)
    seg("in", 10, c, 0, netpkt.SYN)
    seg("out", 11, g, c + 1, netpkt.SYN | netpkt.ACK)
    seg("in", 12, c + 1, g + 1, netpkt.ACK)
    seg("in", 13, c + 1, g + 1, netpkt.ACK | netpkt.PSH, b"GET a\n")
    seg("out", 14, g + 1, c + 7, netpkt.ACK, b"VALUE ")
    seg("out", 15, g + 1, c + 7, netpkt.ACK, b"VALUE ")          # a retransmission
    seg("out", 16, g + 7, c + 7, netpkt.ACK, b"1\n")
    seg("in", 17, c + 7, g + 9, netpkt.ACK | netpkt.PSH, b"GET b\n")
    seg("in", 18, c + 13, g + 9, netpkt.ACK | netpkt.FIN)
    w.close(end_vm_ns=100)
    rec = inputs.from_events(pcapng.iter_events(path))
    (fl,) = rec.flows
    assert list(fl.guest_data) == [(14, b"VALUE "), (16, b"1\n")] and fl.guest_bytes == 8
    assert [(i.kind, i.data, i.offset, i.needs_bytes, i.needs_line) for i in rec.inputs] == [
        ("tcp-open", b"", 0, {}, (b"READY", 1)),
        ("tcp-data", b"GET a\n", 0, {}, None),
        ("tcp-data", b"GET b\n", 6, {0: 8}, None),
        ("tcp-fin", b"", 12, {}, None)]        # flow 0's 8 bytes: needed by the input before



def test_a_probe_the_native_reset_while_its_service_started_is_not_compared(tmp_path):
    """The native's guest took a connection and reset it before answering a byte, while its
    service had answered none on that port (nginx starting: a readiness probe); an analysis
    booting on its own timing answers it. Not a divergence. A reset after the service had
    answered another client is the guest's, and stays one."""
    path = tmp_path / "devices.pcapng"
    w = pcapng.PcapngWriter(path)
    net = w.add_interface("net0", "net")

    def seg(direction, ns, port, seq, ack, flags, payload=b""):
        src, dst = ((CLIENT[0], port), GUEST) if direction == "in" else (GUEST, (CLIENT[0], port))
        smac, dmac = (CMAC, GMAC) if direction == "in" else (GMAC, CMAC)
        w.event(net, direction, ns, netpkt.tcp(smac, dmac, src[0], dst[0], src[1], dst[1], seq, ack, flags,
                                               64240, payload), icount=ns)

    def probe(t, port, answer=b""):
        c, g = 1000, 5000
        seg("in", t, port, c, 0, netpkt.SYN)
        seg("out", t + 1, port, g, c + 1, netpkt.SYN | netpkt.ACK)
        seg("in", t + 2, port, c + 1, g + 1, netpkt.ACK | netpkt.PSH | netpkt.FIN, b"GET a\n")
        if answer:
            seg("out", t + 3, port, g + 1, c + 8, netpkt.ACK | netpkt.PSH | netpkt.FIN, answer)
        else:
            seg("out", t + 3, port, g + 1, c + 8, netpkt.RST | netpkt.ACK)
    probe(10, 40001)                     # reset while starting
    probe(20, 40002, b"VALUE 1\n")       # the service answers
    probe(30, 40003)                     # reset by a service that answered before
    w.close(end_vm_ns=100)
    rec = inputs.from_events(pcapng.iter_events(path))
    assert [fl.reset_starting for fl in rec.flows] == [True, False, False]
    run = AnalysisRun("native")
    run.net = Peer().out
    for i in range(3):
        run.net.flows[i] = FlowOutput(inputs.Chunks([(50 + i, b"VALUE 1\n")]))
    divs = compare.compare(rec, run, spec())
    assert [d.channel.split(" (")[0] for d in divs] == ["tcp flow 2"], [(d.channel, d.kind) for d in divs]
