"""One QEMU process: launch the patched QEMU for a Guest and a Run (machine/) with the
command line qemu/argv.py composes, and talk to it (QMP, serial console, procfs).

Its seams, declared as Protocols so that mypy holds each side to them: `Launcher` (who
starts the QEMU when tandem does not: libvirt/launcher.Launcher), the `Process` a
launcher hands back, and `AnalysisVM` (what an analysis run's driver asks of its QEMU,
semantic/driving/driver.py; tests/unit/scripted_feed.py's ScriptedVM stands in for it).
A VM follows tandem's lifecycle (lifecycle.py): start(), close(), `with`."""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import BinaryIO, Callable, Protocol

from qemu.qmp import ConnectError, QMPError
from qemu.qmp.legacy import QEMUMonitorProtocol

from .. import private
from ..errors import BootError, InfraError
from ..lifecycle import Lifecycle
from ..machine import Guest, LibvirtSection, Run
from .argv import qemu_argv

log = logging.getLogger(__name__)

# What a QMP exchange raises when QEMU has gone or is going (qemu.qmp's errors, a closed
# socket, an event-loop read cut short): callers that ask in passing (a status, a
# counter, a quit) take it as "gone" and log the cause; nothing else is caught.
QMP_GONE = (QMPError, OSError, EOFError, asyncio.TimeoutError)

GUEST_PORT = 7000          # the demo service inside the guest
ICOUNT_SHIFT = 2           # fixed: record and replay must use the same shift


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


class Serial:
    """The guest's serial console over QEMU's socket chardev: read lines, type lines."""

    def __init__(self, path: Path):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(str(path))
        self.buf = bytearray()
        self.cond = threading.Condition()
        self.closed = False
        self.listeners: list[Callable[[bytes], None]] = []     # each gets the output as it comes
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
                listeners = list(self.listeners)
            if not data:
                return
            for listener in listeners:
                listener(data)

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
                    raise BootError(f"guest console: no {text.decode()!r} within {timeout:.0f}s"
                                    f"{' (console closed)' if self.closed else ''}; last output: {tail!r}")
                self.cond.wait(left)

    def type(self, line: str) -> None:
        self.write(line.encode() + b"\n")

    def write(self, data: bytes) -> None:
        """Bytes to the guest's serial port as they are (a user's keystrokes)."""
        self.sock.sendall(data)

    def add_listener(self, fn: Callable[[bytes], None]) -> None:
        """fn(data) with each piece of output from now on, in the reader's thread."""
        with self.cond:
            self.listeners.append(fn)

    def remove_listener(self, fn: Callable[[bytes], None]) -> None:
        with self.cond:
            if fn in self.listeners:
                self.listeners.remove(fn)

    def output(self) -> bytes:
        with self.cond:
            return bytes(self.buf)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class QMPUnavailable(InfraError):
    """QEMU's QMP socket did not answer in time, or QEMU went away while tandem waited."""


def qmp_connect(path: Path, timeout: float, *, alive: Callable[[], bool] = lambda: True,
                poll_s: float = 0.02) -> QEMUMonitorProtocol:
    """A QMP client connected to the socket at `path`, tried until QEMU answers: QEMU makes
    the socket some time after it starts (tens of ms; seconds for a domain libvirt
    starts). QMPUnavailable after `timeout` seconds, or as soon as `alive()` says the QEMU
    is gone."""
    try:   # qemu.qmp's sync wrapper needs an asyncio loop in this thread
        asyncio.get_event_loop()
    except RuntimeError:
        asyncio.set_event_loop(asyncio.new_event_loop())
    deadline = time.monotonic() + timeout
    while True:
        if not alive():
            raise QMPUnavailable(f"{path}: QEMU exited before its QMP answered")
        if path.exists():
            client = QEMUMonitorProtocol(str(path))
            try:
                client.connect()
                return client
            except (OSError, ConnectError) as e:
                log.debug("QMP %s: not yet (%s: %s)", path, type(e).__name__, e)
        if time.monotonic() > deadline:
            raise QMPUnavailable(f"{path}: no QMP answer within {timeout:g}s")
        time.sleep(poll_s)


class Process(Protocol):
    """A VM's QEMU process: what VM uses of subprocess.Popen (a launcher's handle offers
    the same: libvirt/launcher.DomainProcess). wait(timeout) raises
    subprocess.TimeoutExpired when the process is still running after timeout."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


class Launcher(Protocol):
    """Starts a VM's QEMU some other way than as tandem's child process
    (libvirt/launcher.Launcher: as a libvirt domain). tandem's QMP and serial sockets are
    in vm.argv, so once started the VM talks to its QEMU as to a child's."""

    def section(self) -> LibvirtSection:
        """What the launcher adds that the guest sees, for the manifest's machine section."""
        ...

    def start(self, vm: VM, log: BinaryIO) -> Process:
        """Run vm.argv; QEMU's output is in `log` by the time it has exited."""
        ...

    def release(self) -> None:
        """Drop what start() made (the domain), the QEMU ended first if it still runs;
        called by VM.close(), also after a failed start or none."""
        ...


class AnalysisVM(Protocol):
    """What an analysis run's driver (semantic/driving/driver.AnalysisDriver) asks of its
    QEMU: VM below, or a scripted stand-in (tests/unit/scripted_feed.ScriptedVM)."""

    def kill(self) -> None: ...

    def quit(self) -> None: ...

    def powerdown(self) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def log_tail(self, n: int = 400) -> str: ...

    def status(self) -> str: ...

    def feed_counters(self) -> str: ...

    def cpu_seconds(self) -> float | None: ...


# SCHED_IDLE alone does not keep a QEMU off the native's CPU time: the scheduler shares a
# CPU between task groups before it looks at the tasks in them, and a QEMU in a session of
# its own (start_new_session; libvirt's daemonized QEMU) is a group of its own under
# Linux's autogroup (CONFIG_SCHED_AUTOGROUP, on in Debian's kernels), which got a group's
# equal share however idle its threads. So an idle VM goes into a cgroup marked idle
# (cpu.idle, Linux 5.15: the group itself is SCHED_IDLE against its siblings), or, where
# tandem cannot make one, its autogroup gets nice 19 (weight 15 against 1024).
# bench/device_mode.py --shadows 1,2 (docs/benchmarks.md) measures what is left.
# TANDEM_IDLE_GROUP=0 leaves that out (SCHED_IDLE threads only): for a host where several
# runs share the CPUs and one run's analyses must not wait on another's natives, as the
# test suite's two workers do (tests/conftest.py).
IDLE_CGROUP = "tandem-idle"
IDLE_AUTOGROUP_NICE = 19
IDLE_GROUP_SETTING = "TANDEM_IDLE_GROUP"


def _idle_groups() -> bool:
    return os.environ.get(IDLE_GROUP_SETTING, "1") != "0"


def _cpu_cgroup_root() -> Path | None:
    """The root of the hierarchy the cpu controller is in: a cgroup v1 mount with the cpu
    option, or the cgroup2 mount whose root offers cpu; None if neither is mounted."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        pre, _, post = line.partition(" - ")
        fields, rest = pre.split(), post.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        mount = Path(fields[4])
        if rest[0] == "cgroup" and "cpu" in rest[2].split(","):
            return mount
        try:
            if rest[0] == "cgroup2" and "cpu" in (mount / "cgroup.subtree_control").read_text().split():
                return mount
        except OSError:
            continue
    return None


def _idle_group(group: Path) -> Path:
    """The idle cgroup, made if missing and marked idle (OSError where tandem cannot)."""
    group.mkdir(exist_ok=True)
    (group / "cpu.idle").write_text("1\n")
    return group


def make_idle(pid: int) -> str:
    """Process pid (all its threads) off the CPU time of everything not idle: into the
    idle cgroup, else its autogroup reniced; how ('cgroup', 'autogroup' or 'none': also
    under TANDEM_IDLE_GROUP=0)."""
    if not _idle_groups():
        return "none"
    root = _cpu_cgroup_root()
    if root is not None:
        group = root / IDLE_CGROUP
        try:
            _idle_group(group).joinpath("cgroup.procs").write_text(f"{pid}\n")
            return "cgroup"
        except OSError as e:
            log.debug("pid %d: not into cgroup %s: %s", pid, group, e)
    try:
        Path(f"/proc/{pid}/autogroup").write_text(f"{IDLE_AUTOGROUP_NICE}\n")
        return "autogroup"
    except OSError as e:
        log.debug("pid %d: its autogroup not reniced: %s", pid, e)
        return "none"


def make_thread_idle() -> bool:
    """The calling thread into the idle cgroup (cgroup v1, which moves single threads:
    tandem's own analysis work, beside threads that are not idle); True if it went."""
    if not _idle_groups():
        return False
    root = _cpu_cgroup_root()
    if root is None or not (root / "tasks").exists():     # "tasks": v1's per-thread file
        return False
    group = root / IDLE_CGROUP
    try:
        _idle_group(group).joinpath("tasks").write_text(f"{threading.get_native_id()}\n")
        return True
    except OSError as e:
        log.debug("thread %d: not into cgroup %s: %s", threading.get_native_id(), group, e)
        return False


def drop_idle_cgroup() -> None:
    """The idle cgroup removed once no process is left in it (another idle VM's keeps it)."""
    root = _cpu_cgroup_root()
    if root is not None:
        try:
            (root / IDLE_CGROUP).rmdir()
        except OSError:
            pass


class VM(Lifecycle):
    """A running QEMU: process, QMP connection, optional serial console.

    launcher: start the QEMU some other way than as tandem's child process (a Launcher:
    as a libvirt domain); close() has it release what it made. argv: QEMU's command line
    when not qemu_argv's of (guest, run) (the replay of a domain's own:
    libvirt/command_line.py).
    """

    def __init__(self, guest: Guest, run: Run, launcher: Launcher | None = None, name: str | None = None,
                 argv: list[str] | None = None):
        self.guest, self.run, self.launcher = guest, run, launcher
        self.name = name or run.mode        # for messages: "native", an analysis, "replay"
        # The guest's console so far, for a failure's report: the serial socket's when
        # tandem types on it; an analysis's driver sets its own (the feed carries it).
        self.console = lambda: self.serial.output() if self.serial else b""
        # QEMU's QMP and serial sockets go here: 0700 even when the caller made it.
        private.make_dir(run.rundir)
        os.chmod(run.rundir, private.DIR_MODE)
        self.argv = argv or qemu_argv(guest, run)
        self.log_path = run.rundir / "qemu.log"
        self.proc: Process | None = None
        self.qmp: QEMUMonitorProtocol | None = None
        self.serial: Serial | None = None
        self.shutdown_reason: str | None = None   # from QEMU's SHUTDOWN event
        self._log: BinaryIO | None = None         # QEMU's output (log_path), from start() on
        self._closed = False

    @property
    def started(self) -> bool:
        return self._log is not None

    def start(self, timeout: float = 30.0) -> VM:
        """Launch QEMU and connect QMP (and the serial console, but for replay and
        analysis runs); a QEMU that exits or stays silent for `timeout` s is an error."""
        for stale in ("qmp.sock", "serial.sock"):
            (self.run.rundir / stale).unlink(missing_ok=True)
        self._log = open(self.log_path, "wb", opener=private.opener)
        if self.launcher is not None:
            if self.run.host.pass_fds:       # libvirt starts the QEMU: it cannot inherit our files
                raise InfraError("a QEMU started by libvirt cannot be given open files (pass_fds)")
            try:
                self.proc = self.launcher.start(self, self._log)
            except BaseException:
                self._log.close()
                raise
            if self.run.host.idle:   # a domain's QEMU: all its threads to SCHED_IDLE once started
                subprocess.run(["chrt", "--idle", "--all-tasks", "--pid", "0", str(self.proc.pid)],
                               capture_output=True)
                make_idle(self.proc.pid)
            if self.run.host.cpus:
                subprocess.run(["taskset", "--all-tasks", "--pid", "--cpu-list", self.run.host.cpus,
                                str(self.proc.pid)], capture_output=True)
        else:
            # SCHED_IDLE (chrt, util-linux): the VM gets only CPU time nothing else wants;
            # taskset: only on these CPUs.
            argv = ["chrt", "--idle", "0", *self.argv] if self.run.host.idle else self.argv
            if self.run.host.cpus:
                argv = ["taskset", "--cpu-list", self.run.host.cpus, *argv]
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         umask=private.CHILD_UMASK, pass_fds=self.run.host.pass_fds)
            if self.run.host.idle:
                make_idle(self.proc.pid)
        proc = self.proc
        try:
            self.qmp = qmp_connect(self.run.rundir / "qmp.sock", timeout, alive=lambda: proc.poll() is None)
        except QMPUnavailable as e:
            if proc.poll() is not None:
                raise InfraError(f"QEMU exited at start (status {proc.returncode}): {self.log_tail()}") from None
            self.kill()
            raise InfraError(f"QEMU did not open QMP within {timeout:.0f}s: {self.log_tail()}") from e
        if self.run.mode not in ("replay", "analysis"):
            self.serial = Serial(self.run.rundir / "serial.sock")
        return self

    def _monitor(self) -> QEMUMonitorProtocol:
        """QMP, once start() has connected it."""
        if self.qmp is None:
            raise InfraError(f"{self.name}: QEMU's QMP is not connected (the VM was not started)")
        return self.qmp

    def process(self) -> Process:
        """The QEMU process, once start() has started it."""
        if self.proc is None:
            raise InfraError(f"{self.name}: QEMU was not started")
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
            raise InfraError(f"{self.name}: query-status answered {str(reply)[:80]!r}, not a status")
        return reply["status"]

    def cpu_seconds(self) -> float | None:
        """CPU time QEMU has used so far (procfs), None once it is gone."""
        return cpu_seconds(self.proc.pid) if self.proc else None

    def feed_counters(self) -> str:
        """The input feed's counters (qemu-patches/0027), for diagnosing a stuck analysis
        VM: QMP may be as stuck as the feed, so it is asked with a 2 s deadline."""
        qmp = self._monitor()
        qmp.settimeout(2.0)
        out = []
        for prop in ("horizon", "waits", "delivered", "late", "rules-fired"):
            try:
                out.append(f"{prop}={qmp.command('qom-get', path='/objects/feed', property=prop)}")
            except QMP_GONE as e:
                out.append(f"{prop}=? ({type(e).__name__})")
        return "feed " + " ".join(out)

    def powerdown(self) -> None:
        """Press the guest's ACPI power button (QMP system_powerdown): a guest that handles
        it (systemd-logind, acpid) shuts down and powers off by itself."""
        try:
            self._monitor().command("system_powerdown")
        except QMP_GONE as e:
            log.debug("system_powerdown: QEMU gone (%s: %s)", type(e).__name__, e)

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
            raise BootError(f"QEMU still running after {timeout:.0f}s") from None

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        """End QEMU (killed if it still runs) and release its sockets, its log and what a
        launcher made; what was read stays readable (console(), log_tail())."""
        if self._closed:
            return
        self._closed = True
        if self.serial:
            self.serial.close()
        if self.qmp:
            try:
                self.qmp.close()
            except QMP_GONE as e:
                log.debug("QMP close: %s: %s", type(e).__name__, e)
        self.kill()
        if self.launcher is not None:
            self.launcher.release()
        if self.run.host.idle:
            drop_idle_cgroup()
        if self._log is not None:
            self._log.close()

