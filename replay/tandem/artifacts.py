"""Where the build put things: QEMU, guest kernels, the guest image.

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

from .errors import TandemError

REPO = Path(__file__).resolve().parents[2]


def build_dir() -> Path:
    return Path(os.environ.get("TANDEM_BUILD_DIR", REPO / "build"))


def cache_dir() -> Path:
    return Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem"))


def _load(name: str) -> dict:
    path = build_dir() / f"{name}.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise TandemError(f"{path}: not built yet (run ./tandem build)") from None
    except json.JSONDecodeError as e:
        raise TandemError(f"{path}: unreadable ({e})") from None


def qemu() -> dict:
    """{binary, img, firmware_dir, build_id, patch_series, version}"""
    return _load("qemu")


def qemu_stock() -> dict:
    """The benchmarks' baseline: the same QEMU without tandem's code patches."""
    return _load("qemu-stock")


def kernel(flavor: str = "native") -> dict:
    """{flavor, bzImage, vmlinux, system_map, config, bzImage_sha256, version}"""
    return _load(f"kernel-{flavor}")


def modules(flavor: str = "native") -> dict:
    """{flavor, modules (.ko paths), cpio, cpio_sha256}: the planted-bug module for a kernel"""
    return _load(f"modules-{flavor}")


def plugin_calls() -> dict:
    """{plugin (.so path), key}: the TCG plugin behind the temporal assertions"""
    return _load("plugin-calls")


def guest() -> dict:
    """{initramfs_native, initramfs_asan, disk_base, and their _sha256}"""
    return _load("guest")


def initrd_with_modules(initramfs: str, initramfs_sha256: str, modules: dict) -> str:
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
