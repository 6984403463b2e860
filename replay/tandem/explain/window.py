"""One window of the native's kernel, re-executed in Unicorn: from a function's entry,
where the exact replay stopped, until the function returns, with every memory access
hooked. Guest pages come from the stopped replay as Unicorn first touches them.

What Unicorn cannot run as the native did (an MSR, a port or the TSC, a call out of the
window, an instruction Unicorn does not know, a page the guest has not mapped) is stepped
over through the replay itself: the replay runs to that instruction (its registers are
checked against Unicorn's, so a wrong emulation shows), then past it, and Unicorn takes
the replay's registers and forgets its pages. Each such step is marked in the trace.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import capstone
from unicorn import (UC_ARCH_X86, UC_CTL_IO_WRITE, UC_CTL_TLB_FLUSH, UC_HOOK_CODE, UC_HOOK_MEM_READ, UC_HOOK_MEM_WRITE, UC_HOOK_TLB_FILL,
                     UC_MEM_WRITE, UC_MODE_64, UC_PROT_ALL, UC_TLB_VIRTUAL, Uc, UcError)
from unicorn import x86_const as X

from .stop import Stop, StopClient

PAGE = 4096
GPRS = ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp",
        "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15")
UC_REGS = {name: getattr(X, f"UC_X86_REG_{name.upper()}") for name in (*GPRS, "rip", "eflags", "fs_base", "gs_base")}
# Run by the replay, not Unicorn: their answers come from the machine (MSRs, ports, the
# TSC, the CPU's identity, its random numbers) or change what Unicorn does not model
# (SMAP, interrupts' return, the GS swap, control registers, page tables, FPU state).
MACHINE = frozenset({"rdmsr", "wrmsr", "in", "out", "insb", "insw", "insd", "outsb", "outsw", "outsd",
                     "rdtsc", "rdtscp", "rdpid", "rdpmc", "rdrand", "rdseed", "cpuid", "hlt", "pause",
                     "stac", "clac", "swapgs", "sysretq", "iretq", "iret", "sysexit", "lgdt", "lidt",
                     "ltr", "lldt", "invlpg", "invpcid", "wbinvd", "xsave", "xsaves", "xsaveopt",
                     "xrstor", "xrstors", "xgetbv", "xsetbv", "int", "int3", "ud2", "vmcall", "monitor",
                     "mwait", "sti", "popfq", "popf"})
RSP_CHANGING = frozenset({"popfq", "popf", "iretq", "iret", "sysretq", "int", "int3"})
MAX_STEPOVERS = 512
EMULATED_LIMIT = 200_000       # instructions of one window (a loop that never ends here is a bug of ours)


@dataclass
class Access:
    step: int              # index of the instruction in Window.steps
    pc: int
    kind: str              # "read" or "write"
    addr: int
    size: int
    value: int


@dataclass
class Step:
    pc: int
    text: str              # the instruction, capstone's
    stepped: str = ""      # why the replay ran it instead of Unicorn ("" : Unicorn did)
    icount: int | None = None      # the replay's instruction count, at instructions it stopped at


@dataclass
class Window:
    func: str
    entry: Stop
    steps: list[Step] = field(default_factory=list)
    accesses: list[Access] = field(default_factory=list)
    end: str = ""                  # how it ended: "returned", "left through ...", "limit"
    exit: Stop | None = None       # the replay at the window's last instruction
    mismatches: list[str] = field(default_factory=list)   # Unicorn's registers against the replay's
    stepovers: int = 0
    outside: int = 0               # instructions the replay ran outside the window (calls, interrupts)
    emulated: int = 0              # instructions Unicorn ran
    emulate_s: float = 0.0         # wall time Unicorn took for them
    pages: int = 0                 # guest pages Unicorn read from the stopped replay
    entry_rsp: int = 0             # the stack pointer at the window's entry


class Emulator:
    """Unicorn over the stopped replay's memory: a virtual TLB filled page by page."""

    def __init__(self, client: StopClient):
        self.client = client
        self.uc: Any = cast(Any, Uc(UC_ARCH_X86, UC_MODE_64))     # UcIntel: its ctl_* are not on Uc's type
        self.uc.ctl_set_tlb_mode(UC_TLB_VIRTUAL)    # pages by the TLB fill hook: guest virtual addresses as they are
        self.phys: dict[int, int] = {}        # guest virtual page -> Unicorn physical page
        self.virt: dict[int, int] = {}        # and back
        self.free: list[int] = []             # Unicorn pages unmapped since
        self.next_phys = PAGE
        self.fault: int | None = None         # the guest page that could not be read
        self.fetched = 0                      # pages read from the stopped replay
        self.on_access: Callable[[str, int, int, int], None] | None = None
        self.uc.hook_add(UC_HOOK_TLB_FILL, self._fill)
        self.uc.hook_add(UC_HOOK_MEM_READ | UC_HOOK_MEM_WRITE, self._access)

    def _fill(self, uc, vaddr, access, entry, _user) -> bool:
        page = vaddr & ~(PAGE - 1)
        p = self.phys.get(page)
        if p is None:
            data = self.client.mem(page, PAGE)
            if data is None:
                self.fault = vaddr
                return False
            self.fetched += 1
            p = self.free.pop() if self.free else self._new_phys()
            uc.mem_write(p, data)
            self.phys[page], self.virt[p] = p, page
        entry.paddr = p
        entry.perms = UC_PROT_ALL
        return True

    def _new_phys(self) -> int:
        p = self.next_phys
        self.next_phys += PAGE
        self.uc.mem_map(p, PAGE)
        return p

    def _access(self, uc, kind, paddr, size, value, _user) -> None:
        page = self.virt.get(paddr & ~(PAGE - 1))
        if page is None or self.on_access is None:
            return
        if kind != UC_MEM_WRITE:
            value = int.from_bytes(uc.mem_read(paddr, size), "little") if size <= 8 else 0
        self.on_access("write" if kind == UC_MEM_WRITE else "read", page | (paddr & (PAGE - 1)), size, value)

    def forget_pages(self) -> None:
        """After the replay ran: every page is read again when next touched."""
        self.free.extend(self.phys.values())
        self.phys.clear()
        self.virt.clear()
        self.uc.ctl(UC_CTL_TLB_FLUSH, UC_CTL_IO_WRITE)

    def load(self, regs: dict[str, int]) -> None:
        for name, r in UC_REGS.items():
            if name in regs:
                self.uc.reg_write(r, regs[name])
        for i in range(16):          # a kernel uses SSE between kernel_fpu_begin and _end
            if f"xmm{i}" in regs:
                self.uc.reg_write(X.UC_X86_REG_XMM0 + i, regs[f"xmm{i}"])

    def reg(self, name: str) -> int:
        return self.uc.reg_read(UC_REGS[name])


def _target(insn) -> int | None:
    """A direct branch's target."""
    op = insn.op_str
    try:
        return int(op, 16) if op.startswith("0x") else None
    except ValueError:
        return None


def _text(insn) -> str:
    return f"{insn.mnemonic} {insn.op_str}".strip()


class Runner:
    """The window [lo, hi) (a function) from the replay's stop at its entry until it returns."""

    def __init__(self, client: StopClient, entry: Stop, lo: int, hi: int, name: str,
                 return_thunk: int | None, limit: int = EMULATED_LIMIT):
        self.client, self.lo, self.hi, self.limit = client, lo, hi, limit
        self.w = Window(name, entry)
        self.emu = Emulator(client)
        self.return_thunk = return_thunk
        self.last = entry               # where the replay last stopped
        self.since = 0                  # instructions Unicorn ran since
        self.pending: list[int] = []    # pcs the code hook saw in the current emu_start
        self.insns: dict = {}
        self.special: dict[int, str] = {}
        self.exit_targets: list[tuple[int, int]] = []

    def _why(self, i) -> str:
        """Why the instruction is not Unicorn's to run ("": it is)."""
        if i.mnemonic in ("ret", "retq") or (i.mnemonic == "jmp" and _target(i) == self.return_thunk):
            return "exit"
        if i.mnemonic in MACHINE:
            return f"{i.mnemonic}: the machine's answer"
        t = _target(i)
        if i.mnemonic == "call":
            return "call" if t is None or not self.lo <= t < self.hi else ""
        if i.mnemonic.startswith("j") and (t is None or not self.lo <= t < self.hi):
            return "leave"
        return ""

    def run(self) -> Window:
        w, emu = self.w, self.emu
        regs = self.client.regs()
        emu.load(regs)
        self.entry_rsp = w.entry_rsp = regs["rsp"]
        code = self.client.mem(self.lo, self.hi - self.lo)
        if code is None:
            w.end = "its code could not be read from the replay"
            return w
        md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
        self.insns = {i.address: i for i in md.disasm(code, self.lo)}
        self.special = {a: why for a, i in self.insns.items() if (why := self._why(i))}
        self.exit_targets = [(a, self.entry_rsp) for a, why in sorted(self.special.items()) if why == "exit"]
        emu.on_access = self._on_access
        emu.uc.hook_add(UC_HOOK_CODE, self._on_code)
        pc = w.entry.pc
        while not w.end:
            pc = self._advance(pc)
        w.pages = emu.fetched
        return w

    def _on_code(self, uc, addr, size, _user) -> None:
        if (addr in self.special and self.pending) or not self.lo <= addr < self.hi:
            uc.emu_stop()       # before it runs
            return
        self.pending.append(addr)
        i = self.insns.get(addr)
        self.w.steps.append(Step(addr, _text(i) if i else "(not on an instruction boundary)",
                                 icount=self.last.icount + self.since + len(self.pending) - 1))

    def _on_access(self, kind: str, addr: int, size: int, value: int) -> None:
        w = self.w
        w.accesses.append(Access(len(w.steps) - 1, w.steps[-1].pc if w.steps else 0, kind, addr, size, value))

    def _advance(self, pc: int) -> int:
        """One stretch: Unicorn's run from pc, or the replay's step over the instruction at pc."""
        w, emu = self.w, self.emu
        if w.emulated > self.limit:
            w.end = f"limit ({self.limit} instructions emulated)"
            return pc
        why = self.special.get(pc, "")
        if why == "exit" and emu.reg("rsp") == self.entry_rsp:
            w.exit = self._sync(pc, "return")
            w.steps.append(Step(pc, _text(self.insns[pc]), icount=w.exit.icount if w.exit else None))
            w.end = "returned"
            return pc
        if why == "leave":
            w.exit = self._sync(pc, "leaving")
            w.steps.append(Step(pc, _text(self.insns[pc]), stepped="leaves the window",
                                icount=w.exit.icount if w.exit else None))
            w.end = f"left the window ({_text(self.insns[pc])})"
            return pc
        if why and why != "exit":
            return self._step_over(self.insns[pc], why)
        self.pending.clear()
        emu.fault = None
        t0 = time.perf_counter()
        try:
            emu.uc.emu_start(pc, 0, count=self.limit)
            err = None
        except UcError as e:
            err = e
        w.emulate_s += time.perf_counter() - t0
        ran = len(self.pending)
        if err is None:
            w.emulated += ran
            self.since += ran
            if ran == 0:
                w.end = f"Unicorn made no progress at {pc:#x}"
            return emu.reg("rip")
        # The last instruction the hook saw did not complete (an unknown instruction, a
        # page the guest has not mapped): its registers are as before it; the replay runs it.
        failed = self.pending[-1] if self.pending else pc
        w.emulated += max(0, ran - 1)
        self.since += max(0, ran - 1)
        if w.steps and w.steps[-1].pc == failed:
            w.steps.pop()
            while w.accesses and w.accesses[-1].step >= len(w.steps):
                w.accesses.pop()
        i = self.insns.get(failed)
        if i is None:
            w.end = f"Unicorn failed outside the window's instructions at {failed:#x} ({err})"
            return failed
        emu.uc.reg_write(UC_REGS["rip"], failed)
        what = f"a guest page fault at {emu.fault:#x}" if emu.fault is not None else f"Unicorn cannot run it ({err})"
        return self._step_over(i, what)

    def _sync(self, pc: int, why: str) -> Stop | None:
        """Run the replay to pc, where Unicorn is now; check Unicorn's registers there."""
        emu = self.emu
        s = self.client.go([(pc, emu.reg("rsp"))])
        if s is None:
            self.w.end = "the replay ended before the window did"
            return None
        real = self.client.regs()
        bad = [f"{r} {emu.reg(r):#x} (Unicorn) != {real.get(r, 0):#x} (replay)"
               for r in GPRS if emu.reg(r) != real.get(r, 0)]
        if bad:
            self.w.mismatches.append(f"at {pc:#x} ({why}): " + "; ".join(bad))
        self._ran_to(s)
        return s

    def _ran_to(self, s: Stop) -> None:
        """The replay caught up with Unicorn at s: instructions it ran besides Unicorn's (an
        interrupt or exception it took on the way) are marked where they were seen."""
        extra = s.icount - self.last.icount - self.since
        if extra > 0:
            self.w.outside += extra
            self.w.steps.append(Step(s.pc, "", stepped=f"{extra} instructions outside the window before here "
                                     f"(an interrupt or exception the replay took)", icount=s.icount))
        self.last, self.since = s, 0

    def _step_over(self, insn, why: str) -> int:
        """The replay runs insn (a call: the whole callee) in Unicorn's stead; Unicorn takes
        its registers after it and forgets its pages."""
        w, emu = self.w, self.emu
        if w.stepovers >= MAX_STEPOVERS:
            w.end = f"limit ({MAX_STEPOVERS} instructions stepped over)"
            return insn.address
        before = self._sync(insn.address, why)
        if before is None:
            return insn.address
        sp = 0 if insn.mnemonic in RSP_CHANGING else emu.reg("rsp")
        after = self.client.go([(insn.address + insn.size, sp), *self.exit_targets])
        if after is None:
            w.end = "the replay ended before the window did"
            return insn.address
        emu.load(self.client.regs())
        emu.forget_pages()
        w.stepovers += 1
        self.last, self.since = after, 0     # the callee's instructions are not the window's
        ran = after.icount - before.icount
        label = f"run by the replay: {why}" if why != "call" else f"call run by the replay ({ran} instructions)"
        w.steps.append(Step(insn.address, _text(insn), stepped=label, icount=before.icount))
        w.outside += max(0, ran - 1)
        return after.pc


def run(client: StopClient, entry: Stop, lo: int, hi: int, name: str, return_thunk: int | None,
        limit: int = EMULATED_LIMIT) -> Window:
    """Re-execute the window [lo, hi) from the replay's stop at its entry (see Runner)."""
    return Runner(client, entry, lo, hi, name, return_thunk, limit).run()
