"""Every external program tandem calls, and the Debian package that ships it.

This is the one declared list. `scripts/host-deps.sh` installs the packages (or they
are in Debian's required/important set, which every Debian 12 root has), `tandem
doctor` checks them, and tests/unit/test_host_programs.py reads tandem's code
(the launcher, scripts/, the Python package, tests, benchmarks), collects the
programs it calls and fails on one missing here, or whose package nobody installs.
That test exists because a green CI once hid a missing install step: the kernel
build called `ccache gcc`, only the CI machine had ccache, and the README's first
command failed on every fresh machine.

Python code looks programs up through `require` or `which` here, so that a name
asked for is a name declared. Standard library only: `tandem doctor` runs on
Debian's python3 before the venv exists.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
from dataclasses import dataclass

from ..errors import InfraError, TandemError

VENV = "venv"          # a program the launcher's venv provides (replay/requirements.txt)
# Programs root-only tools live in: a non-root PATH often lacks the sbin directories.
SEARCH_PATH = os.pathsep.join(("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"))


@dataclass(frozen=True)
class Program:
    name: str
    package: str        # the Debian package `dpkg -S` names for it, or VENV
    why: str
    optional: bool = False   # every use is behind a check with a fallback
    implicit: bool = False   # called by a tool tandem runs (make, tar), not by tandem's code
    # A directory off PATH it is found in, as a glob of versioned directories (Debian puts
    # PostgreSQL's server programs in /usr/lib/postgresql/VERSION/bin): the newest is used.
    where: str = ""


def _p(package: str, why: str, *names: str, **kw) -> list[Program]:
    return [Program(n, package, why, **kw) for n in names]


PROGRAMS: dict[str, Program] = {p.name: p for p in [
    # Debian's required set: on every Debian root.
    *_p("coreutils", "files, hashes and paths in the launcher and build scripts",
        "basename", "cat", "chmod", "chroot", "cp", "cut", "date", "dd", "dirname", "env", "head", "id",
        "install", "ln", "ls", "mkdir", "mknod", "mv", "nproc", "readlink", "realpath", "rm", "sha256sum",
        "seq", "sleep", "sort", "stat", "sync", "tail", "tee", "touch", "tr", "truncate"),
    *_p("coreutils", "FreeBSD guest scripts (scripts/build-freebsd.sh, run-freebsd.sh)", "nice", "timeout", "mktemp",
        "du"),
    *_p("bash", "the launcher and build scripts", "bash"),
    *_p("dash", "/bin/sh: the private libvirtd's launch script", "sh"),
    *_p("util-linux", "locks (flock), namespaces (unshare), CPU placement of VMs (chrt, taskset), sessions (setsid)",
        "flock", "unshare", "chrt", "taskset", "setsid"),
    *_p("mount", "the private libvirtd's mount namespace; fresh-check unmounts what a run left",
        "mount", "umount"),
    *_p("grep", "build scripts", "grep"),
    *_p("sed", "build scripts", "sed"),
    *_p("mawk", "build scripts (awk)", "awk"),
    *_p("findutils", "build scripts", "find", "xargs"),
    *_p("diffutils", "module build: is the kernel object dir at the published config", "cmp"),
    *_p("gzip", "initramfs and module archives", "gzip"),
    *_p("tar", "extracting the kernel source", "tar"),
    *_p("libc-bin", "the ASan guest's shared libraries", "ldd"),
    *_p("apt", "installing packages, the QEMU source", "apt-get", "apt-cache"),
    *_p("dpkg", "which packages are installed", "dpkg-query", "dpkg"),
    *_p("dpkg", "tandem's kernel as a Debian package (scripts/build-kernel-deb.sh)", "dpkg-deb"),
    *_p("debconf", "tshark's install question answered ahead", "debconf-set-selections"),
    *_p("sudo", "host-deps.sh when not run as root", "sudo", optional=True),
    # Installed by scripts/host-deps.sh.
    *_p("python3-minimal", "the launcher's venv and the build scripts' JSON", "python3"),
    *_p("ccache", "QEMU, kernel and module builds: a rebuild under a new key reuses objects", "ccache"),
    *_p("gcc", "the guest userland, the TCG plugin, the kernel (through make)", "gcc"),
    *_p("make", "QEMU and kernel builds", "make"),
    *_p("binutils", "guest binaries (strip, readelf), FreeBSD kernels' System.map (nm), report source "
        "lines (addr2line)", "strip", "readelf", "nm"),
    *_p("binutils", "source lines of kernel report frames", "addr2line", optional=True),
    *_p("binutils", "the QEMU functional tests' guest, assembled to check the bytes they carry (tests)",
        "as", "ld"),
    *_p("patch", "tandem's QEMU patches", "patch"),
    *_p("dpkg-dev", "unpacking Debian's QEMU source", "dpkg-source"),
    *_p("pkgconf", "the TCG plugin's glib flags", "pkg-config"),
    *_p("cpio", "initramfs archives", "cpio"),
    *_p("xz-utils", "tar's decompressor for linux-source-6.12.tar.xz", "xz", implicit=True),
    *_p("kmod", "module vermagic", "modinfo"),
    *_p("e2fsprogs", "the guest's disk image", "mkfs.ext4"),
    *_p("e2fsprogs", "the reference VM's root filesystem: inode times fixed, then checked",
        "debugfs", "dumpe2fs", "e2fsck"),
    *_p("busybox-static", "the guest userland", "busybox", implicit=True),
    *_p("bc", "the kernel build", "bc", implicit=True),
    *_p("flex", "the kernel and QEMU builds", "flex", implicit=True),
    *_p("bison", "the kernel and QEMU builds", "bison", implicit=True),
    *_p("perl-base", "the kernel build", "perl", implicit=True),
    *_p("ninja-build", "QEMU's and meson's builds; tandem regenerates build.ninja with it", "ninja"),
    *_p("netcat-openbsd", "the demo's independent client", "nc"),
    *_p("curl", "fetches a guest's web files, their hashes checked (demo --guest debian, tests, bench)", "curl"),
    *_p("tshark", "the device log read by Wireshark's dissectors (tests, tandem wireshark)", "tshark"),
    *_p("wireshark-common", "the device log counted by capinfos (tests)", "capinfos"),
    *_p("libvirt-daemon", "the private libvirtd (tandem attach, --libvirt, tests)", "libvirtd", "virtlogd"),
    *_p("libvirt-clients", "virsh in tests and docs", "virsh"),
    *_p("apache2-utils", "ab: HTTP load, a connection per request (a guest's web server: demo, tests, bench)", "ab"),
    *_p("wrk", "HTTP load over kept-alive connections (demo --guest debian, tests, bench)", "wrk"),
    *_p("redis-tools", "redis-benchmark against a guest's redis (demo --guest debian, tests, bench)",
        "redis-benchmark"),
    *_p("git", "scripts/fresh-check.sh clones the repository", "git"),
    *_p("mmdebstrap", "the reference VM's Debian root (scripts/build-refvm.sh); fresh-check's clean Debian 12 root",
        "mmdebstrap"),
    *_p("fdisk", "the reference VM's partition table, written into its disk image file", "sfdisk"),
    *_p("qemu-utils", "the reference VM's raw disk converted to qcow2 (not tandem's: this build does not wait for QEMU's)",
        "qemu-img"),
    *_p("clang-19", "the FreeBSD guest's init (scripts/build-freebsd.sh)", "clang-19"),
    *_p("zstd", "tar's decompressor for a FreeBSD source archive .tar.zst (scripts/build-freebsd.sh)", "zstd",
        implicit=True),
    *_p("time", "the FreeBSD build: make.py links the host's time among its tools (tools/build/Makefile)", "time",
        implicit=True),
    *_p("clang-19", "the FreeBSD guest's kernel: make.py --cross-bindir=/usr/lib/llvm-19/bin", "clang-cpp-19",
        implicit=True),
    *_p("lld-19", "the FreeBSD guest's kernel and init (ld.lld)", "ld.lld-19", implicit=True),
    *_p("llvm-19", "the FreeBSD guest's kernel (llvm-ar, llvm-nm, llvm-objcopy ...)", "llvm-ar-19", implicit=True),
    *_p("stress-ng", "scripts/ci-under-load.sh loads the machine while CI runs", "stress-ng"),
    *_p("linux-perf", "bench/device_mode.py --attribute traces the scheduler (bench/sched_trace.py); "
        "bench/devlog_profile.py samples the native QEMU (bench/cpu_profile.py)", "perf"),
    # The tests' own (scripts/host-deps.sh --test: `./tandem test` and `./tandem bench` install them).
    *_p("chromium", "the farm's HTML report opened as a reader sees it (tests)", "chromium"),
    *_p("chromium-driver", "drives that headless Chromium (tests, through selenium)", "chromedriver"),
    *_p("postgresql-15", "a private PostgreSQL cluster the farm's tests share a night in",
        "initdb", "pg_ctl", where="/usr/lib/postgresql/*/bin"),
    *_p("util-linux", "runs that PostgreSQL server as nobody: it refuses root (tests)", "setpriv"),
    *_p("gdb", "reverse debugging against a replay's gdbstub (tests)", "gdb"),
    *_p("iproute2", "the private libvirtd's own network namespace: its loopback up (tests)", "ip"),
    *_p("util-linux", "clients inside that namespace, where libvirt's default network is (tests)", "nsenter"),
    *_p("dnsmasq-base", "DHCP and DNS on that default network, run by libvirtd (tests)", "dnsmasq",
        implicit=True),
    *_p("iptables", "that default network's NAT rules, set by libvirtd (tests)", "iptables", implicit=True),
    # The launcher's venv.
    *_p(VENV, "runs the meson build", "meson"),
    *_p(VENV, "the venv's interpreter", "python"),
]}


def declared(name: str) -> Program:
    try:
        return PROGRAMS[name]
    except KeyError:
        raise TandemError(f"{name}: not a declared program (add it to tandem/setup/programs.py "
                          f"with its Debian package)") from None


def which(name: str) -> str | None:
    """The path of a declared program, looking in the sbin directories too, and in its
    versioned directory off PATH if it has one; None if absent."""
    p = declared(name)
    return shutil.which(name) or shutil.which(name, path=SEARCH_PATH) or off_path(p)


def off_path(p: Program) -> str | None:
    """A program in its versioned directory off PATH: the newest version's."""
    found = [d for d in glob.glob(p.where) if os.access(os.path.join(d, p.name), os.X_OK)] if p.where else []
    if not found:
        return None
    newest = max(found, key=lambda d: [int(n) for n in re.findall(r"\d+", d)])
    return os.path.join(newest, p.name)


def require(name: str) -> str:
    """The path of a declared program, or a one-line error naming the package to install."""
    path = which(name)
    if path is None:
        p = PROGRAMS[name]
        raise InfraError(f"{name}: not installed (Debian package {p.package}; run ./tandem setup)")
    return path
