"""Semantic replay: a recording's inputs re-delivered into an analysis VM.

The analysis VM runs a different kernel or userland. Its network, serial input
and entropy come from a feed (qemu-patches/0006): tandem sends each input with
the VM time to deliver it at and grants the VM clock a horizon it may not pass;
QEMU returns every frame and serial byte the guest sends and stops at the
horizon. Each output also pulls the horizon in by the link's lookahead, so the
replayer (tcp_peer) answers the guest within that VM time, as the real network
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
from pathlib import Path

from ... import private
from ...errors import TandemError
from ...formats import bundle, lifecycle
from ...formats.bundle import Manifest
from ...machine import RR, Feed, Guest, Host, NetSection, Run
from ...qemu import wake_latency
from ...qemu.vm import VM
from ...qemu.image import make_overlays
from .. import inputs as inputs_mod
from .driver import AnalysisDriver
from ...qemu.feed import FeedServer
from ..model import DELIVERED_KEPT, HANG_WALL_S, LOOKAHEAD_NS, MAX_LAG_NS, AnalysisRun, Buffer, Outcome


def run(rec: inputs_mod.RecordedInputs, analysis: str, workdir: Path, *,
        lookahead_ns: int = LOOKAHEAD_NS, guest: Guest | None = None,
        max_lag_ns: int = MAX_LAG_NS, progress=None, record: bool = True,
        buffer: Buffer | None = None, stop=None, hang_wall_s: float = HANG_WALL_S,
        idle: bool = False, cpus: str | None = None, launcher=None, tick=None,
        line_deps: bool = True, cpu_idle: bool = False) -> AnalysisRun:
    """Replay rec into one analysis VM; never raises for what the guest does.

    With record (the default) the analysis VM runs under QEMU's record/replay and
    leaves its own bundle, workdir/ANALYSIS.tdm, which `tandem replay` replays
    exactly: every finding can be reproduced instruction for instruction.

    rec may be a live native's, still filling in (rec.finished False): the analysis
    then trails it, idling no further than what the native has reached (rec.known_ns;
    it may work past it, as a slow-booting analysis must), holding at
    most `buffer` of inputs it has not taken yet; over that it detaches (outcome
    "detached"). `stop()` returning True ends the run early (outcome "detached").

    launcher: run the analysis VM as a libvirt domain (virt.Launcher, see vm.VM).
    line_deps: inputs wait for the console lines the native had printed (False for a
    user's VM: driver.AnalysisDriver).
    cpu_idle: let the host's CPUs idle meanwhile (by default they are held awake, so that
    each stop of the VM is not a CPU's wake-up longer: qemu/wake_latency.py).
    tick(run): called every TICK_S from the run's thread (a live run compares and drops
    what it has matched: live_compare.py); a live run keeps only the inputs it delivered
    last and no raw frames, so that its memory does not grow with its length.
    """
    guest = guest or Guest.for_analysis(analysis)
    res = AnalysisRun(analysis)
    if not rec.finished:
        res.delivered, res.net_out = deque(maxlen=DELIVERED_KEPT), None
    tmp = Path(tempfile.mkdtemp(prefix="tandem-an-"))
    private.make_dir(workdir)
    server = FeedServer(tmp / "feed.sock")
    manifest = None
    rr: RR | None = None
    overlay: Path | None = None
    if record:
        run_bundle = res.bundle = workdir / f"{analysis}.tdm"
        if run_bundle.exists():
            shutil.rmtree(run_bundle)
        manifest = lifecycle.start(run_bundle, guest, dataclasses.replace(
            guest.section(), mode="analysis", analysis=analysis, rtc_base=rec.created, lookahead_ns=lookahead_ns,
            source=str(rec.path), net=NetSection(backend="feed"), libvirt=launcher.section() if launcher else None),
            then=lambda: make_overlays(guest, run_bundle / bundle.OVERLAY))
        rr, devlog = RR("record", run_bundle / bundle.STREAM), run_bundle / bundle.DEVLOG
        overlay = run_bundle / bundle.OVERLAY if guest.disk else None
    else:
        devlog = workdir / f"{analysis}.pcapng"
        if guest.disk:
            overlay = tmp / "disk-overlay.qcow2"
            make_overlays(guest, overlay)     # one per disk, each the analysis's own
    run = Run(tmp, net=Feed(server.path, lookahead_ns=lookahead_ns, rtc_base=rec.created), rr=rr, devlog=devlog,
              overlay=overlay, host=Host(idle=idle, cpus=cpus))
    vm = VM(guest, run, launcher=launcher, name=analysis)
    vm.console = lambda: bytes(res.console)
    t0 = time.monotonic()
    try:
        vm.start()
        res.qemu_pid = vm.process().pid
        server.accept(30)
        with wake_latency.held(not cpu_idle):
            AnalysisDriver(rec, res, vm, server, max_lag_ns=max_lag_ns, progress=progress, buffer=buffer,
                           stop=stop, hang_wall_s=hang_wall_s, tick=tick, line_deps=line_deps).drive()
    except TandemError as e:
        res.outcome, res.detail = Outcome.ERROR, str(e)
    finally:
        if vm.proc and vm.proc.poll() is None:
            vm.kill()
        res.wall_s = time.monotonic() - t0
        res.qemu_log = vm.log_tail(2000)
        vm.close()
        server.close()
        if manifest is not None and res.bundle is not None:
            _seal(res, res.bundle, vm, manifest)
        shutil.rmtree(tmp, ignore_errors=True)
    return res


def _seal(res: AnalysisRun, run_bundle: Path, vm: VM, manifest: Manifest) -> None:
    """Finish the analysis run's bundle (run_bundle); a run that did not end cleanly stays 'interrupted'."""
    try:
        private.copy_file(vm.log_path, run_bundle / "qemu.log")
        status = vm.proc.returncode if vm.proc and vm.proc.returncode is not None else -9
        lifecycle.seal(run_bundle, manifest, status=status, wall_s=res.wall_s, stop_reason=res.outcome)
    except (OSError, TandemError) as e:
        res.limits.append(f"the run's recording could not be sealed: {e}")
