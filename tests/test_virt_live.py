"""Live shadow runs as libvirt domains: `tandem shadow --libvirt` and `tandem attach`
(real private libvirtd, real QEMU, real kernels; virsh as a user runs it)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, analyses, assert_one_line_error, console, quiet, run_cli, wait_for_service, wait_until
from helpers.libvirt import firmware_xml, names, native_xml, tandem_metadata, virsh
from helpers.live import drive, run_until_native_stops
from tandem import artifacts
from tandem.formats import bundle, pcapng
from tandem.exact.replay import replay
from tandem.live import attach
from tandem.errors import BundleError
from tandem.live.shadow import ShadowRun
from tandem.machine import Guest
from tandem.qemu.vm import free_port
from tandem.record.workload import KV, demo_traffic


def test_shadow_runs_native_and_analysis_as_domains(libvirtd, tmp_path):
    """tandem shadow --libvirt: virsh shows the native and its shadow while they run; the
    analysis follows live; the native's recording replays exactly outside libvirt, and so
    does the analysis run's; nothing is left defined."""
    uri = libvirtd.uri
    path = tmp_path / "web.tdm"
    sh = ShadowRun(path, analyses("native"), workdir=tmp_path / "an",
                   libvirt=attach.LiveDomains.for_bundle(uri, path, analyses("native")))
    sh.start()
    seen = {}

    def work():
        # The native can serve before its shadow's domain is defined (on a loaded host the
        # list may hold 'web' alone, and dominfo just after find the shadow running):
        # wait for the shadow, then take the whole list.
        wait_until(lambda: "web-tandem-native" in names(uri), 120, "the shadow domain web-tandem-native")
        seen["list"] = names(uri)
        seen["dominfo"] = virsh(uri, "dominfo", "web-tandem-native")
        demo_traffic(sh.port, rounds=3)
        with KV(sh.port) as kv:
            seen["get"] = kv.request("GET key1")
    t = drive(sh, work)
    run_until_native_stops(sh, client=t)
    t.join(10)
    s = sh.finish()
    assert seen["list"] == {"web", "web-tandem-native"}, seen
    assert "running" in seen["dominfo"]
    assert seen["get"].startswith("VALUE value-1")
    (r,) = s.results
    assert r.run.outcome == "poweroff", r.run.detail
    assert len(r.run.delivered) > 0 and not r.divergences, ([d.diff for d in r.divergences], r.run.limits,
                                                            r.run.first_input_ns)
    assert names(uri, "--all") == set() and libvirtd.others() == []
    m = bundle.load_manifest(path)
    assert m.machine.libvirt.domain == "web" and m.state == "complete"
    v = replay(path)
    assert v.ok, v.summary()
    v = replay(tmp_path / "an" / "native.tdm")
    assert v.ok, v.summary()


@pytest.mark.skipif(not os.environ.get("TANDEM_FREEBSD_SRC"),
                    reason="no FreeBSD source tree: TANDEM_FREEBSD_SRC (docs/freebsd.md)")
def test_a_freebsd_native_and_its_shadow_run_as_domains(libvirtd, tmp_path):
    """tandem shadow --libvirt with the FreeBSD demo guest: both domains carry tandem's TCG
    CPU model (FreeBSD's early delay loop needs its TSC frequency, docs/freebsd.md) through
    the domain's QEMU command line; the shadow serves what the native served; the
    native's recording replays exactly outside libvirt."""
    uri = libvirtd.uri
    path = tmp_path / "fb.tdm"
    an = analyses("freebsd-native")
    sh = ShadowRun(path, an, workdir=tmp_path / "an", guest=Guest.default("freebsd-native"),
                   libvirt=attach.LiveDomains.for_bundle(uri, path, an))
    sh.start()
    seen = {}

    def work():
        wait_until(lambda: "fb-tandem-freebsd-native" in names(uri), 120, "the shadow domain")
        seen["xml"] = {n: virsh(uri, "dumpxml", n) for n in ("fb", "fb-tandem-freebsd-native")}
        demo_traffic(sh.port, rounds=3)
    t = drive(sh, work)
    run_until_native_stops(sh, client=t)
    t.join(10)
    s = sh.finish()
    for name, xml in seen["xml"].items():
        assert "vendor=GenuineIntel" in xml, (name, xml[-3000:])
    (r,) = s.results
    assert r.run.outcome == "poweroff", r.run.detail
    assert len(r.run.delivered) > 0 and not r.divergences, [d.diff for d in r.divergences]
    assert names(uri, "--all") == set()
    v = replay(path)
    assert v.ok, v.summary()


def test_shadow_libvirt_cli(libvirtd, tmp_path):
    """The CLI: `tandem shadow NAME.tdm --libvirt=URI`, ended by --duration; a domain name
    already defined is refused before anything starts."""
    uri = libvirtd.uri
    r = run_cli("shadow", str(tmp_path / "cli.tdm"), "--analysis", "native", f"--libvirt={uri}",
                "--duration", "3s", "--no-record")
    assert r.returncode == 0, r.stderr
    assert "libvirt domains cli, cli-tandem-native" in r.stderr
    assert names(uri, "--all") == set() and libvirtd.others() == []
    assert bundle.load_manifest(tmp_path / "cli.tdm").machine.libvirt.domain == "cli"
    assert replay(tmp_path / "cli.tdm").ok
    plain_web(uri, tmp_path)
    try:
        assert_one_line_error(run_cli("shadow", str(tmp_path / "web.tdm"), "--analysis", "native",
                                      f"--libvirt={uri}"), "domain web: already defined")
        assert not (tmp_path / "web.tdm").exists()
    finally:
        virsh(uri, "undefine", "web")


def start_attach(uri: str, tmp_path: Path, port: int, *extra: str) -> subprocess.Popen:
    """`tandem attach web` as a user runs it, in the background."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "replay"))
    return subprocess.Popen([sys.executable, "-m", "tandem", "attach", "web", "--analysis", "native",
                             "--uri", uri, "--bundle", str(tmp_path / "web.tdm"), "--port", str(port), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)


def frames_taken(bundle_dir: Path) -> int:
    """Network frames a VM has taken so far, from its device log as it grows: for an
    analysis, what the feed has delivered (tandem holds the shadow's QMP socket, which
    takes one client). A log not there yet, or not yet past its header, counts none."""
    try:
        return sum(1 for e in pcapng.iter_events(bundle_dir / bundle.DEVLOG)
                   if e.kind == "net" and e.direction == "in")
    except (FileNotFoundError, BundleError):
        return 0


def interrupt_when_quiet(proc: subprocess.Popen, native: Path, timeout: float) -> str:
    """Ctrl-C to `tandem attach` once nothing is in flight (a host-side stop as a frame
    arrives can leave it out of the replay log): no frame has reached the native, whose
    bundle is `native`, for a poll's while. Its stderr."""
    wait_until(quiet(lambda: frames_taken(native)), 60, "the native's network to go quiet", poll=0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=timeout)
    return err


def plain_web(uri: str, tmp_path: Path) -> str:
    (tmp_path / "web.xml").write_text(native_xml(tmp_path))
    virsh(uri, "define", str(tmp_path / "web.xml"))
    return virsh(uri, "dumpxml", "--inactive", "web")


def test_attach_follows_a_plain_domain_live(libvirtd, tmp_path):
    """tandem attach on a domain defined from plain XML: tandem starts it recorded, its shadow
    takes its inputs while it serves, Ctrl-C ends the run, and the domain's own definition
    is back; the recording replays exactly (the domain's qcow2 disk, MAC and UUID)."""
    uri = libvirtd.uri
    original = plain_web(uri, tmp_path)
    port = free_port()
    proc = start_attach(uri, tmp_path, port)
    try:
        wait_for_service(port, proc)
        assert names(uri) == {"web", "web-tandem-native"}
        native, shadow = tandem_metadata(uri, "web"), tandem_metadata(uri, "web-tandem-native")
        assert "original" in native and shadow["native"] == "web" and shadow["live"] == "yes"
        demo_traffic(port, rounds=3)
        # Live: the shadow has taken the client's frames while the native still runs.
        wait_until(lambda: frames_taken(tmp_path / "web.tdm.analysis" / "native.tdm") > 0, 60,
                 "the shadow to take the native's inputs")
        assert proc.poll() is None and "web" in names(uri)
        err = interrupt_when_quiet(proc, tmp_path / "web.tdm", 180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    assert "its own definition is back" in err
    summary = json.loads((tmp_path / "web.tdm.analysis" / "summary.json").read_text())
    (a,) = summary["analyses"]
    # Ctrl-C pressed the native's power button: the shadow's is pressed after its last input
    assert a["outcome"] == "poweroff" and a["delivered"] > 0, a
    assert names(uri, "--all") == {"web"}
    assert virsh(uri, "dumpxml", "--inactive", "web") == original
    assert libvirtd.others() == []
    for p in (native["rundir"], shadow["statedir"]):
        assert not Path(p).exists(), p
    m = bundle.load_manifest(tmp_path / "web.tdm")
    assert m.machine.nics[0].mac == "52:54:00:7a:6e:01" and m.machine.disks[0].format == "qcow2"
    v = replay(tmp_path / "web.tdm")
    assert v.ok, v.summary()
    assert_one_line_error(run_cli("detach", "web", "--uri", uri), "nothing to detach")
    virsh(uri, "undefine", "web")


@pytest.mark.parametrize("mode", ["device", "exact"])
def test_attach_records_a_two_vcpu_domain(libvirtd, tmp_path, mode):
    """tandem attach on a domain with 2 vCPUs: in device mode its device log alone on both
    vCPUs, in exact mode their round-robin turns in the replay log too (qemu-patches/0038);
    its shadow (one vCPU) trailing it, the domain's definition back. The exact recording
    replays exactly; the device one is refused, naming its mode."""
    uri = libvirtd.uri
    (tmp_path / "web.xml").write_text(native_xml(tmp_path).replace("<vcpu>1</vcpu>", "<vcpu>2</vcpu>"))
    virsh(uri, "define", str(tmp_path / "web.xml"))
    original = virsh(uri, "dumpxml", "--inactive", "web")
    port = free_port()
    proc = start_attach(uri, tmp_path, port, "--mode", mode)
    try:
        wait_for_service(port, proc)
        assert names(uri) == {"web", "web-tandem-native"}
        assert re.search(r"<vcpu[^>]*>2</vcpu>", virsh(uri, "dumpxml", "web"))
        demo_traffic(port, rounds=3)
        wait_until(lambda: frames_taken(tmp_path / "web.tdm.analysis" / "native.tdm") > 0, 60,
                   "the shadow to take the native's inputs")
        err = interrupt_when_quiet(proc, tmp_path / "web.tdm", 180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    (a,) = json.loads((tmp_path / "web.tdm.analysis" / "summary.json").read_text())["analyses"]
    assert a["outcome"] == "poweroff" and a["delivered"] > 0, a
    assert virsh(uri, "dumpxml", "--inactive", "web") == original
    m = bundle.load_manifest(tmp_path / "web.tdm")
    assert (m.machine.mode, m.machine.smp) == ("device" if mode == "device" else None, 2), m.machine
    if mode == "device":
        assert_one_line_error(run_cli("replay", str(tmp_path / "web.tdm")), "recorded in device mode")
    else:
        v = replay(tmp_path / "web.tdm")
        assert v.ok, v.summary()
    virsh(uri, "undefine", "web")


FREEBSD_LOR = "WITNESS: lock order reversal: tandem_b -> tandem_a in tb_stats_reset"


@pytest.mark.skipif(not os.environ.get("TANDEM_FREEBSD_SRC"),
                    reason="no FreeBSD source tree: TANDEM_FREEBSD_SRC (docs/freebsd.md)")
@pytest.mark.timeout(900)
@pytest.mark.parametrize("boot", ["direct", "loader"])
def test_attach_follows_a_freebsd_domain_live(libvirtd, tmp_path, boot):
    """tandem attach on a FreeBSD domain as a user defines it (its kernel booted directly,
    or its firmware booting its disk through FreeBSD's own loader; its disk, user
    networking; no CPU model of tandem's): tandem knows the guest is FreeBSD from its
    kernel file or its disk's partitions, records it with the CPU FreeBSD's early delays
    need under TCG, and its debug-kernel shadow (booted on the root the native's kernel
    said it mounted, for the loader's boot) reports the lock order reversal the native's
    requests made, live; the recording replays exactly and the domain's own definition is
    back."""
    uri = libvirtd.uri
    mac = "52:54:00:7a:6e:02"
    port = free_port()
    if boot == "direct":
        xml, reach = native_xml(tmp_path, "fb", flavor="freebsd-native", mac=mac), ["--port", str(port)]
    else:
        disk = tmp_path / "fb.qcow2"       # a standalone image, as a user's is
        subprocess.run([artifacts.qemu()["img"], "convert", "-f", "raw", "-O", "qcow2",
                        artifacts.freebsd_disk()["disk"], str(disk)], check=True, capture_output=True)
        xml, reach = firmware_xml("fb", [(disk, "qcow2")], mac=mac), ["--forward", f"tcp:{port}:7000"]
    (tmp_path / "fb.xml").write_text(xml)
    virsh(uri, "define", str(tmp_path / "fb.xml"))
    original = virsh(uri, "dumpxml", "--inactive", "fb")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "replay"))
    proc = subprocess.Popen([sys.executable, "-m", "tandem", "attach", "fb", "--analysis", "freebsd-debug",
                             "--uri", uri, "--bundle", str(tmp_path / "fb.tdm"), *reach, "--stop", "quit"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        wait_for_service(port, proc, timeout=300)
        # The loader's boot names its root only on the console, so the shadow is defined
        # once the native's kernel has printed it: its services may answer first.
        wait_until(lambda: names(uri) == {"fb", "fb-tandem-freebsd-debug"}, 60,
                   lambda: f"the shadow to be defined beside the native (domains: {sorted(names(uri))})")
        assert "vendor=GenuineIntel" in virsh(uri, "dumpxml", "fb")
        demo_traffic(port, rounds=2)
        with KV(port) as kv:
            assert [kv.request("BUG lock-ab"), kv.request("BUG lock-ba")] == ["OK", "OK"]
        findings = tmp_path / "fb.tdm.analysis" / "findings.jsonl"
        wait_until(lambda: findings.exists() and FREEBSD_LOR in findings.read_text(), 180,
                   "the shadow to report the lock order reversal live")
        err = interrupt_when_quiet(proc, tmp_path / "fb.tdm", 300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, err        # found something
    assert "its own definition is back" in err, err
    summary = json.loads((tmp_path / "fb.tdm.analysis" / "summary.json").read_text())
    (a,) = summary["analyses"]
    assert a["delivered"] > 0 and [f["title"] for f in a["findings"]] == [FREEBSD_LOR], a
    assert names(uri, "--all") == {"fb"}
    assert virsh(uri, "dumpxml", "--inactive", "fb") == original
    m = bundle.load_manifest(tmp_path / "fb.tdm")
    assert (m.machine.os, m.machine.cpu, m.machine.nics[0].mac) == ("freebsd", "tcg-intel", mac)
    if boot == "loader":
        assert m.machine.boot == "firmware" and b"Trying to mount root from ufs:/dev/vtbd0p2" in \
            console(tmp_path / "fb.tdm.analysis" / "freebsd-debug.tdm")
    v = replay(tmp_path / "fb.tdm")
    assert v.ok, v.summary()
    virsh(uri, "undefine", "fb")


def test_detach_after_attach_died(libvirtd, tmp_path):
    """tandem dies mid-run: the native goes on serving; detach stops it, puts its own
    definition back and removes the shadow, its run directories and sockets."""
    uri = libvirtd.uri
    original = plain_web(uri, tmp_path)
    port = free_port()
    proc = start_attach(uri, tmp_path, port)
    try:
        wait_for_service(port, proc)
        native, shadow = tandem_metadata(uri, "web"), tandem_metadata(uri, "web-tandem-native")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    with KV(port) as kv:
        assert kv.request("GET up") == "VALUE 1"
    assert "web" in names(uri)
    r = run_cli("detach", "web", "--uri", uri)
    assert r.returncode == 0, r.stderr
    assert "restored web's own definition" in r.stderr
    assert names(uri, "--all") == {"web"}
    assert virsh(uri, "dumpxml", "--inactive", "web") == original
    assert libvirtd.others() == []
    for p in (native["rundir"], shadow["statedir"], shadow["feed"], shadow["qmp"]):
        assert not Path(p).exists(), p
    virsh(uri, "undefine", "web")


def test_attach_refusals_are_one_line(libvirtd, tmp_path):
    uri = libvirtd.uri
    plain_web(uri, tmp_path)
    xml = (tmp_path / "web.xml").read_text()
    variants = {
        # macvtap: libvirt's tap on a host NIC, whose frames tandem's command line cannot carry
        "net": xml.replace("<interface type='user'>", "<interface type='direct'><source dev='eth0' mode='bridge'/>"),
    }
    try:
        for name, text in variants.items():
            (tmp_path / f"{name}.xml").write_text(text.replace("<name>web</name>", f"<name>{name}</name>")
                                                  .replace("52:54:00:7a:6e:01", "52:54:00:7a:6e:02"))
            virsh(uri, "define", str(tmp_path / f"{name}.xml"))
        assert_one_line_error(run_cli("attach", "net", "--analysis", "native", "--uri", uri), "'direct'")
        assert_one_line_error(run_cli("attach", "web", "--analysis", "native", "--uri", uri,
                                      "--rtc-base", "2026-01-01T00:00:00"), "--no-follow")
        assert names(uri, "--all") == {"web", "net"}
        assert not (Path.cwd() / "web.tdm").exists()
    finally:
        for n in ("web", "net"):
            virsh(uri, "undefine", n, check=False)
