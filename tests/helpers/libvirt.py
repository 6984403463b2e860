"""Driving a private libvirtd as a user would: virsh, the domains it lists, a native
domain's XML as a user writes it."""
from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

from tandem import artifacts
from tandem.libvirt import daemon, shadows
from tandem.machine import Guest
from tandem.qemu.image import make_overlay


def virsh(uri: str, *args: str, check: bool = True) -> str:
    r = subprocess.run(["virsh", "-c", uri, *args], check=False, capture_output=True, text=True, timeout=60)
    if check:
        assert r.returncode == 0, f"virsh {' '.join(args)}: {r.stderr}"
    return r.stdout


def names(uri: str, *flags: str) -> set[str]:
    return {n for n in virsh(uri, "list", "--name", *flags).split() if n}


def native_xml(tmp_path: Path, name: str = "web", nic: str = "virtio", flavor: str | None = None,
               mac: str = "52:54:00:7a:6e:01") -> str:
    """A domain as a user writes it for libvirt: a disk, tandem's kernel (of `flavor`: the
    demo guest's default, or a FreeBSD one, whose guest has no initramfs), user networking;
    no CPU model of tandem's."""
    g = Guest.default(flavor) if flavor else Guest.default()
    disk = tmp_path / f"{name}.qcow2"
    make_overlay(g.disk.base, disk)
    initrd = f"<initrd>{g.initrd}</initrd>" if g.initrd else ""
    return f"""<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>{g.memory_mb}</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{g.kernel}</kernel>{initrd}<cmdline>{g.cmdline}</cmdline></os>
  <devices>
    <emulator>{artifacts.qemu()['binary']}</emulator>
    <disk type='file' device='disk'><driver name='qemu' type='qcow2'/>
      <source file='{disk}'/><target dev='vda' bus='virtio'/></disk>
    <interface type='user'><mac address='{mac}'/><model type='{nic}'/></interface>
  </devices>
</domain>"""


def firmware_xml(name: str, disks: list[tuple[Path, str]], memory_mb: int = 512,
                 mac: str = "52:54:00:7a:6e:01") -> str:
    """A domain its firmware boots from its first disk (no <kernel>), as a user defines a VM
    installed from an image: its disks [(file, format)] on virtio (vda, vdb, ...), one virtio
    NIC on user networking."""
    devices = "".join(f"""
    <disk type='file' device='disk'><driver name='qemu' type='{fmt}'/>
      <source file='{path}'/><target dev='vd{chr(ord("a") + i)}' bus='virtio'/></disk>"""
                      for i, (path, fmt) in enumerate(disks))
    return f"""<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>{memory_mb}</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os>
  <devices>
    <emulator>{artifacts.qemu()['binary']}</emulator>{devices}
    <interface type='user'><mac address='{mac}'/><model type='virtio'/></interface>
  </devices>
</domain>"""


def shadow_pid(d: daemon.Libvirtd, name: str) -> int:
    return int((d.dir / "run" / "libvirt" / "qemu" / f"{name}.pid").read_text())


def tandem_metadata(uri: str, name: str) -> dict[str, str]:
    """Paths tandem names in a domain's <metadata> (run directory, sockets)."""
    root = ET.fromstring(virsh(uri, "dumpxml", name))
    md = root.find(f"metadata/{{{shadows.NS}}}*")
    out = {k: v for k, v in md.attrib.items()}
    for e in md:
        if shadows._local(e.tag) == "original":
            out["original"] = e.text
        elif e.get("path"):
            out[e.get("role") or shadows._local(e.tag)] = e.get("path")
    return out
