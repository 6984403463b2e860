"""The root device an analysis kernel mounts on a user's VM: root=UUID= and
LABEL= looked up in the disks' ext file systems through qemu-img (raw and qcow2, MBR and
GPT), named /dev/vdXN; hostile partition tables read no further than they make sense."""
from __future__ import annotations

import struct
import subprocess
import uuid

import pytest

from tandem import artifacts
from tandem.errors import TandemError
from tandem.formats.bundle import Manifest
from tandem.machine import Disk
from tandem.qemu.image import disk_os, freebsd_root, partitions, root_device
from tandem.semantic import guests

UUID = "2f6e1c8a-5b3d-4e7a-9c21-7d4b8e0f6a13"
MIB = 1 << 20


def mbr(entries: list[tuple[int, int, int]]) -> bytes:
    """A boot sector with primary partitions (type, first LBA, sectors)."""
    table = b"".join(struct.pack("<B3xB3xII", 0, kind, lba, n) for kind, lba, n in entries)
    return bytes(446) + table.ljust(64, b"\0") + b"\x55\xaa"


def disk(tmp_path, name: str = "d.raw", *, gpt: bool = False, kinds: tuple[str, str] | None = None) -> str:
    """A 12 MiB raw disk: an ext4 root (UUID, label 'root') in partition 2 at 4 MiB,
    a partition 1 at 1 MiB with no file system; a GPT's entries of the given types (GUIDs),
    else random ones."""
    path = tmp_path / name
    path.write_bytes(bytes(12 * MIB))
    subprocess.run(["mkfs.ext4", "-q", "-F", "-U", UUID, "-L", "root", "-E", f"offset={4 * MIB}", str(path),
                    "6M"], check=True, capture_output=True)
    with open(path, "r+b") as f:
        if gpt:
            f.write(mbr([(0xEE, 1, 12 * MIB // 512 - 1)]))
            kind = [uuid.UUID(k) for k in kinds] if kinds else [uuid.uuid4(), uuid.uuid4()]
            entry = lambda k, first, last: k.bytes_le + uuid.uuid4().bytes + struct.pack("<QQ", first, last)  # noqa: E731
            table = (entry(kind[0], 2048, 4095) + bytes(80) + entry(kind[1], 8192, 20479) + bytes(80)).ljust(128 * 128, b"\0")
            f.seek(512)
            f.write(b"EFI PART" + bytes(64) + struct.pack("<QII", 2, 128, 128))
            f.seek(1024)
            f.write(table)
        else:
            f.write(mbr([(0x83, 2048, 2048), (0x83, 8192, 12288)]))
    return str(path)


def qcow2(raw: str) -> str:
    out = raw + ".qcow2"
    subprocess.run([artifacts.qemu()["img"], "convert", "-f", "raw", "-O", "qcow2", raw, out], check=True)
    return out


@pytest.mark.parametrize("gpt", [False, True])
def test_root_by_uuid_or_label_is_the_partition_holding_it(tmp_path, gpt):
    raw = disk(tmp_path, gpt=gpt)
    for path, fmt in ((raw, "raw"), (qcow2(raw), "qcow2")):
        parts = partitions(path, fmt)
        assert [(p.number, p.offset, p.fs_uuid, p.fs_label) for p in parts] == \
            [(1, MIB, None, None), (2, 4 * MIB, UUID, "root")]
        other = Disk(str(tmp_path / "d.raw"), "raw", id="disk0")
        d = Disk(path, fmt, id="disk1")
        assert root_device((d,), f"UUID={UUID.upper()}") == "/dev/vda2"
        assert root_device((other, d), "LABEL=root") == "/dev/vda2"     # the first disk holding it
        assert root_device((d,), "/dev/sda7") == "/dev/sda7" and root_device((d,), "PARTUUID=x-02") == "PARTUUID=x-02"


def test_a_root_not_on_the_disks_is_a_one_line_error(tmp_path):
    d = Disk(disk(tmp_path), "raw")
    with pytest.raises(TandemError, match=r"root=UUID=0000.*give the analysis's root device with --root"):
        root_device((d,), "UUID=00000000-0000-0000-0000-000000000000")


def test_hostile_partition_tables_are_read_no_further_than_the_image(tmp_path):
    path = tmp_path / "h.raw"
    # partitions far past the image's end, a GPT header claiming a huge table past it
    path.write_bytes(mbr([(0x83, 1 << 31, 1 << 30), (0xEE, 1, 100)]) + b"EFI PART" + bytes(64)
                     + struct.pack("<QII", 1 << 40, 1 << 31, 1 << 31) + bytes(MIB))
    assert partitions(str(path), "raw") == []
    path.write_bytes(mbr([(0x83, 1 << 31, 1 << 30)]) + bytes(MIB))
    assert [(p.number, p.fs_uuid) for p in partitions(str(path), "raw")] == [(1, None)]
    path.write_bytes(bytes(MIB))                        # no boot sector at all
    assert partitions(str(path), "raw") == []


def test_the_root_a_guest_booted_with_is_read_from_its_console(tmp_path):
    from tandem.formats import pcapng

    class Reader:
        def __init__(self, _path):
            pass

        def __iter__(self):
            chunks = [b"SeaBIOS\r\nBooting from Hard Disk...\r\n[    0.000000] Command line: BOOT_IMAGE=/boot/vmlinuz",
                      b" root=UUID=" + UUID.encode() + b" ro console=ttyS0\r\n[    0.1] more"]
            return iter(pcapng.Event(i, 1, "serial0", "serial", "out", i, i, c, 0) for i, c in enumerate(chunks))
    m = {"machine": {"cmdline": "", "disks": [{"id": "disk0"}], "net": {"forwards": []}}}
    orig = guests.pcapng.DevlogReader
    guests.pcapng.DevlogReader = Reader
    try:
        assert guests.recorded_root(tmp_path, Manifest.from_json(m)) == f"UUID={UUID}"
    finally:
        guests.pcapng.DevlogReader = orig
    direct = Manifest.from_json({"machine": {"cmdline": "console=ttyS0 root=/dev/vdb1"}})
    assert guests.recorded_root(tmp_path, direct) == "/dev/vdb1"
    assert Manifest.from_json(m).users_guest
    demo = {"machine": {**m["machine"], "net": {"hostfwd_port": 4000, "guest_port": 7000}}}
    assert not Manifest.from_json(demo).users_guest


FREEBSD_BOOT, FREEBSD_UFS = "83bd6b9d-7f41-11dc-be0b-001560b84f0f", "516e7cb6-6ecf-11d6-8ff8-00022d09712b"
LINUX_FS = "0fc63daf-8483-4772-8e79-3d69d8477de4"


def test_a_disk_with_freebsd_partitions_is_freebsd_and_its_ufs_is_the_root(tmp_path):
    """gpart's types (as `mkimg -p freebsd-boot -p freebsd-ufs` writes them) say FreeBSD;
    Linux's, an MBR's 0x83 or none say nothing; the root is the first freebsd-ufs, on the
    disk it is on (vtbd1 when the second)."""
    fb = disk(tmp_path, "fb.raw", gpt=True, kinds=(FREEBSD_BOOT, FREEBSD_UFS))
    for path, fmt in ((fb, "raw"), (qcow2(fb), "qcow2")):
        assert [p.kind for p in partitions(path, fmt)] == [FREEBSD_BOOT, FREEBSD_UFS]
        assert disk_os(path, fmt) == "freebsd"
    linux = disk(tmp_path, "linux.raw", gpt=True, kinds=(LINUX_FS, LINUX_FS))
    assert disk_os(linux, "raw") is None and disk_os(disk(tmp_path, "mbr.raw"), "raw") is None
    assert [p.kind for p in partitions(disk(tmp_path, "mbr2.raw"), "raw")] == ["0x83", "0x83"]
    assert freebsd_root((Disk(fb, "raw"),)) == "ufs:/dev/vtbd0p2"
    assert freebsd_root((Disk(linux, "raw"), Disk(fb, "raw"))) == "ufs:/dev/vtbd1p2"
    assert freebsd_root((Disk(linux, "raw"),)) is None


def test_a_freebsd_guests_root_is_the_one_its_kernel_tried_else_its_ufs_partition(tmp_path):
    """A loader's boot shows no command line: the root is the one the kernel printed it
    tried (vfs_mountroot.c), read from a real devlog; without it on the console, the disks'
    freebsd-ufs partition; a direct boot's vfs.root.mountfrom before both."""
    from tandem.formats import bundle, pcapng
    from tandem.machine import Guest
    fb = disk(tmp_path, "fb.raw", gpt=True, kinds=(FREEBSD_BOOT, FREEBSD_UFS))
    w = pcapng.PcapngWriter(tmp_path / bundle.DEVLOG)
    serial = w.add_interface("serial0", "serial")
    for i, chunk in enumerate([b"Consoles: internal video/keyboard  serial port\r\nBIOS drive C: is disk0\r\n",
                               b"Loading kernel...\r\n/boot/kernel/kernel text=0x1\r\nTrying to mount root ",
                               b"from ufs:/dev/gpt/rootfs [rw]...\r\n"]):
        w.event(serial, "out", i * 1000, chunk)
    w.close(10_000)
    guest = Guest.of_disks([(fb, "raw")], os="freebsd")
    assert guests.freebsd_recorded_root(tmp_path, guest) == "ufs:/dev/gpt/rootfs"
    (tmp_path / bundle.DEVLOG).unlink()
    w = pcapng.PcapngWriter(tmp_path / bundle.DEVLOG)
    w.add_interface("serial0", "serial")
    w.close(10_000)
    assert guests.freebsd_recorded_root(tmp_path, guest) == "ufs:/dev/vtbd0p2"
    direct = Guest.of_disks([(fb, "raw")], kernel="k", append="vfs.root.mountfrom=ufs:/dev/vtbd0", os="freebsd")
    assert guests.freebsd_recorded_root(tmp_path, direct) == "ufs:/dev/vtbd0"
