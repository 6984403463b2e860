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

Usage: python bench/device_mode.py --runs 3 [--shadows 1,2 [--shadows-in /dev/shm]] --out docs/benchmarks.md
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "replay"))

from record_replay import replace_section  # noqa: E402

from tandem import artifacts, catalog  # noqa: E402
from tandem.live.shadow import ShadowOptions, ShadowRun, analysis_cpuset  # noqa: E402
from tandem.machine import Forward, Guest, Run, UserNet  # noqa: E402
from tandem.qemu.image import make_overlays  # noqa: E402
from tandem.qemu.vm import VM, free_port, make_idle  # noqa: E402
from tandem.record import clients  # noqa: E402
from tandem.record.recording import Recording  # noqa: E402

SECTION, TITLE = "device_mode", "## Device-mode recording of a 2-vCPU native under load"
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


def run_idle_loops(tmp: Path, wrk_seconds: int, n: int) -> dict[str, float]:
    """The device-mode recording with n busy loops where live shadows run (the analysis
    CPUs of --analysis-cpus auto, SCHED_IDLE, the idle cgroup), no tandem in them."""
    cpus = ",".join(map(str, sorted(analysis_cpuset("auto") or os.sched_getaffinity(0))))
    loops = [subprocess.Popen(["taskset", "--cpu-list", cpus, "chrt", "--idle", "0", sys.executable, "-c",
                               "while True: pass"], start_new_session=True) for _ in range(n)]
    try:
        for p in loops:
            make_idle(p.pid)
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
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
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
