"""An idle VM's QEMU is kept off the CPU time of everything not idle (qemu/vm.make_idle),
checked on this host's own kernel: a process started in a session of its own, as tandem
starts a QEMU, lands in the idle cgroup (cpu.idle 1), or, where tandem cannot make one,
in an autogroup of nice 19; the cgroup goes once empty, and stays while a process is in it."""
from __future__ import annotations

import subprocess
from pathlib import Path

from tandem.qemu import vm


def test_an_idle_process_is_in_an_idle_cgroup_or_a_reniced_autogroup(monkeypatch):
    monkeypatch.setenv(vm.IDLE_GROUP_SETTING, "1")      # the suite turns it off (tests/conftest.py)
    p = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        how = vm.make_idle(p.pid)
        cgroups = Path(f"/proc/{p.pid}/cgroup").read_text()
        if how == "cgroup":
            root = vm._cpu_cgroup_root()
            assert root is not None and (root / vm.IDLE_CGROUP / "cpu.idle").read_text().strip() == "1"
            assert f"/{vm.IDLE_CGROUP}\n" in cgroups, cgroups
        else:
            assert how == "autogroup", "neither an idle cgroup nor an autogroup on this host"
            assert Path(f"/proc/{p.pid}/autogroup").read_text().split()[-1] == str(vm.IDLE_AUTOGROUP_NICE)
    finally:
        p.kill()
        p.wait()
    vm.drop_idle_cgroup()
    root = vm._cpu_cgroup_root()
    group = root / vm.IDLE_CGROUP if root else None
    # gone, unless another idle VM (a test running beside this one) is still in it
    assert group is None or not group.exists() or (group / "cgroup.procs").read_text().strip()


def test_the_setting_leaves_idle_groups_out(monkeypatch):
    monkeypatch.setenv(vm.IDLE_GROUP_SETTING, "0")
    p = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert vm.make_idle(p.pid) == "none"
        assert f"/{vm.IDLE_CGROUP}\n" not in Path(f"/proc/{p.pid}/cgroup").read_text()
    finally:
        p.kill()
        p.wait()
