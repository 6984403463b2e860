"""One night of the farm: every recording replayed exactly on this QEMU build and into every
analysis, as tasks on Dask distributed, each result stored as it comes.

The farm's own process plans the night, takes tasks in the database, hands them to Dask
and stores what they give; workers only run replays (task.py). A task asks for the VMs it
boots as a worker resource `vm` (an analysis with its noise run boots two), so no worker
runs more VMs than it was started with (`dask worker --resources vm=N`), and Dask runs a
task again elsewhere when its worker dies. A finding whose title the database has never
seen is replayed `repeats` times more before it is called new (flaky if it does not show
every time), and the analysis run's own recording is replayed exactly to confirm it
reproduces.
"""
from __future__ import annotations

import enum
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import CancelledError
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import dask
from distributed import Client, Future, KilledWorker, LocalCluster, as_completed

from ..errors import InfraError, TandemError
from . import task
from .spec import Settings
from .store import CONFIRM, HEARTBEAT_S, Result, Store, TaskKey



class Guests(enum.Enum):
    """The recordings an analysis can analyse, and why not the others: a kernel of the
    user's boots on a user's VM's own disk; an analysis that swaps the demo guest's
    userland needs the demo guest."""
    ANY = None
    USERS = "a kernel you bring analyses recordings of your own VMs"
    DEMO = "it swaps the demo guest's userland, which a recording of your own VM does not have"


@dataclass(frozen=True)
class Target:
    """An analysis as the farm schedules it: its name, the key of the kernel build it boots
    (tonight's build: a new build is a new task), a user kernel's --analysis-kernel, and
    the recordings it can analyse."""
    name: str
    kernel: str
    kernel_spec: str | None = None
    guests: Guests = Guests.ANY
    os: str = "linux"                   # the guest OS its kernel is (a user kernel's: what its file says)


@dataclass(frozen=True)
class Corpus:
    """A recording of the night: its path, its identity (the device log's sha256, stable
    when the bundle moves), whether it is of a user's own VM, and its guest's OS."""
    bundle: str
    recording: str
    users_guest: bool = False
    os: str = "linux"                   # the recorded guest's OS
    icount: int = 0                     # its guest's instructions: how long its replays take, for their order


def skipped_because(c: Corpus, t: Target) -> str | None:
    """Why target t cannot analyse recording c (a task stored as skipped, with this
    reason, never run and never an error), or None."""
    if t.guests is Guests.USERS and not c.users_guest or t.guests is Guests.DEMO and c.users_guest:
        return f"{t.name}: {t.guests.value}"
    if t.os != c.os:
        return f"{t.name}: a {t.os} kernel, and the recording is of a {c.os} guest"
    return None


def plan(corpus: Iterable[Corpus], targets: Iterable[Target],
         exact_build: str | None) -> list[tuple[TaskKey, str | None]]:
    """The night's first tasks, each with why it is skipped (None: it runs): each
    recording exactly (if exact_build), and into each target."""
    targets = list(targets)
    out: list[tuple[TaskKey, str | None]] = []
    for c in corpus:
        if exact_build is not None:
            out.append((TaskKey(c.bundle, c.recording, task.EXACT, exact_build), None))
        out += [(TaskKey(c.bundle, c.recording, t.name, t.kernel), skipped_because(c, t)) for t in targets]
    return out


def vms_of(key: TaskKey, noise: bool) -> int:
    """The VMs a task boots at once: an exact replay one; an analysis one, and its noise run."""
    return 1 if key.analysis == task.EXACT else 2 if noise else 1


def vm_capacity(client: Client, wait_s: float = 60) -> int:
    """The most VMs one worker may run (its `vm` resource): a task asks for no more, so a
    worker started with vm=1 runs an analysis and its noise run in turn rather than never."""
    try:
        client.wait_for_workers(1, timeout=wait_s)
    except TimeoutError:
        raise InfraError(f"Dask scheduler {client.scheduler.address}: no worker joined in {wait_s:.0f} s") from None
    workers = client.scheduler_info()["workers"].values()
    most = max((int(w.get("resources", {}).get("vm", 0)) for w in workers), default=0)
    if most < 1:
        raise InfraError(f"Dask scheduler {client.scheduler.address}: no worker has the 'vm' resource "
                         "(start workers with: dask worker ... --resources vm=N)")
    return most


def vm_total(client: Client) -> int:
    """The VMs the cluster's workers may run at once, together (workers come and go)."""
    return sum(int(w.get("resources", {}).get("vm", 0)) for w in client.scheduler_info()["workers"].values())


@contextmanager
def cluster(settings: Settings) -> Iterator[Client]:
    """The scheduler the night runs on, closed at the end: the one settings name, or a
    LocalCluster of one worker on this host with as many VMs as it has cores (TCG runs a
    VM on a core). A scheduler that cannot be reached is a one-line error naming it."""
    if settings.scheduler:
        try:
            client = Client(settings.scheduler, timeout="30s")
        except (OSError, TimeoutError) as e:
            raise InfraError(f"Dask scheduler {settings.scheduler}: cannot connect ({e})") from None
        with client:
            yield client
        return
    vms = settings.vms or os.cpu_count() or 1
    # Dask's profiler samples a task's thread every 10 ms; a farm task's thread only waits
    # for its replay, and the samples cost the replays' cores (docs/farm.md: 0.87 s of
    # CPU in 30 s against 0.43 s without).
    with dask.config.set({"distributed.worker.profile.enabled": False}), \
            LocalCluster(n_workers=1, threads_per_worker=vms, resources={"vm": vms}, processes=True,
                         dashboard_address=":0", silence_logs=40) as local, Client(local) as client:
        yield client


def longest_first(open_tasks: Iterable[tuple[int, TaskKey]], icount: dict[str, int]) -> list[tuple[int, TaskKey]]:
    """The order tasks are handed out in: analyses before exact replays (which take about
    half as long), each the longest recording first (by its guest's instructions; one not
    in `icount`, a finding's confirmation on the analysis run's recording, last), so that
    the night's last minutes are short tasks spread over the workers, not one long one on
    one worker while the others stand idle. Measured on a night of 4 recordings x (kasan, exact) on 2
    workers (docs/benchmarks.md, farm): in the order they were given, one worker finished
    25 s of a 194 s night before the other; a recording of 4.8 G guest instructions
    replayed into kasan in 45 s, three of 5.5-5.6 G in 61-63 s."""
    return sorted(open_tasks, key=lambda t: (t[1].analysis == task.EXACT, -icount.get(t[1].bundle, 0)))


class Night:
    """A night's run against a store, on a Dask client."""

    def __init__(self, store: Store, client: Client, targets: list[Target], settings: Settings, out: Path,
                 on_result: Callable[[TaskKey, Result], None] | None = None, corpus: Iterable[Corpus] = ()):
        self.store, self.client, self.settings, self.out = store, client, settings, out
        self.icount = {c.bundle: c.icount for c in corpus}
        self.targets = {t.name: t for t in targets}
        self.on_result = on_result or (lambda key, result: None)
        self.tally: Counter[str] = Counter()
        self._stop = threading.Event()
        self.vm_max = vm_capacity(client)

    def run(self) -> Counter[str]:
        """Do every open task of the night, and the repeats and confirmations they call for."""
        beat = threading.Thread(target=self._heartbeat, name="farm-heartbeat", daemon=True)
        beat.start()
        try:
            while True:
                self._drain()
                if not self.store.held_elsewhere():
                    break
                self._stop.wait(HEARTBEAT_S)    # another farm's tasks: done by it, or taken back
        finally:
            self._stop.set()
            beat.join()
        return self.tally

    def _drain(self) -> None:
        """Submit what is open, store each result as it comes, until nothing is open."""
        futures = as_completed([])
        held: dict[Future, tuple[int, TaskKey, int]] = {}
        self._submit_open(futures, held)
        for fut in futures:
            task_id, key, _ = held.pop(fut)
            result = self._result_of(fut)
            if self.store.finish(task_id, result):
                self.tally[result.status] += 1
                self.on_result(key, result)
                self._follow_up(key, result)
            self._submit_open(futures, held)

    def _submit_open(self, futures: as_completed, held: dict) -> None:
        """Take open tasks while the cluster has VMs free for them, and submit them. A farm
        takes only what it can run now: taking every open task at once, the first of two
        farms on one night would hold all of them while the other stood idle."""
        busy = {t for t, _, _ in held.values()}
        free = max(vm_total(self.client), self.vm_max) - sum(vms for _, _, vms in held.values())
        for task_id, key in longest_first(self.store.open_tasks(), self.icount):
            job = self._job(task_id, key)
            if task_id in busy or job.jobs > free or not self.store.claim(task_id):
                continue
            fut = self.client.submit(task.work, job, key=f"tandem-farm-{self.store.run_id[:8]}-{task_id}",
                                     resources={"vm": job.jobs}, pure=False)
            held[fut] = (task_id, key, job.jobs)
            futures.add(fut)
            free -= job.jobs

    def _job(self, task_id: int, key: TaskKey) -> task.Job:
        workdir = self.out / f"task-{task_id}-{key.analysis}-r{key.repeat}"
        target = self.targets.get(key.analysis)
        return task.Job(key.bundle, key.analysis, str(workdir), kernel_spec=target.kernel_spec if target else None,
                        noise=self.settings.noise, jobs=min(vms_of(key, self.settings.noise), self.vm_max),
                        pin=self.settings.pin)

    @staticmethod
    def _result_of(fut: Future) -> Result:
        try:
            return fut.result()
        except (KilledWorker, CancelledError, OSError, TandemError) as e:
            # its worker died too often, it was cancelled, the host or tandem failed it:
            # the harness's failure, stored as the task's error (a bug in tandem still raises)
            return Result("error", reason=f"{type(e).__name__}: {e}"[:2000])

    def _follow_up(self, key: TaskKey, result: Result) -> None:
        """Repeats of a task that found something never seen before, and an exact replay of
        the analysis run's recording that shows it."""
        if key.kernel == CONFIRM:
            self.store.confirm(key.bundle, result.status == "pass")
            return
        if key.repeat != 0 or self.store.night_id is None:
            return
        new = [f for f in result.findings if f.kind == "finding"
               and not self.store.seen_before(f.signature, self.store.night_id)]
        if not new:
            return
        self.store.add_tasks(TaskKey(key.bundle, key.recording, key.analysis, key.kernel, r)
                             for r in range(1, self.settings.repeats + 1))
        self.store.add_tasks(TaskKey(rec, rec, task.EXACT, CONFIRM)
                             for rec in dict.fromkeys(f.recording for f in new if f.recording))

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self.store.heartbeat()
