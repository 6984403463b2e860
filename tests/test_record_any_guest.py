"""Recording a guest from its own disk with the options any user's VM needs (issue 23),
through the CLI as a user runs it: --disk, --kernel-image/--initrd/--append, --memory,
--forward, --nic; the base image never written and a changed one refused on replay;
the bad inputs, each in one line. The guest here is the demo's disk, kernel and
initramfs given as a user's files; tests/test_refvm.py records the reference Debian VM
booted by its own GRUB."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest
from helpers import ROOT, assert_one_line_error, run_cli, wait_for_service
from tandem import artifacts
from tandem.formats import bundle, pcapng
from tandem.qemu.vm import free_port
from tandem.record.workload import KV


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def user_files(tmp_path):
    """The demo guest's disk, kernel and initramfs, copied where a user keeps their VM."""
    g, k = artifacts.guest(), artifacts.kernel("native")
    out = {"disk": tmp_path / "vm.img", "kernel": tmp_path / "bzImage", "initrd": tmp_path / "initrd.gz"}
    for key, src in (("disk", g["disk_base"]), ("kernel", k["bzImage"]), ("initrd", g["initramfs_native"])):
        shutil.copyfile(src, out[key])
    return out


def record_cli(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "replay")}
    return subprocess.Popen([sys.executable, "-m", "tandem", "record", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def test_user_disk_direct_boot_forwards_and_exact_replay(tmp_path, user_files):
    """A disk, kernel and initramfs of the user's, booted directly with --append; a forward
    to the service and one to a port where nothing listens (said once, the recording goes
    on); the exact replay verifies; the base is unchanged; inspect says what it ran."""
    port, dead = free_port(), free_port()
    tdm = tmp_path / "vm.tdm"
    before = sha256(user_files["disk"])
    proc = record_cli(str(tdm), "--disk", str(user_files["disk"]), "--kernel-image", str(user_files["kernel"]),
                      "--initrd", str(user_files["initrd"]), "--append", "panic=-1 oops=panic", "--memory", "512M",
                      "--forward", f"tcp:{port}:7000", "--forward", f"tcp:{dead}:81")
    try:
        wait_for_service(port, proc)
        with KV(port) as kv:
            for i in range(20):
                assert kv.request(f"SET k{i} {i * 7}") == "OK"
        with socket.create_connection(("127.0.0.1", dead), timeout=30) as s:
            try:    # slirp accepts, then closes (or resets) it when the guest refuses
                assert s.recv(1) == b""
            except ConnectionResetError:
                pass
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert f"forward tcp:{dead}:81: the guest refused a connection to its tcp port 81" in err, err
    assert err.count("the guest refused") == 1
    assert sha256(user_files["disk"]) == before
    r = run_cli("replay", str(tdm))
    assert r.returncode == 0 and "VERIFIED" in r.stderr, r.stdout + r.stderr
    r = run_cli("inspect", str(tdm))
    said = r.stdout + r.stderr
    assert "boot: direct" in said and str(user_files["disk"]) in said, said
    assert f"tcp:{port}:7000, tcp:{dead}:81" in said, said
    m = json.loads((tdm / bundle.MANIFEST).read_text())
    assert m["machine"]["memory_mb"] == 512 and m["inputs"]["disk_base"]["sha256"] == before


def test_a_changed_base_image_is_refused_on_replay(tmp_path, user_files):
    tdm = tmp_path / "vm.tdm"
    r = run_cli("record", str(tdm), "--disk", str(user_files["disk"]), "--kernel-image", str(user_files["kernel"]),
                "--initrd", str(user_files["initrd"]), "--duration", "3s")
    assert r.returncode == 0, r.stderr
    with open(user_files["disk"], "r+b") as f:
        f.seek(4096)
        f.write(b"changed")
    assert_one_line_error(run_cli("replay", str(tdm)), "disk_base", str(user_files["disk"]),
                          "changed since recording")


def test_bad_guest_options_are_one_line_errors(tmp_path, user_files):
    tdm = str(tmp_path / "x.tdm")
    text = tmp_path / "notes.txt"
    text.write_text("not a disk\n")
    assert_one_line_error(run_cli("record", tdm, "--disk", str(tmp_path / "nope.qcow2")), "nope.qcow2", "not found")
    assert_one_line_error(run_cli("record", tdm, "--disk", str(text)), "notes.txt", "not a disk image")
    assert_one_line_error(run_cli("record", tdm, "--disk", str(user_files["disk"])), "vm.img", "no boot sector")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert_one_line_error(run_cli("record", tdm, "--disk", str(user_files["disk"]), "--kernel-image",
                                      str(user_files["kernel"]), "--forward", f"tcp:{port}:80"),
                              f"forward tcp:{port}:80", "taken")
    r = run_cli("record", tdm, "--forward", "tcp:1:99999")
    assert r.returncode == 2 and "guest port 99999 is not a port" in r.stderr
    assert not (tmp_path / "x.tdm").exists()      # refused before any bundle was made


@pytest.mark.timeout(900)
def test_reference_vm_boots_its_own_grub_recorded_and_replayed(tmp_path):
    """The reference VM (Debian 12) from its own disk: SeaBIOS, its GRUB, its kernel and
    systemd, recorded from power-on (no agent, no kernel given) and replayed exactly; its
    DHCP exchange is on the wire; its base image is not written."""
    ref = artifacts.refvm()
    base = tmp_path / "refvm.qcow2"
    shutil.copyfile(ref["disk"], base)
    before = sha256(base)
    tdm = tmp_path / "deb.tdm"
    r = run_cli("record", str(tdm), "--disk", str(base), "--duration", "75s", timeout=800)   # DHCP at ~47 s of VM time
    assert r.returncode == 0, r.stderr
    r = run_cli("replay", str(tdm), timeout=800)
    assert r.returncode == 0 and "VERIFIED" in r.stderr, r.stderr
    r = run_cli("inspect", str(tdm))
    said = r.stdout + r.stderr
    assert "boot: firmware" in said and "DHCP 1 DISCOVER, 1 OFFER, 1 REQUEST, 1 ACK (leased 10.0.2.15)" in said, said
    console = b"".join(e.data for e in pcapng.read_devlog(tdm / bundle.DEVLOG).events if e.channel == "serial0")
    assert b"Booting `Debian GNU/Linux 12" in console and b"systemd" in console
    assert sha256(base) == before
