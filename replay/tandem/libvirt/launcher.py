"""tandem's own VMs started as libvirt domains: `Launcher` is qemu.vm.VM's launcher
(qemu.vm.Launcher) for a libvirt domain (define, start, the QEMU's pid, end and log as a child process's,
undefine at the end); live/attach.py's `LiveDomains` gives one to the native and to each
analysis of a live shadow run (`tandem shadow --libvirt`, `tandem attach`).
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO
from uuid import uuid4

from ..errors import InfraError, TandemError
from ..machine import LibvirtSection, OwnLine
from ..qemu import vm
from ..qemu.argv import qmp_chardev
from ..qemu.vm import VM, alive
from .command_line import native_argv
from .daemon import binding, connect
from .domain import SHADOW_SUFFIX, domain_xml

if TYPE_CHECKING:     # libvirt-python has no type information: these names say what is held
    import libvirt

    from .recorded import OwnCommandLine

# How a domain's QEMU ended, as libvirt tells it, in subprocess terms (returncode).
# SHUTDOWN: QEMU said SHUTDOWN first (guest poweroff, tandem's QMP quit) and exited.
# DESTROYED: `virsh destroy`; libvirt sends SIGTERM, which QEMU takes as a clean
# shutdown (exit 0); if libvirt had to SIGKILL it after its grace period, the device
# log is not closed cleanly and the recording's seal says so. CRASHED: QEMU died
# without a shutdown (SIGKILL, a crash).
SHUTOFF_STATUS = {1: 0, 2: 0, 3: -signal.SIGKILL}      # VIR_DOMAIN_SHUTOFF_{SHUTDOWN,DESTROYED,CRASHED}
GONE_WAIT_S = 10.0     # QEMU's process is gone but libvirt still says running: wait this long


def _qemu_pid(needle: bytes, timeout: float = 10.0) -> int | None:
    """The pid of the local process whose command line holds needle (tandem's QMP socket)."""
    deadline = time.monotonic() + timeout
    while True:
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    if needle in (p / "cmdline").read_bytes():
                        return int(p.name)
                except OSError:
                    pass
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


class DomainProcess:
    """A domain's QEMU as vm.VM sees a child process (qemu.vm.Process).

    The QEMU is libvirt's child, not tandem's: it is found by tandem's QMP socket in its
    command line (so libvirtd must be on this host, as tandem's sockets are), its end is
    its pid going away, and how it ended is libvirt's shutoff reason. Its output is
    libvirt's per-domain log; this run's part of it is copied into vm.VM's log when it ends.
    """

    def __init__(self, dom, name: str, rundir: Path, log: BinaryIO):
        self.dom, self.name, self.log = dom, name, log
        self.returncode: int | None = None
        self._gone_at: float | None = None
        pid = _qemu_pid(b"\0" + qmp_chardev(rundir).encode() + b"\0")
        if pid is None:
            raise InfraError(f"domain {name}: started, but its QEMU is not a process on this host "
                             f"(tandem needs a local libvirtd: its QMP and serial sockets are in {rundir})")
        self.pid = pid
        # The main thread ends the run (kill, close) while a live shadow's follow thread
        # (tandem-follow) polls the native: copy_log and close take turns on the log.
        self._lock = threading.Lock()
        self._src: BinaryIO | None
        try:        # the log as the QEMU's mount namespace names it (a private libvirtd has its own /var)
            self._src = open(f"/proc/{pid}/root/var/log/libvirt/qemu/{name}.log", "rb")
        except OSError:
            self._src = None

    def argv(self) -> list[str]:
        """The QEMU's command line."""
        try:
            raw = Path(f"/proc/{self.pid}/cmdline").read_bytes()
        except OSError as e:
            raise InfraError(f"domain {self.name}: its QEMU's command line: {e.strerror}") from None
        return [a.decode("utf-8", "surrogateescape") for a in raw.split(b"\0")[:-1]]

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        if alive(self.pid):
            return None
        libvirt = binding()
        try:
            state, reason = self.dom.state()
        except libvirt.libvirtError:
            state, reason = libvirt.VIR_DOMAIN_SHUTOFF, 0
        if state != libvirt.VIR_DOMAIN_SHUTOFF:
            now = time.monotonic()
            self._gone_at = self._gone_at or now
            if now - self._gone_at < GONE_WAIT_S:
                return None         # libvirt has not seen it end yet
        code = SHUTOFF_STATUS.get(reason, 1)
        self.copy_log()             # first: a thread that sees the returncode has the log
        self.returncode = code
        return code

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if timeout is not None and deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.name, timeout)
            time.sleep(0.05)
        return code

    def kill(self) -> None:
        """SIGKILL, as Popen.kill (a stopped or hung QEMU too); libvirt sees it crash."""
        if self.poll() is not None:
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.wait(GONE_WAIT_S + 5)
        except subprocess.TimeoutExpired:
            try:
                self.dom.destroy()
            except binding().libvirtError:
                pass

    def copy_log(self) -> None:
        """This run's part of libvirt's domain log (it appends every start) into vm.VM's log."""
        with self._lock:
            if self._src is None or self.log.closed:
                return
            self._src.seek(0)
            text = self._src.read()
            start = text.rfind(b": starting up libvirt")
            start = text.rfind(b"\n", 0, start) + 1 if start >= 0 else 0
            try:
                self.log.seek(0)
                self.log.truncate()
                self.log.write(text[start:])
                self.log.flush()
            except ValueError:
                # vm.VM.close() closed the log meanwhile (it is not ours to lock): the
                # main thread's own poll (kill) has copied it, as poll sets the returncode
                # only after the copy.
                return

    def close(self) -> None:
        with self._lock:
            if self._src:
                self._src.close()
                self._src = None


class Launcher(vm.Launcher):
    """Starts one tandem VM as a libvirt domain (the seam qemu.vm.Launcher, declared as its
    base so that mypy holds it to it): domain_xml of the VM's exact argv, defined and
    started; tandem's own QMP and serial sockets are passed through, so the rest of
    tandem talks to it as to a child QEMU.

    uuid: the domain's (guest-visible) SMBIOS UUID; it goes into the run's manifest
    (section()) so its recording replays exactly outside libvirt (machine.replay_args).
    metadata(vm): tandem's <metadata> element (what detach removes if tandem dies).
    restore: a domain definition release() puts back (tandem attach: the native's own)
    instead of undefining the domain.
    own: a user's domain on libvirt's own command line (recorded.OwnCommandLine): its
    definition for the run instead of domain_xml of the VM's argv; it is started paused
    and runs once `own` has read what the manifest keeps of its QEMU's command line.
    """

    def __init__(self, uri: str | None, name: str, *, uuid: str | None = None, metadata=None,
                 title: str | None = None, restore: str | None = None, own: OwnCommandLine | None = None):
        self.uri, self.name, self.title = uri, name, title
        self.uuid = uuid or str(uuid4())
        self.metadata = metadata
        self.restore = restore
        self.own = own
        self.own_line: OwnLine | None = None    # what own read of the started QEMU's command line
        self.conn: libvirt.virConnect | None = None
        self.dom: libvirt.virDomain | None = None
        self.proc: DomainProcess | None = None

    def section(self) -> LibvirtSection:
        """The manifest's machine.libvirt of a run in this domain."""
        return LibvirtSection(uuid=self.uuid, domain=self.name, command_line="libvirt" if self.own else None,
                              own=self.own_line)

    def start(self, vm: VM, log: BinaryIO) -> DomainProcess:
        libvirt = binding()
        conn = self.conn = connect(self.uri)
        metadata = self.metadata(vm) if self.metadata else None
        try:
            xml = self.own.xml(vm, metadata, lambda x: native_argv(conn.domainXMLToNative("qemu-argv", x, 0))) \
                if self.own else domain_xml(self.name, vm.guest, vm.run, argv=vm.argv, uuid=self.uuid,
                                            title=self.title, metadata=metadata)
            if self.restore is None and self.name in {d.name() for d in conn.listAllDomains()}:
                raise TandemError(f"domain {self.name}: already defined in libvirt "
                                  f"(tandem detach {self.name.split(SHADOW_SUFFIX)[0]}, or virsh undefine)")
            dom = self.dom = conn.defineXML(xml)
            dom.createWithFlags(libvirt.VIR_DOMAIN_START_PAUSED if self.own else 0)
            self.proc = DomainProcess(dom, self.name, vm.run.rundir, log)
            if self.own:
                self.own_line = self.own.started(self.proc.argv())
                dom.resume()
            return self.proc
        except BaseException as e:
            self._drop()
            if isinstance(e, libvirt.libvirtError):
                raise InfraError(f"domain {self.name}: {' '.join(e.get_error_message().split())}") from None
            raise

    def release(self) -> None:
        """After the QEMU has ended (it is killed if not): its log copied, the domain
        undefined (or its own definition put back). Nothing to do after a failed start,
        or a second time."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.copy_log()
            proc.close()
        self._drop()

    def _drop(self) -> None:
        if self.conn is None:
            return
        libvirt = binding()
        try:
            if self.dom is not None:
                if self.dom.isActive():
                    self.dom.destroy()
                if self.restore is not None:
                    self.conn.defineXML(self.restore)
                else:
                    self.dom.undefine()
        except libvirt.libvirtError as e:
            if e.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:    # gone already (tandem detach)
                raise InfraError(f"domain {self.name}: {e.get_error_message()}") from None
        finally:
            self.dom = None
            self.conn.close()
            self.conn = None
