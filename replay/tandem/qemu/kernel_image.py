"""Kernel files a user gives tandem to boot directly (QEMU's -kernel): checked before any
VM starts, so a wrong file is a one-line error naming it rather than a VM that prints
nothing (QEMU takes some files it cannot boot and leaves SeaBIOS with no bootable device).

A bzImage is recognised by the x86 boot protocol's header (Documentation/arch/x86/boot.rst):
the boot sector signature 55 AA at 0x1FE and "HdrS" at 0x202, protocol 2.00 or later at
0x206; its version string is at 0x200 + the word at 0x20E. A vmlinux, for symbolizing
reports, is a 64-bit ELF file.

A FreeBSD kernel is an ELF file of OS ABI 9 (ELFOSABI_FREEBSD) that QEMU boots directly
through its PVH entry, a Xen ELF note of type 18 (XEN_ELFNOTE_PHYS32_ENTRY, in amd64
kernels since FreeBSD 14); its version string ("FreeBSD 15.1-RELEASE-p1 MYKERNEL") is
its `version` variable's text, found in the file as uname -v prints it.
"""
from __future__ import annotations

import mmap
import re
import struct

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from ..errors import TandemError

HEADER_BYTES = 0x10000     # the setup header and the setup code the version string is in
ELF64 = b"\x7fELF\x02"
ELFOSABI_FREEBSD = 9
XEN_ELFNOTE_PHYS32_ENTRY = 18
FREEBSD_VERSION = re.compile(rb"FreeBSD \d+\.\d+-[A-Za-z0-9.-]+ (?:#\d+ )?[A-Za-z0-9_.-]+")


def _head(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(HEADER_BYTES)
    except FileNotFoundError:
        raise TandemError(f"{what} {path}: not found") from None
    except IsADirectoryError:
        raise TandemError(f"{what} {path}: a directory, not a kernel file") from None
    except OSError as e:
        raise TandemError(f"{what} {path}: cannot read it: {e.strerror}") from None


def kernel_version(path: str, what: str = "kernel") -> tuple[str, str]:
    """(its OS, its version string) of a kernel QEMU boots directly: a Linux bzImage or a
    FreeBSD kernel with a PVH entry; anything else a one-line error naming the file."""
    if is_freebsd(path, what):
        return "freebsd", freebsd_version(path, what)
    return "linux", bzimage_version(path, what)


def is_freebsd(path: str, what: str = "kernel") -> bool:
    """Is the file an ELF file of FreeBSD's OS ABI (a FreeBSD kernel, bootable or not)?"""
    head = _head(path, what)
    return head[:4] == ELF64[:4] and len(head) > 7 and head[7] == ELFOSABI_FREEBSD


def freebsd_version(path: str, what: str = "kernel") -> str:
    """A FreeBSD kernel's version string, or a one-line error naming the file when QEMU
    cannot boot it directly (no PVH entry: a 32-bit kernel, or one older than 14)."""
    try:
        with open(path, "rb") as f:
            notes = [(n["n_name"], n["n_type"]) for seg in ELFFile(f).iter_segments()
                     if seg["p_type"] == "PT_NOTE" for n in seg.iter_notes()]
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                found = FREEBSD_VERSION.search(m)
                version = found.group().decode("ascii", "replace") if found else "(no version string)"
    except (ELFError, ValueError, struct.error) as e:
        raise TandemError(f"{what} {path}: a FreeBSD ELF file that cannot be read ({e})") from None
    if ("Xen", XEN_ELFNOTE_PHYS32_ENTRY) not in notes:
        raise TandemError(f"{what} {path}: a FreeBSD kernel without a PVH entry (Xen ELF note "
                          "XEN_ELFNOTE_PHYS32_ENTRY), which QEMU boots directly: an amd64 kernel of FreeBSD 14 "
                          "or later has one")
    return version


def bzimage_version(path: str, what: str = "kernel") -> str:
    """The version string a bzImage carries (e.g. "6.12.41 (root@host) #1 SMP ..."), or a
    one-line error naming the file when it is not a bzImage: an ELF vmlinux (give the
    bzImage, the vmlinux after it), or anything else."""
    head = _head(path, what)
    if head.startswith(ELF64[:4]):
        raise TandemError(f"{what} {path}: an ELF file (a vmlinux?), not a bzImage; give the bzImage "
                          "(arch/x86/boot/bzImage), and the vmlinux after a comma for symbols")
    if len(head) < 0x210 or head[0x1FE:0x200] != b"\x55\xaa" or head[0x202:0x206] != b"HdrS":
        raise TandemError(f"{what} {path}: not a Linux kernel image (no x86 boot header 'HdrS' at 0x202)")
    protocol, = struct.unpack_from("<H", head, 0x206)
    if protocol < 0x0200:
        raise TandemError(f"{what} {path}: boot protocol {protocol >> 8}.{protocol & 0xff:02d}, older than "
                          "QEMU boots directly (2.00)")
    at, = struct.unpack_from("<H", head, 0x20E)
    text = head[0x200 + at:].split(b"\0", 1)[0] if at and 0x200 + at < len(head) else b""
    return text.decode("ascii", "replace") or "(no version string)"


def check_vmlinux(path: str, what: str = "vmlinux") -> None:
    """A 64-bit ELF file, or a one-line error naming it."""
    head = _head(path, what)
    if not head.startswith(ELF64):
        raise TandemError(f"{what} {path}: not a 64-bit ELF file (the kernel's vmlinux, built with the bzImage)")
