#!/usr/bin/env python3
"""Benchmark: semantic replay of heavy recordings, offline.

Two parts, each measured in one run side by side:
  memory  tandem's own memory (the Python process's resident set, sampled every 0.25 s)
          while it replays a heavy demo recording into an analysis, for recordings of two
          lengths (default 20 s and 120 s of four keep-alive clients pipelining SET/GET):
          it must not grow with the recording's length (the reading is paced by the
          analysis, and what every analysis is done with is dropped: semantic/trail.py).
  ratio   the same replay's wall time against the analysis kernel serving the same
          requests live (a recording of the demo guest booted with that kernel, its
          clients making as many requests as the native's recording holds): target 1.1x.
          The replay holds the host's CPUs out of idle, as tandem does by default
          (qemu/wake_latency.py); the live kernel is run both ways, as a user runs it and
          with the CPUs held awake too, so the ratio is also seen on equal terms.
          CPU time too (this process's and its children's, the QEMUs: tandem and the
          analysis VM against the clients and the live VM). This machine's speed changes
          by up to 1.8x from one second to the next (a CPU-bound loop, alone, took 0.83 to
          1.83 s), CPU time with it, so a ratio of wall or CPU times says more about the
          host than about tandem. Each run is therefore split into what noise scales and
          what it does not: the guest instructions it executed (the VM's icount, from its
          own recording: a count no host noise changes), the time its vCPU thread ran
          (schedstat), per instruction, and the rest of its wall time, in which the vCPU did
          not run (for the replay: held at a horizon while tandem answers, and asleep
          while the main loop warps an idle guest's clock; for the live run: booting and
          idle). The vCPU's time per instruction rises with what runs on the other core
          (bench/neighbour.py). Runs alternate, so that a drift of the host over minutes
          reaches both: a replay slower per instruction than the live runs on both sides
          of it is tandem's cost, not the host's. Two VMs run at once on this machine's 2
          cores fight for them (the replay's vCPU waits on tandem, which waits for a core):
          that measures the cores, not tandem, and is not done.

Usage: ./tandem bench offline-heavy [--seconds 20,120] [--analysis kasan] [--only memory|ratio] [--reps N]
       (python bench/offline_heavy.py --out docs/benchmarks.md ...)
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "replay"))

from record_replay import replace_part  # noqa: E402

from tandem import catalog  # noqa: E402
from tandem.formats import rrstream  # noqa: E402
from tandem.machine import Guest  # noqa: E402
from tandem.qemu import wake_latency  # noqa: E402
from tandem.record.recording import Recording  # noqa: E402
from tandem.record.workload import KV  # noqa: E402
from tandem.semantic.analyze import analyze  # noqa: E402

SECTION, TITLE, PARTS = "offline_heavy", "## Offline semantic replay of heavy recordings", \
    ("memory", "ratio")
CLIENTS = 4


def hammer(port: int, *, seconds: float | None = None, requests: int | None = None) -> int:
    """CLIENTS keep-alive clients pipelining SET/GET pairs, for `seconds` or until
    `requests` in all; the requests made."""
    made = [0] * CLIENTS
    stop = time.monotonic() + seconds if seconds else None
    each = -(-requests // (2 * CLIENTS)) if requests else None

    def one(n: int) -> None:
        with KV(port) as kv:
            while (stop is None or time.monotonic() < stop) and (each is None or made[n] < each):
                kv.requests([f"SET k{n}-{made[n]} {made[n]}", f"GET k{n}-{made[n]}"])
                made[n] += 1
    threads = [threading.Thread(target=one, args=(n,)) for n in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 2 * sum(made)


def record(path: Path, guest: Guest | None = None, **load) -> tuple[int, float]:
    """A demo-guest recording under the heavy load: (requests, wall seconds power-on to off)."""
    n, wall, _ = record_timed(path, guest, **load)
    return n, wall


def record_timed(path: Path, guest: Guest | None = None, **load) -> tuple[int, float, tuple[float, float]]:
    """record(), and the CPU seconds it took: (here: the clients and tandem, the QEMU)."""
    t0, (me0, kids0) = time.monotonic(), cpu_split()
    with Recording(path, guest) as rec:
        rec.wait_ready()
        n = hammer(rec.port, **load)
        rec.serial.type("poweroff")
        rec.wait(timeout=600)
    me, kids = cpu_split()
    print(f"record {path.name}: {me - me0:.1f} s CPU here (clients, tandem), {kids - kids0:.1f} s in QEMU",
          file=sys.stderr)
    return n, time.monotonic() - t0, (me - me0, kids - kids0)


def icount(bundle: Path) -> int:
    """The guest instructions a recorded run executed (its record/replay log's last count)."""
    n = rrstream.scan(bundle / "replay.tdrs").last_icount
    if n is None:
        raise SystemExit(f"{bundle}: its record/replay log has no instruction count")
    return n


def live(path: Path, analysis: str, requests: int, awake: bool = False) -> dict:
    """The analysis kernel serving `requests` live (recorded, power-on to off); with `awake`
    the host's CPUs held out of idle meanwhile, as a replay holds them (qemu/wake_latency.py)."""
    with VcpuTime() as vcpu, wake_latency.held(awake):
        n, wall, (here, qemu) = record_timed(path, Guest.for_analysis(catalog.get(analysis)), requests=requests)
    return {"requests": n, "wall_s": wall, "cpu_here_s": here, "cpu_qemu_s": qemu, "cpu_s": here + qemu,
            "icount": icount(path), "vcpu_s": vcpu.seconds}


def cpu_s() -> float:
    """CPU seconds of this process and of its children waited for (the QEMUs it ran)."""
    return sum(cpu_split())


def cpu_split() -> tuple[float, float]:
    """(this process's CPU seconds, its waited-for children's: the QEMUs)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class VcpuTime:
    """The run time of the vCPU thread of the QEMU this process starts meanwhile (a
    descendant named qemu-system-*; its busiest thread other than the main one), from
    /proc/PID/task/TID/schedstat sampled every 0.2 s: context manager, `.seconds` after."""

    def __init__(self) -> None:
        self.threads: dict[tuple[int, int], int] = {}
        self.done = threading.Event()
        self.t = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> VcpuTime:
        self.t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.t.join()

    @property
    def seconds(self) -> float:
        return max((ns for (pid, tid), ns in self.threads.items() if pid != tid), default=0) / 1e9

    def _sample(self) -> None:
        pids: list[int] = []
        while not self.done.wait(0.2):
            # /proc is walked until the QEMU has started, not at every sample: this runs
            # on the core beside the vCPU it measures.
            pids = pids or qemu_descendants()
            for pid in pids:
                try:
                    for task in Path(f"/proc/{pid}/task").iterdir():
                        run_ns = int((task / "schedstat").read_text().split()[0])
                        self.threads[(pid, int(task.name))] = run_ns
                except (OSError, ValueError):
                    continue            # it exited meanwhile: its last sample stands


def qemu_descendants() -> list[int]:
    """PIDs of the qemu-system-* processes descended from this one."""
    parent, names = {}, {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            name_end = stat.rindex(")")
            names[int(d.name)] = stat[stat.index("(") + 1:name_end]
            parent[int(d.name)] = int(stat[name_end + 2:].split()[1])
    me, found = os.getpid(), []
    for pid, name in names.items():
        if name.startswith("qemu-system"):
            p = parent.get(pid)
            while p and p != me:
                p = parent.get(p)
            if p == me:
                found.append(pid)
    return found


def replay_sampled(path: Path, analysis: str, workdir: Path, record: bool = False) -> dict:
    """Replay `path` into `analysis` offline, sampling tandem's resident set; with `record`
    the analysis records itself (as `tandem replay` does by default), and its guest
    instructions are counted."""
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.25):
            samples.append(rss_kib())
    t = threading.Thread(target=sample, daemon=True)
    before = rss_kib()
    t.start()
    t0, (me0, kids0) = time.monotonic(), cpu_split()
    with VcpuTime() as vcpu:
        s = analyze(path, [catalog.get(analysis)], noise=False, workdir=workdir, record=record)
    me, kids = cpu_split()
    wall, cpu = time.monotonic() - t0, me - me0 + kids - kids0
    print(f"replay {path.name} into {analysis}: {me - me0:.1f} s CPU here (tandem), {kids - kids0:.1f} s in QEMU",
          file=sys.stderr)
    done.set()
    t.join()
    (r,) = s.results
    if not (r.complete and s.ok):
        raise SystemExit(f"{analysis} of {path}: {r.run.outcome} {r.failure or ''}; "
                         f"{len(r.findings)} findings, {len(r.divergences)} divergences")
    half = samples[len(samples) // 2:] or [before]
    return {"icount": icount(r.run.bundle) if record and r.run.bundle else None, "wall_s": wall, "cpu_s": cpu, "cpu_here_s": me - me0, "cpu_qemu_s": kids - kids0,
            "vcpu_s": vcpu.seconds, "inputs": r.run.n_delivered, "vm_s": r.run.end_ns / 1e9, "before_kib": before,
            "peak_kib": max(samples or [before]), "late_mean_kib": sum(half) / len(half)}


def memory_part(seconds: list[float], analysis: str) -> str:
    rows = []
    with tempfile.TemporaryDirectory(prefix="tandem-bench-") as t:
        for secs in seconds:
            path = Path(t) / f"heavy-{secs:g}.tdm"
            n, rec_wall = record(path, seconds=secs)
            m = replay_sampled(path, analysis, Path(t) / f"an-{secs:g}")
            rows.append((secs, n, rec_wall, m))
            print(f"memory: {secs:g}s recording, {n} requests: {analysis} replay {m['wall_s']:.0f}s, "
                  f"tandem RSS peak {m['peak_kib'] / 1024:.1f} MiB", file=sys.stderr)
    first = rows[0][3]["peak_kib"]
    lines = [f"Demo guest, {CLIENTS} keep-alive clients pipelining SET/GET for each length, replayed offline into "
             f"{analysis} (`tandem replay --analysis {analysis} --no-noise --no-record`, in-process). Command: "
             f"`./tandem bench offline-heavy --only memory --seconds {','.join(f'{s:g}' for s in seconds)} "
             f"--analysis {analysis}`.", "",
             "| recording | requests | inputs delivered | analysis VM time (s) | replay wall (s) | tandem RSS before "
             "(MiB) | peak (MiB) | mean, second half (MiB) | peak vs the shortest |", "|---|---|---|---|---|---|---|---|---|"]
    for secs, n, _, m in rows:
        lines.append(f"| {secs:g} s | {n} | {m['inputs']} | {m['vm_s']:.1f} | {m['wall_s']:.0f} | "
                     f"{m['before_kib'] / 1024:.1f} | {m['peak_kib'] / 1024:.1f} | {m['late_mean_kib'] / 1024:.1f} | "
                     f"{m['peak_kib'] / first:.2f}x |")
    growth = rows[-1][3]["peak_kib"] / first
    lines += ["", f"Target: flat in the recording's length. {'Met' if growth <= 1.2 else 'Not met'}: "
              f"{rows[-1][0] / rows[0][0]:.0f}x the recording, {growth:.2f}x the peak (bound used: 1.2x, for "
              "the allocator's noise)."]
    return "\n".join(lines + [""])


def ratio_part(seconds: float, analysis: str, reps: int = 1) -> str:
    """The replay against the kernel serving live, `reps` times each, alternating; medians,
    and where the difference lies (see the module's docstring)."""
    kernel = catalog.get(analysis).flavor
    replays, lives, awake = [], [], []
    with tempfile.TemporaryDirectory(prefix="tandem-bench-") as t:
        path = Path(t) / "heavy.tdm"
        n, native_wall = record(path, seconds=seconds)
        for i in range(reps):
            replays.append(replay_sampled(path, analysis, Path(t) / f"an{i}", record=True))
            lives.append(live(Path(t) / f"live{i}.tdm", analysis, n))
            awake.append(live(Path(t) / f"awake{i}.tdm", analysis, n, awake=True))
    runs = [r for trio in zip(replays, lives, awake) for r in trio]     # in the order run
    for r in runs:
        r["off_vcpu_s"] = r["wall_s"] - r["vcpu_s"]
        r["ns_per_insn"] = r["vcpu_s"] / r["icount"] * 1e9
    keys = ("wall_s", "cpu_here_s", "cpu_qemu_s", "cpu_s", "icount", "vcpu_s", "off_vcpu_s", "ns_per_insn")
    m = {k: statistics.median(r[k] for r in replays) for k in keys}
    lv = {k: statistics.median(r[k] for r in lives) for k in keys}
    aw = {k: statistics.median(r[k] for r in awake) for k in keys}
    n_live = lives[0]["requests"]
    ratio, cpu_ratio, insns = m["wall_s"] / lv["wall_s"], m["cpu_s"] / lv["cpu_s"], m["icount"] / lv["icount"]
    equal = m["wall_s"] / aw["wall_s"]

    def each(key: str, fmt: str) -> str:
        return ", ".join(format(r[key], fmt) for r in runs)
    print(f"ratio: replay {m['wall_s']:.0f}s ({m['cpu_s']:.0f} s CPU), {kernel} live {lv['wall_s']:.0f}s "
          f"({lv['cpu_s']:.0f} s CPU), with the CPUs held awake {aw['wall_s']:.0f}s for {n_live} requests: "
          f"{ratio:.2f}x, {equal:.2f}x on equal terms",
          file=sys.stderr)
    row = "| {} | {} | {:.0f} | {:.1f} | {:.1f} | {:.0f} | {:.2f} | {:.1f} | {:.2f} | {:.1f} |"
    return "\n".join([
        f"Demo guest, {CLIENTS} keep-alive clients pipelining SET/GET for {seconds:g} s on the native kernel "
        f"({n} requests, {native_wall:.0f} s power-on to off), replayed offline into {analysis} (recording "
        f"itself, as `tandem replay` does by default); against the {kernel} kernel serving the same requests live "
        f"(recorded, power-on to off). {reps} of each, alternating; medians. CPU: this process's (tandem "
        "replaying, or the clients and tandem recording) and its QEMU's. Guest instructions: each VM's icount at "
        "its end, from its own recording. vCPU: its thread's run time (schedstat); off the vCPU: the wall time "
        "it did not run. Command: "
        f"`./tandem bench offline-heavy --only ratio --seconds {seconds:g} --analysis {analysis} --reps {reps}`.", "",
        "| run | requests | wall (s) | CPU, tandem or clients (s) | CPU, QEMU (s) | CPU (s) | guest instructions "
        "(G) | vCPU (s) | vCPU ns per instruction | off the vCPU (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
        row.format(f"semantic replay into {analysis}", n, *(m[k] for k in ("wall_s", "cpu_here_s", "cpu_qemu_s",
                   "cpu_s")), m["icount"] / 1e9, *(m[k] for k in ("vcpu_s", "ns_per_insn", "off_vcpu_s"))),
        row.format(f"{kernel} kernel serving them live", n_live, *(lv[k] for k in ("wall_s", "cpu_here_s",
                   "cpu_qemu_s", "cpu_s")), lv["icount"] / 1e9, *(lv[k] for k in ("vcpu_s", "ns_per_insn",
                                                                                  "off_vcpu_s"))),
        row.format(f"{kernel} live, the host's CPUs held awake as in the replay", awake[0]["requests"],
                   *(aw[k] for k in ("wall_s", "cpu_here_s", "cpu_qemu_s", "cpu_s")), aw["icount"] / 1e9,
                   *(aw[k] for k in ("vcpu_s", "ns_per_insn", "off_vcpu_s"))),
        "",
        f"Each run in the order run (replay, live, live with the CPUs awake, replay, ...): wall "
        f"{each('wall_s', '.0f')} s; vCPU ns per instruction {each('ns_per_insn', '.2f')}.", "",
        f"Target at most 1.1x (wall), judged on equal terms: against the live kernel with the host's CPUs "
        f"held awake, as the replay holds them (qemu/wake_latency.py): {equal:.2f}x, "
        f"{'met' if equal <= 1.1 else 'not met'}; CPU {m['cpu_s'] / aw['cpu_s']:.2f}x. Where the difference "
        f"lies: guest instructions {m['icount'] / aw['icount']:.2f}x; vCPU time per instruction "
        f"{m['ns_per_insn'] / aw['ns_per_insn']:.2f}x; time off the vCPU {m['off_vcpu_s']:.1f} s against "
        f"{aw['off_vcpu_s']:.1f} s. Against the live kernel as a user runs it, its CPUs left to idle: "
        f"{ratio:.2f}x (CPU {cpu_ratio:.2f}x; guest instructions {insns:.2f}x; vCPU time per instruction "
        f"{m['ns_per_insn'] / lv['ns_per_insn']:.2f}x; off the vCPU {lv['off_vcpu_s']:.1f} s).", ""])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", default="20,120", help="recording lengths, comma-separated (ratio: the first)")
    ap.add_argument("--analysis", default="kasan")
    ap.add_argument("--reps", type=int, default=3, help="ratio: runs of each, alternating (medians)")
    ap.add_argument("--only", choices=PARTS)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    seconds = [float(x) for x in args.seconds.split(",")]
    for part in PARTS:
        if args.only and part != args.only:
            continue
        text = memory_part(seconds, args.analysis) if part == "memory" else ratio_part(seconds[0], args.analysis, args.reps)
        print(text)
        if args.out:
            replace_part(args.out, SECTION, TITLE, PARTS, part, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
