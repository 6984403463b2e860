"""Semantic replay into analysis VMs: real recordings, real sanitizer kernels and
userland, the real feed in the patched QEMU."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from helpers import ROOT, assert_one_line_error, record_planted_bugs, run_cli, start_client
from tandem import catalog
from tandem.semantic import inputs
from tandem.semantic.driving import replay
from tandem.semantic.driving.replay import RunOptions
from tandem.exact.replay import replay as exact_replay
from tandem.semantic.findings import failure, findings
from tandem.record.recording import Recording
from tandem.semantic.analyze import PACE_EVERY, analyze
from tandem.semantic.trail import Trail
from tandem.machine import Guest
from tandem.record.workload import KV, PLANTED_BUGS, bad_requests

# Every Linux analysis of the catalogue but the null one: a new analysis is tested here once
# it says below what it finds in the planted bugs (FreeBSD's: tests/test_freebsd.py).
SANITIZERS = [a for a in catalog.ALL if a != catalog.NATIVE and a.os == "linux"]
KASAN = catalog.ANALYSES["kasan"]

# analysis -> {(report type, words in the title): the planted request that causes it}
EXPECTED = {
    "kasan": {("KASAN", "slab-out-of-bounds Write in tb_note_store"): "kasan-oob",
              ("KASAN", "slab-use-after-free Read in tb_session_account"): "kasan-uaf",
              ("KASAN", "slab-use-after-free Read in lkdtm_READ_AFTER_FREE"): "lkdtm-uaf"},
    # KASAN and lockdep in one kernel: what each finds (the lock-order pair comes first in
    # PLANTED_BUGS, since a KASAN report turns lockdep off)
    "debug": {("KASAN", "slab-out-of-bounds Write in tb_note_store"): "kasan-oob",
              ("KASAN", "slab-use-after-free Read in tb_session_account"): "kasan-uaf",
              ("KASAN", "slab-use-after-free Read in lkdtm_READ_AFTER_FREE"): "lkdtm-uaf",
              ("LOCKDEP", "possible deadlock in tb_stats_reset"): "lockdep-ba"},
    "ubsan": {("UBSAN", "shift-out-of-bounds in tb_proc_write"): "ubsan-shift",
              ("UBSAN", "array-index-out-of-bounds in tb_hist_read"): "ubsan-index",
              # the bounds sanitizer also sees the off-by-one store of the oob request
              ("UBSAN", "array-index-out-of-bounds in tb_note_store"): "kasan-oob"},
    "lockdep": {("LOCKDEP", "possible deadlock in tb_stats_reset"): "lockdep-ba"},
    # KCSAN prints a module function with its module, and the title keeps what it prints.
    "kcsan": {("KCSAN", "data-race in tb_rate_sample [tandem_bugs] / tb_rate_tick [tandem_bugs]"):
              "kcsan-race"},
    "asan-userland": {("ASAN", "heap-buffer-overflow Write in miss_cache_put"): "asan-heap-overflow"},
    "native": {},
}


@pytest.fixture(scope="session")
def planted_bugs_bundle(built, tmp_path_factory) -> Path:
    """Clean traffic, then every planted-bug request (answered normally), then poweroff."""
    return record_planted_bugs(tmp_path_factory.mktemp("bugs") / "bugs.tdm")


def client_line(rec: inputs.RecordedInputs, flow: int, offset: int) -> bytes:
    """The line the recorded client sent at this offset of its stream on a flow."""
    stream = b"".join(i.data for i in rec.inputs if i.kind == "tcp-data" and i.flow == flow)
    return stream[offset:].split(b"\n", 1)[0]


def test_null_analysis_has_no_divergence(demo_bundle, tmp_path):
    s = analyze(demo_bundle, [catalog.NATIVE], noise=False, workdir=tmp_path)
    (r,) = s.results
    assert r.run.outcome == "poweroff", r.run.detail
    assert not r.divergences, [d.diff for d in r.divergences]
    assert not r.findings
    assert not r.run.limits


def test_clean_traffic_into_every_sanitizer_is_clean(demo_bundle, tmp_path):
    s = analyze(demo_bundle, SANITIZERS, workdir=tmp_path)
    for r in s.results:
        assert r.run.outcome == "poweroff", (r.analysis, r.run.detail)
        assert not r.findings, (r.analysis, [f.title for f in r.findings])
        assert not r.divergences, (r.analysis, [d.diff for d in r.divergences])
    assert s.ok
    assert (tmp_path / "summary.json").is_file()


def test_each_planted_bug_is_found_by_its_analyses_and_attributed(planted_bugs_bundle, tmp_path):
    rec = inputs.load(planted_bugs_bundle)
    s = analyze(planted_bugs_bundle, SANITIZERS + [catalog.NATIVE], workdir=tmp_path)
    for r in s.results:
        assert r.run.outcome == "poweroff", (r.analysis, r.run.detail)
        got = {}
        for f in r.findings:
            assert f.input_flow is not None, (r.analysis, f.title, f.after_input)
            got[(f.type, f.title)] = client_line(rec, f.input_flow, f.input_offset)
        want = EXPECTED[r.analysis]
        assert len(got) == len(want), (r.analysis, sorted(got))
        for (typ, words), bug in want.items():
            hits = [line for (t, title), line in got.items() if t == typ and title.endswith(words)]
            assert hits, (r.analysis, words, sorted(got))
            assert hits[0] == PLANTED_BUGS[bug][0].encode(), (r.analysis, words, hits[0])
        if r.analysis != "asan-userland":   # kvd-asan dies on its bug: its outputs differ
            assert not r.divergences, (r.analysis, [d.diff for d in r.divergences])
    assert not s.ok

    # Each analysis run recorded itself: its recording replays exactly, findings included.
    # KCSAN's is the hard case (its sampling and delays draw on the TSC, which the
    # recording holds); KASAN's and lockdep's replays would cost 20 s more of the suite and
    # test nothing KCSAN's does not.
    for r in s.results:
        if r.analysis == "kcsan":
            v = exact_replay(r.run.bundle)
            assert v.ok, (r.analysis, v.summary())
            assert v.reports == [f.title for f in r.findings], (r.analysis, v.reports)


def test_two_replays_into_one_kernel_agree(tmp_path):
    """Initramfs only (no disk): same outputs and findings at the same VM times."""
    g = Guest.default()
    g = g.with_disk(None)
    path = tmp_path / "nodisk.tdm"
    with Recording(path, g) as rec:
        rec.wait_ready()
        bad_requests(rec.port, ["kasan-oob", "kasan-uaf"])
        rec.serial.type("poweroff")
        rec.wait(timeout=120)
    r_in = inputs.load(path)
    kasan = Guest.default("kasan").with_disk(None)
    a, b = (replay.run(r_in, RunOptions(KASAN, kasan, tmp_path / f"run{i}")) for i in (1, 2))
    assert a.outcome == b.outcome == "poweroff"
    assert a.net_out == b.net_out                      # every frame, with its VM time
    assert a.console_times == b.console_times and a.console == b.console
    fa, fb = findings(a, KASAN), findings(b, KASAN)
    assert [(f.title, f.vm_ns) for f in fa] == [(f.title, f.vm_ns) for f in fb]
    assert len(fa) == 2


def test_analysis_vm_that_panics_at_boot_did_not_boot_and_is_no_crash_of_the_guest(demo_bundle, tmp_path):
    g = dataclasses.replace(Guest.default(), cmdline=Guest.default().cmdline + " rdinit=/nonexistent init=/nonexistent")
    r = replay.run(inputs.load(demo_bundle), RunOptions(catalog.NATIVE, g, tmp_path))
    assert r.outcome == "crashed", r.detail
    assert not [f for f in findings(r, catalog.NATIVE) if f.type == "VM-CRASH"]
    why = failure(r)
    assert why.startswith("did not boot") and ("guest-reset" in why or "panic" in why), why


def test_analysis_vm_that_never_serves_is_tandems_limit_not_a_finding_nor_a_hang(demo_bundle, tmp_path):
    # The guest boots to cat(1) as init, echoing the console; the service never starts.
    g = dataclasses.replace(Guest.default(), cmdline=Guest.default().cmdline + " rdinit=/bin/cat")
    r = replay.run(inputs.load(demo_bundle), RunOptions(catalog.NATIVE, g, tmp_path, max_lag_ns=5_000_000_000))
    assert r.outcome == "lagging", r.detail
    assert findings(r, catalog.NATIVE) == []                # tandem's limit, not a finding about the guest
    assert failure(r).startswith("lagging"), failure(r)


def test_unknown_analysis_is_a_one_line_error(demo_bundle):
    assert_one_line_error(run_cli("replay", str(demo_bundle), "--analysis", "kasan,bogus"),
                          "unknown analysis 'bogus'")


@pytest.mark.parametrize("text, needle", [
    ("serial = [", "not a valid TOML"),
    ("[serial]\nmask = ['(unclosed']\n", "bad regular expression"),
    ("ignore_channels = ['carrier-pigeon']\n", "unknown channel"),
    ("[tcp]\nbyte_ranges = [{flow = 0, start = 9, end = 3}]\n", "start < end"),
    ("colour = 'blue'\n", "unknown key 'colour'"),
])
def test_malformed_equivalence_spec_is_a_one_line_error(demo_bundle, tmp_path, text, needle):
    spec = tmp_path / "spec.toml"
    spec.write_text(text)
    assert_one_line_error(run_cli("replay", str(demo_bundle), "--analysis", "kasan", "--spec", str(spec)),
                          str(spec), needle)


def test_an_analysis_kernel_not_built_is_built_when_asked_for(demo_bundle, tmp_path):
    """--analysis kasan with no kasan kernel in the build directory: said first, what for
    and about how long, then built (here from the cache: its script writes the build's
    description again), then the analysis runs to the recording's end; nothing else is
    built."""
    import os
    import shutil
    import subprocess
    import sys
    from tandem import artifacts
    build = tmp_path / "build"
    subprocess.run([str(Path(sys.executable).parent / "meson"), "setup", str(build), str(ROOT)], check=True,
                   capture_output=True, timeout=300)
    for f in artifacts.build_dir().glob("*.json"):
        if f.name != "kernel-kasan.json":
            shutil.copy(f, build / f.name)
    env = dict(os.environ, TANDEM_BUILD_DIR=str(build), PYTHONPATH=str(ROOT / "replay"))
    r = subprocess.run([sys.executable, "-m", "tandem", "replay", str(demo_bundle), "--analysis", "kasan",
                        "--workdir", str(tmp_path / "an"), "--no-record"],
                       capture_output=True, text=True, env=env, timeout=280)
    said = [line for line in r.stderr.splitlines() if "building" in line]
    assert said and said[0].startswith("tandem: building kernel-kasan, modules-kasan for --analysis kasan: about "), \
        r.stderr
    assert not [line for line in said if "lockdep" in line or "ubsan" in line or "refvm" in line], said
    assert r.returncode == 0 and "kasan: poweroff" in r.stdout + r.stderr, r.stdout + r.stderr


def hammer(port: int, seconds: float, clients: int = 4) -> int:
    """Keep-alive clients pipelining SET/GET as fast as the guest answers; requests made."""
    made, stop = [0] * clients, time.monotonic() + seconds

    def one(n: int) -> None:
        with KV(port) as kv:
            while time.monotonic() < stop:
                assert kv.requests([f"SET h{n}-{made[n]} {made[n]}", f"GET h{n}-{made[n]}"]) == \
                    ["OK", f"VALUE {made[n]}"]
                made[n] += 1
    threads = [start_client(lambda n=n: one(n), f"hammer-{n}") for n in range(clients)]
    for t in threads:
        t.join(seconds + 60)        # a client's failed assert fails the test here
    return 2 * sum(made)


def test_a_heavy_recording_is_analysed_whole_reading_no_further_ahead_than_its_window(tmp_path, monkeypatch):
    """A finished recording is read as the analysis advances: a heavy one is
    analysed to its end (loaded whole, it would pass the live bound of 100,000 inputs and
    detach every analysis), clean, and the inputs held never exceed the read-ahead window (made small
    here so that a short recording crosses it many times)."""
    path = tmp_path / "heavy.tdm"
    with Recording(path) as rec:
        rec.wait_ready()
        # Hammered in rounds of 3 s until 4,000 requests (about 2,000 inputs: 3,972 for
        # 7,916 requests beside another test's VMs), for 60 s at most: one round on a busy
        # host can make a handful.
        requests, until = 0, time.monotonic() + 60
        while requests < 4000 and time.monotonic() < until:
            requests += hammer(rec.port, 3)
        rec.serial.type("poweroff")
        rec.wait(timeout=120)
    recorded = [i for i in inputs.load(path).inputs if i.kind != "rng"]
    # Crossed five times at least.
    window = min(1000, len(recorded) // 5)
    assert window >= 200, (len(recorded), requests)
    monkeypatch.setattr("tandem.semantic.analyze.READ_AHEAD_INPUTS", window)
    monkeypatch.setattr("tandem.semantic.analyze.READ_ON_BELOW", 100)
    held: list[int] = []
    trim = Trail.trim
    monkeypatch.setattr(Trail, "trim", lambda self: (held.append(len(self.rec.inputs)), trim(self))[1])
    s = analyze(path, [catalog.NATIVE], noise=False, workdir=tmp_path / "an")
    (r,) = s.results
    assert r.run.outcome == "poweroff", r.run.detail
    assert r.complete and not r.findings and not r.divergences, (r.failure, [d.diff for d in r.divergences])
    assert s.exit_status() == 0
    delivered = r.run.n_delivered - sum(1 for i in inputs.load(path).inputs if i.kind == "rng")
    assert delivered == len(recorded), (delivered, len(recorded), requests)
    assert max(held) <= window + PACE_EVERY, max(held)
    # The clients' requests went by release rules (semantic/network/rules.py), QEMU firing them
    # with no stop: nearly all (not the connections' openings and closings, nor what a
    # stop found ready: 5,900 of 5,924 in a 3 s recording); and the
    # analysis's own recording replays exactly, the rules' decisions taken again from
    # its log.
    assert r.run.rules_fired >= 0.9 * delivered, (r.run.rules_fired, delivered)
    assert r.run.waits < delivered / 4, (r.run.waits, delivered)
    v = exact_replay(r.run.bundle)
    assert v.ok, v.summary()


def test_cli_prints_findings_and_exits_1(planted_bugs_bundle, tmp_path):
    r = run_cli("replay", str(planted_bugs_bundle), "--analysis", "ubsan", "--no-noise", "--workdir", str(tmp_path))
    assert r.returncode == 1, r.stderr
    assert "FINDING UBSAN: shift-out-of-bounds in tb_proc_write" in r.stderr
    assert "after tcp-data" in r.stderr
    assert (tmp_path / "findings.jsonl").read_text().count("\n") == 3
