"""--analysis-priority yield (live/yielding.py): the policy's decision, and the sampler
process against real processes (a busy loop, stopped and killed)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from helpers import wait_until
from hypothesis import given, strategies as st
from tandem.qemu import vm
from tandem.live.yielding import CALM_WINDOWS, NativeLoad, Stopper, YieldPolicy, open_threads, start_time, threads_cpu_ns


def test_a_busy_window_holds_until_the_native_has_been_calm_for_the_calm_windows():
    p = YieldPolicy(busy_cpu=0.2, calm_windows=3)
    assert not p.observe(0.005, 0.05)            # 10% of a CPU: calm
    assert p.observe(0.02, 0.05)                 # 40%: busy
    assert p.observe(0.0, 0.05) and p.observe(0.0, 0.05)
    assert p.observe(0.05, 0.05)                 # busy again: the count starts over
    assert p.observe(0.0, 0.05) and p.observe(0.0, 0.05)
    assert not p.observe(0.0, 0.05)
    assert p.holds == 1 and abs(p.held_s - 0.3) < 1e-9


@given(st.lists(st.tuples(st.floats(0, 0.2), st.floats(0.001, 0.2)), max_size=60))
def test_held_only_after_a_busy_window_and_never_longer_than_the_calm_windows_after_the_last(windows):
    p = YieldPolicy(busy_cpu=0.2, calm_windows=CALM_WINDOWS)
    since_busy = None
    for cpu, wall in windows:
        held = p.observe(cpu, wall)
        since_busy = 0 if cpu > 0.2 * wall else (None if since_busy is None else since_busy + 1)
        assert held == (since_busy is not None and since_busy < CALM_WINDOWS)


def _busy_loop() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def test_threads_cpu_time_grows_with_a_busy_process_and_is_none_once_it_is_gone():
    p = _busy_loop()
    tasks: dict[int, int] = {}
    try:
        open_threads(p.pid, tasks)
        a = threads_cpu_ns(p.pid, tasks)
        assert a is not None
        wait_until(lambda: (threads_cpu_ns(p.pid, tasks) or 0) - a > 20_000_000, 10, "20 ms of a busy loop's CPU time")
    finally:
        p.kill()
        p.wait()
    assert threads_cpu_ns(p.pid, tasks) is None and tasks == {}


def test_the_sampler_holds_while_the_native_is_busy_and_lets_go_when_it_stops_or_is_gone(tmp_path):
    p = _busy_loop()
    load = NativeLoad(p.pid, tmp_path).start()
    try:
        wait_until(load.held, 10, "a busy loop not seen busy")
        assert not load.wait_calm(0.1)
        os.kill(p.pid, signal.SIGSTOP)
        wait_until(lambda: not load.held(), 10, "a stopped process still seen busy")
        assert load.wait_calm(0)
        os.kill(p.pid, signal.SIGCONT)
        wait_until(load.held, 10, "the busy loop seen busy again")
        p.kill()
        p.wait()
        wait_until(lambda: not load.held(), 10, "a native gone still held")
        wait_until(lambda: load._proc.poll() is not None, 10, "the sampler's end once the native is gone")
        held_s, holds = load.figures()
        assert holds == 2 and held_s > 0
    finally:
        p.kill()
        p.wait()
        load.close()
    assert not (tmp_path / "yield.page").exists()


def _state(pid: int) -> str:
    stat = open(f"/proc/{pid}/stat").read()
    return stat[stat.rindex(")") + 2]


def test_the_analysis_vms_registered_are_stopped_while_held_and_continued_after(tmp_path):
    native, vm = _busy_loop(), _busy_loop()
    load = NativeLoad(native.pid, tmp_path).start()
    try:
        load.register({vm.pid})
        wait_until(lambda: _state(vm.pid) == "T", 10, "the analysis VM not stopped while the native is busy")
        os.kill(vm.pid, signal.SIGCONT)        # continued by someone else while held: stopped again
        wait_until(lambda: _state(vm.pid) == "T", 10, "the VM continued by someone else stopped again")
        os.kill(native.pid, signal.SIGSTOP)
        wait_until(lambda: _state(vm.pid) != "T", 10, "the analysis VM not continued once the native is calm")
        os.kill(native.pid, signal.SIGCONT)
        wait_until(lambda: _state(vm.pid) == "T", 10, "the VM stopped again once the native is busy again")
        load.close()            # the sampler ends: what it stopped goes on
        assert _state(vm.pid) != "T"
        load = NativeLoad(native.pid, tmp_path).start()
        load.register({vm.pid})
        wait_until(lambda: _state(vm.pid) == "T", 10, "the VM stopped by the sampler about to be killed")
        load._proc.kill()       # a sampler killed as it held: nothing is held any more, its VMs go on
        load._proc.wait()
        assert not load.held() and _state(vm.pid) != "T"
    finally:
        for p in (native, vm):
            p.kill()
            p.wait()
        load.close()


def test_a_process_id_given_again_is_not_signalled():
    """A VM's pid that the kernel gave to another process since (its start time differs
    from the one first read) is forgotten, not stopped."""
    p = _busy_loop()
    try:
        stopper = Stopper()
        stopper.known[p.pid] = start_time(p.pid) - 1      # as if first read from an earlier process
        stopper.update([p.pid], held=True)
        assert _state(p.pid) != "T" and stopper.known == {} and stopper.stopped == set()
        stopper.update([p.pid], held=True)                # read anew: this one is stopped
        wait_until(lambda: _state(p.pid) == "T", 10, "the process stopped")
        assert stopper.stopped == {p.pid}
        stopper.release()
        wait_until(lambda: _state(p.pid) != "T", 10, "the process continued on release")
    finally:
        p.kill()
        p.wait()
    assert start_time(p.pid) is None


def test_the_sampler_is_idle_where_the_analyses_are_and_not_where_runs_share_the_cpus(tmp_path, monkeypatch):
    """Idle groups on (tandem's default): the sampler at SCHED_IDLE in the analyses' idle
    cgroup (or a reniced autogroup of its own, never tandem's); off (the suite's setting,
    several runs on the CPUs), at normal priority."""
    native = _busy_loop()
    try:
        for setting, policy in (("1", os.SCHED_IDLE), ("0", os.SCHED_OTHER)):
            monkeypatch.setenv(vm.IDLE_GROUP_SETTING, setting)
            load = NativeLoad(native.pid, tmp_path).start()
            try:
                pid = load._proc.pid
                assert os.sched_getscheduler(pid) == policy
                assert os.getsid(pid) == pid
                if setting == "1" and vm.make_idle(pid) == "cgroup":
                    assert f"/{vm.IDLE_CGROUP}\n" in Path(f"/proc/{pid}/cgroup").read_text()
            finally:
                load.close()
    finally:
        native.kill()
        native.wait()
        vm.drop_idle_cgroup()
