"""The options that say which guest runs, shared by the commands that boot one (`record`,
`shadow`): the demo guest by default, or the user's
own VM from its disks, booted by its own bootloader or directly."""
from __future__ import annotations

import argparse

from .. import catalog
from ..machine import NIC_MODELS, VIRTIO_NET, Forward, Guest, OptionError


def parse_memory(text: str) -> int:
    """'1024', '1024M', '1G' -> MiB (QEMU's -m units)."""
    units = {"": 1, "M": 1, "G": 1024}
    num, unit = (text[:-1], text[-1].upper()) if text[-1:].upper() in ("M", "G") else (text, "")
    if not num.isdigit() or not 16 <= int(num) * units[unit] < (1 << 22):
        raise argparse.ArgumentTypeError(f"not a memory size: {text!r} (MiB, or 512M, 2G; at least 16M)")
    return int(num) * units[unit]


def parse_vcpus(text: str) -> int:
    """'2' -> 2: a vCPU count QEMU's pc machine takes (1 to 255)."""
    if not text.isdigit() or not 1 <= int(text) <= 255:
        raise argparse.ArgumentTypeError(f"not a vCPU count: {text!r} (1 to 255)")
    return int(text)


def parse_forward(text: str) -> Forward:
    try:
        return Forward.parse(text)
    except OptionError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_guest_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("the guest", "without --disk: tandem's demo guest (busybox and kvd on port 7000, "
                                          "booted with a built kernel flavor)")
    g.add_argument("--disk", action="append", metavar="PATH", default=[],
                   help="a disk image of your VM (qcow2 or raw; repeatable: the first is the boot disk). "
                        "Never written: the run writes a qcow2 overlay in the bundle")
    g.add_argument("--kernel-image", metavar="BZIMAGE",
                   help="boot this kernel directly (default with --disk: the disk's own bootloader)")
    g.add_argument("--initrd", metavar="FILE", help="the initramfs for --kernel-image")
    g.add_argument("--append", metavar="CMDLINE",
                   help="the command line for --kernel-image (e.g. 'root=/dev/vda1'; console=ttyS0 is added "
                        "unless it names a console)")
    g.add_argument("--os", choices=("linux", "freebsd"),
                   help="with --disk: your VM's OS, whose console dialect its reports are in (default: "
                        "what boots says, a FreeBSD kernel given to --kernel-image, or FreeBSD's partition "
                        "types on the boot disk its loader boots from; else linux)")
    g.add_argument("--smp", type=parse_vcpus, metavar="N",
                   help="vCPUs (default 1; more than one needs --mode device: QEMU's record/replay runs one)")
    g.add_argument("--accel", choices=("tcg", "kvm"),
                   help="accelerator (default tcg; kvm needs --mode device, which has no -icount, and a "
                        "/dev/kvm that boots a guest: tandem doctor says whether this host's does)")
    g.add_argument("--memory", type=parse_memory, metavar="SIZE", help="guest memory (1G, 512M; default "
                                                                        "1G with --disk, the flavor's otherwise)")
    g.add_argument("--nic", action="append", metavar="MODEL", default=[], choices=sorted(NIC_MODELS),
                   help="a NIC of this model on its own user network (repeatable; default one virtio); "
                        "each is logged as its own interface")
    g.add_argument("--forward", action="append", type=parse_forward, metavar="tcp:HOSTPORT:GUESTPORT", default=[],
                   help="forward a host port (on 127.0.0.1) to the guest, tcp or udp, to the first NIC (repeatable)")
    g.add_argument("--kernel", choices=list(catalog.KERNELS),
                   help=f"demo guest: its kernel flavor (default {catalog.DEFAULT_KERNEL}: Debian's own, or native "
                        "with --assertions: tandem's build, whose DWARF and fixed addresses the assertions read)")
    g.add_argument("--userland", default="native", choices=list(catalog.USERLANDS),
                   help="demo guest: its userland (default native; asan: its services built with ASan)")


def kernel_flavor(args: argparse.Namespace) -> str:
    """The demo guest's kernel flavor: --kernel, else native when the recording declares
    assertions (tandem assert reads that kernel's vmlinux; Debian's has no DWARF beside it,
    KASLR and SMP), else the catalogue's default."""
    if args.kernel:
        return args.kernel
    return catalog.ASSERTIONS_KERNEL if getattr(args, "assertions", None) else catalog.DEFAULT_KERNEL


def guest_from_args(args: argparse.Namespace) -> Guest:
    """The guest the options describe, with its vCPUs and accelerator; a disk that is
    not one is a one-line error naming it."""
    guest = _guest(args)
    vcpus, accel = getattr(args, "smp", None), getattr(args, "accel", None)
    if vcpus is not None:
        guest.vcpus = vcpus
    if accel is not None:
        guest.accel = accel
    return guest


def _guest(args: argparse.Namespace) -> Guest:
    nics = tuple(NIC_MODELS[m] for m in args.nic) or None
    if not args.disk:
        if args.initrd or args.append or args.os:
            raise OptionError("--initrd, --append and --os go with --disk (the demo guest has its own)")
        guest = Guest.default(kernel_flavor(args), args.userland)
        if args.kernel_image:
            guest.kernel = args.kernel_image
        if args.memory:
            guest.memory_mb = args.memory
        if nics:
            guest = guest.with_nics(nics)
        return guest
    from ..qemu.image import check_bootable, disk_os, probe_disk
    from ..qemu.kernel_image import is_freebsd
    images = [probe_disk(path) for path in args.disk]
    if args.kernel_image is None:
        check_bootable(images[0])
        found = disk_os(images[0].path, images[0].format)
    else:
        found = "freebsd" if is_freebsd(args.kernel_image, f"--kernel-image {args.kernel_image}") else None
    return Guest.of_disks([(i.path, i.format) for i in images], kernel=args.kernel_image, initrd=args.initrd,
                          append=args.append, memory_mb=args.memory or 1024, nic_models=nics or (VIRTIO_NET,),
                          os=args.os or found or "linux")
