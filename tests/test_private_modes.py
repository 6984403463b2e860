"""Recordings private by default, and a live recording safe
from a second recorder. Real recordings with the real patched QEMU, under the umask
most hosts run with (022), so that nothing here is private by the umask's doing."""
from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from helpers import analyses, assert_one_line_error, run_cli
from tandem.formats import bundle
from tandem.exact.replay import replay
from tandem.record.recording import Recording
from tandem.semantic.analyze import analyze
from tandem.machine import RR, Guest, Run
from tandem.qemu.argv import qemu_argv
from tandem.record.workload import demo_traffic

USUAL_UMASK = 0o022


@pytest.fixture
def usual_umask():
    old = os.umask(USUAL_UMASK)
    yield
    os.umask(old)


def modes(top: Path) -> dict[str, str]:
    """Every path under top (top included, as "."), relative, with its mode in octal."""
    out = {".": f"{stat.S_IMODE(top.lstat().st_mode):04o}"}
    for dirpath, dirs, files in os.walk(top):
        for n in dirs + files:
            p = Path(dirpath, n)
            out[str(p.relative_to(top))] = f"{stat.S_IMODE(p.lstat().st_mode):04o}"
    return out


def not_private(top: Path) -> dict[str, str]:
    return {p: m for p, m in modes(top).items()
            if m != ("0700" if (top / p).is_dir() else "0600")}


def raw_qemu(rundir: Path, *, rrfile: Path, devlog: Path, stop_after_ns: int = 0) -> subprocess.CompletedProcess:
    """The patched QEMU alone in record mode (no disk: no overlay to share), started under
    umask 022 and not through tandem's VM (which starts QEMU under umask 077)."""
    rundir.mkdir(exist_ok=True)
    guest = Guest.default().with_disk(None)
    argv = qemu_argv(guest, Run(rundir, rr=RR("record", rrfile), devlog=devlog, stop_after_ns=stop_after_ns))
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          umask=USUAL_UMASK)


def test_qemu_creates_its_logs_0600(built, tmp_path, usual_umask):
    """QEMU's side on its own: the record log and device log 0600 under umask 022 (not the
    umask's 0644: qemu-patches/0012, 0015)."""
    rr, dl = tmp_path / "r.tdrs", tmp_path / "d.pcapng"
    r = raw_qemu(tmp_path / "run", rrfile=rr, devlog=dl, stop_after_ns=50_000_000)
    assert r.returncode == 0, r.stderr
    assert (f"{stat.S_IMODE(rr.stat().st_mode):04o}", f"{stat.S_IMODE(dl.stat().st_mode):04o}") == ("0600", "0600")


def test_fresh_bundle_and_analysis_workdir_private(demo_bundle_022, tmp_path, usual_umask):
    """Every directory 0700 and every file 0600: the bundle (manifest, QEMU's record log
    and device log, the disk overlay, qemu.log) and an analysis workdir tandem creates
    (findings, summary, the analysis's own recording and its QEMU logs)."""
    b = demo_bundle_022
    assert set(modes(b)) >= {".", bundle.MANIFEST, bundle.STREAM, bundle.DEVLOG, "disk-overlay.qcow2",
                             "qemu.log"}
    assert not_private(b) == {}, modes(b)
    workdir = tmp_path / "out" / "analysis"
    s = analyze(b, analyses("native"), noise=False, workdir=workdir)
    assert s.results[0].run.outcome == "poweroff", s.results[0].run.detail
    found = modes(workdir)
    assert {"findings.jsonl", "summary.json", "native.tdm", f"native.tdm/{bundle.STREAM}",
            f"native.tdm/{bundle.DEVLOG}", "native.tdm/qemu.log"} <= set(found), found
    assert not_private(workdir) == {}, found
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o700     # the parent tandem made
    r = run_cli("inspect", str(b))
    assert "group/others" not in r.stderr, r.stderr


def test_second_recorder_refused_first_replays_exactly(built, tmp_path, usual_umask):
    """A second recorder on a live recording's path: `tandem record` refuses the bundle,
    and a QEMU given its record log or its device log refuses them (and does not empty
    them: the lock comes before O_TRUNC); the first recording then replays exactly."""
    path = tmp_path / "live.tdm"
    with Recording(path) as rec:
        rec.wait_ready()
        demo_traffic(rec.port, rounds=2)
        # What a truncating second recorder would wipe: the first QEMU writes on at its
        # own offset, so the file grows back, but over a hole of zeros.
        before = {n: (path / n).read_bytes() for n in (bundle.STREAM, bundle.DEVLOG)}
        assert all(before.values()), before.keys()

        assert_one_line_error(run_cli("record", str(path), "--duration", "1s"), str(path), "not empty")

        # (stop-after: a QEMU that took the log anyway, as before the lock of qemu-patches/0012, ends by itself)
        second = raw_qemu(tmp_path / "second", rrfile=path / bundle.STREAM, devlog=tmp_path / "second.pcapng",
                          stop_after_ns=50_000_000)
        third = raw_qemu(tmp_path / "third", rrfile=tmp_path / "third.tdrs", devlog=path / bundle.DEVLOG,
                         stop_after_ns=50_000_000)
        for n, data in before.items():
            with open(path / n, "rb") as f:
                assert f.read(len(data)) == data, f"{n}: changed under the live recording"
        assert second.returncode != 0
        assert f"replay stream {path / bundle.STREAM}: another QEMU is recording into it (locked)" in second.stderr
        assert third.returncode != 0
        assert f"devlog: '{path / bundle.DEVLOG}': another QEMU is writing it (locked)" in third.stderr
        demo_traffic(rec.port, rounds=2)
        rec.serial.type("poweroff")
        rec.wait(timeout=120)
    assert bundle.load_manifest(path).state == "complete"
    v = replay(path)
    assert v.ok, v.summary()


@pytest.fixture
def demo_bundle_022(built, tmp_path_factory):
    """A fresh small recording made under umask 022."""
    old = os.umask(USUAL_UMASK)
    try:
        path = tmp_path_factory.mktemp("private") / "rec" / "demo.tdm"
        with Recording(path) as rec:
            rec.wait_ready()
            demo_traffic(rec.port, rounds=2)
            rec.serial.type("poweroff")
            rec.wait(timeout=120)
        return path
    finally:
        os.umask(old)
