"""The one list of analyses tandem runs: each once, with everything that differs between them.

Whatever names an analysis reads it from here: the CLI's choices and help, the demo,
`tandem shadow` and `tandem attach`, the guest's defaults, the equivalence spec and the
build. Adding one is one entry below and docs, and a kernel config fragment
(guest-kernel/linux/FLAVOR.config) when it needs its own kernel; `guest-kernel/linux/FLAVORS`
lists the kernel flavors for meson, and tests/unit/test_catalog.py checks that it, the
config fragments and this list agree.

Kernel flavors and userlands are tables of their own because `tandem record --kernel
--userland` boots any pair of them, not only the pairs an analysis names.

Nothing here imports the rest of tandem: every stage reads it, it reads none of them.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .errors import TandemError

# Sanitizer output is reported as findings, not as divergences: an ASan-built userland
# prints its reports on the console the native's never has. Possessive repeats: a spec's
# patterns run on guest lines and must not backtrack (equivalence.py's load check).
SANITIZER_LINES = (r"^==\d+==", r"^\s*+#\d++ 0x[0-9a-f]++ ", r"runtime error:", r"^SUMMARY: ",
                   r"^(Shadow|Address|  )", r"^=+$")


# The guest OSes a kernel may run (report.OSES has a console dialect for each).
GUEST_OSES = ("linux", "freebsd", "openbsd", "netbsd")


@dataclass(frozen=True)
class Kernel:
    """A guest kernel the build makes (guest-kernel/linux/FLAVOR.config over the base) or
    takes from Debian (FLAVOR.debian: scripts/debian-kernel.sh)."""
    flavor: str
    cmdline_extra: str = ""     # appended to the guest's kernel command line
    memory_mb: int = 256        # the guest needs at least this much memory under it
    os: str = "linux"           # the guest OS, whose console dialect report.parse reads
    # A kernel the user brought (tandem replay --analysis-kernel): its bzImage, booted as it
    # is, and its vmlinux for symbolizing reports (None: reports keep addresses only).
    image: str | None = None
    vmlinux: str | None = None
    # Whether it runs more than one CPU: tandem's Linux flavors are built without SMP
    # (guest-kernel/linux/base.config: one CPU, so a replay into them is deterministic and
    # the assertions read fixed addresses); Debian's, FreeBSD's and a user's have it.
    smp: bool = True


@dataclass(frozen=True)
class Userland:
    """A guest image's userland (agent/: the image builder's initramfs_NAME)."""
    name: str
    cmdline_extra: str = ""


@dataclass(frozen=True)
class Analysis:
    """One analysis: what it boots, and what it may print that the native does not."""
    name: str
    kernel: Kernel
    summary: str                # one line, for --help and the docs
    userland: Userland = Userland("native")
    # built-in spec rules (docs/equivalence.md): channel -> its table, as a spec file has it
    equivalence: dict[str, dict[str, object]] = field(default_factory=dict, hash=False)
    # Files swapped into the guest's userland (tandem replay --overlay): a directory whose
    # tree is copied over the guest's root before the analysis boots (semantic/overlay.py).
    overlay: str | None = None
    # In `tandem demo`'s replay: the kernel sanitizers on memory and locking in one kernel
    # (debug: KASAN and lockdep, as syzbot's kernels) and a sanitized userland. Each kernel
    # more is 700-1,000 s of CPU on a cold 2-core machine, about 6-8 minutes of the demo
    # (docs/benchmarks.md, cold setup): kasan and lockdep apart, ubsan and kcsan are one
    # `tandem replay BUNDLE --analysis` away, built then.
    demo: bool = True

    @property
    def flavor(self) -> str:
        return self.kernel.flavor

    @property
    def os(self) -> str:
        return self.kernel.os


# kasan_multi_shot: report every bug, not only the first one of the boot; KASAN's shadow
# memory and quarantine need the extra memory.
KERNELS = {k.flavor: k for k in (
    Kernel("native", smp=False),
    Kernel("kasan", cmdline_extra="kasan_multi_shot", memory_mb=512, smp=False),
    Kernel("ubsan", smp=False),
    Kernel("lockdep", smp=False),
    Kernel("kcsan", smp=False),
    Kernel("debug", cmdline_extra="kasan_multi_shot", memory_mb=512, smp=False),
    # Debian's own 6.12 kernel (linux-image-cloud-amd64), fetched in seconds where a kernel
    # compiled here costs 600-700 s of CPU on 2 cores: what the demo guest runs unless told.
    Kernel("stock"),
    # FreeBSD kernels from the user's source tree (guest-kernel/freebsd/TANDEM-*,
    # scripts/build-freebsd.sh): the production one, INVARIANTS and WITNESS on it, KASAN on
    # that. They boot the FreeBSD demo guest (machine.Guest.of_image) or a FreeBSD VM of
    # the user's. KASAN's shadow is an eighth of memory, and the debug kernel's zones are
    # split (MALLOC_DEBUG_MAXZONES): 512 MiB under each.
    Kernel("freebsd-native", memory_mb=512, os="freebsd"),
    Kernel("freebsd-debug", memory_mb=512, os="freebsd"),
    Kernel("freebsd-kasan", memory_mb=512, os="freebsd"),
)}
# The demo guest's kernel when none is named (tandem record, shadow, the demo): a
# distribution's, as the production VMs tandem records run; the analyses run sanitizer
# builds of the same source.
DEFAULT_KERNEL = "stock"
# ... and when the recording declares temporal assertions: `tandem assert` reads this
# kernel's vmlinux at its link addresses (no KASLR, one CPU, full DWARF), which Debian's
# kernel has not beside it.
ASSERTIONS_KERNEL = "native"
USERLANDS = {u.name: u for u in (Userland("native"), Userland("asan", cmdline_extra="tandem.asan=1"))}

ALL = (
    Analysis("native", KERNELS["native"], "the native kernel on the semantic path, the noise baseline"),
    Analysis("kasan", KERNELS["kasan"], "KASAN: out-of-bounds and use-after-free in the kernel", demo=False),
    Analysis("ubsan", KERNELS["ubsan"], "UBSAN: undefined behaviour in the kernel", demo=False),
    Analysis("lockdep", KERNELS["lockdep"], "lockdep: lock-order and lock-usage bugs in the kernel",
             demo=False),
    Analysis("kcsan", KERNELS["kcsan"], "KCSAN: data races in the kernel (task against interrupt, one CPU)",
             demo=False),
    # kasan and lockdep in one kernel, as syzbot's: one compile for the demo, where the two
    # apart are two; a replay into it takes 1.5x kasan's (docs/benchmarks.md, cold setup).
    Analysis("debug", KERNELS["debug"], "KASAN and lockdep in one kernel, as syzbot's: memory errors "
             "and lock-order bugs in the kernel"),
    Analysis("asan-userland", KERNELS[DEFAULT_KERNEL], "ASan-built guest services: memory errors in userland",
             userland=USERLANDS["asan"], equivalence={"serial": {"ignore": list(SANITIZER_LINES)}}),
    # A FreeBSD guest's: its native (the noise run) and the kernel's own checks.
    Analysis("freebsd-native", KERNELS["freebsd-native"], "FreeBSD's production kernel on the semantic path, "
             "a FreeBSD guest's noise baseline", demo=False),
    Analysis("freebsd-debug", KERNELS["freebsd-debug"], "FreeBSD INVARIANTS and WITNESS: the kernel's own "
             "assertions and lock-order checking", demo=False),
    Analysis("freebsd-kasan", KERNELS["freebsd-kasan"], "FreeBSD KASAN (with INVARIANTS and WITNESS): "
             "out-of-bounds and use-after-free in the kernel", demo=False),
)
# The built-in analyses by name, read only: the CLI resolves the names it is given here
# (get) and hands the stages Analysis values; an analysis of the user's (brought_kernel,
# with_overlay) is made there too and never written here.
ANALYSES: Mapping[str, Analysis] = MappingProxyType({a.name: a for a in ALL})
# The native kernel on the semantic path: the noise run every analysis is split by.
NATIVE = ANALYSES["native"]
# Linux kernel flavors the build makes (guest-kernel/linux/FLAVORS says the same, for
# meson), and FreeBSD's (meson.build's kernel-freebsd-* targets).
FLAVORS = tuple(f for f, k in KERNELS.items() if k.os == "linux")
FREEBSD_FLAVORS = tuple(f for f, k in KERNELS.items() if k.os == "freebsd")
# Each guest OS's native kernel: the noise run of a recording of its demo guest when the
# kernel it was recorded on is not known, and of a user's VM.
OS_NATIVE = {"linux": "native", "freebsd": "freebsd-native"}


def native_on(kernel: Kernel) -> Analysis:
    """The native on the semantic path, booting `kernel`: the noise run of a recording of the
    demo guest made on that kernel (tandem record --kernel), so that what differs from the
    recording is what the analyses' kernels change, not the kernel it was recorded on."""
    return NATIVE if kernel == NATIVE.kernel else dataclasses.replace(
        NATIVE, kernel=kernel, summary=f"the {kernel.flavor} kernel on the semantic path, the noise baseline")


def get(name: str, known: Mapping[str, Analysis] = ANALYSES) -> Analysis:
    """The analysis called name among `known` (default: the built-in ones; the CLI adds the
    user's); an unknown name is a one-line error listing the known ones."""
    try:
        return known[name]
    except (KeyError, TypeError):
        raise TandemError(f"unknown analysis {name!r} (known: {', '.join(known)})") from None


# What a user may call an analysis of their own: it names files in the analysis's work
# directory (NAME.tdm, NAME-console.log).
USER_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,39}")


def check_name(name: str) -> None:
    """A name fit for an analysis of the user's, or a one-line error."""
    if not USER_NAME.fullmatch(name):
        raise TandemError(f"analysis name {name!r}: use lower-case letters, digits, '.', '_' and '-' (it names files)")
    if name in {a.name for a in ALL}:
        raise TandemError(f"analysis name {name!r}: a built-in analysis has it; call yours otherwise")


def brought_kernel(name: str, image: str, vmlinux: str | None = None, os: str = "linux") -> Analysis:
    """An analysis that boots the user's own kernel of that OS (checked by the caller:
    qemu.kernel_image), with at least the memory tandem's native kernel of a FreeBSD guest has."""
    memory = KERNELS[OS_NATIVE[os]].memory_mb if os == "freebsd" else Kernel.memory_mb
    return Analysis(name, Kernel(name, memory_mb=memory, os=os, image=image, vmlinux=vmlinux), f"your kernel {image}",
                    demo=False)


def with_overlay(name: str, base: Analysis, overlay: str) -> Analysis:
    """An analysis that is `base` with the files under `overlay` swapped into the guest."""
    return dataclasses.replace(base, name=name, overlay=overlay, demo=False,
                               summary=f"{base.name} with the files of {overlay} in the guest")


def kernel(flavor: str) -> Kernel:
    try:
        return KERNELS[flavor]
    except (KeyError, TypeError):
        raise TandemError(f"unknown kernel flavor {flavor!r} (known: {', '.join(KERNELS)})") from None


def userland(name: str) -> Userland:
    try:
        return USERLANDS[name]
    except (KeyError, TypeError):
        raise TandemError(f"unknown userland {name!r} (known: {', '.join(USERLANDS)})") from None


def help_lines() -> str:
    """name: summary, one per analysis, for --help."""
    return "; ".join(f"{a.name} ({a.summary})" for a in ALL)


def demo_analyses() -> list[Analysis]:
    """The analyses `tandem demo` replays into (the native kernel is its noise run)."""
    return [a for a in ALL if a.demo and a != NATIVE]


def build_targets(analyses: Iterable[Analysis]) -> list[str]:
    """The build targets these analyses run on (QEMU, the demo guest's image, and each
    catalogue kernel with its modules; a kernel the user brought needs no build)."""
    out = ["qemu"]
    for a in analyses:
        if a.os == "linux" and "guest" not in out:
            out.append("guest")
        if a.kernel.image is None:
            out += [t for t in kernel_targets(a.kernel) if t not in out]
    return out


def kernel_targets(k: Kernel) -> list[str]:
    """The build targets a catalogue kernel is: a Linux kernel and its modules; a FreeBSD
    kernel and the FreeBSD demo guest's root (built in seconds once the toolchain is)."""
    if k.os == "freebsd":
        return [f"kernel-{k.flavor}", "freebsd-guest"]
    return [f"kernel-{k.flavor}", f"modules-{k.flavor}"]


def demo_build_targets() -> list[str]:
    """The build targets the demo's analyses need beyond recording (their kernels)."""
    flavors = dict.fromkeys(a.flavor for a in demo_analyses())
    return [t for f in flavors if f != DEFAULT_KERNEL for t in (f"kernel-{f}", f"modules-{f}")]
