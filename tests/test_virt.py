"""tandem's VMs as libvirt domains, under a real private libvirtd and the patched QEMU.

Each test starts what it needs: the daemon (libvirtd + virtlogd, all files in a temp
directory), domains, QEMU. `virsh` is the plain libvirt client, as a user would run it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import stat
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers import assert_one_line_error, run_cli, wait_until
from helpers.libvirt import names, native_xml, shadow_pid, virsh
from tandem import artifacts
from tandem.formats import bundle, sealing
from tandem.qemu import feed
from tandem.record import recording
from tandem.libvirt import daemon, domain, shadows
from tandem.errors import TandemError
from tandem.exact.replay import replay
from tandem.machine import RR, Feed, Guest, LibvirtSection, NetSection, Run, UserNet
from tandem.qemu.vm import Serial, alive, free_port
from tandem.record.workload import KV


def test_private_libvirtd_starts_and_leaves_nothing(built, tmp_path):
    host = {p: Path(p).exists() for p in ("/run/libvirt", "/var/lib/libvirt", "/var/log/libvirt")}
    passwd = hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest()
    d = daemon.Libvirtd(tmp_path / "lv")
    d.start()
    try:
        pids = d.pids()
        assert set(pids) == {"libvirtd", "virtlogd"} and all(alive(p) for p in pids.values())
        assert virsh(d.uri, "uri").strip() == d.uri
        assert names(d.uri, "--all") == set()
        # The daemon's /run, /etc and /var are its own: the host's are untouched.
        assert {p: Path(p).exists() for p in host} == host
        assert hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest() == passwd
        assert "tandem-libvirt" not in Path("/proc/self/mountinfo").read_text()
        assert (d.dir / "run" / "libvirt" / "virtlogd-sock").exists()
        # The daemon sees its own libvirt directories only, not the host's (/etc/libvirt
        # has libvirt.conf from libvirt-clients).
        seen = {p.name for p in Path(f"/proc/{pids['libvirtd']}/root/etc/libvirt").iterdir()}
        assert "qemu.conf" in seen and "libvirt.conf" not in seen, seen
        assert set(pids.values()) <= set(d.processes())
    finally:
        d.close()
    assert not any(alive(p) for p in pids.values())
    assert d.processes() == [] and not d.dir.exists()


def test_domain_xml_resolves_libvirt_conflicts(libvirtd, tmp_path):
    """What libvirt generates itself is not passed twice; -rtc is libvirt's, as tandem's."""
    g = Guest.default()
    run = Run(tmp_path, net=Feed(tmp_path / "f.sock", rtc_base="2026-01-01T00:00:00"), overlay=tmp_path / "d.qcow2")
    xml = domain.domain_xml("conflicts", g, run)
    root = ET.fromstring(xml)
    passed = [a.get("value") for a in root.iter(f"{{{domain.QEMU_NS}}}arg")]
    assert not set(passed) & set(domain.LIBVIRT_OWNS)
    assert passed[:2] == ["-L", artifacts.qemu()["firmware_dir"]] and "-icount" in passed
    clock = root.find("clock")
    assert clock.get("offset") == "absolute" and clock.get("start") == "1767225600"
    conn = daemon.connect(libvirtd.uri)
    conn.defineXML(xml)
    try:
        argv = virsh(libvirtd.uri, "domxml-to-native", "qemu-argv", "--domain", "conflicts").split()
    finally:
        conn.lookupByName("conflicts").undefine()
    for once in ("-rtc", "-m", "-smp", "-accel", "-nodefaults", "-kernel", "-icount", "-L"):
        assert argv.count(once) == 1, once
    assert argv[argv.index("-rtc") + 1] == "base=2026-01-01T00:00:00,clock=vm"
    assert argv[argv.index("-accel") + 1] == "tcg" and "-no-acpi" not in argv
    with pytest.raises(TandemError, match="only under TCG"):
        domain.domain_xml("k", g, run, virt_type="kvm")
    # A plain run without icount may be a kvm domain (written, not run here: docs/libvirt.md).
    kvm = ET.fromstring(domain.domain_xml("k", g, Run(tmp_path, overlay=tmp_path / "d.qcow2", icount=False),
                                        virt_type="kvm"))
    passed = [a.get("value") for a in kvm.iter(f"{{{domain.QEMU_NS}}}arg")]
    assert kvm.get("type") == "kvm" and "-accel" not in passed and "-icount" not in passed


def test_tandem_domain_boots_serves_and_replays(libvirtd, tmp_path):
    """The native as a libvirt domain: tandem's record argv, the demo service through the
    host port forward, virsh list/dominfo; its recording replays exactly outside libvirt."""
    g = Guest.default()
    path, rundir, port = tmp_path / "native.tdm", tmp_path / "run", free_port()
    rundir.mkdir()
    uuid = "5a4d1e2b-0000-4000-8000-000000000001"
    m = recording.start_bundle(path, g, dataclasses.replace(
        g.section(), libvirt=LibvirtSection(uuid=uuid), net=NetSection(backend="user", hostfwd_port=port, guest_port=7000)))
    run = Run(rundir, net=UserNet(port), rr=RR("record", path / bundle.STREAM), devlog=path / bundle.DEVLOG,
              overlay=path / bundle.OVERLAY)
    conn = daemon.connect(libvirtd.uri)
    dom = conn.defineXML(domain.domain_xml("native", g, run, uuid=uuid))
    t0 = time.monotonic()
    dom.create()
    assert "native" in names(libvirtd.uri)
    info = dict(line.split(":", 1) for line in virsh(libvirtd.uri, "dominfo", "native").splitlines() if ":" in line)
    assert info["State"].strip() == "running" and info["CPU(s)"].strip() == "1"
    assert info["Max memory"].strip() == f"{g.memory_mb * 1024} KiB"
    serial = Serial(wait_until(lambda: (rundir / "serial.sock").exists() and rundir / "serial.sock", 30,
                             "the serial socket"))
    serial.wait_for(b"TANDEM-READY", 120)
    with KV(port) as kv:
        assert kv.request("SET libvirt yes") == "OK"
        assert kv.request("GET libvirt") == "VALUE yes"
    serial.type("poweroff")
    wait_until(lambda: not dom.isActive(), 60, "the guest to power off")
    serial.close()
    assert "native" not in names(libvirtd.uri) and "native" in names(libvirtd.uri, "--inactive")
    m = sealing.seal(path, m, status=0, wall_s=time.monotonic() - t0, stop_reason="poweroff")
    assert m.state == "complete"
    v = replay(path)
    assert v.ok, v.summary()
    dom.undefine()


def test_attach_and_detach(libvirtd, tmp_path):
    uri = libvirtd.uri
    (tmp_path / "web.xml").write_text(native_xml(tmp_path))
    virsh(uri, "define", str(tmp_path / "web.xml"))
    state = tmp_path / "shadows"
    r = run_cli("attach", "web", "--analysis", "native,kasan", "--uri", uri, "--state-dir", str(state), "--json",
                "--no-follow")
    assert r.returncode == 0, r.stderr
    attached = {s["analysis"]: s for s in json.loads(r.stdout)}
    assert set(attached) == {"native", "kasan"}
    assert names(uri) == {"web-tandem-native", "web-tandem-kasan"}          # the native is not started
    assert "shut off" in virsh(uri, "dominfo", "web")

    # Private: the feed and QMP sockets steer a shadow, so they are only in
    # 0700 directories (0755 under umask 022 if tandem left it to the umask); overlays 0600.
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for s in attached.values():
        assert Path(s["feed_socket"]).parent == Path(s["qmp_socket"]).parent == Path(s["state_dir"])
        assert stat.S_IMODE(Path(s["state_dir"]).stat().st_mode) == 0o700
        assert stat.S_IMODE(Path(s["overlay"]).stat().st_mode) == 0o600

    # The shadows: the analysis kernel, the native's MAC, an overlay over the native's disk.
    kasan = attached["kasan"]
    cmdline = Path(f"/proc/{shadow_pid(libvirtd, 'web-tandem-kasan')}/cmdline").read_bytes().split(b"\0")
    assert artifacts.kernel("kasan")["bzImage"].encode() in cmdline
    nics = [json.loads(a) for a in cmdline if a.startswith(b'{"driver":"virtio-net-pci"')]
    assert [n.get("mac") for n in nics] == ["52:54:00:7a:6e:01"]
    info = json.loads(subprocess.run([artifacts.qemu()["img"], "info", "--output=json", "-U", kasan["overlay"]],
                                     capture_output=True, text=True, check=True).stdout)
    assert info["format"] == "qcow2" and info["backing-filename"] == str(tmp_path / "web.qcow2")
    assert "<tandem:shadow" in virsh(uri, "dumpxml", "web-tandem-kasan")
    assert "Max memory:     524288 KiB" in virsh(uri, "dominfo", "web-tandem-kasan")

    # tandem's own QMP monitor, next to libvirt's: the feed holds the VM at time 0.
    sh = shadows.ShadowDomain(**{k: Path(v) if k.endswith(("dir", "socket", "overlay")) else v
                        for k, v in kasan.items()})
    qmp = sh.qmp()
    assert qmp.command("query-status")["status"] == "running"           # held, not stopped
    assert qmp.command("qom-get", path="/objects/feed", property="horizon") == 0
    qmp.close()

    # Fed a horizon, it runs there and says WAIT.
    srv = feed.FeedServer(Path(kasan["feed_socket"])).start()
    try:
        srv.accept(10)
        srv.horizon(20_000_000)
        srv.flush()
        got: list[feed.Message] = []

        def waits() -> bool:
            msgs = srv.receive(1.0)
            assert msgs is not None, "the shadow's QEMU closed its feed"
            got.extend(msgs)
            return any(m.type == feed.WAIT for m in got)
        wait_until(waits, 60, "the shadow to say WAIT at its horizon", poll=0)
        wait = [m for m in got if m.type == feed.WAIT]
        assert wait[0].vm_ns >= 20_000_000
    finally:
        srv.conn.close()
        srv.listener.close()        # the socket file stays: detach must remove it

    # virsh destroy behaves as on any domain.
    native_pid = shadow_pid(libvirtd, "web-tandem-native")
    virsh(uri, "destroy", "web-tandem-native")
    assert "web-tandem-native" not in names(uri) and "web-tandem-native" in names(uri, "--inactive")
    wait_until(lambda: not alive(native_pid), 10, "the destroyed shadow's QEMU to exit")

    r = run_cli("detach", "web", "--uri", uri)
    assert r.returncode == 0, r.stderr
    assert names(uri, "--all") == {"web"}
    assert not state.exists()                                  # overlays, sockets, state dirs
    assert (tmp_path / "web.qcow2").is_file()                  # the native's disk is the native's
    assert libvirtd.others() == []                             # no QEMU left
    virsh(uri, "undefine", "web")


def test_attach_refuses_with_one_line(libvirtd, tmp_path):
    uri = libvirtd.uri
    (tmp_path / "db.xml").write_text(native_xml(tmp_path, "db"))
    (tmp_path / "old.xml").write_text(native_xml(tmp_path, "old", nic="e1000"))
    virsh(uri, "define", str(tmp_path / "db.xml"))
    virsh(uri, "define", str(tmp_path / "old.xml"))
    try:
        assert_one_line_error(run_cli("attach", "nosuch", "--analysis", "kasan", "--uri", uri), "nosuch")
        assert_one_line_error(run_cli("attach", "db", "--analysis", "valgrind", "--uri", uri), "valgrind")
        assert_one_line_error(run_cli("attach", "db", "--analysis", "native", "--uri", uri, "--no-follow",
                                      "--rtc-base", "yesterday"), "--rtc-base")
        assert_one_line_error(run_cli("attach", "old", "--analysis", "native", "--uri", uri, "--no-follow",
                                      "--state-dir", str(tmp_path / "s1")), "e1000")
        assert not (tmp_path / "s1").exists() or not any((tmp_path / "s1").iterdir())
        assert names(uri, "--all") == {"db", "old"}
        r = run_cli("attach", "db", "--analysis", "native", "--uri", uri, "--no-start",
                    "--state-dir", str(tmp_path / "s2"))
        assert r.returncode == 0, r.stderr
        assert_one_line_error(run_cli("attach", "db", "--analysis", "native", "--uri", uri), "already defined")
        assert run_cli("detach", "db", "--uri", uri).returncode == 0
        assert_one_line_error(run_cli("detach", "db", "--uri", uri), "no tandem shadows")
        assert_one_line_error(run_cli("attach", "db", "--analysis", "kasan", "--uri", "qemu+unix:///system?socket=/nonexistent"),
                              "libvirt")
    finally:
        for n in ("db", "old"):
            virsh(uri, "undefine", n, check=False)
