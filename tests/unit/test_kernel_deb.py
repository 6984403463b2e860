"""tandem's kernel as a Debian package (scripts/build-kernel-deb.sh), and the reference
VM that installs it (scripts/build-refvm.sh --tandem-kernel): the
package's files, control fields and maintainer scripts, its reproducibility, the VM's
cache key and its JSON's shape. Made from stand-in build outputs (a kernel image is just
bytes to the packaging; the module is a real ELF object, which strip needs). No VM, no
network: the image build itself is checked on a real VM (docs/guests.md)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tandem import artifacts
from tandem.errors import TandemError
from tandem.setup import state

ROOT = Path(__file__).resolve().parents[2]
DEB_SCRIPT = ROOT / "scripts/build-kernel-deb.sh"
REFVM_SCRIPT = ROOT / "scripts/build-refvm.sh"
RELEASE = "6.12.95-tandem"


def builds(tmp_path: Path, *, kernel_key: str = "1f6eb0a4b802af02", modules_key: str = "08eac1a1917ba563",
           modules_release: str = RELEASE) -> tuple[Path, Path]:
    """kernel-native.json and modules-native.json as the build scripts write them, over
    stand-in files."""
    d = tmp_path / "in"
    d.mkdir(parents=True, exist_ok=True)
    (d / "bzImage").write_bytes(b"MZ" + bytes(4094))
    (d / "System.map").write_text("ffffffff81000000 T _text\n")
    (d / "config").write_text("CONFIG_MODULES=y\nCONFIG_RD_GZIP=y\n")
    (d / "tandem_bugs.c").write_text("int tb_probe(void) { return 7; }\n")
    subprocess.run(["gcc", "-g", "-c", "-o", str(d / "tandem_bugs.ko"), str(d / "tandem_bugs.c")], check=True)
    (d / "modules.builtin").write_text("kernel/fs/ext4/ext4.ko\n")
    (d / "modules.builtin.modinfo").write_bytes(b"ext4.license=GPL\0")
    kjson, mjson = d / "kernel-native.json", d / "modules-native.json"
    kjson.write_text(json.dumps({"flavor": "native", "key": kernel_key, "bzImage": str(d / "bzImage"),
                                 "vmlinux": str(d / "vmlinux"), "system_map": str(d / "System.map"),
                                 "config": str(d / "config"), "bzImage_sha256": "0" * 64, "version": RELEASE}))
    mjson.write_text(json.dumps({"flavor": "native", "key": modules_key, "kernel_key": kernel_key,
                                 "version": modules_release, "modules": [str(d / "tandem_bugs.ko")],
                                 "builtin": [str(d / "modules.builtin"), str(d / "modules.builtin.modinfo")],
                                 "cpio": str(d / "modules.cpio.gz"), "cpio_sha256": "0" * 64}))
    return kjson, mjson


def make_deb(kjson: Path, mjson: Path, out: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(DEB_SCRIPT), str(kjson), str(mjson), str(out)], capture_output=True,
                          text=True, env={**os.environ, **env})


@pytest.fixture(scope="module")
def deb(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("deb")
    r = make_deb(*builds(tmp), tmp / "out")
    assert r.returncode == 0, r.stderr
    return Path(r.stdout.strip())


def dpkg_deb(*args: str) -> str:
    return subprocess.run(["dpkg-deb", *args], capture_output=True, text=True, check=True).stdout


def test_package_name_version_and_control_fields(deb):
    assert deb.name == f"linux-image-{RELEASE}_{RELEASE}-1+08eac1a1917ba563_amd64.deb"
    fields = {f: dpkg_deb("-f", str(deb), f).strip() for f in
              ("Package", "Version", "Architecture", "Section", "Priority", "Depends", "Installed-Size")}
    assert fields["Package"] == f"linux-image-{RELEASE}"
    assert fields["Version"] == f"{RELEASE}-1+08eac1a1917ba563"     # the modules build's key: another build, another version
    assert fields["Architecture"] == "amd64"
    assert fields["Section"] == "kernel" and fields["Priority"] == "optional"
    # What Debian's linux-image packages depend on: depmod, linux-update-symlinks, an initramfs tool.
    assert fields["Depends"] == "kmod, linux-base (>= 4.3~), initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool"
    assert int(fields["Installed-Size"]) >= 4


def test_package_files_owners_and_times(deb):
    listing = [line.split() for line in dpkg_deb("-c", str(deb)).splitlines()]
    files = {cols[-1].lstrip("."): (cols[0], cols[1], cols[3], cols[4]) for cols in listing}
    expected = {
        f"/boot/vmlinuz-{RELEASE}", f"/boot/System.map-{RELEASE}", f"/boot/config-{RELEASE}",
        f"/lib/modules/{RELEASE}/extra/tandem_bugs.ko",
        f"/lib/modules/{RELEASE}/modules.builtin", f"/lib/modules/{RELEASE}/modules.builtin.modinfo",
        f"/lib/modules/{RELEASE}/modules.order",
        f"/usr/share/doc/linux-image-{RELEASE}/copyright",
    }
    regular = {name for name, (mode, *_) in files.items() if mode.startswith("-")}
    assert regular == expected
    for name, (mode, owner, day, time) in files.items():
        assert owner == "root/root", name
        assert (day, time) == ("1970-01-01", "00:00"), name       # SOURCE_DATE_EPOCH, the kernel build's date
        assert mode == ("-rw-r--r--" if name in regular else "drwxr-xr-x"), name


def test_module_is_stripped_of_debug_info(deb, tmp_path):
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True)
    sections = subprocess.run(["readelf", "-S", str(tmp_path / f"lib/modules/{RELEASE}/extra/tandem_bugs.ko")],
                              capture_output=True, text=True, check=True).stdout
    assert ".debug_info" not in sections and ".text" in sections
    assert (tmp_path / f"boot/vmlinuz-{RELEASE}").read_bytes()[:2] == b"MZ"


def test_maintainer_scripts_are_debians(deb, tmp_path):
    subprocess.run(["dpkg-deb", "-e", str(deb), str(tmp_path)], check=True)
    scripts = {n: (tmp_path / n).read_text() for n in ("preinst", "postinst", "prerm", "postrm")}
    for name, text in scripts.items():
        assert os.access(tmp_path / name, os.X_OK), name
        assert text.startswith(f"#!/bin/sh -e\n\nversion={RELEASE}\nimage_path=/boot/vmlinuz-$version\n"), name
        subprocess.run(["sh", "-n", str(tmp_path / name)], check=True)
    post = scripts["postinst"]
    # depmod, then the symlinks (a fresh install becomes the default), then the hooks
    # that make the initramfs; in that order.
    order = [post.index(s) for s in ("depmod $version", "linux-update-symlinks $change $version $image_path",
                                     "run-parts --report --exit-on-error --arg=$version")]
    assert order == sorted(order)
    assert "/etc/kernel/postinst.d" in post
    assert "touch /lib/modules/$version/.fresh-install" in scripts["preinst"]
    assert "linux-check-removal $version" in scripts["prerm"]
    assert "linux-update-symlinks remove $version $image_path" in scripts["postrm"]
    sums = (tmp_path / "md5sums").read_text().split("\n")
    assert f"boot/vmlinuz-{RELEASE}" in {line.split("  ")[1] for line in sums if line}


def test_package_is_reproducible(deb, tmp_path):
    """The same inputs give the same bytes, whatever the moment or the directory."""
    r = make_deb(*builds(tmp_path), tmp_path / "again")
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).read_bytes() == deb.read_bytes()


def test_kernel_and_modules_of_different_kernels_are_refused(tmp_path):
    r = make_deb(*builds(tmp_path, modules_release="6.12.94-tandem"), tmp_path / "out")
    assert r.returncode != 0
    assert "kernel 6.12.95-tandem but modules for 6.12.94-tandem" in r.stderr
    assert not list((tmp_path / "out").glob("*.deb"))


# --- the reference VM with that kernel: its key and its JSON ---------------------------------------

def refvm_key(tmp_path: Path, *args: str) -> str:
    r = subprocess.run(["bash", str(REFVM_SCRIPT), *args, os.devnull], capture_output=True, text=True,
                       env={**os.environ, "TANDEM_KEY_ONLY": "1", "TANDEM_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    return r.stdout.split()[0]     # then where its build is cached


def test_refvm_tandem_key_covers_the_kernels_and_modules_keys(tmp_path):
    plain = refvm_key(tmp_path)
    k, m = builds(tmp_path)
    with_kernel = refvm_key(tmp_path, "--tandem-kernel", str(k), str(m))
    k2, m2 = builds(tmp_path / "b", modules_key="0000000000000000")
    other_modules = refvm_key(tmp_path, "--tandem-kernel", str(k2), str(m2))
    k3, m3 = builds(tmp_path / "c", kernel_key="1111111111111111")
    other_kernel = refvm_key(tmp_path, "--tandem-kernel", str(k3), str(m3))
    assert len({plain, with_kernel, other_modules, other_kernel}) == 4
    assert refvm_key(tmp_path, "--tandem-kernel", str(k), str(m)) == with_kernel
    assert not (tmp_path / "cache/refvm-tandem").exists() or not any((tmp_path / "cache/refvm-tandem").iterdir())


def test_doctor_computes_refvm_tandem_key_from_the_build_dir(tmp_path, monkeypatch):
    k, m = builds(tmp_path)
    build = tmp_path / "build"
    build.mkdir()
    (build / "kernel-native.json").write_text(k.read_text())
    (build / "modules-native.json").write_text(m.read_text())
    monkeypatch.setenv("TANDEM_BUILD_DIR", str(build))
    monkeypatch.setenv("TANDEM_CACHE", str(tmp_path / "cache"))
    assert state.current_key("refvm-tandem") == refvm_key(tmp_path, "--tandem-kernel", str(k), str(m))


def test_refvm_tandem_json_shape(tmp_path, monkeypatch):
    """build/refvm-tandem.json: what refvm.json has, and the UDP port, the keys, the package."""
    refvm = {"key": "k", "disk": "/c/disk.qcow2", "disk_sha256": "0" * 64, "disk_format": "qcow2",
             "kernel": "/c/vmlinuz", "initrd": "/c/initrd.img", "kernel_release": RELEASE,
             "root": "root=UUID=x", "cmdline": "root=UUID=x ro console=ttyS0",
             "services": {"http": 80, "redis": 6379}, "packages": {f"linux-image-{RELEASE}": "v"}, "site": [],
             "data_disk": {"label": "tandem-data", "mount": "/srv/data", "log": "/srv/data/nginx-access.log"},
             "backend": {"path": "/backend/", "host_port": 18081}}
    extra = {"udp_port": 4444, "kernel_key": "1f6eb0a4b802af02", "modules_key": "08eac1a1917ba563",
             "deb": f"/c/linux-image-{RELEASE}_x_amd64.deb"}
    assert artifacts.required(artifacts.RefvmTandemBuild) == artifacts.required(artifacts.RefvmBuild) | extra.keys()
    monkeypatch.setenv("TANDEM_BUILD_DIR", str(tmp_path))
    (tmp_path / "refvm-tandem.json").write_text(json.dumps({**refvm, **extra}))
    got = artifacts.refvm_tandem()
    assert got["udp_port"] == 4444 and got["kernel_release"] == RELEASE
    (tmp_path / "refvm-tandem.json").write_text(json.dumps(refvm))      # a refvm.json is not one
    with pytest.raises(TandemError, match="no deb, kernel_key, modules_key, udp_port"):
        artifacts.refvm_tandem()
    assert "deb" in state.ARTIFACTS       # doctor checks the package is still in the cache
