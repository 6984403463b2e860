"""bench/sched_trace.py: the native's run-queue waits charged to what ran meanwhile, read
from `perf script` text in the layout perf prints (perf 6.1, sched tracepoints)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import sched_trace  # noqa: E402


def sw(cpu: int, t: float, prev: int, state: str, nxt: int) -> str:
    return (f"[{cpu:03d}] {t:.6f}:     sched:sched_switch: prev_comm=a prev_pid={prev} prev_prio=120 "
            f"prev_state={state} ==> next_comm=b next_pid={nxt} next_prio=120")


def wake(cpu: int, t: float, pid: int) -> str:
    return f"[{cpu:03d}] {t:.6f}:     sched:sched_wakeup: comm=qemu-system-x86 pid={pid} prio=120 target_cpu=001"


TRACE = "\n".join([
    sw(0, 0.9, 300, "S", 100),      # the native runs on CPU 0
    sw(0, 1.000, 100, "R", 200),    # preempted by tandem's 200 ...
    sw(0, 1.010, 200, "S", 300),    # ... then 300 runs ...
    sw(0, 1.015, 300, "R+", 100),   # ... and the native again: 15 ms waited, 10 behind 200, 5 behind 300
    sw(1, 1.5, 200, "S", 0),        # CPU 1 idle
    wake(1, 2.000, 100),            # the native woken on CPU 1 ...
    "perf's own noise line",
    sw(1, 2.002, 0, "R", 100),      # ... runs 2 ms later: behind an idle CPU's wake-up
    wake(1, 3.0, 555),              # another process's wake-up: not counted
])


def test_waits_are_charged_to_what_ran_on_the_cpu_and_cut_into_windows():
    a, b, c = sched_trace.waits(TRACE, {100}, [(0.5, 1.5), (1.9, 2.1), (2.5, 3.5)])
    assert round(a.total, 6) == 0.015 and round(a.behind[200], 6) == 0.010 and round(a.behind[300], 6) == 0.005
    assert round(a.behind_any({200}), 6) == 0.010
    assert round(b.total, 6) == 0.002 and round(b.behind[0], 6) == 0.002 and b.behind_any({200, 300}) == 0
    assert c.total == 0 and not c.behind
