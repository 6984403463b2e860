"""`tandem attach --mode device` on a domain as libvirt's users define one: the reference
VM booted by its firmware, 2 vCPUs, its NIC on libvirt's `default` NAT network, two
disks, a serial console and libvirt's default devices; recorded on libvirt's own command
line (libvirt/recorded.py) while a KASAN and a lockdep shadow trail it. The private libvirtd runs in
a network namespace of its own with its default network there (its bridge, dnsmasq and
NAT rules touch nothing of the host's), and Debian's clients reach the guest at its
address from inside that namespace (real libvirtd, real QEMU, real dnsmasq)."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from helpers import ROOT, assert_one_line_error, run_cli, wait_until
from helpers.libvirt import names, tandem_metadata, virsh
from helpers.refvm import dhcp_to_guest, offered_then_acked
from helpers.reverse import check_reverse_of_one_vcpu, gdb_reverse
from tandem import artifacts
from tandem.exact.debug import debug
from tandem.formats import bundle
from tandem.qemu.vm import free_port
from tandem.record import clients

MAC = "52:54:00:7a:6e:31"


@pytest.fixture(scope="module")
def netns_libvirtd(built, tmp_path_factory):
    """A private libvirtd in a network namespace of its own, its `default` network started."""
    from tandem.libvirt import daemon
    d = daemon.Libvirtd(tmp_path_factory.mktemp("libvirt") / "libvirt", netns=True)
    d.start()
    yield d
    d.close()


@pytest.fixture
def clean_libvirtd(netns_libvirtd):
    """The module's libvirtd, with every domain a test left (one that failed half-way)
    destroyed and undefined after it: the next test defines the same names."""
    yield netns_libvirtd
    for name in names(netns_libvirtd.uri, "--all"):
        virsh(netns_libvirtd.uri, "destroy", name, check=False)
        virsh(netns_libvirtd.uri, "undefine", name, check=False)


NICS = {
    "network": f"""<interface type='network'><source network='default'/><mac address='{MAC}'/>
      <model type='virtio'/></interface>""",
    # a bridge of the host's: here the default network's own, where its dnsmasq answers
    "bridge": f"""<interface type='bridge'><source bridge='virbr0'/><mac address='{MAC}'/>
      <model type='virtio'/></interface>""",
}


def domain_xml(tmp_path: Path, name: str = "refvm", *, nic: str | None = None, extra: str = "",
               clock: str = "utc", features: str = "<acpi/><apic/>", machine: str = "pc") -> str:
    """The reference VM as virt-install writes a domain: firmware boot, 2 vCPUs, its qcow2
    disk and a raw data disk on virtio, a virtio NIC on the `default` network, a serial
    port and its console, a virtio rng; libvirt adds its balloon and USB controller (and
    on q35, virt-install's machine, a pcie-root-port for each PCIe device)."""
    disk, data = tmp_path / f"{name}.qcow2", tmp_path / f"{name}-data.raw"
    if not disk.exists():
        shutil.copyfile(artifacts.refvm()["disk"], disk)
    with open(data, "wb") as f:
        f.truncate(8 << 20)
    nic = nic or NICS["network"]
    return f"""<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>1024</memory>
  <vcpu placement='static'>2</vcpu>
  <os><type arch='x86_64' machine='{machine}'>hvm</type><boot dev='hd'/></os>
  <features>{features}</features>
  <clock offset='{clock}'/>
  <devices>
    <emulator>{artifacts.qemu()['binary']}</emulator>
    <disk type='file' device='disk'><driver name='qemu' type='qcow2'/>
      <source file='{disk}'/><target dev='vda' bus='virtio'/></disk>
    <disk type='file' device='disk'><driver name='qemu' type='raw'/>
      <source file='{data}'/><target dev='vdb' bus='virtio'/></disk>
    {nic}
    <serial type='pty'><target port='0'/></serial>
    <console type='pty'><target type='serial' port='0'/></console>
    <rng model='virtio'><backend model='random'>/dev/urandom</backend></rng>{extra}
  </devices>
</domain>"""


def leases(uri: str, mac: str) -> list[tuple[str, str]]:
    """The leases libvirt's dnsmasq has given mac on `default`: (expiry, address), the
    expiry as virsh prints it (YYYY-MM-DD HH:MM:SS, so in order as text)."""
    return re.findall(rf"^\s*(\S+ \S+)\s+{mac}\s+ipv4\s+([\d.]+)/", virsh(uri, "net-dhcp-leases", "default"),
                      re.M)


def leased(uri: str, mac: str, since: str) -> str | None:
    """The address of a lease given to mac after the newest of `since` (an expiry): an
    earlier test's guest with the same MAC leaves its own (another address when its DHCP
    client id differs: it follows the NIC's name, enp1s0 on q35, ens3 on i440FX)."""
    newer = [lease for lease in leases(uri, mac) if lease[0] > since]
    return max(newer)[1] if newer else None


def start_attach(uri: str, tmp_path: Path, stderr: Path, *args: str) -> subprocess.Popen:
    """`tandem attach refvm` (bundle refvm.tdm) started as a user starts it, its stderr to a file."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "replay"))
    with open(stderr, "w") as err_file:
        return subprocess.Popen([sys.executable, "-m", "tandem", "attach", "refvm", "--uri", uri,
                                 "--bundle", str(tmp_path / "refvm.tdm"), *args],
                                stdout=subprocess.DEVNULL, stderr=err_file, text=True, env=env,
                                start_new_session=True)


def nginx_at_its_lease(d, proc: subprocess.Popen, since: str, said, timeout: float) -> tuple[str, clients.Via]:
    """The guest's address on `default` (a lease newer than `since`) once nginx answers
    there within `timeout` s, and the clients' way to it (from the libvirtd's namespace)."""
    ip = wait_until(lambda: leased(d.uri, MAC, since) or proc.poll() is not None, 900,
                    "the guest's DHCP lease on libvirt's default network", poll=1.0)
    assert proc.poll() is None, said()
    wait_until(lambda: d.run_in_netns(["curl", "-sf", "-o", "/dev/null", f"http://{ip}/"],
                                      capture_output=True).returncode == 0, timeout, "nginx at the guest's address",
               poll=1.0)
    return ip, clients.Via(host=ip, netns=d.netns_path)


# On the bridge, the gate (qemu-patches/0033) on libvirt's tap: each of the guest's
# responses leaves only once both shadows gave it, and a shadow that falls behind holds the
# clients' requests rather than being let go. Its metrics say how far the shadows trail.
GATED = ["--release", "agreed", "--overflow", "block", "--metrics-port", "0"]


def shadows_lag(said: str) -> float | None:
    """The most wall seconds a shadow trails the native by, from the Prometheus endpoint
    tandem attach announced (None before it did)."""
    from prometheus_client.parser import text_string_to_metric_families
    if not (m := re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", said)):
        return None
    text = urllib.request.urlopen(m.group(1), timeout=10).read().decode()
    return max((s.value for f in text_string_to_metric_families(text) if f.name == "tandem_lag_wall_seconds"
                for s in f.samples), default=0.0)


def paced_fetches(site: dict[str, str], via: clients.Via, said, under: float = 5.0) -> None:
    """Each file fetched once the shadows trail by less than `under` seconds: gated, a
    response waits for them, and nginx closes a connection whose client took nothing for
    its send_timeout (60 s; docs/shadow.md, Limits)."""
    for path, digest in site.items():
        wait_until(lambda: (lag := shadows_lag(said())) is not None and lag < under, 900,
                   lambda path=path: f"the shadows within {under:g} s of the native before {path} (tandem said: {said()})",
                   poll=2.0)
        clients.fetch_files(80, {path: digest}, via=via, max_time=900)


@pytest.mark.timeout(2400)
@pytest.mark.parametrize("nic,machine,policy", [("network", "q35", []), ("bridge", "pc", GATED)])
def test_attach_records_a_domain_on_libvirts_default_network_in_device_mode(clean_libvirtd, tmp_path, nic, machine,
                                                                             policy):
    """The reference VM (its Debian kernel runs both vCPUs) with a KASAN and a lockdep
    shadow: on q35 with its NIC on libvirt's default network, or on i440FX on a bridge
    with its outputs released as the shadows agree. Served, shut down by Ctrl-C, nothing
    found, nothing different, nothing held back that agreed, nothing left."""
    d, uri = clean_libvirtd, clean_libvirtd.uri
    (tmp_path / "refvm.xml").write_text(domain_xml(tmp_path, nic=NICS[nic], machine=machine))
    virsh(uri, "define", str(tmp_path / "refvm.xml"))
    original = virsh(uri, "dumpxml", "--inactive", "refvm")
    stderr = tmp_path / "attach.err"
    since = max((expiry for expiry, _ in leases(uri, MAC)), default="")
    proc = start_attach(uri, tmp_path, stderr, "--mode", "device", "--analysis", "kasan,lockdep",
                        "--analysis-priority", "normal", *policy)
    said = lambda: stderr.read_text()[-3000:]     # noqa: E731
    try:
        # gated, the first response leaves once both shadows have booted and given it too
        _, via = nginx_at_its_lease(d, proc, since, said, 900 if policy else 300)
        # The shadow is defined once the native's kernel has printed its root device.
        wait_until(lambda: names(uri) == {"refvm", "refvm-tandem-kasan", "refvm-tandem-lockdep"}, 120,
                   lambda: f"the shadow beside the native (domains {sorted(names(uri))}; tandem said: {said()})")
        native = tandem_metadata(uri, "refvm")
        live = virsh(uri, "dumpxml", "refvm")
        # libvirt's own command line: its network (a tap on virbr0), tandem's QEMU, vhost off
        assert f"<interface type='{nic}'>" in live and "<driver name='qemu'/>" in live, live
        assert f"<emulator>{artifacts.qemu()['binary']}</emulator>" in live
        assert re.search(rf"machine='pc-{'q35' if machine == 'q35' else 'i440fx'}-", live), live
        pid = int((d.dir / "run/libvirt/qemu/refvm.pid").read_text())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert any(b'"type":"tap"' in a and b'"id":"hostnet0"' in a for a in argv), argv
        assert any(b'"netdev":"hostnet0"' in a and b"filter-devlog" in a for a in argv), argv
        # Gated, a response leaves only once the shadows gave it too, and nginx sees a client
        # that takes nothing meanwhile: past its send_timeout (60 s) it closes the connection.
        # The files are fetched as the shadows catch up; the 4 MiB one took the KASAN shadow
        # longer than that on its own here (docs/shadow.md, Limits).
        site = {f["path"]: f["sha256"] for f in artifacts.refvm()["site"] if not (policy and f["path"] == "/4m.bin")}
        if policy:
            paced_fetches(site, via, said)
        else:
            clients.fetch_files(80, site, via=via)
            # load with clients' own timeouts (ab's 60 s): a gated answer may take longer
            clients.ab(80, requests=50, via=via)
            clients.redis_benchmark(6379, requests=200, via=via)
        proc.send_signal(signal.SIGINT)         # Ctrl-C: the power button, as virsh shutdown
        proc.wait(timeout=1800)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            virsh(uri, "destroy", "refvm", check=False)     # libvirt's QEMU is not in tandem's group
    err = stderr.read_text()
    assert proc.returncode == 0, err[-3000:]
    assert "its own definition is back" in err
    for a in json.loads((tmp_path / "refvm.tdm.analysis" / "summary.json").read_text())["analyses"]:
        assert a["outcome"] in ("poweroff", "finished") and a["delivered"] > 0, a
        assert not a["findings"] and not a["divergences"], a
    if policy:      # every response the clients checked went through QEMU's gate on the tap, agreed
        gate = json.loads((tmp_path / "refvm.tdm.analysis" / "gate.json").read_text())
        assert gate["released"] > 0 and gate["dropped"] == 0 and gate["qemu"]["released"] > 0, gate
        assert not [e for e in gate["events"] if e["kind"] == "dropped"], gate["events"]
    # the shadow's own recording: its DHCP answered from the native's, libvirt's dnsmasq's
    assert offered_then_acked(dhcp_to_guest(tmp_path / "refvm.tdm.analysis" / "kasan.tdm" / bundle.DEVLOG))
    assert names(uri, "--all") == {"refvm"} and virsh(uri, "dumpxml", "--inactive", "refvm") == original
    assert d.others() == [], "a QEMU left running"
    assert not Path(native["rundir"]).exists(), "the native's run directory (its sockets) left"
    m = bundle.load_manifest(tmp_path / "refvm.tdm")
    assert (m.machine.mode, m.machine.smp, len(m.machine.disks), m.machine.machine_type) == \
        ("device", 2, 2, machine), m.machine
    assert m.machine.net.backend == "libvirt" and m.machine.libvirt.command_line == "libvirt"
    assert_one_line_error(run_cli("replay", str(tmp_path / "refvm.tdm")), "recorded in device mode")
    shown = run_cli("inspect", str(tmp_path / "refvm.tdm")).stdout
    assert "recorded in device mode (2 vCPUs" in shown and "on libvirt's own command line" in shown, shown
    assert re.search(r"^disk0 .* [1-9]\d*$", shown, re.M), shown       # the guest's writes, from its channel
    virsh(uri, "undefine", "refvm")


@pytest.mark.timeout(2400)
def test_attach_records_a_domain_on_libvirts_default_network_exactly(clean_libvirtd, tmp_path):
    """The reference VM on q35, 2 vCPUs, two disks, its NIC on libvirt's `default` network,
    attached in exact mode with a lockdep shadow: recorded on libvirt's own command line
    with -icount rr=record, each disk behind blkreplay (libvirt's node names, the devices'
    drives overridden) and its rng on QEMU's generator; served, shut down by Ctrl-C, its
    definition back. Its replay repeats libvirt's command line (its own overlays, a tap of
    its own in a network namespace) and reproduces every device event."""
    d, uri = clean_libvirtd, clean_libvirtd.uri
    (tmp_path / "refvm.xml").write_text(domain_xml(tmp_path, machine="q35"))
    virsh(uri, "define", str(tmp_path / "refvm.xml"))
    original = virsh(uri, "dumpxml", "--inactive", "refvm")
    stderr = tmp_path / "attach.err"
    since = max((expiry for expiry, _ in leases(uri, MAC)), default="")
    proc = start_attach(uri, tmp_path, stderr, "--mode", "exact", "--analysis", "lockdep")
    said = lambda: stderr.read_text()[-3000:]     # noqa: E731
    try:
        _, via = nginx_at_its_lease(d, proc, since, said, 300)
        pid = int((d.dir / "run/libvirt/qemu/refvm.pid").read_text())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert any(a.startswith(b"shift=") and b"rr=record" in a for a in argv), argv
        assert sum(b'"driver":"blkreplay"' in a for a in argv) == 2, argv
        assert any(b'"driver":"virtio-blk-pci"' in a and b'"drive":"tandem-rr-ua-tandem-disk1"' in a for a in argv)
        assert any(b'"qom-type":"rng-builtin"' in a for a in argv), argv
        site = {f["path"]: f["sha256"] for f in artifacts.refvm()["site"] if f["path"] != "/4m.bin"}
        clients.fetch_files(80, site, via=via)
        proc.send_signal(signal.SIGINT)         # Ctrl-C: the power button, as virsh shutdown
        proc.wait(timeout=1800)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            virsh(uri, "destroy", "refvm", check=False)
    err = stderr.read_text()
    assert proc.returncode == 0, err[-3000:]
    (a,) = json.loads((tmp_path / "refvm.tdm.analysis" / "summary.json").read_text())["analyses"]
    assert a["outcome"] in ("poweroff", "finished") and a["delivered"] > 0 and not a["findings"], a
    assert names(uri, "--all") == {"refvm"} and virsh(uri, "dumpxml", "--inactive", "refvm") == original
    assert d.others() == [], "a QEMU left running"
    m = bundle.load_manifest(tmp_path / "refvm.tdm")
    own = m.machine.libvirt.own
    assert (m.machine.mode, m.machine.smp, len(m.machine.disks)) == (None, 2, 2), m.machine
    assert own is not None and own.argv[0] == artifacts.qemu()["binary"] and "-S" in own.argv, own
    assert not any("rr=record" in a for a in own.argv), own.argv
    r = run_cli("replay", str(tmp_path / "refvm.tdm"), timeout=1800)
    assert r.returncode == 0 and "VERIFIED" in r.stderr, r.stdout + r.stderr
    # under gdb: snapshots through the recording (savevm into the replay's blank qcow2,
    # not through a disk's blkreplay) and gdb's reverse steps on one of the 2 vCPUs
    with debug(tmp_path / "refvm.tdm", free_port(), spacing_s=10) as s:
        assert len(s.snapshots) >= 2 and s.snapshots[0].icount == 0, s.snapshots
        assert s.end[1] is not None
        s.seek(s.end[1] // 2)
        check_reverse_of_one_vcpu(gdb_reverse(s.port, steps=6))
        # each snapshot loaded and replayed on across its whole span: the frames that were
        # waiting in the NIC's queue when it was saved come back with it (qemu-patches/0040)
        for later in s.snapshots[1:]:
            s.seek(later.icount - 1)
    # stopped just after each frame given to the guest, the replay still runs to its end: a
    # frame that came before the guest's network was up waits in the NIC's queue, and a
    # stop there lost it, so the replay hung at the log's interrupt for it (qemu-patches/0040)
    with debug(tmp_path / "refvm.tdm", None, index=False) as s:
        given = sorted({e.icount for e in s.recording.events if e.kind == "net" and e.direction == "in"
                        and e.icount})
        assert len(given) > 10, given
        for n in given:
            if n + 1 > s.icount():
                s.run_to(n + 1)
        s.vm._monitor().command("cont")
        wait_until(lambda: s.vm._monitor().command("query-status")["status"] != "running", 300,
                   "the replay reaching the recorded end")
        assert s.vm._monitor().command("query-status")["status"] == "shutdown"
        assert s.icount() >= s.end[1] and "diverged" not in s.vm.log_tail()
    virsh(uri, "undefine", "refvm")


def test_attach_refuses_what_a_recording_cannot_see_or_replay(clean_libvirtd, tmp_path):
    """Each before anything starts, as a one-line error naming what to change: device
    passthrough and a vhost-user NIC in any mode; a local-time RTC and the guest agent's
    channel in exact mode; --forward on a libvirt network; no ACPI, or a graphical console,
    on libvirt's own command line."""
    uri = clean_libvirtd.uri
    vhost_user = """<interface type='vhostuser'><mac address='52:54:00:7a:6e:32'/>
      <source type='unix' path='/tmp/tandem-no-vhost.sock' mode='client'/><model type='virtio'/></interface>"""
    hostdev = """
    <hostdev mode='subsystem' type='pci' managed='no'>
      <source><address domain='0x0000' bus='0x00' slot='0x1f' function='0x0'/></source></hostdev>"""
    variants = {
        "vhostuser": (domain_xml(tmp_path, "vhostuser", nic=vhost_user), ["--mode", "device"], "a NIC of type 'vhostuser'"),
        "hostdev": (domain_xml(tmp_path, "hostdev", extra=hostdev), ["--mode", "device"], "a host device passed through"),
        "localtime": (domain_xml(tmp_path, "localtime", clock="localtime").replace("<vcpu placement='static'>2", "<vcpu placement='static'>1"),
                      [], "<clock offset='localtime'>"),
        "agent": (domain_xml(tmp_path, "agent", extra="""
    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>"""),
                  ["--mode", "exact"], "<channel type='unix'> (org.qemu.guest_agent.0): an exact recording records"),
        "forward": (domain_xml(tmp_path, "forward"), ["--mode", "device", "--forward", "tcp:18080:80"],
                    "--forward is for a NIC on user networking"),
        "noacpi": (domain_xml(tmp_path, "noacpi", features="<apic/>"), ["--mode", "device"], "no <features><acpi/>"),
        # what virt-install adds with a graphical console; its <graphics>, <video> and <sound>
        # libvirt would not even define with tandem's QEMU as the emulator (a user's is
        # Debian's): tests/unit/test_libvirt_native.py reads those
        "tablet": (domain_xml(tmp_path, "tablet", extra="""
    <input type='tablet' bus='usb'/>"""), ["--mode", "device"], "<input type='tablet' bus='usb'>: a graphical console"),
    }
    try:
        for name, (text, _, _) in variants.items():
            (tmp_path / f"{name}.xml").write_text(text)
            virsh(uri, "define", str(tmp_path / f"{name}.xml"))
        for name, (_, args, said) in variants.items():
            assert_one_line_error(run_cli("attach", name, "--analysis", "kasan", "--uri", uri,
                                          "--bundle", str(tmp_path / f"{name}.tdm"), *args), said)
            assert not (tmp_path / f"{name}.tdm").exists(), name
        assert names(uri, "--all") == set(variants)
    finally:
        for n in variants:
            virsh(uri, "undefine", n, check=False)
