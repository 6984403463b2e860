"""Whom a process's threads waited behind on a run queue: perf's scheduler trace.

A slice's ratio of run-queue wait per request (bench/device_mode.py --slices) resolves
some 10% on the 2-core benchmark machine. The trace resolves what it attributes: each
interval a native thread spent runnable (from its wake-up, or its preemption, to its
next switch in) is charged to what ran on the CPU it then ran on, so the wait behind
tandem's own processes is read apart from the wait behind the native's own threads and
its clients. `perf record -k CLOCK_MONOTONIC` stamps the events with the clock that
time.monotonic() reads, so one trace is cut into the slices the bench timed.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

EVENTS = ("sched:sched_switch", "sched:sched_wakeup", "sched:sched_wakeup_new")
LINE = re.compile(r"\s*\[(\d+)\]\s+([\d.]+):\s+(\S+?):?\s+(.*)")
SWITCH = re.compile(r"prev_pid=(\d+) .*?prev_state=(\S+) ==> .*?next_pid=(\d+)")
WAKEUP = re.compile(r"\bpid=(\d+)\b")


def available() -> str | None:
    """None if this host can trace the scheduler, else why not."""
    if shutil.which("perf") is None:
        return "perf is not installed (Debian: linux-perf)"
    r = subprocess.run(["perf", "list", "sched:sched_switch"], capture_output=True, text=True)
    if "sched_switch" not in r.stdout:
        return "perf cannot see the sched tracepoints here (run as root, or lower kernel.perf_event_paranoid)"
    return None


def record(out: Path) -> subprocess.Popen:
    """Start tracing every CPU's scheduler into `out`; stop() it."""
    return subprocess.Popen(["perf", "record", "-q", "-a", "-k", "CLOCK_MONOTONIC",
                             *[a for e in EVENTS for a in ("-e", e)], "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(p: subprocess.Popen) -> None:
    p.send_signal(2)        # SIGINT: perf writes its file out and exits
    p.wait(120)


def script(data: Path) -> str:
    return subprocess.run(["perf", "script", "-i", str(data), "-F", "cpu,time,event,trace"],
                          capture_output=True, text=True, check=True).stdout


@dataclass
class Waits:
    """A window's run-queue wait of the traced threads (seconds), and its share behind
    each thread id that ran meanwhile on the CPU they then ran on (0: the CPU idle)."""
    total: float = 0.0
    behind: dict[int, float] = field(default_factory=lambda: defaultdict(float))

    def behind_any(self, tids: set[int]) -> float:
        return sum(v for t, v in self.behind.items() if t in tids)


def waits(text: str, tids: set[int], windows: list[tuple[float, float]]) -> list[Waits]:
    """The waits of threads `tids` in each (start, end) window of monotonic time, from
    `perf script` text; a wait is counted in the window where it ends."""
    out = [Waits() for _ in windows]
    running: dict[int, tuple[int, float]] = {}          # cpu -> (tid, since)
    ran: dict[int, list[tuple[float, float, int]]] = defaultdict(list)   # cpu -> (from, to, tid)
    runnable: dict[int, float] = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m is None:
            continue
        cpu, t, event, trace = int(m[1]), float(m[2]), m[3], m[4]
        if event.endswith("sched_switch"):
            s = SWITCH.search(trace)
            if s is None:
                continue
            prev, state, nxt = int(s[1]), s[2], int(s[3])
            if cpu in running:
                tid, since = running[cpu]
                ran[cpu].append((since, t, tid))
                del ran[cpu][:-500]
            if prev in tids and state.startswith("R"):      # preempted: runnable from now
                runnable[prev] = t
            if nxt in tids and nxt in runnable:
                _charge(out, windows, ran[cpu], runnable.pop(nxt), t)
            running[cpu] = (nxt, t)
        elif (w := WAKEUP.search(trace)) is not None and int(w[1]) in tids:
            runnable.setdefault(int(w[1]), t)
    return out


def _charge(out: list[Waits], windows: list[tuple[float, float]], ran: list[tuple[float, float, int]],
            since: float, until: float) -> None:
    for i, (a, b) in enumerate(windows):
        if a <= until <= b:
            w = out[i]
            w.total += until - since
            for s0, s1, tid in ran:
                if (o := min(s1, until) - max(s0, since)) > 0:
                    w.behind[tid] += o
            return
