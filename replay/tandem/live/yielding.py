"""`--analysis-priority yield`: the analyses hold still while the native is busy.

SCHED_IDLE and an idle cgroup keep the analyses off the CPU time the native wants, but
not off its wake-ups. A native thread that wakes on a CPU where an idle-priority task
runs waits for that task to be preempted, where on an idle CPU it waits for the CPU to
wake. On the 2-core benchmark machine (a VM itself), `perf sched` over wrk slices of the
2-vCPU reference VM with two live shadows put a median of 8 us on each of some 1.1 such
waits per request behind a shadow's QEMU or tandem's own idle threads, against 2 us
behind an idle CPU, and the native's own CPU time per request rose 1.07x with work on
the other core: its run-queue wait per request came to 1.11x of recording alone
(docs/benchmarks.md, device_mode_slices). None of that is there when nothing of the
analyses is runnable while the native works.

So, under this policy, a sampler reads the native QEMU's threads' CPU time
(/proc/PID/task/TID/schedstat, nanoseconds) every WINDOW_S; while the native used more
than BUSY_CPU of a CPU in a window, the analyses are held: the analysis VMs' QEMUs are
stopped (SIGSTOP; their VM clock counts instructions, -icount, so the guest sees
nothing), none is granted a new horizon (so one tandem may not signal, a system
libvirtd's, stops at the horizon it has), and the follower stops reading the native's
device log (it waits on disk, where nothing is lost). They go on once the native has been under that
for CALM_WINDOWS windows in a row. What the native does meanwhile waits in the analyses'
buffers, as it does when they are slower than the native: an analysis catches up when
the native is quiet, or, at its buffer's bound, is detached (and drained offline from
the sealed bundle at the end).

The sampler is a process of its own, its verdict in a shared page that tandem's threads
read. A thread of tandem's would share the interpreter's lock with the idle-priority
threads that follow the native and drive the analyses: one of those, preempted by the
native while it holds the lock, would keep such a thread from its next sample for as
long as the native is busy, and the analyses would go on unheld. The sampler runs at idle priority too, in the analyses' idle cgroup: each of its
wake-ups on this machine took some 0.3 ms of CPU, and at normal priority, 20 a second,
the native waited behind them 4.5 us per request. Idle, it runs when a CPU is free,
which is when it has something to decide: a native that keeps every CPU busy leaves
it none, and leaves the analyses none either. Not so where several runs share the CPUs
(TANDEM_IDLE_GROUP=0, qemu/vm.py: the test suite's two workers): there another run's
native could keep it from seeing its own, and it runs at normal priority. It reads a few files (one per native
thread: 6-10) every WINDOW_S.
"""
from __future__ import annotations

import mmap
import os
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..lifecycle import Lifecycle

WINDOW_S = 0.1          # how often the native's CPU time is read
# Busy: over a fifth of a CPU in a window. The 2-vCPU reference VM idle (nginx and redis
# up, no client) under TCG used some 7% of a CPU; under wrk, 160%.
BUSY_CPU = 0.2
CALM_WINDOWS = 2        # quiet this many windows in a row (200 ms) before the analyses go on
THREADS_S = 1.0         # how often the native's thread list is read again


@dataclass
class YieldPolicy:
    """The decision, pure: fed the native's CPU time over each window, held or not.
    held_s: wall seconds held so far; holds: how many times the analyses were held."""
    busy_cpu: float = BUSY_CPU
    calm_windows: int = CALM_WINDOWS
    held: bool = False
    calm: int = 0
    held_s: float = 0.0
    holds: int = 0

    def observe(self, cpu_s: float, wall_s: float) -> bool:
        """The native used cpu_s of CPU time over the last wall_s: held now?"""
        if self.held:
            self.held_s += wall_s
        busy = wall_s > 0 and cpu_s > self.busy_cpu * wall_s
        if busy:
            if not self.held:
                self.holds += 1
            self.held, self.calm = True, 0
        elif self.held:
            self.calm += 1
            if self.calm >= self.calm_windows:
                self.held, self.calm = False, 0
        return self.held


def threads_cpu_ns(pid: int, tasks: dict[int, int]) -> int | None:
    """CPU time (ns) of pid's threads, read through the open schedstat files in `tasks`
    (tid -> fd; threads gone are dropped); None once the process is gone."""
    total = 0
    for tid, fd in list(tasks.items()):
        try:
            total += int(os.pread(fd, 64, 0).split()[0])
        except (OSError, ValueError, IndexError):
            os.close(fd)
            del tasks[tid]
    return total if tasks or _alive(pid) else None


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}/task")


def open_threads(pid: int, tasks: dict[int, int]) -> None:
    """Open the schedstat of each of pid's threads not open yet."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return
    for tid in tids:
        if tid not in tasks:
            try:
                tasks[tid] = os.open(f"/proc/{pid}/task/{tid}/schedstat", os.O_RDONLY)
            except OSError:
                continue


# The shared page: held (0/1), wall seconds held so far, holds so far; then the analysis
# VMs' QEMU process ids, which tandem writes as they start (0: a free slot).
PAGE = struct.Struct("<Qdq")
SLOTS = 32
PIDS = struct.Struct(f"<{SLOTS}i")
PAGE_SIZE = PAGE.size + PIDS.size


def start_time(pid: int) -> int | None:
    """When pid started (clock ticks after boot, /proc/PID/stat): a process id the
    kernel gave again to another process has another."""
    return _stat(pid)[0]


def _stat(pid: int) -> tuple[int | None, str]:
    """(pid's start time, its state letter: T when stopped); (None, "") once gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2:].split()
        return int(fields[19]), fields[0].decode()
    except (OSError, ValueError, IndexError):
        return None, ""


class Stopper:
    """The analysis VMs' QEMUs, stopped (SIGSTOP) while held and continued after. Each
    is known by its start time, so that a process id given again to another process
    is never signalled. One continued by someone else while held is stopped again;
    only those it stopped are continued."""

    def __init__(self) -> None:
        self.known: dict[int, int] = {}     # pid -> its start time, when first read
        self.stopped: set[int] = set()

    def update(self, pids: list[int], held: bool) -> None:
        for pid in pids:
            if pid > 0 and pid not in self.known and (t := start_time(pid)) is not None:
                self.known[pid] = t
        for pid in list(self.known):
            started, state = _stat(pid)
            if started != self.known[pid]:      # gone
                del self.known[pid]
                self.stopped.discard(pid)
            elif held and state not in ("T", "t"):
                if self._signal(pid, signal.SIGSTOP):
                    self.stopped.add(pid)
            elif not held and pid in self.stopped:
                self._signal(pid, signal.SIGCONT)
                self.stopped.discard(pid)

    def release(self) -> None:
        for pid in self.stopped:
            if start_time(pid) == self.known.get(pid):
                self._signal(pid, signal.SIGCONT)
        self.stopped.clear()

    @staticmethod
    def _signal(pid: int, sig: int) -> bool:
        try:
            os.kill(pid, sig)
            return True
        except OSError:         # gone, or not ours to signal (a system libvirtd's QEMU)
            return False


def sample(pid: int, page: mmap.mmap, parent: int, policy: YieldPolicy | None = None,
           window_s: float = WINDOW_S) -> None:
    """The sampler's loop: pid's load into `page` every window_s, the analysis VMs the
    page names stopped while held, until pid is gone or the process `parent` (tandem)
    is; nothing held, and every VM it stopped continued, at the end."""
    policy = policy or YieldPolicy()
    tasks: dict[int, int] = {}
    stopper = Stopper()
    listed = last_cpu = last_wall = None
    try:
        while os.getppid() == parent:
            now = time.monotonic()
            if listed is None or now - listed > THREADS_S:
                open_threads(pid, tasks)
                listed = now
            cpu = threads_cpu_ns(pid, tasks)
            if cpu is None:         # the native is gone: nothing to yield to
                return
            if last_cpu is not None and last_wall is not None:
                policy.observe(max(0, cpu - last_cpu) / 1e9, now - last_wall)
                PAGE.pack_into(page, 0, int(policy.held), policy.held_s, policy.holds)
                stopper.update(list(PIDS.unpack_from(page, PAGE.size)), policy.held)
            last_cpu, last_wall = cpu, now
            time.sleep(window_s)
    finally:
        for fd in tasks.values():
            os.close(fd)
        stopper.release()
        PAGE.pack_into(page, 0, 0, policy.held_s, policy.holds)


class NativeLoad(Lifecycle):
    """The sampler, seen from tandem: `held()` is True while the analyses are to hold
    still. pid: the native QEMU's; dir: where the shared page goes (tandem's private
    temporary directory). Once the native is gone, nothing is held."""

    def __init__(self, pid: int, dir: Path):
        self.pid, self.path = pid, dir / "yield.page"
        self._page: mmap.mmap | None = None
        self._proc: subprocess.Popen | None = None
        self._registered: dict[int, int] = {}       # the analysis VMs' pids -> their start times
        self._orphans_continued = False

    @property
    def started(self) -> bool:
        return self._proc is not None

    def start(self) -> NativeLoad:
        from ..qemu.vm import make_idle     # here: the sampler's own process does without it
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, bytes(PAGE_SIZE))
            self._page = mmap.mmap(fd, PAGE_SIZE)
        finally:
            os.close(fd)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")) if p))
        # A session of its own: its autogroup, reniced where there is no idle cgroup, is
        # not tandem's (qemu/vm.make_idle)
        self._proc = subprocess.Popen([sys.executable, "-m", __name__, str(self.pid), str(self.path), str(os.getpid())],
                                      env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        if make_idle(self._proc.pid) != "none":     # not under TANDEM_IDLE_GROUP=0 (the module's docstring)
            try:
                os.sched_setscheduler(self._proc.pid, os.SCHED_IDLE, os.sched_param(0))
            except OSError:
                pass        # it has ended already: its error is its exit status
        return self

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self.held()         # a sampler that had to be killed: the VMs it stopped continued
        if self._page is not None:
            PAGE.pack_into(self._page, 0, 0, *self.figures())
            self._page.close()
            self._page = None
        self.path.unlink(missing_ok=True)

    def _read(self) -> tuple[int, float, int]:
        return PAGE.unpack_from(self._page, 0) if self._page is not None else (0, 0.0, 0)

    def held(self) -> bool:
        """The analyses are to hold still now (never once the sampler has gone, however
        it ended: the page may say held still, and the VMs it stopped are continued)."""
        if self._read()[0] == 0:
            return False
        if self._proc is not None and self._proc.poll() is None:
            return True
        if not self._orphans_continued:
            self._orphans_continued = True
            stopper = Stopper()
            stopper.known = dict(self._registered)
            stopper.stopped = set(self._registered)
            stopper.release()
        return False

    def register(self, pids: set[int]) -> None:
        """The analysis VMs' QEMUs now running: stopped while the analyses are held
        (SLOTS of them at most; the rest are held at their horizons only)."""
        for pid in pids - self._registered.keys():
            if (t := start_time(pid)) is not None:
                self._registered[pid] = t
        if self._page is not None:
            slots = sorted(pids)[:SLOTS]
            PIDS.pack_into(self._page, PAGE.size, *slots, *[0] * (SLOTS - len(slots)))

    def figures(self) -> tuple[float, int]:
        """(wall seconds the analyses were held, how many times)."""
        _, held_s, holds = self._read()
        return held_s, holds

    def wait_calm(self, timeout: float) -> bool:
        """Wait (up to timeout s) until the analyses may go on; True if they may."""
        end = time.monotonic() + timeout
        while self.held():
            if time.monotonic() >= end:
                return False
            time.sleep(min(WINDOW_S, max(0.0, end - time.monotonic())))
        return True


def main(argv: list[str]) -> int:
    """python -m tandem.live.yielding PID PAGE PARENT: the sampler (NativeLoad starts it)."""
    pid, path, parent = int(argv[0]), argv[1], int(argv[2])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), PAGE_SIZE) as page:
        sample(pid, page, parent)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
