"""A recording bundle's manifest, typed: what a replay needs to be exact (the QEMU build,
the input artifacts, the machine), the size and sha256 of every file of the bundle, how
the recording stopped and what its device log holds per channel.

Its JSON (manifest.json) is read by formats/bundle.py, which checks every field tandem
reads for its type and shape first (manifest_problem), into a Manifest; every section is
a jsontable.Table, so a manifest read and written again is the same bytes, fields tandem
does not read included. The machine section is machine.MachineSection (the machine
description reads it back into a Guest).
"""
from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from pathlib import Path

from .. import __version__, artifacts
from ..jsontable import Table, named, one, optional, texts
from ..machine import MachineSection, overlay_path

SCHEMA = 1
STATES = ("recording", "complete", "interrupted")
OVERLAY = "disk-overlay.qcow2"      # the recording's writes to disk0 (overlay_path names the others')


@dataclasses.dataclass(frozen=True)
class Qemu(Table):
    """The QEMU build that recorded: a replay must run the same (build_id)."""
    binary: str | None = None
    build_id: str | None = None
    patch_series: str | None = None
    version: str | None = None
    nulls: frozenset[str] = dataclasses.field(
        default=frozenset({"binary", "build_id", "patch_series", "version"}), kw_only=True, repr=False)

    @classmethod
    def current(cls) -> Qemu:
        """tandem's QEMU build (artifacts.qemu)."""
        q = artifacts.qemu()
        return cls(binary=q["binary"], build_id=q["build_id"], patch_series=q["patch_series"], version=q["version"])


@dataclasses.dataclass(frozen=True)
class InputFile(Table):
    """An input artifact outside the bundle (kernel, initrd, a disk's base image): where it
    was and what it held, so a replay can refuse one that changed."""
    path: str | None = None
    size: int | None = None
    sha256: str | None = None


@dataclasses.dataclass(frozen=True)
class FileEntry(Table):
    """A file of the bundle, as sealed."""
    size: int | None = None
    sha256: str | None = None


@dataclasses.dataclass(frozen=True)
class Stop(Table):
    """How the recording stopped: why (poweroff, duration, interrupt, qemu-exit, an
    analysis run's outcome...), QEMU's exit status, and where in VM time and instructions."""
    reason: str | None = None
    exit_status: int | None = None
    vm_ns: int | None = None
    icount: int | None = None
    power_button: bool | None = None    # the guest's ACPI power button was pressed
    nulls: frozenset[str] = dataclasses.field(default=frozenset({"reason", "vm_ns", "icount"}), kw_only=True,
                                              repr=False)


@dataclasses.dataclass(frozen=True)
class Traffic(Table):
    """A channel's events and bytes in one direction."""
    events: int | None = None
    bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class Channel(Table):
    """A device log channel: its kind, the pcapng records it took (what Wireshark counts:
    a long event is several in format 2) and its traffic each way."""
    kind: str | None = None
    records: int | None = None
    inbound: Traffic = one(Traffic, key="in")
    outbound: Traffic = one(Traffic, key="out")


@dataclasses.dataclass(frozen=True)
class DeclaredPack(Table):
    """The assertion pack `tandem record --assertions` declared: its path, hash and names."""
    path: str | None = None
    sha256: str | None = None
    names: tuple[str, ...] | None = texts()


@dataclasses.dataclass(frozen=True)
class Manifest(Table):
    """manifest.json: what a replay needs to be exact, and what the bundle holds."""
    schema: int | None = None
    tandem_version: str | None = None
    created: str | None = None              # when the recording started (UTC, ISO 8601)
    state: str | None = None                # one of STATES
    qemu: Qemu = one(Qemu)
    inputs: Mapping[str, InputFile | None] = named(InputFile)     # kind -> entry (None: not given)
    machine: MachineSection = one(MachineSection)
    files: Mapping[str, FileEntry] = named(FileEntry)
    stop: Stop = one(Stop)
    channels: Mapping[str, Channel] = named(Channel)
    devlog_format: int | None = None
    wall_time_s: float | None = None
    assertions: DeclaredPack | None = optional(DeclaredPack)
    nulls: frozenset[str] = dataclasses.field(default=frozenset({"wall_time_s"}), kw_only=True, repr=False)

    @classmethod
    def new(cls, *, qemu: Qemu | None = None, inputs: Mapping[str, InputFile] | None = None,
            machine: MachineSection | None = None, assertions: DeclaredPack | None = None) -> Manifest:
        """A recording's first manifest, in state 'recording' (sealed later: formats.bundle.seal)."""
        return cls(schema=SCHEMA, tandem_version=__version__,
                   created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   state="recording", qemu=qemu or Qemu(), inputs=dict(inputs or {}),
                   machine=machine or MachineSection(), assertions=assertions)

    @property
    def input_paths(self) -> Mapping[str, str]:
        """kind -> path of the inputs given (machine.Recorded: Guest.from_manifest reads it)."""
        return {kind: e.path for kind, e in self.inputs.items() if e is not None and e.path is not None}

    @property
    def users_guest(self) -> bool:
        """A recording of a user's own VM (tandem record --disk), not of tandem's demo guest,
        whose service port (net.guest_port) a recording of it names."""
        net = self.machine.net
        return (net is None or net.guest_port is None) and bool(self.machine.disks)

    @property
    def started_at(self) -> str | None:
        """When the recording started, to the second (YYYY-MM-DDTHH:MM:SS, UTC), if it says."""
        return self.created[:19] if self.created is not None and len(self.created) >= 19 else None

    def overlays(self) -> list[str]:
        """The bundle's disk overlays, one per disk (the older one-disk form: disk_base)."""
        return [overlay_path(Path(OVERLAY), str(d.id)).name
                for d in self.machine.disk_table(self.inputs.get("disk_base") is not None)]
