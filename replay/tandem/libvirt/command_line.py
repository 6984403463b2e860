"""libvirt's own QEMU command line for a domain recorded exactly (recorded.py): read when
the domain starts, kept in the bundle (machine.libvirt.own), and repeated by its replay.

The replay must run the machine libvirt ran (its pcie-root-ports, USB controller,
balloon, each device at its address, the recorded disks' node names), so it repeats
libvirt's options; they come from a bundle, hostile input, so each option is one of a
list this module knows, with what may be in it (`replay_argv`): no option that opens a
file, a socket or a program is kept except the disks' own files, a chardev becomes a
null one of the same id, and libvirt's monitor, pid file and start paused go. The NIC's
backend was a tap whose descriptor libvirt opened; virtio-net shows the guest the
offloads of a backend with a virtio-net header, which only a tap (among the backends of
tandem's QEMU) has, so the replay has a tap of its own, in a network namespace of its
own (qemu/tap.py; its frames come from the log: record/replay's filter drops what the
tap gives).
"""
from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import artifacts
from ..errors import BundleError, InfraError
from ..machine import Guest, OwnLine, Run, json_option, keyval_option, overlay_path
from ..qemu.argv import DeviceIds, clock_options, qmp_monitor, recording_objects, replay_filters

BLKREPLAY = "tandem-rr-"     # the node name of each disk's blkreplay, then the disk device's alias
VMSTATE = "tandem-vmstate"   # the drive of the replay's blank qcow2, where savevm puts the VM state
# Options that take no value.
FLAGS = {"-S", "-no-user-config", "-nodefaults", "-no-shutdown", "-no-reboot", "-no-hpet", "-enable-kvm"}
# libvirt's options the replay leaves out: tandem's monitor stands for libvirt's, and the replay ends with the guest.
DROPPED = {"-S", "-no-shutdown", "-mon", "-pidfile", "-daemonize"}
# Options kept as they are: none of these names a file or a program.
KEPT = {"-name", "-m", "-smp", "-uuid", "-overcommit", "-no-user-config", "-nodefaults", "-no-reboot",
        "-msg", "-sandbox", "-cpu", "-append", "-no-hpet"}
MACHINE_KEYS = {"type", "usb", "vmport", "dump-guest-core", "memory-backend", "smm", "hpet", "acpi", "pit", "pic",
                "sata", "i8042", "graphics", "mem-merge", "suppress-vmdesc", "kernel_irqchip", "accel",
                "pflash0", "pflash1"}
ACCEL_KEYS = {"type", "thread", "tb-size"}
RTC_KEYS = {"base", "clock", "driftfix"}
BOOT_KEYS = {"order", "once", "menu", "strict", "reboot-timeout", "splash-time"}
GLOBAL_PROPERTIES = {"lost_tick_policy", "disable_s3", "disable_s4", "extended-tseg-mbytes"}
DEVICES = {"pcie-root-port", "pcie-pci-bridge", "pci-bridge", "qemu-xhci", "piix3-usb-uhci", "ich9-usb-ehci1",
           "ich9-usb-uhci1", "ich9-usb-uhci2", "ich9-usb-uhci3", "isa-serial", "virtio-blk-pci", "virtio-net-pci",
           "virtio-balloon-pci", "virtio-rng-pci", "virtio-serial-pci", "pvpanic", "pvpanic-pci"}
# A device property that names a file the device reads: kept only empty.
DEVICE_FILES = {"romfile"}
OBJECTS = {"memory-backend-ram", "rng-builtin", "secret"}
BLOCK_DRIVERS = {"file", "qcow2", "raw"}
BLOCK_KEYS = {"driver", "node-name", "filename", "auto-read-only", "read-only", "discard", "file", "backing",
              "cache", "detect-zeroes", "locking"}


def native_argv(text: str) -> list[str]:
    """The QEMU command line of `virsh domxml-to-native qemu-argv` (virConnectDomainXMLToNative):
    the environment's assignments before the binary left out."""
    words = shlex.split(text.replace("\\\n", " "))
    while words and "=" in words[0] and not words[0].startswith("/"):
        words.pop(0)
    return words


def _options(argv: Sequence[str], where: str) -> list[tuple[str, str | None]]:
    """argv (after the binary) as (option, value) pairs; a flag's value is None."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv):
        opt = argv[i]
        if not opt.startswith("-"):
            raise BundleError(f"{where}: {opt[:80]!r}: not a QEMU option")
        if opt in FLAGS:
            out.append((opt, None))
            i += 1
            continue
        if i + 1 >= len(argv):
            raise BundleError(f"{where}: {opt}: its value is missing")
        out.append((opt, argv[i + 1]))
        i += 2
    return out


def _json(value: str) -> dict[str, Any] | None:
    """A JSON option's object, None for a key=value one; a ValueError if it is neither."""
    if not value.startswith("{"):
        return None
    obj = json.loads(value)
    if not isinstance(obj, dict):
        raise ValueError(f"{value[:80]!r}: not a JSON object")
    return obj


def _json_or_none(value: str) -> dict[str, Any] | None:
    try:
        return _json(value)
    except ValueError:
        return None


def _keyval(value: str, implied: str) -> dict[str, str]:
    """A key=value option (QEMU's syntax: ',,' is a comma in a value; a first part without
    '=' is the implied key's)."""
    parts, cur, i = [], "", 0
    while i < len(value):
        if value[i] == ",":
            if value[i + 1:i + 2] == ",":
                cur += ","
                i += 2
                continue
            parts.append(cur)
            cur = ""
        else:
            cur += value[i]
        i += 1
    parts.append(cur)
    out: dict[str, str] = {}
    for n, part in enumerate(parts):
        key, eq, val = part.partition("=")
        if not eq:
            if n:
                key, val = key, "on"
            else:
                key, val = implied, key
        out[key] = val
    return out


def device_drives(argv: Sequence[str], aliases: Sequence[str]) -> tuple[str, ...]:
    """The block node each device of `aliases` has as its drive, in libvirt's command line argv."""
    drives: dict[str, str] = {}
    for opt, value in _options(argv[1:], "libvirt's command line"):
        if opt == "-device" and value and (dev := _json_or_none(value)) and isinstance(dev.get("id"), str):
            drives[dev["id"]] = str(dev.get("drive", ""))
    missing = [a for a in aliases if not drives.get(a)]
    if missing:
        raise InfraError(f"libvirt's command line has no disk device {missing[0]!r} with a drive "
                         f"(its devices: {', '.join(sorted(drives))})")
    return tuple(drives[a] for a in aliases)


def _blockdevs(argv: Sequence[str]) -> dict[str, dict[str, Any]]:
    return {str(b.get("node-name")): b for opt, value in _options(argv[1:], "QEMU's command line")
            if opt == "-blockdev" and value and (b := _json_or_none(value)) is not None}


def recorded_line(argv: Sequence[str], added: Sequence[str], images: Sequence[str], overlays: Sequence[Path],
                  *, drives: Sequence[str], netdevs: Sequence[str], serial: str | None, rng: str | None) -> OwnLine:
    """What an exact replay repeats of a domain's started QEMU (argv, from /proc): libvirt's
    part of it, without tandem's own (`added`: libvirt 9.0 puts <qemu:commandline> before
    its last option, -msg). Each disk's format node (images) must be the one over its
    overlay: an InfraError naming the disk if libvirt numbered its nodes otherwise than
    when tandem asked (the guest has not run yet)."""
    n, argv = len(added), list(argv)
    at = next((i for i in range(len(argv) - n, 0, -1) if argv[i:i + n] == list(added)), None) if n else None
    if at is None:
        raise InfraError("the domain's QEMU command line does not hold tandem's recording as tandem gave it")
    nodes = _blockdevs(argv)
    for i, (image, overlay) in enumerate(zip(images, overlays)):
        fmt = nodes.get(image) or {}
        storage = nodes.get(str(fmt.get("file"))) or {}
        if storage.get("filename") != str(overlay):
            raise InfraError(f"disk {i}: the node {image!r} tandem put blkreplay over is not its overlay "
                             f"{overlay} in the started QEMU (libvirt numbered its nodes otherwise)")
    return OwnLine(argv=tuple(argv[:at] + argv[at + n:]), overlays=tuple(str(p) for p in overlays), images=tuple(images),
                   drives=tuple(drives), netdevs=tuple(netdevs), serial=serial, rng=rng)


class Translation:
    """libvirt's recorded options made the replay's (replay_argv), each checked."""

    def __init__(self, own: OwnLine, *, overlays: Sequence[Path], disks: Sequence[str],
                 kernel: Mapping[str, str | None], taps: Sequence[int], where: str):
        self.own, self.where = own, where
        self.overlays = dict(zip(own.overlays or (), (str(p) for p in overlays)))
        self.disks = set(disks)          # the bases: the manifest's disk inputs
        self.kernel = kernel
        self.taps = list(taps)

    def refuse(self, what: str) -> BundleError:
        what = what[:160]
        return BundleError(f"{self.where}: machine.libvirt.own: {what if what.isprintable() else repr(what)}: "
                           f"not an option an exact replay repeats")

    def option(self, opt: str, value: str | None) -> list[str]:
        if opt in DROPPED:
            return []
        if opt in KEPT:
            return [opt] if value is None else [opt, value]
        if value is None:
            raise self.refuse(opt)
        handler = {"-machine": self.machine, "-accel": self.accel, "-rtc": self.rtc, "-boot": self.boot,
                   "-global": self.global_, "-device": self.device, "-object": self.object_,
                   "-blockdev": self.blockdev, "-netdev": self.netdev, "-chardev": self.chardev,
                   "-display": self.display, "-audiodev": self.audiodev, "-kernel": self.boot_file,
                   "-initrd": self.boot_file}.get(opt)
        if handler is None:
            raise self.refuse(opt)
        try:
            return handler(opt, value)
        except (ValueError, TypeError, AttributeError):     # JSON of another shape than the option's
            raise self.refuse(f"{opt} {value}") from None

    def _keys(self, opt: str, value: str, implied: str, allowed: set[str]) -> None:
        kv = _keyval(value, implied)
        if bad := set(kv) - allowed:
            raise self.refuse(f"{opt} {sorted(bad)[0]}=")

    def machine(self, opt: str, value: str) -> list[str]:
        self._keys(opt, value, "type", MACHINE_KEYS)
        if any(k in _keyval(value, "type") for k in ("pflash0", "pflash1")):
            raise self.refuse(f"{opt} pflash (UEFI firmware)")
        return [opt, value]

    def accel(self, opt: str, value: str) -> list[str]:
        self._keys(opt, value, "type", ACCEL_KEYS)
        if _keyval(value, "type").get("type") != "tcg":
            raise self.refuse(f"{opt} {value} (record/replay runs under TCG)")
        return [opt, value]

    def rtc(self, opt: str, value: str) -> list[str]:
        self._keys(opt, value, "base", RTC_KEYS)
        return [opt, value]

    def boot(self, opt: str, value: str) -> list[str]:
        self._keys(opt, value, "order", BOOT_KEYS)
        return [opt, value]

    def display(self, opt: str, value: str) -> list[str]:
        if value != "none":
            raise self.refuse(f"{opt} {value}")
        return [opt, value]

    def audiodev(self, opt: str, value: str) -> list[str]:
        dev = _json(value) or _keyval(value, "driver")
        if dev.get("driver") != "none" or set(dev) - {"id", "driver"}:
            raise self.refuse(f"{opt} {value}")
        return [opt, value]

    def global_(self, opt: str, value: str) -> list[str]:
        kv = _keyval(value, "")
        prop = kv.get("property") or next((k.rpartition(".")[2] for k in kv if "." in k), "")
        if prop not in GLOBAL_PROPERTIES:
            raise self.refuse(f"{opt} {value}")
        return [opt, value]

    def boot_file(self, opt: str, value: str) -> list[str]:
        if value != self.kernel.get(opt):
            raise self.refuse(f"{opt} {value} (not the manifest's)")
        return [opt, value]

    def device(self, opt: str, value: str) -> list[str]:
        dev = _json(value)
        if dev is None or dev.get("driver") not in DEVICES:
            raise self.refuse(f"{opt} {value}")
        if any(dev.get(k) for k in DEVICE_FILES):
            raise self.refuse(f"{opt} {dev['driver']} romfile")
        return [opt, value]

    def object_(self, opt: str, value: str) -> list[str]:
        obj = _json(value)
        if obj is None or obj.get("qom-type") not in OBJECTS:
            raise self.refuse(f"{opt} {value}")
        if obj["qom-type"] == "secret":
            return []       # libvirt's master key, for secrets the domain does not have
        if set(obj) - {"qom-type", "id", "size", "x-use-canonical-path-for-ramblock-id", "prealloc", "share"}:
            raise self.refuse(f"{opt} {value}")
        return [opt, value]

    def blockdev(self, opt: str, value: str) -> list[str]:
        node = _json(value)
        if node is None or node.get("driver") not in BLOCK_DRIVERS or set(node) - BLOCK_KEYS:
            raise self.refuse(f"{opt} {value}")
        if node["driver"] != "file":
            return [opt, value]
        name = str(node.get("filename"))
        if name in self.overlays:
            return [opt, json_option({**node, "filename": self.overlays[name]})]
        if name not in self.disks:
            raise self.refuse(f"{opt} {name} (neither a recorded disk nor its overlay)")
        # A recorded base is only read: a node over it that would write fails to open.
        return [opt, json_option({**{k: v for k, v in node.items() if k != "auto-read-only"}, "read-only": True})]

    def netdev(self, opt: str, value: str) -> list[str]:
        dev = _json(value)
        if dev is None or dev.get("type") != "tap" or not isinstance(dev.get("id"), str) or \
                set(dev) - {"type", "fd", "vhost", "id", "vnet_hdr", "sndbuf"}:
            raise self.refuse(f"{opt} {value}")
        if not self.taps:
            raise self.refuse(f"{opt} {value} (more netdevs than the recording's NICs)")
        return [opt, json_option({"type": "tap", "id": dev["id"], "fd": str(self.taps.pop(0)), "vhost": False})]

    def chardev(self, opt: str, value: str) -> list[str]:
        cid = (_json(value) or _keyval(value, "backend")).get("id")
        if not cid:
            raise self.refuse(f"{opt} {value}")
        return [opt, keyval_option("null", {"id": cid})]


def replay_argv(own: OwnLine, *, binary: str, overlays: Sequence[Path], disks: Sequence[str],
                kernel: str | None, initrd: str | None, taps: Sequence[int], where: str) -> list[str]:
    """libvirt's recorded part of a domain's command line (own.argv) for its replay by
    `binary`: each option checked (a BundleError names the first not repeated), the
    recorded overlays (own.overlays) replaced by `overlays` (in the disks' order), every
    file named one of them or of `disks` (the recorded bases, then only read) or the
    manifest's kernel and initrd, each chardev a null one, each tap one of `taps` (the
    replay's own, descriptors QEMU is given: qemu.tap.private_taps)."""
    if not own.argv:
        raise BundleError(f"{where}: machine.libvirt.own.argv: empty")
    t = Translation(own, overlays=overlays, disks=disks, kernel={"-kernel": kernel, "-initrd": initrd}, taps=taps,
                    where=where)
    out = [binary]
    for opt, value in _options(own.argv[1:], f"{where}: machine.libvirt.own.argv"):
        out += t.option(opt, value)
    return out


def blkreplay_node(drive: str) -> str:
    """The node name of the blkreplay over a disk: tandem's prefix and the disk device's
    alias (a drive as the device log names it, the alias or a path from it)."""
    return BLKREPLAY + drive.split("/")[0]


def blkreplay_options(drives: Sequence[str], images: Sequence[str]) -> list[str]:
    """The blkreplay node over each disk's format node (images), the disk device's drive:
    the same in the recording and its replay."""
    return [a for drive, image in zip(drives, images)
            for a in ("-blockdev", json_option({"driver": "blkreplay", "node-name": blkreplay_node(drive),
                                                "image": image}))]


def replay_command_line(own: OwnLine, guest: Guest, run: Run, *, taps: Sequence[int], vmstate: Path,
                        where: str) -> list[str]:
    """The exact replay of a domain recorded on its own command line (own): libvirt's
    options (replay_argv) on the run's overlays of the guest's disks and on `taps` (one
    per netdev, in run.host.pass_fds), then what the recording added, for the replay:
    tandem's monitor, -icount rr=replay, each disk's blkreplay, the netdevs'
    filter-replay, the device log over the same ids, and run.extra (a plugin, gdb).

    `vmstate`, a blank qcow2, is a drive of no device: savevm (`tandem replay --gdb`'s
    snapshots) writes the VM state into the first block backend that can hold it, a
    -drive's coming before any device's. Without it that is a disk's blkreplay node,
    whose flush waits for the replay's next block event while the VM is stopped, so the
    first snapshot never ends."""
    if len(own.overlays or ()) != len(guest.disks) or len(own.images or ()) != len(guest.disks) \
            or len(own.drives or ()) != len(guest.disks):
        raise BundleError(f"{where}: machine.libvirt.own: {len(own.overlays or ())} overlays, {len(own.images or ())} "
                          f"images and {len(own.drives or ())} drives for {len(guest.disks)} disks")
    if run.overlay is None:
        raise InfraError(f"{where}: the replay has no overlay for its disks")
    q = run.host.qemu or artifacts.qemu()
    argv = replay_argv(own, binary=q["binary"], overlays=[overlay_path(run.overlay, d.id) for d in guest.disks],
                       disks=[d.base for d in guest.disks], kernel=guest.kernel, initrd=guest.initrd, taps=taps,
                       where=where)
    ids = DeviceIds(own.serial, own.rng, own.drives or (), own.netdevs or ())
    scratch = ["-drive", keyval_option(None, {"if": "none", "id": VMSTATE, "format": "qcow2", "file": str(vmstate)})]
    return argv[:1] + scratch + argv[1:] + qmp_monitor(run.rundir) + clock_options(run, q) \
        + blkreplay_options(ids.drives, own.images or ()) + replay_filters(ids.netdevs) \
        + recording_objects(run, ids) + list(run.extra)
