"""A farm task's CPUs (farm/task.cpus_for): real lock files, in processes of their own as
two workers on one host are."""
from __future__ import annotations

import multiprocessing
import os

from tandem.farm import task


def _hold(cache: str, n: int, ready, done, out) -> None:
    os.environ["TANDEM_CACHE"] = cache
    with task.cpus_for(n) as cpus:
        out.put(cpus)
        ready.set()
        done.wait(30)


def test_two_tasks_on_one_host_take_different_cpus_and_give_them_back(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_CACHE", str(tmp_path))
    allowed = sorted(os.sched_getaffinity(0))
    ctx = multiprocessing.get_context("spawn")
    ready, done, out = ctx.Event(), ctx.Event(), ctx.Queue()
    other = ctx.Process(target=_hold, args=(str(tmp_path), 1, ready, done, out))
    other.start()
    try:
        assert ready.wait(30)
        theirs = out.get(timeout=5)
        assert theirs == allowed[:1]
        with task.cpus_for(1) as mine:
            # another CPU if the host has one; none (run anywhere) if it has not
            assert mine == (allowed[1:2] if len(allowed) > 1 else [])
        with task.cpus_for(len(allowed)) as all_of_them:
            assert all_of_them == []            # one is held: not n free, so none
    finally:
        done.set()
        other.join(30)
    with task.cpus_for(len(allowed)) as all_of_them:
        assert all_of_them == allowed           # given back when the holder ended
    with task.cpus_for(0) as none:
        assert none == []


def test_a_pinned_job_runs_its_replay_on_its_cpus_and_an_unpinned_one_anywhere(tmp_path, monkeypatch):
    """The job's process sees only the CPU it was given (a job whose `tandem` is a python
    that writes down its affinity: the Popen path a replay takes)."""
    monkeypatch.setenv("TANDEM_CACHE", str(tmp_path))
    allowed = sorted(os.sched_getaffinity(0))
    seen = tmp_path / "cpus"
    code = f"import os; open({str(seen)!r}, 'w').write(repr(sorted(os.sched_getaffinity(0))))"
    for pin, want in ((True, allowed[:1]), (False, allowed)):
        job = task.Job("b.tdm", task.EXACT, str(tmp_path / "w"), jobs=1, pin=pin, tandem=("python3", "-c", code))
        r = task.run(job)
        assert r.status == "error"          # it printed no verdict: the harness's error
        assert seen.read_text() == repr(want), (pin, seen.read_text())
