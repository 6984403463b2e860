"""The device log takes every disk and NIC it is given: a guest with two disks
and two NICs, recorded through tandem's own command line (qemu/argv.py: both disks on
their overlays behind blkreplay, the device log's `drives`), gets one pcapng interface
per drive and per NIC, named by its id, and replays exactly."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from tandem.cli.inspect_bundle import inspect
from tandem.exact.verify import final_state, first_mismatch
from tandem.formats import bundle, pcapng
from tandem.machine import RR, Disk, Guest, Nic, Run, UserNet
from tandem.qemu.argv import overlay_path
from tandem.qemu.vm import VM, free_port
from tandem.qemu.image import make_overlay
from tandem.record.workload import KV

DATA_MIB = 4
# The second NIC, as qemu_argv makes it: its own slirp network (10.0.3.0/24), its frames
# recorded (filter-replay) and logged (filter-devlog) like the first NIC's.
SECOND_NIC = Nic(netdev="net1", mac="52:54:00:12:34:57")


def _run(guest: Guest, d: Path, rr: RR, port: int | None = None) -> Run:
    """A run of `guest` in directory d, a fresh overlay over each disk's base."""
    d.mkdir()
    overlay = d / "disk-overlay.qcow2"
    for disk in guest.disks:
        make_overlay(disk.base, overlay_path(overlay, disk.id), disk.format)
    return Run(d, net=UserNet(port), rr=rr, devlog=d / bundle.DEVLOG, overlay=overlay)


def _guest_runs(vm: VM, cmd: str) -> None:
    """CMD run by the guest agent (`run`), which says its status when CMD ends."""
    start = len(vm.serial.output())
    vm.serial.type(f"run {cmd}")
    vm.serial.wait_for(b"tandem-agent: run status 0", 120, start)


def test_two_disks_and_two_nics_each_their_own_interface(built, tmp_path):
    base = Guest.default()
    data = tmp_path / "data.raw"
    data.write_bytes(bytes(DATA_MIB << 20))
    guest = dataclasses.replace(base, disks=(*base.disks, Disk(str(data), id="disk1")),
                                nics=(*base.nics, SECOND_NIC))
    port = free_port()
    rec = _run(guest, tmp_path / "rec", RR("record", tmp_path / "rec.tdrs"), port)
    with VM(guest, rec) as vm:
        vm.serial.wait_for(b"TANDEM-READY", 120)
        with KV(port) as kv:                    # kvd writes its data disk, /dev/vda
            assert kv.request("SET both-disks 1") == "OK"
            assert kv.request("SYNC") == "OK"
        _guest_runs(vm, "dd if=/dev/urandom of=/dev/vdb bs=4096 count=8 conv=fsync")
        _guest_runs(vm, "ifconfig eth1 10.0.3.15 netmask 255.255.255.0 up && ping -c 2 -W 5 10.0.3.2")
        vm.serial.type("poweroff")
        vm.wait(120)
    assert data.read_bytes() == bytes(DATA_MIB << 20)       # the base image is never written

    log = pcapng.read_devlog(rec.devlog)
    assert sorted((i.name, i.kind) for i in log.interfaces) == [
        ("disk0", "block"), ("disk1", "block"), ("net0", "net"), ("net1", "net"), ("rng0", "rng"),
        ("serial0", "serial")]
    for disk in ("disk0", "disk1"):
        writes = [pcapng.block_record(e.data) for e in log.events if e.channel == disk]
        assert any(op == 1 for op, *_ in writes), f"no write on {disk}"
    net1 = {e.direction for e in log.events if e.channel == "net1"}
    assert net1 == {"in", "out"}            # ARP and ping to slirp's gateway, both ways
    channels = inspect(rec.rundir)["channels"]          # `tandem inspect`'s table
    assert {name: c["kind"] for name, c in channels.items()} == {
        "serial0": "serial", "disk0": "block", "disk1": "block", "rng0": "rng", "net0": "net", "net1": "net"}
    assert channels["disk1"]["out"]["events"] >= 2 and channels["net1"]["in"]["events"] >= 1

    rep = _run(guest, tmp_path / "rep", RR("replay", tmp_path / "rec.tdrs"))
    with VM(guest, rep) as vm:
        vm.wait(300)
    replayed = pcapng.read_devlog(rep.devlog)
    assert first_mismatch(log, replayed) is None
    assert final_state(replayed) == final_state(log)
