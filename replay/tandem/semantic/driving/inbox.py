"""The recording's inputs as one analysis run takes them: taken as the native makes them
(all at once from a finished recording), delivered in their order, dropped once
delivered. A live run's inbox would otherwise grow with its length; its fill is what
the run's buffer bounds (model.Buffer).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice

from ..inputs import Flow, Input, InputKind, RecordedInputs
from ..model import AnalysisRun, Buffer
from ..network.exchanges import Exchange

# Delivered inputs are dropped from the front once there are more than this many and
# they are over half of those kept.
TRIM_AT = 256


@dataclass
class Taken:
    """What one take() found new in the recording, besides the inputs that now wait."""
    entropy: list[Input]            # delivered at once: the guest draws it from a pool, in order
    exchanges: list[Exchange]       # the UDP exchanges the native's guest started
    flows: list[Flow | None]        # connections (None: retired already)


class Inbox:
    """The inputs taken from `rec` and not delivered yet, oldest first. `res` counts
    what is taken and delivered (res.taken counts from the recording's first input: a
    live recording drops its front once every analysis has taken it); `buffer` is told
    what is delivered as it goes (its fill, read by the native's side)."""

    def __init__(self, rec: RecordedInputs, res: AnalysisRun, buffer: Buffer):
        self.rec, self.res, self.buffer = rec, res, buffer
        self.todo: list[Input] = []     # taken; todo[nxt:] not delivered yet
        self.nxt = 0
        self.trimmed = 0                # delivered inputs dropped from todo's front
        self.pending_bytes = 0          # of todo[nxt:]
        self.flows_taken = 0
        self.last_ns = 0                # VM time the last input was delivered

    def take(self) -> Taken:
        """Take what the native has made since the last take (all of it, once finished)."""
        rec, res = self.rec, self.res
        with rec.lock:
            new = rec.inputs[res.taken - rec.inputs_dropped:]
            exchanges = rec.exchanges[res.exchanges_taken - rec.exchanges_dropped:]
            flows = rec.flows[self.flows_taken:]
        res.exchanges_taken += len(exchanges)
        self.flows_taken += len(flows)
        entropy = []
        for i in new:
            if i.kind == InputKind.RNG:
                entropy.append(i)
                res.deliver(0, i)
            else:
                res.wait(i)
                self.todo.append(i)
                self.pending_bytes += len(i.data)
        res.taken += len(new)           # after: AnalysisRun.waits_on reads the two in that order
        self.buffer.delivered = res.n_delivered
        return Taken(entropy, exchanges, flows)

    def next(self) -> Input | None:
        """The next input to deliver, if one is taken."""
        return self.todo[self.nxt] if self.nxt < len(self.todo) else None

    def due(self, now: int) -> Input | None:
        """The next input, if its recorded time has come."""
        inp = self.next()
        return inp if inp is not None and inp.vm_ns <= now else None

    def after(self, n: int) -> Iterator[Input]:
        """The inputs taken after the next n (those QEMU holds as rules already)."""
        return islice(self.todo, self.nxt + n, None)

    def delivered(self, now: int, inp: Input) -> None:
        """The next input went to the guest at VM time `now`."""
        self.res.deliver(now, inp)
        self.buffer.delivered = self.res.n_delivered
        self.pending_bytes -= len(inp.data)
        self.last_ns = now
        self.nxt += 1

    def count(self) -> int:
        """Inputs delivered (entropy aside)."""
        return self.trimmed + self.nxt

    def total(self) -> int:
        """Inputs taken (entropy aside)."""
        return self.trimmed + len(self.todo)

    def left(self) -> int:
        """Inputs taken and not delivered."""
        return len(self.todo) - self.nxt

    def not_taken(self) -> int:
        with self.rec.lock:
            return len(self.rec.inputs) + self.rec.inputs_dropped - self.res.taken

    def pending(self) -> int:
        """Inputs made and not delivered: the buffer's fill."""
        return self.left() + self.not_taken()

    def oldest_pending_ns(self) -> int | None:
        """Recorded VM time of the oldest input not delivered."""
        if (inp := self.next()) is not None:
            return inp.vm_ns
        with self.rec.lock:
            i = self.res.taken - self.rec.inputs_dropped
            return self.rec.inputs[i].vm_ns if i < len(self.rec.inputs) else None

    def next_undelivered(self) -> str:
        """The first recorded input not delivered ("" once all are: a finished
        recording's, or all a live one has made so far)."""
        if (inp := self.next()) is not None:
            return inp.describe()
        with self.rec.lock:
            i = self.res.taken - self.rec.inputs_dropped
            return self.rec.inputs[i].describe() if 0 <= i < len(self.rec.inputs) else ""

    def trim(self) -> None:
        """Drop delivered inputs from the to-do list's front."""
        if self.nxt > TRIM_AT and 2 * self.nxt > len(self.todo):
            del self.todo[:self.nxt]
            self.trimmed += self.nxt
            self.nxt = 0
