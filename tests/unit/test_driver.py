"""The semantic replay's loop (semantic.driving.driver.AnalysisDriver) against a scripted feed and
VM, the way syzkaller tests its VM monitor loop (vm/vm_test.go, TestMonitorExecution):
each scenario is what QEMU says on the feed (WAIT, OUTPUT, SHUTDOWN, silence, exit) and
what the driver must answer (inputs, horizons) and conclude (outcome, detail, limits).
tests/test_semantic.py and tests/test_live.py run the same loop against real QEMU."""
from __future__ import annotations

import pytest
from tandem.formats import netpkt
from tandem.qemu.feed import RNG, SERIAL
from tandem.semantic.driving.driver import AnalysisDriver, DriveOptions
from tandem.semantic.inputs import Flow, Input, RecordedInputs
from tandem.semantic.model import (DEP_TIMEOUT_NS, HANG_WALL_S, LIVE_SLICE_NS, POWEROFF_WAIT_NS, SETTLE_NS,
                                   AnalysisRun, Buffer)

from scripted_feed import Clock, ScriptedFeed, ScriptedVM, console, shutdown, wait

MS = 1_000_000


def drive(rec: RecordedInputs, script, stop_when=None, **kw):
    """Run the driver over the script; stop_when(feed): end the run as tandem's stop() would.
    Every input goes at a stop (no release rules: the script plays no QEMU that fires
    them; test_rules.py does)."""
    kw.setdefault("rules", False)
    clock, vm = Clock(), ScriptedVM()
    feed = ScriptedFeed(script, vm, clock)
    if stop_when is not None:
        kw["stop"] = lambda: stop_when(feed)
    res = AnalysisRun("scripted")
    AnalysisDriver(rec, res, vm, feed, DriveOptions(clock=clock, **kw)).drive()
    return res, feed, vm


def serial_inputs(*at_ns: int, **kw) -> list[Input]:
    return [Input("serial", ns, b"x%d\n" % i, offset=i, **kw) for i, ns in enumerate(at_ns)]


def test_inputs_are_released_at_their_times_and_the_run_finishes():
    rec = RecordedInputs(serial_inputs(1 * MS, 2 * MS), [], 3 * MS, [])
    res, feed, vm = drive(rec, [[wait(0)], [wait(1 * MS)], [wait(2 * MS)], [wait(3 * MS + SETTLE_NS)]])
    assert feed.inputs == [(SERIAL, 1 * MS, b"x0\n"), (SERIAL, 2 * MS, b"x1\n")]
    # the next input's time, then after the last one the native's end plus the settling time
    assert [h for h, _ in feed.horizons] == [1 * MS, 2 * MS, 3 * MS + SETTLE_NS]
    assert vm.quit_asked and (res.outcome, res.detail) == ("finished", "")
    assert res.n_delivered == 2 and res.waits == 4 and res.end_ns == 3 * MS + SETTLE_NS


def test_a_native_powered_off_by_its_button_has_the_analysis_pressed_too():
    # A user's VM ended by its ACPI power button: after the last input and the settling
    # time the analysis guest's button is pressed, and it may take POWEROFF_WAIT_NS to
    # power off (its shutdown, a DHCP RELEASE among it, is compared as the native's was).
    rec = RecordedInputs(serial_inputs(1 * MS), [], 1 * MS, [], powered_off=True, power_button=True)
    end = 1 * MS + SETTLE_NS
    res, feed, vm = drive(rec, [[wait(0)], [wait(1 * MS)], [wait(end)], [wait(end + 5 * MS)],
                                [shutdown(end + 7 * MS, "guest-shutdown")], None])
    assert vm.pressed and not vm.quit_asked
    assert [h for h, _ in feed.horizons][-2:] == [end + POWEROFF_WAIT_NS] * 2
    assert res.outcome == "poweroff"
    # one that never powers off is quit at the bound
    res, feed, vm = drive(rec, [[wait(0)], [wait(1 * MS)], [wait(end)], [wait(end + POWEROFF_WAIT_NS)]])
    assert vm.pressed and vm.quit_asked and res.outcome == "finished"


def test_a_native_that_powered_off_gives_a_slower_analysis_time_to_power_off():
    # The native powered off on a typed command: a slower guest (an ASan userland) may
    # power off past the settling second; it is not quit there, nor pressed.
    rec = RecordedInputs(serial_inputs(1 * MS), [], 1 * MS, [], powered_off=True)
    end = 1 * MS + SETTLE_NS
    res, feed, vm = drive(rec, [[wait(0)], [wait(1 * MS)], [wait(end)], [wait(end + 300 * MS)],
                                [shutdown(end + 400 * MS, "guest-shutdown")], None])
    assert not vm.pressed and not vm.quit_asked and res.outcome == "poweroff"
    assert [h for h, _ in feed.horizons][-2:] == [end + POWEROFF_WAIT_NS] * 2
    # one that never powers off is quit at the bound
    res, feed, vm = drive(rec, [[wait(0)], [wait(1 * MS)], [wait(end)], [wait(end + POWEROFF_WAIT_NS)]])
    assert not vm.pressed and vm.quit_asked and res.outcome == "finished"


def test_entropy_goes_into_the_feed_at_once():
    rec = RecordedInputs([Input("rng", 5 * MS, b"\x01\x02")] + serial_inputs(1 * MS), [], 1 * MS, [])
    res, feed, _ = drive(rec, [[wait(0)]])
    assert feed.inputs[0] == (RNG, 0, b"\x01\x02")


def test_silence_is_a_hang_with_the_feed_state():
    rec = RecordedInputs(serial_inputs(1 * MS), [], 1 * MS, [])
    res, feed, vm = drive(rec, [[wait(0)]])
    assert res.outcome == "hung"
    assert f"QEMU silent for {HANG_WALL_S:.0f}s" in res.detail
    assert "QEMU state running, feed horizon=7" in res.detail
    assert not vm.killed            # run() kills it and keeps its log


def test_a_run_far_past_the_natives_end_is_lagging():
    rec = RecordedInputs(serial_inputs(1 * MS, 9_000 * MS), [], 10 * MS, [])
    res, _, vm = drive(rec, [[wait(0)], [wait(1 * MS)], [wait(12 * MS)]], max_lag_ns=1 * MS)
    assert res.outcome == "lagging" and vm.killed
    assert res.detail == ("0s of VM time past the native's end, no input has found the outputs it waits for "
                          "since VM 0.001s (1/2 inputs delivered)")


def test_a_slow_run_past_the_natives_end_that_still_answers_is_not_lagging():
    # Each input waits on the line the guest prints for the one before: a guest that
    # answers, slowly (a KASAN kernel under a heavy recording), goes on past the bound.
    inputs = [Input("serial", i * MS, b"x%d\n" % i, offset=i, needs_line=(b"ok", i) if i else None)
              for i in range(4)]
    rec = RecordedInputs(inputs, [], 4 * MS, [])
    script = [[wait(0)]] + [[console(k * 10 * MS, b"ok\n"), wait(k * 10 * MS)] for k in range(1, 4)]
    res, feed, vm = drive(rec, script + [lambda f: [wait(f.horizons[-1][0])]], max_lag_ns=2 * MS)
    assert res.outcome != "lagging", res.detail
    assert [i[2] for i in feed.inputs] == [b"x0\n", b"x1\n", b"x2\n", b"x3\n"]


def test_an_input_waits_for_its_line_then_is_sent_at_the_dependency_timeout():
    rec = RecordedInputs(serial_inputs(1 * MS, needs_line=(b"ready", 1)), [], 1 * MS, [])
    res, feed, _ = drive(rec, [[wait(1 * MS)], lambda f: [wait(f.horizons[-1][0])]])
    assert feed.horizons[0][0] == 1 * MS + DEP_TIMEOUT_NS       # blocked: wait at most the timeout
    assert feed.inputs == [(SERIAL, 1 * MS + DEP_TIMEOUT_NS, b"x0\n")]
    assert res.limits == ["serial at VM 0.001000s (serial offset 0, devlog event 0) \"x0\": sent after waiting "
                          "5s of VM time for serial line b'ready' (#1)"]


def test_an_input_goes_as_soon_as_the_guest_prints_its_line():
    rec = RecordedInputs(serial_inputs(1 * MS, needs_line=(b"ready", 1)), [], 1 * MS, [])
    res, feed, _ = drive(rec, [[wait(1 * MS)], [console(2 * MS, b"ready\n"), wait(2 * MS)]])
    assert feed.inputs == [(SERIAL, 2 * MS, b"x0\n")] and res.limits == []
    assert bytes(res.console) == b"ready\n" and res.console_times == [(0, 2 * MS)]


def test_an_output_pushes_the_dependency_timeout_back():
    flow = Flow(0, (b"\x0a\0\0\x02", 40000), (b"\x0a\0\0\x0f", 80), b"\x52" * 6, b"\x54" * 6, 0)
    rec = RecordedInputs(serial_inputs(1 * MS, needs_bytes={0: 5}), [flow], 1 * MS, [])
    # The guest prints at 3 ms on its way to the first horizon (1 ms + the timeout): still
    # working, so the input keeps waiting, now until 3 ms + the timeout.
    res, feed, _ = drive(rec, [[wait(1 * MS)], [console(3 * MS, b"working\n"), wait(1 * MS + DEP_TIMEOUT_NS)],
                               lambda f: [wait(f.horizons[-1][0])]])
    assert [h for h, _ in feed.horizons[:2]] == [1 * MS + DEP_TIMEOUT_NS, 3 * MS + DEP_TIMEOUT_NS]
    assert feed.inputs == [(SERIAL, 3 * MS + DEP_TIMEOUT_NS, b"x0\n")]
    assert res.limits[0].endswith("for flow 0: 0/5 guest bytes")


def test_waiting_on_a_silent_native_is_not_a_hang():
    rec = RecordedInputs(serial_inputs(1 * MS), [], None, [], known_ns=1 * MS, finished=False)
    res, feed, _ = drive(rec, [[wait(1 * MS, idle=True)], [wait(1 * MS, idle=True)]],
                         stop_when=lambda feed: feed.clock.now > 1000 + 3 * HANG_WALL_S)
    assert (res.outcome, res.detail) == ("detached", "stopped by tandem")


@pytest.mark.parametrize("cause, outcome, detail", [
    ("guest-shutdown", "poweroff", ""),
    ("guest-panic", "crashed", "the guest stopped with guest-panic (kernel panic or reboot)"),
    ("guest-reset", "crashed", "the guest stopped with guest-reset (kernel panic or reboot)"),
    ("host-signal", "crashed", "QEMU exited (host-signal): qemu: the log's tail"),
])
def test_why_qemu_stopped_is_the_outcome(cause, outcome, detail):
    rec = RecordedInputs(serial_inputs(1 * MS, 2 * MS), [], 2 * MS, [])
    res, _, _ = drive(rec, [[wait(1 * MS)], [shutdown(1 * MS + 5, cause)], None])
    assert (res.outcome, res.detail) == (outcome, "; ".join(filter(None, [detail, "1 of 2 inputs not delivered"])))
    assert res.end_ns == 1 * MS + 5


def test_qemu_gone_without_a_word():
    rec = RecordedInputs([], [], 0, [])
    res, _, _ = drive(rec, [None])
    assert (res.outcome, res.detail) == ("crashed", "QEMU exited (without saying why): qemu: the log's tail")


def test_stop_detaches():
    rec = RecordedInputs(serial_inputs(1 * MS), [], 1 * MS, [])
    res, _, vm = drive(rec, [[wait(0)]], stop=lambda: True)
    assert (res.outcome, res.detail) == ("detached", "stopped by tandem") and vm.killed


def test_a_live_analysis_over_its_buffer_is_detached():
    rec = RecordedInputs(serial_inputs(1 * MS, 2 * MS, 3 * MS), [], None, [], known_ns=3 * MS, finished=False)
    res, _, vm = drive(rec, [[wait(0)]], buffer=Buffer(max_events=2))
    assert res.outcome == "detached" and vm.killed
    assert res.detail.startswith("input buffer full (3 events, 9 bytes; bound 2 events")


def test_a_live_analysis_idles_until_the_native_gives_it_more():
    rec = RecordedInputs(serial_inputs(1 * MS), [], None, [], known_ns=1 * MS, finished=False)

    def native_makes_an_input(feed):
        with rec.lock:
            rec.inputs.append(Input("serial", 4 * MS, b"late\n", offset=1))
            rec.known_ns = 4 * MS
        return []

    res, feed, _ = drive(rec, [[wait(1 * MS, idle=True)], [wait(1 * MS, idle=True)], native_makes_an_input,
                               [wait(4 * MS)]], stop_when=lambda feed: len(feed.inputs) >= 2)
    assert feed.inputs == [(SERIAL, 1 * MS, b"x0\n"), (SERIAL, 4 * MS, b"late\n")]
    # Past the native only by the live slice, warp bound at the native's clock; idle with
    # nothing new (the second WAIT): no grant at all, until the native's next input.
    assert feed.horizons == [(1 * MS + LIVE_SLICE_NS, 1 * MS), (4 * MS, 4 * MS), (4 * MS + LIVE_SLICE_NS, 4 * MS)]
    assert res.outcome == "detached"


def test_a_yielding_live_analysis_is_granted_nothing_while_its_native_is_busy():
    """--analysis-priority yield (live/yielding.py): held, the VM stays at its stop, for
    longer than the hang bound without being called hung; once the native is calm the
    stop it was held at (not idle) is granted as it would have been."""
    rec = RecordedInputs(serial_inputs(1 * MS, 2 * MS), [], None, [], known_ns=2 * MS, finished=False)
    busy = [True]

    def a_while(feed):      # receive() waits 50 ms while held: here longer, and no word from QEMU
        feed.clock.now += 0.75 * HANG_WALL_S
        return []

    def native_calms(feed):
        assert feed.horizons == [] and feed.inputs == []
        busy[0] = False
        return []

    res, feed, _ = drive(rec, [[wait(0)], a_while, a_while, a_while, native_calms, [wait(1 * MS)], [wait(2 * MS)]],
                         hold=lambda: busy[0], stop_when=lambda feed: len(feed.inputs) >= 2)
    assert feed.horizons[0] == (1 * MS, 2 * MS)
    assert feed.inputs == [(SERIAL, 1 * MS, b"x0\n"), (SERIAL, 2 * MS, b"x1\n")]
    assert (res.outcome, res.detail) == ("detached", "stopped by tandem")


def test_a_yielding_analysis_silent_while_held_is_not_hung():
    """Held, its QEMU is stopped (live/yielding.py) between two stops: no word from it for
    longer than the hang bound is not a hang; the same silence unheld is."""
    rec = RecordedInputs(serial_inputs(1 * MS), [], None, [], known_ns=1 * MS, finished=False)

    def a_while(feed):
        feed.clock.now += 0.75 * HANG_WALL_S
        return []

    first = iter([False])       # the first stop granted, then held
    res, feed, _ = drive(rec, [[wait(0)], a_while, a_while, a_while, [wait(1 * MS)]], hold=lambda: next(first, True),
                         stop_when=lambda feed: len(feed.inputs) >= 1)
    assert feed.horizons == [(1 * MS, 1 * MS)]
    assert (res.outcome, feed.inputs) == ("detached", [(SERIAL, 1 * MS, b"x0\n")])
    res, _, _ = drive(rec, [[wait(0)], a_while, a_while, a_while, [wait(1 * MS)]], hold=lambda: False)
    assert res.outcome == "hung"


def flow(index: int, answer: str | None) -> Flow:
    return Flow(index, (b"\x0a\x00\x02\x02", 40000 + index), (b"\x0a\x00\x02\x0f", 7000), b"\x52" * 6, b"\x54" * 6,
                0, answer=answer)


def test_a_connection_the_native_refused_is_not_opened():
    """A probe the native refused (its service not listening yet) opened here could be
    accepted: an extra connection, numbered before the native's next one."""
    rec = RecordedInputs([Input("tcp-open", 1 * MS, flow=0), Input("tcp-open", 2 * MS, flow=1)],
                         [flow(0, "refused"), flow(1, "accepted")], 2 * MS, [])
    res, feed, _ = drive(rec, [[wait(0)], [wait(1 * MS)], [wait(2 * MS)], [wait(2 * MS + SETTLE_NS)]])
    # flow 1's SYN (and its retransmission, nothing answers here), none of flow 0's
    assert feed.inputs[0][1] == 2 * MS and {netpkt.parse(d).sport for _, _, d in feed.inputs} == {40001}
    assert res.n_delivered == 2 and res.net is not None and set(res.net.flows) == {1}


def test_a_connection_whose_syn_the_native_never_answered_is_not_opened():
    """The native's guest never answered its SYN (no address yet, and the client gave up):
    opened here, a guest a little further in its boot would serve it (under load: a whole
    index page of extra output)."""
    rec = RecordedInputs([Input("tcp-open", 1 * MS, flow=0), Input("tcp-open", 2 * MS, flow=1)],
                         [flow(0, None), flow(1, "accepted")], 2 * MS, [])
    res, feed, _ = drive(rec, [[wait(0)], [wait(1 * MS)], [wait(2 * MS)], [wait(2 * MS + SETTLE_NS)]])
    assert {netpkt.parse(d).sport for _, _, d in feed.inputs} == {40001}
    assert res.net is not None and set(res.net.flows) == {1} and 0 in res.net.not_opened


def test_a_live_open_waits_for_the_natives_answer_to_its_syn():
    rec = RecordedInputs([Input("tcp-open", 1 * MS, flow=0)], [flow(0, None)], None, [],
                         known_ns=1 * MS, finished=False)

    def native_answers(feed):
        rec.flows[0].answer = "accepted"
        rec.known_ns = 2 * MS
        return [wait(1 * MS + LIVE_SLICE_NS)]

    res, feed, _ = drive(rec, [[wait(1 * MS)], native_answers], stop_when=lambda feed: len(feed.inputs) >= 1)
    assert [ns for _, ns, _ in feed.inputs] == [1 * MS + LIVE_SLICE_NS]


def test_a_live_open_does_not_run_ahead_of_the_native_while_its_answer_is_unknown():
    """Waiting on the native's answer to a SYN is waiting on the native, not on this
    guest: an idle analysis VM is held at the native's clock, not run DEP_TIMEOUT_NS ahead
    of it to give the connection up (an idle guest's 5 s of VM time can take less wall
    time than the native's log takes to show its SYN-ACK; every request of the run then
    goes after a dependency timeout)."""
    rec = RecordedInputs([Input("tcp-open", 1 * MS, flow=0)], [flow(0, None)], None, [],
                         known_ns=1 * MS, finished=False, native_live=True)

    def idle_at_horizon(feed):
        return [wait(feed.horizons[-1][0] if feed.horizons else 1 * MS, idle=True)]

    def native_answers(feed):
        rec.flows[0].answer = "accepted"
        rec.known_ns = 2 * MS
        return idle_at_horizon(feed)

    res, feed, _ = drive(rec, [idle_at_horizon] * 200 + [native_answers] + [idle_at_horizon] * 3,
                         stop_when=lambda feed: len(feed.inputs) >= 1 or not feed.script)
    assert max(h for h, _ in feed.horizons) <= 2 * MS + LIVE_SLICE_NS
    assert res.limits == [] and feed.inputs and feed.inputs[0][1] < 2 * MS + LIVE_SLICE_NS
