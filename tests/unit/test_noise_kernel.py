"""The noise run boots the kernel a recording of the demo guest was made on (Debian's by
default, tandem's native with --assertions or --kernel native), so that what differs from
the recording is what the analyses' kernels change; a user's VM keeps tandem's native."""
from __future__ import annotations

import json

import pytest

from tandem import catalog
from tandem.formats.bundle import Manifest
from tandem.formats.manifest import InputFile
from tandem.machine.section import MachineSection, NetSection
from tandem.semantic import guests


def demo_manifest(kernel: str | None, *, users: bool = False) -> Manifest:
    net = NetSection(backend="user") if users else NetSection(backend="user", guest_port=7000)
    machine = MachineSection(net=net, disks=({"id": "d0", "format": "qcow2"},) if users else None)
    return Manifest.new(inputs={"kernel": InputFile(path=kernel)} if kernel else {}, machine=machine)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TANDEM_BUILD_DIR", str(tmp_path / "build"))
    (tmp_path / "build").mkdir()
    return tmp_path


@pytest.mark.parametrize("flavor", catalog.FLAVORS)
def test_a_catalogue_kernel_is_known_by_where_it_was_built(cache, flavor):
    m = demo_manifest(str(cache / "cache" / "kernel" / f"{flavor}-0123456789abcdef" / "bzImage"))
    noise = guests.noise_analysis(m)
    assert noise.name == "native" and noise.kernel == catalog.KERNELS[flavor]
    assert noise.userland == catalog.NATIVE.userland


def test_a_built_kernel_is_known_by_its_build_record_wherever_it_is(cache):
    image = cache / "elsewhere" / "bzImage"
    image.parent.mkdir()
    image.write_bytes(b"")
    record = dict.fromkeys(("flavor", "key", "vmlinux", "system_map", "config", "bzImage_sha256", "version"), "")
    (cache / "build" / "kernel-stock.json").write_text(json.dumps({**record, "bzImage": str(image)}))
    assert guests.noise_analysis(demo_manifest(str(image))).kernel == catalog.KERNELS["stock"]


@pytest.mark.parametrize("kernel", [
    None,                                       # no kernel input at all
    "/home/me/bzImage",                         # a kernel from elsewhere
    "CACHE/kernel/valgrind-0123/bzImage",       # a flavor the catalogue does not have
    "CACHE/other/stock-0123/bzImage",           # not the cache's kernel directory
    "CACHE/kernel/stock/bzImage",               # no key
    "\ud800/bzImage",                           # a string a hostile manifest can hold
])
def test_anything_else_is_tandems_native(cache, kernel):
    kernel = kernel and kernel.replace("CACHE", str(cache / "cache"))
    assert guests.noise_analysis(demo_manifest(kernel)) == catalog.NATIVE


def test_a_users_vm_keeps_tandems_native(cache):
    m = demo_manifest(str(cache / "cache" / "kernel" / "stock-0123456789abcdef" / "bzImage"), users=True)
    assert m.users_guest and guests.noise_analysis(m) == catalog.NATIVE
