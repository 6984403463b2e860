"""Exact replay: re-execute a bundle under icount replay and verify its outputs.

The replay re-captures the device boundary with the same tap; verify.py then
checks it against the recording byte for byte, plus the final instruction count.
`follow` replays a recording that is still being written; `partial` replays the
intact prefix of an unfinished or damaged one.
"""
from __future__ import annotations

import contextlib
import dataclasses
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import artifacts, private, report
from ..errors import BundleError, InfraError
from ..formats import bundle, pcapng, rrstream
from ..libvirt.command_line import replay_command_line
from ..machine import RR, Feed, Guest, Host, OwnLine, Recorded, RRMode, Run, UserNet, replay_args
from ..machine.section import recorded
from ..qemu.tap import private_taps
from ..qemu.vm import VM
from ..qemu.image import make_blank, make_overlays
from .verify import Mismatch, final_state, first_departure
from .watch import DepartureWatch

HANG_SECONDS = 60   # no VM-clock progress for this long (wall time) is a hang


@dataclass
class Verdict:
    ok: bool
    events: int
    mismatch: Mismatch | None
    recorded_end: tuple
    replayed_end: tuple
    replay_wall_s: float
    record_wall_s: float | None
    partial: bool
    note: str = ""
    reports: list[str] = field(default_factory=list)   # sanitizer/oops reports on the replayed console

    def summary(self) -> str:
        vm_ns, icount = self.replayed_end
        t = f"{vm_ns / 1e9:.3f}s" if vm_ns is not None else "?"
        speed = ""
        if self.record_wall_s:
            speed = f", replay took {self.replay_wall_s:.1f}s wall vs {self.record_wall_s:.1f}s recording"
        if self.ok:
            scope = "intact prefix: " if self.partial else ""
            found = "".join(f"\n  reproduced: {r}" for r in self.reports)
            return (f"VERIFIED: {scope}{self.events} device events reproduced byte for byte, "
                    f"VM time {t}, final instruction count {icount}{speed}{self.note}{found}")
        return f"MISMATCH: {self.mismatch}{self.note}"


def console_reports(devlog: pcapng.Devlog, guest_os: str = "linux") -> list[str]:
    """The kernel and sanitizer reports a run printed on its serial console, as
    titles: a replay of an analysis run shows its findings reproduced."""
    out = b"".join(e.data for e in devlog.events
                   if e.direction == "out" and e.channel.startswith("serial"))
    return [r.title for r in report.parse(out, guest_os)]


def _wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise BundleError(f"{path}: did not appear within {timeout:.0f}s (is the recording running?)")
        time.sleep(0.1)


def replay(bundle_dir: str | Path, *, follow: bool = False, partial: bool = False,
           progress=None, keep: Path | None = None, extra: Sequence[str] = (),
           until_departure: bool = False) -> Verdict:
    """extra: QEMU arguments appended to the replay's (a TCG plugin: assertions/trace.py).
    until_departure: stop a replay that departs from its recording once it has shown what
    that led to (exact/watch.py), not at its end."""
    d = Path(bundle_dir)
    q = artifacts.qemu()
    if until_departure and follow:
        raise BundleError(f"{d}: a replay stopped at its departure compares with a finished recording")
    if follow:
        _wait_for(d / bundle.MANIFEST, 30)
        manifest = bundle.check_bundle(d, qemu_build_id=q["build_id"], partial=True)
        _wait_for(d / bundle.STREAM, 30)
    else:
        manifest = bundle.check_bundle(d, qemu_build_id=q["build_id"], partial=partial)
    refuse_device_mode(d, manifest)
    guest = Guest.from_manifest(manifest)

    tmp = Path(tempfile.mkdtemp(prefix="tandem-replay-"))
    try:
        stream = d / bundle.STREAM
        if not follow:
            info = rrstream.scan(stream)
            if not info.finished:
                where = f"torn at offset {info.torn_at}" if info.torn_at is not None else "has no END segment"
                if not partial:
                    raise BundleError(f"{stream}: unfinished recording ({where}); "
                                      f"replay the intact prefix with --partial")
            if partial:
                # QEMU reads a clean copy: only whole, checked segments.
                info = rrstream.write_intact_prefix(stream, tmp / "prefix.tdrs")
                stream = tmp / "prefix.tdrs"
                partial = not info.finished
        overlay = tmp / "disk.qcow2"
        make_overlays(guest, overlay)
        with contextlib.ExitStack() as held:
            pass_fds: tuple[int, ...] = ()
            if stream == d / bundle.STREAM:
                # QEMU reads the stream tandem checked, through an fd tandem opened the
                # way it opens every bundle file (bundle.open_member: no link followed):
                # a link planted in its place after the check is not QEMU's to follow.
                f = held.enter_context(bundle.open_member(d, bundle.STREAM))
                stream, pass_fds = Path(f"/dev/fd/{f.fileno()}"), (f.fileno(),)
            run = dataclasses.replace(replay_run(manifest, tmp, stream, overlay, follow=follow, partial=partial,
                                                 extra=extra), host=Host(pass_fds=pass_fds))
            vm = replay_vm(manifest, guest, run, held, where=str(d))
            t0 = time.monotonic()
            died: InfraError | None = None
            recorded: pcapng.Devlog | None = None
            with vm, contextlib.ExitStack() as watching:
                stop = None
                if until_departure:     # the recording is finished: its log is read once
                    recorded = pcapng.read_devlog(d / bundle.DEVLOG)
                    watch = DepartureWatch(recorded, tmp / "replay.pcapng").start()
                    watching.callback(watch.close)
                    stop = watch.done
                try:
                    if _run_to_end(vm, partial, progress, stop):
                        died = InfraError("stopped where it had departed from its recording")
                except InfraError as e:
                    # QEMU ends a replay that has departed from its log ("REPLAY: read
                    # clock 0 failed"), or it hangs: the logs so far say where it departed.
                    died = e
            wall = time.monotonic() - t0
        if keep:
            private.copy_file(tmp / "replay.pcapng", keep)

        if follow:   # the recording must be sealed before its log can be compared
            deadline = time.monotonic() + 120
            while bundle.load_manifest(d).state == "recording":
                if time.monotonic() > deadline:
                    raise BundleError(f"{d}: recording did not finish within 120s of the replay")
                time.sleep(0.2)
            manifest = bundle.load_manifest(d)
        if recorded is None:
            recorded = pcapng.read_devlog(d / bundle.DEVLOG)
        replayed = pcapng.read_devlog(tmp / "replay.pcapng")
        mm = first_departure(recorded, replayed, prefix=partial or died is not None)
        if died is not None and mm is None:
            raise died
        rec_end, rep_end = final_state(recorded), final_state(replayed)
        note = f" (then the replay stopped: {died})" if died is not None else ""
        if mm is None and not partial and rec_end[1] != rep_end[1]:
            mm = Mismatch(len(replayed.events), "-", rep_end[0],
                          f"final instruction count: recorded {rec_end[1]}, replayed {rep_end[1]}")
        compared = len(replayed.events)
        if partial:
            note = f" (recording has {len(recorded.events)} events; replay stopped at the intact end)"
            if len(replayed.events) > len(recorded.events):
                compared = len(recorded.events)
                note = (f" (the recording's device log ends at its event {compared}; the replay's "
                        f"{len(replayed.events) - compared} later events are not compared)")
        return Verdict(ok=mm is None, events=compared, mismatch=mm,
                       recorded_end=rec_end, replayed_end=rep_end, replay_wall_s=wall,
                       record_wall_s=manifest.wall_time_s, partial=partial, note=note,
                       reports=console_reports(replayed, guest.os))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def refuse_device_mode(d: Path, manifest: Recorded) -> None:
    """A one-line error for a device-mode recording: it has no replay log (no -icount), so
    nothing can replay it instruction for instruction."""
    if recorded(manifest).machine.mode == "device":
        raise BundleError(f"{d}: recorded in device mode (no replay log): it cannot be replayed exactly; "
                          f"replay it semantically (tandem replay {d} --analysis NAME)")


def replay_run(manifest: Recorded | Mapping[str, Any], tmp: Path, stream: Path, overlay: Path, *,
               follow: bool = False, partial: bool = False, extra: Sequence[str] = ()) -> Run:
    """How a bundle replays: its machine section's stop time, mode and (for an analysis
    run's own recording) RTC base and lookahead, and what libvirt added that the guest saw.
    manifest: the bundle's Manifest (or its JSON document: machine.section.recorded)."""
    machine = recorded(manifest).machine
    net: UserNet | Feed = UserNet()
    if machine.mode == "analysis":
        # An analysis run's own recording (semantic/driving/replay.py): the same machine as
        # it ran, its feed's inputs now coming from the log.
        if machine.rtc_base is None:
            raise _missing("rtc_base")
        if machine.lookahead_ns is None:
            raise _missing("lookahead_ns")
        net = Feed(None, lookahead_ns=machine.lookahead_ns, rtc_base=machine.rtc_base)
    # Recorded in a libvirt domain: what libvirt added that the guest sees (on its own
    # command line, libvirt's options are repeated: own_line).
    extra = [*([] if own_line(manifest) else replay_args(machine)), *extra]
    return Run(tmp, net=net, rr=RR(RRMode.REPLAY, stream, follow=follow, partial=partial), devlog=tmp / "replay.pcapng",
               overlay=overlay, stop_after_ns=machine.stop_after_ns or 0,
               state_every_ns=machine.state_every_ns or 0, extra=tuple(extra))


def replay_vm(manifest: Recorded, guest: Guest, run: Run, held: contextlib.ExitStack, *, where: str,
              name: str | None = None) -> VM:
    """The VM of a bundle's replay run: tandem's command line for (guest, run), or, recorded
    on a domain's own command line, libvirt's repeated (libvirt/command_line.py) with a tap
    of the replay's own for each NIC (qemu/tap.py), held open by `held`."""
    own = own_line(manifest)
    if own is None:
        return VM(guest, run, name=name)
    taps = held.enter_context(private_taps(len(own.netdevs or ())))
    run = dataclasses.replace(run, host=dataclasses.replace(run.host, pass_fds=(*run.host.pass_fds, *taps)))
    private.make_dir(run.rundir)
    vmstate = run.rundir / "vmstate.qcow2"
    make_blank(vmstate)
    return VM(guest, run, name=name, argv=replay_command_line(own, guest, run, taps=taps, vmstate=vmstate,
                                                              where=where))


def own_line(manifest: Recorded | Mapping[str, Any]) -> OwnLine | None:
    """libvirt's command line of a recording on a domain's own (libvirt/command_line.py), if it is one."""
    lv = recorded(manifest).machine.libvirt
    return lv.own if lv is not None else None


def _missing(key: str) -> BundleError:
    return BundleError(f"manifest machine.{key}: missing (an analysis run's recording has one)")


STATUS_EVERY_S = 1.0    # how often the replay's progress is asked over QMP


def _run_to_end(vm: VM, partial: bool, progress, stop: Callable[[int | None], bool] | None = None) -> bool:
    """Run until QEMU exits (the recorded shutdown) or, for a prefix, pauses at its end, or
    `stop` (given the VM clock) says to quit it early: whether it did.

    Its progress (VM clock, for the hang check and the progress line) is asked once every
    STATUS_EVERY_S: each QMP command runs in QEMU's main loop under the big lock, which the
    vCPU thread takes for every device access (a recording asks nothing while it runs).
    Its exit is seen at once."""
    last_clock, last_change = None, time.monotonic()
    proc = vm.process()
    while True:
        try:    # returns as soon as QEMU exits: the replay's end is not rounded up
            proc.wait(timeout=STATUS_EVERY_S)
            break
        except subprocess.TimeoutExpired:
            pass
        st = vm.vm_status()
        if progress:
            progress(st)
        clock = st.get("vm-clock-ns")
        if stop is not None and stop(clock):
            vm.quit()
            vm.wait(30)
            return True
        if clock != last_clock:
            last_clock, last_change = clock, time.monotonic()
        elif vm.status() == "paused":
            # A prefix replay pauses at the end of its log ("replay file is over").
            vm.quit()
            vm.wait(30)
            return False
        elif time.monotonic() - last_change > HANG_SECONDS:
            raise InfraError(f"replay hung: VM clock stuck at {clock} ns for {HANG_SECONDS}s "
                             f"({vm.log_tail()})")
    if proc.returncode != 0:
        raise InfraError(f"replay QEMU exited with status {proc.returncode}: {vm.log_tail()}")
    return False
