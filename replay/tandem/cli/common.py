"""What the commands share: durations on the command line, progress lines, analysis lists."""
from __future__ import annotations

import argparse


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


def users_analyses(args: argparse.Namespace) -> list[str]:
    """--analysis, then the analyses --analysis-kernel and --overlay define (made known to
    the catalogue here; their files checked: a one-line error naming the culprit)."""
    from ..semantic.guests import bring_kernel, swap_files
    names = analysis_names(args.analysis)
    names += [bring_kernel(spec) for spec in args.analysis_kernel]
    names += [swap_files(spec) for spec in args.overlay]
    return list(dict.fromkeys(names))


def build_for(targets: list[str], why: str, parser: bool = False) -> None:
    """Build what of targets is missing before the command runs, saying what for and about
    how long (tandem.setup.build.ensure): each command builds what it needs, no more."""
    from ..setup.build import ensure
    ensure(targets, why, command=f"tandem ({why})", parser=parser)


def build_for_analyses(names: list[str], noise: bool = True) -> None:
    """What these analyses run on (and the native kernel, the noise run, unless noise is off)."""
    from .. import catalog
    build_for(catalog.build_targets([*names, *(["native"] if noise else [])]), "--analysis " + ",".join(names),
              parser=True)


def record_targets(args: argparse.Namespace) -> list[str]:
    """What booting the guest of `record`'s options needs: QEMU for a user's VM; QEMU,
    the demo guest's image and its kernel flavor for the demo guest."""
    if args.disk:
        return ["qemu"]
    return ["qemu", "guest", f"kernel-{args.kernel}", f"modules-{args.kernel}"]
