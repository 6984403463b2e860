"""The bundle manifest's `machine` section, typed: what a recording's machine was (the
Guest's part: machine_section) and how it ran (its stop time, network, mode, libvirt),
read back into a Guest (Guest.from_manifest) and a replay run (exact/replay.replay_run).

Here rather than in formats/ because the machine description reads it and is the layer
below; formats.bundle.Manifest holds it as its `machine`, and checks its shapes when a
manifest loads (manifest_problem), before any of it is read here.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol

from ..jsontable import Table, listed, optional, renamed, texts


@dataclasses.dataclass(frozen=True)
class DiskEntry(Table):
    """One of machine.disks: a drive id and its base image's format (the base itself is in
    the manifest's inputs, under disk_input(id))."""
    id: str | None = None
    format: str | None = None


@dataclasses.dataclass(frozen=True)
class NicEntry(Table):
    """One of machine.nics: its netdev, QEMU device model and MAC (each left out when unset)."""
    netdev: str | None = None
    model: str | None = None
    mac: str | None = None


@dataclasses.dataclass(frozen=True)
class NetSection(Table):
    """machine.net: how the guest's network ran. backend 'user' (a recording: the host's
    forwards, and the demo service's port and its forward), 'libvirt' (a recording on a
    domain's own command line: its network as libvirt made it) or 'feed' (an analysis run)."""
    backend: str | None = None
    forwards: tuple[str, ...] | None = texts()
    hostfwd_port: int | None = None
    guest_port: int | None = None       # the demo guest's service: a recording of tandem's guest


@dataclasses.dataclass(frozen=True)
class OwnLine(Table):
    """machine.libvirt.own: an exact recording on a domain's own command line, as its replay
    repeats it (libvirt/command_line.py): libvirt's part of QEMU's command line (from the
    binary on, before what tandem added), and what tandem's recording named in it."""
    argv: tuple[str, ...] | None = texts()
    overlays: tuple[str, ...] | None = texts()  # each disk's overlay, as the argv names it, in the disks' order
    images: tuple[str, ...] | None = texts()    # each disk's format node, under its blkreplay
    drives: tuple[str, ...] | None = texts()    # each disk's block device, as the device log names it
    netdevs: tuple[str, ...] | None = texts()   # each NIC's netdev
    serial: str | None = None                   # the serial port's chardev
    rng: str | None = None                      # the entropy device's backend


@dataclasses.dataclass(frozen=True)
class LibvirtSection(Table):
    """machine.libvirt: the domain a run was in, and its SMBIOS UUID, which the guest saw
    (a replay outside libvirt gives QEMU the same: guest.replay_args)."""
    uuid: str | None = None
    domain: str | None = None
    command_line: str | None = None     # "libvirt": the domain's own (libvirt/recorded.py); absent: tandem's
    own: OwnLine | None = optional(OwnLine)     # an exact recording's, on the domain's own command line


@dataclasses.dataclass(frozen=True)
class MachineSection(Table):
    """The manifest's machine section. Bundles from before several disks and NICs have one
    disk (inputs.disk_base, disk_format) and one NIC (nic_model, mac): disk_table and
    nic_table read both forms."""
    accel: str | None = None
    machine_type: str | None = renamed("machine")
    icount_shift: int | None = None
    memory_mb: int | None = None
    cmdline: str | None = None
    smp: int | None = None
    devices: tuple[str, ...] | None = texts()
    boot: str | None = None                 # absent: direct
    disks: tuple[DiskEntry, ...] | None = listed(DiskEntry)
    nics: tuple[NicEntry, ...] | None = listed(NicEntry)
    os: str | None = None                   # absent: linux
    cpu: str | None = None                  # absent: QEMU's default (machine.guest.CPUS)
    disk_format: str | None = None          # the one-disk form
    nic_model: str | None = None            # the one-NIC form
    mac: str | None = None                  # the one-NIC form
    stop_after_ns: int | None = None
    state_every_ns: int | None = None       # the device log's state checkpoints (devlog state-every)
    net: NetSection | None = optional(NetSection)
    libvirt: LibvirtSection | None = optional(LibvirtSection)
    mode: str | None = None                 # 'device': a device-mode recording; 'analysis': an analysis run's own recording
    analysis: str | None = None             # ... of this analysis
    source: str | None = None               # ... of the recording it replayed
    rtc_base: str | None = None             # ... its RTC's start
    lookahead_ns: int | None = None         # ... its feed's lookahead

    def disk_table(self, has_disk_base: bool) -> tuple[DiskEntry, ...]:
        """The disks, in either form (the one-disk form has a disk when inputs.disk_base is given)."""
        if self.disks is not None:
            return self.disks
        return (DiskEntry(id="disk0", format=self.disk_format),) if has_disk_base else ()

    def nic_table(self) -> tuple[NicEntry, ...]:
        """The NICs, in either form."""
        return self.nics or (NicEntry(netdev=None, model=self.nic_model, mac=self.mac),)


class Recorded(Protocol):
    """What a recorded machine is read back from: a manifest's machine section and the
    paths of its inputs by kind (kernel, initrd, disk_base, disk_base.ID).
    formats.bundle.Manifest is one; a JSON document becomes one through recorded()."""
    @property
    def machine(self) -> MachineSection: ...

    @property
    def input_paths(self) -> Mapping[str, str]: ...


@dataclasses.dataclass(frozen=True)
class RecordedDocument:
    """A manifest's JSON document (a test's, a tool's) read as a Recorded: its machine
    section and its inputs' paths, as formats.bundle.Manifest reads them."""
    machine: MachineSection
    input_paths: Mapping[str, str]


def recorded(source: Recorded | Mapping[str, Any]) -> Recorded:
    """source itself, or the JSON document source read as one."""
    if not isinstance(source, Mapping):
        return source
    entries = source.get("inputs") or {}
    return RecordedDocument(MachineSection.from_json(source.get("machine") or {}),
                            {kind: str(e["path"]) for kind, e in entries.items() if e and e.get("path") is not None})
