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
from tandem.qemu.image import partitions, root_device
from tandem.semantic import guests

UUID = "2f6e1c8a-5b3d-4e7a-9c21-7d4b8e0f6a13"
MIB = 1 << 20


def mbr(entries: list[tuple[int, int, int]]) -> bytes:
    """A boot sector with primary partitions (type, first LBA, sectors)."""
    table = b"".join(struct.pack("<B3xB3xII", 0, kind, lba, n) for kind, lba, n in entries)
    return bytes(446) + table.ljust(64, b"\0") + b"\x55\xaa"


def disk(tmp_path, name: str = "d.raw", *, gpt: bool = False) -> str:
    """A 12 MiB raw disk: an ext4 root (UUID, label 'root') in partition 2 at 4 MiB,
    a partition 1 at 1 MiB with no file system."""
    path = tmp_path / name
    path.write_bytes(bytes(12 * MIB))
    subprocess.run(["mkfs.ext4", "-q", "-F", "-U", UUID, "-L", "root", "-E", f"offset={4 * MIB}", str(path),
                    "6M"], check=True, capture_output=True)
    with open(path, "r+b") as f:
        if gpt:
            f.write(mbr([(0xEE, 1, 12 * MIB // 512 - 1)]))
            entry = lambda first, last: uuid.uuid4().bytes + uuid.uuid4().bytes + struct.pack("<QQ", first, last)  # noqa: E731
            table = (entry(2048, 4095) + bytes(80) + entry(8192, 20479) + bytes(80)).ljust(128 * 128, b"\0")
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
