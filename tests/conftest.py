"""Shared fixtures: real recordings of the real demo guest under the patched QEMU.

Nothing here is mocked: `./tandem test` builds QEMU, the kernels and the guest
image first, and these fixtures boot them.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "replay"))

from tandem import artifacts, pcapng  # noqa: E402
from tandem.errors import BundleError  # noqa: E402
from tandem.record import Recording  # noqa: E402
from tandem.workload import KV  # noqa: E402
from tandem.workload import demo_traffic  # noqa: E402


def record_demo(path: Path, *, rounds: int = 10) -> Path:
    """Record the demo guest: client traffic, serial lines, disk writes, poweroff."""
    with Recording(path) as rec:
        rec.wait_ready()
        demo_traffic(rec.port, rounds=rounds)
        rec.serial.type("echo serial says hi")
        rec.serial.wait_for(b"serial says hi", 30)
        rec.serial.type("poweroff")
        rec.wait(timeout=120)
    return path


def wireshark_counts(path: Path) -> tuple[int, int]:
    """(capinfos's packet count, tshark's): each reads the file to its end or fails."""
    r = subprocess.run(["capinfos", "-M", "-c", str(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"capinfos cannot read {path} to the end: {r.stderr.strip()}"
    n_capinfos = int(r.stdout.rsplit("Number of packets:", 1)[1].split()[0])
    r = subprocess.run(["tshark", "-r", str(path), "-T", "fields", "-e", "frame.number"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"tshark cannot read {path} to the end: {r.stderr.strip()}"
    return n_capinfos, len(r.stdout.split())


def check_devlogs_readable(paths: list[Path]) -> None:
    """Every device log QEMU wrote (its SHB names `tandem devlog`) is read to the end by
    Wireshark's tools, which count as many packets as tandem counts records. Logs the
    tests damage on purpose, or that a killed QEMU left torn, are the readers' tests'."""
    for path in paths:
        with open(path, "rb") as f:
            if b"tandem devlog" not in f.read(256):
                continue
        try:
            log = pcapng.read_devlog(path)
        except BundleError:
            continue
        if log.torn_at is not None:
            continue
        assert wireshark_counts(path) == (sum(log.records),) * 2, path


@pytest.fixture(autouse=True)
def devlogs_readable_by_wireshark(request, tmp_path_factory):
    """Issue 22's guard, around every test: the device logs it made (its own, a session
    fixture's, an analysis's) open in capinfos and tshark with tandem's record count."""
    base = tmp_path_factory.getbasetemp()
    start = time.time()
    yield
    made = [p for p in base.rglob("*.pcapng") if p.is_file() and p.stat().st_mtime >= start]
    check_devlogs_readable(made)


@pytest.fixture(scope="session")
def built():
    """The build's artifacts; a clear failure if ./tandem build has not run."""
    return {"qemu": artifacts.qemu(), "kernel": artifacts.kernel("native"), "guest": artifacts.guest()}


@pytest.fixture(scope="session")
def demo_bundle(built, tmp_path_factory) -> Path:
    """One recording shared by the read-only tests; copy it before damaging it."""
    return record_demo(tmp_path_factory.mktemp("rec") / "demo.tdm")


@pytest.fixture(scope="module")
def libvirtd(built, tmp_path_factory):
    """A private libvirtd (and virtlogd) for one test module, stopped after it."""
    from tandem import virt
    d = virt.Libvirtd(tmp_path_factory.mktemp("libvirt") / "libvirt")
    d.start()
    yield d
    d.stop()


@pytest.fixture
def bundle_copy(demo_bundle, tmp_path) -> Path:
    dst = tmp_path / "copy.tdm"
    shutil.copytree(demo_bundle, dst)
    return dst


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the tandem CLI as a user would (a subprocess), capturing its output."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "replay"))
    return subprocess.run([sys.executable, "-m", "tandem", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def assert_one_line_error(r: subprocess.CompletedProcess, *needles: str) -> str:
    """A user error: non-zero exit, one line on stderr naming the culprit, no traceback."""
    assert r.returncode != 0, r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def wait_for_service(port: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until the guest service behind `port` answers, while `proc` (tandem) runs."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            with KV(port, timeout=5) as kv:
                if kv.request("SET up 1") == "OK":
                    return
        except Exception:
            pass
        assert time.monotonic() < deadline, "the guest service never answered"
        time.sleep(0.5)
