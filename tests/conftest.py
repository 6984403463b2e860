"""Shared fixtures: real recordings of the real demo guest under the patched QEMU, and the
guards every test runs under.

Nothing here is mocked: `./tandem test` builds QEMU, the kernels and the guest image
first, and these fixtures boot them. Helpers (waiting, client threads, the CLI) are in
tests/helpers; test modules import from there.

Guards around every test:
- a timeout (pytest-timeout, pytest.ini: 300 s; a test that needs longer says so with
  @pytest.mark.timeout): a stuck analysis fails its test, not CI's 90 minutes;
- every tandem VM the test started is closed at its end, whatever the test did, and
  every process it started (tandem's CLI, the QEMUs those start in sessions of their own)
  is killed: they carry the test's mark in their environment;
- a failed test's report carries each VM's QEMU log and console tail, so a red CI says why;
- every device log the test made opens in Wireshark's tools.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import settings

from helpers import (MARK, ROOT, check_devlogs_readable, in_shared_block, record_demo,  # noqa: F401  (ROOT: sys.path)
                     shared_across_tests)
from tandem import artifacts
from tandem.qemu.vm import VM

# Hypothesis: no per-example deadline anywhere (a loaded 2-core machine makes any
# deadline flaky; the suite's timeout bounds a test instead).
settings.register_profile("tandem", deadline=None)
settings.load_profile("tandem")

# The suite's two workers each run their own VMs side by side: an idle analysis of one
# test must not wait for the other test's native (qemu/vm.make_idle), or its waits time out.
# tests/unit/test_idle_vms.py and bench/device_mode.py check the idle groups themselves.
os.environ["TANDEM_IDLE_GROUP"] = "0"

# A suite started in the background by a script (`./tandem test &`, `setsid cmd &`) has
# SIGINT ignored, and every command it starts inherits that: a CLI told to stop with
# Ctrl-C, as the tests tell one, then never hears it (Python installs its KeyboardInterrupt
# handler only over SIGINT's default). A handled signal is reset to the default in a
# child, so catching it here gives the commands what a terminal's foreground job has.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# What a whole run of the suite writes under pytest's base temp directory at its peak: its
# VMs' recordings, overlays and run directories (5.4 GiB, df sampled every 20 s through a
# clean-clone CI at 85b2c0a), and a little room besides.
SUITE_DISK_BYTES = 6 << 30


def pytest_configure(config):
    """Before any test: one line and exit 1 when the disk under pytest's base temp cannot
    hold a whole run (a full disk would fail VM tests far apart, each its own way). The
    controller checks, not each xdist worker; a run of some tests (-k, a path) is not."""
    if hasattr(config, "workerinput") or config.args_source != pytest.Config.ArgsSource.TESTPATHS:
        return
    base = Path(config.option.basetemp) if config.option.basetemp else Path(tempfile.gettempdir())
    probe = next(p for p in (base, *base.parents) if p.exists())
    free = shutil.disk_usage(probe).free
    if free < SUITE_DISK_BYTES:
        pytest.exit(f"tandem: error: disk: {free / 2**30:.1f} GiB free under {probe}, the whole suite writes up to "
                    f"{SUITE_DISK_BYTES / 2**30:.0f} GiB there; fix: free space there, or give --basetemp on a "
                    "larger disk", returncode=1)


VMS = pytest.StashKey[list]()
TAIL_BYTES = 3000


# --- where a test runs ----------------------------------------------------------------------

# The VM test modules, slowest first: each is an xdist group of its own (one test at a
# time, its module fixtures shared), and the two workers take them in this order, so the
# longest start first and the short ones and the unit tests fill in at the end. Seconds
# of one module's tests with the two workers busy (./tandem test --durations=0); a
# module not listed runs after these, before the unit tests. Stale figures
# only cost balance: the order is a hint, the groups are what keeps a module's VMs apart.
SLOWEST_FIRST = {
    "test_farm.py": 336, "test_record_any_guest.py": 294, "test_semantic.py": 159, "test_freebsd.py": 136,
    "test_live.py": 132, "test_virt_live.py": 98, "test_gate_bound.py": 95, "test_device_mode.py": 90,
    "test_record_replay.py": 82, "test_assertions.py": 65, "test_planted_bugs.py": 54, "test_bad_input.py": 38,
    "test_launcher.py": 26, "test_virt.py": 26, "test_private_modes.py": 18,
    "test_devlog_tshark.py": 16, "test_devlog_devices.py": 9,
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (./tandem test runs two workers), each test module outside
    tests/unit is a group run in one worker one test at a time (its VMs one after
    another, its module fixtures such as a private libvirtd shared), two modules at once
    on the two cores; the unit tests go to whichever worker is free. Modules are taken
    slowest first (SLOWEST_FIRST), the unit tests last.

    tryfirst: xdist's worker reads the groups in its own hook of this name (it names
    each test "nodeid@group"), and a hook registered after this conftest runs before
    it. Without tryfirst the marks come too late and no test is grouped: two VM tests
    of one module run at once (two private libvirtds side by side)."""
    if not hasattr(config, "workerinput"):      # not an xdist worker: one process, in order
        return
    unit = ROOT / "tests" / "unit"

    def is_unit(item) -> bool:
        return unit in item.path.parents

    for item in items:
        if not is_unit(item):
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
    # A stable sort: a module's tests keep their order (its fixtures are shared in it).
    items.sort(key=lambda i: (is_unit(i), -SLOWEST_FIRST.get(i.path.name, 0)))


# --- what a test leaves ------------------------------------------------------------------

def _marked(mark: str) -> list[int]:
    """Processes (not this one) whose environment carries mark."""
    needle = f"{MARK}={mark}".encode()
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:         # gone, or not ours to read
            continue
        if needle in env:
            out.append(int(pid))
    return out


def _vm_tail(vm: VM) -> str:
    """A VM's QEMU log and console tails, as a report section reads them."""
    log = vm.log_tail(TAIL_BYTES)
    console = bytes(vm.console()[-TAIL_BYTES:]).decode(errors="replace")
    status = "running" if vm.proc and vm.proc.poll() is None else \
        f"exited {vm.proc.returncode}" if vm.proc else "never started"
    return (f"QEMU ({status}), argv mode {vm.run.mode}, rundir {vm.run.rundir}\n"
            f"--- QEMU log (tail) ---\n{log}\n--- console (tail) ---\n{console}")


@pytest.fixture(autouse=True)
def test_leaves_nothing(request, monkeypatch):
    """Every VM the test starts is watched: closed at the end if still running, its tails
    kept for the failure report (taken before close, which removes its run directory);
    every process the test starts is marked, and killed at the end if still there."""
    mark = uuid.uuid4().hex
    monkeypatch.setenv(MARK, mark)
    started: list[VM] = []
    tails: dict[int, str] = {}
    request.node.stash[VMS] = (started, tails)
    real_start, real_close = VM.start, VM.close

    def start(vm, *args, **kwargs):
        if not in_shared_block():       # a module fixture's VM is that fixture's to close
            started.append(vm)
        return real_start(vm, *args, **kwargs)

    def close(vm):
        tails[id(vm)] = _vm_tail(vm)
        return real_close(vm)

    monkeypatch.setattr(VM, "start", start)
    monkeypatch.setattr(VM, "close", close)
    yield
    for vm in started:
        if vm.proc is not None and vm.proc.poll() is None:
            close(vm)
    for pid in _marked(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report: each VM it started, with its QEMU log and console tails."""
    rep = yield
    if rep.failed and VMS in item.stash:
        started, tails = item.stash[VMS]
        for i, vm in enumerate(started):
            rep.sections.append((f"VM {i + 1}: {vm.name}", tails.get(id(vm)) or _vm_tail(vm)))
    return rep


@pytest.fixture(autouse=True)
def devlogs_readable_by_wireshark(request, tmp_path_factory, tmp_path):
    """A guard around every test: the device logs it made (its own, a session
    fixture's, an analysis's) open in capinfos and tshark with tandem's record count.
    It asks for tmp_path so that it ends before tmp_path does: a passed test's directory
    is removed as its tmp_path ends (pytest.ini), and its logs with it."""
    base = tmp_path_factory.getbasetemp()
    start = time.time()
    yield
    made = [p for p in base.rglob("*.pcapng") if p.is_file() and p.stat().st_mtime >= start]
    check_devlogs_readable(made)


# --- what tests share ---------------------------------------------------------------------

@pytest.fixture(scope="session")
def built():
    """The build's artifacts; a clear failure if ./tandem build has not run."""
    return {"qemu": artifacts.qemu(), "kernel": artifacts.kernel("native"), "guest": artifacts.guest()}


@pytest.fixture(scope="session")
def demo_bundle(built, tmp_path_factory) -> Path:
    """One recording shared by the read-only tests; copy it before damaging it."""
    return record_demo(tmp_path_factory.mktemp("rec") / "demo.tdm")


@pytest.fixture
def bundle_copy(demo_bundle, tmp_path) -> Path:
    dst = tmp_path / "copy.tdm"
    shutil.copytree(demo_bundle, dst)
    return dst


@pytest.fixture(scope="session")
def postgres_cluster():
    """A private PostgreSQL cluster on a unix socket (tests/helpers/postgres.py), one a
    session: started outside any test's mark, so the test that first asks for it does
    not kill it at its end."""
    from helpers.postgres import private_cluster
    stack = contextlib.ExitStack()
    with shared_across_tests():
        cluster = stack.enter_context(private_cluster())
    with stack:
        yield cluster


@pytest.fixture
def postgres_url(postgres_cluster) -> str:
    """A new empty database of the session's cluster, as an SQLAlchemy URL."""
    return postgres_cluster.create_database()


@pytest.fixture(scope="module")
def libvirtd_daemon(built, tmp_path_factory):
    """A private libvirtd (and virtlogd) for one test module, stopped after it."""
    from tandem.libvirt import daemon
    d = daemon.Libvirtd(tmp_path_factory.mktemp("libvirt") / "libvirt")
    d.start()
    yield d
    d.close()


@pytest.fixture
def libvirtd(libvirtd_daemon):
    """The module's libvirtd, as this test finds it and leaves it: every domain the test
    defined is destroyed and undefined at its end, whatever the test did, so the next test
    meets the same set of domains."""
    from tandem.libvirt import daemon
    conn = daemon.connect(libvirtd_daemon.uri)
    try:
        before = {d.name() for d in conn.listAllDomains()}
    finally:
        conn.close()
    yield libvirtd_daemon
    conn = daemon.connect(libvirtd_daemon.uri)
    try:
        for dom in conn.listAllDomains():
            if dom.name() not in before:
                if dom.isActive():
                    dom.destroy()
                dom.undefine()
    finally:
        conn.close()
