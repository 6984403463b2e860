"""QEMU's command line for every mode, pinned (issue 20: golden argv before the machine
description moves), and built so that no value can add a key (issue 19).

tests/unit/data/qemu-argv.json is today's argv per mode, byte for byte; a deliberate
change regenerates it (`PYTHONPATH=replay python tests/unit/test_qemu_argv.py > tests/unit/data/qemu-argv.json`)
and says why in its commit. qemu-argv-keyval-62870f3.json is the argv as it was at
62870f3, in QEMU's key=value forms: the move to JSON -device/-object/-netdev changed how
the options are written, not what they say, which test_same_options_as_before checks
option by option with QEMU's own parsing rules.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from tandem import machine
from tandem.errors import TandemError
from tandem.machine import Disk, Forward, Nic, OptionError, json_option, keyval_option
from tandem.machine import RR, Feed, Gate, Guest, Host, Run, UserNet
from tandem.qemu.argv import qemu_argv

DATA = Path(__file__).parent / "data"
Q = {"binary": "/opt/qemu/bin/qemu-system-x86_64", "firmware_dir": "/opt/qemu/share"}
G = Guest(kernel="/k/bzImage", initrd="/k/initrd.cpio.gz", disks=(Disk("/k/disk.raw"),))
R = Path("/run/t")
H = Host(qemu=Q)


def cases(rundir: Path = R) -> dict[str, tuple[Guest, Run]]:
    """One (guest, run) per mode and per option a mode can add."""
    r = rundir
    return {
        "plain": (G, Run(r, net=UserNet(5555), overlay=r / "o.qcow2", host=H)),
        "plain-noicount": (G, Run(r, overlay=r / "o.qcow2", icount=False, host=H)),
        "record": (G, Run(r, net=UserNet(5555), rr=RR("record", r / "b/replay.tdrs"), devlog=r / "b/devices.pcapng",
                          overlay=r / "b/o.qcow2", stop_after_ns=3_000_000_000, host=H)),
        "record-gate": (Guest(kernel="/k/bzImage", initrd=None, nics=(Nic(mac="52:54:00:12:34:56"),)),
                        Run(r, net=UserNet(5555), rr=RR("record", r / "r"), devlog=r / "d",
                            gate=Gate(r / "gate.sock", outputs=False), host=H)),
        "device": (dataclasses.replace(G, vcpus=2), Run(r, net=UserNet(5555), devlog=r / "b/devices.pcapng",
                                                         overlay=r / "b/o.qcow2", icount=False,
                                                         stop_after_ns=3_000_000_000, host=H)),
        "device-kvm-gate": (Guest(kernel="/k/bzImage", initrd=None, vcpus=4, accel="kvm"),
                            Run(r, net=UserNet(5555), devlog=r / "d", gate=Gate(r / "gate.sock"), host=H)),
        "replay": (G, Run(r, rr=RR("replay", r / "r", follow=True, partial=True), devlog=r / "d",
                          overlay=r / "o.qcow2", stop_after_ns=5, host=H, extra=("-plugin", "x.so"))),
        "replay-stock": (G, Run(r, rr=RR("replay", r / "r"), devlog=r / "d", overlay=r / "o.qcow2",
                                host=Host(qemu={**Q, "stock": True}))),
        "analysis": (G, Run(r, net=Feed(r / "feed.sock", lookahead_ns=1000, rtc_base="2026-01-01T00:00:00"),
                            overlay=r / "o.qcow2", host=H)),
        "analysis-record": (G, Run(r, net=Feed(r / "feed.sock", lookahead_ns=0), overlay=r / "o.qcow2",
                                   rr=RR("record", r / "r"), devlog=r / "d", host=H)),
        "analysis-replay": (G, Run(r, net=Feed(None, lookahead_ns=0), overlay=r / "o.qcow2",
                                   rr=RR("replay", r / "r"), devlog=r / "d", host=H)),
    }


def argvs(rundir: Path = R) -> dict[str, list[str]]:
    return {name: qemu_argv(g, r) for name, (g, r) in cases(rundir).items()}


# --- QEMU's parsing rules, to read an argv back -------------------------------------------

def parse_keyval(text: str) -> dict[str, str]:
    """QEMU's qemu_opts_parse, as util/qemu-option.c reads an option: the first element is
    the implied one (driver, backend, type) when '=' does not come before the first ','
    or the end; a doubled comma is a comma inside a value."""
    out, i, first = {}, 0, True
    while i <= len(text):
        j = i
        while j < len(text) and text[j] not in "=,":
            j += 1
        if first and (j == len(text) or text[j] == ","):
            name = ""
            j = i
        elif j < len(text) and text[j] == "=":
            name, j = text[i:j], j + 1
        else:
            out[text[i:j]] = "on"        # a flag
            i = j + 1
            first = False
            continue
        value = []
        while j < len(text):
            if text[j] == ",":
                if text[j + 1:j + 2] == ",":
                    value.append(",")
                    j += 2
                    continue
                break
            value.append(text[j])
            j += 1
        out[name] = "".join(value)
        i, first = j + 1, False
    return out


HEAD_KEY = {"-device": "driver", "-object": "qom-type", "-netdev": "type"}


def option_dict(opt: str, value: str) -> dict[str, str]:
    """One option's keys and values as QEMU reads them, written either way; JSON values as
    the key=value text QEMU would accept for them."""
    if value.startswith("{"):
        out = {}
        for k, v in json.loads(value).items():
            if k == "hostfwd":                  # NetdevUserOptions: ['String']
                v = ",".join(x["str"] for x in v)
            if k == "drives":                   # DevlogProperties: ['str'], keyval drives.N=
                out.update({f"{k}.{i}": str(x) for i, x in enumerate(v)})
                continue
            out[k] = ("on" if v else "off") if isinstance(v, bool) else str(v)
        return out
    out = parse_keyval(value)
    if "" in out and opt in HEAD_KEY:
        out[HEAD_KEY[opt]] = out.pop("")
    return out


def options(argv: list[str]) -> list[tuple[str, dict[str, str] | str | None]]:
    out, i = [], 1
    while i < len(argv):
        opt = argv[i]
        if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            val = argv[i + 1]
            out.append((opt, option_dict(opt, val) if opt in ("-device", "-object", "-netdev", "-chardev",
                                                               "-icount", "-drive", "-rtc", "-mon") else val))
            i += 2
        else:
            out.append((opt, None))
            i += 1
    return out


# --- the tests ------------------------------------------------------------------------------

def test_golden_argv():
    """Every mode's argv byte for byte as pinned (a change must be deliberate)."""
    assert argvs() == json.loads((DATA / "qemu-argv.json").read_text())


def test_same_options_as_before():
    """The JSON forms say what the key=value forms said at 62870f3: same options, same
    order, same keys and values."""
    before = json.loads((DATA / "qemu-argv-keyval-62870f3.json").read_text())
    for name, argv in argvs().items():
        if name.startswith("device"):   # device mode came after
            continue
        assert options(argv) == options(deliberate_changes(before[name])), name


def deliberate_changes(argv: list[str]) -> list[str]:
    """The argv of 62870f3 with the changes made since on purpose:
    - `-qmp unix:PATH,server=on,wait=off` became a keyed `-chardev socket,id=qmp,path=PATH,...`
      and `-mon chardev=qmp,mode=control` (the same monitor; -qmp's implied path reads a
      PATH with '=' before its first ',' as a key);
    - filter-gate says its overflow policy (`overflow=block`, the host's default;
      qemu-patches/0033 bounds what the gate holds);
    - the device log takes every disk of the guest as `drives` (qemu-patches/0017), not
      one `drive`;
    - the demo guest's command line turns IPv6 off (`ipv6.disable=1`): the kernels have it
      since issue 24, for ordinary guests' services."""
    i = argv.index("-qmp")
    path = argv[i + 1].removeprefix("unix:").split(",server=on", 1)[0]
    argv = argv[:i] + ["-chardev", f"socket,id=qmp,path={path},server=on,wait=off",
                       "-mon", "chardev=qmp,mode=control"] + argv[i + 2:]
    argv = [a.replace(",drive=", ",drives.0=") if a.startswith("devlog,") else a for a in argv]
    argv = [a.replace("oops=panic", "oops=panic ipv6.disable=1", 1) if p == "-append" else a
            for p, a in zip(["", *argv], argv)]
    return [a.replace(",position=head", ",position=head,overflow=block") if a.startswith("filter-gate,") else a
            for a in argv]


def test_structured_forms():
    """-device, -object and -netdev are JSON in every mode: no value there is parsed as keys."""
    for name, argv in argvs().items():
        for opt, val in zip(argv, argv[1:]):
            if opt in ("-device", "-object", "-netdev"):
                assert val.startswith("{") and isinstance(json.loads(val), dict), (name, opt, val)


@pytest.mark.parametrize("rundir", ["/run/a,romfile=/etc/shadow", "/run/x,,y,id=evil", "/run/t,server=off",
                                    "/run/a=b,c"])
def test_hostile_paths_add_no_key(rundir):
    """A path with commas and keys in it (a bundle the user named so, a state directory)
    stays one value: every option has the keys it has with a plain path."""
    plain, hostile = argvs(), argvs(Path(rundir))
    for name in plain:
        a, b = options(plain[name]), options(hostile[name])
        assert [(o, sorted(v) if isinstance(v, dict) else None) for o, v in a] == \
               [(o, sorted(v) if isinstance(v, dict) else None) for o, v in b], name
        # ... and the path arrives whole where it goes
        assert any(rundir in v for _, d in b if isinstance(d, dict) for v in d.values()), name


@pytest.mark.parametrize("mac", ["52:54:00:12:34:56,romfile=/etc/shadow", "52:54:00:12:34", "", "zz:54:00:12:34:56"])
def test_bad_mac_refused(mac):
    with pytest.raises(OptionError, match="not a MAC address"):
        Guest(kernel="/k", initrd=None).with_nic(mac=mac)


@pytest.mark.parametrize("model", ["virtio-net-pci,romfile=/etc/shadow", "pci-testdev", ""])
def test_unknown_nic_model_refused(model):
    with pytest.raises(OptionError, match="NIC model"):
        Guest(kernel="/k", initrd=None).with_nic(model)


@pytest.mark.parametrize("base", ["2026-01-01T00:00:00,clock=host", "now", "2026-01-01"])
def test_bad_rtc_base_refused(base):
    with pytest.raises(OptionError, match="RTC base"):
        Feed(R / "f", rtc_base=base)


def test_option_builders_refuse_what_qemu_cannot_take():
    with pytest.raises(OptionError, match="not a property name"):
        json_option({"id,romfile": "x"})
    with pytest.raises(OptionError, match="NUL"):
        keyval_option("socket", {"path": "/a\0b"})
    with pytest.raises(OptionError, match="64-bit"):
        json_option({"lookahead": 1 << 64})
    with pytest.raises(OptionError, match="not a QEMU option value"):
        json_option({"x": 1.5})
    with pytest.raises(OptionError, match="not a QEMU id"):
        Nic(netdev="net0,x=y")
    assert keyval_option("socket", {"path": "/a,b", "server": True, "wait": False, "x": None}) == \
        "socket,path=/a,,b,server=on,wait=off"


def test_manifest_machine_round_trip():
    """The manifest's machine section is derived from the Guest and loads back into it."""
    g = Guest(kernel="/k", initrd="/i", disks=(Disk("/d", "qcow2"),), memory_mb=512, cmdline="console=ttyS0",
              nics=(Nic(model="e1000", mac="52:54:00:12:34:56"),))
    entry = {"path": "", "size": 0, "sha256": "0" * 64}
    m = {"inputs": {k: {**entry, "path": p} for k, p in (("kernel", "/k"), ("initrd", "/i"), ("disk_base", "/d"))},
         "machine": g.machine_section()}
    assert Guest.from_manifest(m) == g
    assert machine.NIC_MODELS["e1000"] == "e1000"


if __name__ == "__main__":      # regenerate the golden file
    json.dump(argvs(), sys.stdout, indent=1)
    print()


# --- a bundle crafted to set QEMU options through its manifest -----------------------------

def crafted_manifest(**machine) -> dict:
    entry = {"size": 1, "sha256": "0" * 64}
    return {"schema": 1, "state": "complete",
            "inputs": {"kernel": {**entry, "path": "/k/bzImage"}, "initrd": {**entry, "path": "/k/initrd"},
                       "disk_base": {**entry, "path": "/k/disk.raw"}},
            "machine": {**G.machine_section(), "stop_after_ns": 0, "mode": "analysis",
                        "rtc_base": "2026-01-01T00:00:00", "lookahead_ns": 1000, **machine},
            "files": {}, "stop": {}, "channels": {}}


def replay_argv(m: dict) -> list[str]:
    """The argv `tandem replay` gives QEMU for manifest m (after the load's checks)."""
    from tandem.formats import bundle
    from tandem.exact import replay as replay_exact
    problem = bundle.manifest_problem(m)
    if problem:
        raise TandemError(problem)
    run = dataclasses.replace(replay_exact.replay_run(m, R, R / "r", R / "o.qcow2"), host=H)
    return qemu_argv(Guest.from_manifest(m), run)


CRAFTED = [   # (where, value): each manifest field that reaches QEMU's command line
    ("machine.mac", "52:54:00:12:34:56,romfile=/etc/shadow"),
    ("machine.nic_model", "e1000,romfile=/etc/shadow"),
    ("machine.disk_format", "raw,file.driver=host_device"),
    ("machine.stop_after_ns", "1,romfile=/etc/shadow"),
    ("machine.rtc_base", "2026-01-01T00:00:00,clock=host"),
    ("machine.lookahead_ns", "0,chardev=gatesock"),
    ("machine.memory_mb", "256,maxmem=1T"),
    ("machine.cmdline", "console=ttyS0 x,romfile=/etc/shadow"),
    ("machine.libvirt", {"uuid": "00000000-0000-0000-0000-000000000000,romfile=/etc/shadow"}),
    ("inputs.kernel", {"path": "/k/bzImage,romfile=/etc/shadow", "size": 1, "sha256": "0" * 64}),
    ("inputs.initrd", {"path": "/k/a,b=c", "size": 1, "sha256": "0" * 64}),
    ("machine.mode", "analysis,x=y"),
    ("machine.cpu", "tcg-intel,x=y"),
    ("machine.cpu", "host"),
]


@pytest.mark.parametrize("where,value", CRAFTED, ids=[f"{w}={v}" for w, v in CRAFTED])
def test_crafted_manifest_refused_or_inert(where, value):
    """Each field refused with a one-line error naming it, or inert: the command line has
    exactly the options and keys of an honest manifest's."""
    section, key = where.split(".")
    m = crafted_manifest()
    m[section][key] = value
    try:
        argv = replay_argv(m)
    except TandemError as e:
        assert where.split(".")[1] in str(e) and "\n" not in str(e)
        return
    honest = options(replay_argv(crafted_manifest()))
    assert [(o, sorted(v) if isinstance(v, dict) else None) for o, v in options(argv)] == \
           [(o, sorted(v) if isinstance(v, dict) else None) for o, v in honest]


def test_a_freebsd_guest_gets_its_cpu_and_keeps_it_through_the_manifest():
    """A FreeBSD guest booted directly: the Intel CPU with a brand-string frequency its PVH
    boot times itself by, no console= added to its command line (its kenv), both kept in
    the manifest and given again to its replay."""
    g = Guest.of_disks([("/k/root.img", "raw")], kernel="/k/kernel", append="vfs.root.mountfrom=ufs:/dev/vtbd0",
                       os="freebsd")
    assert (g.os, g.cpu, g.cmdline) == ("freebsd", "tcg-intel", "vfs.root.mountfrom=ufs:/dev/vtbd0")
    argv = qemu_argv(g, Run(R, net=UserNet(5555), overlay=R / "o.qcow2", host=H))
    assert argv[argv.index("-cpu") + 1] == "qemu64,vendor=GenuineIntel,model-id=tandem TCG CPU @ 1.00GHz"
    entry = {"path": "", "size": 0, "sha256": "0" * 64}
    m = {"inputs": {k: {**entry, "path": p} for k, p in (("kernel", "/k/kernel"), ("disk_base", "/k/root.img"))},
         "machine": g.machine_section()}
    assert m["machine"]["cpu"] == "tcg-intel" and Guest.from_manifest(m) == g
    assert "-cpu" not in qemu_argv(G, Run(R, net=UserNet(5555), overlay=R / "o.qcow2", host=H))      # a Linux guest: QEMU's default


def test_device_mode_runs_the_native_as_it_is_and_logs_its_devices_only():
    """Device mode: no -icount, no record/replay stream, no blkreplay, no state checkpoints;
    the device log with its clock marks; several vCPUs on a thread each under TCG, or KVM."""
    argv = argvs()
    for name in ("device", "device-kvm-gate"):
        a = argv[name]
        assert "-icount" not in a and not any("blkreplay" in x or "filter-replay" in x for x in a), name
        devlog = next(json.loads(a[i + 1]) for i, x in enumerate(a)
                      if x == "-object" and json.loads(a[i + 1])["qom-type"] == "devlog")
        assert devlog["clock-marks"] is True and "state-every" not in devlog, name
    assert argv["device"][argv["device"].index("-accel") + 1] == "tcg,thread=multi"
    assert argv["device"][argv["device"].index("-smp") + 1] == "2"
    assert argv["device-kvm-gate"][argv["device-kvm-gate"].index("-accel") + 1] == "kvm"
    assert any('"filter-gate"' in x for x in argv["device-kvm-gate"])


def test_several_vcpus_under_icount_share_tcgs_one_thread():
    """QEMU refuses -icount with multi-threaded TCG ("No MTTCG when icount is enabled"): a
    plain run of a 2-vCPU guest under -icount (an analysis disk's overlay preparation boot
    of a user's 2-vCPU VM) keeps round-robin TCG; without -icount it gets a thread each."""
    g = dataclasses.replace(G, vcpus=2)
    with_icount = qemu_argv(g, Run(R, overlay=R / "o.qcow2", icount=True, host=H))
    assert "-icount" in with_icount and with_icount[with_icount.index("-accel") + 1] == "tcg"
    without = qemu_argv(g, Run(R, overlay=R / "o.qcow2", icount=False, host=H))
    assert "-icount" not in without and without[without.index("-accel") + 1] == "tcg,thread=multi"


def test_a_recording_of_two_vcpus_runs_them_in_turns_on_one_thread():
    """Record/replay of several vCPUs (qemu-patches/0038) is QEMU's round-robin TCG under
    -icount, whose turns the log says: -smp as the guest has, no thread=multi."""
    r = R
    argv = qemu_argv(dataclasses.replace(G, vcpus=2), Run(r, rr=RR("record", r / "r"), devlog=r / "d",
                                                         overlay=r / "o", host=H))
    assert argv[argv.index("-smp") + 1] == "2" and argv[argv.index("-accel") + 1] == "tcg"
    assert any(a.startswith("shift=") and "rr=record" in a for a in argv), argv


def test_what_only_device_mode_can_run_is_refused_elsewhere():
    """TCG for record/replay and analysis runs (-icount is TCG's); no state checkpoints
    without instruction counts."""
    r = R
    with pytest.raises(OptionError, match="accelerator 'kvm': replay runs need -icount"):
        qemu_argv(dataclasses.replace(G, accel="kvm"), Run(r, rr=RR("replay", r / "r"), overlay=r / "o", host=H))
    with pytest.raises(OptionError, match="state checkpoints need record/replay"):
        Run(r, devlog=r / "d", icount=False, state_every_ns=100_000_000)
    with pytest.raises(OptionError, match="filter-gate holds"):
        Run(r, gate=Gate(r / "g"))


def test_device_lists_past_what_the_modes_take_are_refused():
    """The description holds lists of devices with ids; the analysis feed takes one NIC
    and says so rather than drop one."""
    two_nics = Guest(kernel="/k", initrd=None, nics=(Nic(), Nic(netdev="net1")))
    with pytest.raises(OptionError, match="2 NICs"):
        qemu_argv(two_nics, Run(R, net=Feed(R / "f"), host=H))
    with pytest.raises(OptionError, match="disk format"):
        Disk("/a", "vmdk")
    with pytest.raises(OptionError, match="disk disk0: the run has no overlay"):
        qemu_argv(G, Run(R, host=H))
    with pytest.raises(OptionError, match="drive ids"):
        Guest(kernel="/k", initrd=None, disks=(Disk("/a"), Disk("/b")))


def test_several_nics_each_recorded_and_logged():
    """Record: every NIC on its own user netdev, each behind filter-replay and logged by
    the device log; the host's forwards go to the first."""
    g = Guest(kernel="/k", initrd=None, nics=(Nic(), Nic(netdev="net1", model="e1000")))
    run = Run(R, net=UserNet(forwards=(Forward("tcp", 8080, 80), Forward("udp", 5353, 53))),
              rr=RR("record", R / "r"), devlog=R / "d", host=H)
    opts = options(qemu_argv(g, run))
    netdevs = [v for o, v in opts if o == "-netdev"]
    assert [n["id"] for n in netdevs] == ["net0", "net1"]
    assert netdevs[0]["hostfwd"] == "tcp:127.0.0.1:8080-:80,udp:127.0.0.1:5353-:53"     # options(): as QEMU reads it
    assert "hostfwd" not in netdevs[1]
    objects = [(v["qom-type"], v.get("netdev")) for o, v in opts if o == "-object"]
    for netdev in ("net0", "net1"):
        assert ("filter-replay", netdev) in objects and ("filter-devlog", netdev) in objects


def test_firmware_boot_has_no_kernel_and_boots_the_first_disk():
    g = Guest(kernel=None, initrd=None, disks=(Disk("/a.qcow2", "qcow2"), Disk("/b", id="disk1")))
    argv = qemu_argv(g, Run(R, overlay=R / "o.qcow2", host=H))
    assert "-kernel" not in argv and "-append" not in argv
    drives = [v for o, v in options(argv) if o == "-device" and v.get("driver") == "virtio-blk-pci"]
    assert [(d["drive"], d.get("bootindex")) for d in drives] == [("disk0", "0"), ("disk1", None)]
    files = [v["file"] for o, v in options(argv) if o == "-drive"]
    assert files == [str(R / "o.qcow2"), str(R / "o.disk1.qcow2")]
    with pytest.raises(OptionError, match="nothing to boot"):
        Guest(kernel=None, initrd=None)


def test_forward_parse():
    assert str(Forward.parse("tcp:8080:80")) == "tcp:8080:80"
    assert Forward.parse("udp:5353:53").hostfwd() == "udp:127.0.0.1:5353-:53"
    for bad in ("tcp:8080", "sctp:1:2", "tcp:0:80", "tcp:70000:80", "tcp:80:x", "tcp:1:2,hostfwd=x"):
        with pytest.raises(OptionError, match="forward"):
            Forward.parse(bad)


def test_every_disk_has_its_overlay_and_is_in_the_device_log():
    """Two disks recorded: each on its own overlay behind its own blkreplay, and the
    device log takes both (qemu-patches/0017: one pcapng block interface per drive)."""
    two_disks = dataclasses.replace(G, disks=(Disk("/k/disk.raw"), Disk("/data.qcow2", "qcow2", id="disk1")))
    argv = qemu_argv(two_disks, Run(R, net=UserNet(5555), rr=RR("record", R / "r"), devlog=R / "d",
                                    overlay=R / "b/disk-overlay.qcow2", host=H))
    opts = options(argv)
    drives = [v for o, v in opts if o == "-drive"]
    assert [(d.get("id"), d.get("file"), d.get("driver")) for d in drives] == [
        ("disk0-img", "/run/t/b/disk-overlay.qcow2", None), ("disk0", None, "blkreplay"),
        ("disk1-img", "/run/t/b/disk-overlay.disk1.qcow2", None), ("disk1", None, "blkreplay")]
    assert [v["drive"] for o, v in opts if o == "-device" and v["driver"] == "virtio-blk-pci"] == ["disk0", "disk1"]
    devlog = next(json.loads(v) for o, v in zip(argv, argv[1:]) if o == "-object" and '"devlog"' in v
                  and json.loads(v)["qom-type"] == "devlog")
    assert devlog["drives"] == ["disk0", "disk1"] and "drive" not in devlog
    no_disk = qemu_argv(dataclasses.replace(G, disks=()), Run(R, rr=RR("record", R / "r"), devlog=R / "d", host=H))
    assert not any('"drives"' in a for a in no_disk)


def test_manifest_devices_come_from_the_description():
    g = Guest(kernel="/k", initrd=None, disks=(Disk("/d"),), nics=(Nic(model="e1000"),))
    assert g.machine_section()["devices"] == ["isa-serial", "e1000", "virtio-blk-pci", "virtio-rng-pci"]
    assert Guest(kernel="/k", initrd=None).machine_section()["devices"] == ["isa-serial", "virtio-net-pci",
                                                                            "virtio-rng-pci"]
