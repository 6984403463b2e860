"""`tandem shadow`: analysis VMs trail a serving native live (FreeDA's leader/followers).

The native records as `tandem record` does (its bundle is the same, replayable
exactly). Its device log is followed as QEMU writes it (pcapng.DevlogReader with
follow=) and turned into inputs in place (an inputs.InputExtractor fed the events); each
analysis VM runs semantic.driving.replay.run on that growing recording, never past the VM
time the native has reached, with a bounded buffer of inputs it has not taken yet.
With release policy "now" the native never waits for an analysis while its buffer
has room. An analysis that falls a full buffer behind is detached and reported
(overflow policy "detach"), or the native's inputs are held at the host side of its
NIC until that analysis has room again, for at most a wall-time budget (policy
"block", gate.py); one that crashes or hangs is a finding, and neither touches the
native or its recording.

Memory: each analysis compares its outputs with the native's as it goes and drops what
they agree on (live_compare.py); the native's inputs, outputs and connections are
dropped here once every analysis has taken, matched or compared them, so tandem's
memory follows what is in flight (buffers, open connections), not the run's length.

How far the native has reached: every 100 ms of wall time the native's QEMU writes
its VM clock into the device log (a clock mark, devlog clock-marks=on), after every
input timed before it; the follower raises `known_ns` to each mark it reads. Nothing
asks the native over QMP while it serves: a QMP command takes the big lock its vCPU
then waits for (10 a second cost some 18% of its p99 latency).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from .. import catalog, private
from ..errors import TandemError
from ..lifecycle import Lifecycle
from ..formats import bundle, pcapng
from ..machine import Forward, Guest, analyses_given
from ..qemu.vm import cpu_seconds, drop_idle_cgroup, make_thread_idle
from ..record.recording import Recording, RecordMode
from ..semantic.comparison import equivalence
from ..semantic import guests, inputs, model
from ..semantic.model import Overflow
from ..semantic.analyze import Summary, analyze, summarize, write_summary
from ..semantic.driving.replay import RunOptions
from ..qemu.feed import FeedServer
from ..semantic.trail import Trail
from . import metrics
from .gate import Gate
from .yielding import NativeLoad

log = logging.getLogger(__name__)

SAMPLE_S = 0.1
TRIM_S = 0.5            # how often the native's side drops what every analysis is done with
MARKS_KEPT = 3000       # the native's clock marks kept to measure wall lag: 5 minutes of them
# A user's VM booted by its bootloader: its root device is known once its kernel prints
# its command line (GRUB and the kernel's first second: 15-20 s of wall time under TCG).
ROOT_WAIT_S = 300.0
STOP_REASON_WAIT_S = 120.0  # the native's exit to its stop reason (finish(), the main thread)
YIELD_POLL_S = 0.5          # yielding: how often the waiting follower looks at _stop
YIELD_EVENTS = 256          # yielding: events of the native's log read between looks at its load
FOLLOW_CLOSE_S = 30.0       # close(): the native gone, its log's rest read by the following thread


class Release(StrEnum):
    """When the native's network outputs leave (--release)."""
    NOW = "now"             # at once: the analyses only watch
    AGREED = "agreed"       # once every analysis produced the same output (the release gate)


@dataclass(frozen=True)
class ShadowOptions:
    """How a live shadow run runs: what `tandem shadow` and `tandem attach` take on the
    command line, checked when made (one-line errors naming the option)."""
    duration_ns: int = 0                    # stop the native after this much VM time (0: never)
    port: int | None = None                 # host port forwarded to the guest service (None: free)
    buffer_events: int = 100_000            # inputs an analysis may trail by ...
    buffer_bytes: int = 64 << 20            # ... and their bytes; over either, `overflow` applies
    buffer_events_of: dict[str, int] | None = field(default=None, hash=False)   # per analysis
    overflow: Overflow = Overflow.DETACH
    block_budget_s: float = 10.0            # overflow block: wall time the native may be held
    release: Release = Release.NOW
    agree_timeout_ns: int = 2_000_000_000   # release agreed: VM time an analysis may take to answer
    record_analyses: bool = True            # each analysis VM leaves its own bundle
    spec_path: str | None = None            # equivalence spec (default: the built-in ones)
    idle_analyses: bool = True              # analysis VMs under SCHED_IDLE
    yield_to_native: bool = False           # ... and held still while the native is busy (yielding.py)
    analysis_cpus: str = "auto"             # auto (all but the first CPU), all, or a list
    metrics_port: int | None = None         # Prometheus metrics on 127.0.0.1:PORT (0: any free)
    hang_wall_s: float = model.HANG_WALL_S
    drain: bool = True                      # an analysis stopped for lag is analysed again offline
    cpu_idle: bool = False                  # the host's CPUs may idle (qemu/wake_latency.py)
    stop: str = "powerdown"                 # what Ctrl-C does to the native (recording.STOP_POLICIES)
    shutdown_timeout_s: float = 60.0        # ... and how long its power button is waited on
    record_mode: RecordMode = RecordMode.EXACT  # how the native is recorded
    analysis_vcpus: str = "one"             # each analysis VM's vCPUs: "one", or "native" (the native's)

    def __post_init__(self) -> None:
        for name, enum in (("release", Release), ("overflow", Overflow), ("record_mode", RecordMode)):
            value = getattr(self, name)
            if value not in set(enum):
                raise TandemError(f"unknown {name} policy {value!r} (known: {', '.join(enum)})")
            object.__setattr__(self, name, enum(value))
        if self.analysis_vcpus not in ("one", "native"):
            raise TandemError(f"--analysis-vcpus {self.analysis_vcpus!r}: 'one' or 'native'")
        if self.block_budget_s <= 0:
            raise TandemError(f"--block-budget must be positive, not {self.block_budget_s:g}s")
        if self.yield_to_native and (self.release == Release.AGREED or self.overflow == Overflow.BLOCK):
            raise TandemError("--analysis-priority yield: not with --release agreed or --overflow block, where the "
                              "native would wait on analyses that hold still while it is busy")
        if self.yield_to_native and not self.idle_analyses:
            raise TandemError("yield_to_native: the analyses yield at idle priority (idle_analyses)")
        for name in ("buffer_events", "buffer_bytes"):
            if getattr(self, name) <= 0:
                raise TandemError(f"--{name.replace('_', '-')} must be positive, not {getattr(self, name)}")


class ShadowRun(Lifecycle):
    """A live shadow run: the native recorded as it serves, each analysis VM trailing it
    (semantic.driving.replay.run on the growing recording), compared and reported as they go.
    start() starts the native and the analyses; finish(), once the native has stopped,
    waits for the analyses and gives the summary; close() releases what is left."""

    def __init__(self, bundle_dir: str | Path, analyses: list[catalog.Analysis], options: ShadowOptions | None = None, *,
                 workdir: Path | None = None, libvirt=None, on_finding=None, guest: Guest | None = None,
                 forwards: tuple[Forward, ...] | None = None, root: str | None = None):
        """libvirt: run the native and the analysis VMs as libvirt domains (a attach.LiveDomains:
        tandem shadow --libvirt, tandem attach); everything else is the same (a user's VM
        too: `guest` is then the native's machine, and the analyses' are made as below).
        on_finding(analysis, finding): called from the analysis's thread as each is found.
        guest, forwards: the user's own VM as `tandem record` takes it (--disk ...,
        --forward ...): its analyses boot its disks with their kernels (semantic/guests.py,
        root= as given, or as the native's kernel prints it at boot), as offline."""
        o = self.options = options or ShadowOptions()
        self.users_guest = guest is not None and forwards is not None and o.port is None
        self.root = root
        release, overflow = o.release, o.overflow
        duration_ns, port, spec_path = o.duration_ns, o.port, o.spec_path
        self.path = Path(bundle_dir)
        self.analyses = analyses_given(analyses)     # none, or a kernel not built: fail now
        self.workdir = workdir or self.path.with_name(self.path.name + ".analysis")
        self.release, self.overflow = release, overflow
        self.idle_analyses = o.idle_analyses
        self.analysis_cpus = analysis_cpuset(o.analysis_cpus)
        self.spec_path = spec_path
        # Loaded now: a bad spec fails here, not at the end; the release gate uses them too.
        self.specs = {a.name: equivalence.load(a, spec_path, self.users_guest) for a in self.analyses}
        self.agree_timeout_ns = o.agree_timeout_ns
        self.gate: Gate | None = None
        self._gate_server: FeedServer | None = None
        self._tmp = Path(tempfile.mkdtemp(prefix="tandem-shadow-"))
        if release == Release.AGREED or overflow == Overflow.BLOCK:
            self._gate_server = FeedServer(self._tmp / "gate.sock")
        self.libvirt = libvirt
        self.native = Recording(self.path, guest if guest is not None or libvirt is None else libvirt.native_guest(),
                                duration_ns=duration_ns, port=port, forwards=forwards,
                                gate_socket=self._gate_server.path if self._gate_server else None,
                                gate_outputs=release == Release.AGREED,
                                # QEMU's bound on held frames: the same policy as the buffers'
                                gate_overflow=overflow,
                                launcher=libvirt.native_launcher() if libvirt else None, stop=o.stop,
                                powerdown_wait_s=o.shutdown_timeout_s, mode=o.record_mode)
        self.rec = inputs.RecordedInputs([], [], None, [], finished=False, path=str(self.path), native_live=True)
        per = o.buffer_events_of or {}
        buffers = {a.name: model.Buffer(per.get(a.name, o.buffer_events), o.buffer_bytes, overflow, o.block_budget_s)
                   for a in self.analyses}
        self.trail = Trail(self.rec, self.analyses, self.specs, buffers, run_options=self._run_options,
                           on_finding=on_finding)
        self.followers = self.trail.followers
        self._trim_at = 0.0
        self.record_analyses = o.record_analyses
        self.hang_wall_s = o.hang_wall_s
        self.metrics_port = o.metrics_port
        self._native_sealed = threading.Event()         # finish() has the native's stop reason
        self._samples: list[tuple[int, float]] = []     # (native VM clock mark, wall time read)
        self._reader: pcapng.DevlogReader | None = None
        self.native_cpu_s = 0.0
        self._stop = False
        self._lock = threading.Lock()
        self.on_drain_progress: Callable | None = None  # (analysis, run, delivered, taken), while draining
        self._started = self._closed = False
        self._following: threading.Thread | None = None     # the native's log into self.rec
        self._metrics: WSGIServer | None = None
        self.load: NativeLoad | None = None             # --analysis-priority yield: the native's load

    @property
    def started(self) -> bool:
        return self._started

    @property
    def port(self) -> int:
        """The native's service port on the host (the demo guest's forward)."""
        if self.native.port is None:
            raise TandemError(f"{self.native.path}: the native has no service port forwarded")
        return self.native.port

    def start(self) -> ShadowRun:
        self._started = True
        if self._gate_server:           # the native's QEMU connects to it as it starts
            self._gate_server.start()
        self.native.start()
        if self._gate_server:
            self._gate_server.accept(30)
            self.gate = Gate(self._gate_server, self.rec, self.followers, timeout_vm_ns=self.agree_timeout_ns,
                             hold=self._hold_native, specs=self.specs)
            self.gate.start()
            self.trail.on_retire = self.gate.forget
            if self.release == Release.AGREED:      # the gate compares outputs too: keep what it has not copied
                gate = self.gate
                for f in self.followers:
                    f.cmp.keep_flow_from = lambda index, a=f.analysis: gate.copied(a, index)
        self.rec.created = self.native.manifest.started_at or self.rec.created
        if self.options.yield_to_native:
            self.load = NativeLoad(self.native.started().process().pid, self._tmp).start()
        private.make_dir(self.workdir)
        self.trail.findings_file = open(self.workdir / "findings.jsonl", "w", opener=private.opener)
        self._following = threading.Thread(target=self._follow, name="tandem-follow", daemon=True)
        self._following.start()
        if self.metrics_port is not None:
            self._metrics = metrics.serve(self.status, self.metrics_port)
            self.metrics_port = self._metrics.server_port
        self.trail.start()
        return self

    def close(self) -> None:
        """End the run and release everything: a native still recording is quit and
        sealed, analyses still running are stopped, then the gate, the metrics endpoint,
        the findings file and the sockets' directory go. finish() ends with it."""
        if self._closed:
            return
        self._closed = True
        self._stop = True
        try:
            self.native.close()
        finally:
            self._native_sealed.set()
            self.trail.close()
            if self.load is not None:
                self.load.close()
            if self._following is not None:
                self._following.join(FOLLOW_CLOSE_S)
            if self.gate is not None:
                self.gate.close()
            if self._gate_server is not None:
                self._gate_server.close()
            if self.trail.findings_file is not None:
                self.trail.findings_file.close()
            if self._metrics is not None:
                self._metrics.shutdown()
                self._metrics.server_close()
            shutil.rmtree(self._tmp, ignore_errors=True)
            drop_idle_cgroup()      # once its threads and VMs have left it

    def _run_options(self, analysis: catalog.Analysis) -> RunOptions:
        """How each analysis VM runs, from this thread of it."""
        self._idle_thread()
        lv = self.libvirt
        return RunOptions(analysis, self._users_analysis_guest(analysis) if self.users_guest or not lv
                          else lv.analysis_guest(analysis), self.workdir,
                          record=self.record_analyses, stop=lambda: self._stop, hang_wall_s=self.hang_wall_s,
                          hold=self.load.held if self.load else None,
                          cpu_idle=self.options.cpu_idle, idle=self.idle_analyses,
                          cpus=_cpu_list(self.analysis_cpus), launcher=lv.analysis_launcher(analysis) if lv else None,
                          line_deps=not self.users_guest, swap_from=self.path if self.users_guest else None,
                          vcpus=self.native.guest.vcpus if self.options.analysis_vcpus == "native" else 1)

    def _users_analysis_guest(self, analysis: catalog.Analysis) -> Guest | None:
        """For the user's VM: the machine the analysis boots, once its root device is known
        (given, on a direct boot's command line, or printed by the native's kernel as it
        boots: waited for, up to ROOT_WAIT_S of wall time, while the native boots; then, for
        FreeBSD, its disks' freebsd-ufs partition)."""
        if not self.users_guest:
            return None
        deadline = time.monotonic() + ROOT_WAIT_S
        while True:
            try:
                root = self.root or guests.native_root(self.path, self.native.manifest,
                                                       from_disks=time.monotonic() > deadline)
            except TandemError as e:        # the log's last block is still being written
                log.debug("%s: reading the native's console for its root device: %s", analysis.name, e)
                root = None
            if root is not None or time.monotonic() > deadline or self._stop:
                break
            time.sleep(0.5)
        if root is None:
            raise TandemError(f"{self.path}: the native's kernel printed no root device (Linux's root=, FreeBSD's "
                              f"'Trying to mount root from') within {ROOT_WAIT_S:.0f}s of wall time; give it with "
                              "--root (e.g. /dev/vda1, ufs:/dev/vtbd0p2)")
        return guests.analysis_guest(self.path, self.native.manifest, analysis, root)

    # --- the native's side ---

    def _native_running(self) -> bool:
        """At the device log's end (the follow thread): how far the native has reached,
        and is it still running. Yielding, the log waits while the native is busy."""
        self._yield()
        now = time.monotonic()
        mark = self._reader.clock_ns if self._reader else 0
        if not self._samples or mark > self._samples[-1][0]:
            with self._lock:
                self.rec.known_ns = max(self.rec.known_ns, mark)
                self._samples.append((mark, now))     # wall lag is measured against these
                del self._samples[:-MARKS_KEPT]
        if now - self._trim_at > TRIM_S:
            self.trail.trim()
            self._trim_at = now
        return self.native.started().process().poll() is None

    def _yield(self) -> None:
        """Yielding (--analysis-priority yield): the analysis VMs running now told to the
        sampler, then, while the native is busy, wait."""
        load = self.load
        if load is None:
            return
        while True:
            load.register({f.run.qemu_pid for f in self.followers if f.run is not None and f.run.qemu_pid})
            if self._stop or load.wait_calm(YIELD_POLL_S):
                return

    def _yielding(self, events):
        """The device log's events, waiting while the native is busy every YIELD_EVENTS
        (a backlog is read no faster than the native leaves CPU time for)."""
        for i, ev in enumerate(events):
            if i % YIELD_EVENTS == 0:
                self._yield()
            yield ev

    def _idle_thread(self) -> None:
        """The calling thread to idle CPU priority, as the analysis VMs are: following
        the native and feeding the analyses is analysis work. Not with a gate, which
        the native waits on (a thread at idle priority holding the GIL would hold it)."""
        if self.idle_analyses and self.gate is None and hasattr(os, "SCHED_IDLE"):
            try:
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))    # this thread only
                if self.analysis_cpus:
                    os.sched_setaffinity(0, self.analysis_cpus)
            except OSError:
                pass
            make_thread_idle()      # out of tandem's own task group too (qemu/vm.make_idle)

    def _follow(self) -> None:
        self._idle_thread()
        reader = self._reader = pcapng.DevlogReader(self.path / bundle.DEVLOG, follow=self._native_running)
        try:
            inputs.InputExtractor(self.rec).feed(self._yielding(reader) if self.load else reader)
        except TandemError as e:        # a damaged log: the analyses end, the native goes on
            self.rec.limits.append(f"following the native's device log stopped: {e}")
        except BaseException as e:      # tandem's own fault: said, raised, and the analyses still end
            self.rec.limits.append(f"following the native's device log stopped: {type(e).__name__}: {e}")
            self.rec.end_ns, self.rec.finished = self.rec.known_ns, True
            raise
        self.rec.end_ns = next((s.end_vm_ns for s in reader.stats if s and s.end_vm_ns), None) \
            or self.rec.known_ns
        # Did the native power off by itself (its ACPI button, a shutdown in the guest)?
        # Then each analysis's button is pressed after its last input (driver): known once
        # finish() has the native's stop reason, before the analyses are told the
        # recording is finished. Tandem's own guest powers off from its console unless
        # its button was pressed (a Ctrl-C).
        self._native_sealed.wait(STOP_REASON_WAIT_S)
        self.rec.powered_off = self.native.stop_reason == "poweroff"
        self.rec.power_button = self.rec.powered_off and (self.users_guest or self.native.button_pressed)
        self.rec.finished = True

    def sample(self) -> None:
        """Note the native's CPU time (from /proc, call from the owning thread, often).
        Its VM clock comes from its device log's clock marks, not from QMP."""
        self.native_cpu_s = cpu_seconds(self.native.started().process().pid) or self.native_cpu_s

    def _hold_native(self) -> bool:
        """Overflow policy "block": hold the native's inputs while a live analysis is full."""
        return self.overflow == Overflow.BLOCK and any(
            f.buffer.over(self.rec.made()) and (f.run is None or f.run.outcome == "running") for f in self.followers)

    # --- the analyses' side ---

    def status(self) -> list[dict]:
        """Per VM: clock, lag behind the native (VM time), buffer fill and peak, findings."""
        native = self.rec.known_ns
        out = [{"vm": "native", "vm_ns": native, "lag_ns": 0, "lag_wall_s": 0.0, "state": "recording"
                if not self.rec.finished else "finished"}]
        if self.gate:       # QEMU's gate reached its bound (told in band: no QMP while serving)
            out[0]["gate_overflows"] = sum(e.kind == "overflow" for e in self.gate.events)
        held = self.load is not None and self.load.held()
        if self.load is not None:
            out[0]["yield_held_s"] = self.load.figures()[0]
        for f in self.followers:
            run = f.run
            # Lag (FreeDA): how old, in the native's VM time and in wall time, is the
            # oldest input this analysis has not taken yet.
            oldest = f.buffer.oldest_ns
            lag_ns = native - oldest if oldest is not None else 0
            out.append({"vm": f.analysis, "vm_ns": run.end_ns if run else 0, "lag_ns": max(0, lag_ns),
                        "lag_wall_s": self._wall_since(oldest) if oldest is not None else 0.0,
                        "buffer_events": f.buffer.events, "buffer_bytes": f.buffer.bytes,
                        "peak_events": f.buffer.peak_events, "peak_bytes": f.buffer.peak_bytes,
                        "blocking": f.buffer.full, "blocks": f.buffer.blocks,
                        "blocked_s": f.buffer.blocked_s + (time.monotonic() - f.buffer.full_since
                                                           if f.buffer.full else 0.0),
                        "findings": len(f.live_findings), "yielding": held,
                        "state": run.outcome if run else "starting"})
        return out

    def _wall_since(self, vm_ns: int) -> float:
        """Wall seconds since the native's clock passed vm_ns (from the samples)."""
        with self._lock:
            for clock, wall in self._samples:
                if clock >= vm_ns:
                    return time.monotonic() - wall
        return 0.0

    # --- the end ---

    def finish(self, timeout: float = 600.0, noise: bool = False) -> Summary:
        """After the native has stopped: seal its bundle, let the analyses run out (those
        still running after `timeout` s are stopped), report: the summary. The run is
        closed at the end, whatever happens."""
        try:
            return self._report(timeout, noise)
        finally:
            self.close()

    def _report(self, timeout: float, noise: bool) -> Summary:
        try:
            self.native.finish()
        finally:
            self._native_sealed.set()
        deadline = time.monotonic() + timeout
        if not self.trail.join(max(1.0, deadline - time.monotonic())):
            self._stop = True
            self.trail.close()
        runs, found = self.trail.results()
        s = summarize(self.path, self.rec, self.analyses, runs, self.specs, noise, self.workdir, found)
        if self.trail.findings_file is not None:
            self.trail.findings_file.close()
        held_s, holds = self.load.figures() if self.load is not None else (0.0, 0)
        if holds:
            s.limits.append(f"yield: the analyses held still {held_s:.1f}s of wall time in all, {holds} time(s), "
                            "while the native was busy (--analysis-priority yield)")
        if self.options.drain:
            self._drain(s)
        if self.gate:
            self.gate.join(10)      # QEMU's gate closed: its last counters
            s.limits += [f"gate: {e.describe()}" for e in self.gate.events if e.kind != "overflow"]
            s.limits += overflow_limits(self.gate.events)
            s.limits += [f"overflow: {f.analysis}'s full buffer held the native's inputs {f.buffer.blocks} "
                         f"time(s), {f.buffer.blocked_s:.1f}s of wall time in all"
                         for f in self.followers if f.buffer.blocks]
            private.write_text(self.workdir / "gate.json", json.dumps(
                {"released": self.gate.released, "dropped": self.gate.dropped, "input_holds": self.gate.holds,
                 "overflows": sum(e.kind == "overflow" for e in self.gate.events), "detached": self.gate.detached,
                 "qemu": self.gate.qemu_stats,      # QEMU's own counters at its end (None: none came)
                 "events": [{"kind": e.kind, "analysis": e.analysis, "flow": e.flow, "offset": e.offset,
                             "native": e.native.decode("latin-1"), "analysis_bytes": e.analysis_bytes.decode("latin-1"),
                             "vm_ns": e.vm_ns, **({"qemu": e.qemu} if e.qemu else {})}
                            for e in self.gate.events]}, indent=1))
        peaks = {f.analysis: {"peak_events": f.buffer.peak_events, "peak_bytes": f.buffer.peak_bytes,
                              "blocks": f.buffer.blocks, "blocked_s": round(f.buffer.blocked_s, 3)}
                 for f in self.followers}
        private.write_text(self.workdir / "buffers.json", json.dumps(peaks, indent=1))
        # For `tandem plan --from`: on a live run every VM's wall time is the native's,
        # so the slowdown is measured in CPU time against the native QEMU's.
        sj = self.workdir / "summary.json"
        data = json.loads(sj.read_text())
        data["live"] = {"native_cpu_s": round(self.native_cpu_s, 3)}
        private.write_text(sj, json.dumps(data, indent=1, default=str))
        return s

    def _drain(self, s: Summary) -> None:
        """Every analysis stopped for lag (detached, lagging) analysed again offline from the
        native's sealed bundle, from its start: its result replaces the live one, so every
        recorded input is analysed in the end (ShadowOptions.drain, --no-drain)."""
        stopped = {r.analysis for r in s.results if r.run.outcome in (model.Outcome.DETACHED, model.Outcome.LAGGING)}
        lagged = [a for a in self.analyses if a.name in stopped]
        if not lagged:
            return
        lv = self.libvirt
        log.info("analysing %s again offline from %s (stopped live for lag)", ", ".join(a.name for a in lagged),
                 self.path)
        d = analyze(self.path, lagged, spec_path=self.spec_path, workdir=self.workdir / "drain", noise=False,
                    record=self.record_analyses, progress=self.on_drain_progress, cpu_idle=self.options.cpu_idle,
                    guests={a.name: lv.analysis_guest(a) for a in lagged} if lv and not self.users_guest else None,
                    root=self.root)
        again = {r.analysis: r for r in d.results}
        for i, r in enumerate(s.results):
            if r.analysis in again:
                s.limits.append(f"{r.analysis}: live, {r.failure}; analysed again offline from the native's "
                                f"bundle (in {self.workdir / 'drain'}; --no-drain skips this): {again[r.analysis].run.outcome}")
                s.results[i] = again[r.analysis]
        s.limits += [x for x in d.limits if x not in s.limits]
        write_summary(self.workdir, s)


def overflow_limits(events) -> list[str]:
    """QEMU's gate overflows, one line a direction: under policy block the gate may fill
    again each time it has drained (gate.json lists every one)."""
    out = []
    for direction in ("outputs", "inputs"):
        evs = [e for e in events if e.kind == "overflow" and e.qemu["direction"] == direction]
        if evs:
            more = f" ({len(evs)} times, the last at VM time {evs[-1].vm_ns / 1e9:.3f}s)" if len(evs) > 1 else ""
            out.append(f"gate: {evs[0].describe()}{more}")
    return out


def analysis_cpuset(spec: str) -> set[int] | None:
    """The CPUs for analysis VMs: "auto" is every CPU tandem may use but the lowest,
    left to the native (none to pin when there is only one), "all" pins nothing, else
    a list such as "1,3-5" of CPUs tandem may use.

    Why: on the benchmark machine two busy loops at idle priority raise a recording's
    p99 latency 2.4x when they may run on every core, and within the machine's noise
    when kept off one (the control in docs/benchmarks.md, shadow-latency)."""
    allowed = os.sched_getaffinity(0)
    if spec == "all":
        return None
    if spec == "auto":
        return set(sorted(allowed)[1:]) or None
    cpus: set[int] = set()
    try:
        for part in spec.split(","):
            lo, dash, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi if dash else lo) + 1))
    except ValueError:
        raise TandemError(f"--analysis-cpus {spec!r}: not auto, all or a CPU list such as 1,3-5") from None
    if not cpus or not cpus <= allowed:
        raise TandemError(f"--analysis-cpus {spec!r}: CPUs {sorted(cpus - allowed) or 'none'} are not "
                          f"available (available: {_cpu_list(allowed)})")
    return cpus


def _cpu_list(cpus: set[int] | None) -> str | None:
    return ",".join(map(str, sorted(cpus))) if cpus else None
