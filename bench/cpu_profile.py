"""Where a process's CPU time goes, by call stack: perf's sampling profile.

Whole-run ratios of a device-mode native against a plain one move some 10% round by
round on the 2-core benchmark machine (docs/benchmarks.md), more than the 3% they are
held to. A profile resolves what it attributes: of the native QEMU's CPU-clock samples,
those with a frame of the device log's code anywhere in their stack (the pcapng writer,
the netdev filter, the block and chardev hooks, the state checkpoints; qemu-patches/
0015-0020, 0036, 0041) are the recording's own cost, including the kernel's work in the
writes it makes (perf takes the kernel's stack with the user one). Stacks are unwound
from DWARF CFI (`--call-graph dwarf`): tandem's QEMU is built without frame pointers.
Samples in the guest's translated code have no unwind information and end there; none of
the device log's code runs under it, so none is lost from the count.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

# The device log's functions (qemu-patches 0015-0020: devlog.c, filter-devlog.c; their
# static helpers may be inlined into these, or stay apart under their own names).
RECORDING = re.compile(r"^(devlog_|filter_devlog_|write_epb|write_record|flush_pending|flush_all_pending"
                       r"|write_clock_mark|state_read_cpu)")
HEADER = re.compile(r"^(\S.*?)\s+(\d+)/(\d+)\s+")           # comm pid/tid ...
FRAME = re.compile(r"^\s+[0-9a-f]+\s+(\S+?)(?:\+0x[0-9a-f]+)?\s+\((.*)\)\s*$")


@dataclass
class Profile:
    """Samples of the profiled threads: all, those with a frame matching RECORDING, and
    the recording's samples by the function nearest the leaf that matched."""
    samples: int = 0
    recording: int = 0
    by_thread: Counter = field(default_factory=Counter)          # thread name -> samples
    recording_by_thread: Counter = field(default_factory=Counter)
    recording_by_function: Counter = field(default_factory=Counter)

    @property
    def share(self) -> float:
        return self.recording / self.samples if self.samples else 0.0


def available() -> str | None:
    """None if perf is here to sample with, else why not."""
    return None if shutil.which("perf") else "perf is not installed (Debian: linux-perf; scripts/host-deps.sh --dev)"


def record(pid: int, seconds: float, out: Path, freq: int = 299) -> None:
    """Sample every thread of `pid` for `seconds` (CPU clock: this machine, itself a VM,
    has no hardware cycle counter to give)."""
    subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", str(freq), "--call-graph", "dwarf,8192",
                    "-p", str(pid), "-o", str(out), "--", "sleep", str(seconds)],
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True, timeout=seconds + 600)


def script(data: Path) -> str:
    return subprocess.run(["perf", "script", "-i", str(data), "-F", "comm,pid,tid,ip,sym,dso"],
                          capture_output=True, text=True, check=True).stdout


def read(text: str, names: dict[int, str] | None = None) -> Profile:
    """A Profile of `perf script` text: a sample is a header line, its frames indented
    (leaf first), then a blank line. Threads are named from `names` (thread id -> name),
    else by perf's comm."""
    prof = Profile()
    thread: str | None = None
    frames: list[str] = []

    def done() -> None:
        if thread is None:
            return
        prof.samples += 1
        prof.by_thread[thread] += 1
        hit = next((f for f in frames if RECORDING.match(f)), None)
        if hit is not None:
            prof.recording += 1
            prof.recording_by_thread[thread] += 1
            prof.recording_by_function[hit] += 1

    for line in text.splitlines():
        if not line.strip():
            done()
            thread, frames = None, []
        elif (m := FRAME.match(line)) and thread is not None:
            frames.append(m.group(1))
        elif (h := HEADER.match(line)) and not line[0].isspace():
            done()
            thread, frames = (names or {}).get(int(h.group(3)), h.group(1)), []
    done()
    return prof
