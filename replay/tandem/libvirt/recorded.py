"""A user's domain recorded on libvirt's own command line: the domain as its user
defined it, with tandem's QEMU as its emulator and tandem's recording added.

libvirt keeps generating the machine, its devices and their backends (a tap on the
`default` network or a bridge, with the file descriptors libvirt opens; -blockdev
disks; its monitor), so whatever libvirt supports in the definition stays as it is.
tandem changes only what recording needs, each through an element libvirt documents:

- `<emulator>`: tandem's QEMU (the devlog and its filters are its patches);
- each disk's `<source>`: the bundle's qcow2 overlay, with the disk itself as its
  `<backingStore>` (never written; the shadows back onto it too);
- each NIC's `<driver name='qemu'/>`: no vhost, so the frames pass through QEMU's net
  layer, where the filters are (vhost moves them in the host kernel); and, unless the
  NIC says which, `<rom enabled='no'/>`: tandem's QEMU is installed with SeaBIOS and no
  iPXE option ROMs (scripts/build-qemu.sh), so the NIC cannot network-boot;
- the first serial port: a unix socket in the run directory (`tandem console`, and the
  console tandem reads), added if the domain has none;
- user aliases (`ua-tandem-...`) on the disks, the serial port and the rng: libvirt
  derives the QEMU ids from them (a disk's device id is its alias, and its backend is
  that of the device's child ALIAS/virtio-backend; the serial port's chardev is `char` +
  alias, an rng backend `obj` + alias), and these are stable, unlike the -blockdev node
  names libvirt numbers at each start; a NIC's netdev is `host` + its alias (`netN` by
  its place in the domain);
- `<qemu:commandline>` (libvirt's supported passthrough): tandem's QMP monitor and the
  recording's objects (qemu.argv.recording_objects) on those ids.

An exact recording (`-icount rr=record`) adds what record/replay needs, and its replay
repeats libvirt's command line (command_line.py):

- each disk behind blkreplay: a `-blockdev` of driver blkreplay over the disk's format
  node, and a `<qemu:override>` (libvirt 8.2 and later) of the disk device's `drive`
  property pointing at it. The format nodes' names are libvirt's (`libvirt-N-format`),
  numbered at each start in an order `virConnectDomainXMLToNative` repeats for the same
  XML, so they are read from it (`to_native`) and checked in the started QEMU's command
  line before the guest runs (command_line.recorded_line);
- `-icount ...,rr=record` and filter-replay on each netdev;
- an entropy device's backend made `builtin` (QEMU's own generator, whose bytes
  record/replay logs; `random` reads /dev/urandom in the main loop, unlogged); the guest
  sees the same virtio-rng.

The domain's own definition is put back when the run ends (launcher.Launcher's restore).
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import InfraError
from ..machine import OwnLine, RRMode, Run, overlay_path
from ..qemu.argv import DeviceIds, clock_options, qmp_monitor, recording_objects, replay_filters
from .command_line import blkreplay_node, blkreplay_options, device_drives, recorded_line
from .domain import QEMU_NS

ALIAS = "ua-tandem-"      # libvirt keeps a user alias only with the ua- prefix


def _alias(el: ET.Element, default: str) -> str:
    """The device's user alias: its own, else tandem's `ua-tandem-DEFAULT`, set on it."""
    a = el.find("alias")
    if a is not None and (a.get("name") or "").startswith("ua-"):
        return a.get("name", "")
    if a is None:
        a = ET.SubElement(el, "alias")
    a.set("name", ALIAS + default)
    return ALIAS + default


def _overlay_disks(devices: ET.Element, overlays: list[Path]) -> tuple[str, ...]:
    """Each disk onto its overlay, the disk's own file as the overlay's backing store;
    the disks' aliases, in order."""
    disks = [d for d in devices.findall("disk") if d.get("device", "disk") == "disk"]
    if len(disks) != len(overlays):
        raise InfraError(f"{len(disks)} disks in the domain, {len(overlays)} overlays made for them")
    ids = []
    for i, (disk, overlay) in enumerate(zip(disks, overlays)):
        src, drv = disk.find("source"), disk.find("driver")
        if src is None or not src.get("file"):
            raise InfraError(f"disk {i}: no <source file> (attach checks this first)")
        if drv is None:
            drv = ET.SubElement(disk, "driver", name="qemu")
        base, fmt = src.get("file", ""), drv.get("type") or "raw"
        src.set("file", str(overlay))
        drv.set("type", "qcow2")
        for old in disk.findall("backingStore"):
            disk.remove(old)
        backing = ET.SubElement(disk, "backingStore", type="file")
        ET.SubElement(backing, "format", type=fmt)
        ET.SubElement(backing, "source", file=base)
        ET.SubElement(backing, "backingStore")      # the disk itself has none (a standalone image)
        ids.append(_alias(disk, f"disk{i}"))
    return tuple(ids)


def _drive(disk: ET.Element, alias: str) -> str:
    """The disk's device as the devlog finds it (qemu-patches/0017: an id, or a path under
    /machine/peripheral): a virtio-blk-pci's backend is its child's, the path libvirt
    names it by too."""
    target = disk.find("target")
    virtio = target is None or target.get("bus", "virtio") == "virtio"
    return alias + ("/virtio-backend" if virtio else "")


def _builtin_rng(devices: ET.Element) -> None:
    """Each entropy device's backend QEMU's own generator (record/replay logs its bytes)."""
    for rng in devices.findall("rng"):
        for backend in rng.findall("backend"):
            rng.remove(backend)
        ET.SubElement(rng, "backend", model="builtin")


def _blkreplay(dom: ET.Element, aliases: tuple[str, ...], images: tuple[str, ...]) -> list[str]:
    """Each disk device's drive a blkreplay over its format node: the override of the
    device's property, and the -blockdev options of the blkreplay nodes."""
    override = ET.SubElement(dom, f"{{{QEMU_NS}}}override")
    for alias in aliases:
        device = ET.SubElement(override, f"{{{QEMU_NS}}}device", alias=alias)
        front = ET.SubElement(device, f"{{{QEMU_NS}}}frontend")
        ET.SubElement(front, f"{{{QEMU_NS}}}property", name="drive", type="string", value=blkreplay_node(alias))
    return blkreplay_options(aliases, images)


def _netdevs(devices: ET.Element) -> tuple[str, ...]:
    """Each NIC without vhost; the netdev ids libvirt gives their backends: `host` + the
    NIC's alias, its user alias or else libvirt's `netN`, numbered in the domain's order
    (libvirt turns a `network` NIC into a tap before it names it, and does not keep a user
    alias through that)."""
    out = []
    for i, iface in enumerate(devices.findall("interface")):
        drv = iface.find("driver")
        if drv is None:
            drv = ET.SubElement(iface, "driver")
        drv.set("name", "qemu")
        if iface.find("rom") is None:       # tandem's QEMU has no iPXE ROMs (its NICs boot none)
            ET.SubElement(iface, "rom", enabled="no")
        a = iface.find("alias")
        user = a.get("name", "") if a is not None else ""
        out.append("host" + (user if user.startswith("ua-") else f"net{i}"))
    return tuple(out)


def _serial(devices: ET.Element, socket: Path) -> str:
    """The first serial port on a unix socket tandem listens through; its chardev id.
    The consoles that stand for it go: libvirt makes console 0 from serial 0 again."""
    serial = devices.find("serial")
    if serial is None:
        serial = ET.SubElement(devices, "serial")
        ET.SubElement(serial, "target", port="0")
    for child in serial.findall("source") + serial.findall("protocol"):
        serial.remove(child)
    serial.set("type", "unix")
    serial.insert(0, ET.Element("source", mode="bind", path=str(socket)))
    for console in devices.findall("console"):
        target = console.find("target")
        if target is None or target.get("type", "serial") == "serial":
            devices.remove(console)
    return "char" + _alias(serial, "serial0")


@dataclass(frozen=True)
class DomainRecording:
    """A domain's definition as recorded_domain_xml makes it, and what it adds to libvirt's
    command line: the ids the recording names, the arguments, and in exact mode each
    disk's format node under its blkreplay."""
    xml: str
    ids: DeviceIds
    added: list[str]
    images: tuple[str, ...] = ()


def recorded_domain_xml(original: str, run: Run, overlays: list[Path], *, emulator: str,
                        metadata: ET.Element | None = None,
                        to_native: Callable[[str], list[str]] | None = None) -> DomainRecording:
    """The domain `original` (its inactive XML) recorded by run (in device mode, or exact:
    run.rr records), on its disks' overlays (in the order of its disks), run by
    `emulator`; tandem's `metadata` replaces any earlier of tandem's in its <metadata>.
    to_native(xml): libvirt's QEMU command line for a definition (an exact recording
    reads its disks' node names from it)."""
    dom = ET.fromstring(original)
    devices = dom.find("devices")
    if devices is None:
        devices = ET.SubElement(dom, "devices")
    emu = devices.find("emulator")
    if emu is None:
        emu = ET.SubElement(devices, "emulator")
    emu.text = emulator
    exact = run.rr_mode == RRMode.RECORD
    if exact:
        _builtin_rng(devices)
    aliases = _overlay_disks(devices, overlays)
    disks = [d for d in devices.findall("disk") if d.get("device", "disk") == "disk"]
    drives = tuple(_drive(d, a) for d, a in zip(disks, aliases))
    netdevs = _netdevs(devices)
    serial = _serial(devices, run.rundir / "serial.sock")
    rng = next(("obj" + _alias(r, f"rng{i}") for i, r in enumerate(devices.findall("rng"))
                if r.get("model") == "virtio"), None)
    if metadata is not None:
        md = dom.find("metadata")
        if md is None:
            md = ET.SubElement(dom, "metadata")
        md.append(metadata)
    ids = DeviceIds(serial, rng, drives, netdevs)
    added = qmp_monitor(run.rundir)
    images: tuple[str, ...] = ()
    if exact:
        if to_native is None:
            raise InfraError("an exact recording on libvirt's own command line needs libvirt's to name its disks' nodes")
        images = device_drives(to_native(_text(dom)), aliases)
        added += clock_options(run) + _blkreplay(dom, aliases, images) + replay_filters(netdevs)
    added += recording_objects(run, ids)
    cmd = dom.find(f"{{{QEMU_NS}}}commandline")
    if cmd is None:
        cmd = ET.SubElement(dom, f"{{{QEMU_NS}}}commandline")
    for value in added:
        ET.SubElement(cmd, f"{{{QEMU_NS}}}arg", value=value)
    return DomainRecording(_text(dom), ids, added, images)


class OwnCommandLine:
    """A domain recorded on its own command line, for libvirt/launcher.Launcher: its
    definition for the run (xml), and once its QEMU has started (paused), what the
    manifest keeps of that QEMU's command line (started: command_line.recorded_line)."""

    def __init__(self, original: str):
        self.original = original
        self.made: DomainRecording | None = None
        self.overlays: list[Path] = []

    def xml(self, vm, metadata: ET.Element | None, to_native: Callable[[str], list[str]]) -> str:
        self.overlays = [overlay_path(vm.run.overlay, d.id) for d in vm.guest.disks]
        self.made = recorded_domain_xml(self.original, vm.run, self.overlays, emulator=vm.argv[0],
                                        metadata=metadata, to_native=to_native)
        return self.made.xml

    def started(self, argv: list[str]) -> OwnLine:
        made = self.made
        if made is None:
            raise InfraError("the domain's QEMU started before tandem made its definition")
        return recorded_line(argv, made.added, made.images, self.overlays, drives=made.ids.drives,
                             netdevs=made.ids.netdevs, serial=made.ids.serial, rng=made.ids.rng)


def _text(dom: ET.Element) -> str:
    ET.indent(dom)
    return ET.tostring(dom, encoding="unicode")
