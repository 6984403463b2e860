"""Source locations of a report's frames, from the kernel's DWARF (via addr2line).

Symbol addresses come from the ELF symbol table (pyelftools); file:line from
binutils' addr2line, which reads DWARF 5 quickly. Both are cached per vmlinux.
A vmlinux without debug info (or no addr2line) leaves locations empty.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from functools import lru_cache
from collections.abc import Sequence
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

# " func+0x12/0x40", "[<ffffffff81234567>] func+0x12/0x40", "RIP: 0010:func+0x12/0x40",
# and a bare "[<ffffffff81234567>]".
_FRAME = re.compile(r"(?P<rip>^(?:RIP|IP): (?:[0-9a-f]{4}:)?)?(?:\[<(?P<addr>[0-9a-f]+)>\]\s*)?"
                    r"(?:(?P<name>[A-Za-z_][\w.]*)\+0x(?P<off>[0-9a-f]+)(?:/0x(?P<size>[0-9a-f]+))?)?")
# FreeBSD's stack(9): "#2 0xffffffff809fd643 at tb_note_store+0xd3". Its address is what is
# symbolized: a kernel booted without its loader names a static function after the global
# symbol before it (tb_sysctl as "tb_stats_reset+0x194"), its DWARF by its own name.
# A frame in a KLD (the planted bugs) is named right by the kernel linker, which has the
# module's own symbols: its name and offset are symbolized in the module's .ko.
_BSD_FRAME = re.compile(r"^#\d+ 0x(?P<addr>[0-9a-f]+) at (?P<name>[A-Za-z_][\w.]*)\+0x(?P<off>[0-9a-f]+)")
# FreeBSD's ddb backtrace (a panic's, with DDB): "tb_session_close() at tb_session_close+0x4f/frame 0x...",
# no address: the printed symbol's address plus the offset is the return address all the same.
_DDB_FRAME = re.compile(r"^(?P<name>[A-Za-z_][\w.]*)\(\) at (?P=name)\+0x(?P<off>[0-9a-f]+)/frame ")


class _Symbols:
    """Function symbols of a vmlinux, or of a module (.ko, a relocatable object whose
    symbol values are offsets into their section: addr2line is told the section)."""

    def __init__(self, path: Path):
        self.path = path
        self.by_name: dict[str, list[tuple[int, int]]] = {}
        self.section: dict[str, str] = {}       # module only: function -> its section
        self.has_dwarf = False
        self._cache: dict[tuple[str, int], list[tuple[str, str, int]]] = {}
        try:
            with open(path, "rb") as f:
                elf = ELFFile(f)
                rel = elf["e_type"] == "ET_REL"
                self.has_dwarf = elf.get_section_by_name(".debug_info") is not None
                symtab = elf.get_section_by_name(".symtab")
                for sym in symtab.iter_symbols() if symtab else ():
                    if sym["st_info"]["type"] == "STT_FUNC" and (sym["st_value"] or rel):
                        self.by_name.setdefault(sym.name, []).append((sym["st_value"], sym["st_size"]))
                        if rel and isinstance(sym["st_shndx"], int):
                            self.section[sym.name] = elf.get_section(sym["st_shndx"]).name
        except (OSError, ELFError):
            pass

    def address(self, name: str, off: int, size: int | None) -> int | None:
        cands = self.by_name.get(name)
        if not cands:
            return None
        # Static functions share names: the size printed with the frame picks one.
        start = next((a for a, s in cands if size is not None and s == size), cands[0][0])
        return start + off

    def start_of(self, name: str, pc: int) -> int | None:
        """The start of the function `name` that holds `pc` (statics share names)."""
        return next((a for a, size in self.by_name.get(name, ()) if a <= pc < a + size), None)

    def lines(self, pcs: list[int], section: str = "") -> dict[int, list[tuple[str, str, int]]]:
        todo = sorted({pc for pc in pcs if (section, pc) not in self._cache})
        tool = shutil.which("addr2line")
        if todo and self.has_dwarf and tool:
            sect = ["-j", section] if section else []
            out = subprocess.run([tool, "-f", "-i", "-a", *sect, "-e", str(self.path)] +
                                 [hex(pc) for pc in todo], capture_output=True, text=True, timeout=300).stdout
            self._cache.update({(section, pc): v for pc, v in _parse_addr2line(out).items()})
        for pc in todo:
            self._cache.setdefault((section, pc), [])
        return {pc: self._cache[(section, pc)] for pc in pcs}


def _parse_addr2line(out: str) -> dict[int, list[tuple[str, str, int]]]:
    """addr2line -f -i -a: "0xADDR", then (function, "file:line") pairs, innermost first."""
    result: dict[int, list[tuple[str, str, int]]] = {}
    pc, lines = None, out.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("0x"):
            pc = int(lines[i], 16)
            result[pc] = []
            i += 1
            continue
        func, loc = lines[i], lines[i + 1] if i + 1 < len(lines) else "??:0"
        i += 2
        file, _, line = loc.split(" ", 1)[0].rpartition(":")
        if pc is not None and func != "??" and file != "??" and line.isdigit() and line != "0":
            result[pc].append((func, file, int(line)))
    return result


@lru_cache(maxsize=8)
def _symbols(path: str, mtime: float, size: int) -> _Symbols:
    return _Symbols(Path(path))


def _load(path: Path) -> _Symbols | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return _symbols(str(path.resolve()), st.st_mtime, st.st_size)


def short_path(path: str) -> str:
    """Kernel sources relative to the kernel tree, module sources to this repository."""
    if path.startswith("/usr/src/sys/"):     # FreeBSD's kernels name their sources there
        return path.removeprefix("/usr/src/")
    for marker in ("guest-kernel/", "/linux-src/"):
        if marker in path:
            rest = path.split(marker, 1)[1]
            return marker.strip("/") + "/" + rest if marker == "guest-kernel/" else rest.split("/", 1)[-1]
    return path


def source_lines(path: Path | str, pcs: list[int], section: str = "") -> dict[int, list[tuple[str, str, int]]]:
    """{pc: [(function, file, line), ...] inlined frames first} for code addresses of a
    vmlinux, or of a module's `section` (section-relative); empty lists when unknown."""
    syms = _load(Path(path))
    if syms is None:
        return {pc: [] for pc in pcs}
    return syms.lines(pcs, section)


def symbolize(report, vmlinux: Path | str, modules: Sequence[Path | str] = ()):
    """Fill report.locations for its frames (guilty first); returns the report.
    Frames of out-of-tree modules are found in `modules` (their .ko files). A FreeBSD
    report is first read again with its frames named by the kernel's DWARF (_real_names)."""
    syms = _load(Path(vmlinux))
    if syms is None:
        return report
    text = _real_names(report, syms) if report.os == "freebsd" else report.text
    mods = [m for m in (_load(Path(p)) for p in modules) if m is not None]
    wanted = set(report.frames)
    pcs: list[tuple[str | None, int]] = []      # (the frame's printed name, pc)
    # (symbols, section, pc) for frames found in a module
    in_mods: list[tuple[_Symbols, str, int]] = []

    def in_module(name: str, off: int, size: int | None = None) -> tuple[_Symbols, str, int] | None:
        """(module, section, name+off there) when one of the modules has the function `name`."""
        mod = next((x for x in mods if name in x.by_name), None)
        at = mod.address(name, off, size) if mod is not None else None
        return None if mod is None or at is None else (mod, mod.section.get(name, ".text"), at)

    for line in text.splitlines():
        if b := _BSD_FRAME.match(line.strip()):
            name, back = b.group("name"), int(b.group("addr"), 16)
            if name not in wanted:
                continue
            # a return address: the call is before it
            if syms.start_of(name, back - 1) is None and (hit := in_module(name, int(b.group("off"), 16))):
                in_mods.append((hit[0], hit[1], hit[2] - 1))        # not the kernel's: a KLD's
            else:
                pcs.append((name, back - 1))
            continue
        if d := _DDB_FRAME.match(line.strip()):
            name, off = d.group("name"), int(d.group("off"), 16)
            if name not in wanted:
                continue
            if (ret := syms.address(name, off, None)) is not None:
                pcs.append((name, ret - 1))
            elif hit := in_module(name, off):                           # a KLD's function
                in_mods.append((hit[0], hit[1], hit[2] - 1))
            continue
        m = _FRAME.search(line.strip())
        if not m or not (m.group("name") or m.group("addr")):
            continue
        if m.group("name"):
            if m.group("name").split(".", 1)[0] not in wanted:
                continue
            size = int(m.group("size"), 16) if m.group("size") else None
            pc = syms.address(m.group("name"), int(m.group("off"), 16), size)
            if pc is None:
                if hit := in_module(m.group("name"), int(m.group("off"), 16), size):
                    in_mods.append((hit[0], hit[1], hit[2] if m.group("rip") else hit[2] - 1))
                continue
        else:
            pc = int(m.group("addr"), 16)
        # Stack frames hold return addresses: the call is the instruction before.
        pcs.append((m.group("name"), pc if m.group("rip") else pc - 1))
    found = syms.lines([pc for _, pc in pcs])
    located: list[tuple[tuple[str, str, int], str | None]] = []
    for printed, pc in pcs:
        located += [(loc, printed) for loc in found[pc]]
    for mod, section, pc in in_mods:
        located += [(loc, None) for loc in mod.lines([pc], section)[pc]]
    report.locations = _guilty_first(located, report.frames)
    return report


def _bsd_frames(text: str, syms: _Symbols) -> list[tuple[int, str, int]]:
    """(line index, printed name, return address) of each stack(9) or ddb frame line."""
    out = []
    for i, line in enumerate(text.splitlines()):
        if b := _BSD_FRAME.match(line.strip()):
            out.append((i, b.group("name"), int(b.group("addr"), 16)))
        elif (d := _DDB_FRAME.match(line.strip())) and (
                a := syms.address(d.group("name"), int(d.group("off"), 16), None)) is not None:
            out.append((i, d.group("name"), a))
    return out


def _real_names(report, syms: _Symbols) -> str:
    """A FreeBSD kernel booted without its loader names each static function in its own
    backtraces after the global symbol before it (db_trace_self_wrapper as
    "db_fetch_ksymtab+0x215", tb_sysctl as "tb_stats_reset+0x194"): so its machinery is not
    known as such and its guilty frame may be another function. Each frame is named again
    by the DWARF function holding its call, and the report's type, title and frames are
    read again from those lines; they are returned (the report's text stays as the
    console had it)."""
    from .scanner import Scanner
    frames = _bsd_frames(report.text, syms)
    found = syms.lines([ret - 1 for _, _, ret in frames])
    lines = report.text.splitlines()
    renamed = False
    for i, printed, ret in frames:
        real = found[ret - 1][-1][0] if found[ret - 1] else printed      # the outermost: not inlined
        start = syms.start_of(real, ret - 1)
        if real != printed and start is not None:
            p, at = re.escape(printed), f"at {real}+{ret - start:#x}"
            lines[i] = re.sub(rf"\b{p}\(\) at {p}\+0x[0-9a-f]+", f"{real}() {at}", lines[i])     # ddb
            lines[i] = re.sub(rf"\bat {p}\+0x[0-9a-f]+", at, lines[i])                          # stack(9)
            renamed = True
    text = "\n".join(lines) + "\n"
    scanner = Scanner(report.os)
    again = scanner.feed(text) + scanner.flush() if renamed else []
    if again:
        report.type, report.title, report.frames = again[0].type, again[0].title, again[0].frames
    return text


def _guilty_first(located: list[tuple[tuple[str, str, int], str | None]],
                  frames: list[str]) -> list[tuple[str, str, int]]:
    """Each location once, in the order of the report's frames: by its function's name, or
    else by the frame it was found under (an inlined function, a misnamed static one)."""
    order = {name: i for i, name in reversed(list(enumerate(frames)))}

    def rank(lp: tuple[tuple[str, str, int], str | None]) -> float:
        (func, _, _), printed = lp
        return order[func] if func in order else order.get(printed or "", len(frames)) + 0.5
    ranked = sorted(located, key=rank)
    return list(dict.fromkeys(loc for loc, _ in ranked))
