"""Record a guest: boot it under rr=record with the device tap (exact mode), or with the
device tap alone (device mode: any vCPU count, any accelerator), and write a bundle.

The caller (CLI, demo, tests) drives traffic through `Recording.port` and the
serial console while the recording runs; the bundle is readable up to its last
complete segment at any time, and finished with a manifest at the end.
"""
from __future__ import annotations

import dataclasses
import logging
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from enum import StrEnum
from pathlib import Path

from .. import catalog, private
from ..errors import BootError, InfraError, TandemError
from ..formats import bundle, sealing
from ..formats.bundle import OVERLAY, Manifest
from ..formats.manifest import DeclaredPack
from . import forwards as forward_watch
from .console import ConsoleServer
from ..machine import RR, Forward, Gate, Guest, MachineSection, NetSection, RRMode, Run, UserNet, overlay_path
from ..qemu.argv import GUEST_PORT
from ..qemu.vm import VM, Launcher, Serial, free_port
from ..qemu.image import make_overlays

log = logging.getLogger(__name__)


def overlay_name(disk_id: str) -> str:
    """The bundle's overlay of a disk: the recording's writes to it (its base is never written)."""
    return overlay_path(Path(OVERLAY), disk_id).name


def start_bundle(path: Path, guest: Guest, machine: MachineSection, assertions: DeclaredPack | None = None) -> Manifest:
    """A new bundle at path with its disks' overlays, and its manifest in state
    'recording' (formats.sealing.start)."""
    return sealing.start(path, guest, machine, assertions, then=lambda: make_overlays(guest, path / OVERLAY))


def check_host_ports(forwards: tuple[Forward, ...]) -> None:
    """Each forward's host port is free now, or a one-line error naming the forward (QEMU
    would only say that a hostfwd rule failed, after the bundle was made)."""
    for f in forwards:
        kind = socket.SOCK_STREAM if f.protocol == "tcp" else socket.SOCK_DGRAM
        with socket.socket(socket.AF_INET, kind) as s:
            try:
                s.bind((f.host_addr, f.host_port))
            except OSError as e:
                raise TandemError(f"forward {f}: host port {f.host_addr}:{f.host_port} is taken "
                                  f"({e.strerror}); choose another") from None


# What a stop request (Ctrl-C, SIGTERM) does: press the power button first, or quit.
STOP_POLICIES = ("powerdown", "quit")
# Wall seconds the first Ctrl-C waits for a guest to power off after its power button
# (--shutdown-timeout): room for a systemd guest to stop its services under TCG; a guest
# that ignores the button (no ACPI, no handler) is quit once it has passed.
POWERDOWN_WAIT_S = 60.0
# VM time between the device log's state checkpoints (every vCPU's registers, gdb's set:
# 682 bytes a checkpoint on x86-64 with one vCPU, 760 with the record's framing), the
# window `tandem replay --locate` bounds a departure to when no input differs. At 10 ms
# they made a 13 s demo recording's device log 1.1 MB, 23 times its replay log; at 100 ms
# they add about 7.6 KB a second of busy VM time (27 MB an hour), and none while a vCPU
# stays halted (an unchanged checkpoint is left out).
STATE_EVERY_NS = 100_000_000
# Wall seconds between the CLI's progress lines while it records: each asks QEMU three
# qom-gets, which its main loop answers under the BQL the vCPUs also take. At five a
# second, running `tandem record`'s process against stopping it raised a 2-vCPU native's
# run-queue wait per request under wrk 1.164x (95% interval 1.037-1.316x); at one a
# second 0.997x (0.886-1.081x) in a run of the same 30 pairs and 1.072x (0.984-1.217x)
# in one of 40 (bench/device_mode.py --slices, docs/benchmarks.md).
PROGRESS_S = 1.0


class RecordMode(StrEnum):
    """How a native is recorded (`--mode`)."""
    EXACT = "exact"     # QEMU's record/replay under -icount, TCG's vCPUs in turns: replayed exactly, every output verified
    DEVICE = "device"   # the device log alone: no -icount, any vCPUs, multi-threaded TCG or KVM; replayed semantically


def record_mode(mode: str, guest: Guest) -> RecordMode:
    """`mode` as a RecordMode; a one-line error when it is none, or `guest` cannot be
    recorded in it (before any bundle is made)."""
    try:
        mode = RecordMode(mode)
    except ValueError:
        raise TandemError(f"--mode {mode!r}: not one of {', '.join(RecordMode)}") from None
    if mode == RecordMode.EXACT and guest.accel != "tcg":
        raise TandemError(f"accelerator {guest.accel}: exact mode needs TCG's -icount; record with --mode device")
    return mode


class Recording:
    """One recording in progress, with tandem's lifecycle (lifecycle.py): start(), close(),
    `with`. finish() waits for the guest's own end and seals the bundle (its manifest is
    the result); a `with` block that ends without an error finishes it so, and close()
    stops and seals one still running."""

    def __init__(self, path: str | Path, guest: Guest | None = None, *,
                 duration_ns: int = 0, port: int | None = None, forwards: tuple[Forward, ...] | None = None,
                 gate_socket: Path | None = None, gate_outputs: bool = True, gate_overflow: str = "block",
                 assertions: DeclaredPack | None = None, launcher: Launcher | None = None, stop: str = "powerdown",
                 powerdown_wait_s: float | None = None, state_every_ns: int = STATE_EVERY_NS,
                 mode: RecordMode | str = RecordMode.EXACT):
        """port: the demo guest's service forward (host port to its port 7000); without
        forwards, a free port is chosen for it. forwards: the host ports forwarded to the
        guest (`tandem record --forward`); given (even empty), no demo port is added unless
        port is given too. assertions: a declared assertion pack (path, sha256, names) for
        the manifest; it changes nothing in the recorded run (the checking happens on
        replay). launcher: run the QEMU as a libvirt domain (qemu.vm.Launcher);
        what libvirt adds that the guest sees goes into the manifest's machine.libvirt.
        stop: what a stop request (Ctrl-C) does, as `virsh shutdown` and `virsh destroy`:
        "powerdown" presses the power button and waits powerdown_wait_s for the guest to
        power off, quitting on a second request or when the wait is over; "quit" quits at
        once. state_every_ns: VM time between state checkpoints (0: none; device mode has
        none). mode: exact or device (RecordMode)."""
        if stop not in STOP_POLICIES:
            raise TandemError(f"stop policy {stop!r}: not one of {', '.join(STOP_POLICIES)}")
        if powerdown_wait_s is not None and not 0 < powerdown_wait_s < 1e6:
            raise TandemError(f"--shutdown-timeout {powerdown_wait_s:g}: not a number of seconds above 0")
        self.launcher = launcher
        self.path = Path(path)
        self.assertions = assertions
        self.guest = guest or Guest.default(catalog.ASSERTIONS_KERNEL if assertions else catalog.DEFAULT_KERNEL)
        self.mode = record_mode(mode, self.guest)
        self.duration_ns = duration_ns
        self.state_every_ns = state_every_ns if self.mode == RecordMode.EXACT else 0
        self.forwards = forwards or ()
        self.port = port or (free_port() if forwards is None else None)
        self.gate_socket, self.gate_outputs, self.gate_overflow = gate_socket, gate_outputs, gate_overflow
        self.vm: VM | None = None
        self.stop_reason: str | None = None
        self.stop_policy = stop
        self.powerdown_wait_s = POWERDOWN_WAIT_S if powerdown_wait_s is None else powerdown_wait_s
        self.stop_requests = 0          # request_stop(): from a signal handler, acted on by wait()
        self.button_at: float | None = None     # when a stop request pressed the power button
        self.button_pressed = False             # by powerdown(), for whatever reason
        self._tmp: str | None = None       # the sockets' directory, while recording
        self.console: ConsoleServer | None = None   # the serial console served to users
        self._ended = False                 # finish() has begun, or start() failed: nothing to seal

    def started(self) -> VM:
        """The recording's VM, once start() has made it."""
        if self.vm is None:
            raise InfraError(f"{self.path}: the recording was not started")
        return self.vm

    def start(self) -> "Recording":
        g = self.guest
        net = UserNet(self.port, self.forwards)
        check_host_ports(net.all_forwards(GUEST_PORT))
        device = self.mode == RecordMode.DEVICE
        domain = self.launcher.section() if self.launcher else None
        self.manifest = start_bundle(self.path, g, dataclasses.replace(
            g.section(), stop_after_ns=self.duration_ns, state_every_ns=self.state_every_ns or None,
            mode="device" if device else None, icount_shift=None if device else g.section().icount_shift,
            net=NetSection(backend="libvirt" if domain and domain.command_line else "user",
                           forwards=tuple(str(f) for f in self.all_forwards()),
                           hostfwd_port=self.port or None, guest_port=GUEST_PORT if self.port else None),
            libvirt=domain), self.assertions)
        # Sockets live in a short temp path (unix socket paths are limited to 108 bytes).
        tmp = self._tmp = tempfile.mkdtemp(prefix="tandem-rec-")
        gate = Gate(self.gate_socket, self.gate_outputs, self.gate_overflow) if self.gate_socket else None
        run = Run(Path(tmp), net=net, rr=None if device else RR(RRMode.RECORD, self.path / bundle.STREAM),
                  devlog=self.path / bundle.DEVLOG, overlay=self.path / OVERLAY, icount=not device,
                  stop_after_ns=self.duration_ns, state_every_ns=self.state_every_ns, gate=gate)
        vm = self.vm = VM(g, run, launcher=self.launcher, name="native")
        self.t0 = time.monotonic()
        try:
            vm.start()
        except TandemError:
            # Keep the bundle honest: it exists, holds what QEMU wrote, and says so.
            self._ended = True
            vm.close()
            self.manifest = sealing.interrupted(self.manifest)
            bundle.write_manifest(self.path, self.manifest)
            private.copy_file(vm.log_path, self.path / "qemu.log")
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if self.launcher and (started := self.launcher.section()) != domain:
            # what libvirt's start showed (a domain's own command line, which its replay repeats)
            self.manifest = dataclasses.replace(self.manifest, machine=dataclasses.replace(
                self.manifest.machine, libvirt=started))
            bundle.write_manifest(self.path, self.manifest)
        if vm.serial is not None:       # tandem console BUNDLE, while this runs
            try:
                self.console = ConsoleServer(vm.serial, self.path)
            except (TandemError, OSError) as e:     # the recording goes on without it
                log.warning("%s: its console is not served to tandem console: %s", self.path, e)
        return self

    def all_forwards(self) -> tuple[Forward, ...]:
        """Every host port forwarded to the guest: the demo port's first."""
        return UserNet(self.port, self.forwards).all_forwards(GUEST_PORT)

    def watch_forwards(self, say) -> threading.Thread | None:
        """Say (once each) the forwards the guest refuses a connection on, while it records
        (record/forwards.py): the watching thread, which reads the log to its end once the
        VM has stopped (join it before the summary: a refusal just before a Ctrl-C was
        lost when the CLI printed its summary and exited first)."""
        return forward_watch.watch(self.path / bundle.DEVLOG, self.all_forwards(), self.running, say)

    @property
    def serial(self) -> Serial:
        serial = self.started().serial
        if serial is None:      # a recording's VM always has one (vm.VM.start)
            raise InfraError(f"{self.path}: the recording's serial console is not connected")
        return serial

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait for the guest agent's TANDEM-READY line on the serial console."""
        self.serial.wait_for(b"TANDEM-READY", timeout)

    def stop(self) -> None:
        """Quit the guest now (recorded as a host shutdown, so replay stops there too):
        what a stop request does; finish() or close() then seals the bundle."""
        if self.stop_reason is None:
            self.stop_reason = "interrupt"
        self.started().quit()

    def request_stop(self) -> None:
        """Ask to stop, from a signal handler: the loop that talks to QEMU (wait(), a
        shadow's watch) acts on it in act_on_stop_requests(). QMP is not reentrant: a quit
        sent from a handler that interrupted a QMP command failed with "This event loop
        is already running"."""
        self.stop_requests += 1

    def act_on_stop_requests(self, say=lambda line: None) -> None:
        """What the stop requests so far ask for, as libvirt has it: the first presses the
        guest's power button (virsh shutdown) and waits for the guest to power off, which
        is recorded (stop reason 'poweroff'); a second, or the wait running out, quits at
        once (virsh destroy; stop reason 'interrupt'). With the policy "quit", the first
        quits. say(line): one line for the user on each step."""
        if not self.stop_requests or self.stop_reason is not None:
            return
        now = time.monotonic()
        if self.stop_policy == "quit" or self.stop_requests > 1:
            self.stop()
        elif self.button_at is None:
            self.button_at = now
            self.powerdown()
            say(f"pressed the guest's power button (as virsh shutdown): waiting up to "
                f"{self.powerdown_wait_s:.0f} s for it to power off; Ctrl-C again quits at once (as virsh destroy)")
        elif now - self.button_at >= self.powerdown_wait_s:
            say(f"the guest did not power off within {self.powerdown_wait_s:.0f} s of its power button: quitting")
            self.stop()

    def running(self) -> bool:
        """The recording's QEMU is still running."""
        vm = self.started()
        return vm.proc is not None and vm.proc.poll() is None

    def powerdown(self) -> None:
        """Press the guest's power button (ACPI): the recording ends when it powers off,
        recorded as the guest's own shutdown (stop reason 'poweroff')."""
        self.button_pressed = True
        self.started().powerdown()

    def wait(self, timeout: float | None = None, progress=None, say=lambda line: None) -> None:
        """Wait for the guest to stop by itself (poweroff or --duration), or as stop
        requests ask (act_on_stop_requests, which says its steps through say)."""
        vm = self.started()
        proc = vm.process()
        deadline = None if timeout is None else time.monotonic() + timeout
        shown = float("-inf")
        while proc.poll() is None:
            self.act_on_stop_requests(say)
            vm.poll_events()
            if progress and time.monotonic() - shown >= PROGRESS_S:
                shown = time.monotonic()
                progress(vm.vm_status())
            if deadline and time.monotonic() > deadline:
                raise BootError(f"{self.path}: guest still running after {timeout:.0f}s")
            try:    # returns as soon as QEMU exits, so the recording's end is not delayed
                proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass

    def finish(self, timeout: float = 60.0) -> Manifest:
        """Wait for QEMU to exit (killed after `timeout` s), release the VM, its console
        server and sockets, and seal the bundle: its manifest. An 'interrupted' bundle
        is an error (once sealed)."""
        vm = self.started()
        self._ended = True
        try:
            status = vm.wait(timeout)
        except TandemError:
            vm.kill()
            status = -9
        wall = time.monotonic() - self.t0
        vm.poll_events()
        if self.console is not None:
            self.console.close()
        vm.close()
        private.copy_file(vm.log_path, self.path / "qemu.log")
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

        if self.stop_reason is None:
            # QEMU says why it stopped: guest-shutdown is a poweroff; guest-reset is a
            # reboot or a kernel panic (panic=-1 with -no-reboot), kept distinct so a
            # panicking guest never passes for a clean stop.
            reason = vm.shutdown_reason
            if reason is None:
                self.stop_reason = "duration" if self.duration_ns else "qemu-exit"
            else:
                self.stop_reason = {"guest-shutdown": "poweroff", "host-qmp-quit": "duration"}.get(reason, reason)
        m = self.manifest = sealing.seal(self.path, self.manifest, status=status, wall_s=wall,
                                           stop_reason=self.stop_reason, power_button=self.button_pressed)
        if m.state != "complete":
            raise InfraError(f"{self.path}: QEMU exited with status {status} during recording "
                             f"(bundle kept as 'interrupted'; replay it with --partial)")
        return m

    def close(self) -> None:
        """End the recording and release it: one still running is quit (stop()) and
        sealed as finish() seals it; an 'interrupted' bundle is logged here, not raised.
        Nothing to do once finish() has run, after a failed start, or a second time."""
        if self.vm is None or self._ended:
            return
        if self.running():
            try:
                self.stop()
            except TandemError:     # QMP not connected yet (a start cut short): no quit to ask
                self.vm.kill()
        try:
            self.finish()
        except TandemError as e:
            log.debug("%s: closed: %s", self.path, e)

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, exc_type, *_) -> None:
        if exc_type is None and self.vm is not None and not self._ended:
            self.finish()       # the block's result: the guest's own end, sealed (an error if interrupted)
        else:
            self.close()
