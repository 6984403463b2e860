"""The reference ordinary VM (scripts/build-refvm.sh, issue 23): a Debian 12 disk that
boots under tandem's QEMU, through its own GRUB or directly with its own kernel, serves
its static site and redis to Debian's clients on the host, and powers off by ACPI.

The QEMU command line is composed here, not by tandem: this checks the image itself,
before `tandem record --disk` exists to take it. TCG with -icount, as tandem records
(this machine's /dev/kvm cannot boot stock kernels). The built image is only ever a
backing file: each boot writes to its own qcow2 overlay, and the base's hash is checked
unchanged after.
"""
from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import wait_until
from tandem import artifacts
from tandem.qemu import vm as qemu_vm
from tandem.qemu.image import make_overlay

# Measured on this 2-core machine (TCG, -icount shift=2; docs/guests.md): power-on to
# nginx 32-51 s at load 3-4 and 117 s at load 8, power-off 1.2-4.8 s. The bounds leave
# room for a loaded CI; they bound a wait, they assert no speed.
BOOT_S = 420            # power-on to nginx answering
POWEROFF_S = 180        # system_powerdown to QEMU's exit
MEMORY_MB = 1024


@dataclass
class Booted:
    proc: subprocess.Popen
    http: int               # host ports forwarded to the guest's nginx and redis
    redis: int
    console: Path
    qmp: Path

    def console_text(self) -> str:
        try:
            return self.console.read_bytes().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self) -> str:
        return self.console_text()[-1500:]


def refvm_argv(ref: artifacts.RefvmBuild, q: artifacts.QemuBuild, overlay: Path, rundir: Path,
               ports: dict[str, int], direct: bool) -> list[str]:
    """QEMU for the reference VM, its services' ports forwarded from 127.0.0.1:ports[name]:
    booted by SeaBIOS and the disk's GRUB, or (direct) with its own kernel and initrd and
    the command line GRUB passes (root=UUID=...)."""
    fwd = ",".join(f"hostfwd=tcp:127.0.0.1:{ports[name]}-:{port}" for name, port in ref["services"].items())
    argv = [q["binary"], "-L", q["firmware_dir"], "-M", "pc", "-accel", "tcg", "-m", str(MEMORY_MB),
            "-icount", f"shift={qemu_vm.ICOUNT_SHIFT},sleep=on",
            "-nodefaults", "-no-user-config", "-display", "none",
            "-chardev", f"file,id=ser0,path={rundir / 'console.log'}", "-serial", "chardev:ser0",
            "-qmp", f"unix:{rundir / 'qmp.sock'},server=on,wait=off",
            # romfile= : no iPXE option ROM (tandem's firmware directory has none; the disk boots)
            "-netdev", f"user,id=n0,{fwd}", "-device", "virtio-net-pci,netdev=n0,romfile=",
            "-drive", f"file={overlay},if=virtio,format=qcow2"]
    if direct:
        argv += ["-kernel", ref["kernel"], "-initrd", ref["initrd"], "-append", ref["cmdline"]]
    return argv


def boot(ref: artifacts.RefvmBuild, tmp_path: Path, direct: bool) -> Booted:
    overlay = tmp_path / "overlay.qcow2"
    make_overlay(ref["disk"], overlay, fmt=ref["disk_format"])
    ports = {name: qemu_vm.free_port() for name in ref["services"]}
    argv = refvm_argv(ref, artifacts.qemu(), overlay, tmp_path, ports, direct)
    with open(tmp_path / "qemu.log", "wb") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    return Booted(proc, ports["http"], ports["redis"], tmp_path / "console.log", tmp_path / "qmp.sock")


def curl(b: Booted, path: str, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["curl", "-sSf", "--max-time", "30", "-o", str(out), f"http://127.0.0.1:{b.http}{path}"],
                          capture_output=True, text=True, timeout=60)


def redis(b: Booted, *command: str) -> str:
    r = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(b.redis), *command],
                       capture_output=True, text=True, timeout=30)
    return r.stdout.strip() if r.returncode == 0 else ""


def sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def nginx_answers(b: Booted, tmp_path: Path) -> bool:
    assert b.proc.poll() is None, f"QEMU exited ({b.proc.returncode}) before nginx answered; console: {b.tail()}"
    return curl(b, "/index.html", tmp_path / "probe.html").returncode == 0


@pytest.fixture(scope="module")
def refvm():
    return artifacts.refvm()


@pytest.mark.timeout(BOOT_S + POWEROFF_S + 120)
@pytest.mark.parametrize("direct", [False, True], ids=["grub", "direct-kernel"])
def test_refvm_serves_its_site_and_redis_then_powers_off(refvm, tmp_path, direct):
    base_sha = refvm["disk_sha256"]
    b = boot(refvm, tmp_path, direct)
    try:
        wait_until(lambda: nginx_answers(b, tmp_path), BOOT_S,
                   lambda: f"nginx on the reference VM (console tail: {b.tail()!r})", poll=1.0)
        console = b.console_text()
        # Booted the way asked: GRUB passes BOOT_IMAGE= and the cmdline it was built with.
        if direct:
            assert "BOOT_IMAGE=" not in console and refvm["root"] in console, b.tail()
        else:
            assert f"BOOT_IMAGE=/vmlinuz {refvm['cmdline']}" in console, console[:3000]
        # systemd's own boot chatter reaches the serial console (what analyses scan).
        assert "Reached target" in console and "nginx" in console, console[-3000:]

        for f in refvm["site"]:
            out = tmp_path / ("site" + f["path"].replace("/", "_"))
            r = curl(b, f["path"], out)
            assert r.returncode == 0, f"GET {f['path']}: {r.stderr.strip()}"
            assert out.stat().st_size == f["bytes"] and sha256(out) == f["sha256"], f["path"]

        assert wait_until(lambda: redis(b, "PING"), 60, "redis PING") == "PONG"
        assert redis(b, "SET", "tandem", "refvm") == "OK"
        assert redis(b, "GET", "tandem") == "refvm"

        qmp = qemu_vm.qmp_connect(b.qmp, 30, alive=lambda: b.proc.poll() is None)
        try:
            qmp.command("system_powerdown")
        finally:
            qmp.close()
        wait_until(lambda: b.proc.poll() is not None, POWEROFF_S,
                   lambda: f"QEMU to exit after an ACPI power-off (console tail: {b.tail()!r})")
        assert b.proc.returncode == 0, (tmp_path / "qemu.log").read_text(errors="replace")
        assert "reboot: Power down" in b.console_text(), b.tail()
    finally:
        if b.proc.poll() is None:
            b.proc.kill()
            b.proc.wait()
    assert sha256(refvm["disk"]) == base_sha, "the built image was written: boots must use an overlay"
