"""The assertion event source: an exact replay with the tandem-calls TCG plugin.

    kern = kernel_for_bundle(bundle)                  # vmlinux + the modules it loaded
    p = plan(kern, aset.needed(), aset.sites())       # watched addresses
    t = run(bundle, kern, p)                          # replay + decode: t.events

The plan turns what an assertion set needs into instruction addresses: a function's
entry (call events, and a shadow frame when its return is needed), its exit
instructions (kernel.Kernel.exits: rets, also through tail calls) and assertion
sites (symbol+offset, checked to be an instruction boundary). The plugin
(replay/plugins/tandem-calls.c) instruments only those instructions and writes
a binary stream, decoded here into events.Event. The replay's own verdict says
whether the plugin left the replay exact.
"""
from __future__ import annotations

import shutil
import struct
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .. import artifacts, private
from ..errors import InfraError, TandemError
from ..exact.replay import Verdict, replay
from ..formats import bundle, pcapng
from ..machine import ICOUNT_SHIFT
from .events import Event
from .kernel import Func, Kernel, comm_offset, kld_bases, kld_sections, module_sections
from .kernel import load as load_kernel

MAGIC = b"TDMCALL1"
HEADER = struct.Struct("<8sII")
RECORD = struct.Struct("<BBHIQQQQ6QQQQ16s")
KINDS = {1: "call", 2: "return", 3: "site"}
END = 0xEE
STACK_SCAN_WORDS = 128       # stack words the plugin reads at each event (1 KiB)


class TraceError(InfraError):
    """The plugin's event stream is missing, damaged or cut short."""


@dataclass
class Plan:
    """What the plugin watches: `lines` of its watch file, and names for its ids."""
    funcs: list[Func]                    # id -> function (call and return events)
    sites: list[tuple[str, int]]         # id -> (symbol, offset)
    lines: list[str]
    notes: list[str] = field(default_factory=list)
    exits: int = 0

    def site_name(self, i: int) -> str:
        sym, off = self.sites[i]
        return f"{sym}+{off:#x}"

    def write(self, path: Path) -> None:
        path.write_text("".join(line + "\n" for line in self.lines))


def plan(kern: Kernel, needed: dict[str, set[str]], sites: Sequence[tuple[str, int]] = ()) -> Plan:
    """Watch points for the symbols an assertion set needs ("call", "return") and its sites."""
    funcs: list[Func] = []
    roles: dict[int, list[tuple[str, int]]] = {}
    exit_addrs: set[int] = set()
    after_addrs: set[int] = set()
    notes: list[str] = []
    for name in sorted(needed):
        kinds = set(needed[name])
        bad = kinds - {"call", "return"}
        if bad:
            raise TandemError(f"{name}: unknown event kind(s) {', '.join(sorted(bad))}")
        f = kern.function(name)
        fid = len(funcs)
        funcs.append(f)
        flags = ("c" if "call" in kinds else "") + ("r" if "return" in kinds else "")
        roles.setdefault(f.addr, []).append((flags, fid))
        if "return" in kinds:
            ex, why = kern.exits(f)
            after = kern.call_sites(f) if why else []
            if not ex and not after:
                raise TandemError(f"{name}: no return instruction found (not even through tail calls): "
                                  f"its returns cannot be watched")
            exit_addrs |= ex
            # It may leave through an indirect tail call: its direct callers' return
            # addresses are watched too (indirect callers: see docs/assertions-running.md).
            after_addrs.update(after)
            notes += [f"{name} may return through an indirect jump ({w}): the return addresses "
                      f"of its {len(after)} direct calls are watched too" for w in why]
    site_list = list(dict.fromkeys(sites))
    for sid, (sym, off) in enumerate(site_list):
        roles.setdefault(site_address(kern, sym, off), []).append(("s", sid))
    for a in exit_addrs:
        roles.setdefault(a, []).append(("x", 0))
    for a in after_addrs:
        roles.setdefault(a, []).append(("a", 0))
    lines = [f"{a:x} {flags} {i}" for a in sorted(roles) for flags, i in roles[a]]
    return Plan(funcs, site_list, lines, notes, len(exit_addrs))


def site_address(kern: Kernel, sym: str, off: int) -> int:
    """The address of an assertion site symbol+offset: an instruction of the function."""
    f = kern.function(sym)
    if not 0 <= off < f.size:
        raise TandemError(f"{sym}+{off:#x}: outside {sym} (size {f.size:#x})")
    if f.addr + off not in {i.address for i in kern.instructions(f)}:
        raise TandemError(f"{sym}+{off:#x}: not at an instruction boundary of {sym}")
    return f.addr + off


# --- the kernel a bundle ran -----------------------------------------------------


def kernel_for_bundle(bundle_dir: str | Path) -> Kernel:
    """vmlinux next to the recorded bzImage, and the modules /init loaded (their
    addresses from the recorded console, their .ko from the module build whose
    cpio the recorded initrd ends with; a FreeBSD kernel's KLDs beside it)."""
    d = Path(bundle_dir)
    m = bundle.load_manifest(d)
    kpath = Path(m.input_paths.get("kernel", ""))
    # Linux's vmlinux, or FreeBSD's kernel.debug (scripts/build-freebsd.sh)
    vmlinux = next((p for p in (kpath.parent / "vmlinux", kpath.parent / "kernel.debug") if p.is_file()),
                   kpath.parent / "vmlinux")
    smap, config = kpath.parent / "System.map", kpath.parent / "config"
    if not vmlinux.is_file() or not smap.is_file():
        raise TandemError(f"{d}: its kernel {kpath} has no vmlinux (or kernel.debug) and System.map "
                          f"next to it (its code is named from its symbols: record a built kernel flavor)")
    if config.is_file() and "\nCONFIG_SMP=y" in config.read_text():
        raise TandemError(f"{config}: an SMP kernel (the current task is per CPU): "
                          f"assertions support uniprocessor kernels only")
    console = pcapng.console(d / bundle.DEVLOG)
    sections = module_sections(console)
    mods = []
    if sections:
        initrd = Path(m.input_paths.get("initrd", ""))
        kos = _module_build(initrd)
        for name, secs in sorted(sections.items()):
            ko = kos.get(name)
            if ko is None:
                raise TandemError(f"{d}: module {name} was loaded but no module build in "
                                  f"{artifacts.cache_dir() / 'modules'} matches its initrd {initrd}")
            mods.append((name, str(ko), tuple(sorted(secs.items()))))
    for name, base in sorted(kld_bases(console).items()):     # FreeBSD: the KLDs built with the kernel
        ko = kpath.parent / f"{name}.ko"
        if not ko.is_file():
            raise TandemError(f"{d}: KLD {name} was loaded but its kernel {kpath} has no {name}.ko beside it")
        mods.append((name, str(ko), tuple(sorted(kld_sections(ko, base).items()))))
    # FreeBSD's kernel.debug has no code: the recorded kernel has it
    return load_kernel(str(vmlinux), str(smap), tuple(mods), str(kpath) if vmlinux.name == "kernel.debug" else None)


def _module_build(initrd: Path) -> dict[str, Path]:
    """{module name: .ko with debug info} of the module build appended to this initrd."""
    try:
        data = initrd.read_bytes()
    except OSError as e:
        raise TandemError(f"{initrd}: the recorded initrd is unreadable ({e})") from None
    for cpio in sorted((artifacts.cache_dir() / "modules").glob("*/modules.cpio.gz")):
        tail = cpio.read_bytes()
        if tail and data.endswith(tail):
            return {ko.stem: ko for ko in cpio.parent.glob("*.ko")}
    return {}


# --- running and decoding ----------------------------------------------------------


@dataclass
class Trace:
    events: list[Event]
    comms: list[str]             # per event: the task's comm ("" if not read)
    exact: list[tuple[int, bool]]   # per event: (stack entries found by ORC, ORC reached the end)
    verdict: Verdict
    stats: dict
    plan: Plan
    wall_s: float


def plugin_args(kern: Kernel, p: Plan, watch: Path, out: Path, scan: int = STACK_SCAN_WORDS) -> str:
    return ",".join([artifacts.plugin_calls()["plugin"], f"watch={watch}", f"out={out}",
                     f"task={current_thread(kern)}", f"comm={comm_offset(kern.vmlinux) or 0}",
                     f"scan={scan}"])


def current_thread(kern: Kernel) -> str:
    """Where the plugin reads the current thread's pointer: Linux's pcpu_hot (a UP
    kernel's current_task, its first word), FreeBSD's gs:0 (the CPU's struct pcpu, whose
    first member is pc_curthread; __pcpu names the array of them)."""
    syms = kern.symbols()
    if "pcpu_hot" in syms:
        return f"{syms['pcpu_hot']:#x}"
    if "__pcpu" in syms:
        return "gs:0"
    raise TandemError(f"{kern.vmlinux}: neither pcpu_hot (Linux) nor __pcpu (FreeBSD): "
                      f"where its current thread is is unknown")


def run(bundle_dir: str | Path, kern: Kernel, p: Plan, *, progress=None,
        keep: Path | None = None, scan: int = STACK_SCAN_WORDS, extra: Sequence[str] = ()) -> Trace:
    """Replay the bundle exactly with the plugin watching `p`; decode its events.
    extra: more QEMU arguments (another plugin: explain/)."""
    tmp = Path(tempfile.mkdtemp(prefix="tandem-trace-"))
    try:
        watch, out = tmp / "watch.txt", tmp / "events.bin"
        p.write(watch)
        t0 = time.monotonic()
        verdict = replay(bundle_dir, progress=progress,
                         extra=["-plugin", plugin_args(kern, p, watch, out, scan), *extra])
        wall = time.monotonic() - t0
        if keep:
            private.copy_file(out, keep)
        events, comms, exact, stats = decode(out, p, kern)
        return Trace(events, comms, exact, verdict, stats, p, wall)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_records(path: Path):
    """(records, end): records as (type, back, id, icount, vm_ns, pc, task, args, ret,
    sp, bp, comm, stack words from sp up); end is the END record's counters."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TraceError(f"{path}: no event stream ({e}): did the plugin load?") from None
    if len(data) < HEADER.size:
        raise TraceError(f"{path}: event stream has no header ({len(data)} bytes)")
    magic, version, size = HEADER.unpack_from(data)
    if magic != MAGIC or version != 1 or size != RECORD.size:
        raise TraceError(f"{path}: not a tandem-calls v1 event stream "
                         f"(magic {magic!r}, version {version}, record size {size})")
    records, off, end = [], HEADER.size, None
    while off < len(data):
        if off + RECORD.size > len(data):
            break
        (typ, nstack, back, ident, icount, vm_ns, pc, task, a0, a1, a2, a3, a4, a5,
         ret, sp, bp, comm) = RECORD.unpack_from(data, off)
        nxt = off + RECORD.size + 8 * nstack
        if nxt > len(data):
            break
        if typ == END:
            end = {"events": a0, "abandoned_frames": a1, "open_frames": a2, "read_failures": a3,
                   "depth_overflows": a4, "callbacks": a5, "callback_ns": ret, "translate_ns": sp}
            off = nxt
            break
        if typ not in KINDS:
            raise TraceError(f"{path}: unknown record type {typ} at offset {off}")
        stack = struct.unpack_from(f"<{nstack}Q", data, off + RECORD.size) if nstack else ()
        records.append((typ, back, ident, icount, vm_ns, pc, task, (a0, a1, a2, a3, a4, a5),
                        ret, sp, bp, comm, stack))
        off = nxt
    if end is None:
        raise TraceError(f"{path}: event stream cut short at offset {off} after {len(records)} "
                         f"events (no END record: QEMU did not exit cleanly)")
    if off != len(data) or end["events"] != len(records):
        raise TraceError(f"{path}: event stream damaged: END says {end['events']} events, "
                         f"{len(records)} read, {len(data) - off} bytes after END")
    return records, end


def decode(path: Path, p: Plan, kern: Kernel | None = None) -> tuple[list[Event], list[str], list, dict]:
    """The plugin's stream as Events, with each event's comm and (how many of its stack
    entries the ORC unwinder found, whether it reached the end of the kernel stack); the
    entries after the ORC ones are return-address-like stack words.
    Instruction count and VM time are corrected from the end of the event's TB to its
    instruction. Without kern, stacks are left empty."""
    records, end = read_records(path)
    events, comms, exact = [], [], []
    unwound: dict[tuple, tuple[list[int], int, bool]] = {}
    for typ, back, ident, icount, vm_ns, pc, task, args, ret, sp, bp, comm, words in records:
        kind = KINDS[typ]
        if kind == "site":
            if ident >= len(p.sites):
                raise TraceError(f"{path}: site id {ident} not in the plan")
            func = p.site_name(ident)
        else:
            if ident >= len(p.funcs):
                raise TraceError(f"{path}: function id {ident} not in the plan")
            func = p.funcs[ident].name
        stack: tuple[int, ...] = ()
        n: tuple[int, bool] = (0, False)    # (frames the unwinder found exactly, to the end)
        if kern is not None:
            key = (pc, sp, bp, words)       # loops repeat the same stacks: unwind once
            if key not in unwound:
                unwound[key] = kern.unwind(pc, sp, bp, words)
            frames, exact_n, to_end = unwound[key]
            stack, n = tuple(frames), (exact_n, to_end)
        events.append(Event(kind, func, args, ret if kind == "return" else None, task,
                            vm_ns - (back << ICOUNT_SHIFT), icount - back, pc, stack))
        comms.append(comm.split(b"\0", 1)[0].decode(errors="replace"))
        exact.append(n)
    return events, comms, exact, end
