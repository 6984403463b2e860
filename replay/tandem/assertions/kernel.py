"""The guest kernel's code as the event source and the violation reports see it.

`Kernel` holds vmlinux (symbols from System.map and its ELF symbol table, bytes of
its executable sections) and the modules a recording loaded, relocated to where
/init loaded them (agent/init prints each module's section addresses on the
console; `module_sections` reads them back; the FreeBSD demo guest's init prints the
address of each KLD it loaded, `kld_bases`, and `kld_sections` lays its sections out
from there as the kernel linker did). With it:

- function entries and their exit instructions: every `ret` (or `jmp
  __x86_return_thunk` on a rethunk kernel) in the function's body and, through
  direct tail calls (a `jmp`/`jcc` out of the body), in the functions it tail-calls,
  transitively: the return of a function that ends in a tail call is the callee's
  `ret` (the plugin tells them apart by the stack pointer);
- return-address checks for the stack words the plugin scans (a word is kept when
  the instruction before it is a call);
- disassembly (capstone) and source lines (addr2line, report/symbolize.py).

The kernel has no KASLR (base.config: CONFIG_RELOCATABLE off), so vmlinux's link
addresses are its run-time addresses. Code the kernel patches at boot (alternatives,
jump labels, static calls) is seen as it is in the file.

A FreeBSD kernel is the same to it: its kernel.debug in vmlinux's place (symbols, DWARF;
its code from the booted `kernel`, as kernel.debug's sections hold none), linked where
it runs (amd64 has no KASLR), with no ORC tables (its stacks are the `?` words alone).
"""
from __future__ import annotations

import bisect
import re
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import capstone
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.relocation import RelocationSection

from ..errors import TandemError
from ..report.symbolize import source_lines

# arch/x86/include/asm/orc_types.h, struct pt_regs offsets
ORC_REG_PREV_SP, ORC_REG_BP, ORC_REG_SP, ORC_REG_BP_INDIRECT, ORC_REG_SP_INDIRECT = 1, 4, 5, 8, 9
ORC_TYPE_UNDEFINED, ORC_TYPE_END_OF_STACK, ORC_TYPE_CALL, ORC_TYPE_REGS, ORC_TYPE_REGS_PARTIAL = 0, 1, 2, 3, 4
PT_REGS_BP, PT_REGS_IP, PT_REGS_SP = 4 * 8, 16 * 8, 19 * 8

MODULE_LINE = re.compile(rb"tandem-init: module (\S+) ([^\r\n]*)")
_SECTION = re.compile(r"(\.?[\w.$-]+)=0x([0-9a-f]+)")


@dataclass(frozen=True)
class Func:
    name: str
    addr: int
    size: int
    image: str      # "vmlinux" or the module name

    def contains(self, a: int) -> bool:
        return self.addr <= a < self.addr + self.size


def module_sections(console: bytes) -> dict[str, dict[str, int]]:
    """{module: {section: address}} from /init's `tandem-init: module` lines."""
    out: dict[str, dict[str, int]] = {}
    for m in MODULE_LINE.finditer(console):
        out[m.group(1).decode()] = {s: int(a, 16) for s, a in _SECTION.findall(m.group(2).decode())}
    return out


# The FreeBSD demo guest's init (guest-kernel/freebsd/init/kvd-init.c): "kvd-init: kld NAME.ko at 0x..."
KLD_LINE = re.compile(rb"^kvd-init: kld (\w+)\.ko at 0x([0-9a-f]{1,16})\r?$", re.M)
# sys/kern/link_elf_obj.c: the section types a KLD's memory holds
_KLD_SECTION_TYPES = {"SHT_PROGBITS", "SHT_NOBITS", "SHT_X86_64_UNWIND", "SHT_INIT_ARRAY", "SHT_FINI_ARRAY"}


def kld_bases(console: bytes) -> dict[str, int]:
    """{KLD name: the address it was loaded at} from the FreeBSD init's `kvd-init: kld` lines."""
    return {m.group(1).decode(): int(m.group(2), 16) for m in KLD_LINE.finditer(console)}


def kld_sections(ko: Path, base: int) -> dict[str, int]:
    """{section: address} of a FreeBSD KLD (a relocatable object on amd64) loaded at `base`:
    link_elf_obj.c's link_elf_load_file puts each allocated section of the types above with
    a size, in the file's order, at the next multiple of its alignment, from the base the
    kernel reports (kldstat(2)'s address). Per-CPU and VNET sets, which it copies elsewhere,
    are not code."""
    try:
        with open(ko, "rb") as f:
            elf = ELFFile(f)
            out: dict[str, int] = {}
            at = base
            for sec in elf.iter_sections():
                if sec["sh_size"] == 0 or sec["sh_type"] not in _KLD_SECTION_TYPES or not sec["sh_flags"] & 0x2:
                    continue
                align = max(sec["sh_addralign"], 1)
                at = (at + align - 1) & ~(align - 1)
                out.setdefault(sec.name, at)
                at += sec["sh_size"]
            return out
    except (OSError, ELFError) as e:
        raise TandemError(f"{ko}: cannot read the KLD ({e})") from None


class _Image:
    """One loaded object: its functions and executable bytes at run-time addresses."""

    def __init__(self, name: str, path: Path):
        self.name, self.path = name, path
        self.funcs: list[Func] = []
        self.code: list[tuple[int, bytes]] = []      # (start, bytes), executable sections
        self.objects: dict[str, int] = {}            # every named symbol -> address
        self.labels: list[tuple[int, str]] = []      # text symbols without a size (asm entry code)
        self.exec_sections: list[tuple[str, int, int]] = []   # modules: (name, address, size)
        self.orc_ips: list[int] = []                 # sorted code addresses of ORC entries
        self.orc: list[tuple[int, int, int, int, int, int]] = []   # sp_off bp_off sp_reg bp_reg type signal

    def set_orc(self, ips: list[int], table: bytes) -> None:
        entries = []
        for i in range(min(len(ips), len(table) // 6)):
            sp_off, bp_off, bits = struct.unpack_from("<hhH", table, 6 * i)
            entries.append((ips[i], (sp_off, bp_off, bits & 0xF, (bits >> 4) & 0xF, (bits >> 8) & 0x7,
                                     (bits >> 11) & 1)))
        entries.sort(key=lambda e: e[0])
        self.orc_ips = [ip for ip, _ in entries]
        self.orc = [e for _, e in entries]


def _exec_sections(elf: ELFFile) -> list[tuple[int, bytes]]:
    return [(sec["sh_addr"], sec.data()) for sec in elf.iter_sections()
            if sec["sh_flags"] & 0x4 and sec["sh_type"] == "SHT_PROGBITS" and sec["sh_addr"]]


def _load_vmlinux(path: Path, system_map: Path, code: Path | None = None) -> _Image:
    """`code`: the image whose executable sections to read instead, when `path` has its
    symbols and DWARF but not its code (FreeBSD's kernel.debug, made by objcopy
    --only-keep-debug: its sections are NOBITS; the code is in `kernel`)."""
    img = _Image("vmlinux", path)
    try:
        if code is not None:
            with open(code, "rb") as f:
                img.code = _exec_sections(ELFFile(f))
        with open(path, "rb") as f:
            elf = ELFFile(f)
            if code is None:
                img.code = _exec_sections(elf)
            symtab = elf.get_section_by_name(".symtab")
            for sym in symtab.iter_symbols() if symtab else ():
                if sym["st_info"]["type"] == "STT_FUNC" and sym["st_value"] and sym["st_size"]:
                    img.funcs.append(Func(sym.name, sym["st_value"], sym["st_size"], "vmlinux"))
            ip_sec, orc_sec = elf.get_section_by_name(".orc_unwind_ip"), elf.get_section_by_name(".orc_unwind")
            if ip_sec is not None and orc_sec is not None:
                rel = struct.unpack(f"<{ip_sec['sh_size'] // 4}i", ip_sec.data())
                base = ip_sec["sh_addr"]
                img.set_orc([base + 4 * i + r for i, r in enumerate(rel)], orc_sec.data())
    except (OSError, ELFError) as e:
        raise TandemError(f"{path}: cannot read the kernel image ({e})") from None
    try:
        for line in system_map.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3:
                a = int(parts[0], 16)
                img.objects.setdefault(parts[2], a)
                if parts[1] in "tT":
                    img.labels.append((a, parts[2]))
    except (OSError, ValueError) as e:
        raise TandemError(f"{system_map}: unreadable ({e})") from None
    return img


def _load_module(name: str, path: Path, bases: dict[str, int], kernel_syms: dict[str, int]) -> _Image:
    """A module .ko relocated to the section addresses it was loaded at."""
    img = _Image(name, path)
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            secs = list(elf.iter_sections())
            symtab = elf.get_section_by_name(".symtab")
            syms = list(symtab.iter_symbols()) if symtab else []

            def sym_addr(sym) -> int | None:
                ndx = sym["st_shndx"]
                if ndx == "SHN_UNDEF":
                    return kernel_syms.get(sym.name)
                if isinstance(ndx, int):
                    base = bases.get(secs[ndx].name)
                    return None if base is None else base + sym["st_value"]
                return sym["st_value"] if ndx == "SHN_ABS" else None

            for sym in syms:
                a = sym_addr(sym)
                if a is None or not sym.name or sym["st_shndx"] == "SHN_UNDEF":
                    continue
                img.objects.setdefault(sym.name, a)
                if sym["st_info"]["type"] == "STT_FUNC" and sym["st_size"]:
                    img.funcs.append(Func(sym.name, a, sym["st_size"], name))
            ip_sec, orc_sec = elf.get_section_by_name(".orc_unwind_ip"), elf.get_section_by_name(".orc_unwind")
            if ip_sec is not None and orc_sec is not None:
                ips = [0] * (ip_sec["sh_size"] // 4)
                for rsec in elf.iter_sections():     # each entry is a PC32 relocation: ip = S + A
                    if isinstance(rsec, RelocationSection) and rsec["sh_info"] == secs.index(ip_sec):
                        for r in rsec.iter_relocations():
                            a = sym_addr(syms[r["r_info_sym"]])
                            if a is not None:
                                ips[r["r_offset"] // 4] = a + r["r_addend"]
                img.set_orc(ips, orc_sec.data())
            for i, sec in enumerate(secs):
                if not (sec["sh_flags"] & 0x4) or sec.name not in bases:
                    continue
                data = bytearray(sec.data())
                for rsec in elf.iter_sections():
                    if isinstance(rsec, RelocationSection) and rsec["sh_info"] == i and rsec.is_RELA():
                        _relocate(data, bases[sec.name], rsec, syms, sym_addr)
                img.code.append((bases[sec.name], bytes(data)))
                img.exec_sections.append((sec.name, bases[sec.name], len(data)))
    except (OSError, ELFError) as e:
        raise TandemError(f"{path}: cannot read the module ({e})") from None
    return img


def _relocate(data: bytearray, base: int, rsec, syms, sym_addr) -> None:
    """Apply x86-64 RELA relocations (64, PC32, PLT32, 32, 32S) as the module loader does."""
    for r in rsec.iter_relocations():
        s = sym_addr(syms[r["r_info_sym"]])
        if s is None:
            continue
        off, a, t = r["r_offset"], r["r_addend"], r["r_info_type"]
        p = base + off
        if t == 1:                      # R_X86_64_64
            data[off:off + 8] = ((s + a) & (2**64 - 1)).to_bytes(8, "little")
        elif t in (2, 4):               # PC32, PLT32
            data[off:off + 4] = ((s + a - p) & 0xFFFFFFFF).to_bytes(4, "little")
        elif t in (10, 11):             # 32, 32S
            data[off:off + 4] = ((s + a) & 0xFFFFFFFF).to_bytes(4, "little")


class Kernel:
    """vmlinux plus loaded modules: symbols, code bytes, exits, disassembly, lines."""

    def __init__(self, vmlinux: str | Path, system_map: str | Path,
                 modules: dict[str, tuple[Path, dict[str, int]]] | None = None, code: str | Path | None = None):
        self.vmlinux, self.system_map = Path(vmlinux), Path(system_map)
        k = _load_vmlinux(self.vmlinux, Path(system_map), Path(code) if code else None)
        self.images = [k]
        for name, (path, bases) in (modules or {}).items():
            self.images.append(_load_module(name, Path(path), bases, k.objects))
        self._funcs = sorted((f for img in self.images for f in img.funcs), key=lambda f: f.addr)
        self._starts = [f.addr for f in self._funcs]
        self._by_name: dict[str, Func] = {}
        for img in self.images:           # vmlinux first: a module's local name never shadows it
            for f in img.funcs:
                self._by_name.setdefault(f.name, f)
        self._labels = sorted(k.labels)
        self._label_starts = [a for a, _ in self._labels]
        self.function_names = frozenset(self._by_name)
        self._code = sorted((c for img in self.images for c in img.code), key=lambda c: c[0])
        self._code_starts = [c[0] for c in self._code]
        self.md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
        self.return_thunk = k.objects.get("__x86_return_thunk")
        self._exits: dict[str, frozenset[int]] = {}
        self._exit_notes: dict[str, list[str]] = {}
        self._retaddr: dict[int, bool] = {}
        self._calls: dict[int, list[int]] | None = None
        self._orc_cache: dict[int, tuple | None] = {}

    # --- symbols -----------------------------------------------------------------

    def symbols(self) -> dict[str, int]:
        """Every symbol name -> address: System.map, then the modules' symbols."""
        out: dict[str, int] = {}
        for img in self.images:
            for name, a in img.objects.items():
                out.setdefault(name, a)
        return out

    def function(self, name: str) -> Func:
        f = self._by_name.get(name)
        if f is None:
            raise TandemError(f"{name}: no such function in this kernel ({self.vmlinux}) "
                              f"or its loaded modules")
        return f

    def function_at(self, a: int) -> Func | None:
        i = bisect.bisect_right(self._starts, a) - 1
        while i >= 0:
            f = self._funcs[i]
            if f.contains(a):
                return f
            if a - f.addr > 1 << 20:
                break
            i -= 1          # an enclosing function may start before a smaller one
        return None

    def describe(self, a: int) -> str:
        f = self.function_at(a)
        if f is None:
            # asm code (entry_SYSCALL_64, ...) has labels but no sizes in the symbol table
            i = bisect.bisect_right(self._label_starts, a) - 1
            if i >= 0 and a - self._labels[i][0] < 0x1000 and self.code(a, 1) is not None:
                return f"{self._labels[i][1]}+{a - self._labels[i][0]:#x}"
            return f"{a:#x}"
        mod = f" [{f.image}]" if f.image != "vmlinux" else ""
        return f"{f.name}+{a - f.addr:#x}/{f.size:#x}{mod}"

    # --- code --------------------------------------------------------------------

    def code(self, a: int, n: int) -> bytes | None:
        i = bisect.bisect_right(self._code_starts, a) - 1
        if i < 0:
            return None
        start, data = self._code[i]
        if a + n > start + len(data):
            return None
        return data[a - start:a - start + n]

    def disasm(self, start: int, end: int) -> list:
        data = self.code(start, end - start)
        return list(self.md.disasm(data, start)) if data else []

    def instructions(self, f: Func) -> list:
        return self.disasm(f.addr, f.addr + f.size)

    def is_return_address(self, a: int) -> bool:
        """Is the instruction right before `a` a call (so `a` can be a return address)?"""
        hit = self._retaddr.get(a)
        if hit is None:
            hit = False
            for k in (5, 6, 2, 3, 7, 4):
                data = self.code(a - k, k)
                if data:
                    insn = next(self.md.disasm(data, a - k, 1), None)
                    if insn is not None and insn.size == k and insn.mnemonic == "call":
                        hit = True
                        break
            self._retaddr[a] = hit
        return hit

    def call_before(self, a: int):
        """The call instruction that returns to `a`, or None."""
        for k in (5, 6, 2, 3, 7, 4):
            data = self.code(a - k, k)
            if data:
                insn = next(self.md.disasm(data, a - k, 1), None)
                if insn is not None and insn.size == k and insn.mnemonic == "call":
                    return insn
        return None

    def around(self, a: int, before: int = 6, after: int = 3) -> list[tuple[int, str, bool]]:
        """Instructions around `a` within its function: (address, text, is_a)."""
        f = self.function_at(a)
        if f is None:
            return []
        insns = self.instructions(f)
        idx = next((i for i, x in enumerate(insns) if x.address == a), None)
        if idx is None:
            return []
        out = []
        for x in insns[max(0, idx - before):idx + after + 1]:
            text = f"{x.mnemonic} {x.op_str}".strip()
            target = _imm(x.op_str) if x.mnemonic == "call" or x.mnemonic.startswith("j") else None
            if target is not None:
                text += f" <{self.describe(target)}>"
            out.append((x.address, text, x.address == a))
        return out

    # --- stacks ------------------------------------------------------------------

    def _orc_find(self, ip: int):
        """The ORC entry that covers ip (the last one at or before it, in ip's image)."""
        try:
            return self._orc_cache[ip]
        except KeyError:
            pass
        img = next((x for x in self.images if any(b <= ip < b + len(d) for b, d in x.code)), None)
        orc = None
        if img is not None and img.orc_ips:
            i = bisect.bisect_right(img.orc_ips, ip) - 1
            orc = img.orc[i] if i >= 0 else None
        self._orc_cache[ip] = orc
        return orc

    def unwind(self, pc: int, sp: int, bp: int, words: tuple[int, ...]) -> tuple[list[int], int, bool]:
        """Return addresses of the stack `words` (read from `sp` up) at `pc`, innermost
        first: what the kernel's ORC unwinder (arch/x86/kernel/unwind_orc.c) finds, then,
        where it stops short of the end of the stack (the snapshot ends, another stack
        such as an IRQ stack's link, no ORC data), the words that follow a call
        instruction (the kernel's `?` entries). Returns (addresses, how many of them are
        ORC frames, whether ORC reached the end: user-mode registers or the end of a
        kernel thread's stack)."""
        end = sp + 8 * len(words)

        def word(a: int | None) -> int | None:
            if a is None or a & 7 or not sp <= a < end:
                return None
            return words[(a - sp) // 8]

        frames: list[int] = []
        ip, cur_sp, cur_bp, signal, done = pc, sp, bp, True, False
        for _ in range(64):
            orc = self._orc_find(ip if signal else ip - 1)
            if orc is None or orc[4] == ORC_TYPE_UNDEFINED:
                break
            sp_off, bp_off, sp_reg, bp_reg, typ, sig = orc
            if typ == ORC_TYPE_END_OF_STACK:
                done = True
                break
            if sp_reg == ORC_REG_SP:
                nsp = cur_sp + sp_off
            elif sp_reg == ORC_REG_BP:
                nsp = cur_bp + sp_off
            elif sp_reg == ORC_REG_SP_INDIRECT:
                nsp = word(cur_sp)
                nsp = None if nsp is None else nsp + sp_off
            elif sp_reg == ORC_REG_BP_INDIRECT:
                nsp = word(cur_bp + sp_off)
            else:
                break       # a register only saved in pt_regs (entry code)
            if nsp is None:
                break
            regs_bp = None
            if typ == ORC_TYPE_CALL:
                nip = word(nsp - 8)
            elif typ == ORC_TYPE_REGS:          # a full pt_regs at nsp
                nip, cs = word(nsp + PT_REGS_IP), word(nsp + PT_REGS_IP + 8)
                if cs is not None and cs & 3:
                    done = True                 # entered from user mode: the kernel stack ends
                    break
                regs_bp, nsp = word(nsp + PT_REGS_BP), word(nsp + PT_REGS_SP)
            elif typ == ORC_TYPE_REGS_PARTIAL:  # an iret frame at nsp
                nip, cs = word(nsp), word(nsp + 8)
                if cs is not None and cs & 3:
                    done = True
                    break
                nsp = word(nsp + 24)
            else:
                break
            if nip is None or nsp is None:
                break
            if bp_reg == ORC_REG_PREV_SP:
                nbp = word(nsp + bp_off) if typ == ORC_TYPE_CALL else None
            elif bp_reg == ORC_REG_BP:
                nbp = word(cur_bp + bp_off)
            else:
                nbp = regs_bp if regs_bp is not None else cur_bp
            if nbp is None or (nsp <= cur_sp and typ == ORC_TYPE_CALL):
                break
            frames.append(nip)
            ip, cur_sp, cur_bp, signal = nip, nsp, nbp, bool(sig)
        exact = len(frames)
        if not done:        # the rest of the snapshot, as the kernel's "?" entries
            start = max(cur_sp, sp) if frames else sp
            frames += [w for i, w in enumerate(words) if sp + 8 * i >= start and w not in frames[-1:]
                       and self.is_return_address(w)]
        return frames, exact, done

    # --- exits -------------------------------------------------------------------

    def exits(self, f: Func) -> tuple[frozenset[int], list[str]]:
        """The instructions where a call of f returns to its caller, and what could
        not be followed: indirect jumps (`jmp reg`: a switch, or a tail call through a
        function pointer, whose callee's ret is unknown) and unknown jump targets."""
        if f.name in self._exits:
            return self._exits[f.name], self._exit_notes[f.name]
        out: set[int] = set()
        notes: list[str] = []
        seen = {f.addr}
        todo = [f]
        while todo:
            g = todo.pop()
            for insn in self.instructions(g):
                m = insn.mnemonic
                if m == "ret":
                    out.add(insn.address)
                elif m.startswith("j"):
                    target = _imm(insn.op_str)
                    if target is None:
                        if m == "jmp" and "[" not in insn.op_str:
                            notes.append(f"{g.name}: indirect jump at {insn.address:#x}")
                        continue
                    if target == self.return_thunk:
                        out.add(insn.address)       # rethunk: `jmp __x86_return_thunk` is the ret
                    elif not g.contains(target):
                        h = self.function_at(target)
                        if h is None:
                            notes.append(f"{g.name}: jump to {target:#x} outside any function")
                        elif h.addr not in seen:
                            seen.add(h.addr)
                            todo.append(h)
        result = frozenset(out)
        self._exits[f.name] = result
        self._exit_notes[f.name] = notes
        return result, notes

    def call_sites(self, f: Func) -> list[int]:
        """Return addresses of the direct calls (`call rel32`) of f anywhere in the code."""
        if self._calls is None:
            calls: dict[int, list[int]] = {}
            for start, data in self._code:
                i = data.find(b"\xe8")
                while 0 <= i <= len(data) - 5:
                    ret = start + i + 5
                    target = (ret + int.from_bytes(data[i + 1:i + 5], "little", signed=True)) & (2**64 - 1)
                    calls.setdefault(target, []).append(ret)
                    i = data.find(b"\xe8", i + 1)
            self._calls = calls
        # a byte scan also finds E8 inside other instructions: keep instruction boundaries
        out = []
        for ret in self._calls.get(f.addr, ()):
            call = self.call_before(ret)
            if call is not None and call.size == 5 and _imm(call.op_str) == f.addr:
                out.append(ret)
        return out

    # --- source lines ------------------------------------------------------------

    def lines(self, pcs: list[int]) -> dict[int, list[tuple[str, str, int]]]:
        """Source lines (function, file, line; inlined frames first) of code addresses."""
        out: dict[int, list[tuple[str, str, int]]] = {pc: [] for pc in pcs}
        by_image: dict[int, list[int]] = {}
        for pc in pcs:
            f = self.function_at(pc)
            img = next((i for i, x in enumerate(self.images) if f and x.name == f.image), 0)
            by_image.setdefault(img, []).append(pc)
        for i, group in by_image.items():
            image = self.images[i]
            if image.name == "vmlinux":
                out.update(source_lines(image.path, group))
                continue
            for pc in group:      # module: addr2line wants section-relative addresses
                for sec, base, size in image.exec_sections:
                    if base <= pc < base + size:
                        out[pc] = source_lines(image.path, [pc - base], sec)[pc - base]
        return out


def _imm(op_str: str) -> int | None:
    try:
        return int(op_str, 16) if op_str.startswith("0x") else None
    except ValueError:
        return None


def module_functions(ko: str | Path) -> set[str]:
    """Names of the functions a module .ko defines (no load address needed)."""
    try:
        with open(ko, "rb") as f:
            symtab = ELFFile(f).get_section_by_name(".symtab")
            return {s.name for s in symtab.iter_symbols() if s["st_info"]["type"] == "STT_FUNC"
                    and s["st_shndx"] != "SHN_UNDEF"} if symtab else set()
    except (OSError, ELFError) as e:
        raise TandemError(f"{ko}: cannot read the module ({e})") from None


# (a function of the compilation unit that defines the thread structure, that unit's
# source, the structure, its name member): Linux's task_struct.comm, FreeBSD's
# thread.td_name
_THREAD_NAMES = (("__get_task_comm", b"fs/exec.c", b"task_struct", b"comm"),
                 ("thread_alloc", b"kern/kern_thread.c", b"thread", b"td_name"))


def comm_offset(vmlinux: str | Path) -> int | None:
    """Offset of the thread's name in the kernel's thread structure (_THREAD_NAMES), from
    the DWARF of the compilation unit that holds the function named with it (found
    through .debug_aranges, so only that unit is read; else by the unit's source name, as
    clang leaves .debug_aranges out: 1.2 s to reach kern_thread.c, unit 433 of FreeBSD
    15.1's 843). None without debug info."""
    try:
        with open(vmlinux, "rb") as f:
            elf = ELFFile(f)
            if not elf.has_dwarf_info():
                return None
            symtab = elf.get_section_by_name(".symtab")
            for func, source, struct_name, member in _THREAD_NAMES:
                syms = symtab.get_symbol_by_name(func) if symtab else None
                if syms:
                    return member_offset(elf, syms[0]["st_value"], source, struct_name, member)
    except (OSError, ELFError, KeyError):
        return None
    return None


def member_offset(elf: ELFFile, addr: int, source: bytes, struct_name: bytes, member: bytes) -> int | None:
    """The offset of member in struct_name, from the DWARF of the compilation unit holding addr
    (by .debug_aranges; else the unit whose source name ends with source)."""
    dwarf = elf.get_dwarf_info()
    aranges = dwarf.get_aranges()
    off = aranges.cu_offset_at_addr(addr) if aranges else None
    if off is not None:
        cu = dwarf.get_CU_at(off)
    else:
        cu = next((u for u in dwarf.iter_CUs()
                   if (n := u.get_top_DIE().attributes.get("DW_AT_name")) and n.value.endswith(source)), None)
        if cu is None:
            return None
    for die in cu.get_top_DIE().iter_children():
        name = die.attributes.get("DW_AT_name")
        if (die.tag == "DW_TAG_structure_type" and name and name.value == struct_name
                and "DW_AT_byte_size" in die.attributes):
            for m in die.iter_children():
                mname = m.attributes.get("DW_AT_name")
                if mname and mname.value == member:
                    return m.attributes["DW_AT_data_member_location"].value
    return None


@lru_cache(maxsize=4)
def load(vmlinux: str, system_map: str, modules: tuple = (), code: str | None = None) -> Kernel:
    """A cached Kernel; modules: ((name, ko path, ((section, address), ...)), ...); code: the
    image holding vmlinux's code when it holds none (_load_vmlinux)."""
    return Kernel(vmlinux, system_map, {n: (Path(p), dict(b)) for n, p, b in modules}, code)
