#!/usr/bin/env python3
"""Benchmark: what device-mode recording costs a multi-vCPU native under load.

The reference VM (scripts/build-refvm.sh: Debian 12 booted by its own GRUB, nginx and
redis) with 2 vCPUs on multi-threaded TCG, in two configurations run side by side, round
by round, which goes first alternating (the machine is shared and noisy; medians of
per-round ratios):
  plain    tandem's QEMU running the VM, nothing recorded (the baseline)
  device   `tandem record --mode device --smp 2` of the same disk (the device log alone)
  N shadows (--shadows) the device-mode recording with N live shadows trailing it
  N shadows in DIR (--shadows-in DIR) the same with the shadows' work directories
           (their overlays, logs) in DIR, a tmpfs such as /dev/shm: what the shadows'
           disk writeback costs the native
  N idle loops (--idle-loops N) the control: the device-mode recording with N busy loops
           where the shadows run (idle CPU priority, the idle cgroup, the analysis CPUs)
           and no tandem in them: what any busy work there costs the native on this machine
The workload, every round: power-on to nginx answering, then wrk for --wrk-seconds over
4 kept-alive connections. Besides wrk's throughput and p99, what the native's QEMU used
per request, which the p99 of a shared 2-core machine cannot resolve: its CPU time, its
threads' time waiting on the run queue (/proc/PID/task/TID/schedstat, the second field),
and their involuntary context switches; tandem's own CPU time per request (this
process: the recording's and the shadows' threads, at whatever priority each runs); and
the machine's steal time per request (/proc/stat: time its CPUs wanted and the hypervisor
under it gave to others).

Paired slices (--slices N): the whole-run ratios above move more from round to round on
this machine than the 3% they are held to, as the machine's speed does (steal time, the
other VMs on its host). So each of these runs once and measures within itself: wrk in
2-second slices, in pairs, one slice with everything tandem added to the recording
running and one with it stopped (SIGSTOP: tandem's process and its analysis VMs, all but
the native's QEMU), which goes first alternating pair by pair; the ratio of the native's
run-queue wait per request, on over off, is taken pair by pair (slices seconds apart see
the same machine) and its median given with a bootstrap interval:
  slices: 2 shadows   `tandem shadow --mode device` with kasan and lockdep
  slices: 2 shadows' VMs the same, only the analysis VMs stopped (tandem's process runs
                       in both halves): the VMs' part of the shadows' cost
  slices: 2 shadows' tandem the same, only tandem's process stopped (the VMs run in both
                       halves, on what they were given before the stop)
  slices: 2 idle loops the recording with 2 busy loops where the shadows run (control)
  slices: recorder     `tandem record --mode device`, its own process stopped and run
                       (the QEMU writes the device log either way)
  slices: A/A          `tandem record --mode device`, nothing stopped: what the method
                       reads when the two halves differ in nothing
  slices: 2 shadows yielding the 2 shadows under --analysis-priority yield
With --attribute K, K more pairs of each configuration are traced (perf's scheduler
events, bench/sched_trace.py; not in the ratios, as the tracing is load of its own): the
native's run-queue wait per request behind the processes the configuration adds, which
the trace resolves where the ratios cannot.

Usage: python bench/device_mode.py --runs 3 [--shadows 1,2 [--shadows-in /dev/shm]] [--slices 20] --out docs/benchmarks.md
"""
from __future__ import annotations

import argparse
import os
import random
import re
import shlex
import signal
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "replay"))

import sched_trace  # noqa: E402
from record_replay import replace_section  # noqa: E402

from tandem import artifacts, catalog  # noqa: E402
from tandem.live.shadow import ShadowOptions, ShadowRun, analysis_cpuset  # noqa: E402
from tandem.machine import Forward, Guest, Run, UserNet  # noqa: E402
from tandem.qemu.image import make_overlays  # noqa: E402
from tandem.qemu.vm import VM, alive, cpu_seconds, free_port, make_idle  # noqa: E402
from tandem.record import clients  # noqa: E402
from tandem.record.recording import Recording  # noqa: E402

SECTION, TITLE = "device_mode", "## Device-mode recording of a 2-vCPU native under load"
SLICES_SECTION = "device_mode_slices"
SLICES_TITLE = "## What live shadows cost a device-mode native, in paired slices"
VCPUS = 2
WRK_SECONDS = 10


def sched(pid: int) -> tuple[float, int]:
    """(seconds the process's threads waited on a run queue, their involuntary context
    switches) so far, summed over its threads."""
    wait, switches = 0, 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            wait += int((task / "schedstat").read_text().split()[1])
            status = (task / "status").read_text()
        except (OSError, IndexError, ValueError):
            continue        # a thread gone meanwhile
        switches += int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
    return wait / 1e9, switches


def drive(http: int, alive, pid: int, cpu, wrk_seconds: int, t0: float) -> dict[str, float]:
    """Power-on to nginx, then wrk; the figures per request."""
    clients.wait_for(lambda: clients.http_up(http), "nginx", 900, alive)
    boot = time.monotonic() - t0
    c0, (w0, s0), p0, st0 = cpu(), sched(pid), time.process_time(), steal()
    w = clients.wrk(http, seconds=wrk_seconds)
    c1, (w1, s1), p1, st1 = cpu(), sched(pid), time.process_time(), steal()
    n = max(1, w.requests)
    return {"boot_s": boot, "wrk_rps": w.per_s, "wrk_p99_ms": w.p99_ms or 0.0, "requests": w.requests,
            "cpu_ms_per_req": 1000 * (c1 - c0) / n, "runq_us_per_req": 1e6 * (w1 - w0) / n,
            "invol_per_req": (s1 - s0) / n, "tandem_ms_per_req": 1000 * (p1 - p0) / n,
            "steal_us_per_req": 1e6 * (st1 - st0) / n}


def steal() -> float:
    """Seconds of steal time so far, all CPUs (/proc/stat's first line, its 8th field)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0


def refvm_guest() -> Guest:
    ref = artifacts.refvm()
    g = Guest.of_disks([(ref["disk"], ref["disk_format"])])
    g.vcpus = VCPUS
    return g


def run_plain(tmp: Path, wrk_seconds: int) -> dict[str, float]:
    g = refvm_guest()
    d = Path(tempfile.mkdtemp(dir=tmp))
    make_overlays(g, d / "o.qcow2")
    http = free_port()
    run = Run(d, net=UserNet(forwards=(Forward("tcp", http, 80),)), overlay=d / "o.qcow2", icount=False)
    t0 = time.monotonic()
    with VM(g, run) as vm:
        fig = drive(http, lambda: vm.process().poll() is None, vm.process().pid, lambda: vm.cpu_seconds() or 0.0,
                    wrk_seconds, t0)
        vm.powerdown()
        vm.wait(300)
    return fig


def run_device(tmp: Path, wrk_seconds: int) -> dict[str, float]:
    path = Path(tempfile.mkdtemp(dir=tmp)) / "refvm.tdm"
    http = free_port()
    t0 = time.monotonic()
    with Recording(path, refvm_guest(), forwards=(Forward("tcp", http, 80),), mode="device") as rec:
        vm = rec.started()
        fig = drive(http, rec.running, vm.process().pid, lambda: vm.cpu_seconds() or 0.0, wrk_seconds, t0)
        rec.powerdown()
        rec.wait(timeout=300)
    return fig


SHADOWS = ("kasan", "lockdep")     # the live shadows of the "N shadows" configurations, in order


def start_idle_loops(n: int) -> list[subprocess.Popen]:
    """n busy loops where live shadows run: the analysis CPUs of --analysis-cpus auto,
    SCHED_IDLE, the idle cgroup."""
    cpus = ",".join(map(str, sorted(analysis_cpuset("auto") or os.sched_getaffinity(0))))
    loops = [subprocess.Popen(["taskset", "--cpu-list", cpus, "chrt", "--idle", "0", sys.executable, "-c",
                               "while True: pass"], start_new_session=True) for _ in range(n)]
    for p in loops:
        make_idle(p.pid)
    return loops


def run_idle_loops(tmp: Path, wrk_seconds: int, n: int) -> dict[str, float]:
    """The device-mode recording with n busy loops where live shadows run (the analysis
    CPUs of --analysis-cpus auto, SCHED_IDLE, the idle cgroup), no tandem in them."""
    loops = start_idle_loops(n)
    try:
        return run_device(tmp, wrk_seconds)
    finally:
        for p in loops:
            p.kill()
            p.wait()


def run_shadows(tmp: Path, wrk_seconds: int, n: int, work: Path | None = None) -> dict[str, float]:
    """The device-mode recording with n live shadows trailing it (release now, SCHED_IDLE,
    as `tandem shadow` runs them), their work directories in `work` (default beside the
    recording): the native's figures while wrk runs; whether every shadow still had room
    in its buffer at wrk's end (none detached or blocked)."""
    path = Path(tempfile.mkdtemp(dir=tmp)) / "refvm.tdm"
    http = free_port()
    t0 = time.monotonic()
    workdir = Path(tempfile.mkdtemp(dir=work, prefix="tandem-bench-an-")) if work else path.with_name("an")
    sh = ShadowRun(path, [catalog.ANALYSES[a] for a in SHADOWS[:n]], ShadowOptions(record_mode="device"),
                   guest=refvm_guest(), forwards=(Forward("tcp", http, 80),), workdir=workdir)
    with sh:
        vm = sh.native.started()
        fig = drive(http, sh.native.running, vm.process().pid, lambda: vm.cpu_seconds() or 0.0, wrk_seconds, t0)
        shadows = sh.status()[1:]
        fig["room"] = float(all(s["state"] not in ("detached",) and not s["blocking"] for s in shadows))
        fig["shadows_started"] = float(sum(s["state"] != "starting" for s in shadows))
    if work:
        shutil.rmtree(workdir, ignore_errors=True)
    return fig


SLICE_S = 2
SLICE_BUFFER_EVENTS, SLICE_BUFFER_BYTES = 4_000_000, 4 << 30
SLICE_KINDS = ("2 shadows", "2 shadows yielding", "2 shadows' VMs", "2 shadows' tandem", "2 idle loops", "recorder",
               "A/A")
SHADOW_KINDS = ("2 shadows", "2 shadows yielding", "2 shadows' VMs", "2 shadows' tandem")


def _children(pid: int) -> list[int]:
    """Every process descended from pid."""
    kids: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        try:
            stat = (p / "stat").read_text()
            kids.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(p.name))
        except (OSError, ValueError, IndexError):
            continue
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _native(pid: int, http: int) -> int | None:
    """The native's QEMU among pid's children: the one forwarding the host port."""
    for c in _children(pid):
        try:
            if f":{http}-:".encode() in Path(f"/proc/{c}/cmdline").read_bytes():
                return c
        except OSError:
            continue
    return None


def _tids(pids: list[int]) -> set[int]:
    """The threads of these processes now."""
    out: set[int] = set()
    for pid in pids:
        try:
            out.update(int(t) for t in os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue
    return out


def slice_run(tmp: Path, kind: str, pairs: int, attribute: int = 0) -> tuple[list[dict[str, float]], dict | None]:
    """One device-mode recording of the reference VM, under tandem's CLI as a user runs
    it; once nginx answers (and the shadows have booted), `pairs` pairs of wrk slices,
    one with what `kind` adds to the recording stopped and one with it running. Per
    pair: the on/off ratios of the native's run-queue wait, CPU time and involuntary
    switches per request. Then `attribute` more pairs, traced: the native's wait per
    request behind what the configuration adds, running and stopped (None untraced)."""
    d = Path(tempfile.mkdtemp(dir=tmp))
    http = free_port()
    ref = artifacts.refvm()
    guest = ["--mode", "device", "--smp", str(VCPUS), "--disk", ref["disk"], "--forward", f"tcp:{http}:80"]
    if kind in SHADOW_KINDS:
        metrics = free_port()
        # buffers for every input of the slices: a shadow at idle priority takes only what
        # the saturated native leaves, and one that detached would cost nothing
        cmd = ["shadow", "--analysis", ",".join(SHADOWS), "--no-drain", "--workdir", str(d / "an"),
               "--metrics-port", str(metrics), "--buffer-events", str(SLICE_BUFFER_EVENTS),
               "--buffer-bytes", str(SLICE_BUFFER_BYTES), *guest]
        if kind == "2 shadows yielding":
            cmd[1:1] = ["--analysis-priority", "yield"]
    else:
        cmd = ["record", *guest]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "replay")}
    with open(d / "tandem.log", "wb") as said:
        tandem = subprocess.Popen([sys.executable, "-m", "tandem", *cmd, str(d / "refvm.tdm")], env=env,
                                  stdout=subprocess.DEVNULL, stderr=said, start_new_session=True)
    loops: list[subprocess.Popen] = []
    native: int | None = None
    try:
        clients.wait_for(lambda: clients.http_up(http), "nginx", 900, lambda: tandem.poll() is None)
        native = _native(tandem.pid, http)
        if native is None:
            raise RuntimeError(f"{kind}: the native's QEMU not found among tandem's processes")
        if kind == "2 idle loops":
            loops = start_idle_loops(2)
        elif kind in SHADOW_KINDS:     # the shadows booted (at idle priority) before the slices begin
            up = _clocks(metrics).get("native", 0.0)
            clients.wait_for(lambda: _shadows_caught_up(metrics, up), "the shadows' boot", 900,
                             lambda: tandem.poll() is None)

        windows: list[tuple[float, float, bool, int, set[int]]] = []    # traced: (from, to, on, requests, theirs)

        def one(running: bool, traced: bool = False) -> dict[str, float]:
            vms = [c for c in _children(tandem.pid) if c != native]
            tandems = ([] if kind == "A/A" else vms if kind == "2 shadows' VMs" else
                       [tandem.pid] if kind == "2 shadows' tandem" else [tandem.pid, *vms])
            for pid in [*tandems, *(p.pid for p in loops)]:
                try:
                    os.kill(pid, signal.SIGCONT if running else signal.SIGSTOP)
                except ProcessLookupError:
                    pass        # a short-lived helper of tandem's (qemu-img, chrt), gone
            (w0, s0), c0, t0 = sched(native), cpu_seconds(native) or 0.0, time.monotonic()
            w = clients.wrk(http, seconds=SLICE_S)
            (w1, s1), c1 = sched(native), cpu_seconds(native) or 0.0
            n = max(1, w.requests)
            if traced:      # everything of tandem's but the native, and the loops
                windows.append((t0, time.monotonic(), running, n, _tids([tandem.pid, *vms, *(p.pid for p in loops)])))
            return {"runq": (w1 - w0) / n, "cpu": (c1 - c0) / n, "invol": (s1 - s0) / n}
        out = []
        trace = None
        for i in range(pairs + attribute):
            first = i % 2 == 0
            traced = i >= pairs     # after the ratios' pairs: tracing is load of its own, more with more to trace
            if traced and trace is None:
                trace = sched_trace.record(d / "sched.data")
                time.sleep(2)       # perf's start (its first events come some 0.5 s after it is run)
            a, b = one(first, traced), one(not first, traced)
            on, off = (a, b) if first else (b, a)
            if not traced:
                out.append({k: on[k] / off[k] for k in on if off[k]})
        blame = None
        if trace is not None:
            sched_trace.stop(trace)
            blame = _blame(d / "sched.data", _tids([native]), windows)
        one(True)
        if kind in SHADOW_KINDS:     # still trailing it at the end: none detached or failed
            states = _states(metrics)
            if sorted(a for a, st in states.items() if st == "running") != sorted(SHADOWS):
                log = (d / "tandem.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{kind}: the shadows' states at the end: {states}; tandem said: {log}")
        return out, blame
    finally:
        for p in loops:
            p.kill()
            p.wait()
        for pid in [tandem.pid, *_children(tandem.pid)]:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        # Ctrl-C: the guest's power button; once the native has powered off, what the
        # shadows still trail is not measured, so they are killed rather than waited for
        tandem.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 120
        while native is not None and alive(native) and time.monotonic() < deadline:
            time.sleep(0.5)
        try:
            tandem.wait(10)
        except subprocess.TimeoutExpired:
            for pid in [*_children(tandem.pid), tandem.pid]:   # its VMs are sessions of their own
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            tandem.wait()


def _blame(data: Path, native: set[int], windows: list[tuple[float, float, bool, int, set[int]]]) -> dict:
    """From the trace: per request, the native's run-queue wait and its part behind what
    the configuration adds, in the slices with it running and in those with it stopped."""
    got = sched_trace.waits(sched_trace.script(data), native, [(a, b) for a, b, *_ in windows])
    out = {}
    for half, on in (("on", True), ("off", False)):
        sel = [(w, win) for w, win in zip(got, windows) if win[2] == on]
        n = sum(win[3] for _, win in sel) or 1
        out[half] = (sum(w.total for w, _ in sel) / n, sum(w.behind_any(win[4]) for w, win in sel) / n)
    return out


def _metrics(port: int) -> str:
    """`tandem shadow`'s metrics page; "" if it does not answer."""
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return ""


def _clocks(port: int) -> dict[str, float]:
    """Each VM's VM clock (seconds), by the metrics."""
    return {vm: float(v) for vm, v in re.findall(r'^tandem_vm_clock_seconds\{vm="([^"]+)"\} (\S+)', _metrics(port), re.M)}


def _states(port: int) -> dict[str, str]:
    """Each VM's state (running, detached, ...), by the metrics."""
    labels = [dict(re.findall(r'(\w+)="([^"]*)"', m))
              for m in re.findall(r"^tandem_vm_running\{([^}]*)\}", _metrics(port), re.M)]
    return {m["vm"]: m["state"] for m in labels if "vm" in m and "state" in m}


def _shadows_caught_up(port: int, vm_s: float) -> bool:
    """Every shadow's VM clock at vm_s or past it (booted as far as the native was)."""
    clocks = _clocks(port)
    return all(clocks.get(a, 0.0) >= vm_s for a in SHADOWS)


def _interval(xs: list[float], n: int = 2000) -> tuple[float, float]:
    """A 95% bootstrap interval of the median of xs."""
    rng = random.Random(1)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n)]


def slices_report(pairs: int, kinds: tuple[str, ...] = SLICE_KINDS, attribute: int = 0) -> str:
    rows: dict[str, list[dict[str, float]]] = {}
    blames: dict[str, dict | None] = {}
    with tempfile.TemporaryDirectory(prefix="tandem-bench-") as t:
        for kind in kinds:
            rows[kind], blames[kind] = slice_run(Path(t), kind, pairs, attribute)
            print(f"slices {kind}: run-queue on/off median {statistics.median(r['runq'] for r in rows[kind]):.3f}",
                  file=sys.stderr)
    kinds_arg = "" if kinds == SLICE_KINDS else f"--slice-kinds {shlex.quote(','.join(kinds))} "
    attr_arg = f"--attribute {attribute} " if attribute else ""
    lines = [f"Paired slices: each configuration one run of the reference VM recorded in device mode "
             f"under tandem's CLI; {pairs} pairs of {SLICE_S}-second wrk slices (4 connections), one slice "
             f"with what the configuration adds stopped (SIGSTOP) and one with it running, which goes first "
             f"alternating; per pair the ratio on/off of the native QEMU's figure per request; the median "
             f"of the pairs with a 95% bootstrap interval. Command: `python bench/device_mode.py --slices {pairs} "
             f"{kinds_arg}{attr_arg}"
             f"--out docs/benchmarks.md`.", "",
             "| configuration (running over stopped) | run-queue wait/req | 95% interval | CPU/req | "
             "invol. switches/req | met (<= 1.03x) |",
             "|---|---|---|---|---|---|"]
    for kind, r in rows.items():
        rq = [x["runq"] for x in r]
        lo, hi = _interval(rq)
        med = statistics.median(rq)
        target = f"{'yes' if med <= 1.03 else 'no'}" if kind in ("2 shadows", "2 shadows yielding") else "-"
        lines.append(f"| {kind} | {med:.3f}x | {lo:.3f}-{hi:.3f}x | "
                     f"{statistics.median(x['cpu'] for x in r):.3f}x | "
                     f"{statistics.median(x['invol'] for x in r):.3f}x | {target} |")
    if attribute:
        lines += ["", f"Traced (perf's scheduler events, {attribute} more pairs of each, not in the ratios above; "
                  "bench/sched_trace.py): "
                  "the native's run-queue wait per request, and its part behind the processes the configuration "
                  "adds (tandem's, its analysis VMs and their helpers, the loops), which ran on the CPU the native "
                  "thread then ran on.", "",
                  "| configuration | running: wait/req | behind its processes | share | "
                  "stopped: wait/req | behind its processes |", "|---|---|---|---|---|---|"]
        for kind, b in blames.items():
            if b is not None:
                (on_w, on_b), (off_w, off_b) = b["on"], b["off"]
                lines.append(f"| {kind} | {1e6 * on_w:.1f} us | {1e6 * on_b:.2f} us | "
                             f"{100 * on_b / on_w if on_w else 0:.1f}% | {1e6 * off_w:.1f} us | {1e6 * off_b:.2f} us |")
    return "\n".join(lines) + "\n"


def report(runs: int, wrk_seconds: int, shadows: tuple[int, ...] = (), shadows_in: Path | None = None,
           idle_loops: int = 0) -> str:
    kinds = ["plain", "device", *(f"{n} shadows" for n in shadows),
             *(f"{n} shadows in {shadows_in}" for n in shadows if shadows_in),
             *([f"{idle_loops} idle loops"] if idle_loops else [])]
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory(prefix="tandem-bench-") as t:
        for i in range(runs):
            # which goes first turns round by round: what a run leaves (its overlay's
            # writeback and removal) falls on the next one
            for kind in kinds[i % len(kinds):] + kinds[:i % len(kinds)]:
                if kind == "plain":
                    fig = run_plain(Path(t), wrk_seconds)
                elif kind == "device":
                    fig = run_device(Path(t), wrk_seconds)
                elif kind.endswith(" idle loops"):
                    fig = run_idle_loops(Path(t), wrk_seconds, idle_loops)
                else:
                    fig = run_shadows(Path(t), wrk_seconds, int(kind.split()[0]),
                                      shadows_in if kind.endswith(f" in {shadows_in}") else None)
                rows[kind].append(fig)
            print(f"round {i + 1}/{runs}: " + ", ".join(f"{k} {v[-1]['wrk_rps']:.0f} req/s" for k, v in rows.items()),
                  file=sys.stderr)

    def ratio(field: str, inverse: bool = False, of: str = "device", to: str = "plain") -> float:
        r = [(p[field] / d[field]) if inverse else (d[field] / p[field]) for p, d in zip(rows[to], rows[of])
             if (d[field] if inverse else p[field])]
        return statistics.median(r) if r else float("nan")
    yes = lambda ok: "yes" if ok else "no"  # noqa: E731
    thr, p99 = ratio("wrk_rps", inverse=True), ratio("wrk_p99_ms")
    lines = [
        f"Reference VM (Debian 12, its own GRUB and systemd; nginx), {VCPUS} vCPUs on multi-threaded TCG, "
        f"{runs} interleaved rounds, which goes first turning round by round; ratios are the median of each round's device/plain. Workload: power-on to "
        f"nginx answering, wrk {wrk_seconds} s x 4 kept-alive connections. Measured on this project's 2-core "
        f"machine, nothing else running. Command: `python bench/device_mode.py --runs {runs}"
        f"{f' --wrk-seconds {wrk_seconds}' if wrk_seconds != WRK_SECONDS else ''}"
        f"{' --shadows ' + ','.join(map(str, shadows)) if shadows else ''}"
        f"{f' --shadows-in {shadows_in}' if shadows_in else ''}"
        f"{f' --idle-loops {idle_loops}' if idle_loops else ''} --out docs/benchmarks.md`.",
        "",
        "| target | measured | met |",
        "|---|---|---|",
        f"| device-mode wrk throughput within 1.03x of plain | {thr:.3f}x | {yes(thr <= 1.03)} |",
        f"| device-mode wrk p99 (no target: a shared 2-core machine's p99 moves round by round) | {p99:.3f}x | - |",
        "",
        "Per wrk request, the native's QEMU (device over plain, median of the rounds' ratios): "
        f"CPU time {ratio('cpu_ms_per_req'):.3f}x, run-queue wait {ratio('runq_us_per_req'):.3f}x, "
        f"involuntary context switches {ratio('invol_per_req'):.3f}x.",
        "",
        "| configuration | boot to nginx (s) | wrk req/s | wrk p99 (ms) | CPU ms/req | run-queue us/req | "
        "invol. switches/req | tandem's CPU ms/req | steal us/req |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for k, v in rows.items():
        m = {f: statistics.median(r[f] for r in v) for f in v[0]}
        lines.append(f"| {k} | {m['boot_s']:.1f} | {m['wrk_rps']:.0f} | {m['wrk_p99_ms']:.2f} | "
                     f"{m['cpu_ms_per_req']:.3f} | {m['runq_us_per_req']:.1f} | {m['invol_per_req']:.3f} | "
                     f"{m['tandem_ms_per_req']:.3f} | {m['steal_us_per_req']:.1f} |")
    if shadows:
        lines += ["", f"Live shadows ({', '.join(SHADOWS)}, in that order; release now, at idle CPU priority, "
                  "as `tandem shadow` runs them) trailing the device-mode recording, against the recording alone "
                  "(median of each round's ratio):", "",
                  "| with the recording | run-queue wait/req | CPU/req | invol. switches/req | wrk req/s (plain over) | "
                  "wrk p99 (over plain) | rounds every shadow had buffer room |",
                  "|---|---|---|---|---|---|---|"]
        for k in (k for k in kinds if "shadows" in k or "idle loops" in k):
            room = f"{sum(int(r['room']) for r in rows[k])}/{runs}" if "room" in rows[k][0] else "-"
            lines.append(f"| {k} | {ratio('runq_us_per_req', of=k, to='device'):.3f}x | "
                         f"{ratio('cpu_ms_per_req', of=k, to='device'):.3f}x | "
                         f"{ratio('invol_per_req', of=k, to='device'):.3f}x | "
                         f"{ratio('wrk_rps', inverse=True, of=k):.3f}x | {ratio('wrk_p99_ms', of=k):.3f}x | "
                         f"{room} |")
        if max(shadows) == 2:
            rq = ratio("runq_us_per_req", of="2 shadows", to="device")
            lines += ["", "| target | measured | met |", "|---|---|---|",
                      f"| run-queue wait per request with 2 shadows within 3% of recording only | {rq:.3f}x | "
                      f"{yes(rq <= 1.03)} |"]
            if shadows_in:
                rq = ratio("runq_us_per_req", of=f"2 shadows in {shadows_in}", to="device")
                lines.append(f"| the same, the shadows' work in {shadows_in} | {rq:.3f}x | {yes(rq <= 1.03)} |")
            if idle_loops:
                rq = ratio("runq_us_per_req", of=f"{idle_loops} idle loops", to="device")
                lines.append(f"| (control, no target: {idle_loops} busy loops where the shadows run, no tandem) | "
                             f"{rq:.3f}x | - |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--wrk-seconds", type=int, default=WRK_SECONDS)
    ap.add_argument("--shadows", default="", help="also the recording with this many live shadows "
                    "(comma-separated, of 1 and 2; e.g. 1,2)")
    ap.add_argument("--shadows-in", type=Path, metavar="DIR",
                    help="also each shadow configuration with the shadows' work directories in DIR (a tmpfs)")
    ap.add_argument("--idle-loops", type=int, default=0, metavar="N",
                    help="also the control: the recording with N busy loops where the shadows run")
    ap.add_argument("--slices", type=int, default=0, metavar="PAIRS",
                    help="instead: the paired-slice measurement, PAIRS pairs per configuration")
    ap.add_argument("--slice-kinds", metavar="KINDS", help="with --slices: only these configurations "
                    f"(comma-separated, of: {', '.join(SLICE_KINDS)})")
    ap.add_argument("--attribute", type=int, default=0, metavar="K",
                    help="with --slices: also K more pairs of each configuration, traced with perf "
                         "(the native's wait behind what the configuration adds)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.slices:
        kinds = tuple(args.slice_kinds.split(",")) if args.slice_kinds else SLICE_KINDS
        if not set(kinds) <= set(SLICE_KINDS):
            ap.error(f"--slice-kinds {args.slice_kinds}: of {', '.join(SLICE_KINDS)}")
        if args.attribute and (why := sched_trace.available()):
            ap.error(f"--attribute: {why}")
        if not 0 <= args.attribute <= 100:
            ap.error(f"--attribute {args.attribute}: between 0 and 100")
        text = slices_report(args.slices, kinds, args.attribute)
        print(text)
        if args.out:
            replace_section(args.out, f"{SLICES_TITLE}\n\n{text}", SLICES_SECTION)
        return 0
    shadows = tuple(int(n) for n in args.shadows.split(",") if n)
    if any(not 1 <= n <= len(SHADOWS) for n in shadows):
        ap.error(f"--shadows {args.shadows}: each between 1 and {len(SHADOWS)}")
    if args.shadows_in and not (shadows and args.shadows_in.is_dir()):
        ap.error(f"--shadows-in {args.shadows_in}: a directory, with --shadows")
    if not 0 <= args.idle_loops <= 8:
        ap.error(f"--idle-loops {args.idle_loops}: between 0 and 8")
    text = report(args.runs, args.wrk_seconds, shadows, args.shadows_in, args.idle_loops)
    print(text)
    if args.out:
        replace_section(args.out, f"{TITLE}\n\n{text}", SECTION)
    return 0


if __name__ == "__main__":
    sys.exit(main())
