"""What an input waits for before it goes to the analysis guest, and for how long.

The native's clients reacted to its outputs, so an input waits until this guest has
made them too (inputs.py records them): the bytes a connection had sent, the console
line the native had printed; and, live, the native's answer to a connection's SYN, or,
for a connection the native's guest opened, this guest opening its own. The input due
waits at most DEP_TIMEOUT_NS of VM time from when it began to or from the guest's last
output (a guest still working pushes it back); then it goes anyway and what it waited
for is given up on (not waited for again), which the run reports as a replay limit.
"""
from __future__ import annotations

from ..inputs import Input, InputKind, RecordedInputs, SerialLines
from ..model import DEP_TIMEOUT_NS
from ..network.remote import Remote


class Dependencies:
    def __init__(self, rec: RecordedInputs, remote: Remote, line_deps: bool = True):
        """line_deps: inputs wait for the console line the native had printed (the demo's
        readiness line); not on a user's VM, whose console is systemd's chatter in an
        order that differs by kernel: its clients waited on its ports (a refused
        connection is retried, peer.SYN_RETRY_FOR_NS)."""
        self.rec, self.remote, self.line_deps = rec, remote, line_deps
        self.lines = SerialLines()      # the guest's console lines
        # Outputs given up on: after one dependency timeout, the bytes a flow never
        # produced (and lines never printed) are not waited for again.
        self.short: dict[int, int] = {}
        self.lost_lines: set[bytes] = set()
        self.blocked_since: int | None = None   # VM time the input due began waiting
        self.last_output_ns = 0         # VM time of the guest's last output
        self.met_ns = 0                 # VM time an input last went with its dependencies met

    # -- the guest's outputs ------------------------------------------------------------
    def have(self, flow: int) -> int:
        """Guest bytes connection `flow` has sent here (counting those given up on)."""
        pf = self.remote.peer.flows.get(flow)
        return (pf.guest_bytes if pf else 0) + self.short.get(flow, 0)

    def retired(self, flow: int) -> bool:
        """Compared to its end here (forgotten), or by every analysis: nothing waits on
        it. Not the second alone: the recording retires a connection at most every
        trail.FLOWS_TRIM_S, and until then an input waiting on one forgotten here would
        count its bytes as none and wait out DEP_TIMEOUT_NS for them."""
        return flow in self.remote.forgotten or (flow not in self.remote.peer.flows and self.rec.flows[flow] is None)

    def bytes_met(self, flow: int, need: int) -> bool:
        return self.retired(flow) or self.have(flow) >= need

    def line_missing(self, inp: Input) -> bool:
        return self.line_deps and inp.needs_line is not None and inp.needs_line[0] not in self.lost_lines \
            and not self.lines.has(inp.needs_line)

    def answer_unknown(self, inp: Input) -> bool:
        """A live native's answer to this connection's SYN is not in its log yet: whether
        to open it here (not if the native refused it) is not known."""
        if inp.kind != InputKind.TCP_OPEN or self.rec.finished or inp.flow is None:
            return False
        fl = self.rec.flows[inp.flow]
        return fl is not None and fl.answer is None

    def unopened(self, inp: Input) -> bool:
        """An input of a connection the native's guest opened, which this guest has not
        opened yet (or it is not matched yet): the server's bytes wait for it."""
        if inp.flow is None or inp.flow in self.remote.peer.flows or inp.flow in self.remote.given_up:
            return False
        fl = self.rec.flows[inp.flow]
        return fl is not None and fl.guest_opened

    def only_bytes(self, inp: Input) -> bool:
        """It waits on nothing but the guest's bytes (what QEMU sees in sequence numbers)."""
        return not (self.line_missing(inp) or self.answer_unknown(inp) or self.unopened(inp))

    def met(self, inp: Input) -> bool:
        return self.only_bytes(inp) and all(self.bytes_met(f, n) for f, n in inp.needs_bytes.items())

    # -- how long the input due waits ---------------------------------------------------
    def starting(self, inp: Input) -> bool:
        """inp waits on the guest's bytes on a connection the guest has not accepted yet
        (the peer still sends or retries its SYN): the guest is still starting, not
        silent, so the dependency timeout waits for the connection. A KASAN kernel on a
        user's disk brought its network up at VM 25.8 s, where the native had answered
        the first request at 11.8 s: timed from 12 s, the client's FIN went with its
        request and the guest reset the connection. The peer's own bounds still apply:
        a refused connection is given up after 60 s of VM time; one whose SYN is never
        answered ends the run as lagging (AnalysisDriver.lagging), tandem's limit."""
        return any(not self.bytes_met(f, n) and self.remote.peer.connecting(f) for f, n in inp.needs_bytes.items())

    def waiting(self, now: int, inp: Input | None = None) -> None:
        """Something due at `now` waits (inp, or the release rules QEMU holds): the wait
        starts now, unless it has already (again, while inp's connection is opening)."""
        if self.blocked_since is None or (inp is not None and self.starting(inp)):
            self.blocked_since = now

    def waited_out(self, now: int) -> bool:
        """DEP_TIMEOUT_NS of VM time since the wait began, and since the guest's last output."""
        return self.blocked_since is not None and now - max(self.blocked_since, self.last_output_ns) >= DEP_TIMEOUT_NS

    def went(self, now: int, met: bool) -> None:
        """The input due went at `now` (its dependencies met, or given up on)."""
        self.blocked_since = None
        if met:
            self.met_ns = now

    def give_up(self, inp: Input) -> str:
        """inp waited out the timeout: what it waits for is not waited for again. The
        replay limit that says so (it is sent anyway, or, a connection whose SYN a live
        native never answered, not opened)."""
        done = "not opened" if self.answer_unknown(inp) else "sent"
        line = f"{inp.describe()}: {done} after waiting {DEP_TIMEOUT_NS / 1e9:.0f}s of VM time for {self.unmet(inp)}"
        if inp.needs_line and not self.lines.has(inp.needs_line):
            self.lost_lines.add(inp.needs_line[0])
        if self.unopened(inp) and inp.flow is not None and (fl := self.rec.flows[inp.flow]) is not None:
            self.remote.give_up(fl)
        for flow, need in inp.needs_bytes.items():
            if not self.bytes_met(flow, need):
                self.short[flow] = self.short.get(flow, 0) + need - self.have(flow)
        return line

    def unmet(self, inp: Input) -> str:
        line = inp.needs_line
        parts = [f"serial line {line[0][:60]!r} (#{line[1]})"] if line is not None and self.line_missing(inp) else []
        parts += ["the native's answer to its SYN"] if self.answer_unknown(inp) else []
        parts += [f"the guest to open its connection (flow {inp.flow})"] if self.unopened(inp) else []
        parts += [f"flow {flow}: {self.have(flow)}/{need} guest bytes"
                  for flow, need in inp.needs_bytes.items() if not self.bytes_met(flow, need)]
        return ", ".join(parts)
