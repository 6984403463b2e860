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
import shutil
from pathlib import Path

from .. import artifacts, catalog, private
from ..errors import TandemError
from ..formats import bundle, pcapng
from ..formats.bundle import Manifest
from ..machine import Guest
from ..qemu.image import freebsd_root, root_device
from . import overlay

log = logging.getLogger(__name__)

# How much of the console is searched for the kernel's command line (it is among the
# first lines a kernel prints; GRUB's menu and SeaBIOS come before it).
CONSOLE_SEARCHED = 256 << 10
# ... and how many device-log events at most (a kernel's first lines come after its
# bootloader's disk reads: some hundreds of events for GRUB loading Debian's kernel).
EVENTS_SEARCHED = 200_000
COMMAND_LINE = re.compile(rb"Command line: ([^\r\n]*)")
KERNEL_VERSION = re.compile(rb"Linux version (\S+)")
ROOT_ARG = re.compile(r"(?:^|\s)root=(\S+)")


def recorded_root(bundle_dir: Path, manifest: Manifest) -> str | None:
    """The root= the native booted with: a direct boot's command line, else the one its
    kernel printed on the console."""
    m = ROOT_ARG.search(manifest.machine.cmdline or "")
    if m:
        return m.group(1)
    line = console_line(bundle_dir, COMMAND_LINE)
    m = ROOT_ARG.search(line.decode("ascii", "replace")) if line is not None else None
    return m.group(1) if m else None


def recorded_release(bundle_dir: Path) -> str | None:
    """The kernel release the native ran ("Linux version 6.12.95-tandem ..." on its console)."""
    line = console_line(bundle_dir, KERNEL_VERSION)
    return line.decode("ascii", "replace") if line is not None else None


def console_line(bundle_dir: Path, pattern: re.Pattern[bytes]) -> bytes | None:
    """pattern's group 1 in the first whole console line of the native that has it, among
    the first CONSOLE_SEARCHED bytes (a kernel's first lines)."""
    seen = bytearray()
    for n, e in enumerate(pcapng.DevlogReader(bundle_dir / bundle.DEVLOG)):
        if n >= EVENTS_SEARCHED:    # a guest whose kernel prints nothing on ttyS0: not the whole log
            break
        if e.kind == "serial" and e.direction == "out":
            seen += e.data
            if (m := pattern.search(seen)) and m.end() < len(seen) and b"\n" in seen[m.end():]:
                return m.group(1)
            if len(seen) > CONSOLE_SEARCHED:
                break
    return None


def recorded_flavor(manifest: Manifest) -> str | None:
    """The catalogue kernel a recording of the demo guest booted: the flavor whose build its
    kernel is (built here now, or under the cache's kernel/FLAVOR-KEY/ it was built in); None
    for a user's VM or a kernel from elsewhere."""
    kernel = manifest.input_paths.get("kernel")
    if manifest.users_guest or kernel is None:
        return None
    for flavor in catalog.FLAVORS + catalog.FREEBSD_FLAVORS:
        try:
            if artifacts.kernel(flavor)["bzImage"] == kernel:
                return flavor
        except TandemError:         # not built
            continue
    where = Path(kernel).parent
    flavor = where.name.rpartition("-")[0]
    if where.parent == artifacts.cache_dir() / "freebsd" and flavor.startswith("kernel-"):
        flavor = "freebsd-" + flavor[len("kernel-"):]       # freebsd/kernel-FLAVOR-KEY/kernel
        return flavor if flavor in catalog.FREEBSD_FLAVORS else None
    return flavor if where.parent == artifacts.cache_dir() / "kernel" and flavor in catalog.FLAVORS else None


def noise_analysis(manifest: Manifest) -> catalog.Analysis:
    """The noise run of a recording: the native on the semantic path, booting the kernel the
    demo guest was recorded on (catalog.native_on); tandem's native kernel of the guest's
    OS for a user's VM."""
    flavor = recorded_flavor(manifest) or catalog.OS_NATIVE.get(recorded_os(manifest), "native")
    return catalog.native_on(catalog.kernel(flavor))


def as_recorded(analyses: list[catalog.Analysis], manifest: Manifest) -> list[catalog.Analysis]:
    """analyses, the native among them booting the kernel the recording was made on
    (noise_analysis): `--analysis native` names the native's own kernel on the semantic path."""
    return [noise_analysis(manifest) if a == catalog.NATIVE else a for a in analyses]


def recorded_os(manifest: Manifest) -> str:
    """The OS of the guest a recording is of (recordings before FreeBSD guests say none)."""
    return manifest.machine.os or "linux"


def check_os(bundle_dir: Path, manifest: Manifest, a: catalog.Analysis) -> None:
    """A one-line error when analysis `a`'s kernel (the catalogue's, or one the user brought,
    whose OS its file says: qemu.kernel_image) is another OS's than the guest the
    recording is of."""
    recorded = recorded_os(manifest)
    if a.os != recorded:
        raise TandemError(f"analysis {a.name}: {'your' if a.kernel.image else 'its'} kernel is {a.os}'s; {bundle_dir} "
                          f"is of a {recorded} guest (its analyses: "
                          f"{', '.join(x.name for x in catalog.ALL if x.os == recorded)})")


def analysis_guest(bundle_dir: Path, manifest: Manifest, a: catalog.Analysis, root: str | None = None) -> Guest:
    """The machine analysis `a` boots for the recording in bundle_dir (manifest: its
    manifest): the catalogue's guest for the demo guest's recordings; for a user's VM its
    own disks with the analysis's kernel booted directly on its root."""
    check_os(bundle_dir, manifest, a)
    if not manifest.users_guest:
        if a.kernel.image or a.overlay:
            raise TandemError(f"analysis {a.name}: {'a kernel you bring' if a.kernel.image else 'an overlay'} "
                              f"analyses a recording of your own VM (tandem record --disk); {bundle_dir} is of "
                              "the demo guest")
        return Guest.for_analysis(a)
    if a.userland.name != "native":
        raise TandemError(f"analysis {a.name}: it swaps the demo guest's userland; a user's VM keeps its own "
                          "(its files can be swapped through an overlay instead: --overlay)")
    recorded = Guest.from_manifest(manifest)
    given = root or native_root(bundle_dir, manifest)
    if recorded.os == "freebsd":
        return freebsd_guest(bundle_dir, recorded, a, given)
    if given is None:
        raise TandemError(f"{bundle_dir}: the guest's root device is not in the recording (no root= on a kernel "
                          "command line it shows); give it with --root (e.g. /dev/vda1)")
    device = root_device(recorded.disks, given)
    cmdline = " ".join(filter(None, (f"root={device} ro console=ttyS0 panic=-1", a.kernel.cmdline_extra)))
    image = a.kernel.image or artifacts.kernel(a.flavor)["bzImage"]
    return dataclasses.replace(recorded, kernel=image, initrd=None, cmdline=cmdline,
                               memory_mb=max(recorded.memory_mb, a.kernel.memory_mb), nics=recorded.nics[:1])


FREEBSD_ROOT_ARG = re.compile(r"(?:^|\s)vfs\.root\.mountfrom=(\S+)")
FREEBSD_MOUNTING = re.compile(rb"Trying to mount root from (\S+)")     # vfs_mountroot.c, before each try


def native_root(bundle_dir: Path, manifest: Manifest, *, from_disks: bool = True) -> str | None:
    """The root the native booted with, as the analysis kernels of its OS take it: Linux's
    root= (recorded_root), FreeBSD's vfs.root.mountfrom (freebsd_recorded_root)."""
    if recorded_os(manifest) == "freebsd":
        return freebsd_recorded_root(bundle_dir, Guest.from_manifest(manifest), from_disks=from_disks)
    return recorded_root(bundle_dir, manifest)


def freebsd_recorded_root(bundle_dir: Path, recorded: Guest, *, from_disks: bool = True) -> str | None:
    """The root a recorded FreeBSD guest mounted: a direct boot's vfs.root.mountfrom, else
    the one its kernel said it tried on the console (a loader's boot: from the loader's
    variables or the root's /etc/fstab), else (from_disks) the first freebsd-ufs partition
    of its disks (a kernel whose console is not the serial port)."""
    if m := FREEBSD_ROOT_ARG.search(recorded.cmdline):
        return m.group(1)
    line = console_line(bundle_dir, FREEBSD_MOUNTING)
    if line is not None:
        return line.decode("ascii", "replace")
    return freebsd_root(recorded.disks) if from_disks else None


def freebsd_guest(bundle_dir: Path, recorded: Guest, a: catalog.Analysis, root: str | None) -> Guest:
    """A user's FreeBSD VM booting the analysis's kernel directly (PVH) on its own disks, on
    the root given (freebsd_recorded_root, or --root)."""
    if root is None:
        raise TandemError(f"{bundle_dir}: the FreeBSD guest's root is not in the recording (no "
                          "vfs.root.mountfrom= on its command line or its console, no freebsd-ufs partition on "
                          "its disks); give it with --root (e.g. ufs:/dev/vtbd0p2)")
    rest = " ".join(w for w in recorded.cmdline.split() if not w.startswith("vfs.root.mountfrom="))
    cmdline = " ".join(filter(None, (f"vfs.root.mountfrom={root}", rest, a.kernel.cmdline_extra)))
    image = a.kernel.image or artifacts.kernel(a.flavor)["bzImage"]
    return dataclasses.replace(recorded, kernel=image, initrd=None, cmdline=cmdline,
                               memory_mb=max(recorded.memory_mb, a.kernel.memory_mb), nics=recorded.nics[:1])


def with_files_swapped(guest: Guest, a: catalog.Analysis, workdir: Path, bundle_dir: Path | None = None) -> Guest:
    """guest, or the same guest booting disks with files written into them (overlay.prepare:
    a preparation boot): the analysis's --overlay tree, and, where the native ran one of
    tandem's own kernels as its distro kernel (the same release as the analysis's flavor,
    read from the recording in bundle_dir), that flavor's own builds of tandem's modules
    over the native's (a KASAN kernel needs KASAN-built modules: a module built for another
    flavor is not instrumented, and a lockdep kernel's locks have another layout)."""
    trees = [a.overlay] if a.overlay else []
    modules = flavor_modules(a, bundle_dir, workdir) if bundle_dir is not None else None
    if modules:
        trees.insert(0, modules)
    if not trees:
        return guest
    root = ROOT_ARG.search(guest.cmdline)
    if guest.kernel is None or root is None:
        raise TandemError(f"--overlay {a.name}: its guest boots no kernel tandem gives a root= to")
    return overlay.prepare(guest, trees, root.group(1), workdir, a.name)


def flavor_modules(a: catalog.Analysis, bundle_dir: Path, workdir: Path) -> str | None:
    """A tree of the analysis flavor's builds of tandem's modules at the path the native's
    own are at (lib/modules/RELEASE/extra), when the native ran tandem's kernel of that
    release; None otherwise (a user's own kernel, or a brought one)."""
    if a.kernel.image is not None:
        return None
    release = recorded_release(bundle_dir)
    try:
        built, mods = artifacts.kernel(a.flavor), artifacts.modules(a.flavor)
    except TandemError:         # not built: the analysis fails where its kernel is looked up
        return None
    if release is None or release != built["version"] or not mods.get("modules"):
        return None
    tree = workdir / f"{a.name}-modules"
    extra = tree / "lib" / "modules" / release / "extra"
    private.make_dir(extra)
    for ko in mods.get("modules", []):
        shutil.copyfile(ko, extra / Path(ko).name)
    log.info("%s: the native ran tandem's kernel %s; the analysis gets its own %s modules (%s)", a.name, release,
             a.flavor, ", ".join(Path(ko).name for ko in mods.get("modules", [])))
    return str(tree)
