"""Disk images: what a user's image is (qemu-img info) and the qcow2 overlays every run
writes through, so that no base image is ever written."""
from __future__ import annotations

import json
import os
import stat
import struct
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from .. import artifacts, private
from ..errors import InfraError, TandemError
from ..machine import DISK_FORMATS, Disk, Guest
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
    _qcow2(overlay, ["-b", str(Path(base).resolve()), "-F", fmt])


def make_blank(path: Path, size: int = 1 << 20) -> None:
    """An empty qcow2 of `size` bytes (a store for savevm's VM state, which qcow2 keeps
    past the disk's end, so the size is only the disk's)."""
    _qcow2(path, [], [str(size)])


def _qcow2(path: Path, backing: list[str], size: list[str] | None = None) -> None:
    """qemu-img create of a qcow2 at path: over a backing file (backing's options), or
    of a size (an overlay takes its backing file's)."""
    img = artifacts.qemu()["img"]
    r = subprocess.run([img, "create", "-q", "-f", "qcow2", *backing, str(path), *(size or [])], capture_output=True,
                       text=True, umask=private.CHILD_UMASK)      # it holds the guest's disk writes or RAM
    if r.returncode:
        why = r.stderr.strip() or r.stdout.strip() or (f"killed by signal {-r.returncode}" if r.returncode < 0
                                                        else "no message")
        raise InfraError(f"{path}: qemu-img create failed (status {r.returncode}): {why}")


def make_overlays(guest: Guest, first: Path) -> None:
    """A qcow2 overlay over each disk's base: `first` for disk0, the others beside it
    (argv.overlay_path names them: QEMU's command line and this agree)."""
    for disk in guest.disks:
        make_overlay(disk.base, overlay_path(first, disk.id), disk.format)


def read_bytes(path: str, fmt: str, offset: int, length: int) -> bytes:
    """`length` bytes of a disk image at `offset`, as the guest sees them (qemu-img dd:
    a qcow2 is read through its format); shorter at the image's end."""
    first, last = offset // 512, -(-(offset + length) // 512)
    with tempfile.TemporaryDirectory(prefix="tandem-read-") as tmp:
        out = Path(tmp) / "part"
        # qemu-img dd: skip= and count= in bs-sized blocks, count= from the image's start
        r = subprocess.run([artifacts.qemu()["img"], "dd", "-U", "-f", fmt, "-O", "raw", "bs=512",
                            f"skip={first}", f"count={last}", f"if={path}", f"of={out}"],
                           capture_output=True, text=True)
        if r.returncode:
            why = (r.stderr.strip().splitlines() or [f"status {r.returncode}"])[-1]
            raise TandemError(f"disk {path}: bytes {offset}..{offset + length} cannot be read ({why})")
        data = out.read_bytes()
    return data[offset - first * 512:offset - first * 512 + length]


@dataclass(frozen=True)
class Partition:
    """A partition of a disk image and the ext2/3/4 file system on it, if any."""
    number: int                 # as Linux numbers it (vda1 is 1)
    offset: int                 # bytes
    size: int
    fs_uuid: str | None = None  # the ext superblock's UUID, lower case
    fs_label: str | None = None
    kind: str = ""              # a GPT entry's type GUID (lower case), an MBR entry's type (0x83)


EXT_MAGIC = 0xEF53
GPT_SIGNATURE = b"EFI PART"
# The partition types FreeBSD's gpart(8) creates: freebsd (a BSD label), -boot, -swap, -ufs,
# -vinum, -zfs; and an MBR slice of FreeBSD's.
FREEBSD_KINDS = frozenset({"516e7cb4-6ecf-11d6-8ff8-00022d09712b", "83bd6b9d-7f41-11dc-be0b-001560b84f0f",
                           "516e7cb5-6ecf-11d6-8ff8-00022d09712b", "516e7cb6-6ecf-11d6-8ff8-00022d09712b",
                           "516e7cb8-6ecf-11d6-8ff8-00022d09712b", "516e7cba-6ecf-11d6-8ff8-00022d09712b", "0xa5"})
FREEBSD_UFS = "516e7cb6-6ecf-11d6-8ff8-00022d09712b"


def partitions(path: str, fmt: str) -> list[Partition]:
    """The partitions of a disk image (an MBR's primary ones, or a GPT's), each with its
    ext file system's UUID and label when it has one. Everything read is the guest's
    (hostile) data: a table that points past the image or loops is read as far as it
    makes sense, never trusted for more."""
    mbr = read_bytes(path, fmt, 0, 512)
    if len(mbr) < 512 or mbr[510:512] != b"\x55\xaa":
        return []
    parts: list[tuple[int, int, int, str]] = []     # (number, first LBA, sectors, kind)
    entries = [struct.unpack_from("<B3xB3xII", mbr, 446 + 16 * i) for i in range(4)]
    if any(e[1] == 0xEE for e in entries):
        head = read_bytes(path, fmt, 512, 92)
        if head[:8] == GPT_SIGNATURE:
            table_lba, count, size = struct.unpack_from("<QII", head, 72)
            count, size = min(count, 128), max(128, min(size, 4096))
            table = read_bytes(path, fmt, table_lba * 512, count * size)
            for i in range(len(table) // size):
                first, last = struct.unpack_from("<QQ", table, i * size + 32)
                kind = table[i * size:i * size + 16]
                if kind != bytes(16) and last >= first:
                    parts.append((i + 1, first, last - first + 1, str(uuid.UUID(bytes_le=kind))))
    else:
        parts = [(i + 1, lba, n, f"{kind:#04x}") for i, (_, kind, lba, n) in enumerate(entries) if kind and n]
    return [_with_fs(path, fmt, number, lba * 512, n * 512, kind) for number, lba, n, kind in parts]


def _with_fs(path: str, fmt: str, number: int, offset: int, size: int, kind: str) -> Partition:
    sb = read_bytes(path, fmt, offset + 1024, 256)
    if len(sb) < 0x88 or struct.unpack_from("<H", sb, 0x38)[0] != EXT_MAGIC:
        return Partition(number, offset, size, kind=kind)
    u = sb[0x68:0x78].hex()
    label = sb[0x78:0x88].split(b"\0")[0].decode("ascii", "replace") or None
    return Partition(number, offset, size, f"{u[:8]}-{u[8:12]}-{u[12:16]}-{u[16:20]}-{u[20:]}", label, kind)


def disk_os(path: str, fmt: str) -> str | None:
    """The OS a firmware-booted disk is of, by its partitions' types: freebsd when any is
    FreeBSD's (gpart's freebsd-boot, -ufs, -zfs..., or an MBR slice of type 0xa5), else
    None (any other, Linux's among them: their types say nothing of the kernel)."""
    return "freebsd" if any(p.kind in FREEBSD_KINDS for p in partitions(path, fmt)) else None


def freebsd_root(disks: tuple[Disk, ...]) -> str | None:
    """The root a FreeBSD loader would mount from the disks: the first freebsd-ufs GPT
    partition, as vfs.root.mountfrom names it (ufs:/dev/vtbd0p2, virtio-blk disks in
    order); None when none has one."""
    for i, d in enumerate(disks):
        for p in partitions(d.base, d.format):
            if p.kind == FREEBSD_UFS:
                return f"ufs:/dev/vtbd{i}p{p.number}"
    return None


def root_device(disks: tuple[Disk, ...], root: str) -> str:
    """The device a kernel without an initramfs mounts for `root` (a root= value:
    UUID=, LABEL=, PARTUUID= or a device): UUID and LABEL are looked up in the disks'
    ext file systems (an initramfs resolves them; tandem's analysis kernels boot without
    one) and named /dev/vdXN by the disk's place (virtio-blk, in order)."""
    kind, _, value = root.partition("=")
    if kind not in ("UUID", "LABEL"):
        return root
    for i, d in enumerate(disks):
        for p in partitions(d.base, d.format):
            if (kind == "UUID" and p.fs_uuid == value.lower()) or (kind == "LABEL" and p.fs_label == value):
                return f"/dev/vd{chr(ord('a') + i)}{p.number}"
    raise TandemError(f"root={root}: no partition of the recording's disks has that file system "
                      f"{kind.lower()}; give the analysis's root device with --root (e.g. /dev/vda1)")
