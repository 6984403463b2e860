"""The loop of one analysis VM's semantic replay: what it takes from the recording, what
it releases at each stop of the VM, the horizon it grants, and how the run ends.

The VM stops at each horizon and says so on the feed (WAIT); between stops it sends its
outputs (OUTPUT: frames and console bytes) and, once, why it ends (SHUTDOWN). At each
stop the driver takes what the native has made (inbox.py), releases the inputs whose
recorded VM time has come and whose dependencies the guest has met (dependencies.py),
has the network side answer the guest (network/remote.py: the remote TCP peer, the
recorded UDP answers, the guest's own connections matched to the recording's), and
grants the next horizon (horizon.py, pure). Inputs after those that wait only on the
guest's TCP output go to QEMU ahead as release rules (network/rules.py), which QEMU
fires itself with no stop (FIRED). A live run (rec.finished False) trails a native
still running: it takes new inputs as they come, within its buffer's bound
(model.Buffer).

Each concern is an object of its own with its state, and the loop's stages are this
object's methods, so the loop is tested against a scripted feed and VM
(tests/unit/test_driver.py: hang, lag, detach, dependency timeout, shutdown causes), the
way syzkaller tests its VM monitor loop; tests/test_semantic.py and tests/test_live.py
run it against real QEMU.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ...qemu.feed import FIRED, FeedConnection, Message, NET, OUTPUT, RNG, SERIAL, SHUTDOWN, SHUTDOWN_CAUSES, WAIT, WAIT_IDLE
from ..inputs import Input, InputKind, RecordedInputs
from ..model import HANG_WALL_S, MAX_LAG_NS, POWEROFF_WAIT_NS, TICK_S, AnalysisRun, Buffer, Outcome
from ..network.remote import Remote
from ..network.rules import Rules
from .dependencies import Dependencies
from ...qemu.vm import AnalysisVM
from .horizon import live_grant, next_horizon
from .inbox import Inbox

log = logging.getLogger(__name__)

# How often the run samples its QEMU's CPU time (procfs), in wall seconds.
CPU_SAMPLE_S = 0.2
# Why QEMU said it stopped (feed SHUTDOWN cause) -> the run's outcome and detail.
SHUTDOWN_OUTCOMES = {
    "guest-shutdown": (Outcome.POWEROFF, ""),
    "host-qmp-quit": (Outcome.FINISHED, ""),
    "guest-reset": (Outcome.CRASHED, "the guest stopped with guest-reset (kernel panic or reboot)"),
    "guest-panic": (Outcome.CRASHED, "the guest stopped with guest-panic (kernel panic or reboot)"),
}


@dataclass(frozen=True)
class DriveOptions:
    """How one run is driven, apart from what it drives (the recording, QEMU, its feed)."""
    max_lag_ns: int = MAX_LAG_NS        # past the native's end, without progress this long: lagging
    hang_wall_s: float = HANG_WALL_S    # no word from QEMU for this long: hung
    line_deps: bool = True              # inputs wait for console lines (Dependencies)
    rules: bool = True                  # inputs go to QEMU ahead as release rules where they can
    buffer: Buffer | None = None        # a live run's bound on inputs not delivered (default Buffer())
    progress: Callable[[AnalysisRun, int, int], None] | None = None    # at each stop: (run, delivered, taken)
    stop: Callable[[], bool] | None = None      # True: end the run now (detached)
    # True: grant no new horizon now (a live run's --analysis-priority yield: the native is busy)
    hold: Callable[[], bool] | None = None
    # Every TICK_S (a live comparison): the connections it is done with, which are forgotten.
    tick: Callable[[AnalysisRun], Iterable[int] | None] | None = None
    clock: Callable[[], float] = time.monotonic     # wall seconds (a scripted test passes its own)


class AnalysisDriver:
    """Drive one analysis VM through a recording's inputs; drive() returns when the run
    has ended, its outcome and detail in `res`.

    vm, feed: the analysis VM's QEMU and its feed (the Protocols qemu.vm.AnalysisVM and
    qemu.feed.FeedConnection).
    """

    def __init__(self, rec: RecordedInputs, res: AnalysisRun, vm: AnalysisVM, feed: FeedConnection,
                 options: DriveOptions | None = None):
        self.rec, self.res, self.vm, self.feed = rec, res, vm, feed
        self.opts = options = options or DriveOptions()
        self.buffer = options.buffer or Buffer()
        self.inbox = Inbox(rec, res, self.buffer)
        self.remote = Remote(rec, res.limits)
        res.net = self.remote.out
        self.deps = Dependencies(rec, self.remote, options.line_deps)
        self.rules = Rules(feed, options.rules)
        self.clock = options.clock
        self.stalled_at: int | None = None  # live: at a WAIT, waiting on the native (its input, or its CPU)
        self.stalled_idle = True            # ... and idle there
        self.warp_granted_ns = 0        # live: the last warp bound granted
        self.settled_at: int | None = None   # VM time the run settled after a native that powered off
        self.last_word = self.clock()   # wall time QEMU last said anything
        self.shutdown: str | None = None    # the first SHUTDOWN's cause
        self.ended = False              # the run ended inside the loop (lag, detach, hang)
        self.cpu_at = self.tick_at = float("-inf")

    # -- the loop ---------------------------------------------------------------------------
    def drive(self) -> None:
        self.take()     # from here the inbox keeps buffer.delivered up to date, for the native's side
        while not self.ended:
            self.sample()
            if self.stopped() or self.overflowed():
                return
            if self.stalled_at is not None:
                if self.grant(self.stalled_at, self.stalled_idle):
                    self.stalled_at = None
                self.last_word = self.clock()    # waiting on the native, not on QEMU
            msgs = self.feed.receive(0.05 if self.stalled_at is not None else 1.0)
            if msgs is None:                    # QEMU exited
                self.finish()
                return
            if not msgs:
                self.check_hang()
                continue
            self.last_word = self.clock()
            for m in msgs:
                self.on_message(m)
                if self.ended:
                    return
            self.feed.flush()

    def sample(self) -> None:
        """CPU time every CPU_SAMPLE_S; the run's tick every TICK_S."""
        now = self.clock()
        if now - self.cpu_at > CPU_SAMPLE_S:
            self.res.cpu_s, self.cpu_at = self.vm.cpu_seconds() or self.res.cpu_s, now
        if self.opts.tick is not None and now - self.tick_at > TICK_S:
            self.remote.forget(self.opts.tick(self.res) or ())
            self.tick_at = self.clock()

    def on_message(self, m: Message) -> None:
        if m.type == OUTPUT:
            self.deps.last_output_ns = m.vm_ns
        if m.type == SHUTDOWN:
            self.on_shutdown(m)
        elif m.type == OUTPUT and m.channel == NET:
            if self.res.net_out is not None:
                self.res.net_out.append((m.vm_ns, m.data))
            self.remote.on_frame(m.data, m.vm_ns)
        elif m.type == OUTPUT and m.channel == SERIAL:
            res = self.res
            res.console_times.append((res.console_base + len(res.console), m.vm_ns))
            res.console += m.data
            self.deps.lines.feed(m.data)
        elif m.type == WAIT:
            self.on_wait(m.vm_ns, m.channel == WAIT_IDLE)
        elif m.type == FIRED:
            self.on_fired(m.vm_ns, m.data)

    def on_shutdown(self, m: Message) -> None:
        """The first SHUTDOWN says why: a QEMU under libvirt (-no-shutdown) pauses at a
        guest poweroff and then says SHUTDOWN again for libvirt's SIGTERM."""
        if self.shutdown is None:
            c = SHUTDOWN_CAUSES
            self.shutdown = c[m.channel] if m.channel < len(c) else f"cause {m.channel}"
            self.res.end_ns = m.vm_ns

    def on_wait(self, now: int, idle: bool) -> None:
        res = self.res
        res.end_ns = now
        res.waits += 1
        if not self.grant(now, idle):     # first: what the outputs up to now let go is progress
            self.stalled_at, self.stalled_idle = now, idle
        if self.lagging(now):
            self.end(Outcome.LAGGING, f"{self.opts.max_lag_ns / 1e9:.0f}s of VM time past the native's end, "
                     f"no input has found the outputs it waits for since VM {self.deps.met_ns / 1e9:.3f}s "
                     f"({self.inbox.count()}/{self.inbox.total()} inputs delivered)")
            return
        if self.opts.progress:
            self.opts.progress(res, self.inbox.count(), self.inbox.total())

    def on_fired(self, now: int, acks: bytes) -> None:
        """QEMU delivered the oldest rule's segment at VM time `now`."""
        r = self.rules.fired(self.inbox.next())
        self.remote.peer.sent_by_rule(r.flow, r.inp.data, int.from_bytes(acks[:4], "little"), now)
        self.inbox.delivered(now, r.inp)
        self.res.rules_fired += 1
        self.deps.went(now, met=True)

    # -- a stop of the VM ---------------------------------------------------------------------
    def take(self) -> None:
        """Take what the native has made since: its inputs wait in the inbox, entropy goes
        into the feed at once (a pool the guest draws from in order), its UDP exchanges and
        the connections its guest opened go to the network side."""
        taken = self.inbox.take()
        self.remote.take(taken.exchanges, taken.flows)
        for i in taken.entropy:
            self.feed.input(RNG, 0, i.data)
        self.feed.flush()

    def grant(self, now: int, idle: bool) -> bool:
        """Release what is due at a stop and grant the next horizon; False while a live
        native has given this VM, idle, nothing new to do, or is busy and the run yields."""
        self.take()
        frames = self.remote.at_stop(now)
        self.rules.settle(now, self.deps)
        first = self.inbox.count()
        frames = self.release_due(now, frames)
        sent = bool(frames) or self.inbox.count() != first
        self.rules.renew(self.inbox.after(len(self.rules)), now, self.remote.peer, self.deps)
        self.inbox.trim()
        for fr in frames:
            self.feed.input(NET, now, fr)
        granted = self.grant_horizon(now, self.next_horizon(now), idle, sent)
        self.feed.flush()
        return granted

    def release_due(self, now: int, frames: list[bytes]) -> list[bytes]:
        """Deliver the inputs due at `now` whose dependencies are met (or that waited
        DEP_TIMEOUT_NS of VM time with no output: sent anyway, a replay limit), while no
        rule holds the next; the frames to send (after `frames`)."""
        while (inp := self.inbox.due(now)) is not None and not self.rules:
            met = self.deps.met(inp)
            if not met:
                self.deps.waiting(now, inp)
                if not self.deps.waited_out(now):
                    break
                self.res.limits.append(self.deps.give_up(inp))
            self.deps.went(now, met)
            frames += self.release(inp, now)
            self.inbox.delivered(now, inp)
        return frames + self.remote.peer.delayed_acks(now)     # those the inputs did not carry

    def release(self, inp: Input, now: int) -> list[bytes]:
        """Deliver one input at VM time `now`: console bytes straight into the feed; the
        frames to send for a network input."""
        if inp.kind == InputKind.SERIAL:
            self.feed.input(SERIAL, now, inp.data)
            return []
        return self.remote.release(inp, now)

    def next_horizon(self, now: int) -> int | None:
        """Where the VM may run to next (horizon.py), None when the replay is over."""
        due = self.inbox.next()
        horizon = next_horizon(now, due.vm_ns if due else None, self.deps.blocked_since, self.deps.last_output_ns,
                               self.remote.peer.next_timer(), self.rec.end_ns or 0, self.inbox.last_ns,
                               not self.rec.finished)
        return now + 1 if self.rules.dropping else horizon     # with every rule fired or dropped

    def grant_horizon(self, now: int, horizon: int | None, idle: bool, sent: bool) -> bool:
        """Say the horizon to QEMU (live: within the native's clock; past the last input:
        the power button, or quit)."""
        if not self.rec.finished:
            if self.opts.hold is not None and self.opts.hold():
                return False
            # Behind: an input is due and waits on this guest (not, when the native runs
            # now, on its answer to a SYN, which only the native's clock brings).
            due = self.inbox.next()
            behind = due is not None and due.vm_ns <= now and not (self.rec.native_live and self.deps.answer_unknown(due))
            g = live_grant(now, horizon, self.rec.known_ns, self.warp_granted_ns, behind=behind, idle=idle, sent=sent)
            if g is None:
                return False
            self.warp_granted_ns = self.rec.known_ns
            self.feed.horizon(g[0], warp_ns=g[1])
        elif horizon is None and self.rec.powered_off and self.settled_at is None:
            # The native powered off after its last input: so does this guest, slower
            # maybe (the demo's ASan userland powered off up to 0.97 s of VM time after
            # its native, 31 ms inside the settling second), or it is quit at
            # POWEROFF_WAIT_NS. A
            # native ended by its power button has this guest's pressed too: it then
            # shuts down as the native did (a DHCP RELEASE, services stopping).
            self.settled_at = now
            if self.rec.power_button:
                self.vm.powerdown()
            self.feed.horizon(now + POWEROFF_WAIT_NS)
        elif horizon is None and self.settled_at is not None and now < self.settled_at + POWEROFF_WAIT_NS:
            self.feed.horizon(self.settled_at + POWEROFF_WAIT_NS)
        elif horizon is None:
            self.vm.quit()           # reported back as SHUTDOWN host-qmp-quit
        else:
            self.feed.horizon(horizon)
        return True

    # -- how the run ends ---------------------------------------------------------------------
    def end(self, outcome: Outcome, detail: str, kill: bool = True) -> None:
        self.res.outcome, self.res.detail, self.ended = outcome, detail, True
        self.res.stopped_before = self.inbox.next_undelivered()
        if kill:
            self.vm.kill()

    def stopped(self) -> bool:
        if self.opts.stop is not None and self.opts.stop():
            self.end(Outcome.DETACHED, "stopped by tandem")
        return self.ended

    def overflowed(self) -> bool:
        """Over the buffer's bound (policy detach), or blocking the native past its budget:
        the analysis is detached."""
        b = self.buffer
        if b.update(self.inbox.pending(), self.inbox.pending_bytes, self.inbox.oldest_pending_ns()):
            return False
        detail = (f"input buffer full ({b.events} events, {b.bytes} bytes; bound {b.max_events} events, "
                  f"{b.max_bytes} bytes): the analysis fell "
                  f"{(self.rec.known_ns - self.res.end_ns) / 1e9:.1f}s of VM time behind the native")
        if b.full:
            detail += f", still full after blocking the native for the {b.budget_s:g}s wall-time budget"
            b.release()
        self.end(Outcome.DETACHED, detail)
        return True

    def check_hang(self) -> None:
        if self.opts.hold is not None and self.opts.hold():
            self.last_word = self.clock()     # held (its QEMU stopped while the native is busy): silent as told
            return
        if self.clock() - self.last_word > self.opts.hang_wall_s:
            counters = self.vm.feed_counters()     # first: it puts a deadline on QMP
            self.end(Outcome.HUNG, f"QEMU silent for {self.opts.hang_wall_s:.0f}s of wall time (QEMU state "
                     f"{self.vm.status()}, {counters}, last stop at VM "
                     f"{self.res.end_ns / 1e9:.6f}s)", kill=False)

    def lagging(self, now: int) -> bool:
        """Past the native's end by max_lag_ns, and for as long no input has gone with its
        dependencies met: a guest that stopped answering (a service that never started,
        one that hangs). One that still answers goes on, however slow: a KASAN kernel
        took 68 s of VM time for 54% of a heavy recording that took the native 8 s, and
        answered every request. Once every input is delivered, the settling time ends
        the run."""
        lag = self.opts.max_lag_ns
        return self.rec.finished and now > (self.rec.end_ns or 0) + lag \
            and now - self.deps.met_ns > lag and self.inbox.left() > 0

    def finish(self) -> None:
        """QEMU has exited: the outcome from why it said it stopped."""
        self.vm.wait(30)
        outcome, detail = SHUTDOWN_OUTCOMES.get(self.shutdown or "", (Outcome.CRASHED, ""))
        if self.shutdown not in SHUTDOWN_OUTCOMES:
            detail = f"QEMU exited ({self.shutdown or 'without saying why'}): {self.vm.log_tail(300)}"
        if self.inbox.left():
            undelivered = f"{self.inbox.left()} of {self.inbox.total()} inputs not delivered"
            detail = f"{detail}; {undelivered}" if detail else undelivered
        self.res.outcome, self.res.detail = outcome, detail
        self.res.stopped_before = self.inbox.next_undelivered()
