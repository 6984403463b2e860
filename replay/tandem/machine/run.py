"""How a machine runs: the mode (record, device, exact replay, analysis, plain) and what
that mode needs, as typed parts; qemu/argv.py composes QEMU's options from a Guest and a Run.

The mode is not a field: it follows from the parts (the feed as the network: an analysis
run; record/replay: a recording or its exact replay; a device log without record/replay:
a device-mode recording; none of these: plain), so no Run can say "replay" and carry a
host port forward, or "analysis" without a feed. Each part is
checked when made; the combinations a mode cannot have are refused when the Run is made.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from ..artifacts import QemuBuild
from .devices import Forward
from .options import LOOKAHEAD_NS, RTC_BASE, OptionError


class RRMode(StrEnum):
    """Which way QEMU's record/replay runs (its -icount rr= value)."""
    RECORD = "record"
    REPLAY = "replay"


class Mode(StrEnum):
    PLAIN = "plain"         # no record/replay: benchmarks' baseline, planted-bug checks
    RECORD = "record"       # a native recorded (QEMU's record/replay + tandem's device log)
    DEVICE = "device"       # a native recorded by its device log alone: no -icount, any vCPUs, KVM
    REPLAY = "replay"       # an exact replay of a recording
    ANALYSIS = "analysis"   # fed by tandem (qemu-patches/0027): semantic replay, live shadows


@dataclass(frozen=True)
class RR:
    """QEMU's record/replay (-icount rr=...): the stream it writes or reads. mode may be
    given as its value ("record", "replay"): it is made an RRMode."""
    mode: RRMode
    rrfile: Path
    follow: bool = False        # replay: a recording still being written (qemu-patches/0012)
    partial: bool = False       # replay: up to the last intact segment

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "mode", RRMode(self.mode))
        except ValueError:
            raise OptionError(f"record/replay mode {self.mode!r}: 'record' or 'replay'") from None
        if self.mode == RRMode.RECORD and (self.follow or self.partial):
            raise OptionError("follow and partial are for a replay")


@dataclass(frozen=True)
class UserNet:
    """QEMU's user networking (slirp) on every NIC; the host's forwards go to the first NIC.
    hostfwd_port is the demo guest's shorthand (`tandem record --port`): that host port to
    its service's port 7000."""
    hostfwd_port: int | None = None
    forwards: tuple[Forward, ...] = ()

    def all_forwards(self, demo_port: int) -> tuple[Forward, ...]:
        """The forwards, the demo shorthand's first (to demo_port in the guest)."""
        demo = (Forward("tcp", self.hostfwd_port, demo_port),) if self.hostfwd_port else ()
        return demo + self.forwards


@dataclass(frozen=True)
class Feed:
    """tandem's feed (qemu-patches/0027-0029) as the network, the serial input and the entropy
    of an analysis VM; the VM clock runs from the recording's start (rtc_base)."""
    socket: Path | None             # None: an analysis run's own recording replayed (inputs in the log)
    lookahead_ns: int = LOOKAHEAD_NS
    rtc_base: str = "2026-01-01T00:00:00"
    reconnect_ms: int = 0           # retry the socket until its feeder listens (libvirt shadows)

    def __post_init__(self) -> None:
        if not RTC_BASE.fullmatch(str(self.rtc_base)):
            raise OptionError(f"RTC base {self.rtc_base!r}: not a time YYYY-MM-DDTHH:MM:SS")


@dataclass(frozen=True)
class Gate:
    """filter-gate (qemu-patches/0033): the native's frames held for tandem."""
    socket: Path
    outputs: bool = True            # hold its outgoing frames (release "agreed"); inputs on request
    overflow: str = "block"         # past its bound: "detach" (lets go) or "block" (refuses frames)


@dataclass(frozen=True)
class Host:
    """How the host runs the QEMU process: nothing here is seen by the guest."""
    qemu: QemuBuild | None = None   # artifacts.qemu() unless given (benchmarks: qemu_stock())
    idle: bool = False              # SCHED_IDLE (live analyses: the native first)
    cpus: str | None = None         # pinned to these CPUs (a taskset list)
    pass_fds: tuple[int, ...] = ()  # files QEMU gets open (/dev/fd/N in its argv), not by path


@dataclass(frozen=True)
class Run:
    """How a Guest runs: its mode's parts and where its files go."""
    rundir: Path                    # QMP and serial sockets, scratch files
    net: UserNet | Feed = UserNet()
    rr: RR | None = None
    devlog: Path | None = None      # tandem's device log (pcapng)
    stop_after_ns: int = 0          # the device log stops the VM at this VM time (0: never)
    state_every_ns: int = 0         # the device log's state checkpoints: their period (0: none)
    overlay: Path | None = None     # the run's qcow2 over the disk's base image
    gate: Gate | None = None
    icount: bool = True             # plain runs only: with or without -icount (device mode: never)
    host: Host = Host()
    extra: tuple[str, ...] = ()     # options libvirt added that the guest saw (a replay repeats them)

    def __post_init__(self) -> None:
        mode = self.mode
        if isinstance(self.net, UserNet) and (self.net.hostfwd_port or self.net.forwards) and mode == Mode.REPLAY:
            raise OptionError("a replay forwards no host port (its network input is in the log)")
        if isinstance(self.net, Feed) and self.net.socket is None and (self.rr is None or self.rr.mode != RRMode.REPLAY):
            raise OptionError("an analysis run needs its feed's socket (unless its recording is replayed)")
        if self.gate is not None and mode not in (Mode.RECORD, Mode.DEVICE):
            raise OptionError("filter-gate holds a recorded native's frames: record and device modes only")
        if not self.icount and mode not in (Mode.PLAIN, Mode.DEVICE):
            raise OptionError(f"{mode} runs need -icount")
        if mode == Mode.DEVICE and self.state_every_ns:
            raise OptionError("state checkpoints need record/replay's instruction counts: not in device mode")

    @property
    def mode(self) -> Mode:
        if isinstance(self.net, Feed):
            return Mode.ANALYSIS
        if self.rr is not None:
            return Mode(self.rr.mode)
        if self.devlog is not None:
            return Mode.DEVICE
        return Mode.PLAIN

    @property
    def rr_mode(self) -> RRMode | None:
        """record, replay or None: whether and how QEMU's record/replay runs."""
        return self.rr.mode if self.rr else None


def overlay_path(first: Path, disk_id: str) -> Path:
    """A run's qcow2 overlay over a disk's base: `first` (the run's overlay) for disk0,
    the same name with the drive id added for the others (disk-overlay.disk1.qcow2). The
    one naming: QEMU's command line (qemu/argv.py), the overlays made (qemu/image.py) and
    a bundle's files (formats/bundle.py) all come from here."""
    if disk_id == "disk0":
        return first
    return first.with_name(f"{first.stem}.{disk_id}{first.suffix}")
