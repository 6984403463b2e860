"""Semantic replay: a recording's inputs re-delivered into an analysis VM.

The analysis VM runs a different kernel or userland. Its network, serial input
and entropy come from a feed (qemu-patches/0027-0029): tandem sends each input with
the VM time to deliver it at and grants the VM clock a horizon it may not pass;
QEMU returns every frame and serial byte the guest sends and stops at the
horizon. Each output also pulls the horizon in by the link's lookahead, so the
replayer (network/peer.py) answers the guest within that VM time, as the real network
did: the two advance conservatively in VM time, and with -icount sleep=off the
guest never waits out idle time.

An input is released no earlier than its recorded VM time, and not before the
analysis guest has produced the outputs the native had produced when the input
arrived (inputs.py); one that waits longer than the dependency timeout is sent
anyway and reported as a replay limit.
"""
from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ... import catalog, private
from ...errors import TandemError
from ...formats import bundle, sealing
from ...formats.bundle import Manifest
from ...machine import RR, Feed, Guest, Host, NetSection, RRMode, Run
from ...qemu import wake_latency
from ...qemu.vm import VM
from ...qemu.image import make_overlays
from .. import inputs
from ..guests import with_files_swapped
from .driver import AnalysisDriver, DriveOptions
from ...qemu.feed import FeedServer
from ..model import DELIVERED_KEPT, HANG_WALL_S, LOOKAHEAD_NS, MAX_LAG_NS, AnalysisRun, Buffer, Outcome

if TYPE_CHECKING:
    from ...libvirt.launcher import Launcher


@dataclass(frozen=True)
class RunOptions:
    """How one analysis VM runs (run() below): what it is, where it leaves its files, its
    pace and its host's share of it.

    record: the analysis VM runs under QEMU's record/replay and leaves its own bundle,
    workdir/NAME.tdm, which `tandem replay` replays exactly: every finding can be
    reproduced instruction for instruction (else its device log is workdir/NAME.pcapng).
    line_deps: inputs wait for the console lines the native had printed (False for a
    user's VM: driver.AnalysisDriver). cpu_idle: let the host's CPUs idle meanwhile (by
    default they are held awake, so that each stop of the VM is not a CPU's wake-up
    longer: qemu/wake_latency.py). idle, cpus: the VM's QEMU at idle CPU priority, on
    these CPUs. launcher: run the analysis VM as a libvirt domain (libvirt/launcher.py,
    see qemu/vm.VM). stop(): True ends the run early (outcome "detached"). hold(): True
    grants the VM no new horizon for now (live/yielding.py). swap_from: a
    user's VM's recording, whose guest gets its files swapped in first (guests.
    with_files_swapped: a preparation boot), here in the run's own thread: analyses
    prepare side by side, and one whose preparation fails is that analysis's error.
    vcpus: the analysis VM's vCPUs: one, or a multi-vCPU native's count, which run in turns
    on QEMU's round-robin under -icount (closer to the native); either way recorded and
    reproducible exactly (qemu-patches/0038 logs the turns)."""
    analysis: catalog.Analysis
    guest: Guest | None                 # None: tandem's guest image with the analysis's kernel and userland
    workdir: Path
    record: bool = True
    lookahead_ns: int = LOOKAHEAD_NS
    max_lag_ns: int = MAX_LAG_NS
    hang_wall_s: float = HANG_WALL_S
    line_deps: bool = True
    cpu_idle: bool = False
    idle: bool = False
    cpus: str | None = None
    launcher: Launcher | None = None
    stop: Callable[[], bool] | None = None
    hold: Callable[[], bool] | None = None     # True: no new horizon now (a live run yielding to its native)
    swap_from: Path | None = None
    vcpus: int = 1


def run(rec: inputs.RecordedInputs, o: RunOptions, *, buffer: Buffer | None = None,
        progress: Callable | None = None, tick: Callable | None = None) -> AnalysisRun:
    """Replay rec into one analysis VM, run as `o` says; never raises for what the guest does.

    rec may be a live native's, still filling in (rec.finished False): the analysis
    then trails it, idling no further than what the native has reached (rec.known_ns;
    it may work past it, as a slow-booting analysis must), holding at
    most `buffer` of inputs it has not taken yet; over that it detaches (outcome
    "detached").

    progress(run, delivered, taken): at each stop of the VM. tick(run): called every
    TICK_S from the run's thread (a live run compares and drops what it has matched:
    live_compare.py), returning the connections it is done with, which the run forgets;
    a live run keeps only the inputs it delivered last and no raw frames, so that its
    memory does not grow with its length.
    """
    guest = o.guest or Guest.for_analysis(o.analysis)
    if o.swap_from is not None:
        guest = with_files_swapped(guest, o.analysis, o.workdir, o.swap_from)
    res = AnalysisRun(o.analysis.name)
    # o.vcpus, not the guest's: a user's VM's analysis guest is made from its native's machine.
    vcpus = o.vcpus if o.analysis.kernel.smp else 1
    if o.vcpus != 1 and not o.analysis.kernel.smp:
        res.limits.append(f"one vCPU, not the native's {o.vcpus}: the {o.analysis.flavor} kernel is built "
                          "without SMP (guest-kernel/linux/base.config)")
    elif o.vcpus != 1:
        res.limits.append(f"{o.vcpus} vCPUs, as the native had, in turns on one host thread: recorded and "
                          "reproducible, but not the native's interleaving (its vCPUs ran side by side)")
    if guest.vcpus != vcpus:
        guest = dataclasses.replace(guest, vcpus=vcpus)
    if not rec.finished:
        res.delivered, res.net_out = deque(maxlen=DELIVERED_KEPT), None
    with ExitStack() as cleanup:        # run last to first: the VM, its bundle, the feed, tmp
        tmp = Path(tempfile.mkdtemp(prefix="tandem-an-"))
        cleanup.callback(shutil.rmtree, tmp, ignore_errors=True)
        private.make_dir(o.workdir)
        server = cleanup.enter_context(FeedServer(tmp / "feed.sock"))     # QEMU connects to it as it starts
        manifest, rr, devlog, overlay = _devices(res, rec, o, guest, tmp)
        vm = VM(guest, Run(tmp, net=Feed(server.path, lookahead_ns=o.lookahead_ns, rtc_base=rec.created), rr=rr,
                           devlog=devlog, overlay=overlay, host=Host(idle=o.idle, cpus=o.cpus)),
                launcher=o.launcher, name=o.analysis.name)
        vm.console = lambda: bytes(res.console)
        if manifest is not None and res.bundle is not None:
            cleanup.callback(_seal, res, res.bundle, vm, manifest)
        cleanup.callback(_end, res, vm, time.monotonic())
        try:
            vm.start()
            res.qemu_pid = vm.process().pid
            server.accept(30)
            with wake_latency.held(not o.cpu_idle):
                AnalysisDriver(rec, res, vm, server, DriveOptions(
                    max_lag_ns=o.max_lag_ns, progress=progress, buffer=buffer, stop=o.stop, hold=o.hold,
                    hang_wall_s=o.hang_wall_s, tick=tick, line_deps=o.line_deps)).drive()
        except TandemError as e:
            res.outcome, res.detail = Outcome.ERROR, str(e)
    return res


def _devices(res: AnalysisRun, rec: inputs.RecordedInputs, o: RunOptions, guest: Guest,
             tmp: Path) -> tuple[Manifest | None, RR | None, Path, Path | None]:
    """(manifest, record stream, device log, disk overlay) of the run: recorded, its own
    bundle workdir/NAME.tdm begun (res.bundle); else a device log and the disks' overlays."""
    name = o.analysis.name
    if not o.record:
        overlay = None
        if guest.disk:
            overlay = tmp / "disk-overlay.qcow2"
            make_overlays(guest, overlay)     # one per disk, each the analysis's own
        return None, None, o.workdir / f"{name}.pcapng", overlay
    run_bundle = res.bundle = o.workdir / f"{name}.tdm"
    if run_bundle.exists():
        shutil.rmtree(run_bundle)
    manifest = sealing.start(run_bundle, guest, dataclasses.replace(
        guest.section(), mode="analysis", analysis=name, rtc_base=rec.created, lookahead_ns=o.lookahead_ns,
        source=str(rec.path), net=NetSection(backend="feed"), libvirt=o.launcher.section() if o.launcher else None),
        then=lambda: make_overlays(guest, run_bundle / bundle.OVERLAY))
    return (manifest, RR(RRMode.RECORD, run_bundle / bundle.STREAM), run_bundle / bundle.DEVLOG,
            run_bundle / bundle.OVERLAY if guest.disk else None)


def _end(res: AnalysisRun, vm: VM, t0: float) -> None:
    """The analysis VM ended (killed if it still runs) and closed; its wall time and log's tail noted."""
    if vm.proc and vm.proc.poll() is None:
        vm.kill()
    res.wall_s = time.monotonic() - t0
    res.qemu_log = vm.log_tail(2000)
    vm.close()


def _seal(res: AnalysisRun, run_bundle: Path, vm: VM, manifest: Manifest) -> None:
    """Finish the analysis run's bundle (run_bundle); a run that did not end cleanly stays 'interrupted'."""
    try:
        private.copy_file(vm.log_path, run_bundle / "qemu.log")
        status = vm.proc.returncode if vm.proc and vm.proc.returncode is not None else -9
        sealing.seal(run_bundle, manifest, status=status, wall_s=res.wall_s, stop_reason=res.outcome)
    except (OSError, TandemError) as e:
        res.limits.append(f"the run's recording could not be sealed: {e}")
