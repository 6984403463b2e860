"""Exact-replay verification: did the replay reproduce every device event?

Both runs' device logs are compared event by event in their global order:
channel, direction, VM time, instruction count and payload must all match.
The first difference is reported with enough detail to find it in Wireshark.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import zip_longest

from ..formats import cpustate
from ..formats.pcapng import Devlog, Event


@dataclass
class Mismatch:
    index: int
    channel: str
    vm_ns: int | None
    what: str
    icount: int | None = None       # the recorded one's instruction count
    kind: str = "event"             # or "state checkpoint" (Devlog.states[index])

    def __str__(self) -> str:
        t = f"{self.vm_ns / 1e9:.6f}s" if self.vm_ns is not None else "?"
        return f"{self.kind} #{self.index} on {self.channel} at VM time {t}: {self.what}"


def _first_diff(a: bytes, b: bytes) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"byte {i}: recorded 0x{x:02x}, replayed 0x{y:02x}"
    return f"length: recorded {len(a)} bytes, replayed {len(b)} bytes"


def compare_events(rec: Event, rep: Event) -> str | None:
    if (rec.channel, rec.direction) != (rep.channel, rep.direction):
        return (f"recorded {rec.channel}/{rec.direction}, replayed {rep.channel}/{rep.direction} "
                f"at VM time {rep.vm_ns / 1e9:.6f}s")
    if rec.data != rep.data:
        return f"payload differs at {_first_diff(rec.data, rep.data)}"
    if rec.vm_ns != rep.vm_ns:
        return f"VM time differs: recorded {rec.vm_ns} ns, replayed {rep.vm_ns} ns"
    if rec.icount != rep.icount:
        return f"instruction count differs: recorded {rec.icount}, replayed {rep.icount}"
    if rec.vcpu != rep.vcpu and None not in (rec.vcpu, rep.vcpu):   # a log from before qemu-patches/0036 has none
        return f"vCPU differs: recorded vCPU {rec.vcpu}, replayed vCPU {rep.vcpu}"
    return None


def first_mismatch(recorded: Devlog, replayed: Devlog, *, prefix: bool = False) -> Mismatch | None:
    """The first event that differs. With prefix=True (a torn or unfinished recording)
    either log may end first: the replay stops where the record log's intact prefix
    ends, and the recording's device log, flushed on its own clock (every 100 ms, the
    record log every 50 ms), may end before that: a heavy recording killed after 7 s
    had 29,479 events in its device log and its intact stream replayed more. Only the
    events both logs hold are compared."""
    for i, (a, b) in enumerate(zip_longest(recorded.events, replayed.events)):
        if b is None:
            if prefix:
                return None
            return Mismatch(i, a.channel, a.vm_ns, "recorded event missing from the replay "
                            f"({a.direction}, {len(a.data)} bytes)", a.icount)
        if a is None:
            if prefix:
                return None
            return Mismatch(i, b.channel, b.vm_ns, f"replay produced an extra event ({b.direction}, "
                            f"{len(b.data)} bytes)", b.icount)
        why = compare_events(a, b)
        if why and prefix and _cut_at_the_end(a, b, i, replayed):
            return None
        if why:
            return Mismatch(i, a.channel, a.vm_ns, why, a.icount)
    return None


SHOWN_REGISTERS = 4     # registers a state mismatch's line names; the rest are counted


def first_state_mismatch(recorded: Devlog, replayed: Devlog, *, prefix: bool = False) -> Mismatch | None:
    """The first state checkpoint (devlog state-every) that differs: its instruction count,
    VM time or registers. A recording without checkpoints has none to compare; with
    prefix=True (a torn recording) only the checkpoints both logs hold are compared."""
    if not recorded.states:
        return None
    for k, (a, b) in enumerate(zip_longest(recorded.states, replayed.states)):
        if a is None or b is None:
            if prefix:
                return None
            ev = a or b
            what = ("recorded checkpoint missing from the replay" if b is None
                    else "replay wrote a checkpoint past the recording's last")
            return Mismatch(k, ev.channel, ev.vm_ns, what, ev.icount, "state checkpoint")
        if (a.icount, a.vm_ns, a.data) != (b.icount, b.vm_ns, b.data):
            return Mismatch(k, a.channel, a.vm_ns, _state_diff(recorded, replayed, k), a.icount, "state checkpoint")
    return None


def _state_diff(recorded: Devlog, replayed: Devlog, k: int) -> str:
    if recorded.states[k].icount != replayed.states[k].icount:
        return (f"written at instruction {replayed.states[k].icount}, recorded at "
                f"{recorded.states[k].icount}")
    if recorded.states[k].vm_ns != replayed.states[k].vm_ns:
        return f"VM time differs: recorded {recorded.states[k].vm_ns} ns, replayed {replayed.states[k].vm_ns} ns"
    diffs = cpustate.differences(cpustate.decode(recorded, k), cpustate.decode(replayed, k))
    shown = "; ".join(f"vCPU {cpu} {name} recorded {cpustate.hexval(a)}, replayed {cpustate.hexval(b)}"
                      for cpu, name, a, b in diffs[:SHOWN_REGISTERS])
    more = f" (and {len(diffs) - SHOWN_REGISTERS} more)" if len(diffs) > SHOWN_REGISTERS else ""
    return f"at instruction {recorded.states[k].icount} registers differ: {shown}{more}"


def first_departure(recorded: Devlog, replayed: Devlog, *, prefix: bool = False) -> Mismatch | None:
    """The earlier, by instruction count, of the first event and the first state checkpoint
    that differ: a checkpoint bounds a departure that reaches a device later or never."""
    ev = first_mismatch(recorded, replayed, prefix=prefix)
    st = first_state_mismatch(recorded, replayed, prefix=prefix)
    if st is None or (ev is not None and (st.icount is None or ev.icount is None or ev.icount <= st.icount)):
        return ev
    return st


def _cut_at_the_end(rec: Event, rep: Event, index: int, replayed: Devlog) -> bool:
    """A prefix replay pauses where its intact log ends, which can be inside a guest's
    write: its last event then holds the first bytes of the recorded one (a serial line
    of 71 bytes replayed as its first 2). That is the intact prefix, not a divergence."""
    return (index == len(replayed.events) - 1 and (rec.channel, rec.direction) == (rep.channel, rep.direction)
            and len(rep.data) < len(rec.data) and rec.data.startswith(rep.data))


def final_state(log: Devlog) -> tuple[int | None, int | None]:
    """(VM time, instruction count) at the clean close of a run, if it closed cleanly."""
    s = next((s for s in log.stats if s), None)
    return (s.end_vm_ns, s.icount) if s else (None, None)
