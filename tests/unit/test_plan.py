"""`tandem plan`: FreeDA's equation 2 on the paper's own cases, and on a device log
whose requests, sizes and overlaps are known by construction (worked by hand below)."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from helpers import assert_one_line_error, run_cli
from tandem.formats import bundle, netpkt, pcapng
from tandem.errors import TandemError
from tandem.semantic.inputs import Flow, Input, RecordedInputs, from_events
from tandem.plan import Request, equation2, measure, plan
from tandem.plan.workload import _share_time


def pow2(n: float) -> int:
    """FreeDA's buffers are powers of two: the smallest one that holds n entries."""
    return 1 << math.ceil(math.log2(n))


# --- the equation, on the numbers the paper gives (N_sys = 2 there: entry and exit) ---

def test_nginx_asan():          # §5.2.1: S_req 15, N_T 4 (4 threads), F 1.5 -> buffer 128
    assert equation2(4, 15, 1.5, 2) == pytest.approx((60 - 40 + 15) * 2) == pytest.approx(70)
    assert pow2(equation2(4, 15, 1.5, 2)) == 128


def test_redis_and_memcached():  # §5.2.3: (4, 17, 1.5) -> 128 and (4, 25, 2) -> 256
    assert equation2(4, 17, 1.5, 2) == pytest.approx((68 - 68 / 1.5 + 17) * 2)
    assert pow2(equation2(4, 17, 1.5, 2)) == 128
    assert equation2(4, 25, 2, 2) == pytest.approx((100 - 50 + 25) * 2) == pytest.approx(150)
    assert pow2(equation2(4, 25, 2, 2)) == 256


def test_htop_valgrind():        # §5.1: S_req 13Ki, N_T 1, F 13 -> 64Ki
    assert equation2(1, 13 * 1024, 13, 2) == pytest.approx((13 * 1024 - 1024 + 13 * 1024) * 2)
    assert pow2(equation2(1, 13 * 1024, 13, 2)) == 64 * 1024


def test_section3_load_balancer():   # 12 requests, F 3: 12 - 4 + 1 = 9 requests' worth
    assert equation2(12, 1, 3, 1) == pytest.approx(9)
    assert equation2(12, 10, 3) == pytest.approx(90)


def test_no_slower_than_native_holds_one_request():
    assert equation2(4, 15, 1.0) == pytest.approx(15)
    assert equation2(4, 15, 0.5) == pytest.approx(15)       # the N_T terms would go negative
    with pytest.raises(TandemError):
        equation2(4, 15, 0)
    with pytest.raises(TandemError):
        equation2(0, 15, 2)


# --- measuring a recording --------------------------------------------------------------

GUEST = (bytes([10, 0, 2, 15]), 7000)
A, B = (bytes([10, 0, 2, 2]), 40001), (bytes([10, 0, 2, 2]), 40002)
GMAC, CMAC = bytes.fromhex("525400123456"), netpkt.GATEWAY_MAC
ACK, PSH, SYN, FIN, RST = netpkt.ACK, 0x08, netpkt.SYN, netpkt.FIN, netpkt.RST


def write_devlog(path):
    """The guest is ready @8. Two clients. A: open@10, "SET a 1\\n"@20 answered @30,
    "GET a\\n"@40 answered @50, close @60: two requests, (open + 8 bytes) over [10, 30]
    and (6 bytes + close) over [40, 50]. B: open@25, two pipelined lines @26 and @28
    answered together @45, reset @70: one request of four inputs and 12 bytes over
    [25, 45]. A typed serial line @5 and entropy @1 are outside any request."""
    w = pcapng.PcapngWriter(path)
    net, ser, rng = w.add_interface("net0", "net"), w.add_interface("serial0", "serial"), w.add_interface("rng0", "rng")
    seqs = {A: [1000, 5000], B: [2000, 9000]}           # client, guest next sequence numbers

    def seg(client, direction, ns, flags, payload=b""):
        c, g = seqs[client]
        if direction == "in":
            frame = netpkt.tcp(CMAC, GMAC, client[0], GUEST[0], client[1], GUEST[1], c, g, flags, 64240, payload)
            seqs[client][0] = c + len(payload) + (1 if flags & (SYN | FIN) else 0)
        else:
            frame = netpkt.tcp(GMAC, CMAC, GUEST[0], client[0], GUEST[1], client[1], g, c, flags, 64240, payload)
            seqs[client][1] = g + len(payload) + (1 if flags & (SYN | FIN) else 0)
        w.event(net, direction, ns, frame, icount=ns)

    w.event(rng, "in", 1, b"\x42" * 16, icount=1)
    w.event(ser, "in", 5, b"ls\n", icount=5)
    w.event(ser, "out", 7, b"TANDEM-RE", icount=7)
    w.event(ser, "out", 8, b"ADY\n", icount=8)
    seg(A, "in", 10, SYN)
    seg(A, "out", 11, SYN | ACK)
    seg(A, "in", 12, ACK)
    seg(A, "in", 20, ACK | PSH, b"SET a 1\n")
    seg(B, "in", 25, SYN)
    seg(B, "out", 25, SYN | ACK)
    seg(B, "in", 26, ACK | PSH, b"GET a\n")
    seg(B, "in", 28, ACK | PSH, b"GET b\n")
    seg(A, "out", 30, ACK | PSH, b"OK\n")
    seg(A, "in", 40, ACK | PSH, b"GET a\n")
    seg(B, "out", 45, ACK | PSH, b"VALUE 1\nNOTFOUND\n")
    seg(A, "out", 50, ACK | PSH, b"VALUE 1\n")
    seg(A, "in", 60, ACK | FIN)
    seg(B, "in", 70, RST)
    w.close(end_vm_ns=100)


def test_requests_sizes_and_concurrency(tmp_path):
    write_devlog(tmp_path / "d.pcapng")
    w = measure(from_events(pcapng.iter_events(tmp_path / "d.pcapng"), end_ns=100))
    got = [(r.flow, r.start_ns, r.end_ns, r.events, r.bytes) for r in w.requests]
    assert got == [(0, 10, 30, 2, 8), (1, 25, 45, 4, 12), (0, 40, 50, 2, 6)]
    assert w.flows == 2 and w.peak_concurrency == 2      # A's first with B's, B's with A's second
    assert (w.background_events, w.background_bytes, w.entropy_events) == (1, 3, 1)
    assert w.ready_ns == 8 and "TANDEM-READY" in w.ready_source
    assert w.per_request("mean") == (pytest.approx(8 / 3), pytest.approx(26 / 3))
    assert w.per_request("max") == (4, 12)


@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 300)), max_size=30))
def test_shared_time_counts_the_natives_busy_time_once(spans):
    requests = [Request(0, a, a + n) for a, n in spans]
    _share_time(requests)
    busy, until = 0, -1
    for a, b in sorted((r.start_ns, r.end_ns) for r in requests):   # the union of the spans
        busy += max(0, b - max(a, until))
        until = max(until, b)
    assert sum(r.work_ns for r in requests) == pytest.approx(busy)
    assert all(r.work_ns <= r.end_ns - r.start_ns + 1e-9 for r in requests)


def test_concurrent_clients_are_not_counted_once_each():
    # 4 clients whose requests all span [0, 40]: the native worked 40, not 160. At F 3
    # the analysis is done by 120, before the next request @130 starts a new period.
    requests = [Request(c, 0, 40) for c in range(4)] + [Request(0, 130, 140)]
    _share_time(requests)
    assert [r.work_ns for r in requests] == [10, 10, 10, 10, 10]
    w = measure(RecordedInputs([], [], 200, []))
    w.requests = requests
    assert w.busy_period_requests(3) == 4


def test_busy_periods_and_boot_backlog(tmp_path):
    write_devlog(tmp_path / "d.pcapng")
    w = measure(from_events(pcapng.iter_events(tmp_path / "d.pcapng"), end_ns=100))
    # The native's time per request, shared where requests overlap: A1 [10, 30] alone
    # for 15 and with B1 for 5, B1 [25, 45] with A1 for 5, alone for 10 and with A2 for
    # 5, A2 [40, 50] with B1 for 5 and alone for 5. Together: [10, 50], counted once.
    assert [r.work_ns for r in w.requests] == [17.5, 15, 7.5]
    # F 3: A1 @10 costs 3*17.5, done @62.5; B1 @25 waits, done @107.5; A2 @40 waits: one period of 3.
    assert w.busy_period_requests(3) == 3
    # F 1.5: A1 done @36.25; B1 @25 done @58.75; A2 @40 < 58.75 still in it: 3.
    assert w.busy_period_requests(1.5) == 3
    # F 0.5: A1 done @18.75 < B1 @25, done @32.5 < A2 @40: every request finds it idle.
    assert w.busy_period_requests(0.5) == 1
    # Booted at 8: an analysis 3x slower is ready at 24, after the serial line @5, A's
    # open @10 and A's 8 bytes @20; 1.5x: at 12, after the serial line and the open.
    assert w.boot_backlog(3) == (3, 11)
    assert w.boot_backlog(1.5) == (2, 3)
    assert w.boot_backlog(0.5) == (0, 0)


@pytest.fixture
def recorded(tmp_path):
    d = bundle.new_bundle(tmp_path / "n.tdm")
    write_devlog(d / bundle.DEVLOG)
    m = bundle.Manifest.new().to_json()
    m.update(state="complete", wall_time_s=2.0, stop={"reason": "poweroff", "vm_ns": 100, "icount": 100})
    m["files"] = {bundle.DEVLOG: bundle.file_entry(d / bundle.DEVLOG).to_json()}
    bundle.write_manifest(d, m)
    return d


def test_plan_by_hand(recorded):
    # S_req = 8/3 inputs, 26/3 bytes; F 3 -> N_T 3 (measured):
    # events 3*8/3 - 3/3*8/3 + 8/3 = 8; bytes 3*26/3 - 26/3 + 26/3 = 26; boot backlog 3, 11
    p = plan(recorded, slowdown=3)
    (b,) = p.buffers
    assert (b["n_t"], b["equation"], b["boot_backlog"]["events"], b["boot_backlog"]["bytes"]) == (
        3, {"events": 8, "bytes": 26}, 3, 11)
    assert (p.events, p.bytes) == (11, 37)
    assert plan(recorded, slowdown=3, boot=False).events == 8
    # The largest request (S_req 4 inputs, 12 bytes): 12 - 4 + 4 = 12; 36 - 12 + 12 = 36; + boot
    p = plan(recorded, slowdown=3, stat="max")
    assert (p.events, p.bytes) == (12 + 3, 36 + 11)
    # N_T 4 given, F 1.5: 4*8/3*(1 - 1/1.5) + 8/3 = 56/9 -> 7; 4*26/3/3 + 26/3 = 182/9 -> 21;
    # boot backlog at 1.5: 2 inputs, 3 bytes
    p = plan(recorded, slowdown=1.5, concurrency=4)
    assert (p.buffers[0]["n_t"], p.events, p.bytes) == (4, 7 + 2, 21 + 3)
    # F 0.5: N_T 1, no slower than the native: one request, 8/3 -> 3 and 26/3 -> 9
    p = plan(recorded, slowdown=0.5)
    assert (p.buffers[0]["n_t"], p.events, p.bytes) == (1, 3, 9)


def test_slowdown_from_a_semantic_replay(recorded, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "summary.json").write_text(json.dumps({"bundle": str(recorded), "analyses": [
        {"analysis": "kasan", "outcome": "poweroff", "wall_s": 6.0, "end_vm_ns": 5_000_000_000},
        {"analysis": "ubsan", "outcome": "finished", "wall_s": 3.0, "end_vm_ns": 200}]}))
    p = plan(recorded, from_workdir=work)
    # kasan F = 6.0 / 2.0 = 3 -> 11, 37 as above. ubsan F = 1.5, N_T 3:
    # 3*8/3/3 + 8/3 = 16/3 -> 6; 3*26/3/3 + 26/3 = 52/3 -> 18; boot 2, 3. The larger is kept.
    assert [(b["analysis"], b["f"], b["events"], b["bytes"]) for b in p.buffers] == [
        ("kasan", 3.0, 11, 37), ("ubsan", 1.5, 8, 21)]
    assert (p.events, p.bytes) == (11, 37)
    assert plan(recorded, from_workdir=work, analysis="ubsan").events == 8
    with pytest.raises(TandemError, match="no analysis 'lockdep'"):
        plan(recorded, from_workdir=work, analysis="lockdep")


def test_slowdown_over_the_native_kernels_replay(recorded, tmp_path):
    """With the native kernel replayed alongside, it is the base: the same replay, the
    same idle skipping. kasan 6.0s over native 4.0s: F 1.5 (not 6.0 / 2.0 = 3)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "summary.json").write_text(json.dumps({"bundle": str(recorded), "analyses": [
        {"analysis": "native", "outcome": "poweroff", "wall_s": 4.0},
        {"analysis": "kasan", "outcome": "poweroff", "wall_s": 6.0},
        {"analysis": "lockdep", "outcome": "crashed", "wall_s": 1.0}]}))
    p = plan(recorded, from_workdir=work, analysis="kasan")
    assert (p.buffers[0]["f"], p.events, p.bytes) == (1.5, 8, 21)      # as ubsan above
    assert "native kernel" in p.slowdowns[0].base
    with pytest.raises(TandemError, match="'lockdep' did not finish"):
        plan(recorded, from_workdir=work)
    assert plan(recorded, from_workdir=work, analysis="native").buffers[0]["f"] == 2.0   # over the recording


def test_cli(recorded):
    r = run_cli("plan", str(recorded), "--slowdown", "3", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["events"], out["bytes"], out["n_sys"]) == (11, 37, 1)
    assert out["workload"]["requests"] == 3 and out["buffers"][0]["n_t"] == 3
    assert "S_req" in r.stderr and "buffer needed: 11 inputs, 37 bytes" in r.stderr
    r = run_cli("plan", str(recorded), "--slowdown", "3", "--no-boot", "--concurrency", "2", "--json")
    # 2*8/3*2/3 + 8/3 = 56/9 -> 7; 2*26/3*2/3 + 26/3 = 182/9 -> 21
    assert (json.loads(r.stdout)["events"], json.loads(r.stdout)["bytes"]) == (7, 21)
    assert_one_line_error(run_cli("plan", str(recorded)), "--slowdown")
    assert_one_line_error(run_cli("plan", str(recorded), "--slowdown", "-1"), "--slowdown")
    assert_one_line_error(run_cli("plan", str(recorded), "--from", str(recorded / "nope")), "summary.json")


def test_a_reply_at_the_next_requests_vm_time_came_before_it():
    """VM time may not move between the guest's reply and the client's next line (an
    idle guest under icount): they are still two requests."""
    rec = RecordedInputs([Input("tcp-open", 10, flow=0), Input("tcp-data", 20, b"a\n", flow=0),
                     Input("tcp-data", 30, b"b\n", flow=0)],
                    [Flow(0, A, GUEST, CMAC, GMAC, 10, guest_data=[(30, b"x\n"), (40, b"y\n")])], 100, [])
    w = measure(rec)
    assert [(r.start_ns, r.end_ns, r.events) for r in w.requests] == [(10, 30, 2), (30, 40, 1)]


def test_a_backends_answers_are_no_requests():
    """What the guest's own backend connection brings in is part of the client's request
    that made the guest ask (a proxy): buffered, outside any request."""
    rec = RecordedInputs([Input("tcp-open", 10, flow=0), Input("tcp-data", 20, b"GET /\n", flow=0),
                          Input("tcp-data", 25, b"backend says\n", flow=1), Input("tcp-fin", 26, flow=1)],
                         [Flow(0, A, GUEST, CMAC, GMAC, 10, guest_data=[(30, b"x\n")]),
                          Flow(1, A, GUEST, CMAC, GMAC, 21, guest_data=[(22, b"GET /b\n")], guest_opened=True)],
                         100, [])
    w = measure(rec)
    assert [(r.flow, r.start_ns, r.end_ns, r.events) for r in w.requests] == [(0, 10, 30, 2)]
    assert (w.background_events, w.background_bytes, len(w.buffered)) == (2, 13, 4)
