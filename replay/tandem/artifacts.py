"""Where the build put things: QEMU, guest kernels, the guest image, the reference VM.

The meson build (`meson.build` at the repository root) runs the scripts in
`scripts/`, which build into the content-addressed cache and describe each
result in `build/NAME.json`. This module only reads those files.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from pathlib import Path
from typing import NotRequired, TypedDict, cast

from .errors import TandemError

REPO = Path(__file__).resolve().parents[2]


def build_dir() -> Path:
    return Path(os.environ.get("TANDEM_BUILD_DIR", REPO / "build"))


def cache_dir() -> Path:
    return Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem"))


def required(build: type) -> frozenset[str]:
    """The keys a build record must have: its TypedDict's, but those marked NotRequired.
    Under `from __future__ import annotations`, Python 3.11's TypedDict counts a
    NotRequired key as required (the annotation is a string it does not read), and a
    record without it (a Linux kernel's, which has no KLDs) would be refused."""
    return frozenset(k for k, v in build.__annotations__.items()
                     if not getattr(v, "__forward_arg__", str(v)).startswith("NotRequired["))


# What each build/NAME.json holds (the scripts in scripts/ write them): paths and hashes
# as strings. Only the keys tandem reads are listed; a file may carry more.
class QemuBuild(TypedDict):
    key: str
    binary: str
    img: str
    firmware_dir: str
    plugin_include: NotRequired[str]      # read by scripts/build-plugin.sh only
    source: NotRequired[str]    # the patched source tree it was built from (QEMU's functional tests)
    build_id: str
    patch_series: str
    version: str
    stock: NotRequired[bool]    # the benchmarks' baseline without tandem's patches (older builds: absent)


class KernelBuild(TypedDict):
    flavor: str
    key: str
    bzImage: str
    vmlinux: str
    system_map: str
    config: str
    bzImage_sha256: str
    version: str
    klds: NotRequired[list[str]]    # FreeBSD: the KLDs built against this kernel (.ko, with their DWARF)


class ModulesBuild(TypedDict):
    flavor: str
    key: str
    kernel_key: str
    version: str
    modules: NotRequired[list[str]]     # .ko paths (read with .get: a kernel may have none)
    builtin: NotRequired[list[str]]     # modules.builtin{,.modinfo}: what the kernel has built in (older builds: absent)
    cpio: str
    cpio_sha256: str


class PluginBuild(TypedDict):
    plugin: str                 # the .so
    key: str


class GuestBuild(TypedDict):
    key: str
    initramfs_native: str
    initramfs_native_sha256: str
    initramfs_asan: str
    initramfs_asan_sha256: str
    disk_base: str
    disk_base_sha256: str


class FreeBSDGuestBuild(TypedDict):
    """The FreeBSD demo guest's root (scripts/build-freebsd.sh freebsd-guest)."""
    key: str
    root_image: str             # raw UFS2: use it as a base, never write it
    init: str                   # its /sbin/init, kvd on port 7000


class FreeBSDBootBuild(TypedDict):
    """FreeBSD's BIOS boot blocks and loader (scripts/build-freebsd.sh freebsd-boot)."""
    key: str
    pmbr: str                   # the protective MBR's boot code
    gptboot: str                # the freebsd-boot partition's code, which finds the loader
    loader: str                 # /boot/loader, its simple interpreter
    mkimg: str                  # FreeBSD's mkimg(1), built for this host


class FreeBSDDiskBuild(TypedDict):
    """The FreeBSD demo guest on a GPT disk its loader boots (scripts/build-freebsd.sh
    freebsd-disk)."""
    key: str
    disk: str                   # raw: use it as a base, never write it
    root: str                   # the root it mounts, as vfs.root.mountfrom names it


class SiteFile(TypedDict):
    path: str                   # the URL path nginx serves it at ("/4m.bin")
    bytes: int
    sha256: str


class DataDisk(TypedDict):
    """A second disk the reference VM mounts if it has one: an ext4 with this label,
    mounted at `mount`, where nginx appends a line per request to `log`."""
    label: str
    mount: str
    log: str


class RefvmBackend(TypedDict):
    path: str                   # nginx proxies this path...
    host_port: int              # ...to this port of the host (10.0.2.2 on user networking)


class RefvmBuild(TypedDict):
    """The reference ordinary VM (scripts/build-refvm.sh): a Debian 12 disk that boots
    through its own GRUB, or directly with its own kernel and initramfs."""
    key: str
    disk: str                   # qcow2: use it as a base, never write it
    disk_sha256: str
    disk_format: str
    kernel: str                 # the guest's /vmlinuz, copied out for a direct boot
    initrd: str
    kernel_release: str
    root: str                   # "root=UUID=...": the root device for a direct boot's --append
    cmdline: str                # what the disk's GRUB passes to the kernel
    services: dict[str, int]    # {"http": 80, "redis": 6379}: guest ports
    packages: dict[str, str]    # Debian package -> version (kernel, systemd, nginx, redis, GRUB)
    site: list[SiteFile]        # the static site nginx serves
    data_disk: DataDisk         # a second disk the guest mounts, if given one
    backend: RefvmBackend       # nginx's path proxied to a port of the host (a connection the guest opens)


def _load(name: str, keys: frozenset[str], build: str = "./tandem build") -> dict[str, object]:
    """build/NAME.json, checked to be an object with `keys` (the TypedDict's): a file the
    build left half-written or an older layout fails here, naming the file, rather than
    as a KeyError wherever a path is first used."""
    path = build_dir() / f"{name}.json"
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise TandemError(f"{path}: not built yet (run {build})") from None
    except json.JSONDecodeError as e:
        raise TandemError(f"{path}: unreadable ({e})") from None
    if not isinstance(record, dict):
        raise TandemError(f"{path}: not a JSON object (rebuild: ./tandem build)")
    missing = sorted(keys - record.keys())
    if missing:
        raise TandemError(f"{path}: no {', '.join(missing)} (an older build? ./tandem build)")
    return record


def qemu() -> QemuBuild:
    """{binary, img, firmware_dir, build_id, patch_series, version}"""
    return cast(QemuBuild, _load("qemu", required(QemuBuild)))


def qemu_stock() -> QemuBuild:
    """The benchmarks' baseline: the same QEMU without tandem's code patches."""
    return cast(QemuBuild, _load("qemu-stock", required(QemuBuild)))


def kernel(flavor: str = "native") -> KernelBuild:
    """{flavor, bzImage, vmlinux, system_map, config, bzImage_sha256, version}"""
    how = "./tandem build freebsd --freebsd-src PATH" if flavor.startswith("freebsd-") else "./tandem build"
    return cast(KernelBuild, _load(f"kernel-{flavor}", required(KernelBuild), build=how))


def modules(flavor: str = "native") -> ModulesBuild:
    """{flavor, modules (.ko paths), cpio, cpio_sha256}: the planted-bug module for a kernel"""
    return cast(ModulesBuild, _load(f"modules-{flavor}", required(ModulesBuild)))


def plugin_calls() -> PluginBuild:
    """{plugin (.so path), key}: the TCG plugin behind the temporal assertions"""
    return cast(PluginBuild, _load("plugin-calls", required(PluginBuild)))


def plugin_stop() -> PluginBuild:
    """{plugin (.so path), key}: the TCG plugin that stops a replay for `tandem explain`"""
    return cast(PluginBuild, _load("plugin-stop", required(PluginBuild)))


def guest() -> GuestBuild:
    """{initramfs_native, initramfs_asan, disk_base, and their _sha256}"""
    return cast(GuestBuild, _load("guest", required(GuestBuild)))


def freebsd_guest() -> FreeBSDGuestBuild:
    """The FreeBSD demo guest's root image and init."""
    return cast(FreeBSDGuestBuild, _load("freebsd-guest", required(FreeBSDGuestBuild),
                                         build="./tandem build freebsd --freebsd-src PATH"))


def freebsd_disk() -> FreeBSDDiskBuild:
    """The FreeBSD demo guest on a disk its own loader boots (a firmware boot)."""
    return cast(FreeBSDDiskBuild, _load("freebsd-disk", required(FreeBSDDiskBuild),
                                        build="./tandem build freebsd --freebsd-src PATH"))


def refvm() -> RefvmBuild:
    """The reference ordinary VM's disk, kernel, initrd, services and site files."""
    return cast(RefvmBuild, _load("refvm", required(RefvmBuild), build="./tandem build refvm"))


class RefvmTandemBuild(RefvmBuild):
    """The reference VM with tandem's native kernel as its distribution kernel
    (scripts/build-refvm.sh --tandem-kernel): the same disk layout, services and site,
    booting Linux `kernel_release` (tandem's) through its own GRUB, with tandem_bugs
    loaded at boot and listening on UDP `udp_port` (docs/planted-bugs.md, "From the
    network"). `kernel`/`initrd` are that kernel and the initramfs Debian made for it."""
    udp_port: int               # guest port: each datagram is one tandem_bugs command
    kernel_key: str             # build/kernel-native.json's key it was made from
    modules_key: str            # build/modules-native.json's
    deb: str                    # the linux-image-RELEASE .deb installed in it


def refvm_tandem() -> RefvmTandemBuild:
    """The reference VM booting tandem's native kernel, with the planted-bug module on UDP."""
    return cast(RefvmTandemBuild, _load("refvm-tandem", required(RefvmTandemBuild),
                                        build="./tandem build refvm-tandem"))


class AsanRedisBuild(TypedDict):
    """The reference VM's redis built with ASan (scripts/build-asan-redis.sh), as a tree
    for `tandem replay --overlay`."""
    key: str
    overlay: str                # DIR: usr/bin/redis-server, its libasan, a unit drop-in
    binary: str
    redis_source: str           # the Debian source version it was built from


def asan_redis() -> AsanRedisBuild:
    return cast(AsanRedisBuild, _load("asan-redis", required(AsanRedisBuild),
                                      build="./tandem build asan-redis"))


def initramfs(g: GuestBuild, userland: str) -> tuple[str, str]:
    """(path, sha256) of a userland's initramfs (catalog.USERLANDS names them)."""
    if userland == "native":
        return g["initramfs_native"], g["initramfs_native_sha256"]
    if userland == "asan":
        return g["initramfs_asan"], g["initramfs_asan_sha256"]
    raise TandemError(f"no initramfs for userland {userland!r} in the guest build (native, asan)")


def initrd_with_modules(initramfs: str, initramfs_sha256: str, modules: ModulesBuild) -> str:
    """The initramfs followed by a kernel flavor's module cpio, as one file.

    The initramfs is shared by all kernel flavors but modules must match their
    kernel, so each flavor's modules come as a separate gzipped cpio
    (scripts/build-modules.sh) and Linux unpacks the concatenation of both. The
    result is cached under a name derived from both hashes: it is the file QEMU
    loads, and recordings name it (and its hash) as their initrd, so it must
    outlive the run.
    """
    key = hashlib.sha256(f"{initramfs_sha256} {modules['cpio_sha256']}".encode()).hexdigest()[:16]
    out = cache_dir() / "initrd" / f"{Path(initramfs).name.split('.')[0]}+{modules['flavor']}-{key}.cpio.gz"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}")
        with open(tmp, "wb") as f:
            for part in (initramfs, modules["cpio"]):
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, f)
        os.replace(tmp, out)
    return str(out)
