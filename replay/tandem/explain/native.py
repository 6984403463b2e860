"""The native's kernel as `tandem explain` needs it: its vmlinux (symbols, code, DWARF) and
where its modules were loaded.

A directly booted recording names its kernel; its vmlinux lies beside it
(assertions.trace.kernel_for_bundle). A VM its firmware booted (its own GRUB, a kernel
from its distribution's package) names none: the kernel is found by the banner it printed
("Linux version ..."), which is the vmlinux's own linux_banner, among the kernels tandem
built and the one a user gives (--vmlinux).

A module that no console line placed (the demo's /init prints its sections; a Debian
system's modprobe does not) is placed while the replay runs: the replay stops in the
kernel's module loader (do_init_module) as each module is initialised, and the module's
symbol table, which the loader has filled with the addresses it chose, is read from the
stopped guest (struct module's kallsyms, its offset from the kernel's DWARF).
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

import tandem.assertions.trace as trace
from .. import artifacts, catalog
from ..assertions.kernel import Kernel, load, member_offset, module_functions, module_sections
from ..errors import TandemError
from ..formats import bundle, pcapng

BANNER = re.compile(rb"Linux version [^\r\n]*")
LOADER = "do_init_module"        # kernel/module/main.c: do_init_module(struct module *mod)
ELF64_SYM = struct.Struct("<IBBHQQ")


@dataclass(frozen=True)
class Native:
    """The native's kernel files: vmlinux, System.map, its modules' .ko files by name, and
    the modules the console placed."""
    vmlinux: Path
    system_map: Path
    kos: dict[str, Path]
    placed: tuple = ()            # ((name, ko, ((section, address), ...)), ...)
    kernel: Kernel | None = None  # a directly booted kernel, its modules placed (kernel_for_bundle)

    def load(self, more: tuple = ()) -> Kernel:
        if self.kernel is not None and not more:
            return self.kernel
        return load(str(self.vmlinux), str(self.system_map), tuple(sorted((*self.placed, *more))))

    def module_of(self, func: str) -> str | None:
        """The module (not yet placed) whose .ko defines func."""
        placed = {name for name, _, _ in self.placed}
        for name, ko in sorted(self.kos.items()):
            if name not in placed and func in module_functions(ko):
                return name
        return None


def banner(vmlinux: Path, system_map: Path) -> bytes | None:
    """The kernel's linux_banner (its first line), read from vmlinux."""
    try:
        addr = next((int(line.split()[0], 16) for line in system_map.read_text().splitlines()
                     if line.endswith(" linux_banner")), None)
        if addr is None:
            return None
        with open(vmlinux, "rb") as f:
            elf = ELFFile(f)
            for sec in elf.iter_sections():
                if sec["sh_addr"] <= addr < sec["sh_addr"] + sec["sh_size"] and sec["sh_type"] == "SHT_PROGBITS":
                    data = sec.data()[addr - sec["sh_addr"]:][:512]
                    return data.split(b"\0", 1)[0].split(b"\n", 1)[0]
    except (OSError, ELFError, ValueError):
        return None
    return None


def _built() -> list[tuple[Path, Path, list[Path]]]:
    """(vmlinux, System.map, module .ko files) of each Linux kernel tandem has built."""
    out = []
    for flavor in catalog.FLAVORS:
        try:
            k = artifacts.kernel(flavor)
            kos = [Path(p) for p in artifacts.modules(flavor).get("modules", [])]
        except (TandemError, KeyError):
            continue
        if k.get("vmlinux"):
            out.append((Path(k["vmlinux"]), Path(k["vmlinux"]).parent / "System.map", kos))
    return out


def find(d: Path, vmlinux: Path | None = None) -> Native:
    """The native's kernel of the recording in d (see the module's docstring)."""
    m = bundle.load_manifest(d)
    if m.input_paths.get("kernel") and vmlinux is None:
        kern = trace.kernel_for_bundle(d)
        return Native(kern.vmlinux, kern.system_map, {}, (), kern)
    out = pcapng.console(d / bundle.DEVLOG)
    said = BANNER.search(out)
    if said is None:
        raise TandemError(f"{d}: the native printed no 'Linux version' banner: which kernel it ran is "
                          f"unknown (a Linux guest's console on its serial port is needed)")
    candidates = [(vmlinux, vmlinux.parent / "System.map", [])] if vmlinux else _built()
    for vm, smap, kos in candidates:
        if vm.is_file() and smap.is_file() and banner(vm, smap) == said.group(0).rstrip(b"\r"):
            config = vm.parent / "config"
            if config.is_file() and "\nCONFIG_SMP=y" in config.read_text():
                raise TandemError(f"{config}: an SMP kernel (the current task is per CPU): the native's "
                                  f"heap is watched on uniprocessor kernels only")
            mods = {ko.stem: ko for ko in kos}
            mods.update({ko.stem: ko for ko in vm.parent.glob("*.ko")})
            placed = tuple((name, str(mods[name]), tuple(sorted(secs.items())))
                           for name, secs in sorted(module_sections(out).items()) if name in mods)
            return Native(vm, smap, mods, placed)
    where = f"{vmlinux} (with System.map beside it)" if vmlinux else "the kernels tandem built (./tandem build)"
    raise TandemError(f"{d}: no vmlinux of {where} printed the native's banner "
                      f"{said.group(0)[:100].decode(errors='replace')!r}: give its vmlinux with --vmlinux")


def module_offsets(vmlinux: Path, kern: Kernel) -> tuple[int, int]:
    """(offset of name, offset of kallsyms) in struct module, from the DWARF of the unit
    that holds do_init_module."""
    try:
        with open(vmlinux, "rb") as f:
            elf = ELFFile(f)
            if not elf.has_dwarf_info():
                raise TandemError(f"{vmlinux}: no debug info: where a module was loaded cannot be read")
            a = kern.function(LOADER).addr
            name = member_offset(elf, a, b"main.c", b"module", b"name")
            syms = member_offset(elf, a, b"main.c", b"module", b"kallsyms")
    except (OSError, ELFError) as e:
        raise TandemError(f"{vmlinux}: cannot read its debug info ({e})") from None
    if name is None or syms is None:
        raise TandemError(f"{vmlinux}: struct module has no name or kallsyms (CONFIG_KALLSYMS is needed)")
    return name, syms


def placed_module(client, rdi: int, want: str, ko: Path, offsets: tuple[int, int]) -> tuple | None:
    """At do_init_module's entry: when the module being initialised (rdi) is `want`, its
    ((section, address), ...), from the symbol table the loader filled; else None."""
    name_off, ksyms_off = offsets
    raw = client.mem(rdi + name_off, 56)
    if raw is None or raw.split(b"\0", 1)[0].decode(errors="replace") != want:
        return None
    ptr = client.mem(rdi + ksyms_off, 8)
    head = client.mem(int.from_bytes(ptr, "little"), 24) if ptr else None
    if head is None:
        return None
    symtab, num, strtab = struct.unpack("<QI4xQ", head)
    table = client.mem(symtab, num * ELF64_SYM.size) if 0 < num < 1 << 16 else None
    if table is None:
        return None
    loaded: dict[str, tuple[int, int]] = {}       # name -> (address, size)
    for i in range(num):
        st_name, _, _, _, value, size = ELF64_SYM.unpack_from(table, i * ELF64_SYM.size)
        name = client.mem(strtab + st_name, 128)
        if name:
            loaded.setdefault(name.split(b"\0", 1)[0].decode(errors="replace"), (value, size))
    bases: dict[str, int] = {}
    differ = []
    with open(ko, "rb") as f:
        elf = ELFFile(f)
        secs = list(elf.iter_sections())
        symtab_sec = elf.get_section_by_name(".symtab")
        for sym in symtab_sec.iter_symbols() if symtab_sec else ():
            ndx = sym["st_shndx"]
            kind = sym["st_info"]["type"]
            if sym.name in loaded and isinstance(ndx, int) and kind in ("STT_FUNC", "STT_OBJECT"):
                bases.setdefault(secs[ndx].name, loaded[sym.name][0] - sym["st_value"])
                if kind == "STT_FUNC" and loaded[sym.name][1] != sym["st_size"]:
                    differ.append(sym.name)
    if differ:
        raise TandemError(f"{ko}: not the {want}.ko the native loaded ({len(differ)} functions differ in size, "
                          f"{differ[0]} first): rebuild it (./tandem build) or give the native's kernel "
                          f"directory, with its modules, through --vmlinux")
    return tuple(sorted(bases.items()))


def describe_pc(d: Path, pc: int, vmlinux: Path | None = None) -> str:
    """A program counter of the native in d as a symbol of its kernel ("default_idle+0x13/0x15"),
    or a sentence saying why it is not named."""
    try:
        kern = find(d, vmlinux).load()
    except TandemError as e:
        return f"not named: {e}"
    name = kern.describe(pc)
    if name != f"{pc:#x}":
        return name
    return "not in the kernel's symbols" + (" (user space)" if pc < 1 << 63 else "")
