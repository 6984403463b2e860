"""The parts of recording any guest that need no VM: a guest from its disks
and back from a manifest, the forwards the guest refuses seen in its frames, the ARP,
DHCP and DNS `tandem inspect` shows, and disk images told apart by qemu-img."""
from __future__ import annotations

import struct
import subprocess

import pytest
from hypothesis import given, settings, strategies as st

from tandem import artifacts
from tandem.errors import BundleError, TandemError
from tandem.formats import netpkt
from tandem.formats.pcapng import Event
from tandem.formats.wire import WireSummary
from tandem.machine import Forward, Guest, OptionError
from tandem.qemu.image import check_bootable, probe_disk
from tandem.record.forwards import RefusedForwards

GUEST_MAC, HOST_MAC = b"\x52\x54\x00\x12\x34\x56", b"\x52\x55\x0a\x00\x02\x02"
GUEST_IP, HOST_IP = bytes([10, 0, 2, 15]), bytes([10, 0, 2, 2])


def manifest_of(guest: Guest) -> dict:
    inputs = {("disk_base" if d.id == "disk0" else f"disk_base.{d.id}"): {"path": d.base, "size": 1, "sha256": "0" * 64}
              for d in guest.disks}
    if guest.kernel:
        inputs["kernel"] = {"path": guest.kernel, "size": 1, "sha256": "0" * 64}
    return {"inputs": inputs, "machine": guest.machine_section()}


def test_a_user_guest_round_trips_through_its_manifest():
    g = Guest.of_disks([("/vm/root.qcow2", "qcow2"), ("/vm/data.img", "raw")], memory_mb=2048,
                       nic_models=("virtio-net-pci", "e1000"))
    assert g.boot == "firmware" and g.kernel is None and g.cmdline == ""
    assert [d.id for d in g.disks] == ["disk0", "disk1"] and [n.netdev for n in g.nics] == ["net0", "net1"]
    assert Guest.from_manifest(manifest_of(g)) == g
    direct = Guest.of_disks([("/vm/root.qcow2", "qcow2")], kernel="/boot/vmlinuz", append="root=/dev/vda1 ro")
    assert direct.cmdline == "console=ttyS0 root=/dev/vda1 ro" and direct.boot == "direct"
    assert Guest.from_manifest(manifest_of(direct)) == direct
    assert Guest.of_disks([("/d", "raw")], kernel="/k", append="console=hvc0").cmdline == "console=hvc0"


def test_a_manifest_before_issue_23_reads_as_one_disk_one_nic():
    old = {"inputs": {"kernel": {"path": "/k"}, "disk_base": {"path": "/d.img"}},
           "machine": {"memory_mb": 256, "cmdline": "console=ttyS0", "disk_format": "qcow2",
                       "mac": "52:54:00:12:34:56", "nic_model": "e1000"}}
    g = Guest.from_manifest(old)
    assert [(d.id, d.base, d.format) for d in g.disks] == [("disk0", "/d.img", "qcow2")]
    assert [(n.netdev, n.model, n.mac) for n in g.nics] == [("net0", "e1000", "52:54:00:12:34:56")]


def test_a_manifest_naming_a_disk_without_its_base_is_refused():
    g = Guest.of_disks([("/a", "raw"), ("/b", "raw")])
    m = manifest_of(g)
    del m["inputs"]["disk_base.disk1"]
    with pytest.raises(BundleError, match="inputs.disk_base.disk1: missing"):
        Guest.from_manifest(m)
    m = manifest_of(Guest.of_disks([("/a", "raw")], kernel="/k"))
    del m["inputs"]["kernel"]
    with pytest.raises(BundleError, match="inputs.kernel: missing"):
        Guest.from_manifest(m)


def test_append_needs_a_kernel():
    with pytest.raises(OptionError, match="--append without --kernel-image"):
        Guest.of_disks([("/a", "raw")], append="root=/dev/vda")


# --- forwards the guest refuses -----------------------------------------------------------

def tcp_event(direction: str, sport: int, dport: int, flags: int, vm_ns: int = 1) -> Event:
    src, dst = (HOST_IP, GUEST_IP) if direction == "in" else (GUEST_IP, HOST_IP)
    frame = netpkt.tcp(HOST_MAC, GUEST_MAC, src, dst, sport, dport, 1, 0, flags, 65535)
    return Event(0, 0, "net0", "net", direction, vm_ns, None, frame, 0)


def udp_unreachable(port: int) -> Event:
    inner = netpkt.udp(HOST_MAC, GUEST_MAC, HOST_IP, GUEST_IP, 40000, port, b"q")[14:]
    icmp = bytes([3, 3, 0, 0, 0, 0, 0, 0]) + inner[:28]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(icmp), 0, 0, 64, 1, 0, GUEST_IP, HOST_IP)
    return Event(0, 0, "net0", "net", "out", 5, None, GUEST_MAC + HOST_MAC + b"\x08\x00" + ip + icmp, 0)


def test_a_syn_answered_by_rst_is_a_refused_forward_once():
    w = RefusedForwards((Forward("tcp", 8080, 80), Forward("tcp", 6380, 6379)))
    assert w.see(tcp_event("in", 40000, 80, 0x02)) is None
    refused = w.see(tcp_event("out", 80, 40000, 0x14, vm_ns=7))
    assert refused == (Forward("tcp", 8080, 80), 7)
    assert w.see(tcp_event("in", 40001, 80, 0x02)) is None
    assert w.see(tcp_event("out", 80, 40001, 0x14)) is None        # said once
    assert w.see(tcp_event("in", 40002, 6379, 0x02)) is None
    assert w.see(tcp_event("out", 6379, 40002, 0x12)) is None      # SYN-ACK: it listens
    assert w.done()


def test_a_rst_without_a_syn_before_it_is_no_refusal():
    w = RefusedForwards((Forward("tcp", 8080, 80),))
    assert w.see(tcp_event("out", 80, 40000, 0x14)) is None and not w.done()


def test_icmp_port_unreachable_is_a_refused_udp_forward():
    w = RefusedForwards((Forward("udp", 5353, 53),))
    assert w.see(udp_unreachable(54)) is None
    assert w.see(udp_unreachable(53)) == (Forward("udp", 5353, 53), 5)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(["in", "out"]))
def test_refused_forwards_take_any_frame(frame, direction):
    w = RefusedForwards((Forward("tcp", 1, 80), Forward("udp", 2, 53)))
    w.see(Event(0, 0, "net0", "net", direction, 1, None, b"\x00" * 12 + b"\x08\x00" + frame, 0))


# --- the guest's ARP, DHCP and DNS -------------------------------------------------------

def dhcp(kind: int, yiaddr: bytes = bytes(4)) -> bytes:
    msg = bytes([2 if kind in (2, 5) else 1, 1, 6, 0]) + bytes(12) + yiaddr + bytes(216) + b"\x63\x82\x53\x63"
    msg += bytes([53, 1, kind, 255])
    sport, dport = (67, 68) if kind in (2, 5) else (68, 67)
    return netpkt.udp(HOST_MAC, GUEST_MAC, HOST_IP, GUEST_IP, sport, dport, msg)


def dns_query(name: str, qtype: int = 1) -> bytes:
    q = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00" + struct.pack("!HH", qtype, 1)
    return netpkt.udp(GUEST_MAC, HOST_MAC, GUEST_IP, bytes([10, 0, 2, 3]), 33333, 53,
                      struct.pack("!HHHHHH", 7, 0x100, 1, 0, 0, 0) + q)


def test_wire_summary_counts_dhcp_arp_dns():
    w = WireSummary()
    for frame in (dhcp(1), dhcp(2, bytes([10, 0, 2, 15])), dhcp(3), dhcp(5, bytes([10, 0, 2, 15])),
                  netpkt.arp_reply(HOST_MAC, HOST_IP, GUEST_MAC, GUEST_IP),
                  dns_query("deb.debian.org"), dns_query("deb.debian.org", 28), dns_query("deb.debian.org")):
        w.see(frame)
    d = w.as_dict()
    assert d["dhcp"] == {"DISCOVER": 1, "OFFER": 1, "REQUEST": 1, "ACK": 1} and d["leased"] == ["10.0.2.15"]
    assert d["arp"] == {"reply": 1} and d["dns"] == {"query": 3}
    assert d["names"] == ["deb.debian.org A", "deb.debian.org AAAA"]


def test_a_dns_name_is_shown_printable():
    w = WireSummary()
    w.see(dns_query("a\x1b[2Jb.example"))
    assert w.names == ["a\\027[2Jb.example A"]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.sampled_from([53, 67, 68]))
def test_wire_summary_takes_any_udp_payload(payload, port):
    w = WireSummary()
    w.see(netpkt.udp(GUEST_MAC, HOST_MAC, GUEST_IP, HOST_IP, 68 if port == 67 else 33333, port, payload))
    assert all(n.isprintable() for n in w.names)


# --- disk images -------------------------------------------------------------------------

def qemu_img(*args: str) -> None:
    subprocess.run([artifacts.qemu()["img"], *args], check=True, capture_output=True)


def test_disk_images_told_apart(tmp_path):
    (tmp_path / "text").write_text("not a disk\n")
    with pytest.raises(TandemError, match="text: 11 bytes, not a whole number of 512-byte sectors"):
        probe_disk(str(tmp_path / "text"))
    with pytest.raises(TandemError, match="nope: not found"):
        probe_disk(str(tmp_path / "nope"))
    with pytest.raises(TandemError, match="not a file"):
        probe_disk(str(tmp_path))
    qemu_img("create", "-q", "-f", "qcow2", str(tmp_path / "a.qcow2"), "1M")
    qemu_img("create", "-q", "-f", "qcow2", "-b", str(tmp_path / "a.qcow2"), "-F", "qcow2", str(tmp_path / "b.qcow2"))
    qemu_img("create", "-q", "-f", "vmdk", str(tmp_path / "c.vmdk"), "1M")
    image = probe_disk(str(tmp_path / "a.qcow2"))
    assert (image.format, image.virtual_size) == ("qcow2", 1 << 20)
    with pytest.raises(TandemError, match="over a backing file"):
        probe_disk(str(tmp_path / "b.qcow2"))
    with pytest.raises(TandemError, match="a vmdk image; tandem takes raw or qcow2"):
        probe_disk(str(tmp_path / "c.vmdk"))
    with pytest.raises(TandemError, match="no boot sector"):
        check_bootable(image)
    raw = tmp_path / "mbr.img"
    raw.write_bytes(bytes(510) + b"\x55\xaa" + bytes(512))
    check_bootable(probe_disk(str(raw)))


# --- base image hashes, kept per file version ---------------------------------------------

def test_an_input_hash_is_kept_per_file_version(tmp_path, monkeypatch):
    """A big base image is hashed once per version: the cached digest is used while the
    file is unchanged (shown by planting one), and a write makes a new version."""
    import hashlib as h
    import os
    from tandem.formats import bundle
    monkeypatch.setenv("TANDEM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(bundle, "HASH_CACHE_MIN", 1)
    disk = tmp_path / "disk.img"
    disk.write_bytes(b"a" * 4096)
    first = bundle.input_entry(disk)
    assert first.sha256 == h.sha256(b"a" * 4096).hexdigest()
    (known,) = (tmp_path / "cache" / "hashes").iterdir()
    known.write_text("f" * 64)
    assert bundle.input_entry(disk).sha256 == "f" * 64          # from the cache
    with open(disk, "r+b") as f:
        f.write(b"b")
    os.utime(disk, ns=(os.stat(disk).st_atime_ns, os.stat(known).st_mtime_ns))   # mtime set back: ctime moves
    assert bundle.input_entry(disk).sha256 == h.sha256(b"b" + b"a" * 4095).hexdigest()
