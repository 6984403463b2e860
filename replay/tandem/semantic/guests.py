"""The machine an analysis VM boots, for a recording of tandem's demo guest or of a
user's own VM.

The demo guest's analyses boot tandem's guest image with the analysis's kernel and
userland (the catalogue). A user's VM (recorded with `--disk`: its own disks, bootloader
and userland) is analysed on its own disks, each behind an overlay of the analysis's own,
with the analysis's kernel booted directly: root=, found from the recording, or given
with --root. A distribution mounts its root by UUID through its initramfs; tandem's
analysis kernels boot without one, so a UUID or LABEL is looked up in the disks' file
systems and named as the device it is on (qemu.image.root_device).

Where the root comes from, first found first: --root; the recorded kernel command line
(a direct boot's, in the manifest); the command line the guest's own kernel printed on
the console at boot ("Command line: ... root=..."), read from the device log.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from .. import artifacts, catalog
from ..errors import TandemError
from ..formats import bundle, pcapng
from ..machine import Guest
from ..qemu.image import root_device

# How much of the console is searched for the kernel's command line (it is among the
# first lines a kernel prints; GRUB's menu and SeaBIOS come before it).
CONSOLE_SEARCHED = 256 << 10
COMMAND_LINE = re.compile(rb"Command line: ([^\r\n]*)")
ROOT_ARG = re.compile(r"(?:^|\s)root=(\S+)")


def is_users_guest(manifest: dict) -> bool:
    """Was the recording of a user's VM (tandem record --disk), not of the demo guest
    (whose service port forward the manifest's net section names)?"""
    machine = manifest.get("machine") or {}
    return "guest_port" not in (machine.get("net") or {}) and bool(machine.get("disks"))


def recorded_root(bundle_dir: Path, manifest: dict) -> str | None:
    """The root= the native booted with: a direct boot's command line, else the one its
    kernel printed on the console."""
    m = ROOT_ARG.search(str((manifest.get("machine") or {}).get("cmdline") or ""))
    if m:
        return m.group(1)
    seen = bytearray()
    for e in pcapng.DevlogReader(bundle_dir / bundle.DEVLOG):
        if e.kind == "serial" and e.direction == "out":
            seen += e.data
            if (line := COMMAND_LINE.search(seen)) and line.end() < len(seen):     # the whole line
                m = ROOT_ARG.search(line.group(1).decode("ascii", "replace"))
                return m.group(1) if m else None
            if len(seen) > CONSOLE_SEARCHED:
                break
    return None


def analysis_guest(bundle_dir: Path, manifest: dict, analysis: str, root: str | None = None) -> Guest:
    """The machine `analysis` boots for the recording in bundle_dir (manifest: its
    manifest): the catalogue's guest for the demo guest's recordings; for a user's VM its
    own disks with the analysis's kernel booted directly on its root."""
    if not is_users_guest(manifest):
        return Guest.for_analysis(analysis)
    a = catalog.get(analysis)
    if a.userland.name != "native":
        raise TandemError(f"analysis {analysis}: it swaps the demo guest's userland; a user's VM keeps its own "
                          "(its files can be swapped through an overlay instead)")
    recorded = Guest.from_manifest(manifest)
    given = root or recorded_root(bundle_dir, manifest)
    if given is None:
        raise TandemError(f"{bundle_dir}: the guest's root device is not in the recording (no root= on a kernel "
                          "command line it shows); give it with --root (e.g. /dev/vda1)")
    device = root_device(recorded.disks, given)
    kernel = catalog.kernel(a.flavor)       # its command-line extras and the memory it needs
    cmdline = " ".join(filter(None, (f"root={device} ro console=ttyS0 panic=-1", kernel.cmdline_extra)))
    return dataclasses.replace(recorded, kernel=artifacts.kernel(a.flavor)["bzImage"], initrd=None, cmdline=cmdline,
                               memory_mb=max(recorded.memory_mb, kernel.memory_mb), nics=recorded.nics[:1])
