"""A bundle from its start to its seal: the first manifest (state 'recording'), written
before its QEMU starts, and the last, written once QEMU has exited (the device log's
channels, how the run stopped, the files' hashes, state 'complete' or 'interrupted').

Both tandem's recordings (record/recording.py) and an analysis run's own recording
(semantic/driving/replay.py) are made this way.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from ..errors import TandemError
from ..machine import Guest, MachineSection, disk_input
from . import bundle, pcapng
from .manifest import Channel, DeclaredPack, Manifest, Qemu, Stop, Traffic


def start(path: Path, guest: Guest, machine: MachineSection, assertions: DeclaredPack | None = None, *,
          then: Callable[[], None] | None = None) -> Manifest:
    """A new bundle at path and its manifest in state 'recording': tandem's QEMU build, the
    guest's inputs hashed (kernel, initrd, each disk's base), its machine section (the
    guest's, guest.section(), with how it runs: stop time, network, libvirt domain) and
    the pack `tandem record --assertions` declared. then: what the bundle needs before
    QEMU starts (the disks' overlays); a TandemError from it leaves the bundle
    'interrupted' and is raised."""
    given = (("kernel", guest.kernel), ("initrd", guest.initrd), *((f"disk {d.id}", d.base) for d in guest.disks))
    for what, p in given:
        if p and not Path(p).is_file():
            raise TandemError(f"{what} {p}: not found")
    bundle.refuse_existing(path)    # before hashing the inputs: a refusal should be quick
    inputs = {kind: bundle.input_entry(p) for kind, p in
              (("kernel", guest.kernel), ("initrd", guest.initrd), *((disk_input(d.id), d.base) for d in guest.disks))
              if p}
    manifest = Manifest.new(qemu=Qemu.current(), inputs=inputs, machine=machine, assertions=assertions)
    bundle.new_bundle(path, manifest)      # the manifest first: it claims the directory
    if then is not None:
        try:
            then()
        except TandemError:
            bundle.write_manifest(path, interrupted(manifest))
            raise
    return manifest


def interrupted(manifest: Manifest) -> Manifest:
    """manifest, its recording ended before it was sealed (its QEMU did not start)."""
    return dataclasses.replace(manifest, state="interrupted")


def seal(path: Path, manifest: Manifest, *, status: int, wall_s: float, stop_reason: str,
         power_button: bool = False) -> Manifest:
    """Finish a bundle whose QEMU has exited: channel stats, stop, file hashes, state; the
    sealed manifest is written and returned. power_button: the guest's ACPI power button
    was pressed (the analyses press theirs)."""
    dl = pcapng.read_devlog(path / bundle.DEVLOG)
    end = next((s for s in dl.stats if s), None)
    files = {name: bundle.file_entry(path / name)
             for name in (bundle.STREAM, bundle.DEVLOG, *manifest.overlays(), "qemu.log") if (path / name).exists()}
    sealed = dataclasses.replace(
        manifest, channels=channel_stats(dl), devlog_format=dl.format, files=files, wall_time_s=round(wall_s, 3),
        stop=Stop(reason=stop_reason, exit_status=status, vm_ns=end.end_vm_ns if end else None,
                  icount=end.icount if end else None, power_button=power_button),
        state="complete" if status == 0 and dl.closed_cleanly else "interrupted")
    bundle.write_manifest(path, sealed)
    return sealed


def channel_stats(devlog: pcapng.Devlog) -> dict[str, Channel]:
    """Per channel of a device log: its kind, the pcapng records it took (what Wireshark
    counts: a long event is several in format 2), and its events and bytes each way."""
    events: Counter[tuple[str, str]] = Counter()
    sizes: Counter[tuple[str, str]] = Counter()
    for e in itertools.chain(devlog.events, devlog.states):    # a checkpoint counts as an output
        events[(e.channel, e.direction or "out")] += 1
        sizes[(e.channel, e.direction or "out")] += len(e.data)

    def traffic(channel: str, direction: str) -> Traffic:
        return Traffic(events=events[(channel, direction)], bytes=sizes[(channel, direction)])

    return {i.name: Channel(kind=i.kind, records=devlog.records[i.id], inbound=traffic(i.name, "in"),
                            outbound=traffic(i.name, "out")) for i in devlog.interfaces}
