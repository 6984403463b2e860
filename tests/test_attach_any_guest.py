"""`tandem attach` on an ordinary guest: a libvirt domain as a user
defines it for the reference VM (firmware boot from its own disk, GRUB, systemd, nginx,
redis; a second data disk; user networking), recorded from boot by tandem while a KASAN
shadow domain boots the same disks and trails it, served by Debian's clients, shut down
with `virsh shutdown`, and put back as it was (real private libvirtd, real QEMU)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, assert_one_line_error, run_cli, wait_until
from helpers.libvirt import firmware_xml, names, virsh
from helpers.refvm import arp_replies_to_guest, dhcp_to_guest, offered_then_acked
from tandem import artifacts
from tandem.formats import bundle
from tandem.qemu.vm import free_port
from tandem.record import clients

MAC = "52:54:00:7a:6e:24"


def refvm_xml(tmp_path: Path, name: str = "refvm") -> str:
    """The reference VM as a user defines it: booted by its firmware (no <kernel>), its
    disk and a raw data disk on virtio, one virtio NIC on user networking."""
    disk, data = tmp_path / f"{name}.qcow2", tmp_path / f"{name}-data.raw"
    if not disk.exists():
        shutil.copyfile(artifacts.refvm()["disk"], disk)
    with open(data, "wb") as f:
        f.truncate(8 << 20)
    return firmware_xml(name, [(disk, "qcow2"), (data, "raw")], memory_mb=1024, mac=MAC)


@pytest.mark.timeout(2400)
def test_attach_records_and_shadows_the_reference_vm_as_a_libvirt_domain(libvirtd, built, tmp_path):
    uri = libvirtd.uri
    (tmp_path / "refvm.xml").write_text(refvm_xml(tmp_path))
    virsh(uri, "define", str(tmp_path / "refvm.xml"))
    original = virsh(uri, "dumpxml", "--inactive", "refvm")
    http, redis = free_port(), free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "replay"))
    # At normal priority: at idle priority the suite's other VMs may starve the shadow
    # (it would then be analysed again offline, correct but slower).
    proc = subprocess.Popen([sys.executable, "-m", "tandem", "attach", "refvm", "--analysis", "kasan",
                             "--uri", uri, "--bundle", str(tmp_path / "refvm.tdm"), "--analysis-priority", "normal",
                             "--forward", f"tcp:{http}:80", "--forward", f"tcp:{redis}:6379"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        wait_until(lambda: clients.http_up(http) or proc.poll() is not None, 900, "nginx on the reference VM",
                   poll=1.0)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        wait_until(lambda: clients.redis_up(redis), 120, "redis on the reference VM", poll=1.0)
        assert names(uri) == {"refvm", "refvm-tandem-kasan"}
        clients.fetch_files(http, {f["path"]: f["sha256"] for f in artifacts.refvm()["site"]})
        clients.ab(http, requests=50)
        clients.redis_benchmark(redis, requests=200)
        virsh(uri, "shutdown", "refvm")         # ACPI power button, as a user stops a VM
        out, err = proc.communicate(timeout=1800)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    assert "its own definition is back" in err
    summary = json.loads((tmp_path / "refvm.tdm.analysis" / "summary.json").read_text())
    (a,) = summary["analyses"]
    assert a["outcome"] in ("poweroff", "finished") and a["delivered"] > 0, a
    assert not a["findings"] and not a["divergences"], a
    # the shadow's own recording: its DHCP and its ARP for the gateway answered from the native's
    shadow_log = tmp_path / "refvm.tdm.analysis" / "kasan.tdm" / bundle.DEVLOG
    assert offered_then_acked(dhcp_to_guest(shadow_log)), dhcp_to_guest(shadow_log)
    assert bytes([10, 0, 2, 2]) in arp_replies_to_guest(shadow_log)
    assert names(uri, "--all") == {"refvm"} and virsh(uri, "dumpxml", "--inactive", "refvm") == original
    assert libvirtd.others() == []
    m = bundle.load_manifest(tmp_path / "refvm.tdm")
    assert m.machine.libvirt.domain == "refvm" and len(m.machine.disks) == 2
    assert m.machine.nics[0].mac == MAC
    virsh(uri, "undefine", "refvm")


def test_attach_refuses_what_it_cannot_record_of_a_users_domain(libvirtd, tmp_path):
    uri = libvirtd.uri
    xml = refvm_xml(tmp_path, "mine")
    variants = {
        "ide": xml.replace("<target dev='vdb' bus='virtio'/>", "<target dev='hdb' bus='ide'/>"),
        "raw": xml.replace("<driver name='qemu' type='qcow2'/>", "<driver name='qemu' type='raw'/>"),
        "cdrom": xml.replace("<disk type='file' device='disk'><driver name='qemu' type='raw'/>",
                             "<disk type='file' device='cdrom'><driver name='qemu' type='raw'/>")
                    .replace("dev='vdb' bus='virtio'", "dev='hdb' bus='ide'"),
        "blockdev": xml.replace(f"<disk type='file' device='disk'><driver name='qemu' type='raw'/>\n      "
                                f"<source file='{tmp_path / 'mine-data.raw'}'/>",
                                "<disk type='block' device='disk'><driver name='qemu' type='raw'/>\n      "
                                "<source dev='/dev/null'/>"),
    }
    try:
        for name, text in variants.items():
            assert text != xml, name
            (tmp_path / f"{name}.xml").write_text(text.replace("<name>mine</name>", f"<name>{name}</name>"))
            virsh(uri, "define", str(tmp_path / f"{name}.xml"))
        assert_one_line_error(run_cli("attach", "ide", "--analysis", "kasan", "--uri", uri), "bus 'ide'")
        assert_one_line_error(run_cli("attach", "cdrom", "--analysis", "kasan", "--uri", uri), "a cdrom")
        assert_one_line_error(run_cli("attach", "raw", "--analysis", "kasan", "--uri", uri, "--forward", "tcp:8080:80"),
                              "the domain says raw, the file is a qcow2 image")
        assert_one_line_error(run_cli("attach", "blockdev", "--analysis", "kasan", "--uri", uri), "not a file")
        assert_one_line_error(run_cli("attach", "ide", "--analysis", "kasan", "--uri", uri, "--no-follow",
                                      "--forward", "tcp:8080:80"), "--forward: not with --no-follow")
        assert_one_line_error(run_cli("attach", "ide", "--analysis", "kasan", "--uri", uri, "--no-follow",
                                      "--release", "agreed"), "--release: not with --no-follow")
        assert_one_line_error(run_cli("attach", "ide", "--analysis", "kasan", "--uri", uri, "--no-follow",
                                      "--metrics-port", "0"), "--metrics-port: not with --no-follow")
        assert names(uri, "--all") == set(variants)
    finally:
        for n in variants:
            virsh(uri, "undefine", n, check=False)
