"""Analyses of a user's VM beyond the catalogue's: a kernel the user brings
(--analysis-kernel NAME=BZIMAGE[,VMLINUX]) and files swapped into the guest
(--overlay NAME=DIR[,ANALYSIS]). Bad input is a one-line error naming the culprit before
any VM starts; what is given becomes a catalog.Analysis in the CLI, which every stage
takes as it is (the catalogue's table stays the built-in one)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path
import struct
import subprocess

import pytest

from tandem import catalog
from tandem.cli import common
from tandem.errors import TandemError
from tandem.formats.bundle import Manifest
from tandem.qemu import kernel_image
from tandem.semantic import guests, overlay

BUILT_IN = dict(catalog.ANALYSES)


@pytest.fixture(autouse=True)
def catalogue_as_built():
    """Whatever the user defines, the catalogue's table stays the built-in one."""
    yield
    assert dict(catalog.ANALYSES) == BUILT_IN


def given(analysis=(), kernels=(), overlays=()) -> list[catalog.Analysis]:
    """The analyses of a command line with these --analysis, --analysis-kernel and --overlay."""
    return common.users_analyses(argparse.Namespace(analysis=list(analysis), analysis_kernel=list(kernels),
                                                    overlay=list(overlays)))


def bzimage(path, version: bytes = b"6.12.0-mine (me@host) #1", protocol: int = 0x020F) -> str:
    """A file with the x86 boot protocol's header as a bzImage has it (boot.rst)."""
    head = bytearray(0x400)
    head[0x1FE:0x200] = b"\x55\xaa"
    head[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", head, 0x206, protocol)
    struct.pack_into("<H", head, 0x20E, 0x300 - 0x200)
    head[0x300:0x300 + len(version) + 1] = version + b"\0"
    path.write_bytes(bytes(head) + bytes(4096))
    return str(path)


def elf(path) -> str:
    path.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(57))
    return str(path)


def freebsd_kernel(path, version: bytes = b"FreeBSD 15.1-RELEASE-p1 MINE", pvh: bool = True) -> str:
    """An amd64 FreeBSD kernel as QEMU sees it: an ELF file of OS ABI 9 whose PT_NOTE has
    the Xen PVH entry note (type 18, XEN_ELFNOTE_PHYS32_ENTRY), and its version string."""
    note = struct.pack("<III", 4, 4, 18 if pvh else 6) + b"Xen\0" + struct.pack("<I", 0x1000)
    header = struct.pack("<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01\x09" + bytes(8), 2, 62, 1, 0, 64, 0, 0,
                         64, 56, 1, 64, 0, 0)
    phdr = struct.pack("<IIQQQQQQ", 4, 4, 120, 0, 0, len(note), len(note), 4)
    path.write_bytes(header + phdr + note + bytes(64) + version + b"\0" + bytes(64))
    return str(path)


def test_a_freebsd_kernel_is_known_by_its_abi_and_pvh_note_and_says_its_version(tmp_path):
    assert kernel_image.kernel_version(freebsd_kernel(tmp_path / "kernel")) == ("freebsd",
                                                                                "FreeBSD 15.1-RELEASE-p1 MINE")
    assert kernel_image.kernel_version(bzimage(tmp_path / "bz")) == ("linux", "6.12.0-mine (me@host) #1")
    mine = common.bring_kernel(f"mine={freebsd_kernel(tmp_path / 'k')},{elf(tmp_path / 'kernel.debug')}")
    assert (mine.os, mine.kernel.vmlinux, mine.kernel.memory_mb) == ("freebsd", str(tmp_path / "kernel.debug"), 512)
    with pytest.raises(TandemError, match="without a PVH entry") as e:
        common.bring_kernel(f"old={freebsd_kernel(tmp_path / 'k13', pvh=False)}")
    assert str(tmp_path / "k13") in str(e.value) and "\n" not in str(e.value)


def test_a_brought_kernel_of_another_os_than_the_recorded_guest_is_refused(tmp_path):
    recorded = {"machine": {"net": {"guest_port": 7000}, "disks": [{"id": "disk0"}], "os": "linux"},
                "users_guest": True}
    mine = common.bring_kernel(f"mine={freebsd_kernel(tmp_path / 'k')}")
    with pytest.raises(TandemError, match="analysis mine: your kernel is freebsd's; .* is of a linux guest"):
        guests.analysis_guest(tmp_path, Manifest.from_json(recorded), mine)


def test_a_bzimage_is_known_by_its_boot_header_and_says_its_version(tmp_path):
    assert kernel_image.bzimage_version(bzimage(tmp_path / "bz")) == "6.12.0-mine (me@host) #1"


@pytest.mark.parametrize("make, says", [
    (lambda p: p.write_text("#!/bin/sh\necho not a kernel\n"), "not a Linux kernel image"),
    (lambda p: p.write_bytes(b""), "not a Linux kernel image"),
    (lambda p: elf(p), r"an ELF file \(a vmlinux\?\), not a bzImage"),
    (lambda p: bzimage(p, protocol=0x0105), "boot protocol 1.05"),
    (lambda p: p.mkdir(), "a directory"),
    (lambda p: None, "not found"),
])
def test_a_file_that_is_not_a_kernel_is_refused_naming_it(tmp_path, make, says):
    path = tmp_path / "kernel"
    make(path)
    with pytest.raises(TandemError, match=says) as e:
        common.bring_kernel(f"mine={path}")
    assert str(path) in str(e.value) and "mine" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("spec, says", [
    ("mine", "give NAME=BZIMAGE"),
    ("=BZ", "give NAME=BZIMAGE"),
    ("mine=", "give NAME=BZIMAGE"),
    ("kasan=BZ", "a built-in analysis has it"),
    ("My Kernel=BZ", "lower-case letters"),
    ("../up=BZ", "lower-case letters"),
])
def test_a_malformed_kernel_option_is_refused_before_any_file_is_read(spec, says):
    with pytest.raises(TandemError, match=says):
        common.bring_kernel(spec)


def test_a_brought_kernel_is_an_analysis_that_the_command_line_names(tmp_path):
    image, vmlinux = bzimage(tmp_path / "bz"), elf(tmp_path / "vmlinux")
    a = common.bring_kernel(f"mine={image},{vmlinux}")
    assert (a.name, a.kernel.image, a.kernel.vmlinux, a.demo, a.os) == ("mine", image, vmlinux, False, "linux")
    assert given(["kasan,mine"], [f"mine={image},{vmlinux}"]) == [catalog.ANALYSES["kasan"], a]
    with pytest.raises(TandemError, match="vmlinux .*not a 64-bit ELF"):
        common.bring_kernel(f"other={image},{image}")
    with pytest.raises(TandemError, match="given twice, differently"):
        given(kernels=[f"mine={image},{vmlinux}", f"mine={image}"])
    with pytest.raises(TandemError, match=r"unknown analysis 'nosuch' \(known: native, .*, asan-userland, .*mine\)"):
        given(["nosuch"], [f"mine={image}"])


def test_a_brought_kernel_boots_the_users_disks_not_the_demo_guest(tmp_path):
    mine = common.bring_kernel(f"mine={bzimage(tmp_path / 'bz')}")
    demo = Manifest.from_json({"machine": {"net": {"guest_port": 7000}, "disks": [{"id": "disk0"}]}})
    with pytest.raises(TandemError, match="a kernel you bring analyses a recording of your own VM"):
        guests.analysis_guest(tmp_path, demo, mine)


def tree(root, files: dict[str, bytes]):
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def test_an_overlay_is_a_tree_laid_out_as_the_guests_root(tmp_path):
    d = tree(tmp_path / "ovl", {"usr/bin/redis-server": b"\x7fELF" + bytes(100),
                                "var/www/html/index.html": b"<p>changed</p>\n"})
    os.symlink("redis-server", d / "usr/bin/redis-check-rdb")
    assert overlay.check_tree(str(d)) == (3, 104 + 15)
    a = common.swap_files(f"changed={d}")
    assert (a.name, a.overlay, a.kernel, a.userland.name) == ("changed", str(d), catalog.KERNELS["native"], "native")
    assert common.swap_files(f"changed-kasan={d},kasan").flavor == "kasan"


def test_an_overlay_may_be_on_a_brought_kernel(tmp_path):
    d = tree(tmp_path / "ovl", {"etc/x": b"x"})
    image = bzimage(tmp_path / "bz")
    mine, swapped = given(kernels=[f"mine={image}"], overlays=[f"swapped={d},mine", f"swapped={d},mine"])
    assert (swapped.name, swapped.kernel, swapped.overlay) == ("swapped", mine.kernel, str(d))


@pytest.mark.parametrize("make, says", [
    (lambda d: None, "not found"),
    (lambda d: d.write_text("x"), "not a directory"),
    (lambda d: d.mkdir(), "no files in it"),
    (lambda d: tree(d, {"etc/a file": b"x"}), "a name with white space"),
    (lambda d: (tree(d, {"etc/x": b"x"}), os.mkfifo(d / "etc/fifo")), "not a regular file"),
])
def test_a_bad_overlay_is_refused_naming_it(tmp_path, make, says):
    d = tmp_path / "ovl"
    make(d)
    with pytest.raises(TandemError, match=says):
        common.swap_files(f"changed={d}")


def test_an_overlay_on_an_unknown_analysis_is_refused(tmp_path):
    d = tree(tmp_path / "ovl", {"etc/x": b"x"})
    with pytest.raises(TandemError, match="unknown analysis 'nosuch'"):
        common.swap_files(f"changed={d},nosuch")


def test_the_preparation_initramfs_holds_busybox_init_and_the_tree_as_root(tmp_path):
    d = tree(tmp_path / "ovl", {"usr/bin/redis-server": b"binary", "etc/redis/redis.conf": b"port 6379\n"})
    (d / "usr/bin/redis-server").chmod(0o755)
    out = tmp_path / "o.cpio"
    later = tree(tmp_path / "later", {"etc/redis/redis.conf": b"port 6380\n"})
    overlay.initramfs([str(d), str(later)], out)
    listing = subprocess.run(["cpio", "-itv", "--quiet"], input=out.read_bytes(), capture_output=True,
                             check=True).stdout.decode()
    rows = {line.split()[-1]: line.split() for line in listing.splitlines()}
    assert {"init", "bin/busybox", "files/usr/bin/redis-server", "files/etc/redis/redis.conf"} <= set(rows)
    assert rows["files/usr/bin/redis-server"][0] == "-rwxr-xr-x"
    assert all(r[2] == "root" and r[3] == "root" for r in rows.values())
    assert rows["init"][0] == "-rwxr-xr-x"
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    subprocess.run(["cpio", "-id", "--quiet"], input=out.read_bytes(), cwd=unpacked, check=True)
    assert (unpacked / "files/etc/redis/redis.conf").read_bytes() == b"port 6380\n"     # the later tree's


def console_log(bundle_dir, *chunks: bytes) -> None:
    from tandem.formats import bundle, pcapng
    w = pcapng.PcapngWriter(bundle_dir / bundle.DEVLOG)
    i = w.add_interface("serial0", "serial")
    for n, c in enumerate(chunks):
        w.event(i, "out", n * 1000, c)
    w.f.close()


def test_the_native_kernels_release_is_read_from_its_console(tmp_path):
    console_log(tmp_path, b"SeaBIOS\r\n[    0.000000] Linux version 6.12.95-tand", b"em (tandem@tandem) #1\r\n")
    assert guests.recorded_release(tmp_path) == "6.12.95-tandem"
    other = tmp_path / "other"
    other.mkdir()
    console_log(other, b"[    0.000000] Linux version 6.1.0-56-amd64 (debian-kernel@lists.debian.org)")  # no end yet
    assert guests.recorded_release(other) is None


def test_a_native_on_tandems_kernel_gets_the_flavors_own_modules(tmp_path, monkeypatch):
    """The native ran tandem's kernel of the flavor's release: the analysis's tree has the
    flavor's build of each module where the native's own are; another release, a brought
    kernel: none."""
    kasan_ko = tmp_path / "kasan" / "tandem_bugs.ko"
    kasan_ko.parent.mkdir()
    kasan_ko.write_bytes(b"\x7fELF kasan build")
    monkeypatch.setattr(guests.artifacts, "kernel", lambda flavor: {"version": "6.12.95-tandem"})
    monkeypatch.setattr(guests.artifacts, "modules", lambda flavor: {"modules": [str(kasan_ko)]})
    console_log(tmp_path, b"[    0.000000] Linux version 6.12.95-tandem (tandem@tandem) #1\r\n")
    tree = guests.flavor_modules(catalog.ANALYSES["kasan"], tmp_path, tmp_path / "work")
    assert tree is not None
    assert (Path(tree) / "lib/modules/6.12.95-tandem/extra/tandem_bugs.ko").read_bytes() == b"\x7fELF kasan build"
    monkeypatch.setattr(guests.artifacts, "kernel", lambda flavor: {"version": "6.12.96-tandem"})
    assert guests.flavor_modules(catalog.ANALYSES["kasan"], tmp_path, tmp_path / "work2") is None
    mine = common.bring_kernel(f"mine={bzimage(tmp_path / 'bz')}")
    assert guests.flavor_modules(mine, tmp_path, tmp_path / "work3") is None
