"""One farm task as a worker runs it: `tandem replay` of one recording, exactly or into one
analysis, in a process of its own, and what it gave as a store.Result.

A task is the CLI a user would run, not a call into tandem's internals, for two reasons:
the task's VMs die with it (the replay is a process group of its own, and a watchdog
kills that group when the worker process dies: a Dask worker killed mid-task leaves no
QEMU behind to hold the host's cores), and what the farm stores is what
`tandem replay --json` and its summary.json say, which users read too.
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .. import artifacts
from .store import Finding, Result

# How long a watchdog waits between looks at the worker it guards (a killed worker's
# VMs run on this long at most).
WATCH_S = 1.0
EXACT = "exact"
TAIL = 2000         # characters of a failed replay's stderr kept as the harness's reason


@dataclass(frozen=True)
class Job:
    """What a worker needs to run a task: plain values, so it crosses to any worker."""
    bundle: str
    analysis: str               # a catalogue name, a user kernel's name, or EXACT
    workdir: str
    kernel_spec: str | None = None      # NAME=BZIMAGE[,VMLINUX] for a user kernel
    noise: bool = True
    jobs: int = 2                       # VMs at once: the analysis and its noise run side by side, or in turn
    pin: bool = True                    # on CPUs of its own, a CPU a VM (cpus_for), when the host has them free
    tandem: tuple[str, ...] = (sys.executable, "-m", "tandem")

    def argv(self) -> list[str]:
        if self.analysis == EXACT:
            return [*self.tandem, "replay", self.bundle, "--json"]
        out = [*self.tandem, "replay", self.bundle, "--workdir", self.workdir, "--jobs", str(self.jobs)]
        out += ["--analysis-kernel", self.kernel_spec] if self.kernel_spec else ["--analysis", self.analysis]
        return out + ([] if self.noise else ["--no-noise"])


def work(job: Job) -> Result:
    """What a Dask worker runs for a task: the job, said to have run on this worker."""
    from distributed import get_worker
    try:
        worker = get_worker().address
    except ValueError:          # run outside a worker (a test, a debugger)
        worker = ""
    return run(job, worker)


def run(job: Job, worker: str = "") -> Result:
    """Run the job's replay to its end and read what it gave. Each attempt has a directory
    of its own under the task's (run-*): Dask runs a task again when its worker dies, and
    the dead attempt's VMs may still be writing for the watchdog's second; its files stay."""
    Path(job.workdir).mkdir(parents=True, exist_ok=True)
    job = dataclasses.replace(job, workdir=tempfile.mkdtemp(prefix="run-", dir=job.workdir))
    log = Path(job.workdir) / "tandem.log"
    started = time.monotonic()
    with open(log, "wb") as err, cpus_for(job.jobs if job.pin else 0) as cpus:
        argv = ["taskset", "--cpu-list", ",".join(map(str, cpus)), *job.argv()] if cpus else job.argv()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, start_new_session=True,
                                env={**os.environ, "PYTHONPATH": _pythonpath()})
        dog = _watchdog(proc.pid)
        try:
            out, _ = proc.communicate()
        finally:
            _kill_group(proc.pid)
            dog.kill()
            dog.wait()
    took = round(time.monotonic() - started, 3)
    if job.analysis == EXACT:
        return exact_result(proc.returncode, out.decode(errors="replace"), _tail(log), worker, took, job.workdir)
    name = job.kernel_spec.partition("=")[0] if job.kernel_spec else job.analysis
    return analysis_result(proc.returncode, Path(job.workdir), name, _tail(log), worker, took)


@contextmanager
def cpus_for(n: int) -> Iterator[list[int]]:
    """n CPUs of this host that no other farm task holds, held while the block runs (a
    lock file each under the cache, so that every worker and every farm on the host takes
    others); [] when there are not n free, or n is 0: the replay then runs where the
    kernel puts it.

    Why: a replay is QEMU's vCPU and main-loop threads handing the replay lock to each
    other and, for an analysis, the replayer answering its stops; two replays free to run
    on both of 2 cores keep moving between them. Measured (docs/benchmarks.md, farm): two
    KASAN replays side by side took 59.3 s each on any core and 54.5 s each on a core of
    its own (49.5 s alone); two exact replays 37 s and 25.2 s (25.6 s alone)."""
    held: list[tuple[int, IO[str]]] = []
    try:
        if n:
            locks = artifacts.cache_dir() / "farm" / "cpus"
            locks.mkdir(parents=True, exist_ok=True)
            for cpu in sorted(os.sched_getaffinity(0)):
                if len(held) == n:
                    break
                f = open(locks / f"cpu{cpu}.lock", "a")
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    f.close()
                    continue
                held.append((cpu, f))
        yield [cpu for cpu, _ in held] if n and len(held) == n else []
    finally:
        for _, lock in held:
            lock.close()


def exact_result(code: int, out: str, err: str, worker: str, took: float, workdir: str) -> Result:
    """An exact replay's verdict: pass, a mismatch (tandem's own regression: the recording
    no longer replays exactly on this QEMU), or an error of the harness."""
    verdict = _last_json(out)
    if verdict is None or code not in (0, 1):
        return Result("error", reason=err or f"tandem replay exited {code}", worker=worker, replay_s=took,
                      run_dir=workdir)
    if verdict.get("ok"):
        return Result("pass", worker=worker, replay_s=took, run_dir=workdir)
    title = f"exact replay mismatch: {str(verdict.get('mismatch'))[:200]}"
    return Result("divergence", worker=worker, replay_s=took, run_dir=workdir,
                  findings=(Finding("exact replay mismatch", "exact", title, report=str(verdict.get("mismatch"))),))


def analysis_result(code: int, workdir: Path, analysis: str, err: str, worker: str, took: float) -> Result:
    """A semantic replay's summary as a task result: findings first, then divergences;
    an analysis that could not be analysed whole, or a replay that ended in an error,
    is the harness's, never a finding (KCIDB keeps ERROR apart from FAIL). Only the task's
    own analysis counts: the noise run on the native kernel is a means, not a task."""
    try:
        summary = json.loads((workdir / "summary.json").read_text())
    except (OSError, ValueError):
        return Result("error", reason=err or f"tandem replay exited {code}", worker=worker, replay_s=took,
                      run_dir=str(workdir))
    mine = [a for a in summary.get("analyses", []) if isinstance(a, dict) and a.get("analysis") == analysis]
    found = tuple(f for a in mine for f in _findings(a))
    kinds = {f.kind for f in found}
    status = "finding" if "finding" in kinds else "divergence" if "divergence" in kinds else \
        "pass" if summary.get("complete") and mine else "error"
    reason = None if status != "error" else "; ".join(summary.get("limits", [])[:3]) or err
    return Result(status, reason=reason, worker=worker, replay_s=took, run_dir=str(workdir), findings=found)


def _findings(a: dict) -> list[Finding]:
    rec = a.get("recording")
    out = [Finding(f["title"], "finding", f["title"], report=f.get("text"), input=f.get("after_input"),
                   vm_s=(f["vm_ns"] / 1e9 if isinstance(f.get("vm_ns"), int) else None), recording=rec)
           for f in a.get("findings", []) if isinstance(f, dict) and isinstance(f.get("title"), str)]
    for d in a.get("divergences", []):
        if isinstance(d, dict):
            sig = f"divergence {str(d.get('channel', '?')).split()[0]}: {d.get('kind', '?')}"
            out.append(Finding(sig, "divergence", sig, report=d.get("diff"), input=d.get("after_input"),
                               recording=rec))
    return out


def _last_json(out: str) -> dict | None:
    for line in reversed(out.strip().splitlines()):
        try:
            v = json.loads(line)
        except ValueError:
            continue
        return v if isinstance(v, dict) else None
    return None


def _tail(log: Path) -> str:
    try:
        text = log.read_text(errors="replace").strip()
    except OSError:
        return ""
    return text[-TAIL:]


def _pythonpath() -> str:
    here = str(Path(__file__).resolve().parents[2])
    return os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)


def _watchdog(pgid: int) -> subprocess.Popen:
    """A process that kills the replay's group when this worker process dies."""
    code = ("import os,signal,sys,time\n"
            "w,g,s=int(sys.argv[1]),int(sys.argv[2]),float(sys.argv[3])\n"
            "while os.getppid()==w: time.sleep(s)\n"
            "try: os.killpg(g,signal.SIGKILL)\n"
            "except ProcessLookupError: pass\n")
    return subprocess.Popen([sys.executable, "-c", code, str(os.getpid()), str(pgid), str(WATCH_S)],
                            start_new_session=True)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
