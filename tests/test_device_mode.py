"""Device-mode recording (`tandem record --mode device`): a native with two vCPUs on
multi-threaded TCG, no -icount, only its device log written; semantic replay finds the
planted bugs in it as in an exact recording; exact replay is refused by name."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import analyses, assert_one_line_error, record_planted_bugs, run_cli
from helpers.live import analyses_caught_up, drive, run_until_native_stops
from tandem import catalog
from tandem.exact.replay import replay
from tandem.formats import bundle, pcapng
from tandem.live.shadow import ShadowOptions, ShadowRun
from tandem.machine import Guest
from tandem.record.workload import bad_requests, demo_traffic
from tandem.semantic.analyze import analyze

KASAN = catalog.ANALYSES["kasan"]
# What the KASAN kernel reports for the demo's planted bugs (tests/test_semantic.py: EXPECTED)
KASAN_TITLES = {"slab-out-of-bounds Write in tb_note_store", "slab-use-after-free Read in tb_session_account",
                "slab-use-after-free Read in lkdtm_READ_AFTER_FREE"}


def serial_out(devlog: Path) -> bytes:
    """What a run's guest wrote on its serial console, from its device log."""
    return b"".join(e.data for e in pcapng.read_devlog(devlog).events
                    if e.channel.startswith("serial") and e.direction == "out")


@pytest.fixture(scope="module")
def device_bundle(built, tmp_path_factory) -> Path:
    """The demo guest with 2 vCPUs recorded in device mode: clean traffic from two clients,
    every planted-bug request, then poweroff."""
    guest = Guest.default(catalog.DEFAULT_KERNEL)
    guest.vcpus = 2
    return record_planted_bugs(tmp_path_factory.mktemp("device") / "smp2.tdm", guest=guest, mode="device")


def test_a_device_mode_bundle_has_the_device_log_alone_and_says_its_mode(device_bundle):
    m = json.loads((device_bundle / bundle.MANIFEST).read_text())
    assert m["state"] == "complete" and m["stop"]["reason"] == "poweroff", m["stop"]
    assert m["machine"]["mode"] == "device" and m["machine"]["smp"] == 2, m["machine"]
    assert "icount_shift" not in m["machine"] and "state_every_ns" not in m["machine"]
    assert not (device_bundle / bundle.STREAM).exists()
    assert b"Brought up 1 node, 2 CPUs" in serial_out(device_bundle / bundle.DEVLOG)   # both vCPUs ran
    # each console run says the vCPU that wrote it (qemu-patches/0036), one of the two;
    # a run the UART sent on from QEMU's main loop (its socket was full) says none
    vcpus = {e.vcpu for e in pcapng.read_devlog(device_bundle / bundle.DEVLOG).events
             if e.kind == "serial" and e.direction == "out"}
    assert vcpus - {None} and vcpus <= {0, 1, None}, vcpus
    r = run_cli("inspect", str(device_bundle))
    assert r.returncode == 0, r.stderr
    assert "recorded in device mode (2 vCPUs, tcg, no -icount)" in r.stdout, r.stdout
    assert re.search(r"^serial0 .* [01]:\d+", r.stdout, re.M), r.stdout


def test_exact_replay_of_a_device_mode_bundle_is_refused_by_name(device_bundle):
    for args in (("replay", str(device_bundle)), ("replay", str(device_bundle), "--locate")):
        assert_one_line_error(run_cli(*args), str(device_bundle), "recorded in device mode", "--analysis")


def test_semantic_replay_of_a_device_mode_bundle_finds_the_planted_bugs(device_bundle, tmp_path):
    """The analysis VM runs one vCPU under -icount (deterministic, itself recorded): the
    native's inputs at their VM times are all it needs from the recording."""
    s = analyze(device_bundle, [KASAN], noise=False, workdir=tmp_path)
    (r,) = s.results
    assert r.run.outcome == "poweroff", r.run.detail
    assert not r.divergences, [d.diff for d in r.divergences]
    titles = {f.title for f in r.findings}
    assert KASAN_TITLES <= {t.removeprefix("KASAN: ") for t in titles}, titles


def test_analyses_with_as_many_vcpus_as_the_native_where_their_kernel_has_smp(device_bundle, tmp_path):
    """--analysis-vcpus native: the ASan userland on Debian's SMP kernel runs both vCPUs,
    recorded (qemu-patches/0038: the turns of its vCPUs logged) so that its run replays
    exactly, and finds its bug; KASAN's kernel has no SMP, so it runs one, and the summary
    says both."""
    s = analyze(device_bundle, [catalog.ANALYSES["asan-userland"], KASAN], noise=False, workdir=tmp_path, vcpus=2)
    runs = {r.run.analysis: r for r in s.results}
    asan, kasan = runs["asan-userland"], runs["kasan"]
    assert asan.run.bundle is not None and kasan.run.bundle is not None
    assert b"Brought up 1 node, 2 CPUs" in serial_out(asan.run.bundle / bundle.DEVLOG)
    assert bundle.load_manifest(asan.run.bundle).machine.smp == 2
    v = replay(asan.run.bundle)
    assert v.ok, v.summary()
    assert any("2 vCPUs, as the native had, in turns on one host thread: recorded" in x for x in s.limits), s.limits
    assert any("one vCPU, not the native's 2: the kasan kernel is built without SMP" in x for x in s.limits), s.limits
    assert not kasan.divergences, [d.diff for d in kasan.divergences]    # (ASan's service dies on its bug)
    assert any("heap-buffer-overflow" in f.title for f in asan.findings), [f.title for f in asan.findings]
    assert any("tb_note_store" in f.title for f in kasan.findings), [f.title for f in kasan.findings]


def test_what_exact_mode_cannot_record_is_refused_before_a_bundle_is_made(built, tmp_path):
    for extra, needle in ((("--accel", "kvm"), "accelerator kvm: exact mode needs TCG"),):
        r = run_cli("record", str(tmp_path / "x.tdm"), *extra, "--duration", "1s")
        assert_one_line_error(r, needle, "--mode device")
        assert not (tmp_path / "x.tdm").exists()


def test_a_live_shadow_trails_a_two_vcpu_native_recorded_in_device_mode(built, tmp_path):
    """The native on two vCPUs (multi-threaded TCG), its shadow on one under -icount: the
    shadow follows the native's device log as it is written and finds the planted bug."""
    guest = Guest.default(catalog.DEFAULT_KERNEL)
    guest.vcpus = 2
    sh = ShadowRun(tmp_path / "native.tdm", analyses("kasan"), ShadowOptions(record_mode="device"),
                   workdir=tmp_path / "an", guest=guest)
    with sh:
        t = drive(sh, lambda: (demo_traffic(sh.port, rounds=3), bad_requests(sh.port, ["kasan-oob"])))
        run_until_native_stops(sh, client=t)
        analyses_caught_up(sh)
        t.join(10)
        s = sh.finish()
    assert json.loads((tmp_path / "native.tdm" / bundle.MANIFEST).read_text())["machine"]["mode"] == "device"
    (r,) = s.results
    assert not r.divergences, [d.diff for d in r.divergences]
    assert "KASAN: slab-out-of-bounds Write in tb_note_store" in {f.title for f in r.findings}
