"""Disk images: what a user's image is (qemu-img info) and the qcow2 overlays every run
writes through, so that no base image is ever written."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import artifacts, private
from ..errors import TandemError
from ..machine import DISK_FORMATS, Guest
from .argv import overlay_path

SECTOR = 512


@dataclass(frozen=True)
class DiskImage:
    """A user's disk image as qemu-img reads it."""
    path: str
    format: str             # raw or qcow2
    virtual_size: int       # bytes the guest sees


def probe_disk(path: str) -> DiskImage:
    """What the image at path is, or a one-line error naming it: not found, not a file, an
    image qemu-img cannot read, a format tandem does not take, a qcow2 with a backing file
    (its base would change under the recording unseen: the manifest hashes one file), or
    a raw file that is no whole number of sectors (a text file, a kernel: not a disk)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise TandemError(f"disk {path}: {'not found' if e.errno == 2 else e.strerror}") from None
    if not stat.S_ISREG(st.st_mode) and not stat.S_ISBLK(st.st_mode):
        raise TandemError(f"disk {path}: not a file (a disk image: qcow2 or raw)")
    # -U: the image may be open in a running VM (read only here); the format is read, not guessed
    # by QEMU at run time: the run is given it explicitly.
    r = subprocess.run([artifacts.qemu()["img"], "info", "-U", "--output=json", path],
                       capture_output=True, text=True)
    if r.returncode:
        why = (r.stderr.strip().splitlines() or [f"status {r.returncode}"])[-1]
        raise TandemError(f"disk {path}: not a disk image qemu-img can read ({why})")
    try:
        info = json.loads(r.stdout)
        fmt, size = str(info["format"]), int(info["virtual-size"])
    except (ValueError, KeyError, TypeError) as e:
        raise TandemError(f"disk {path}: qemu-img info gave no format and size ({e})") from None
    if fmt not in DISK_FORMATS:
        raise TandemError(f"disk {path}: a {fmt} image; tandem takes {' or '.join(DISK_FORMATS)} "
                          f"(qemu-img convert -O qcow2 {path} NEW.qcow2)")
    if info.get("backing-filename"):
        raise TandemError(f"disk {path}: a qcow2 over a backing file ({info['backing-filename']}); give tandem a "
                          f"standalone image (qemu-img convert -O qcow2 {path} NEW.qcow2)")
    if fmt == "raw" and stat.S_ISREG(st.st_mode):
        size = st.st_size       # qemu-img rounds a raw file up to whole sectors
    if fmt == "raw" and (size == 0 or size % SECTOR):
        raise TandemError(f"disk {path}: {size} bytes, not a whole number of {SECTOR}-byte sectors: "
                          f"not a disk image")
    return DiskImage(path, fmt, size)


def check_bootable(image: DiskImage) -> None:
    """The disk SeaBIOS is to boot has a boot sector (0x55 0xAA at byte 510 of its first
    sector: an MBR, or a GPT disk's protective MBR), or a one-line error: without one
    SeaBIOS says "No bootable device" on a screen tandem's VMs do not have, and the
    recording would run until stopped with nothing to show. Read through qemu-img, so a
    qcow2's first sector is read as the guest sees it."""
    with tempfile.TemporaryDirectory(prefix="tandem-mbr-") as tmp:
        out = Path(tmp) / "mbr"
        r = subprocess.run([artifacts.qemu()["img"], "dd", "-U", "-f", image.format, "-O", "raw", "bs=512",
                            "count=1", f"if={image.path}", f"of={out}"], capture_output=True, text=True)
        if r.returncode:
            why = (r.stderr.strip().splitlines() or [f"status {r.returncode}"])[-1]
            raise TandemError(f"disk {image.path}: its first sector cannot be read ({why})")
        sector = out.read_bytes()
    if sector[510:512] != b"\x55\xaa":
        raise TandemError(f"disk {image.path}: no boot sector (no 55 AA signature at byte 510), so it cannot "
                          f"boot by its bootloader; boot a kernel directly with --kernel-image and --append root=...")


def make_overlay(base: str, overlay: Path, fmt: str = "raw") -> None:
    """A qcow2 overlay so the base image (of format fmt) is never written."""
    img = artifacts.qemu()["img"]
    r = subprocess.run([img, "create", "-q", "-f", "qcow2", "-b", str(Path(base).resolve()),
                        "-F", fmt, str(overlay)], capture_output=True, text=True,
                       umask=private.CHILD_UMASK)      # the overlay holds the guest's disk writes
    if r.returncode:
        why = r.stderr.strip() or r.stdout.strip() or (f"killed by signal {-r.returncode}" if r.returncode < 0
                                                        else "no message")
        raise TandemError(f"{overlay}: qemu-img create failed (status {r.returncode}): {why}")


def make_overlays(guest: Guest, first: Path) -> None:
    """A qcow2 overlay over each disk's base: `first` for disk0, the others beside it
    (argv.overlay_path names them: QEMU's command line and this agree)."""
    for disk in guest.disks:
        make_overlay(disk.base, overlay_path(first, disk.id), disk.format)
