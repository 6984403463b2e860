"""QEMU's command line for a Guest and a Run: one place composes it for every mode, so
that record and replay can only differ where they must, and every option is built from
typed values by machine/options.py (-device/-object/-netdev as JSON, the rest as
key=value lists with their values escaped), so no value can add a key."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import artifacts
from ..artifacts import QemuBuild
from ..machine import (
    CPUS,
    ICOUNT_SHIFT,
    Disk,
    Feed,
    Guest,
    Mode,
    Nic,
    OptionError,
    RRMode,
    Run,
    Value,
    json_option,
    keyval_option,
    overlay_path,
)

GUEST_PORT = 7000          # the demo service inside the guest


def qemu_argv(guest: Guest, run: Run) -> list[str]:
    """QEMU's command line for (guest, run), every option built from typed values by
    machine/options.py: -device/-object/-netdev as JSON, the rest as key=value lists with their
    values escaped, so no value (a bundle's MAC, a path with a comma) can add a key."""
    q = run.host.qemu or artifacts.qemu()
    if run.mode not in (Mode.PLAIN, Mode.DEVICE) and guest.accel != "tcg":
        raise OptionError(f"accelerator {guest.accel!r}: {run.mode} runs need -icount, which QEMU has only under TCG")
    if run.mode == Mode.ANALYSIS and len(guest.nics) != 1:
        raise OptionError(f"{len(guest.nics)} NICs: tandem's analysis feed takes one (for now)")
    argv = [q["binary"], "-L", q["firmware_dir"], "-M", guest.machine_type, "-m", str(int(guest.memory_mb)),
            "-smp", str(int(guest.vcpus)), "-nodefaults", "-no-user-config", "-display", "none",
            "-no-reboot", "-accel", _accel(guest, run), *_cpu_options(guest), *_boot_options(guest),
            *qmp_monitor(run.rundir)]
    argv += clock_options(run, q)
    argv += _serial_options(run)
    for disk in guest.disks:
        argv += _disk_options(run, disk, overlay_path(run.overlay, disk.id) if run.overlay else None, boot=guest.boot == "firmware" and disk is guest.disks[0])
    argv += _net_and_rng_options(run, guest.nics)
    if run.mode in ("record", "replay"):   # analysis runs: the feed is logged instead
        argv += replay_filters([nic.netdev for nic in guest.nics])
    argv += recording_objects(run, DeviceIds.of(guest))
    return argv + list(run.extra)


@dataclass(frozen=True)
class DeviceIds:
    """The ids QEMU knows a guest's devices by, which the recording's objects (the devlog,
    its filters, the gate) name: tandem's own (DeviceIds.of), or the ones libvirt gives
    the devices of a domain's own command line (libvirt/domain.recorded_domain_xml)."""
    serial: str | None          # the serial port's chardev
    rng: str | None             # the entropy device's backend object
    drives: tuple[str, ...]     # each disk: a drive's id, or a block device's (qemu-patches/0017)
    netdevs: tuple[str, ...]    # each NIC's netdev; the gate holds the first's frames

    @classmethod
    def of(cls, guest: Guest) -> DeviceIds:
        """The ids qemu_argv gives guest's devices."""
        return cls("serial0", "rng0", tuple(d.id for d in guest.disks), tuple(n.netdev for n in guest.nics))


def recording_objects(run: Run, ids: DeviceIds) -> list[str]:
    """The objects that record the run at its device boundary: the gate on the first NIC
    (run.gate), the device log over every device in ids and a filter on every netdev."""
    argv: list[str] = []
    if run.gate:
        # The guest's outgoing frames wait for tandem (release policy "agreed"), and its
        # incoming ones while tandem holds them (overflow policy "block"). At the head of
        # the list: on the way out it comes after the device log, which stamps each frame
        # when the guest sent it; on the way in before filter-replay and the device log,
        # so a held frame is recorded when the guest gets it.
        argv += ["-chardev", keyval_option("socket", {"id": "gatesock", "path": str(run.gate.socket)}),
                 "-object", json_option({"qom-type": "filter-gate", "id": "gate0", "netdev": ids.netdevs[0],
                                         "queue": "all", "chardev": "gatesock", "position": "head",
                                         "overflow": run.gate.overflow,
                                         "outputs": None if run.gate.outputs else False})]
    if run.devlog:
        # A recording's log says how far the VM clock has got every 100 ms: a live
        # shadow follows it without asking the native over QMP.
        argv += ["-object", json_option({
                     "qom-type": "devlog", "id": "devlog", "path": str(run.devlog), "chardev": ids.serial,
                     "rng": ids.rng, "drives": list(ids.drives) or None,
                     "stop-after": run.stop_after_ns or None,
                     "state-every": run.state_every_ns or None,
                     "clock-marks": True if run.mode in (Mode.RECORD, Mode.DEVICE) else None})]
        for i, netdev in enumerate(ids.netdevs):
            argv += ["-object", json_option({"qom-type": "filter-devlog", "id": "devlog-net0" if i == 0 else
                                             f"devlog-{netdev}", "netdev": netdev, "devlog": "devlog",
                                             "position": "tail"})]
    return argv


def replay_filters(netdevs) -> list[str]:
    """filter-replay on each netdev: record/replay logs the frames each gives the guest."""
    return [a for netdev in netdevs for a in
            ("-object", json_option({"qom-type": "filter-replay", "id": f"rr-{netdev}", "netdev": netdev}))]


def _accel(guest: Guest, run: Run) -> str:
    """-accel: the guest's accelerator; TCG with several vCPUs and no -icount (device mode,
    plain runs without it) runs one host thread each (thread=multi), as KVM does, rather
    than QEMU's round-robin on one thread, which -icount needs (QEMU refuses the two
    together) and which would serialise a native's vCPUs."""
    if guest.accel == "tcg" and guest.vcpus > 1 and not _icount(run):
        return keyval_option("tcg", {"thread": "multi"})
    return guest.accel


def _icount(run: Run) -> bool:
    """Whether the run's VM clock counts instructions (clock_options gives -icount)."""
    return run.mode in (Mode.RECORD, Mode.REPLAY) or isinstance(run.net, Feed) or \
        (run.icount and run.mode == Mode.PLAIN)


def _cpu_options(guest: Guest) -> list[str]:
    """-cpu for a guest given a CPU model (machine.guest.CPUS), else none: QEMU's default."""
    if guest.cpu is None:
        return []
    model, props = CPUS[guest.cpu]
    return ["-cpu", keyval_option(model, props)]


def _boot_options(guest: Guest) -> list[str]:
    """Direct boot: the kernel, initrd and command line to QEMU. Firmware boot: nothing
    here (SeaBIOS boots the first disk: its bootindex, _disk_options)."""
    if guest.kernel is None:
        return []
    return ["-kernel", guest.kernel, *(["-initrd", guest.initrd] if guest.initrd else []), "-append", guest.cmdline]


def qmp_monitor(rundir: Path) -> list[str]:
    """tandem's QMP monitor on its socket in rundir. On a keyed chardev: -qmp unix:PATH
    reads a PATH with '=' before its first ',' as a key (QEMU's implied first option)."""
    return ["-chardev", qmp_chardev(rundir), "-mon", keyval_option(None, {"chardev": "qmp", "mode": "control"})]


def qmp_chardev(rundir: Path) -> str:
    """tandem's QMP socket in rundir, as a -chardev (a domain's QEMU is found by it: libvirt/launcher.py)."""
    return keyval_option("socket", {"id": "qmp", "path": f"{rundir}/qmp.sock", "server": True, "wait": False})


def clock_options(run: Run, q: QemuBuild | None = None) -> list[str]:
    """-icount (and the analysis runs' -rtc): how the VM clock runs in this mode.
    q: the QEMU build that runs it (default: tandem's)."""
    q = q or artifacts.qemu()
    rr = run.rr
    rr_opts: dict[str, str | int | bool | None] = {}
    if rr is not None and rr.mode == RRMode.RECORD:
        rr_opts = {"rr": "record", "rrfile": str(rr.rrfile)}
    elif rr is not None:
        # The VM clock's idle warps come from the log, so the replay need not
        # wait them out: rrskipidle=on (qemu-patches/0022) stops the main loop
        # sleeping while the replay waits on it.
        rr_opts = {"rr": "replay", "rrfile": str(rr.rrfile), "rrskipidle": None if q.get("stock") else True,
                   "rrfollow": rr.follow or None, "rrpartial": rr.partial or None}
    if run.mode in ("record", "replay"):
        # sleep stays on in replay to match the recording's warp accounting.
        return ["-icount", keyval_option(None, {"shift": ICOUNT_SHIFT, "sleep": True, **rr_opts})]
    if isinstance(run.net, Feed):
        # sleep=off: an idle analysis guest warps straight to its next input. The RTC
        # runs on the VM clock from the recording's start time: a host-clock RTC
        # would interrupt the guest at host-dependent VM times.
        return ["-icount", keyval_option(None, {"shift": ICOUNT_SHIFT, "sleep": False, **rr_opts}),
                "-rtc", keyval_option(None, {"base": run.net.rtc_base, "clock": "vm"})]
    if run.icount and run.mode == Mode.PLAIN:
        return ["-icount", keyval_option(None, {"shift": ICOUNT_SHIFT, "sleep": True})]
    return []       # device mode: the VM clock is the host's while the VM runs


def _serial_options(run: Run) -> list[str]:
    """The serial console: a socket while live, nothing in replay (input comes from the
    log) or in analysis (the feed carries both directions)."""
    if run.mode in ("replay", "analysis"):
        chardev = keyval_option("null", {"id": "serial0"})
    else:
        chardev = keyval_option("socket", {"id": "serial0", "path": f"{run.rundir}/serial.sock",
                                           "server": True, "wait": False})
    return ["-chardev", chardev, "-serial", "chardev:serial0"]


def _disk_options(run: Run, disk: Disk, overlay: Path | None, *, boot: bool = False) -> list[str]:
    """A disk: the run's qcow2 overlay over its base, behind blkreplay when record/replay
    runs (block completions must be ordered by the replay log). boot: the disk SeaBIOS
    boots (bootindex 0)."""
    if overlay is None:
        raise OptionError(f"disk {disk.id}: the run has no overlay for it (the base image is never written)")
    image = f"{disk.id}-img" if run.rr_mode else disk.id
    argv = ["-drive", keyval_option(None, {"file": str(overlay), "if": "none", "id": image, "format": "qcow2"})]
    if run.rr_mode:
        argv += ["-drive", keyval_option(None, {"driver": "blkreplay", "if": "none", "image": image, "id": disk.id})]
    # Analysis VMs: ioeventfd=off runs a queue kick in the vCPU thread, at the
    # instruction that made it; with an eventfd the main loop takes it later,
    # at a host-dependent VM time.
    return argv + ["-device", json_option({"driver": "virtio-blk-pci", "drive": disk.id,
                                           "ioeventfd": False if run.mode == "analysis" else None,
                                           "bootindex": 0 if boot else None})]


def _net_and_rng_options(run: Run, nics: tuple[Nic, ...]) -> list[str]:
    """Each NIC and its backend, and the entropy source: user networking (the host's
    forwards on the first NIC) and the host's entropy, or tandem's feed for both
    (analysis runs: one NIC)."""
    if isinstance(run.net, Feed):
        return _feed_options(run, run.net, nics[0])
    forwards = run.net.all_forwards(GUEST_PORT)
    argv: list[str] = []
    for i, nic in enumerate(nics):
        hostfwd: list[Value] | None = [{"str": f.hostfwd()} for f in forwards] if i == 0 and forwards else None
        # Each NIC its own network (10.0.2.0/24, 10.0.3.0/24, ...): on one subnet twice the
        # guest could not tell which NIC reaches which gateway.
        subnet = f"10.0.{2 + i}.0/24" if i else None
        argv += ["-netdev", json_option({"type": "user", "id": nic.netdev, "net": subnet, "hostfwd": hostfwd}),
                 "-device", nic.device()]
    return argv + ["-object", json_option({"qom-type": "rng-builtin", "id": "rng0"}),
                   "-device", json_option({"driver": "virtio-rng-pci", "rng": "rng0"})]


def _feed_options(run: Run, feed_net: Feed, nic: Nic) -> list[str]:
    """The feed (qemu-patches/0027-0029) as the network, the serial input and the entropy: the
    NIC's backend is an unconnected hub port whose frames filter-feed replaces. A
    recorded analysis run replays without its controller: the feed's inputs are in the
    log (qemu-patches/0030)."""
    argv: list[str] = []
    feed: dict[str, Value] = {"qom-type": "feed", "id": "feed", "serial": "serial0", "lookahead": int(feed_net.lookahead_ns)}
    if run.rr_mode != "replay":
        argv += ["-chardev", keyval_option("socket", {"id": "feedsock", "path": str(feed_net.socket),
                                                      "reconnect-ms": feed_net.reconnect_ms or None})]
        feed["chardev"] = "feedsock"
    # tx=timer: transmit from a VM-clock timer, not a main-loop bottom half,
    # so the guest's frames leave at the same VM time in every run.
    return argv + ["-netdev", json_option({"type": "hubport", "id": nic.netdev, "hubid": 0}),
                   "-device", nic.device(deterministic_tx=True),
                   "-object", json_option({"qom-type": "rng-feed", "id": "rng0", "feed": "feed"}),
                   "-device", json_option({"driver": "virtio-rng-pci", "rng": "rng0", "ioeventfd": False}),
                   "-object", json_option(feed),
                   "-object", json_option({"qom-type": "filter-feed", "id": f"feed-{nic.netdev}", "netdev": nic.netdev,
                                           "feed": "feed", "position": "head"})]
