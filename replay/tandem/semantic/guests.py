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
import logging
import re
from pathlib import Path

from .. import artifacts, catalog
from ..errors import TandemError
from ..formats import bundle, pcapng
from ..machine import Guest
from ..qemu import kernel_image
from ..qemu.image import root_device
from . import overlay

log = logging.getLogger(__name__)

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
    a = catalog.get(analysis)
    if not is_users_guest(manifest):
        if a.kernel.image or a.overlay:
            raise TandemError(f"analysis {analysis}: {'a kernel you bring' if a.kernel.image else 'an overlay'} "
                              f"analyses a recording of your own VM (tandem record --disk); {bundle_dir} is of "
                              "the demo guest")
        return Guest.for_analysis(analysis)
    if a.userland.name != "native":
        raise TandemError(f"analysis {analysis}: it swaps the demo guest's userland; a user's VM keeps its own "
                          "(its files can be swapped through an overlay instead: --overlay)")
    recorded = Guest.from_manifest(manifest)
    given = root or recorded_root(bundle_dir, manifest)
    if given is None:
        raise TandemError(f"{bundle_dir}: the guest's root device is not in the recording (no root= on a kernel "
                          "command line it shows); give it with --root (e.g. /dev/vda1)")
    device = root_device(recorded.disks, given)
    cmdline = " ".join(filter(None, (f"root={device} ro console=ttyS0 panic=-1", a.kernel.cmdline_extra)))
    image = a.kernel.image or artifacts.kernel(a.flavor)["bzImage"]
    return dataclasses.replace(recorded, kernel=image, initrd=None, cmdline=cmdline,
                               memory_mb=max(recorded.memory_mb, a.kernel.memory_mb), nics=recorded.nics[:1])


def with_files_swapped(guest: Guest, analysis: str, workdir: Path) -> Guest:
    """guest, or for an analysis with an overlay (--overlay) the same guest booting disks
    its files have been written into (overlay.prepare: a preparation boot)."""
    a = catalog.get(analysis)
    if a.overlay is None:
        return guest
    root = ROOT_ARG.search(guest.cmdline)
    if guest.kernel is None or root is None:
        raise TandemError(f"--overlay {analysis}: its guest boots no kernel tandem gives a root= to")
    return overlay.prepare(guest, a.overlay, root.group(1), workdir, analysis)


def bring_kernel(spec: str) -> str:
    """--analysis-kernel NAME=BZIMAGE[,VMLINUX]: the analysis NAME, which boots that kernel,
    made known (catalog.add); its files checked now, a one-line error naming the culprit."""
    name, sep, files = spec.partition("=")
    image, _, vmlinux = files.partition(",")
    if not sep or not name or not image:
        raise TandemError(f"--analysis-kernel {spec!r}: give NAME=BZIMAGE or NAME=BZIMAGE,VMLINUX")
    catalog.check_name(name)
    version = kernel_image.bzimage_version(image, f"--analysis-kernel {name}:")
    if vmlinux:
        kernel_image.check_vmlinux(vmlinux, f"--analysis-kernel {name}: vmlinux")
    log.info("analysis %s boots %s (Linux %s)", name, image, version)
    catalog.add(catalog.brought_kernel(name, str(Path(image).resolve()),
                                       str(Path(vmlinux).resolve()) if vmlinux else None))
    return name


def swap_files(spec: str) -> str:
    """--overlay NAME=DIR[,ANALYSIS]: the analysis NAME, which is ANALYSIS (default native)
    with DIR's files copied over the guest's root before it boots, made known."""
    name, sep, rest = spec.partition("=")
    directory, _, base = rest.partition(",")
    if not sep or not name or not directory:
        raise TandemError(f"--overlay {spec!r}: give NAME=DIR or NAME=DIR,ANALYSIS")
    catalog.check_name(name)
    overlay.check_tree(directory, f"--overlay {name}:")
    catalog.add(catalog.with_overlay(name, catalog.get(base or "native"), str(Path(directory).resolve())))
    return name
