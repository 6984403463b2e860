"""Launch the patched QEMU for a guest and talk to it (QMP, serial console).

One place builds the QEMU command line for every mode (record, replay, plain),
so that record and replay can only differ where they must.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import os
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from qemu.qmp import ConnectError, QMPError
from qemu.qmp.legacy import QEMUMonitorProtocol

from .. import artifacts, catalog, private
from ..errors import BundleError, TandemError
from ..machine import RTC_BASE, VIRTIO_NET, Disk, Nic, OptionError, Value, json_option, keyval_option

log = logging.getLogger(__name__)

# What a QMP exchange raises when QEMU has gone or is going (qemu.qmp's errors, a closed
# socket, an event-loop read cut short): callers that ask in passing (a status, a
# counter, a quit) take it as "gone" and log the cause; nothing else is caught.
QMP_GONE = (QMPError, OSError, EOFError, asyncio.TimeoutError)

GUEST_PORT = 7000          # the demo service inside the guest
ICOUNT_SHIFT = 2           # fixed: record and replay must use the same shift
DEFAULT_CMDLINE = "console=ttyS0 panic=-1 oops=panic"


def initrd_with_modules(initramfs: str, initramfs_sha256: str, modules: artifacts.ModulesBuild) -> str:
    """The initramfs followed by a kernel flavor's module cpio, as one file.

    The initramfs is shared by all kernel flavors but modules must match their
    kernel, so each flavor's modules come as a separate gzipped cpio
    (scripts/build-modules.sh) and Linux unpacks the concatenation of both. The
    result is cached under a name derived from both hashes: it is the file QEMU
    loads, and recordings name it (and its hash) as their initrd, so it must
    outlive the run.
    """
    key = hashlib.sha256(f"{initramfs_sha256} {modules['cpio_sha256']}".encode()).hexdigest()[:16]
    out = artifacts.cache_dir() / "initrd" / f"{Path(initramfs).name.split('.')[0]}+{modules['flavor']}-{key}.cpio.gz"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}")
        with open(tmp, "wb") as f:
            for part in (initramfs, modules["cpio"]):
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, f)
        os.replace(tmp, out)
    return str(out)


@dataclass
class Guest:
    """The machine tandem runs, as the guest sees it: direct kernel boot (kernel, initramfs,
    command line), memory, its devices as lists with ids (disks, NICs; one serial port and
    one entropy source, which every mode has), and its OS. QEMU's command line
    (qemu_argv), the libvirt domain (virt.domain_xml, from that command line) and the
    manifest's machine section (machine_section, read back by from_manifest) all come from
    it. Today's modes take at most one disk and exactly one NIC: the device log and the
    feed know one of each (qemu_argv says so when given more)."""
    kernel: str
    initrd: str | None                      # None: the kernel boots without one
    disks: tuple[Disk, ...] = ()
    memory_mb: int = 256
    cmdline: str = DEFAULT_CMDLINE
    nics: tuple[Nic, ...] = (Nic(),)
    os: str = "linux"                       # the guest OS: which console dialect its reports are in

    @property
    def disk(self) -> Disk | None:
        """The disk (today's machines have at most one)."""
        return self.disks[0] if self.disks else None

    @property
    def nic(self) -> Nic:
        """The NIC (today's machines have exactly one)."""
        if len(self.nics) != 1:
            raise OptionError(f"{len(self.nics)} NICs: tandem's device log and feed take one (for now)")
        return self.nics[0]

    @classmethod
    def default(cls, flavor: str = "native", userland: str = "native") -> "Guest":
        """tandem's guest image with a built kernel flavor and userland (catalog.py)."""
        kernel, land = catalog.kernel(flavor), catalog.userland(userland)
        k, g = artifacts.kernel(flavor), artifacts.guest()
        cmdline = " ".join(filter(None, (DEFAULT_CMDLINE, land.cmdline_extra, kernel.cmdline_extra)))
        initrd = initrd_with_modules(*artifacts.initramfs(g, userland), artifacts.modules(flavor))
        return cls(kernel=k["bzImage"], initrd=initrd, disks=(Disk(g["disk_base"]),), cmdline=cmdline,
                   memory_mb=kernel.memory_mb, os=kernel.os)

    @classmethod
    def for_analysis(cls, analysis: str) -> "Guest":
        """The guest an analysis of the catalogue boots (an unknown name: one-line error)."""
        a = catalog.get(analysis)
        return cls.default(a.flavor, a.userland.name)

    @classmethod
    def from_manifest(cls, manifest: dict) -> "Guest":
        """The guest a bundle recorded, from its manifest's inputs and machine section
        (shapes checked when the manifest loaded: bundle.manifest_problem); its devices are
        made again as machine.Disk and machine.Nic, so a replay's QEMU gets only
        well-formed ones (an OptionError is a BundleError's message here)."""
        inputs, machine = manifest.get("inputs") or {}, manifest.get("machine") or {}
        for where, value in (("inputs.kernel", inputs.get("kernel")), ("machine.memory_mb", machine.get("memory_mb")),
                             ("machine.cmdline", machine.get("cmdline"))):
            if value is None:
                raise BundleError(f"manifest {where}: missing (a replay needs it)")
        base = (inputs.get("disk_base") or {}).get("path")
        try:
            disks = (Disk(base, machine.get("disk_format") or "raw"),) if base else ()
            nics = (Nic(model=machine.get("nic_model") or VIRTIO_NET, mac=machine.get("mac")),)
        except OptionError as e:
            raise BundleError(f"manifest machine: {e}") from None
        return cls(kernel=inputs["kernel"]["path"], initrd=(inputs.get("initrd") or {}).get("path"),
                   disks=disks, memory_mb=machine["memory_mb"], cmdline=machine["cmdline"], nics=nics,
                   os=machine.get("os") or "linux")

    def machine_section(self) -> dict:
        """What the manifest's machine section says of this guest; from_manifest reads it back.
        The disk's base image is in the manifest's inputs (path, size, hash)."""
        out = {"accel": "tcg", "machine": "pc", "icount_shift": ICOUNT_SHIFT, "memory_mb": self.memory_mb,
               "cmdline": self.cmdline, "smp": 1,
               "devices": ["isa-serial", *(n.model for n in self.nics),
                           *("virtio-blk-pci" for _ in self.disks), "virtio-rng-pci"]}
        if self.disk and self.disk.format != "raw":      # what the replay's overlay backs onto
            out["disk_format"] = self.disk.format
        if self.nic.mac:
            out["mac"] = self.nic.mac
        if self.nic.model != VIRTIO_NET:
            out["nic_model"] = self.nic.model
        if self.os != "linux":
            out["os"] = self.os
        return out

    def with_disk(self, base: str | None, fmt: str = "raw") -> "Guest":
        """This guest with its disk replaced (None: without a disk)."""
        return dataclasses.replace(self, disks=(Disk(base, fmt),) if base else ())

    def with_nic(self, model: str = VIRTIO_NET, mac: str | None = None) -> "Guest":
        """This guest with its NIC replaced."""
        return dataclasses.replace(self, nics=(Nic(model=model, mac=mac),))


def analyses_given(names: list[str]) -> list[str]:
    """The --analysis names, each once and in order; an unknown name, or an analysis whose
    kernel or image is not built, is a one-line error now rather than after the native
    has started."""
    names = list(dict.fromkeys(names))
    if not names:
        raise TandemError("no --analysis given")
    for name in names:
        Guest.for_analysis(name)
    return names


@dataclass
class Run:
    """How it runs: the rr mode and where its files go."""
    mode: str                      # "record", "replay" or "plain"
    rundir: Path                   # sockets and scratch files
    rrfile: Path | None = None
    devlog: Path | None = None
    overlay: Path | None = None    # qcow2 over the disk base
    hostfwd_port: int | None = None
    stop_after_ns: int = 0
    follow: bool = False
    partial: bool = False
    icount: bool = True            # plain mode: with or without -icount
    qemu: artifacts.QemuBuild | None = None   # artifacts.qemu() unless given (benchmarks: qemu_stock())
    feed_socket: Path | None = None  # analysis mode: the feed controller's unix socket
    gate_socket: Path | None = None  # record mode: hold the guest's frames for tandem (filter-gate)
    gate_outputs: bool = True        # ... its outgoing ones (release "agreed"); inputs on request
    gate_overflow: str = "block"     # past its bound: "detach" (lets go) or "block" (refuses frames)
    idle: bool = False               # run QEMU at idle CPU priority (live analyses: the native first)
    cpus: str | None = None          # pin QEMU's threads to these CPUs (a taskset list: live analyses
                                     # off the native's core)
    feed_lookahead_ns: int = 0       # analysis mode: outputs pull the horizon in by this
    rtc_base: str = "2026-01-01T00:00:00"  # analysis mode: the guest's wall clock at boot
    rr: str | None = None            # analysis mode: "record" the run, or "replay" a recorded one
    feed_reconnect_ms: int = 0       # analysis mode: retry the feed socket until its feeder listens
    pass_fds: tuple[int, ...] = ()   # files QEMU gets open (/dev/fd/N in its argv), not by path
    extra: list[str] = field(default_factory=list)

    @property
    def rr_mode(self) -> str | None:
        """record, replay or None: whether and how QEMU's record/replay runs."""
        return self.mode if self.mode in ("record", "replay") else self.rr if self.mode == "analysis" else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (which may hold spaces and ')'),
    from the state on; None when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) a running process has used so far, from /proc."""
    fields = _stat_fields(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent counts as gone)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def make_overlay(base: str, overlay: Path, fmt: str = "raw") -> None:
    """A qcow2 overlay so the base image (of format fmt) is never written."""
    img = artifacts.qemu()["img"]
    r = subprocess.run([img, "create", "-q", "-f", "qcow2", "-b", str(Path(base).resolve()),
                        "-F", fmt, str(overlay)], capture_output=True, text=True,
                       umask=private.CHILD_UMASK)      # the overlay holds the guest's disk writes
    if r.returncode:
        raise TandemError(f"{overlay}: qemu-img create failed: {r.stderr.strip()}")


def qemu_argv(guest: Guest, run: Run) -> list[str]:
    """QEMU's command line for (guest, run), every option built from typed values by
    machine.py: -device/-object/-netdev as JSON, the rest as key=value lists with their
    values escaped, so no value (a bundle's MAC, a path with a comma) can add a key."""
    q = run.qemu or artifacts.qemu()
    nic = guest.nic
    if len(guest.disks) > 1:
        raise OptionError(f"{len(guest.disks)} disks: tandem's device log takes one (for now)")
    argv = [q["binary"], "-L", q["firmware_dir"], "-M", "pc", "-m", str(int(guest.memory_mb)),
            "-smp", "1", "-nodefaults", "-no-user-config", "-display", "none",
            "-no-reboot", "-accel", "tcg",
            "-kernel", guest.kernel, *(["-initrd", guest.initrd] if guest.initrd else []),
            "-append", guest.cmdline,
            # QMP on a keyed chardev: -qmp unix:PATH reads a PATH with '=' before its
            # first ',' as a key (QEMU's implied first option).
            "-chardev", qmp_chardev(run.rundir),
            "-mon", keyval_option(None, {"chardev": "qmp", "mode": "control"})]
    argv += _clock_options(run, q)
    argv += _serial_options(run)
    if guest.disk:
        argv += _disk_options(run, guest.disk)
    argv += _net_and_rng_options(run, nic)
    if run.mode in ("record", "replay"):   # analysis runs: the feed is logged instead
        argv += ["-object", json_option({"qom-type": "filter-replay", "id": "rr-net0", "netdev": nic.netdev})]
    if run.gate_socket:
        # The guest's outgoing frames wait for tandem (release policy "agreed"), and its
        # incoming ones while tandem holds them (overflow policy "block"). At the head of
        # the list: on the way out it comes after the device log, which stamps each frame
        # when the guest sent it; on the way in before filter-replay and the device log,
        # so a held frame is recorded when the guest gets it.
        argv += ["-chardev", keyval_option("socket", {"id": "gatesock", "path": str(run.gate_socket)}),
                 "-object", json_option({"qom-type": "filter-gate", "id": "gate0", "netdev": nic.netdev,
                                         "queue": "all", "chardev": "gatesock", "position": "head",
                                         "overflow": run.gate_overflow,
                                         "outputs": None if run.gate_outputs else False})]
    if run.devlog:
        # A recording's log says how far the VM clock has got every 100 ms: a live
        # shadow follows it without asking the native over QMP.
        argv += ["-object", json_option({
                     "qom-type": "devlog", "id": "devlog", "path": str(run.devlog), "chardev": "serial0",
                     "rng": "rng0", "drive": guest.disk.id if guest.disk else None,
                     "stop-after": run.stop_after_ns or None,
                     "clock-marks": True if run.mode == "record" else None}),
                 "-object", json_option({"qom-type": "filter-devlog", "id": "devlog-net0", "netdev": nic.netdev,
                                         "devlog": "devlog", "position": "tail"})]
    return argv + run.extra


def qmp_chardev(rundir: Path) -> str:
    """tandem's QMP socket in rundir, as a -chardev (a domain's QEMU is found by it: virt)."""
    return keyval_option("socket", {"id": "qmp", "path": f"{rundir}/qmp.sock", "server": True, "wait": False})


def _clock_options(run: Run, q: artifacts.QemuBuild) -> list[str]:
    """-icount (and the analysis runs' -rtc): how the VM clock runs in this mode."""
    rr = run.rr_mode
    rr_opts: dict = {}
    if rr == "record":
        rr_opts = {"rr": "record", "rrfile": str(run.rrfile)}
    elif rr == "replay":
        # The VM clock's idle warps come from the log, so the replay need not
        # wait them out: rrskipidle=on (qemu-patches/0004) stops the main loop
        # sleeping while the replay waits on it.
        rr_opts = {"rr": "replay", "rrfile": str(run.rrfile), "rrskipidle": None if q.get("stock") else True,
                   "rrfollow": run.follow or None, "rrpartial": run.partial or None}
    if run.mode in ("record", "replay"):
        # sleep stays on in replay to match the recording's warp accounting.
        return ["-icount", keyval_option(None, {"shift": ICOUNT_SHIFT, "sleep": True, **rr_opts})]
    if run.mode == "analysis":
        # sleep=off: an idle analysis guest warps straight to its next input. The RTC
        # runs on the VM clock from the recording's start time: a host-clock RTC
        # would interrupt the guest at host-dependent VM times.
        if not RTC_BASE.fullmatch(str(run.rtc_base)):
            raise OptionError(f"RTC base {run.rtc_base!r}: not a time YYYY-MM-DDTHH:MM:SS")
        return ["-icount", keyval_option(None, {"shift": ICOUNT_SHIFT, "sleep": False, **rr_opts}),
                "-rtc", keyval_option(None, {"base": run.rtc_base, "clock": "vm"})]
    if run.icount:
        return ["-icount", keyval_option(None, {"shift": ICOUNT_SHIFT, "sleep": True})]
    return []


def _serial_options(run: Run) -> list[str]:
    """The serial console: a socket while live, nothing in replay (input comes from the
    log) or in analysis (the feed carries both directions)."""
    if run.mode in ("replay", "analysis"):
        chardev = keyval_option("null", {"id": "serial0"})
    else:
        chardev = keyval_option("socket", {"id": "serial0", "path": f"{run.rundir}/serial.sock",
                                           "server": True, "wait": False})
    return ["-chardev", chardev, "-serial", "chardev:serial0"]


def _disk_options(run: Run, disk: Disk) -> list[str]:
    """The disk: the run's qcow2 overlay, behind blkreplay when record/replay runs (block
    completions must be ordered by the replay log)."""
    image = f"{disk.id}-img" if run.rr_mode else disk.id
    argv = ["-drive", keyval_option(None, {"file": str(run.overlay), "if": "none", "id": image, "format": "qcow2"})]
    if run.rr_mode:
        argv += ["-drive", keyval_option(None, {"driver": "blkreplay", "if": "none", "image": image, "id": disk.id})]
    # Analysis VMs: ioeventfd=off runs a queue kick in the vCPU thread, at the
    # instruction that made it; with an eventfd the main loop takes it later,
    # at a host-dependent VM time.
    return argv + ["-device", json_option({"driver": "virtio-blk-pci", "drive": disk.id,
                                           "ioeventfd": False if run.mode == "analysis" else None})]


def _net_and_rng_options(run: Run, nic: Nic) -> list[str]:
    """The NIC, its backend and the entropy source."""
    if run.mode != "analysis":
        forward: list[Value] | None = ([{"str": f"tcp:127.0.0.1:{int(run.hostfwd_port)}-:{GUEST_PORT}"}]
                   if run.hostfwd_port else None)
        return ["-netdev", json_option({"type": "user", "id": nic.netdev, "hostfwd": forward}),
                "-device", nic.device(),
                "-object", json_option({"qom-type": "rng-builtin", "id": "rng0"}),
                "-device", json_option({"driver": "virtio-rng-pci", "rng": "rng0"})]
    # The feed (qemu-patches/0006) is the network, the serial input and the entropy:
    # the NIC's backend is an unconnected hub port whose frames filter-feed replaces.
    # A recorded analysis run replays without its controller: the feed's inputs
    # are in the log (qemu-patches/0011).
    argv = []
    feed: dict[str, Value] = {"qom-type": "feed", "id": "feed", "serial": "serial0", "lookahead": int(run.feed_lookahead_ns)}
    if run.rr_mode != "replay":
        argv += ["-chardev", keyval_option("socket", {"id": "feedsock", "path": str(run.feed_socket),
                                                      "reconnect-ms": run.feed_reconnect_ms or None})]
        feed["chardev"] = "feedsock"
    # tx=timer: transmit from a VM-clock timer, not a main-loop bottom half,
    # so the guest's frames leave at the same VM time in every run.
    return argv + ["-netdev", json_option({"type": "hubport", "id": nic.netdev, "hubid": 0}),
                   "-device", nic.device(deterministic_tx=True),
                   "-object", json_option({"qom-type": "rng-feed", "id": "rng0", "feed": "feed"}),
                   "-device", json_option({"driver": "virtio-rng-pci", "rng": "rng0", "ioeventfd": False}),
                   "-object", json_option(feed),
                   "-object", json_option({"qom-type": "filter-feed", "id": "feed-net0", "netdev": nic.netdev,
                                           "feed": "feed", "position": "head"})]


class Serial:
    """The guest's serial console over QEMU's socket chardev: read lines, type lines."""

    def __init__(self, path: Path):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(str(path))
        self.buf = bytearray()
        self.cond = threading.Condition()
        self.closed = False
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self):
        while True:
            try:
                data = self.sock.recv(4096)
            except OSError:
                data = b""
            with self.cond:
                if not data:
                    self.closed = True
                else:
                    self.buf += data
                self.cond.notify_all()
            if not data:
                return

    def wait_for(self, text: bytes, timeout: float, start: int = 0) -> int:
        """Wait until text appears in the console output after `start`; return its end."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                i = self.buf.find(text, start)
                if i >= 0:
                    return i + len(text)
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    tail = bytes(self.buf[-300:]).decode(errors="replace")
                    raise TandemError(f"guest console: no {text.decode()!r} within {timeout:.0f}s"
                                      f"{' (console closed)' if self.closed else ''}; last output: {tail!r}")
                self.cond.wait(left)

    def type(self, line: str) -> None:
        self.sock.sendall(line.encode() + b"\n")

    def output(self) -> bytes:
        with self.cond:
            return bytes(self.buf)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class VM:
    """A running QEMU: process, QMP connection, optional serial console.

    launcher: start the QEMU some other way than as tandem's child process (virt.Launcher:
    as a libvirt domain). Its start(vm, log) runs vm.argv and returns a handle with what
    VM uses of subprocess.Popen: pid, returncode, poll(), wait(timeout) (raising
    subprocess.TimeoutExpired) and kill(); QEMU's output goes to `log` by the time it has
    exited. release(handle), called by close(), drops what the launcher made (the domain).
    tandem's QMP and serial sockets are in the argv, so everything else is the same.
    """

    def __init__(self, guest: Guest, run: Run, launcher=None, name: str | None = None):
        self.guest, self.run, self.launcher = guest, run, launcher
        self.name = name or run.mode        # for messages: "native", an analysis, "replay"
        # The guest's console so far, for a failure's report: the serial socket's when
        # tandem types on it; an analysis's driver sets its own (the feed carries it).
        self.console = lambda: self.serial.output() if self.serial else b""
        # QEMU's QMP and serial sockets go here: 0700 even when the caller made it.
        private.make_dir(run.rundir)
        os.chmod(run.rundir, private.DIR_MODE)
        self.argv = qemu_argv(guest, run)
        self.log_path = run.rundir / "qemu.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.qmp: QEMUMonitorProtocol | None = None
        self.serial: Serial | None = None
        self.shutdown_reason: str | None = None   # from QEMU's SHUTDOWN event

    def start(self, timeout: float = 30.0) -> "VM":
        try:   # qemu.qmp's sync wrapper needs an asyncio loop in this thread
            asyncio.get_event_loop()
        except RuntimeError:
            asyncio.set_event_loop(asyncio.new_event_loop())
        for stale in ("qmp.sock", "serial.sock"):
            (self.run.rundir / stale).unlink(missing_ok=True)
        self._log = open(self.log_path, "wb", opener=private.opener)
        if self.launcher is not None:
            if self.run.pass_fds:       # libvirt starts the QEMU: it cannot inherit our files
                raise TandemError("a QEMU started by libvirt cannot be given open files (pass_fds)")
            try:
                self.proc = self.launcher.start(self, self._log)
            except BaseException:
                self._log.close()
                raise
            if self.run.idle:   # a domain's QEMU: all its threads to SCHED_IDLE once started
                subprocess.run(["chrt", "--idle", "--all-tasks", "--pid", "0", str(self.proc.pid)],
                               capture_output=True)
            if self.run.cpus:
                subprocess.run(["taskset", "--all-tasks", "--pid", "--cpu-list", self.run.cpus,
                                str(self.proc.pid)], capture_output=True)
        else:
            # SCHED_IDLE (chrt, util-linux): the VM gets only CPU time nothing else wants;
            # taskset: only on these CPUs.
            argv = ["chrt", "--idle", "0", *self.argv] if self.run.idle else self.argv
            if self.run.cpus:
                argv = ["taskset", "--cpu-list", self.run.cpus, *argv]
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         umask=private.CHILD_UMASK, pass_fds=self.run.pass_fds)
        deadline = time.monotonic() + timeout
        qmp_path = self.run.rundir / "qmp.sock"
        while True:
            if self.proc.poll() is not None:
                raise TandemError(f"QEMU exited at start (status {self.proc.returncode}): {self.log_tail()}")
            if qmp_path.exists():
                try:
                    self.qmp = QEMUMonitorProtocol(str(qmp_path))
                    self.qmp.connect()
                    break
                except (OSError, ConnectError):
                    self.qmp = None
            if time.monotonic() > deadline:
                self.kill()
                raise TandemError(f"QEMU did not open QMP within {timeout:.0f}s: {self.log_tail()}")
            time.sleep(0.02)
        if self.run.mode not in ("replay", "analysis"):
            self.serial = Serial(self.run.rundir / "serial.sock")
        return self

    def _monitor(self) -> QEMUMonitorProtocol:
        """QMP, once start() has connected it."""
        if self.qmp is None:
            raise TandemError(f"{self.name}: QEMU's QMP is not connected (the VM was not started)")
        return self.qmp

    def process(self) -> subprocess.Popen[bytes]:
        """The QEMU process, once start() has started it."""
        if self.proc is None:
            raise TandemError(f"{self.name}: QEMU was not started")
        return self.proc

    def log_tail(self, n: int = 400) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip()
        except OSError:
            return ""
        return " | ".join(text[-n:].splitlines())

    def vm_status(self, props=("vm-clock-ns", "icount", "events")) -> dict:
        """VM clock (ns), instruction count and device log records (pcapng EPBs) so far, from the devlog."""
        out = {}
        for prop in props:
            try:
                out[prop] = self._monitor().command("qom-get", path="/objects/devlog", property=prop)
            except QMP_GONE as e:
                log.debug("devlog %s: no answer from QEMU (%s: %s)", prop, type(e).__name__, e)
                return out
        return out

    def poll_events(self) -> None:
        """Drain QMP events; remember why the guest stopped (guest-shutdown, guest-reset, ...)."""
        try:
            for ev in self._monitor().get_events(wait=False):
                if ev.get("event") == "SHUTDOWN" and self.shutdown_reason is None:
                    self.shutdown_reason = ev.get("data", {}).get("reason")
        except QMP_GONE as e:   # QEMU is gone; what was received is kept
            log.debug("QMP events: QEMU gone (%s: %s)", type(e).__name__, e)

    def status(self) -> str:
        try:
            reply = self._monitor().command("query-status")
        except QMP_GONE as e:
            log.debug("query-status: QEMU gone (%s: %s)", type(e).__name__, e)
            return "gone"
        if not isinstance(reply, dict) or not isinstance(reply.get("status"), str):
            raise TandemError(f"{self.name}: query-status answered {str(reply)[:80]!r}, not a status")
        return reply["status"]

    def cpu_seconds(self) -> float | None:
        """CPU time QEMU has used so far (procfs), None once it is gone."""
        return cpu_seconds(self.proc.pid) if self.proc else None

    def feed_counters(self) -> str:
        """The input feed's counters (qemu-patches/0006), for diagnosing a stuck analysis
        VM: QMP may be as stuck as the feed, so it is asked with a 2 s deadline."""
        qmp = self._monitor()
        qmp.settimeout(2.0)
        out = []
        for prop in ("horizon", "waits", "delivered", "late"):
            try:
                out.append(f"{prop}={qmp.command('qom-get', path='/objects/feed', property=prop)}")
            except QMP_GONE as e:
                out.append(f"{prop}=? ({type(e).__name__})")
        return "feed " + " ".join(out)

    def quit(self) -> None:
        """Ask QEMU to quit; in record mode this is recorded as a shutdown."""
        try:
            self._monitor().command("quit")
        except QMP_GONE as e:   # already quitting or gone: the same end
            log.debug("quit: QEMU gone (%s: %s)", type(e).__name__, e)

    def wait(self, timeout: float | None = None) -> int:
        try:
            return self.process().wait(timeout)
        except subprocess.TimeoutExpired:
            raise TandemError(f"QEMU still running after {timeout:.0f}s") from None

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        if self.serial:
            self.serial.close()
        if self.qmp:
            try:
                self.qmp.close()
            except QMP_GONE as e:
                log.debug("QMP close: %s: %s", type(e).__name__, e)
        self.kill()
        if self.launcher is not None and self.proc is not None:
            self.launcher.release(self.proc)
        if hasattr(self, "_log"):
            self._log.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

