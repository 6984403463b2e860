"""Launch the patched QEMU for a guest and talk to it (QMP, serial console).

One place builds the QEMU command line for every mode (record, replay, plain),
so that record and replay can only differ where they must.
"""
from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from qemu.qmp import ConnectError
from qemu.qmp.legacy import QEMUMonitorProtocol

from . import artifacts, private
from .errors import TandemError

GUEST_PORT = 7000          # the demo service inside the guest
ICOUNT_SHIFT = 2           # fixed: record and replay must use the same shift
DEFAULT_CMDLINE = "console=ttyS0 panic=-1 oops=panic"


def initrd_with_modules(initramfs: str, initramfs_sha256: str, modules: dict) -> str:
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
    """What runs: kernel, initramfs, disk base image, memory."""
    kernel: str
    initrd: str | None             # None: the kernel boots without one
    disk_base: str | None
    memory_mb: int = 256
    cmdline: str = DEFAULT_CMDLINE
    disk_format: str = "raw"       # of disk_base, which every run's qcow2 overlay backs onto
    mac: str | None = None         # the NIC's MAC (None: QEMU's default); the guest sees it

    @classmethod
    def default(cls, flavor: str = "native", userland: str = "native") -> "Guest":
        k, g = artifacts.kernel(flavor), artifacts.guest()
        cmdline = DEFAULT_CMDLINE + (" tandem.asan=1" if userland == "asan" else "")
        if flavor == "kasan":   # report every bug, not only the first one of the boot
            cmdline += " kasan_multi_shot"
        initrd = initrd_with_modules(g[f"initramfs_{userland}"], g[f"initramfs_{userland}_sha256"],
                                     artifacts.modules(flavor))
        return cls(kernel=k["bzImage"], initrd=initrd, disk_base=g["disk_base"], cmdline=cmdline,
                   memory_mb=512 if flavor == "kasan" else 256)


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
    qemu: dict | None = None       # artifacts.qemu() unless given (benchmarks: qemu_stock())
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
    extra: list[str] = field(default_factory=list)

    @property
    def rr_mode(self) -> str | None:
        """record, replay or None: whether and how QEMU's record/replay runs."""
        return self.mode if self.mode in ("record", "replay") else self.rr if self.mode == "analysis" else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) a running process has used so far, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def make_overlay(base: str, overlay: Path, fmt: str = "raw") -> None:
    """A qcow2 overlay so the base image (of format fmt) is never written."""
    img = artifacts.qemu()["img"]
    r = subprocess.run([img, "create", "-q", "-f", "qcow2", "-b", str(Path(base).resolve()),
                        "-F", fmt, str(overlay)], capture_output=True, text=True,
                       umask=private.CHILD_UMASK)      # the overlay holds the guest's disk writes
    if r.returncode:
        raise TandemError(f"{overlay}: qemu-img create failed: {r.stderr.strip()}")


def qemu_argv(guest: Guest, run: Run) -> list[str]:
    q = run.qemu or artifacts.qemu()
    argv = [q["binary"], "-L", q["firmware_dir"], "-M", "pc", "-m", str(guest.memory_mb),
            "-smp", "1", "-nodefaults", "-no-user-config", "-display", "none",
            "-no-reboot", "-accel", "tcg",
            "-kernel", guest.kernel, *(["-initrd", guest.initrd] if guest.initrd else []),
            "-append", guest.cmdline, "-qmp", f"unix:{run.rundir}/qmp.sock,server=on,wait=off"]
    rr = run.rr_mode
    if rr == "record":
        rr_opts = f",rr=record,rrfile={run.rrfile}"
    elif rr == "replay":
        # The VM clock's idle warps come from the log, so the replay need not
        # wait them out: rrskipidle=on (qemu-patches/0004) stops the main loop
        # sleeping while the replay waits on it.
        rr_opts = f",rr=replay,rrfile={run.rrfile}"
        rr_opts += "" if q.get("stock") else ",rrskipidle=on"
        rr_opts += ",rrfollow=on" if run.follow else ""
        rr_opts += ",rrpartial=on" if run.partial else ""
    else:
        rr_opts = ""
    if run.mode in ("record", "replay"):
        # sleep stays on in replay to match the recording's warp accounting.
        argv += ["-icount", f"shift={ICOUNT_SHIFT},sleep=on{rr_opts}"]
    elif run.mode == "analysis":
        # sleep=off: an idle analysis guest warps straight to its next input. The RTC
        # runs on the VM clock from the recording's start time: a host-clock RTC
        # would interrupt the guest at host-dependent VM times.
        argv += ["-icount", f"shift={ICOUNT_SHIFT},sleep=off{rr_opts}",
                 "-rtc", f"base={run.rtc_base},clock=vm"]
    elif run.icount:
        argv += ["-icount", f"shift={ICOUNT_SHIFT},sleep=on"]

    # Serial console: a socket while live, nothing in replay (input comes from the log)
    # or in analysis (the feed carries both directions).
    if run.mode in ("replay", "analysis"):
        argv += ["-chardev", "null,id=serial0"]
    else:
        argv += ["-chardev", f"socket,id=serial0,path={run.rundir}/serial.sock,server=on,wait=off"]
    argv += ["-serial", "chardev:serial0"]

    if guest.disk_base:
        overlay = run.overlay
        argv += ["-drive", f"file={overlay},if=none,id=disk0-img,format=qcow2"]
        if rr:   # block completions must be ordered by the replay log
            argv += ["-drive", "driver=blkreplay,if=none,image=disk0-img,id=disk0"]
        else:
            argv[-1] = argv[-1].replace("id=disk0-img", "id=disk0")
        # Analysis VMs: ioeventfd=off runs a queue kick in the vCPU thread, at the
        # instruction that made it; with an eventfd the main loop takes it later,
        # at a host-dependent VM time.
        argv += ["-device", "virtio-blk-pci,drive=disk0" + (",ioeventfd=off" if run.mode == "analysis" else "")]

    if run.mode == "analysis":
        # The feed (qemu-patches/0006) is the network, the serial input and the entropy:
        # the NIC's backend is an unconnected hub port whose frames filter-feed replaces.
        # A recorded analysis run replays without its controller: the feed's inputs
        # are in the log (qemu-patches/0011).
        feed = f"feed,id=feed,serial=serial0,lookahead={run.feed_lookahead_ns}"
        if rr != "replay":
            argv += ["-chardev", f"socket,id=feedsock,path={run.feed_socket}"]
            feed += ",chardev=feedsock"
        # tx=timer: transmit from a VM-clock timer, not a main-loop bottom half,
        # so the guest's frames leave at the same VM time in every run.
        argv += ["-netdev", "hubport,id=net0,hubid=0",
                 "-device", "virtio-net-pci,netdev=net0,romfile=,tx=timer,ioeventfd=off",
                 "-object", "rng-feed,id=rng0,feed=feed", "-device", "virtio-rng-pci,rng=rng0,ioeventfd=off",
                 "-object", feed,
                 "-object", "filter-feed,id=feed-net0,netdev=net0,feed=feed,position=head"]
    else:
        fwd = f",hostfwd=tcp:127.0.0.1:{run.hostfwd_port}-:{GUEST_PORT}" if run.hostfwd_port else ""
        argv += ["-netdev", f"user,id=net0{fwd}", "-device", "virtio-net-pci,netdev=net0,romfile=",
                 "-object", "rng-builtin,id=rng0", "-device", "virtio-rng-pci,rng=rng0"]
    if guest.mac:
        i = next(i for i, a in enumerate(argv) if a.startswith("virtio-net-pci,"))
        argv[i] += f",mac={guest.mac}"
    if run.mode in ("record", "replay"):   # analysis runs: the feed is logged instead
        argv += ["-object", "filter-replay,id=rr-net0,netdev=net0"]
    if run.gate_socket:
        # The guest's outgoing frames wait for tandem (release policy "agreed"), and its
        # incoming ones while tandem holds them (overflow policy "block"). At the head of
        # the list: on the way out it comes after the device log, which stamps each frame
        # when the guest sent it; on the way in before filter-replay and the device log,
        # so a held frame is recorded when the guest gets it.
        outputs = "" if run.gate_outputs else ",outputs=off"
        argv += ["-chardev", f"socket,id=gatesock,path={run.gate_socket}",
                 "-object", (f"filter-gate,id=gate0,netdev=net0,queue=all,chardev=gatesock,"
                            f"position=head,overflow={run.gate_overflow}{outputs}")]
    if run.devlog:
        dl = f"devlog,id=devlog,path={run.devlog},chardev=serial0,rng=rng0"
        dl += ",drive=disk0" if guest.disk_base else ""
        dl += f",stop-after={run.stop_after_ns}" if run.stop_after_ns else ""
        # A recording's log says how far the VM clock has got every 100 ms: a live
        # shadow follows it without asking the native over QMP.
        dl += ",clock-marks=on" if run.mode == "record" else ""
        argv += ["-object", dl,
                 "-object", "filter-devlog,id=devlog-net0,netdev=net0,devlog=devlog,position=tail"]
    return argv + run.extra


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

    def __init__(self, guest: Guest, run: Run, launcher=None):
        self.guest, self.run, self.launcher = guest, run, launcher
        # QEMU's QMP and serial sockets go here: 0700 even when the caller made it.
        private.make_dir(run.rundir)
        os.chmod(run.rundir, private.DIR_MODE)
        self.argv = qemu_argv(guest, run)
        self.log_path = run.rundir / "qemu.log"
        self.proc: subprocess.Popen | None = None
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
                                         umask=private.CHILD_UMASK)
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
                out[prop] = self.qmp.command("qom-get", path="/objects/devlog", property=prop)
            except Exception:
                return out
        return out

    def poll_events(self) -> None:
        """Drain QMP events; remember why the guest stopped (guest-shutdown, guest-reset, ...)."""
        try:
            for ev in self.qmp.get_events(wait=False):
                if ev.get("event") == "SHUTDOWN" and self.shutdown_reason is None:
                    self.shutdown_reason = ev.get("data", {}).get("reason")
        except Exception:
            pass   # QEMU is gone; what was received is kept

    def status(self) -> str:
        try:
            return self.qmp.command("query-status")["status"]
        except Exception:
            return "gone"

    def quit(self) -> None:
        """Ask QEMU to quit; in record mode this is recorded as a shutdown."""
        try:
            self.qmp.command("quit")
        except Exception:
            pass

    def wait(self, timeout: float | None = None) -> int:
        try:
            return self.proc.wait(timeout)
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
            except Exception:
                pass
        self.kill()
        if self.launcher is not None and self.proc is not None:
            self.launcher.release(self.proc)
        if hasattr(self, "_log"):
            self._log.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

