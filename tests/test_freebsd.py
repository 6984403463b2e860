"""FreeBSD guests on real VMs: the FreeBSD demo guest (a kernel built here from the FreeBSD
source tree TANDEM_FREEBSD_SRC names, booted directly, its init serving kvd on port 7000)
recorded under client traffic, replayed exactly, and replayed into FreeBSD's native, debug
(INVARIANTS, WITNESS) and KASAN kernels. `./tandem test` builds them when the setting is
there (.ci/run gives it the FreeBSD source archive beside the clone)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import assert_one_line_error, run_cli
from tandem import artifacts, catalog
from tandem.exact.replay import replay as exact_replay
from tandem.formats import bundle, pcapng
from tandem.machine import Guest
from tandem.record.recording import Recording
from tandem.record.workload import KV, demo_traffic
from tandem.semantic.analyze import analyze

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


def console(path: Path) -> bytes:
    return b"".join(e.data for e in pcapng.DevlogReader(path / bundle.DEVLOG)
                    if e.kind == "serial" and e.direction == "out")


def test_a_linux_analysis_of_a_freebsd_recording_is_a_one_line_error(freebsd_bundle):
    assert_one_line_error(run_cli("replay", str(freebsd_bundle), "--analysis", "kasan"),
                          "analysis kasan: its kernel is linux's", "of a freebsd guest")


# The planted bugs of the FreeBSD demo guest's kernel (guest-kernel/freebsd/sys/dev/tandem/):
# request -> what reports it, by analysis. The lock-order pair comes first: one order, then
# the other, which WITNESS reports.
BUGS = ["BUG lock-ab", "BUG lock-ba", "BUG oob", "BUG uaf"]
LOR = "WITNESS: lock order reversal: tandem_b -> tandem_a in tb_stats_reset"
EXPECTED = {
    "native": {},
    "freebsd-debug": {LOR: "BUG lock-ba"},
    "freebsd-kasan": {LOR: "BUG lock-ba", "ASan: Invalid access, NUM-byte write in tb_note_store": "BUG oob",
                      "ASan: Invalid access, NUM-byte read in tb_session_account": "BUG uaf"},
}


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
        found = {f.title: f.after_input for f in r.findings}
        want = EXPECTED[r.analysis]
        assert set(found) == set(want), (r.analysis, sorted(found))
        for title, request in want.items():
            assert f'"{request}"' in found[title], (r.analysis, title, found[title])
        assert not r.divergences, (r.analysis, [d.diff for d in r.divergences])
