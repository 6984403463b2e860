"""FreeBSD guests on real VMs: the FreeBSD demo guest (a kernel built here from the FreeBSD
source tree TANDEM_FREEBSD_SRC names, booted directly, its init serving kvd on port 7000)
recorded under client traffic, replayed exactly, and replayed into FreeBSD's native, debug
(INVARIANTS, WITNESS) and KASAN kernels. `./tandem test` builds them when the setting is
there (.ci/run gives it the FreeBSD source archive beside the clone)."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import assert_one_line_error, console, run_cli, start_cli, wait_for_service
from helpers.live import analyses_caught_up, drive, run_until_native_stops
from tandem import artifacts, catalog
from tandem.exact.replay import replay as exact_replay
from tandem.formats import bundle
from tandem.live.shadow import ShadowOptions, ShadowRun
from tandem.machine import Forward, Guest
from tandem.machine.guest import FREEBSD_CMDLINE
from tandem.qemu.vm import free_port
from tandem.record.recording import Recording
from tandem.record.workload import KV, demo_traffic
from tandem.semantic import inputs
from tandem.semantic.analyze import analyze
from tandem.semantic.driving import replay
from tandem.semantic.driving.replay import RunOptions
from tandem.semantic.findings import did_not_boot, findings

pytestmark = pytest.mark.skipif(not os.environ.get("TANDEM_FREEBSD_SRC"),
                                reason="no FreeBSD source tree: TANDEM_FREEBSD_SRC (docs/freebsd.md)")
FREEBSD = [catalog.ANALYSES[n] for n in ("freebsd-debug", "freebsd-kasan")]


@pytest.fixture(scope="module")
def freebsd_bundle(tmp_path_factory) -> Path:
    """The FreeBSD demo guest on its production kernel: two clients' SETs and GETs, a
    netcat session, one more connection, then `poweroff` typed on its console."""
    path = tmp_path_factory.mktemp("freebsd") / "fb.tdm"
    with Recording(path, guest=Guest.default("freebsd-native")) as rec:
        rec.wait_ready()
        demo_traffic(rec.port, rounds=5)
        with KV(rec.port) as kv:
            assert kv.request("GET key3").startswith("VALUE value-3-")
        rec.serial.type("poweroff")
        rec.wait(timeout=120)
    return path


def test_the_freebsd_demo_guest_is_recorded_and_replays_exactly(freebsd_bundle):
    m = bundle.load_manifest(freebsd_bundle)
    assert (m.machine.os, m.machine.cpu, m.state) == ("freebsd", "tcg-intel", "complete")
    assert m.input_paths["kernel"] == artifacts.kernel("freebsd-native")["bzImage"]
    v = exact_replay(freebsd_bundle)
    assert v.ok, v.summary()


def test_a_freebsd_guest_on_two_vcpus_is_replayed_exactly(tmp_path):
    """FreeBSD's SMP kernel starting its second vCPU and scheduling on both, recorded and
    replayed with QEMU's round-robin turns in the log (qemu-patches/0038)."""
    guest = Guest.default("freebsd-native")
    guest.vcpus = 2
    path = tmp_path / "fb2.tdm"
    with Recording(path, guest=guest) as rec:
        rec.wait_ready()
        demo_traffic(rec.port, rounds=3)
        rec.serial.type("poweroff")
        rec.wait(timeout=120)
    assert b"Multiprocessor System Detected: 2 CPUs" in rec.serial.output()
    m = bundle.load_manifest(path)
    assert (m.state, m.machine.os, m.machine.smp) == ("complete", "freebsd", 2)
    v = exact_replay(path)
    assert v.ok, v.summary()


def test_a_freebsd_kernel_without_tandems_tsc_settings_boots_on_qemus_default_cpu(tmp_path):
    """A kernel as a FreeBSD developer configures one (GENERIC's TSC handling: calibrated
    with DELAY(), not taken from the brand string), on QEMU's default CPU (qemu64, an AMD
    vendor with no frequency in its brand): its early DELAY()s go through the i8254 the VM
    has, not xen_delay() (guest-kernel/freebsd/patches/0002), so it boots, serves, and
    replays exactly."""
    g = Guest.default("freebsd-native")
    g = dataclasses.replace(g, cpu=None, cmdline=g.cmdline + " kern.timecounter.invariant_tsc=0"
                            " machdep.disable_tsc_calibration=0")
    path = tmp_path / "generic-tsc.tdm"
    with Recording(path, guest=g) as rec:
        rec.wait_ready()
        demo_traffic(rec.port, rounds=2)
        rec.serial.type("poweroff")
        rec.wait(timeout=120)
    m = bundle.load_manifest(path)
    assert (m.machine.cpu, m.state) == (None, "complete"), (m.machine, m.state)
    assert b"kvd-init: powering off" in console(path) and b"panic" not in console(path)
    v = exact_replay(path)
    assert v.ok, v.summary()


def test_freebsd_kernels_replay_the_traffic_with_no_divergence(freebsd_bundle, tmp_path):
    """The native on the semantic path (the noise run) and the debug and KASAN kernels serve
    the recorded requests as the native did: no divergence, no finding, powered off."""
    s = analyze(freebsd_bundle, [catalog.NATIVE, *FREEBSD], workdir=tmp_path)
    assert [r.analysis for r in s.results] == ["native", "freebsd-debug", "freebsd-kasan"]
    for r in s.results:
        # each powers off as the native did, slower ones given the time (driver.py)
        assert r.run.outcome == "poweroff", (r.analysis, r.run.detail)
        assert not r.divergences, (r.analysis, [d.diff for d in r.divergences])
        assert not r.findings, (r.analysis, [f.title for f in r.findings])
        assert r.run.n_delivered > 0 and not r.run.limits, (r.analysis, r.run.limits)
    # what each booted: its own kernel, on the FreeBSD demo guest's root (the console its
    # own recording keeps: the run's is dropped as it is compared)
    consoles = {r.analysis: console(tmp_path / f"{r.analysis}.tdm") for r in s.results}
    assert all(b"kvd-init: powering off" in c for c in consoles.values()), consoles
    assert b"TANDEM-NATIVE" in consoles["native"]
    assert b"TANDEM-DEBUG" in consoles["freebsd-debug"] and b"WITNESS" in consoles["freebsd-debug"]
    assert b"TANDEM-KASAN" in consoles["freebsd-kasan"]


def test_a_linux_analysis_of_a_freebsd_recording_is_a_one_line_error(freebsd_bundle):
    assert_one_line_error(run_cli("replay", str(freebsd_bundle), "--analysis", "kasan"),
                          "analysis kasan: its kernel is linux's", "of a freebsd guest")


# The planted bugs of the FreeBSD demo guest's kernel (guest-kernel/freebsd/sys/dev/tandem/):
# request -> what reports it, by analysis. The lock-order pair comes first: one order, then
# the other, which WITNESS reports; the failed KASSERT last, as it panics the debug kernels.
# mac-skip is no kernel report: tandem assert finds it (below).
BUGS = ["BUG lock-ab", "BUG lock-ba", "BUG sleep", "BUG mac-skip", "BUG oob", "BUG uaf", "BUG kassert"]
LOR = "WITNESS: lock order reversal: tandem_b -> tandem_a in tb_stats_reset"
SLEEP = 'WITNESS: Sleeping on "tbflush" with non-sleepable locks held in tb_cache_flush'
KASSERT = "panic: tb_session_close: session already closed"
EXPECTED = {
    "native": {},
    "freebsd-debug": {LOR: "BUG lock-ba", SLEEP: "BUG sleep", KASSERT: "BUG kassert"},
    "freebsd-kasan": {LOR: "BUG lock-ba", SLEEP: "BUG sleep",
                      "ASan: Invalid access, NUM-byte write in tb_note_store": "BUG oob",
                      "ASan: Invalid access, NUM-byte read in tb_session_account": "BUG uaf",
                      KASSERT: "BUG kassert"},
}
FREEBSD_PACK = Path(__file__).parent.parent / "guest-kernel" / "assertions" / "freebsd-15.tesla"


@pytest.fixture(scope="module")
def freebsd_bugs_bundle(tmp_path_factory) -> Path:
    """Clean traffic, then each planted-bug request (the production kernel answers OK)."""
    path = tmp_path_factory.mktemp("freebsd-bugs") / "bugs.tdm"
    with Recording(path, guest=Guest.default("freebsd-native")) as rec:
        rec.wait_ready()
        demo_traffic(rec.port, rounds=3)
        with KV(rec.port) as kv:
            assert [kv.request(b) for b in BUGS] == ["OK"] * len(BUGS)
            assert kv.request("BUG nosuch") == "ERR"
        rec.serial.type("poweroff")
        rec.wait(timeout=120)
    return path


def test_each_planted_freebsd_bug_is_found_by_its_analyses_and_attributed(freebsd_bugs_bundle, tmp_path):
    s = analyze(freebsd_bugs_bundle, [catalog.NATIVE, *FREEBSD], workdir=tmp_path)
    for r in s.results:
        found = {f.title: f for f in r.findings}
        want = EXPECTED[r.analysis]
        assert set(found) == set(want), (r.analysis, sorted(found))
        for title, request in want.items():
            f = found[title]
            assert f'"{request}"' in f.after_input, (r.analysis, title, f.after_input)
            # symbolized from the kernel's kernel.debug: the guilty function's own line first
            func, path, line = f.locations[0]
            assert (path, title.endswith(f" in {func}") or f.frames[0] == func) == (
                "sys/dev/tandem/tandem_bugs.c", True) and line > 0, (r.analysis, title, f.locations[:3])
        # the KASSERT panics a debug kernel (and QEMU stops): what the native did after it
        # is not analysed, never a divergence
        assert r.run.outcome == ("poweroff" if r.analysis == "native" else "crashed"), (r.analysis, r.run.detail)
        assert not r.divergences, (r.analysis, [d.diff for d in r.divergences])


def test_the_freebsd_assertion_pack_holds_but_for_the_planted_mac_skip(freebsd_bugs_bundle):
    """tandem assert on an exact replay of the FreeBSD native: the FreeBSD 15 pack, loaded
    against this kernel's own symbols (its System.map, from kernel.debug), holds on the demo
    guest's traffic; the planted send without its MAC check breaks the pack's
    mac-socket-send-syscall, reported with the request that led there."""
    r = run_cli("assert", str(freebsd_bugs_bundle), "--assertions", str(FREEBSD_PACK), "--json")
    assert r.returncode == 1, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["replay"]["ok"], out["replay"]
    (v,) = out["violations"]
    assert v["assertion"] == "mac-socket-send-syscall", v
    assert v["request"]["text"] == "BUG mac-skip", v["request"]
    assert v["comm"] == "init", v["comm"]             # the demo guest's init, as td_name has it
    assert any(f["symbol"].startswith("tb_notify_send+") for f in v["stack"]), [f["symbol"] for f in v["stack"]]
    assert "VIOLATION mac-socket-send-syscall" in r.stderr


def test_a_freebsd_native_is_shadowed_live_by_its_debug_kernel(tmp_path):
    """tandem shadow with a FreeBSD native: the debug kernel trails it live, reports the
    lock order reversal the native's traffic causes as it happens, and serves the rest as
    the native did."""
    live = []
    sh = ShadowRun(tmp_path / "native.tdm", [catalog.ANALYSES["freebsd-debug"]], ShadowOptions(),
                   workdir=tmp_path / "an", guest=Guest.default("freebsd-native"),
                   on_finding=lambda f: live.append(f))
    sh.start()

    def work():
        demo_traffic(sh.port, rounds=3)
        with KV(sh.port) as kv:
            assert [kv.request(b) for b in ("BUG lock-ab", "BUG lock-ba")] == ["OK", "OK"]
    t = drive(sh, work)
    run_until_native_stops(sh, client=t)
    analyses_caught_up(sh)
    t.join(10)
    s = sh.finish()
    (r,) = s.results
    assert r.run.outcome == "poweroff", r.run.detail
    assert [f.title for f in live] == [LOR], [f.title for f in live]
    assert '"BUG lock-ba"' in live[0].after_input, live[0].after_input
    assert not r.divergences, [d.diff for d in r.divergences]
    v = exact_replay(tmp_path / "native.tdm")      # the native's recording, made alongside
    assert v.ok, v.summary()


def test_a_farm_night_over_a_freebsd_and_a_linux_recording(freebsd_bugs_bundle, demo_bundle, tmp_path):
    """One farm file with a FreeBSD and a Linux recording and an analysis of each OS: each
    recording is replayed exactly and into its own OS's analysis, which finds what it
    finds offline; the other OS's analysis is a skipped task, never an error."""
    spec = tmp_path / "farm.toml"
    spec.write_text("\n".join([
        "[corpus]", f"bundles = {json.dumps([str(freebsd_bugs_bundle), str(demo_bundle)])}",
        "[analyses]", 'names = ["freebsd-debug", "lockdep"]',
        "[settings]", 'db = "farm.sqlite"', 'out = "out"', "noise = false", "vms = 2", "repeats = 0"]) + "\n")
    r = run_cli("farm", "run", str(spec), "--night", "n1", timeout=900)
    assert r.returncode == 1, r.stderr[-3000:]          # new findings: the FreeBSD guest's
    with sqlite3.connect(tmp_path / "farm.sqlite") as c:
        tasks = c.execute("select bundle, analysis, status from tasks where kernel != 'confirm'").fetchall()
        titles = {t for (t,) in c.execute("select distinct signature from findings")}
    fb, linux = str(freebsd_bugs_bundle), str(demo_bundle)
    assert sorted(tasks) == sorted([
        (fb, "exact", "pass"), (fb, "freebsd-debug", "finding"), (fb, "lockdep", "skipped"),
        (linux, "exact", "pass"), (linux, "freebsd-debug", "skipped"), (linux, "lockdep", "pass")]), tasks
    assert titles == {LOR, SLEEP, KASSERT}, titles


def test_a_freebsd_kernel_that_panics_at_boot_did_not_boot_and_is_no_finding(freebsd_bundle, tmp_path):
    """An analysis kernel that panics while it boots (the debug kernel given the planted
    KASSERT at boot, debug.tandem_bug_at_boot=kassert: as the init loads the KLD, before
    it serves): it prints its panic and stops, and the analysis did not boot, with that
    panic as why; not a finding about the guest."""
    a = catalog.ANALYSES["freebsd-debug"]
    g = Guest.default("freebsd-debug")
    g = dataclasses.replace(g, cmdline=g.cmdline + " debug.tandem_bug_at_boot=kassert")
    r = replay.run(inputs.load(freebsd_bundle), RunOptions(a, g, tmp_path))
    assert r.outcome == "crashed", r.detail
    why, found = did_not_boot(r, findings(r, a))
    assert found == [] and why.startswith("did not boot") and KASSERT in why, why


def build_config(conf: Path) -> subprocess.CompletedProcess:
    """`./tandem build --freebsd-config CONF` as a user runs it."""
    return subprocess.run([sys.executable, "-m", "tandem.setup.build", "--freebsd-config", str(conf)],
                          env=dict(os.environ, PYTHONPATH=str(Path(__file__).parent.parent / "replay")),
                          capture_output=True, text=True, timeout=1800)


def test_a_kernel_config_that_does_not_build_is_one_line_naming_it_and_its_error(tmp_path):
    conf = tmp_path / "BROKEN"
    conf.write_text("include TANDEM-NATIVE\nident BROKEN\noptions TANDEM_NO_SUCH_OPTION\n")
    assert_one_line_error(build_config(conf), f"FreeBSD kernel config {conf} does not build",
                          'unknown option "TANDEM_NO_SUCH_OPTION"', "kernel-freebsd-config-BROKEN.log")
    assert_one_line_error(build_config(tmp_path / "NOSUCH"), f"FreeBSD kernel config {tmp_path / 'NOSUCH'}: no such file")
    (tmp_path / "TANDEM-MINE").write_text("include TANDEM-NATIVE\n")
    assert_one_line_error(build_config(tmp_path / "TANDEM-MINE"), "TANDEM-MINE: name it otherwise")


@pytest.mark.timeout(2400)
def test_your_own_kernel_config_is_built_and_analyses_your_freebsd_vm(tmp_path):
    """A FreeBSD developer's config (tandem's TANDEM-NATIVE, the devices a tandem VM has,
    with INVARIANTS on) built by tandem from the same tree, then a recording of their own
    VM (a FreeBSD disk, its kernel booted directly) replayed into it: clean, and the console
    shows their kernel booted."""
    conf = tmp_path / "MINE"
    conf.write_text("include TANDEM-NATIVE\nident MINE\noptions INVARIANTS\noptions INVARIANT_SUPPORT\n")
    r = build_config(conf)
    assert r.returncode == 0, r.stderr[-3000:]
    (line,) = [ln for ln in r.stderr.splitlines() if "--analysis-kernel" in ln]
    spec = line.split("--analysis-kernel ", 1)[1].strip()
    assert spec.startswith("mine=") and spec.endswith("/kernel.debug"), line

    disk = tmp_path / "root.img"
    shutil.copyfile(artifacts.freebsd_guest()["root_image"], disk)
    port = free_port()
    guest = Guest.of_disks([(str(disk), "raw")], kernel=artifacts.kernel("freebsd-native")["bzImage"],
                           append=FREEBSD_CMDLINE, memory_mb=512, os="freebsd")
    rec_path = tmp_path / "myvm.tdm"
    with Recording(rec_path, guest, forwards=(Forward("tcp", port, 7000),)) as rec:
        rec.wait_ready()
        demo_traffic(port, rounds=3)
        rec.serial.type("poweroff")
        rec.wait(timeout=120)
    assert bundle.load_manifest(rec_path).users_guest

    r = run_cli("replay", str(rec_path), "--analysis-kernel", spec, "--no-noise", "--workdir", str(tmp_path / "w"),
                timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "mine: poweroff" in r.stdout + r.stderr, r.stdout + r.stderr
    assert b"FreeBSD 15" in console(tmp_path / "w" / "mine.tdm") and b" MINE" in console(tmp_path / "w" / "mine.tdm")


@pytest.mark.timeout(1800)
def test_a_freebsd_vm_its_own_loader_boots_is_recorded_replayed_and_analysed(tmp_path):
    """A FreeBSD VM as users have them: a GPT disk (pmbr, gptboot, a UFS root with the
    loader, the kernel in /boot/kernel and an /etc/fstab) that the firmware boots through
    FreeBSD's own loader. `tandem record --disk` with nothing said of its OS knows it from
    the partitions and records it with FreeBSD's CPU; it replays exactly; the debug
    kernel, booted directly on its disk on the root the native's kernel said it mounted,
    replays its traffic without a divergence and finds the planted lock order reversal
    (its KLD loaded from the disk by the guest's init), attributed to its request."""
    disk = tmp_path / "freebsd-gpt.img"
    shutil.copyfile(artifacts.freebsd_disk()["disk"], disk)
    port = free_port()
    tdm = tmp_path / "gpt.tdm"
    proc = start_cli("record", str(tdm), "--disk", str(disk), "--memory", "512M", "--forward", f"tcp:{port}:7000")
    try:
        wait_for_service(port, proc, timeout=300)
        demo_traffic(port, rounds=3)
        with KV(port) as kv:
            assert [kv.request(b) for b in ("BUG lock-ab", "BUG lock-ba")] == ["OK", "OK"]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    m = bundle.load_manifest(tdm)
    assert (m.machine.os, m.machine.cpu, m.machine.boot) == ("freebsd", "tcg-intel", "firmware"), m.machine
    assert b"FreeBSD/x86 bootstrap loader" in console(tdm) and b"Trying to mount root from ufs:/dev/vtbd0p2" \
        in console(tdm)
    r = run_cli("replay", str(tdm))
    assert r.returncode == 0 and "VERIFIED" in r.stderr, r.stdout + r.stderr

    s = analyze(tdm, [catalog.ANALYSES["freebsd-debug"]], workdir=tmp_path / "w")
    (res,) = s.results
    assert not res.divergences, [d.diff for d in res.divergences]
    assert [(f.title, '"BUG lock-ba"' in f.after_input) for f in res.findings] == [(LOR, True)], res.findings
    shown = console(tmp_path / "w" / "freebsd-debug.tdm")
    assert b"TANDEM-DEBUG" in shown and b"Trying to mount root from ufs:/dev/vtbd0p2" in shown
