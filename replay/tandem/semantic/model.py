"""What a semantic replay holds and produces, apart from the loop that drives it
(driving/driver.py): the timing rules, one analysis run's result, and a live run's input
buffer. Plain data: the comparators (comparison/compare.py, comparison/live_compare.py),
the release gate and findings read these without importing anything that starts QEMU or
plays the network (network/peer.py fills in the run's NetOutput as the guest sends).
"""
from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from ..machine import LOOKAHEAD_NS as LOOKAHEAD_NS  # a timing rule of semantic replay; the feed option is the machine's
from . import inputs
from .inputs import Chunks, InputKind

DEP_TIMEOUT_NS = 5_000_000_000      # an input waiting on dependencies is sent anyway after
                                    # this much VM time without any output from the guest
LIVE_SLICE_NS = 50_000_000         # live, past the native's clock: stop this often to take new inputs
SETTLE_NS = 1_000_000_000           # run this long after the last input (and the native's end)
POWEROFF_WAIT_NS = 60_000_000_000   # after the power button: VM time the guest may take to power off
MAX_LAG_NS = 60_000_000_000         # beyond the native's end, without progress this long: lagging
HANG_WALL_S = 60.0                  # no word from QEMU for this long (wall): it is hung
DELIVERED_KEPT = 5_000             # live: the inputs delivered last, kept to attribute findings
TICK_S = 0.5                        # live: how often the run's `tick` (live comparison) is called




class Outcome(StrEnum):
    """How an analysis run ended (AnalysisRun.outcome; summary.json and findings.json
    carry the value). HUNG, LAGGING, DETACHED and ERROR are tandem's own limits, not
    findings about the guest (findings.failure)."""
    RUNNING = "running"
    POWEROFF = "poweroff"       # the guest powered off
    FINISHED = "finished"       # every input delivered, settled, QEMU quit by tandem
    CRASHED = "crashed"         # panic, reset, or QEMU exited unasked
    HUNG = "hung"               # QEMU silent for HANG_WALL_S of wall time
    LAGGING = "lagging"         # past the native's end, no input answered for MAX_LAG_NS of VM time
    DETACHED = "detached"       # stopped by tandem (live: buffer over its bound, or asked)
    ERROR = "error"             # the run could not start or failed in tandem


class Overflow(StrEnum):
    """What an analysis whose input buffer is full does to the run (Buffer.policy, --overflow)."""
    DETACH = "detach"       # it is detached, the native goes on
    BLOCK = "block"         # the native's incoming frames are held, for at most Buffer.budget_s


@dataclass
class FlowOutput:
    """The analysis guest's side of one recorded connection: what it sent there, in
    order, and how far it has closed it."""
    data: Chunks = field(default_factory=Chunks)    # (VM ns, in-order payload)
    fin: bool = False           # its FIN came, in order: it sends no more
    reset: str | None = None    # why the connection ended in a reset, if it did
    over: bool = False          # the peer is done with it: closed both ways, or reset either way


@dataclass
class NetOutput:
    """What the analysis guest sent on the network. The run's peer fills it in as the
    guest sends (its TCP state stays in the peer); the comparators read it, and the
    release gate (live/gate.py) from its own thread."""
    flows: dict[int, FlowOutput] = field(default_factory=dict)     # recorded connection -> its side here
    # The guest's UDP datagrams, (VM ns, (dst ip, port), payload): every guest frame is
    # parsed by the peer anyway.
    udp_out: list[tuple[int, tuple[bytes, int], bytes]] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)    # guest frames the peer could not place (the first few)
    # Connections the native refused (or whose SYN it never answered), not opened here:
    # nothing to compare, done with as soon as their time has come.
    not_opened: set[int] = field(default_factory=set)


@dataclass
class Delivered:
    vm_ns: int                  # when the analysis VM got it
    input: inputs.Input


@dataclass
class AnalysisRun:
    analysis: str
    outcome: Outcome = Outcome.RUNNING
    detail: str = ""
    end_ns: int = 0
    wall_s: float = 0.0
    console: bytearray = field(default_factory=bytearray)
    console_times: list[tuple[int, int]] = field(default_factory=list)   # (offset, vm_ns)
    console_base: int = 0           # console offset of console[0] (a live run drops what it compared)
    net_out: list[tuple[int, bytes]] | None = field(default_factory=list)  # (vm_ns, frame); None: live
    # Offline every input delivered; live the last DELIVERED_KEPT (n_delivered counts them all).
    delivered: list[Delivered] | deque[Delivered] = field(default_factory=list)
    n_delivered: int = 0
    taken: int = 0                  # the recording's inputs looked at so far
    exchanges_taken: int = 0        # the recording's UDP exchanges (the guest's requests) taken so far
    last_input_of: dict[int, int] = field(default_factory=dict)  # flow -> VM ns of its last input here
    undelivered: dict[int, int] = field(default_factory=dict)    # flow -> its inputs taken, not delivered yet
    limits: list[str] = field(default_factory=list)
    waits: int = 0
    rules_fired: int = 0            # inputs QEMU delivered by a release rule (rules.py)
    net: NetOutput | None = None    # None: it never got to replay (its frames, if any, are in net_out)
    qemu_log: str = ""
    bundle: Path | None = None  # the run's own recording, replayable exactly
    qemu_pid: int | None = None
    cpu_s: float = 0.0              # CPU time its QEMU used (sampled while it runs)
    first_input_ns: int | None = None   # VM time its first input (other than entropy) was delivered
    # Ended early: the first recorded input it never got (Input.describe()), "" if it got them all.
    stopped_before: str = ""


    def vm_time_at(self, offset: int) -> int:
        """VM time at which console byte `offset` was written."""
        i = bisect.bisect_right(self.console_times, (offset, float("inf"))) - 1
        return self.console_times[i][1] if i >= 0 else 0

    def wait(self, inp: inputs.Input) -> None:
        """inp is taken by the run's loop, to be delivered when it is due."""
        if inp.flow is not None:
            self.undelivered[inp.flow] = self.undelivered.get(inp.flow, 0) + 1

    def deliver(self, vm_ns: int, inp: inputs.Input) -> None:
        self.delivered.append(Delivered(vm_ns, inp))
        self.n_delivered += 1
        if self.first_input_ns is None and inp.kind != InputKind.RNG:
            self.first_input_ns = vm_ns
        if inp.flow is not None:
            self.last_input_of[inp.flow] = vm_ns
            if (n := self.undelivered.get(inp.flow, 0) - 1) > 0:    # never 0 while some wait: other
                self.undelivered[inp.flow] = n                      # threads read it (waits_on)
            else:
                self.undelivered.pop(inp.flow, None)

    def waits_on(self, flow: int, rec: inputs.RecordedInputs) -> bool:
        """Does an input of `flow` still wait to be delivered here: not taken yet, or
        taken and not delivered? Any thread (the release gate asks from its own): the
        recording's side is read first, since the loop counts an input as waiting
        before it counts it as taken."""
        with rec.lock:
            later = rec.inputs[self.taken - rec.inputs_dropped:]
        return any(i.flow == flow for i in later) or self.undelivered.get(flow, 0) > 0

    def drop_console(self, offset: int) -> None:
        """Forget console bytes before `offset` (compared, and scanned for reports)."""
        k = offset - self.console_base
        if k <= 0:
            return
        del self.console[:k]
        self.console_base = offset
        i = bisect.bisect_right(self.console_times, (offset, float("inf"))) - 1
        if i > 0:       # the write that `offset` is in stays: it times what follows
            del self.console_times[:i]

    def input_before(self, vm_ns: int, flow: int | None = None, recorded: bool = False) -> Delivered | None:
        """The last input delivered at or before vm_ns: what a finding is attributed to;
        with flow, the last request bytes on that connection (what a reply on it answers:
        with other clients' inputs between, the last input of all is some other client's;
        a client's FIN after its request is no request), else its last input, else the
        last of all. recorded: vm_ns is the native's time, and inputs are taken by the
        time they were recorded at (they are delivered in that order)."""
        last = last_on_flow = last_data = None
        for d in self.delivered:
            if (d.input.vm_ns if recorded else d.vm_ns) > vm_ns:
                break
            if d.input.kind != InputKind.RNG:
                last = d
                if flow is not None and d.input.flow == flow:
                    last_on_flow = d
                    if d.input.kind == InputKind.TCP_DATA:
                        last_data = d
        return last_data or last_on_flow or last


@dataclass
class Buffer:
    """A live analysis's bound on inputs the native has made but it has not taken yet,
    and what happens over it: policy DETACH (the analysis is detached at once) or
    BLOCK (the native gets no new input until the buffer has room again, for at most
    `budget_s` of wall time at a stretch; past that the analysis is detached)."""
    max_events: int = 100_000
    max_bytes: int = 64 << 20
    policy: Overflow = Overflow.DETACH
    budget_s: float = 10.0
    events: int = 0             # now
    bytes: int = 0
    oldest_ns: int | None = None  # recorded VM time of the oldest input not taken yet
    peak_events: int = 0        # the most it ever held: what the run needed
    peak_bytes: int = 0
    full: bool = False          # policy BLOCK: over its bound, the native's inputs are held
    full_since: float = 0.0     # time.monotonic() when it became full (while full)
    blocks: int = 0             # how often it blocked the native, and for how long in all
    blocked_s: float = 0.0
    # Inputs the analysis has delivered, counted from the recording's first (entropy too),
    # kept up to date by its loop as it delivers; None while no loop runs.
    delivered: int | None = None

    # Room again at 90%: the native is not held and let go at every input.
    RESUME = 0.9

    @classmethod
    def unbounded(cls) -> Buffer:
        """No bound: an analysis of a finished recording, whose reading waits for it instead."""
        return cls(max_events=1 << 62, max_bytes=1 << 62)

    def update(self, events: int, nbytes: int, oldest_ns: int | None = None) -> bool:
        """Record the current fill; False once the analysis must be detached."""
        self.events, self.bytes, self.oldest_ns = events, nbytes, oldest_ns
        self.peak_events, self.peak_bytes = max(self.peak_events, events), max(self.peak_bytes, nbytes)
        over = events > self.max_events or nbytes > self.max_bytes
        if self.policy != Overflow.BLOCK:
            return not over
        now = time.monotonic()
        if over and not self.full:
            self.full, self.full_since = True, now
            self.blocks += 1
        elif self.full and events <= self.RESUME * self.max_events and nbytes <= self.RESUME * self.max_bytes:
            self.release(now)
        return not (self.full and now - self.full_since > self.budget_s)

    def pending(self, made: int) -> int | None:
        """Inputs made (`made`, counted from the recording's first) and not delivered: its
        fill right now, between the loop's updates (any thread); None while no loop runs."""
        return None if self.delivered is None else made - self.delivered

    def over(self, made: int) -> bool:
        """Full or, by the inputs made since its last update, over its bound (any thread)."""
        return self.full or (self.delivered is not None and made - self.delivered > self.max_events)

    def release(self, now: float | None = None) -> None:
        """No longer holding the native (room again, or detached)."""
        if self.full:
            self.blocked_s += (now or time.monotonic()) - self.full_since
            self.full, self.full_since = False, 0.0
