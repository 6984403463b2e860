"""The machine tandem runs, as one typed description: QEMU's command line (qemu/argv.py),
the libvirt domain (libvirt/domain.py) and the bundle manifest's `machine` section
(machine_section, read back by from_manifest) all come from a Guest."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .. import artifacts, catalog
from ..errors import BundleError, TandemError
from .devices import Disk, Nic
from .options import VIRTIO_NET, OptionError

ICOUNT_SHIFT = 2           # fixed: record and replay must use the same shift
DEFAULT_CMDLINE = "console=ttyS0 panic=-1 oops=panic"


# What the machine is, whatever the mode: record and replay must agree on every one of
# these (a replay's QEMU is made from the manifest's machine section). One vCPU under TCG
# with -icount: QEMU's record/replay is single-threaded (docs/record-replay.md).
MACHINE_TYPE = "pc"
ACCEL = "tcg"
VCPUS = 1


@dataclass
class Guest:
    """The machine tandem runs, as the guest sees it: its board (machine type, vCPUs,
    accelerator, memory), direct kernel boot (kernel, initramfs, command line), its
    devices as lists with ids (disks, NICs; one serial port and one entropy source, which
    every mode has), and its OS. QEMU's command line (qemu/argv.py), the libvirt domain
    (libvirt/domain.py) and the manifest's machine section (machine_section, read back by
    from_manifest) all come from it. Today's modes take at most one disk and exactly one
    NIC: the device log and the feed know one of each (qemu_argv says so when given more)."""
    kernel: str
    initrd: str | None                      # None: the kernel boots without one
    disks: tuple[Disk, ...] = ()
    memory_mb: int = 256
    cmdline: str = DEFAULT_CMDLINE
    nics: tuple[Nic, ...] = (Nic(),)
    os: str = "linux"                       # the guest OS: which console dialect its reports are in
    machine_type: str = MACHINE_TYPE
    accel: str = ACCEL
    vcpus: int = VCPUS

    @property
    def disk(self) -> Disk | None:
        """The disk (today's machines have at most one)."""
        return self.disks[0] if self.disks else None

    @property
    def nic(self) -> Nic:
        """The NIC (today's machines have exactly one)."""
        if len(self.nics) != 1:
            raise OptionError(f"{len(self.nics)} NICs: tandem's device log and feed take one (for now)")
        return self.nics[0]

    @classmethod
    def default(cls, flavor: str = "native", userland: str = "native") -> "Guest":
        """tandem's guest image with a built kernel flavor and userland (catalog.py)."""
        kernel, land = catalog.kernel(flavor), catalog.userland(userland)
        k, g = artifacts.kernel(flavor), artifacts.guest()
        cmdline = " ".join(filter(None, (DEFAULT_CMDLINE, land.cmdline_extra, kernel.cmdline_extra)))
        initrd = artifacts.initrd_with_modules(*artifacts.initramfs(g, userland), artifacts.modules(flavor))
        return cls(kernel=k["bzImage"], initrd=initrd, disks=(Disk(g["disk_base"]),), cmdline=cmdline,
                   memory_mb=kernel.memory_mb, os=kernel.os)

    @classmethod
    def for_analysis(cls, analysis: str) -> "Guest":
        """The guest an analysis of the catalogue boots (an unknown name: one-line error)."""
        a = catalog.get(analysis)
        return cls.default(a.flavor, a.userland.name)

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> "Guest":
        """The guest a bundle recorded, from its manifest's inputs and machine section
        (shapes checked when the manifest loaded: bundle.manifest_problem); its devices are
        made again as machine.Disk and machine.Nic, so a replay's QEMU gets only
        well-formed ones (an OptionError is a BundleError's message here)."""
        inputs, machine = manifest.get("inputs") or {}, manifest.get("machine") or {}
        for where, value in (("inputs.kernel", inputs.get("kernel")), ("machine.memory_mb", machine.get("memory_mb")),
                             ("machine.cmdline", machine.get("cmdline"))):
            if value is None:
                raise BundleError(f"manifest {where}: missing (a replay needs it)")
        base = (inputs.get("disk_base") or {}).get("path")
        try:
            disks = (Disk(base, machine.get("disk_format") or "raw"),) if base else ()
            nics = (Nic(model=machine.get("nic_model") or VIRTIO_NET, mac=machine.get("mac")),)
        except OptionError as e:
            raise BundleError(f"manifest machine: {e}") from None
        return cls(kernel=inputs["kernel"]["path"], initrd=(inputs.get("initrd") or {}).get("path"),
                   disks=disks, memory_mb=machine["memory_mb"], cmdline=machine["cmdline"], nics=nics,
                   os=machine.get("os") or "linux", machine_type=machine.get("machine") or MACHINE_TYPE,
                   accel=machine.get("accel") or ACCEL, vcpus=machine.get("smp") or VCPUS)

    def machine_section(self) -> dict[str, object]:
        """What the manifest's machine section says of this guest; from_manifest reads it back.
        The disk's base image is in the manifest's inputs (path, size, hash)."""
        out: dict[str, object] = {"accel": self.accel, "machine": self.machine_type, "icount_shift": ICOUNT_SHIFT,
               "memory_mb": self.memory_mb, "cmdline": self.cmdline, "smp": self.vcpus,
               "devices": ["isa-serial", *(n.model for n in self.nics),
                           *("virtio-blk-pci" for _ in self.disks), "virtio-rng-pci"]}
        if self.disk and self.disk.format != "raw":      # what the replay's overlay backs onto
            out["disk_format"] = self.disk.format
        if self.nic.mac:
            out["mac"] = self.nic.mac
        if self.nic.model != VIRTIO_NET:
            out["nic_model"] = self.nic.model
        if self.os != "linux":
            out["os"] = self.os
        return out

    def with_disk(self, base: str | None, fmt: str = "raw") -> "Guest":
        """This guest with its disk replaced (None: without a disk)."""
        return dataclasses.replace(self, disks=(Disk(base, fmt),) if base else ())

    def with_nic(self, model: str = VIRTIO_NET, mac: str | None = None) -> "Guest":
        """This guest with its NIC replaced."""
        return dataclasses.replace(self, nics=(Nic(model=model, mac=mac),))


def analyses_given(names: list[str]) -> list[str]:
    """The --analysis names, each once and in order; an unknown name, or an analysis whose
    kernel or image is not built, is a one-line error now rather than after the native
    has started."""
    names = list(dict.fromkeys(names))
    if not names:
        raise TandemError("no --analysis given")
    for name in names:
        Guest.for_analysis(name)
    return names
