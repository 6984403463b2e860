"""Sanitizer analyses of an ordinary guest (issue 24): the reference VM (Debian 12 from its
own disk: GRUB, systemd, networkd's DHCP, nginx, redis) recorded under Debian's clients,
then replayed semantically into an analysis kernel booting the same disk directly: its
DHCP answered from the recording, its services compared under the HTTP and RESP rules,
zero divergences and zero findings on a clean run."""
from __future__ import annotations

import shutil

import pytest
from helpers import start_client, wait_until
from tandem import artifacts
from tandem.formats import netpkt, pcapng
from tandem.machine import Forward, Guest
from tandem.qemu.vm import free_port
from tandem.record import clients
from tandem.record.recording import Recording
from tandem.semantic import exchanges
from tandem.semantic.analyze import analyze


@pytest.fixture(scope="module")
def refvm_recording(built, tmp_path_factory):
    """The reference VM from power-on under curl (every site file), ab and redis-benchmark
    at once, powered off by its ACPI button."""
    ref = artifacts.refvm()
    tmp = tmp_path_factory.mktemp("refvm-an")
    base = tmp / "refvm.qcow2"
    shutil.copyfile(ref["disk"], base)
    http, redis = free_port(), free_port()
    tdm = tmp / "web.tdm"
    with Recording(tdm, Guest.of_disks([(str(base), "qcow2")]),
                   forwards=(Forward("tcp", http, 80), Forward("tcp", redis, 6379))) as rec:
        wait_until(lambda: rec.running() and clients.http_up(http), 600, "nginx on the reference VM", poll=1.0)
        wait_until(lambda: rec.running() and clients.redis_up(redis), 120, "redis on the reference VM", poll=1.0)
        clients.fetch_files(http, {f["path"]: f["sha256"] for f in ref["site"]})
        loads = [start_client(lambda: clients.ab(http, requests=50), "ab"),
                 start_client(lambda: clients.redis_benchmark(redis, requests=200), "redis-benchmark")]
        for t in loads:
            t.join(600)
        rec.powerdown()
        rec.wait(timeout=300)
    return tdm


def dhcp_to_guest(devlog) -> list[int]:
    """The DHCP message types the analysis guest received, in order."""
    out = []
    for e in pcapng.read_devlog(devlog).events:
        f = netpkt.parse(e.data) if e.kind == "net" and e.direction == "in" else None
        if f is not None and f.proto == netpkt.PROTO_UDP and (f.sport, f.dport) == (67, 68):
            out.append(exchanges.dhcp_type(f.payload))
    return out


def test_the_reference_vm_analysed_on_its_own_disk_is_clean(refvm_recording, tmp_path):
    s = analyze(refvm_recording, ["native"], noise=False, workdir=tmp_path, record=False)
    (r,) = s.results
    # Its power button is no input of the feed: the run ends when every input is delivered.
    assert r.run.outcome in ("poweroff", "finished"), (r.run.outcome, r.run.detail, r.run.qemu_log[-2000:])
    assert r.complete and not r.findings, (r.failure, [f.title for f in r.findings])
    assert not r.divergences, [d.diff for d in r.divergences][:5]
    # Its DHCP was answered from the recording: an OFFER and an ACK reached it.
    assert dhcp_to_guest(tmp_path / "native.pcapng")[:2] == [2, 5], r.run.limits
    assert not [x for x in r.run.limits if "no answer in the recording" in x and "DHCP" in x], r.run.limits
    assert s.exit_status() == 0
