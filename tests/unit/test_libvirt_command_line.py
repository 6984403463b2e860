"""libvirt/command_line.py: libvirt's own command line of a domain recorded exactly, read
when it starts and repeated by its replay, every option checked (a bundle is hostile
input). The command line is libvirt 9.0's for the reference VM as
tests/test_attach_libvirt_network.py defines it (q35, 2 vCPUs, two disks on their
overlays, `default`), recorded exactly (libvirt/recorded.py), as `virsh domxml-to-native`
printed it; paths shortened."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tandem.errors import BundleError, InfraError
from tandem.libvirt.command_line import (
    _keyval,
    device_drives,
    native_argv,
    recorded_line,
    replay_argv,
)
from tandem.machine import OwnLine

ARGV = json.loads((Path(__file__).parent / "data" / "libvirt-9.0-q35-exact-argv.json").read_text())
QMP = ARGV.index("socket,id=qmp,path=/run/R/qmp.sock,server=on,wait=off") - 1
ADDED = ARGV[QMP:-2]            # tandem's <qemu:commandline>; libvirt's -msg comes after it
OVERLAYS = [Path("/vm/ov.qcow2"), Path("/vm/ov-disk1.qcow2")]
DRIVES = ("ua-tandem-disk0/virtio-backend", "ua-tandem-disk1/virtio-backend")
BASES = ["/vm/refvm.qcow2", "/vm/refvm-data.raw"]


def own() -> OwnLine:
    return recorded_line(ARGV, ADDED, ("libvirt-3-format", "libvirt-1-format"), OVERLAYS, drives=DRIVES,
                         netdevs=("hostnet0",), serial="charua-tandem-serial0", rng="objua-tandem-rng0")


def replayed(line: OwnLine | None = None, **kw) -> list[str]:
    args = dict(binary="/q/qemu", overlays=[Path("/R/ov.qcow2"), Path("/R/ov-disk1.qcow2")], disks=BASES,
                kernel=None, initrd=None, taps=[9], where="B.tdm")
    return replay_argv(line or own(), **{**args, **kw})


def options(argv: list[str]) -> list[tuple[str, str]]:
    return [(argv[i], argv[i + 1]) for i in range(1, len(argv) - 1) if argv[i].startswith("-")
            and not argv[i + 1].startswith("-")]


def test_the_recorded_line_is_libvirts_without_tandems_options():
    line = own()
    assert line.argv is not None and list(line.argv) == ARGV[:QMP] + ARGV[-2:]
    assert line.argv[-2:] == ("-msg", "timestamp=on")
    assert line.overlays == tuple(map(str, OVERLAYS)) and line.images == ("libvirt-3-format", "libvirt-1-format")


def test_a_node_libvirt_numbered_otherwise_is_refused_naming_the_disk():
    with pytest.raises(InfraError, match=r"disk 1: the node 'libvirt-2-format' .* not its overlay /vm/ov-disk1.qcow2"):
        recorded_line(ARGV, ADDED, ("libvirt-3-format", "libvirt-2-format"), OVERLAYS, drives=DRIVES,
                      netdevs=("hostnet0",), serial=None, rng=None)
    with pytest.raises(InfraError, match="does not hold tandem's recording"):
        recorded_line(ARGV, ADDED + ["-x"], ("libvirt-3-format",), OVERLAYS[:1], drives=DRIVES,
                      netdevs=(), serial=None, rng=None)


def test_the_replay_repeats_libvirts_machine_on_its_own_overlays_tap_and_null_chardevs():
    out = replayed()
    opts = options(out)
    assert out[0] == "/q/qemu"
    assert "-S" not in out and "-no-shutdown" not in out and "-mon" not in out
    # every device at its place, as libvirt gave it
    assert [v for o, v in opts if o == "-device"] == [v for o, v in options(ARGV[:QMP]) if o == "-device"]
    blocks = [json.loads(v) for o, v in opts if o == "-blockdev"]
    files = {b["filename"]: b for b in blocks if b["driver"] == "file"}
    assert set(files) == {"/R/ov.qcow2", "/R/ov-disk1.qcow2", *BASES}
    assert all(files[b]["read-only"] is True and "auto-read-only" not in files[b] for b in BASES)
    assert [json.loads(v) for o, v in opts if o == "-netdev"] == [{"type": "tap", "id": "hostnet0", "fd": "9",
                                                                  "vhost": False}]
    assert [v for o, v in opts if o == "-chardev"] == ["null,id=charmonitor", "null,id=charua-tandem-serial0"]
    assert not any("secret" in v or "/var/lib/libvirt" in v for _, v in opts)
    assert ("-machine", "pc-q35-10.0,usb=off,dump-guest-core=off,memory-backend=pc.ram") in opts


def test_the_environment_of_virsh_domxml_to_native_is_left_out():
    text = "LC_ALL=C \\\nPATH=/bin \\\nHOME=/var/lib/x \\\n/q/bin/qemu-system-x86_64 \\\n-name 'guest=a b' \\\n-S\n"
    assert native_argv(text) == ["/q/bin/qemu-system-x86_64", "-name", "guest=a b", "-S"]


def test_the_disks_drives_are_read_from_their_devices():
    assert device_drives(ARGV, ["ua-tandem-disk0", "ua-tandem-disk1"]) == (
        "tandem-rr-ua-tandem-disk0", "tandem-rr-ua-tandem-disk1")
    with pytest.raises(InfraError, match="no disk device 'vdz'"):
        device_drives(ARGV, ["vdz"])


def test_keyval_as_qemu_reads_it():
    assert _keyval("socket,id=a,,b,server", "backend") == {"backend": "socket", "id": "a,b", "server": "on"}


def with_option(opt: str, value: str | None = None) -> OwnLine:
    line = own()
    extra = [opt] if value is None else [opt, value]
    return OwnLine(**{**line.to_json(), "argv": [*ARGV[:QMP], *extra]})


HOSTILE = [
    ("-device", '{"driver":"loader","file":"/etc/shadow"}', "loader"),
    ("-device", '{"driver":"virtio-net-pci","romfile":"/etc/shadow"}', "romfile"),
    ("-object", '{"qom-type":"memory-backend-file","id":"m","mem-path":"/etc"}', "memory-backend-file"),
    ("-object", '{"qom-type":"rng-random","id":"r","filename":"/dev/urandom"}', "rng-random"),
    ("-object", '{"qom-type":"memory-backend-ram","id":"m","size":1,"mem-path":"/x"}', "mem-path"),
    ("-blockdev", '{"driver":"file","filename":"/etc/passwd","node-name":"x"}', "/etc/passwd"),
    ("-blockdev", '{"driver":"nbd","server":{"type":"inet","host":"h"},"node-name":"x"}', "nbd"),
    ("-netdev", '{"type":"user","id":"n"}', '"user"'),
    ("-netdev", '{"type":"tap","id":"n","script":"/bin/sh"}', "script"),
    ("-chardev", "file,path=/etc/x", "-chardev"),
    ("-machine", "pc,dumpdtb=/tmp/x", "dumpdtb"),
    ("-global", "virtio-net-pci.romfile=/etc/x", "romfile"),
    ("-accel", "kvm", "kvm"),
    ("-kernel", "/boot/vmlinuz", "not the manifest's"),
    ("-plugin", "/tmp/x.so", "-plugin"),
    ("-display", "vnc=:0", "vnc"),
    ("-audiodev", '{"id":"a","driver":"wav","path":"/tmp/x"}', "wav"),
    ("-boot", "splash=/etc/x", "splash"),
    ("-incoming", "tcp:0:4444", "-incoming"),
    ("-name", None, "its value is missing"),
    ("--", None, "--"),
]


@pytest.mark.parametrize("opt,value,named", HOSTILE, ids=[f"{o} {v}"[:40] for o, v, _ in HOSTILE])
def test_an_option_a_replay_does_not_repeat_is_a_one_line_error_naming_it(opt, value, named):
    with pytest.raises(BundleError) as e:
        replayed(with_option(opt, value))
    msg = str(e.value)
    assert msg.startswith("B.tdm: machine.libvirt.own") and named in msg and "\n" not in msg, msg


def test_a_netdev_beyond_the_recordings_nics_is_refused():
    line = own()
    argv = [*ARGV[:QMP], "-netdev", '{"type":"tap","fd":"26","id":"hostnet1"}']
    with pytest.raises(BundleError, match="more netdevs than the recording's NICs"):
        replayed(OwnLine(**{**line.to_json(), "argv": argv}))


def test_the_disks_and_overlays_must_match_the_manifests():
    with pytest.raises(BundleError, match="/vm/refvm-data.raw .neither a recorded disk nor its overlay"):
        replayed(disks=BASES[:1])


VALUES = st.one_of(st.sampled_from(["{", "{}", "[1]", '{"driver":1}', '{"driver":"file"}', '{"driver":"file",'
                                     '"filename":7}', '{"type":"tap","id":[]}', '{"qom-type":"secret"}', "id=",
                                     ",,", "=", "", "none", "tcg,", '{"driver":"none","id":{}}', "a\nb"]),
                   st.text(max_size=12))


@settings(max_examples=500, deadline=None)
@example([("-device", "{"), ("-blockdev", '{"driver":"file","filename":7}')])
@example([("-netdev", '{"type":"tap","id":[]}')])
@given(st.lists(st.tuples(st.sampled_from(["-device", "-object", "-blockdev", "-netdev", "-chardev", "-machine",
                                           "-global", "-m", "-S", "-mon", "-accel", "-audiodev", "-display", "-rtc",
                                           "-boot", "-kernel", "-x"]), VALUES), max_size=8))
def test_any_recorded_line_is_repeated_or_refused_in_one_line(pairs):
    line = OwnLine(**{**own().to_json(), "argv": ["/q/qemu", *[w for p in pairs for w in p]]})
    try:
        replayed(line)
    except BundleError as e:
        assert str(e).startswith("B.tdm: ") and "\n" not in str(e), str(e)
