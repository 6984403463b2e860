"""State checkpoints in a device log (devlog state-every; docs/formats.md): every vCPU's
registers at one VM time and instruction count.

QEMU writes them from its main loop, where under record/replay the vCPU stands between two
instructions, so a replay writes its checkpoints at the instruction counts its recording
did. A record holds, per vCPU, its index, the length of what follows, then each register
as a length byte and its little-endian bytes, in the order the interface's comment names
them ("registers: rax rbx ..."; gdb's register set). A register's width follows the CPU's
mode (x86's fs_base is 4 bytes outside long mode), hence a length per register.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import BundleError
from .pcapng import Devlog, Event

COMMENT_HEAD = "registers:"
_CPU_HDR = struct.Struct("<II")
MAX_CPUS = 1024


@dataclass(frozen=True)
class CpuState:
    index: int
    registers: tuple[tuple[str, bytes], ...]    # (gdb's name, little-endian value), in order

    def value(self, name: str) -> int | None:
        raw = dict(self.registers).get(name)
        return int.from_bytes(raw, "little") if raw else None


@dataclass(frozen=True)
class Checkpoint:
    number: int             # its index among the log's checkpoints
    vm_ns: int
    icount: int | None
    cpus: tuple[CpuState, ...]

    def pc(self, cpu: int = 0) -> int | None:
        """The vCPU's program counter (x86's rip, or eip, or gdb's generic pc)."""
        st = next((c for c in self.cpus if c.index == cpu), None)
        if st is None:
            return None
        for name in ("rip", "eip", "pc"):
            if (v := st.value(name)) is not None:
                return v
        return None


def register_names(log: Devlog, ev: Event) -> list[str]:
    comment = log.interfaces[ev.iface].comment
    if not comment.startswith(COMMENT_HEAD):
        raise BundleError(f"state interface {log.interfaces[ev.iface].name!r}: its comment does not "
                          f"name the registers ({comment[:40]!r})")
    return comment[len(COMMENT_HEAD):].split()


def decode(log: Devlog, number: int) -> Checkpoint:
    """Checkpoint `number` of the log; a record that does not parse is a BundleError."""
    ev = log.states[number]
    names = register_names(log, ev)
    data, off = ev.data, 0
    cpus: list[CpuState] = []
    while off < len(data):
        if off + _CPU_HDR.size > len(data) or len(cpus) >= MAX_CPUS:
            raise _bad(ev, number, "a vCPU's header runs past the record")
        index, length = _CPU_HDR.unpack_from(data, off)
        off += _CPU_HDR.size
        end = off + length
        if end > len(data):
            raise _bad(ev, number, f"vCPU {index}'s {length} bytes run past the record")
        regs = []
        for name in names:
            if off >= end or off + 1 + data[off] > end:
                raise _bad(ev, number, f"vCPU {index}'s register {name} runs past its bytes")
            n = data[off]
            regs.append((name, bytes(data[off + 1:off + 1 + n])))
            off += 1 + n
        if off != end:
            raise _bad(ev, number, f"vCPU {index} has {end - off} bytes past its {len(names)} registers")
        cpus.append(CpuState(index, tuple(regs)))
    return Checkpoint(number, ev.vm_ns, ev.icount, tuple(cpus))


def _bad(ev: Event, number: int, why: str) -> BundleError:
    return BundleError(f"state checkpoint {number} (VM time {ev.vm_ns} ns, file offset {ev.file_offset}): {why}")


def differences(a: Checkpoint, b: Checkpoint) -> list[tuple[int, str, bytes | None, bytes | None]]:
    """(vCPU, register, a's value, b's value) for every register that differs, in order."""
    out: list[tuple[int, str, bytes | None, bytes | None]] = []
    bcpus = {c.index: dict(c.registers) for c in b.cpus}
    for c in a.cpus:
        other = bcpus.pop(c.index, None)
        if other is None:
            out.append((c.index, "*", b"present", None))
            continue
        for name, value in c.registers:
            if other.get(name) != value:
                out.append((c.index, name, value, other.get(name)))
    out.extend((index, "*", None, b"present") for index in bcpus)
    return out


def hexval(v: bytes | None) -> str:
    """A register's value as gdb prints it (most significant byte first)."""
    return "-" if v is None else "0x" + (v[::-1].hex() if v else "")
