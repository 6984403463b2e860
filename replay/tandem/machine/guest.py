"""The machine tandem runs, as one typed description: QEMU's command line (qemu/argv.py),
the libvirt domain (libvirt/domain.py) and the bundle manifest's `machine` section
(section, read back by from_manifest) all come from a Guest."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import artifacts, catalog
from ..errors import BundleError, TandemError
from .devices import Disk, Nic
from .options import UUID, VIRTIO_NET, OptionError
from .section import DiskEntry, MachineSection, NicEntry, Recorded, recorded

ICOUNT_SHIFT = 2           # fixed: record and replay must use the same shift
# The demo guest's: IPv6 off (the kernels have it for ordinary guests' services; the demo
# service speaks IPv4 and its recordings carry no IPv6 chatter).
DEFAULT_CMDLINE = "console=ttyS0 panic=-1 oops=panic ipv6.disable=1"
# The FreeBSD demo guest's: its root is the first virtio disk (its console is COM1 by the
# kernel's compiled-in hints, guest-kernel/freebsd/TANDEM-NATIVE).
FREEBSD_CMDLINE = "vfs.root.mountfrom=ufs:/dev/vtbd0"


# What the machine is, whatever the mode: record and replay must agree on every one of
# these (a replay's QEMU is made from the manifest's machine section). One vCPU under TCG
# with -icount: QEMU's record/replay is single-threaded (docs/record-replay.md).
MACHINE_TYPE = "pc"
ACCEL = "tcg"
VCPUS = 1


BOOTS = ("direct", "firmware")    # the kernel given to QEMU, or the disk's own bootloader
# The CPU models a guest may have besides QEMU's default for the board (qemu64), by the
# name the manifest's machine section keeps. tcg-intel: a FreeBSD kernel booted directly
# (PVH) under TCG calls DELAY() before any timecounter works; with an Intel vendor and
# tandem's kernels' tunables it reads the TSC's frequency from the brand string and delays
# on the TSC from the start, with no 0.1 s calibration against the i8254 (any other CPU
# works too, through the i8254: docs/freebsd-boot-notes.md); under -icount the TSC then
# ticks at 1 GHz.
CPUS: dict[str, tuple[str, dict[str, str]]] = {
    "tcg-intel": ("qemu64", {"vendor": "GenuineIntel", "model-id": "tandem TCG CPU @ 1.00GHz"}),
}
# Each guest OS's CPU when none is given.
OS_CPU = {"freebsd": "tcg-intel"}
MAX_DISKS, MAX_NICS = 16, 8


def disk_input(disk_id: str) -> str:
    """The manifest's inputs key for a disk's base image: `disk_base` for the first disk
    (the key a one-disk bundle has), `disk_base.ID` for the others."""
    return "disk_base" if disk_id == "disk0" else f"disk_base.{disk_id}"


@dataclass
class Guest:
    """The machine tandem runs, as the guest sees it: its board (machine type, vCPUs,
    accelerator, memory), how it boots (direct: a kernel, initramfs and command line given
    to QEMU; firmware: kernel None, SeaBIOS boots the first disk's own bootloader), its
    devices as lists with ids (disks disk0.., NICs on net0..; one serial port and one
    entropy source, which every mode has), and its OS. QEMU's command line (qemu/argv.py),
    the libvirt domain (libvirt/domain.py) and the manifest's machine section
    (section, read back by from_manifest) all come from it. Record and exact replay
    take several disks and NICs; the analysis feed knows one NIC (`nic` says so)."""
    kernel: str | None                      # None: boot the first disk's bootloader
    initrd: str | None                      # None: the kernel boots without one
    disks: tuple[Disk, ...] = ()
    memory_mb: int = 256
    cmdline: str = DEFAULT_CMDLINE
    nics: tuple[Nic, ...] = (Nic(),)
    os: str = "linux"                       # the guest OS: which console dialect its reports are in
    machine_type: str = MACHINE_TYPE
    accel: str = ACCEL
    vcpus: int = VCPUS
    cpu: str | None = None                  # a name in CPUS; None: QEMU's default for the board

    def __post_init__(self) -> None:
        if self.cpu is not None and self.cpu not in CPUS:
            raise OptionError(f"cpu {self.cpu!r}: not a CPU model tandem knows ({', '.join(CPUS)})")
        if self.kernel is None and not self.disks:
            raise OptionError("no kernel and no disk: nothing to boot")
        if self.kernel is None and self.initrd:
            raise OptionError("an initrd without a kernel: give the kernel too (--kernel-image)")
        if len(self.disks) > MAX_DISKS or len(self.nics) > MAX_NICS:
            raise OptionError(f"{len(self.disks)} disks, {len(self.nics)} NICs: tandem takes at most "
                              f"{MAX_DISKS} disks and {MAX_NICS} NICs")
        for what, ids in (("drive", [d.id for d in self.disks]), ("netdev", [n.netdev for n in self.nics])):
            if len(set(ids)) != len(ids):
                raise OptionError(f"{what} ids {ids}: each must be given once")

    @property
    def boot(self) -> str:
        """direct (QEMU loads the kernel) or firmware (the disk's own bootloader)."""
        return "firmware" if self.kernel is None else "direct"

    @classmethod
    def of_disks(cls, disks: list[tuple[str, str]], *, kernel: str | None = None, initrd: str | None = None,
                 append: str | None = None, memory_mb: int = 1024, nic_models: tuple[str, ...] = (VIRTIO_NET,),
                 os: str = "linux") -> "Guest":
        """A user's guest: its disks [(path, format)] as disk0.., booted by the first disk's
        bootloader, or directly when a kernel is given (append: its command line; the
        serial console is ttyS0 unless append names one), NICs of the given models on
        net0.."""
        cmdline = ""
        if kernel is not None:
            cmdline = append if append is not None else ""
            if "console=" not in cmdline and os == "linux":
                cmdline = " ".join(filter(None, ("console=ttyS0", cmdline)))
        elif append is not None:
            raise OptionError("--append without --kernel-image: the disk's bootloader has its own command line")
        return cls(kernel=kernel, initrd=initrd, memory_mb=memory_mb, cmdline=cmdline, os=os, cpu=OS_CPU.get(os),
                   disks=tuple(Disk(path, fmt, id=f"disk{i}") for i, (path, fmt) in enumerate(disks)),
                   nics=tuple(Nic(netdev=f"net{i}", model=m) for i, m in enumerate(nic_models)))

    @property
    def disk(self) -> Disk | None:
        """The disk (today's machines have at most one)."""
        return self.disks[0] if self.disks else None

    @property
    def nic(self) -> Nic:
        """The NIC, for the modes that take one (the analysis feed, libvirt shadows)."""
        if len(self.nics) != 1:
            raise OptionError(f"{len(self.nics)} NICs: tandem's analysis feed takes one (for now)")
        return self.nics[0]

    @classmethod
    def default(cls, flavor: str = catalog.DEFAULT_KERNEL, userland: str = "native") -> "Guest":
        """tandem's guest image with a built kernel flavor and userland, by their names
        (`tandem record --kernel --userland`; an unknown name: one-line error)."""
        return cls.of_image(catalog.kernel(flavor), catalog.userland(userland))

    @classmethod
    def for_analysis(cls, analysis: catalog.Analysis) -> "Guest":
        """The guest an analysis boots on tandem's guest image: its kernel and userland."""
        return cls.of_image(analysis.kernel, analysis.userland)

    @classmethod
    def of_image(cls, kernel: catalog.Kernel, land: catalog.Userland) -> "Guest":
        """tandem's guest image with a built kernel and userland (its kernel not built: one-line error);
        a FreeBSD kernel boots the FreeBSD demo guest (of_freebsd)."""
        if kernel.os == "freebsd":
            return cls.of_freebsd(kernel, land)
        k, g = artifacts.kernel(kernel.flavor), artifacts.guest()
        cmdline = " ".join(filter(None, (DEFAULT_CMDLINE, land.cmdline_extra, kernel.cmdline_extra)))
        initrd = artifacts.initrd_with_modules(*artifacts.initramfs(g, land.name), artifacts.modules(kernel.flavor))
        return cls(kernel=k["bzImage"], initrd=initrd, disks=(Disk(g["disk_base"]),), cmdline=cmdline,
                   memory_mb=kernel.memory_mb, os=kernel.os)

    @classmethod
    def of_freebsd(cls, kernel: catalog.Kernel, land: catalog.Userland) -> "Guest":
        """The FreeBSD demo guest (scripts/build-freebsd.sh freebsd-guest): a FreeBSD kernel
        booted directly (PVH) on the UFS root whose init serves kvd on port 7000, with
        tandem's TCG CPU (CPUS). It has one userland."""
        if land.name != "native":
            raise TandemError(f"userland {land.name}: the FreeBSD demo guest has only its native one")
        k, root = artifacts.kernel(kernel.flavor), artifacts.freebsd_guest()
        return cls(kernel=k["bzImage"], initrd=None, disks=(Disk(root["root_image"]),),
                   cmdline=" ".join(filter(None, (FREEBSD_CMDLINE, kernel.cmdline_extra))),
                   memory_mb=kernel.memory_mb, os="freebsd", cpu=OS_CPU["freebsd"])

    @classmethod
    def from_manifest(cls, manifest: Recorded | Mapping[str, Any]) -> "Guest":
        """The guest a bundle recorded, from its manifest's machine section and inputs
        (a formats.bundle.Manifest, or its JSON document: section.recorded; shapes checked
        when the manifest loaded: bundle.manifest_problem); its devices are made again as
        machine.Disk and machine.Nic, so a replay's QEMU gets only well-formed ones (an
        OptionError is a BundleError's message here). A bundle with one disk and one NIC
        in the older form reads as such (MachineSection.disk_table, nic_table)."""
        source = recorded(manifest)
        machine, paths = source.machine, source.input_paths
        boot = machine.boot or "direct"
        if boot == "direct" and paths.get("kernel") is None:
            raise _missing("inputs.kernel")
        if machine.memory_mb is None:
            raise _missing("machine.memory_mb")
        if machine.cmdline is None:
            raise _missing("machine.cmdline")
        try:
            disks = tuple(Disk(cls._disk_base(paths, str(d.id)), d.format or "raw", id=str(d.id))
                          for d in machine.disk_table("disk_base" in paths))
            nics = tuple(Nic(netdev=n.netdev or "net0", model=n.model or VIRTIO_NET, mac=n.mac)
                         for n in machine.nic_table())
            return cls(kernel=paths.get("kernel") if boot == "direct" else None, initrd=paths.get("initrd"),
                       disks=disks, memory_mb=machine.memory_mb, cmdline=machine.cmdline, nics=nics,
                       os=machine.os or "linux", machine_type=machine.machine_type or MACHINE_TYPE,
                       accel=machine.accel or ACCEL, vcpus=machine.smp or VCPUS, cpu=machine.cpu)
        except OptionError as e:
            raise BundleError(f"manifest machine: {e}") from None

    @staticmethod
    def _disk_base(paths: Mapping[str, str], disk_id: str) -> str:
        path = paths.get(disk_input(disk_id))
        if path is None:
            raise BundleError(f"manifest inputs.{disk_input(disk_id)}: missing (machine.disks names {disk_id})")
        return path

    def section(self) -> MachineSection:
        """What the manifest's machine section says of this guest; from_manifest reads it back.
        The disks' base images are in the manifest's inputs (path, size, hash), keyed by
        disk_input(id)."""
        return MachineSection(
            accel=self.accel, machine_type=self.machine_type, icount_shift=ICOUNT_SHIFT, memory_mb=self.memory_mb,
            cmdline=self.cmdline, smp=self.vcpus,
            devices=("isa-serial", *(n.model for n in self.nics), *("virtio-blk-pci" for _ in self.disks),
                     "virtio-rng-pci"),
            boot=None if self.boot == "direct" else self.boot,
            disks=tuple(DiskEntry(id=d.id, format=d.format) for d in self.disks) or None,
            nics=tuple(NicEntry(netdev=n.netdev or None, model=n.model or None, mac=n.mac or None)
                       for n in self.nics),
            os=None if self.os == "linux" else self.os, cpu=self.cpu)

    def machine_section(self) -> dict[str, object]:
        """section(), as the manifest's JSON says it."""
        return self.section().to_json()

    def with_disk(self, base: str | None, fmt: str = "raw") -> "Guest":
        """This guest with its one disk replaced (None: without a disk)."""
        return dataclasses.replace(self, disks=(Disk(base, fmt),) if base else ())

    def with_nics(self, models: tuple[str, ...]) -> "Guest":
        """This guest with NICs of these models on net0.. (no MACs given: QEMU's defaults)."""
        return dataclasses.replace(self, nics=tuple(Nic(netdev=f"net{i}", model=m) for i, m in enumerate(models)))

    def with_nic(self, model: str = VIRTIO_NET, mac: str | None = None) -> "Guest":
        """This guest with its NIC replaced."""
        return dataclasses.replace(self, nics=(Nic(model=model, mac=mac),))


def _missing(where: str) -> BundleError:
    return BundleError(f"manifest {where}: missing (a replay needs it)")


def replay_args(machine: MachineSection) -> list[str]:
    """What libvirt added to QEMU's command line that the guest sees, for a replay outside
    libvirt of a run recorded in a domain (the manifest's machine.libvirt): the SMBIOS
    system UUID (-uuid) and the firmware's boot order (-boot strict=on puts HALT in
    fw_cfg's bootorder). Without them such a replay diverges during boot. None for a run
    that was in no domain."""
    if machine.libvirt is None or not machine.libvirt.to_json():
        return []
    uuid = machine.libvirt.uuid or ""
    if not UUID.fullmatch(uuid):
        raise TandemError(f"manifest machine.libvirt.uuid {uuid!r}: not a UUID")
    return ["-uuid", uuid, "-boot", "strict=on"]


def analyses_given(analyses: list[catalog.Analysis]) -> list[catalog.Analysis]:
    """The analyses asked for, each once and in order; none, or one whose kernel or image
    is not built, is a one-line error now rather than after the native has started."""
    analyses = list(dict.fromkeys(analyses))
    if not analyses:
        raise TandemError("no --analysis given")
    for a in analyses:
        if a.kernel.image is None:     # a kernel the user brought was checked when given
            Guest.for_analysis(a)
    return analyses
