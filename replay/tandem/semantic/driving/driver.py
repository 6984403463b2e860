"""The loop of one analysis VM's semantic replay: what it takes from the recording, what
it releases at each stop of the VM, the horizon it grants, and how the run ends.

The VM stops at each horizon and says so on the feed (WAIT); between stops it sends its
outputs (OUTPUT: frames and console bytes) and, once, why it ends (SHUTDOWN). At each
stop the driver releases the inputs whose recorded VM time has come and whose
dependencies the guest has met (inputs.py: the bytes a flow had sent, the line the
console had printed, when the native received them), answers the guest's frames as the
remote TCP peer (peer.py): the client of a connection the recording opened to the guest,
the server of one the guest opens (matched to the recording's by connections.py), and
grants the next horizon (horizon.py, pure). Inputs after those that wait only on
the guest's TCP output go to QEMU ahead as release rules (rules.py), which QEMU fires
itself with no stop (FIRED). A live run
(rec.finished False) trails a native still running: it takes new inputs as they come,
within its buffer's bound (model.Buffer).

The loop's state is this object's attributes, each stage a method, so the loop is tested
against a scripted feed and VM (tests/unit/test_driver.py: hang, lag, detach,
dependency timeout, shutdown causes), the way syzkaller tests its VM monitor loop;
tests/test_semantic.py and tests/test_live.py run it against real QEMU.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from ...errors import TandemError
from ...formats import netpkt
from ...qemu import feed as feedproto
from ...qemu.feed import FeedConnection
from ...qemu.vm import AnalysisVM
from .. import inputs as inputs_mod
from ..network.connections import Connections
from ..network.exchanges import Answers
from .horizon import live_grant, next_horizon
from ..model import DEP_TIMEOUT_NS, HANG_WALL_S, POWEROFF_WAIT_NS, MAX_LAG_NS, TICK_S, AnalysisRun, Buffer, Outcome
from ..network.peer import Peer
from ..network.rules import MAX_RULES, OWN_BYTES_MAX, Rule, Rules, conditions, guest_seq

log = logging.getLogger(__name__)

# How often the run samples its QEMU's CPU time (procfs), in wall seconds.
CPU_SAMPLE_S = 0.2
# Delivered inputs are dropped from the front of the to-do list once there are more than
# this many and they are over half of it (a live run's list would otherwise grow forever).
TRIM_AT = 256
# Why QEMU said it stopped (feed SHUTDOWN cause) -> the run's outcome and detail.
SHUTDOWN_OUTCOMES = {
    "guest-shutdown": (Outcome.POWEROFF, ""),
    "host-qmp-quit": (Outcome.FINISHED, ""),
    "guest-reset": (Outcome.CRASHED, "the guest stopped with guest-reset (kernel panic or reboot)"),
    "guest-panic": (Outcome.CRASHED, "the guest stopped with guest-panic (kernel panic or reboot)"),
}


def release_input(inp: inputs_mod.Input, rec: inputs_mod.RecordedInputs, peer: Peer, feed, now: int) -> list[bytes]:
    """Deliver one input at VM time `now`: a serial input straight into the feed; the
    frames to send for a network input (a raw frame, or the TCP peer's segments)."""
    if inp.kind == "serial":
        feed.input(feedproto.SERIAL, now, inp.data)
        return []
    if inp.kind == "frame":
        f = netpkt.parse(inp.data)
        if f is not None and f.proto == netpkt.PROTO_UDP:      # the guest's answers to it are no requests
            peer.served.add((f.dport, f.ip_src, f.sport))
        return [inp.data]
    if inp.flow is None:
        raise TandemError(f"{inp}: a {inp.kind} input without its connection")
    if inp.kind == "tcp-open":
        fl = rec.flows[inp.flow]
        if fl is None:      # retired once every analysis compared it: long after its opening
            raise TandemError(f"{inp}: opens a connection already retired")
        if fl.answer != "accepted":
            # The native refused it (opened here, it could be accepted), or never answered its
            # SYN (the guest had no address yet, or its SYN was lost, and the client gave up:
            # opened here, a guest booted a little earlier would serve it; seen under load,
            # 2026-11-28, an index page as extra output on a connection the native never had).
            peer.not_opened.add(fl.index)
            return []
        return peer.open(fl.index, fl.client, fl.server, fl.client_mac, fl.guest_mac, now)
    if inp.flow not in peer.flows:
        return []
    if inp.kind == "tcp-data":
        return peer.send(inp.flow, inp.data, now)
    if inp.kind == "tcp-fin":
        return peer.close(inp.flow, now)
    if inp.kind == "tcp-rst":
        return peer.reset(inp.flow, now)
    return []


class AnalysisDriver:
    """Drive one analysis VM through a recording's inputs; drive() returns when the run
    has ended, its outcome and detail in `res`.

    vm, feed: the analysis VM's QEMU and its feed (the Protocols qemu.vm.AnalysisVM and
    qemu.feed.FeedConnection). clock: wall seconds (time.monotonic; a scripted test passes
    its own).
    """

    def __init__(self, rec: inputs_mod.RecordedInputs, res: AnalysisRun, vm: AnalysisVM, feed: FeedConnection, *,
                 max_lag_ns: int = MAX_LAG_NS, progress: Callable | None = None,
                 buffer: Buffer | None = None, stop: Callable[[], bool] | None = None,
                 hang_wall_s: float = HANG_WALL_S, tick: Callable[[AnalysisRun], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, line_deps: bool = True, rules: bool = True):
        self.rec, self.res, self.vm, self.feed = rec, res, vm, feed
        self.max_lag_ns, self.progress, self.stop, self.tick = max_lag_ns, progress, stop, tick
        self.buffer = buffer or Buffer()
        self.hang_wall_s, self.clock = hang_wall_s, clock
        # Inputs wait for the console line the native had printed (the demo's readiness
        # line); not on a user's VM, whose console is systemd's chatter in an order that
        # differs by kernel: its clients waited on its ports (a refused connection is
        # retried, peer.SYN_RETRY_FOR_NS).
        self.line_deps = line_deps
        # Inputs that wait only on the guest's TCP output go to QEMU ahead as release
        # rules (rules.py), as far as they are known (a live native's as it makes them).
        self.use_rules = rules
        self.rules = Rules()
        self.peer = res.peer = Peer(router_advert=lambda: rec.router_advert)
        self.lines = inputs_mod.SerialLines()  # the guest's console lines (line dependencies)
        self.todo: list[inputs_mod.Input] = []  # taken, not delivered yet: todo[nxt:]
        self.nxt = 0
        self.trimmed = 0                # delivered inputs dropped from todo's front
        self.pending_bytes = 0          # of todo[nxt:]
        self.frames_out: list[bytes] = []   # the peer's frames, sent at the next stop
        self.stalled_at: int | None = None  # live: idle at a WAIT, waiting on the native
        self.warp_granted_ns = 0        # live: the last warp bound granted
        self.blocked_since: int | None = None   # VM time the due input began waiting on deps
        self.last_input_ns = 0
        self.last_output_ns = 0
        self.progress_ns = 0            # VM time an input last went with its dependencies met
        self.last_word = clock()        # wall time QEMU last said anything
        self.shutdown: str | None = None    # the first SHUTDOWN's cause
        self.ended = False              # the run ended inside the loop (lag, detach, hang)
        # Outputs given up on: after one dependency timeout, the bytes a flow never
        # produced (and lines never printed) are not waited for again.
        self.short: dict[int, int] = {}
        self.lost_lines: set[bytes] = set()
        self.cpu_at = self.tick_at = float("-inf")
        self.pressed_at: int | None = None   # VM time the power button was pressed (rec.power_button)
        self.answers = Answers()        # the guest's UDP requests, answered from the recording
        self.unanswered: list[netpkt.Frame] = []    # live: requests the native's log may answer later
        # TCP connections the guest opens, matched to the recording's (connections.py);
        # SYNs not answered yet, by 4-tuple (live: the native's log may bring their match);
        # recorded guest-opened connections given up on (never opened here).
        self.connections = Connections()
        self.flows_taken = 0
        self.connecting: dict[tuple[bytes, int, bytes, int], netpkt.Frame] = {}
        self.not_opened_here: set[int] = set()

    # -- the recording's inputs -----------------------------------------------------------
    def pull(self) -> None:
        """Take the inputs the native has made since (all of them for a finished one).
        res.taken counts inputs from the recording's first: a live one drops the front
        of rec.inputs once every analysis has taken it. Entropy is a pool the guest draws
        from in order: it goes into the feed at once."""
        with self.rec.lock:
            new = self.rec.inputs[self.res.taken - self.rec.inputs_dropped:]
            exchanges = self.rec.exchanges[self.res.exchanges_taken - self.rec.exchanges_dropped:]
            flows = self.rec.flows[self.flows_taken:]
        self.res.taken += len(new)
        self.res.exchanges_taken += len(exchanges)
        self.flows_taken += len(flows)
        for ex in exchanges:
            self.answers.add(ex)
        for fl in flows:
            if fl is not None and fl.guest_opened:
                self.connections.add(fl)
        for i in new:
            if i.kind == "rng":
                self.feed.input(feedproto.RNG, 0, i.data)
                self.res.deliver(0, i)
            else:
                self.todo.append(i)
                self.pending_bytes += len(i.data)
        self.feed.flush()

    def not_taken(self) -> int:
        with self.rec.lock:
            return len(self.rec.inputs) + self.rec.inputs_dropped - self.res.taken

    def pending(self) -> int:
        """Inputs made and not delivered: the buffer's fill (any thread)."""
        return len(self.todo) - self.nxt + self.not_taken()

    def pending_of_flow(self, flow: int) -> bool:
        """Does an input of `flow` still wait to be delivered here?"""
        with self.rec.lock:
            later = self.rec.inputs[self.res.taken - self.rec.inputs_dropped:]
        return any(i.flow == flow for i in self.todo[self.nxt:]) or any(i.flow == flow for i in later)

    def oldest_pending_ns(self) -> int | None:
        if self.nxt < len(self.todo):
            return self.todo[self.nxt].vm_ns
        with self.rec.lock:
            i = self.res.taken - self.rec.inputs_dropped
            return self.rec.inputs[i].vm_ns if i < len(self.rec.inputs) else None

    # -- dependencies -----------------------------------------------------------------------
    def have(self, flow: int) -> int:
        """Guest bytes flow `flow` has sent here (counting those given up on)."""
        pf = self.peer.flows.get(flow)
        if pf is None and self.rec.flows[flow] is None:
            return 1 << 62          # retired: compared to its end by every analysis
        return (pf.guest_bytes if pf else 0) + self.short.get(flow, 0)

    def line_missing(self, inp: inputs_mod.Input) -> bool:
        return self.line_deps and inp.needs_line is not None and inp.needs_line[0] not in self.lost_lines \
            and not self.lines.has(inp.needs_line)

    def answer_unknown(self, inp: inputs_mod.Input) -> bool:
        """A live native's answer to this connection's SYN is not in its log yet: whether
        to open it here (not if the native refused it) is not known."""
        if inp.kind != "tcp-open" or self.rec.finished or inp.flow is None:
            return False
        fl = self.rec.flows[inp.flow]
        return fl is not None and fl.answer is None

    def unopened(self, inp: inputs_mod.Input) -> bool:
        """An input of a connection the native's guest opened, which this guest has not
        opened yet (or it is not matched yet): the server's bytes wait for it."""
        if inp.flow is None or inp.flow in self.peer.flows or inp.flow in self.not_opened_here:
            return False
        fl = self.rec.flows[inp.flow]
        return fl is not None and fl.guest_opened

    def deps_met(self, inp: inputs_mod.Input) -> bool:
        return not self.line_missing(inp) and not self.answer_unknown(inp) and not self.unopened(inp) \
            and all(self.have(f) >= n for f, n in inp.needs_bytes.items())

    def starting(self, inp: inputs_mod.Input) -> bool:
        """inp waits on the guest's bytes on a connection the guest has not accepted yet
        (the peer still sends or retries its SYN): the guest is still starting, not
        silent, so the dependency timeout waits for the connection. A KASAN kernel on a
        user's disk brought its network up at VM 25.8 s, where the native had answered
        the first request at 11.8 s; timed from 12 s, the client's FIN went with its
        request and the guest reset the connection (2026-11-28). The peer's own bounds
        still apply: a refused connection is given up after 60 s of VM time; one whose
        SYN is never answered ends the run as lagging (lagging()), tandem's limit."""
        return any(self.have(f) < n and self.peer.connecting(f) for f, n in inp.needs_bytes.items())

    def give_up(self, inp: inputs_mod.Input) -> None:
        if inp.needs_line and not self.lines.has(inp.needs_line):
            self.lost_lines.add(inp.needs_line[0])
        if self.unopened(inp) and inp.flow is not None and (fl := self.rec.flows[inp.flow]) is not None:
            # Not waited for again, nor matched to a connection this guest opens later.
            self.not_opened_here.add(fl.index)
            self.connections.take(fl)
        for flow, need in inp.needs_bytes.items():
            if self.have(flow) < need:
                self.short[flow] = self.short.get(flow, 0) + need - self.have(flow)

    def unmet(self, inp: inputs_mod.Input) -> str:
        line = inp.needs_line
        parts = [f"serial line {line[0][:60]!r} (#{line[1]})"] if line is not None and self.line_missing(inp) else []
        parts += ["the native's answer to its SYN"] if self.answer_unknown(inp) else []
        parts += [f"the guest to open its connection (flow {inp.flow})"] if self.unopened(inp) else []
        parts += [f"flow {flow}: {self.have(flow)}/{need} guest bytes"
                  for flow, need in inp.needs_bytes.items() if self.have(flow) < need]
        return ", ".join(parts)

    def answer(self, now: int) -> None:
        """Answer the guest's UDP requests from the recording (exchanges.py); one it holds
        no answer to is reported once, unless a live native's log may bring it yet."""
        left = []
        for f in self.unanswered:
            replies = self.answers.on_request(f, now)
            if replies is not None:
                self.frames_out += [frame for _, frame in replies]
            elif not self.rec.finished:
                left.append(f)
            elif (line := self.answers.miss(f)) is not None:
                self.res.limits.append(line)
        self.unanswered = left

    def connect(self, now: int) -> None:
        """Answer the guest's new TCP connections as the recorded server did, each matched
        to a recorded connection (connections.py): by its SYN, or once its first bytes
        have come when the SYN leaves it ambiguous. One that matches none is reset and
        reported once, unless a live native's log may bring its match yet."""
        peer = self.peer
        for syn in peer.connects:
            self.connecting[syn.flow()] = syn       # a retransmitted SYN: once
        peer.connects.clear()
        for key, syn in list(self.connecting.items()):
            group = self.connections.at_syn((syn.ip_dst, syn.dport))
            if not self.rec.finished and (not group or group[0].answer is None):
                continue                            # the native's log may say yet
            del self.connecting[key]
            if not group:
                self.miss((syn.ip_src, syn.sport), (syn.ip_dst, syn.dport))
                self.frames_out += peer.answer_syn(None, syn, now, "refused")
            elif len(group) == 1:
                self.connections.take(group[0])
                self.frames_out += peer.answer_syn(group[0].index, syn, now, group[0].answer)
            else:
                self.frames_out += peer.answer_syn(None, syn, now, "accepted")
        for pf in peer.ready:
            fl = self.connections.pick(pf.client, peer.first_bytes(pf))
            if fl is None:                          # its matches were all taken meanwhile
                self.miss(pf.server, pf.client)
                self.frames_out += peer.reset_unbound(pf)
            else:
                self.connections.take(fl)
                peer.bind(pf, fl.index)
        peer.ready.clear()

    def miss(self, guest: tuple[bytes, int], dst: tuple[bytes, int]) -> None:
        if (line := self.connections.miss(guest, dst)) is not None:
            self.res.limits.append(line)

    # -- a stop of the VM ---------------------------------------------------------------------
    def release_due(self, now: int) -> list[bytes]:
        """Deliver the inputs due at `now` whose dependencies are met (or that waited
        DEP_TIMEOUT_NS of VM time with no output: sent anyway, a replay limit); the frames
        to send."""
        frames = self.frames_out + self.peer.retransmit(now)
        self.frames_out = []
        while self.nxt < len(self.todo) and self.todo[self.nxt].vm_ns <= now and not self.rules:
            inp = self.todo[self.nxt]
            if not self.deps_met(inp):
                if self.blocked_since is None or self.starting(inp):
                    self.blocked_since = now
                if now - max(self.blocked_since, self.last_output_ns) < DEP_TIMEOUT_NS:
                    break
                done = "not opened" if self.answer_unknown(inp) else "sent"
                self.res.limits.append(f"{inp.describe()}: {done} after waiting "
                                       f"{DEP_TIMEOUT_NS / 1e9:.0f}s of VM time for {self.unmet(inp)}")
                self.give_up(inp)
            else:
                self.progress_ns = now
            self.blocked_since = None
            frames += release_input(inp, self.rec, self.peer, self.feed, now)
            self.res.deliver(now, inp)
            self.pending_bytes -= len(inp.data)
            self.last_input_ns = now
            self.nxt += 1
        return frames + self.peer.delayed_acks(now)     # those the inputs did not carry

    def trim(self) -> None:
        """Drop delivered inputs from the to-do list's front."""
        if self.nxt > TRIM_AT and 2 * self.nxt > len(self.todo):
            del self.todo[:self.nxt]
            self.trimmed += self.nxt
            self.nxt = 0

    def grant(self, now: int, idle: bool) -> bool:
        """Release what is due at a stop and grant the next horizon; False while a live
        native has given this VM, idle, nothing new to do."""
        self.pull()
        if self.unanswered:
            self.answer(now)
        if self.connecting:
            self.connect(now)
        self.settle_rules(now)
        first = self.nxt
        frames = self.release_due(now)
        sent = bool(frames) or self.nxt != first
        if self.rules and any(r.flow.unsent() for r in self.rules.queue):
            self.drop_rules()           # a retransmission: the rules' segments would not follow it
        elif self.use_rules and not self.rules.dropping:
            self.install_rules(now)
        self.trim()
        for fr in frames:
            self.feed.input(feedproto.NET, now, fr)
        due = self.todo[self.nxt].vm_ns if self.nxt < len(self.todo) else None
        horizon = next_horizon(now, due, self.blocked_since, self.last_output_ns, self.peer.next_timer(),
                               self.rec.end_ns or 0, self.last_input_ns, not self.rec.finished)
        if self.rules.dropping:
            horizon = now + 1           # the next stop, with every rule fired or dropped
        if not self.rec.finished:
            known = self.rec.known_ns
            g = live_grant(now, horizon, known, self.warp_granted_ns,
                           behind=due is not None and due <= now, idle=idle, sent=sent)
            if g is None:
                self.feed.flush()
                return False
            self.warp_granted_ns = known
            self.feed.horizon(g[0], warp_ns=g[1])
        elif horizon is None and self.rec.power_button and self.pressed_at is None:
            # The native ended by its power button after its last input: so does this
            # guest, which then shuts down as the native did (a DHCP RELEASE, services
            # stopping) or is quit at POWEROFF_WAIT_NS.
            self.pressed_at = now
            self.vm.powerdown()
            self.feed.horizon(now + POWEROFF_WAIT_NS)
        elif horizon is None and self.pressed_at is not None and now < self.pressed_at + POWEROFF_WAIT_NS:
            self.feed.horizon(self.pressed_at + POWEROFF_WAIT_NS)
        elif horizon is None:
            self.vm.quit()           # reported back as SHUTDOWN host-qmp-quit
        else:
            self.feed.horizon(horizon)
        self.feed.flush()
        return True

    # -- release rules (rules.py) -------------------------------------------------------
    def settle_rules(self, now: int) -> None:
        """At a stop: rules dropped at the last one are gone (what fired meanwhile has
        been taken); the oldest one waiting DEP_TIMEOUT_NS is dropped, its input then
        released as any other (sent anyway, a replay limit)."""
        if self.rules.dropping:
            self.rules.queue.clear()
            self.rules.dropping = False
        if not self.rules:
            return
        if self.blocked_since is None:
            self.blocked_since = now
        if now - max(self.blocked_since, self.last_output_ns) >= DEP_TIMEOUT_NS:
            self.drop_rules()

    def drop_rules(self) -> None:
        """Ask QEMU to drop the rules not fired; until the next stop any may still fire."""
        self.feed.unrule()
        self.rules.dropping = True

    def install_rules(self, now: int) -> None:
        """Hand QEMU the inputs after those it holds that wait only on sequence numbers
        of the guest's output, up to MAX_RULES, in order: the first that cannot be a
        rule ends them."""
        q = self.rules
        i = self.nxt + len(q)
        sent_by = {f: n for r in q.queue for f, n in r.inp.needs_bytes.items()}   # guest bytes, by then
        while len(q) < MAX_RULES and i < len(self.todo):
            inp = self.todo[i]
            for f, n in inp.needs_bytes.items():
                sent_by[f] = max(sent_by.get(f, 0), n)
            if inp.kind != "tcp-data" or inp.flow is None or inp.vm_ns > now or self.line_missing(inp) \
                    or self.answer_unknown(inp) or self.unopened(inp):
                return
            fl = self.peer.flows.get(inp.flow)
            conds = conditions(inp, self.peer, self.have, self.short) if fl is not None else None
            if fl is None or conds is None or not fl.ipv4:   # QEMU patches IPv4 segments alone (0023)
                return
            # The guest's bytes on this connection its segment will acknowledge: as many
            # as the native had sent before it, fewer if it came first.
            owed = max(sent_by.get(inp.flow, 0), self.have(inp.flow)) - self.have(inp.flow)
            frame = self.peer.prebuilt(fl, inp.data, q.queued_on(fl)) if owed <= OWN_BYTES_MAX else None
            if frame is None:
                return
            self.feed.rule(inp.vm_ns, conds, (fl.guest_key(), guest_seq(fl, fl.guest_bytes + owed)), [frame])
            q.queue.append(Rule(inp, fl))
            i += 1

    def on_fired(self, now: int, acks: bytes) -> None:
        """QEMU delivered the oldest rule's segment at VM time `now`."""
        if not self.rules:
            raise TandemError("feed: QEMU fired a release rule none was installed for")
        r = self.rules.queue.popleft()
        inp = self.todo[self.nxt]
        if inp is not r.inp:
            raise TandemError(f"feed: release rule fired for {r.inp.describe()}, next in order is {inp.describe()}")
        self.peer.sent_by_rule(r.flow, inp.data, int.from_bytes(acks[:4], "little"), now)
        self.res.deliver(now, inp)
        self.res.rules_fired += 1
        self.pending_bytes -= len(inp.data)
        self.last_input_ns = self.progress_ns = now
        self.blocked_since = None
        self.nxt += 1

    # -- the loop ---------------------------------------------------------------------------
    def drive(self) -> None:
        self.pull()
        # The fill as of now, for the native's side (overflow "block" checks it between
        # this loop's updates, which may be a second apart).
        self.buffer.pending = self.pending
        self.res.pending_of_flow = self.pending_of_flow
        while not self.ended:
            self.sample()
            if self.stopped() or self.overflowed():
                return
            if self.stalled_at is not None:
                if self.grant(self.stalled_at, True):
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
        now = self.clock()
        if now - self.cpu_at > CPU_SAMPLE_S:
            self.res.cpu_s, self.cpu_at = self.vm.cpu_seconds() or self.res.cpu_s, now
        if self.tick is not None and now - self.tick_at > TICK_S:
            self.tick(self.res)
            self.tick_at = self.clock()

    def end(self, outcome: Outcome, detail: str, kill: bool = True) -> None:
        self.res.outcome, self.res.detail, self.ended = outcome, detail, True
        self.res.stopped_before = self.next_undelivered()
        if kill:
            self.vm.kill()

    def next_undelivered(self) -> str:
        """The first recorded input not delivered here ("" once all are: a finished
        recording's, or all a live one has made so far)."""
        if self.nxt < len(self.todo):
            return self.todo[self.nxt].describe()
        with self.rec.lock:
            i = self.res.taken - self.rec.inputs_dropped
            return self.rec.inputs[i].describe() if 0 <= i < len(self.rec.inputs) else ""

    def stopped(self) -> bool:
        if self.stop is not None and self.stop():
            self.end(Outcome.DETACHED, "stopped by tandem")
        return self.ended

    def overflowed(self) -> bool:
        """Over the buffer's bound (policy detach), or blocking the native past its budget:
        the analysis is detached."""
        b = self.buffer
        if b.update(self.pending(), self.pending_bytes, self.oldest_pending_ns()):
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
        if self.clock() - self.last_word > self.hang_wall_s:
            counters = self.vm.feed_counters()     # first: it puts a deadline on QMP
            self.end(Outcome.HUNG, f"QEMU silent for {self.hang_wall_s:.0f}s of wall time (QEMU state "
                     f"{self.vm.status()}, {counters}, last stop at VM "
                     f"{self.res.end_ns / 1e9:.6f}s)", kill=False)

    def on_message(self, m) -> None:
        res = self.res
        if m.type == feedproto.OUTPUT:
            self.last_output_ns = m.vm_ns
        if m.type == feedproto.SHUTDOWN:
            # The first one says why: a QEMU under libvirt (-no-shutdown) pauses at a
            # guest poweroff and then says SHUTDOWN again for libvirt's SIGTERM.
            if self.shutdown is None:
                c = feedproto.SHUTDOWN_CAUSES
                self.shutdown = c[m.channel] if m.channel < len(c) else f"cause {m.channel}"
                res.end_ns = m.vm_ns
        elif m.type == feedproto.OUTPUT and m.channel == feedproto.NET:
            if res.net_out is not None:
                res.net_out.append((m.vm_ns, m.data))
            self.frames_out += self.peer.on_frame(m.data, m.vm_ns)
            if self.peer.requests:
                self.unanswered += self.peer.requests
                self.peer.requests.clear()
                self.answer(m.vm_ns)
            if self.peer.connects or self.peer.ready:
                self.connect(m.vm_ns)
        elif m.type == feedproto.OUTPUT and m.channel == feedproto.SERIAL:
            res.console_times.append((res.console_base + len(res.console), m.vm_ns))
            res.console += m.data
            self.lines.feed(m.data)
        elif m.type == feedproto.WAIT:
            self.on_wait(m.vm_ns, m.channel == feedproto.WAIT_IDLE)
        elif m.type == feedproto.FIRED:
            self.on_fired(m.vm_ns, m.data)

    def on_wait(self, now: int, idle: bool) -> None:
        res = self.res
        res.end_ns = now
        res.waits += 1
        if not self.grant(now, idle):     # first: what the outputs up to now let go is progress
            self.stalled_at = now
        if self.lagging(now):
            self.end(Outcome.LAGGING, f"{self.max_lag_ns / 1e9:.0f}s of VM time past the native's end, "
                     f"no input has found the outputs it waits for since VM {self.progress_ns / 1e9:.3f}s "
                     f"({self.delivered()}/{self.trimmed + len(self.todo)} inputs delivered)")
            return
        if self.progress:
            self.progress(res, self.delivered(), self.trimmed + len(self.todo))

    def delivered(self) -> int:
        return self.trimmed + self.nxt

    def lagging(self, now: int) -> bool:
        """Past the native's end by max_lag_ns, and for as long no input has gone with its
        dependencies met: a guest that stopped answering (a service that never started,
        one that hangs). One that still answers goes on, however slow: a KASAN kernel
        took 68 s of VM time for 54% of a heavy recording that took the native 8 s, and
        answered every request (2026-11-27). Once every input is delivered, the settling
        time ends the run."""
        return self.rec.finished and now > (self.rec.end_ns or 0) + self.max_lag_ns \
            and now - self.progress_ns > self.max_lag_ns and self.nxt < len(self.todo)

    def finish(self) -> None:
        """QEMU has exited: the outcome from why it said it stopped."""
        self.vm.wait(30)
        outcome, detail = SHUTDOWN_OUTCOMES.get(self.shutdown or "", (Outcome.CRASHED, ""))
        if self.shutdown not in SHUTDOWN_OUTCOMES:
            detail = f"QEMU exited ({self.shutdown or 'without saying why'}): {self.vm.log_tail(300)}"
        if self.nxt < len(self.todo):
            undelivered = f"{len(self.todo) - self.nxt} of {self.trimmed + len(self.todo)} inputs not delivered"
            detail = f"{detail}; {undelivered}" if detail else undelivered
        self.res.outcome, self.res.detail = outcome, detail
        self.res.stopped_before = self.next_undelivered()
