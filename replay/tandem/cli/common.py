"""What the commands share: durations on the command line, progress lines, analysis lists.

Analyses are named on the command line and resolved here, once: every stage below takes
catalog.Analysis values (a built-in one, or one the user defines with --analysis-kernel
or --overlay, which exists only in this run) and writes their names in its outputs.
"""
from __future__ import annotations

import argparse
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

from .. import catalog
from ..errors import TandemError

log = logging.getLogger(__name__)


def parse_duration(text: str) -> int:
    """'10s', '500ms', '2m' or plain seconds -> nanoseconds of VM time."""
    units = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000}
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            num, mult = text[: -len(suffix)], units[suffix]
            break
    else:
        num, mult = text, units["s"]
    try:
        value = float(num)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (try 10s, 500ms, 2m)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"duration must be positive: {text!r}")
    return int(value * mult)


def progress(label: str, status):
    def show(st: dict):
        if st:
            status.update(f"{label}: VM time {st.get('vm-clock-ns', 0) / 1e9:7.2f}s, "
                          f"{st.get('events', 0)} device log records, "
                          f"{st.get('icount', 0) / 1e6:,.0f}M instructions")
    return show


def analysis_names(items: list[str] | None) -> list[str]:
    """--analysis values, repeatable and comma-separated, as one list."""
    return [a for item in items or [] for a in item.split(",") if a]


def catalogued(items: list[str] | None) -> list[catalog.Analysis]:
    """--analysis values as the built-in analyses they name (an unknown name: one-line error)."""
    return [catalog.get(name) for name in analysis_names(items)]


def add_mode_option(p: argparse.ArgumentParser) -> None:
    """--mode: how the native is recorded (record.recording.RecordMode)."""
    p.add_argument("--mode", choices=("exact", "device"), default="exact",
                   help="exact (default): QEMU's record/replay under -icount, TCG, the vCPUs in turns on "
                        "one host thread, replayed exactly; device: the device log alone, any --smp, "
                        "multi-threaded TCG or KVM, replayed semantically and shadowed, never exactly")


def add_analysis_vcpus_option(p: argparse.ArgumentParser) -> None:
    """--analysis-vcpus: one vCPU per analysis VM, or as many as the native had."""
    p.add_argument("--analysis-vcpus", choices=("one", "native"), default="one",
                   help="one (default): each analysis VM runs one vCPU; native: as many as the native "
                        "had (its --smp), in turns on one host thread, closer to it; either way recorded "
                        "and reproducible exactly")


def add_stop_option(p: argparse.ArgumentParser) -> None:
    """--stop: what Ctrl-C (or SIGTERM) does to the recorded VM, in libvirt's terms."""
    p.add_argument("--stop", choices=["powerdown", "quit"], default="powerdown",
                   help="powerdown (default): the first Ctrl-C or SIGTERM presses the guest's ACPI power button "
                        "and waits --shutdown-timeout for it to power off (as virsh shutdown; stop reason "
                        "'poweroff'), a second quits at once (as virsh destroy; 'interrupt'); quit: the first "
                        "quits at once")
    p.add_argument("--shutdown-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="with --stop powerdown: wall seconds to wait for the guest to power off after its power "
                        "button before quitting it (default 60; libvirt-guests bounds its own wait with "
                        "SHUTDOWN_TIMEOUT)")


def add_gate_options(p: argparse.ArgumentParser) -> None:
    """What a live run does when an analysis falls behind (its buffer, --overflow) and when
    the native's outputs leave (--release, checked under --spec): shadow's and attach's."""
    p.add_argument("--buffer-events", type=int, default=100_000,
                   help="inputs an analysis may trail by (default 100000); over that, --overflow applies")
    p.add_argument("--buffer-bytes", type=int, default=64 << 20,
                   help="bytes of inputs an analysis may trail by (default 64 MiB); over that, --overflow applies")
    p.add_argument("--overflow", choices=["detach", "block"], default="detach",
                   help="an analysis whose buffer is full: detach it and go on (default), or block: hold "
                        "the native's incoming frames until it has room, for at most --block-budget")
    p.add_argument("--block-budget", type=float, default=10.0, metavar="SECONDS",
                   help="with --overflow block: wall time the native may be held at a stretch before "
                        "the analysis is detached after all (default 10)")
    p.add_argument("--release", choices=["now", "agreed"], default="now",
                   help="now: the native's outputs leave at once (default); agreed: each network output "
                        "leaves only once every analysis produced the same one")
    p.add_argument("--agree-timeout", type=parse_duration, default=2_000_000_000,
                   help="with --release agreed: VM time an analysis may take to answer before the "
                        "output is released without it (default 2s)")
    p.add_argument("--spec", help="equivalence spec (TOML, docs/equivalence.md) for comparing outputs and "
                   "for --release agreed (default: the built-in rules, and for tandem's demo guest its "
                   "service's, agent/kvd.equiv.toml)")


def gate_options(args: argparse.Namespace) -> dict:
    """add_gate_options' values, as live.shadow.ShadowOptions' fields."""
    return dict(buffer_events=args.buffer_events, buffer_bytes=args.buffer_bytes, overflow=args.overflow,
                block_budget_s=args.block_budget, release=args.release, agree_timeout_ns=args.agree_timeout,
                spec_path=args.spec)


def add_analysis_run_options(p: argparse.ArgumentParser) -> None:
    """Where a live run's analysis VMs run and how it is watched: shadow's and attach's."""
    p.add_argument("--analysis-priority", choices=["idle", "normal", "yield"], default="idle",
                   help="CPU priority of the analysis VMs: idle (SCHED_IDLE, default: they take only "
                        "CPU time the native leaves), yield (idle, and they hold still while the native "
                        "is busy, its work waiting in their buffers: docs/device-mode.md) or normal")
    p.add_argument("--analysis-cpus", default="auto", metavar="auto|all|LIST",
                   help="CPUs the analysis VMs run on: auto (default: every CPU but the first, left to "
                        "the native), all, or a list such as 1,3-5")
    p.add_argument("--metrics-port", type=int,
                   help="serve Prometheus metrics (lag, buffer, findings) on 127.0.0.1:PORT (0: any free port)")


def analysis_run_options(args: argparse.Namespace) -> dict:
    """add_analysis_run_options' values, as live.shadow.ShadowOptions' fields."""
    return dict(idle_analyses=args.analysis_priority in ("idle", "yield"),
                yield_to_native=args.analysis_priority == "yield", analysis_cpus=args.analysis_cpus,
                metrics_port=args.metrics_port)


def add_cpu_idle_option(p: argparse.ArgumentParser) -> None:
    """--cpu-idle: the analyses' lockstep with tandem may wait for the host's CPUs to wake."""
    p.add_argument("--cpu-idle", action="store_true",
                   help="let the host's CPUs idle while analysis VMs run (by default, as root, tandem holds them "
                        "awake through /dev/cpu_dma_latency: each stop of an analysis VM is then no CPU's "
                        "wake-up; on a host that is a VM, a heavy replay took 1.3x as long without)")


def add_users_analysis_options(p: argparse.ArgumentParser) -> None:
    """Analyses of a user's VM beyond the catalogue's: a kernel they bring, files swapped in."""
    p.add_argument("--analysis-kernel", action="append", metavar="NAME=BZIMAGE[,VMLINUX]", default=[],
                   help="your VM: also analyse under this kernel, booted directly on the VM's disks as analysis "
                        "NAME (it needs virtio-blk and the root's file system built in: no initramfs); the "
                        "vmlinux symbolizes its reports (repeatable)")
    p.add_argument("--overlay", action="append", metavar="NAME=DIR[,ANALYSIS]", default=[],
                   help="your VM: also run analysis NAME, which is ANALYSIS (default native) with the files under "
                        "DIR copied over the guest's root (DIR/usr/bin/x replaces /usr/bin/x; e.g. an ASan build "
                        "of a service; repeatable)")


def users_analyses(args: argparse.Namespace) -> list[catalog.Analysis]:
    """--analysis, then the analyses --analysis-kernel and --overlay define, each once.
    Their files are checked first (a one-line error naming the culprit), then every name
    is resolved among the built-in analyses and these (--analysis and an --overlay's
    ANALYSIS may name one of them)."""
    known = dict(catalog.ANALYSES)
    theirs = [_define(known, bring_kernel(spec)) for spec in args.analysis_kernel]
    theirs += [_define(known, swap_files(spec, known)) for spec in args.overlay]
    named = [catalog.get(name, known) for name in analysis_names(args.analysis)]
    return list(dict.fromkeys(named + theirs))


def _define(known: dict[str, catalog.Analysis], a: catalog.Analysis) -> catalog.Analysis:
    """a, added to the analyses known in this run; a name given twice, differently, is a one-line error."""
    if known.setdefault(a.name, a) != a:
        raise TandemError(f"analysis {a.name!r} given twice, differently")
    return a


def bring_kernel(spec: str) -> catalog.Analysis:
    """--analysis-kernel NAME=BZIMAGE[,VMLINUX]: the analysis NAME, which boots that kernel
    (a Linux bzImage, or a FreeBSD kernel with its kernel.debug); its files checked now, a
    one-line error naming the culprit."""
    from ..qemu import kernel_image
    name, sep, files = spec.partition("=")
    image, _, vmlinux = files.partition(",")
    if not sep or not name or not image:
        raise TandemError(f"--analysis-kernel {spec!r}: give NAME=BZIMAGE or NAME=BZIMAGE,VMLINUX")
    catalog.check_name(name)
    os_name, version = kernel_image.kernel_version(image, f"--analysis-kernel {name}:")
    if vmlinux:
        kernel_image.check_vmlinux(vmlinux, f"--analysis-kernel {name}: {'vmlinux' if os_name == 'linux' else 'symbols'}")
    log.info("analysis %s boots %s (%s)", name, image, version if os_name == "freebsd" else f"Linux {version}")
    return catalog.brought_kernel(name, str(Path(image).resolve()), str(Path(vmlinux).resolve()) if vmlinux else None,
                                  os=os_name)


def swap_files(spec: str, known: Mapping[str, catalog.Analysis] = catalog.ANALYSES) -> catalog.Analysis:
    """--overlay NAME=DIR[,ANALYSIS]: the analysis NAME, which is ANALYSIS (default native,
    among `known`) with DIR's files copied over the guest's root before it boots."""
    from ..semantic import overlay
    name, sep, rest = spec.partition("=")
    directory, _, base = rest.partition(",")
    if not sep or not name or not directory:
        raise TandemError(f"--overlay {spec!r}: give NAME=DIR or NAME=DIR,ANALYSIS")
    catalog.check_name(name)
    overlay.check_tree(directory, f"--overlay {name}:")
    return catalog.with_overlay(name, catalog.get(base or "native", known), str(Path(directory).resolve()))


def build_for(targets: list[str], why: str, parser: bool = False) -> None:
    """Build what of targets is missing before the command runs, saying what for and about
    how long (tandem.setup.build.ensure): each command builds what it needs, no more."""
    from ..setup.build import ensure
    ensure(targets, why, command=f"tandem ({why})", parser=parser)


def build_for_analyses(analyses: list[catalog.Analysis], noise: bool = True, bundles: Iterable[str | Path] = (),
                       mixed: bool = False) -> None:
    """What these analyses run on for these recordings (the native booting the kernel each
    was made on: semantic.guests.as_recorded), and unless noise is off the kernels of their
    noise runs (the same); a bundle that does not load is left to the replay, which says why.
    An analysis of another OS than a recording's is a one-line error, or with `mixed` (a
    farm's corpus of several OSes) left out for that recording: its task is skipped."""
    from ..formats.bundle import load_manifest
    from ..semantic.guests import as_recorded, check_os, noise_analysis, recorded_os
    bundles = list(bundles)
    runs = [] if bundles else list(analyses)
    for b in bundles:
        try:
            manifest = load_manifest(Path(b))
        except TandemError:
            runs += analyses
            continue
        mine = [a for a in analyses if not mixed or a.kernel.image or a.os == recorded_os(manifest)]
        for a in mine:              # before building anything for it
            check_os(Path(b), manifest, a)
        runs += as_recorded(mine, manifest) + ([noise_analysis(manifest)] if noise else [])
    build_for(catalog.build_targets(runs), "--analysis " + ",".join(a.name for a in analyses), parser=True)


def record_targets(args: argparse.Namespace) -> list[str]:
    """What booting the guest of `record`'s options needs: QEMU for a user's VM; QEMU,
    the demo guest's image and its kernel flavor for the demo guest."""
    if args.disk:
        return ["qemu"]
    from .guest_options import kernel_flavor
    flavor = kernel_flavor(args)
    kernel = catalog.kernel(flavor)
    return ["qemu", *(["guest"] if kernel.os == "linux" else []), *catalog.kernel_targets(kernel)]
