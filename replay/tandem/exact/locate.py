"""A failed exact replay located: where the replay first departs from what its recording
logged, the guest's code there, and the device event that departure led to.

What the recording logged, to compare against, is its device log: every input and output
at the device boundary with its instruction count, and every STATE_EVERY_NS of VM time a
state checkpoint (every vCPU's registers, record/recording.py). The replay writes the
same log at the same instruction counts; the first record of either kind that differs,
and the last checkpoint that agreed, bound the departure:

- an input that differs (the replay log delivered other bytes than the device log saw go
  in): the departure is that instruction, exactly;
- a checkpoint whose registers differ: between the last checkpoint that agreed and it
  (at most STATE_EVERY_NS of VM time); nothing recorded lies between them to bisect on,
  and the registers that differ are shown, recorded and replayed;
- an output that differs with every earlier checkpoint agreeing: between the last of them
  and the output's instruction.

The replay is then run again, paused at power-on, to the departure's instruction count
(replay-break; forward only, no snapshots needed) for its registers, and its program
counter is named by the caller's `name` (the CLI's: explain.native.describe_pc, from the
native's kernel). "Led to" is the first output that differs at or after the departure.

On a machine with several vCPUs each is shown, the one the difference names first: the
vCPU whose checkpointed registers differ, or the one whose access made the event (the
device log says which for MMIO and port I/O: a disk request, a serial byte out; a frame
in is delivered from the main loop and names none). The others follow with their program
counters: under QEMU's round-robin TCG one vCPU ran the instruction counted, and the
cause may lie in what another did before.
"""
from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import TandemError
from ..formats import bundle, cpustate, pcapng
from .debug import debug
from .replay import replay
from .verify import Mismatch, first_mismatch


@dataclass(frozen=True)
class VcpuAt:
    """One vCPU where the replay was stopped."""
    index: int
    pc: int | None
    symbol: str | None              # the pc in the native's kernel, or why it is not named
    registers: tuple[tuple[str, int | None, int | None], ...]   # (name, recorded, replayed)


@dataclass(frozen=True)
class Departure:
    how: str                        # "input", "state" or "output": what differed first
    mismatch: Mismatch              # that first difference
    icount: int                     # where the replay was stopped: the departure's instruction
    vm_ns: int | None
    agreed_icount: int | None       # the last state checkpoint that agreed (None: none did)
    agreed_vm_ns: int | None
    vcpu: int | None                # the vCPU the first difference names (None: it names none)
    vcpus: tuple[VcpuAt, ...]       # every vCPU, that one (else the first) first
    led_to: Mismatch | None         # the first output that differs, at or after the departure
    checkpoints: int                # the recording's state checkpoints

    @property
    def pc(self) -> int | None:
        return self.vcpus[0].pc if self.vcpus else None

    @property
    def symbol(self) -> str | None:
        return self.vcpus[0].symbol if self.vcpus else None

    @property
    def registers(self) -> tuple[tuple[str, int | None, int | None], ...]:
        return self.vcpus[0].registers if self.vcpus else ()

    @property
    def window(self) -> int | None:
        """Instructions the departure may lie in: 0 when it is exact (an input)."""
        if self.how == "input":
            return 0
        return None if self.agreed_icount is None else self.icount - self.agreed_icount


def locate(bundle_dir: str | Path, *, name: Callable[[int], str] | None = None,
           progress: Callable[[str], None] | None = None) -> Departure | None:
    """Where the bundle's exact replay departs from its recording; None when it does not.
    name: the guest's code at a program counter, as text (its symbol)."""
    d = Path(bundle_dir)
    tmp = Path(tempfile.mkdtemp(prefix="tandem-locate-"))
    try:
        verdict = replay(d, keep=tmp / "replay.pcapng", until_departure=True,
                         progress=(lambda st: progress(f"replaying: VM time {st.get('vm-clock-ns', 0) / 1e9:.1f}s"))
                         if progress else None)
        if verdict.ok or verdict.mismatch is None:
            return None
        recorded = pcapng.read_devlog(d / bundle.DEVLOG)
        replayed = pcapng.read_devlog(tmp / "replay.pcapng")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _departure(d, verdict.mismatch, recorded, replayed, name, progress)


def _departure(d: Path, m: Mismatch, recorded: pcapng.Devlog, replayed: pcapng.Devlog,
               name: Callable[[int], str] | None, progress) -> Departure:
    how = _how(m, recorded)
    at = _at(m, recorded)
    agreed = _last_agreed(recorded, m, at)
    if how == "state":
        cpu, regs = _checkpoint_registers(recorded, replayed, m.index)
    else:
        if progress:
            progress(f"replaying to instruction {at}")
        with debug(d, None, index=False) as session:
            session.run_to(at)
            now = session.registers_all()
        cpu = _event_vcpu(m, recorded, replayed)
        regs = {i: tuple((reg, None, value) for reg, value in r.items()) for i, r in now.items()}
    order = sorted(regs, key=lambda i: (i != cpu, i))
    vcpus = tuple(_vcpu_at(i, regs[i], name) for i in order)
    return Departure(how, m, at, m.vm_ns, agreed.icount if agreed else None, agreed.vm_ns if agreed else None,
                     cpu if cpu in regs else None, vcpus, _led_to(recorded, replayed), len(recorded.states))


def _vcpu_at(index: int, registers, name: Callable[[int], str] | None) -> VcpuAt:
    values = {reg: b for reg, _a, b in registers}
    pc = next((values[r] for r in ("rip", "eip", "pc") if values.get(r) is not None), None)
    return VcpuAt(index, pc, name(pc) if name and pc is not None else None, registers)


def _event_vcpu(m: Mismatch, recorded: pcapng.Devlog, replayed: pcapng.Devlog) -> int | None:
    """The vCPU whose access made the event that differs, where the log says: the recorded
    one's, else the replayed one's."""
    for log in (recorded, replayed):
        if m.index < len(log.events) and log.events[m.index].vcpu is not None:
            return log.events[m.index].vcpu
    return None


def _how(m: Mismatch, recorded: pcapng.Devlog) -> str:
    if m.kind == "state checkpoint":
        return "state"
    if m.index < len(recorded.events) and recorded.events[m.index].direction == "in":
        return "input"
    return "output"


def _last_icount(log: pcapng.Devlog) -> int:
    icount = next((s.icount for s in log.stats if s and s.icount is not None), None)
    if icount is None:
        raise TandemError("the recording's device log has no instruction counts (recorded without -icount?)")
    return icount


def _last_agreed(recorded: pcapng.Devlog, m: Mismatch, at: int) -> pcapng.Event | None:
    """The last recorded checkpoint before the departure (every one before the first
    difference agreed: first_departure compared them)."""
    limit = m.index if m.kind == "state checkpoint" else len(recorded.states)
    before = [s for s in recorded.states[:limit] if s.icount is not None and s.icount < at]
    return before[-1] if before else None


def _checkpoint_registers(recorded: pcapng.Devlog, replayed: pcapng.Devlog, k: int):
    """Every vCPU's registers at checkpoint k, recorded and replayed (per vCPU those that
    differ first), and the first vCPU whose registers differ."""
    rec, rep = cpustate.decode(recorded, k), cpustate.decode(replayed, k)
    diffs = cpustate.differences(rec, rep)
    a = {c.index: dict(c.registers) for c in rec.cpus}
    b = {c.index: dict(c.registers) for c in rep.cpus}
    regs = {}
    for i in dict.fromkeys([*a, *b]):
        ra, rb = a.get(i, {}), b.get(i, {})
        rows = [(name, _int(ra.get(name)), _int(rb.get(name))) for name in dict.fromkeys([*ra, *rb])]
        regs[i] = tuple(sorted(rows, key=lambda r: r[1] == r[2]))
    return (diffs[0][0] if diffs else None), regs


def _at(m: Mismatch, recorded: pcapng.Devlog) -> int:
    return m.icount if m.icount is not None else _last_icount(recorded)


def _int(v: bytes | None) -> int | None:
    return int.from_bytes(v, "little") if v else None


def _led_to(recorded: pcapng.Devlog, replayed: pcapng.Devlog) -> Mismatch | None:
    """The first output (guest to device) that differs: every earlier one agreed, so it
    is at or after the departure."""
    def outputs(log: pcapng.Devlog) -> pcapng.Devlog:
        return dataclasses.replace(log, events=[e for e in log.events if e.direction == "out"], states=[])
    rec, rep = outputs(recorded), outputs(replayed)
    m = first_mismatch(rec, rep)
    if m is None:
        return None
    # numbered as in the whole device log, as the first difference is
    ev = rec.events[m.index] if m.index < len(rec.events) else rep.events[m.index]
    return dataclasses.replace(m, index=ev.seq)
