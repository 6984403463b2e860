"""The parts of the semantic replay's loop, each on its own (semantic/driving/inbox.py,
dependencies.py, network/remote.py): what the run takes and delivers, what an input waits
for and for how long, what the network side sends and keeps. test_driver.py runs them
together against a scripted feed."""
from __future__ import annotations

from tandem.formats import netpkt
from tandem.semantic.driving.dependencies import Dependencies
from tandem.semantic.driving.driver import AnalysisDriver, DriveOptions
from tandem.semantic.driving.inbox import TRIM_AT, Inbox
from tandem.semantic.inputs import Flow, Input, RecordedInputs
from tandem.semantic.model import DEP_TIMEOUT_NS, SETTLE_NS, AnalysisRun, Buffer
from tandem.semantic.network.exchanges import Exchange
from tandem.semantic.network.peer import TcpState
from tandem.semantic.network.remote import Remote

from scripted_feed import Clock, ScriptedFeed, ScriptedVM, wait

MS = 1_000_000
CLIENT, GUEST = (b"\x0a\x00\x02\x02", 40000), (b"\x0a\x00\x02\x0f", 7000)


def flow(index: int, answer: str | None = "accepted", guest_opened: bool = False) -> Flow:
    return Flow(index, (CLIENT[0], CLIENT[1] + index), GUEST, b"\x52" * 6, b"\x54" * 6, 0, answer=answer,
                guest_opened=guest_opened)


def data(ns: int, index: int, text: bytes = b"GET\n", **kw) -> Input:
    return Input("tcp-data", ns, text, flow=index, **kw)


# -- the inbox ----------------------------------------------------------------------------------

def test_entropy_is_delivered_when_taken_and_other_inputs_wait_in_order():
    ex = Exchange(0, ("ntp",), 1, b"q", (CLIENT[0], 123))
    rec = RecordedInputs([Input("rng", 5, b"\x01"), data(1 * MS, 0), Input("serial", 2 * MS, b"x\n")],
                         [flow(0)], None, [], exchanges=[ex])
    res, buffer = AnalysisRun("a"), Buffer()
    box = Inbox(rec, res, buffer)
    taken = box.take()
    assert [i.kind for i in taken.entropy] == ["rng"] and taken.exchanges == [ex] and taken.flows == rec.flows
    assert res.n_delivered == 1 and res.taken == 3 and box.left() == 2 and box.pending_bytes == 6
    assert buffer.pending(rec.made()) == box.pending() == 2         # the native's side reads the same fill
    assert res.undelivered == {0: 1} and res.waits_on(0, rec) and not res.waits_on(1, rec)
    assert box.take() == type(taken)([], [], [])        # nothing new
    assert box.due(1 * MS - 1) is None and box.due(1 * MS) is rec.inputs[1]
    box.delivered(1 * MS, rec.inputs[1])
    assert res.undelivered == {} and not res.waits_on(0, rec) and box.last_ns == 1 * MS
    assert buffer.delivered == 2 and buffer.pending(rec.made()) == 1
    assert (box.count(), box.total(), box.left()) == (1, 2, 1)
    assert box.next_undelivered().startswith("serial at VM 0.002000s")


def test_an_input_not_taken_yet_is_pending_and_waits():
    """A live recording grows after the last take: the buffer's fill and waits_on count
    what the loop has not taken yet."""
    rec = RecordedInputs([data(1 * MS, 0)], [flow(0)], None, [], finished=False)
    res = AnalysisRun("a")
    box = Inbox(rec, res, Buffer())
    box.take()
    with rec.lock:
        rec.inputs.append(data(3 * MS, 1, b"late"))
    assert box.pending() == 2 == box.buffer.pending(rec.made()) and box.not_taken() == 1 and res.waits_on(1, rec)
    box.delivered(1 * MS, box.next())
    assert box.oldest_pending_ns() == 3 * MS and box.next_undelivered().startswith("tcp-data at VM 0.003000s")


def test_delivered_inputs_are_dropped_from_the_front():
    inputs = [Input("serial", i, b"x") for i in range(2 * TRIM_AT)]
    box = Inbox(RecordedInputs(inputs, [], None, []), AnalysisRun("a"), Buffer())
    box.take()
    for _ in range(TRIM_AT + 1):
        box.delivered(0, box.next())
    box.trim()
    assert (box.trimmed, box.nxt, len(box.todo)) == (TRIM_AT + 1, 0, TRIM_AT - 1)
    assert (box.count(), box.total()) == (TRIM_AT + 1, 2 * TRIM_AT) and box.next() is inputs[TRIM_AT + 1]


# -- what an input waits for ----------------------------------------------------------------------

def deps(rec: RecordedInputs, line_deps: bool = True) -> Dependencies:
    return Dependencies(rec, Remote(rec, []), line_deps)


def established(d: Dependencies, index: int, guest_bytes: int = 0):
    fl = d.rec.flows[index]
    d.remote.peer.open(index, fl.client, fl.server, fl.client_mac, fl.guest_mac, 0)
    pf = d.remote.peer.flows[index]
    pf.state, pf.guest_bytes = TcpState.ESTABLISHED, guest_bytes
    return pf


def test_an_input_waits_for_its_line_and_the_guests_bytes():
    rec = RecordedInputs([], [flow(0), flow(1)], None, [])
    d = deps(rec)
    inp = data(1 * MS, 1, needs_bytes={0: 10}, needs_line=(b"ready", 1))
    assert d.unmet(inp) == "serial line b'ready' (#1), flow 0: 0/10 guest bytes"
    d.lines.feed(b"ready\n")
    pf = established(d, 0, guest_bytes=9)
    assert not d.met(inp) and d.only_bytes(inp) and d.unmet(inp) == "flow 0: 9/10 guest bytes"
    pf.guest_bytes = 10
    assert d.met(inp)
    assert deps(rec, line_deps=False).line_missing(inp) is False        # a user's VM: no line waits


def test_a_retired_connection_is_waited_on_no_more():
    """Compared to its end by every analysis (None in the recording) and forgotten here:
    its bytes are met, whatever was needed; not yet forgotten here, they count."""
    rec = RecordedInputs([], [flow(0)], None, [])
    d = deps(rec)
    established(d, 0, guest_bytes=3)
    rec.flows[0] = None
    assert not d.retired(0) and not d.bytes_met(0, 5)
    d.remote.peer.forget(0)
    assert d.retired(0) and d.bytes_met(0, 1 << 40) and d.met(Input("serial", 0, b"x", needs_bytes={0: 5}))


def test_a_connection_forgotten_here_is_waited_on_no_more_before_the_recording_retires_it():
    """Compared to its end by this analysis (Remote.forget) while the recording keeps it
    (another analysis needs it, or the next trim is to come): its bytes do not count as
    none; once the recording retires it, it leaves `forgotten`."""
    rec = RecordedInputs([], [flow(0), flow(1)], None, [])
    d = deps(rec)
    established(d, 0, guest_bytes=5)
    established(d, 1)
    inp = Input("serial", 0, b"x", needs_bytes={0: 5})
    assert d.met(inp)
    d.remote.forget([0])
    assert d.have(0) == 0 and d.retired(0) and d.met(inp)
    rec.flows[0] = None
    d.remote.forget([1])
    assert d.remote.forgotten == {1} and d.retired(0) and d.met(inp)


def test_the_wait_times_out_after_the_guests_last_output():
    rec = RecordedInputs([], [flow(0)], None, [])
    d = deps(rec)
    inp = data(1 * MS, 0, needs_bytes={0: 4})
    d.waiting(1 * MS, inp)
    d.waiting(2 * MS, inp)                          # waiting already: from the first
    assert d.blocked_since == 1 * MS and not d.waited_out(1 * MS + DEP_TIMEOUT_NS - 1)
    d.last_output_ns = 3 * MS                       # the guest is still working
    assert not d.waited_out(1 * MS + DEP_TIMEOUT_NS) and d.waited_out(3 * MS + DEP_TIMEOUT_NS)
    d.went(4 * MS, met=False)
    assert d.blocked_since is None and d.met_ns == 0


def test_the_wait_starts_again_while_the_connection_is_opening():
    """A guest still bringing its network up: the peer's SYN is unanswered, so the input
    waiting on that connection's bytes is not timed out from its first wait."""
    rec = RecordedInputs([], [flow(0)], None, [])
    d = deps(rec)
    fl = rec.flows[0]
    d.remote.peer.open(0, fl.client, fl.server, fl.client_mac, fl.guest_mac, 0)
    inp = data(1 * MS, 0, needs_bytes={0: 4})
    d.waiting(1 * MS, inp)
    d.waiting(7 * MS, inp)
    assert d.starting(inp) and d.blocked_since == 7 * MS


def test_giving_up_is_a_limit_and_is_not_waited_for_again():
    back = flow(1, guest_opened=True)
    rec = RecordedInputs([], [flow(0), back], None, [])
    d = deps(rec)
    d.remote.take([], rec.flows)
    established(d, 0, guest_bytes=2)
    inp = data(5 * MS, 1, b"reply", needs_bytes={0: 6}, needs_line=(b"ok", 2))
    d.lines.feed(b"ok\n")
    assert d.unopened(inp)
    line = d.give_up(inp)
    assert line.endswith(": sent after waiting 5s of VM time for serial line b'ok' (#2), the guest to open its "
                         "connection (flow 1), flow 0: 2/6 guest bytes")
    assert d.short == {0: 4} and d.lost_lines == {b"ok"} and d.remote.given_up == {1}
    assert d.met(inp) and d.remote.connections.at_syn(back.client) == []    # nor matched later


def test_a_live_open_waits_for_the_natives_answer():
    rec = RecordedInputs([], [flow(0, answer=None)], None, [], finished=False)
    d = deps(rec)
    opening = Input("tcp-open", 1 * MS, flow=0)
    assert d.answer_unknown(opening) and not d.met(opening)
    assert d.give_up(opening).endswith(": not opened after waiting 5s of VM time for the native's answer to its SYN")
    rec.flows[0].answer = "refused"
    assert not d.answer_unknown(opening)


# -- the network side ----------------------------------------------------------------------------

def test_a_connection_the_native_refused_is_not_opened_and_its_inputs_send_nothing():
    rec = RecordedInputs([], [flow(0, answer="refused")], None, [])
    remote = Remote(rec, [])
    assert remote.release(Input("tcp-open", 1, flow=0), 1) == [] and remote.out.not_opened == {0}
    assert remote.release(data(2, 0), 2) == [] and remote.peer.flows == {}
    remote.forget([0])
    assert remote.out.not_opened == set()


def test_what_the_peer_sends_waits_for_the_stop_with_its_retransmissions():
    rec = RecordedInputs([], [flow(0)], None, [])
    remote = Remote(rec, [])
    (syn,) = map(netpkt.parse, remote.release(Input("tcp-open", 1, flow=0), 1))
    assert syn.flags == netpkt.SYN and remote.out.flows == {0: remote.peer.flows[0].out}
    remote.outbox.append(b"queued")
    frames = remote.at_stop(1 + 200 * MS)               # the SYN again after the peer's RTO
    assert frames[0] == b"queued" and netpkt.parse(frames[1]).flags == netpkt.SYN and remote.outbox == []
    remote.forget([0])
    assert remote.out.flows == {} and remote.peer.flows == {}


# -- the loop with them ----------------------------------------------------------------------------

def test_connections_the_tick_is_done_with_are_forgotten():
    """A live comparison (LiveCompare.tick) says which connections it has compared to their
    end or never needs: the loop drops the peer's state and the run's record of them."""
    rec = RecordedInputs([Input("tcp-open", 1 * MS, flow=0), Input("tcp-open", 2 * MS, flow=1)],
                         [flow(0, answer="refused"), flow(1)], 2 * MS, [])
    seen: list[tuple[set, set]] = []

    def tick(run: AnalysisRun) -> set[int]:
        seen.append((set(run.net.flows), set(run.net.not_opened)))
        return set(run.net.flows) | run.net.not_opened

    def later(ns: int):
        def step(feed):
            feed.clock.now += 1.0           # a tick is due
            return [wait(ns)]
        return step
    clock, vm = Clock(), ScriptedVM()
    feed = ScriptedFeed([[wait(0)], [wait(1 * MS)], [wait(2 * MS)], later(2 * MS + 1), later(2 * MS + SETTLE_NS)],
                        vm, clock)
    res = AnalysisRun("scripted")
    d = AnalysisDriver(rec, res, vm, feed, DriveOptions(clock=clock, rules=False, tick=tick))
    d.drive()
    assert seen == [(set(), set()), ({1}, {0}), (set(), set())]     # at the start, then each second
    assert res.net.flows == {} and res.net.not_opened == set() and d.remote.peer.flows == {}
