"""tandem shadow: analysis VMs trail a serving native live (real QEMU, real kernels)."""
from __future__ import annotations

import itertools
import json
import os
import signal
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from helpers import ROOT, analyses, pace, wait_for_service, wait_until
from helpers.live import analyses_caught_up, drive, run_until_native_stops
from tandem.formats import bundle, pcapng
from tandem.semantic import inputs
from tandem import plan
from tandem.exact.replay import replay
from tandem.live.shadow import ShadowOptions, ShadowRun
from tandem.machine import Guest
from tandem.qemu.vm import Serial, free_port
from tandem.record.workload import KV, PLANTED_BUGS, bad_requests, demo_traffic


def test_live_analyses_find_planted_bugs_as_they_happen(tmp_path):
    live = []
    sh = ShadowRun(tmp_path / "native.tdm", analyses("kasan", "lockdep"), ShadowOptions(metrics_port=0),
                   workdir=tmp_path / "an", on_finding=lambda f: live.append((time.monotonic(), f)))
    sh.start()
    scraped = []
    t = drive(sh, lambda: (demo_traffic(sh.port, rounds=3),
                           bad_requests(sh.port, ["kasan-oob", "lockdep-ab", "lockdep-ba"])))
    lags = []
    def each():
        lags.append(max(r["lag_ns"] for r in sh.status()))
        if not scraped and len(lags) >= 5:   # the Prometheus endpoint shows what the live view shows
            scraped.append(urllib.request.urlopen(f"http://127.0.0.1:{sh.metrics_port}/metrics").read().decode())
    run_until_native_stops(sh, each, client=t)
    analyses_caught_up(sh, each)
    t.join(10)
    s = sh.finish()
    rec = inputs.load(tmp_path / "native.tdm")

    got = {(f.analysis, f.title) for _, f in live}
    assert ("kasan", "KASAN: slab-out-of-bounds Write in tb_note_store") in got, got
    assert ("lockdep", "possible deadlock in tb_stats_reset") in got, got
    for _, f in live:       # attributed to the request that caused it
        stream = b"".join(i.data for i in rec.inputs if i.kind == "tcp-data" and i.flow == f.input_flow)
        line = stream[f.input_offset:].split(b"\n", 1)[0].decode()
        want = "kasan-oob" if f.analysis == "kasan" else "lockdep-ba"
        assert line == PLANTED_BUGS[want][0], (f.title, line)
    # findings.jsonl was written as they happened, not at the end
    written = [json.loads(x) for x in (tmp_path / "an" / "findings.jsonl").read_text().splitlines()]
    assert len(written) >= len(live) >= 2
    for r in s.results:
        assert r.run.outcome == "poweroff", (r.analysis, r.run.detail)
        assert not r.divergences, [d.diff for d in r.divergences]
    assert any(lag > 0 for lag in lags)       # the analyses trailed, and it was reported
    assert scraped and 'tandem_lag_vm_seconds{vm="kasan"}' in scraped[0]
    assert 'tandem_findings_total{vm=' in scraped[0]
    # The native's recording, made alongside, replays exactly.
    v = replay(tmp_path / "native.tdm")
    assert v.ok, v.summary()
    # So does each analysis's own, made while it trailed a live native (the horizons and
    # warp bounds it was granted at host-timed moments are in its replay log).
    for r in s.results:
        v = replay(r.run.bundle)
        assert v.ok, (r.analysis, v.summary())
        assert v.reports == [f.title for f in r.findings], (r.analysis, v.reports)


def test_yielding_analyses_hold_still_while_the_native_is_busy_then_catch_up(tmp_path):
    """--analysis-priority yield (live/yielding.py): while the native works (its boot, its
    clients) the analysis VM's QEMU is stopped and its VM clock stands; once the native is
    quiet it catches up, finds the planted bug and agrees with the native."""
    sh = ShadowRun(tmp_path / "native.tdm", analyses("kasan"),
                   ShadowOptions(yield_to_native=True, record_analyses=False, metrics_port=0), workdir=tmp_path / "an")
    sh.start()
    held: list[tuple[str, int]] = []        # while held: the analysis QEMU's state, its VM clock

    def each():
        run = sh.followers[0].run
        if run is not None and run.qemu_pid and sh.load.held():
            try:
                stat = Path(f"/proc/{run.qemu_pid}/stat").read_text()
            except OSError:
                return
            held.append((stat[stat.rindex(")") + 2], run.end_ns))
    t = drive(sh, lambda: (demo_traffic(sh.port, rounds=3), bad_requests(sh.port, ["kasan-oob"])))
    run_until_native_stops(sh, each, client=t)
    analyses_caught_up(sh)
    t.join(10)
    s = sh.finish()
    stood = [a[1] == b[1] for a, b in itertools.pairwise(held) if a[0] == b[0] == "T"]
    assert stood and sum(stood) >= 3, held
    (lim,) = [x for x in s.limits if x.startswith("yield: ")]
    assert "held still" in lim, lim
    (r,) = s.results
    assert r.run.outcome == "poweroff", r.run.detail
    assert [f.title for f in r.findings] == ["KASAN: slab-out-of-bounds Write in tb_note_store"]
    assert not r.divergences, [d.diff for d in r.divergences]


def test_a_dying_or_overflowing_analysis_never_stops_the_native(tmp_path):
    sh = ShadowRun(tmp_path / "native.tdm", analyses("native", "lockdep"),
                   ShadowOptions(buffer_events_of={"lockdep": 20}, record_analyses=False),
                   workdir=tmp_path / "an")
    sh.start()
    answers = []
    killed = []

    def work():
        demo_traffic(sh.port, rounds=2)
        # kill the 'native' analysis VM mid-run, once it has had an input (before, it is
        # a VM that did not boot: tandem's limit, not a crash of the guest)
        f = next(f for f in sh.followers if f.analysis == "native")
        wait_until(lambda: f.run is not None and f.run.first_input_ns is not None, 120,
                   "the native analysis's first input")
        pid = f.run.qemu_pid
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
        with KV(sh.port) as kv:        # the native keeps serving: many small requests,
            for i in range(300):        # more than lockdep's buffer allows it to trail by
                answers.append(kv.request(f"SET k{i} v{i}"))
    t = drive(sh, work)
    run_until_native_stops(sh, client=t)
    t.join(10)
    s = sh.finish()
    assert killed and answers == ["OK"] * 300
    by = {r.analysis: r for r in s.results}
    assert by["native"].run.outcome == "crashed"
    assert [f.type for f in by["native"].findings] == ["VM-CRASH"]
    # lockdep, detached live (tandem's limit, never a finding), was analysed again offline
    # from the native's bundle: every recorded input analysed in the end, nothing found.
    (lim,) = [x for x in s.limits if x.startswith("lockdep: live, detached")]
    assert "buffer full" in lim and lim.endswith(": poweroff"), lim
    lockdep = by["lockdep"]
    assert lockdep.run.outcome == "poweroff" and lockdep.complete, (lockdep.run.detail, lockdep.failure)
    assert lockdep.findings == [] and lockdep.divergences == [], [d.diff for d in lockdep.divergences]
    assert s.exit_status() == 1                # the killed analysis's crash is a finding
    v = replay(tmp_path / "native.tdm")      # nothing recorded was lost
    assert v.ok, v.summary()


def test_a_hung_analysis_is_tandems_limit_and_the_native_goes_on(tmp_path):
    sh = ShadowRun(tmp_path / "native.tdm", analyses("native"), ShadowOptions(record_analyses=False, hang_wall_s=3),
                   workdir=tmp_path / "an")
    sh.start()
    answers = []

    def work():
        # The native can be ready before the analysis's QEMU has started (a loaded host).
        f = sh.followers[0]
        wait_until(lambda: f.run is not None and f.run.qemu_pid, 120, "the analysis's QEMU to start")
        os.kill(f.run.qemu_pid, signal.SIGSTOP)     # the analysis QEMU stops answering
        with KV(sh.port) as kv:
            for i in range(20):
                answers.append(kv.request(f"SET k{i} v{i}"))
        # The native serves on until tandem has given up on the stopped analysis.
        wait_until(lambda: not sh.followers[0].thread.is_alive(), 60, "the stopped analysis to be found hung")
    t = drive(sh, work)
    run_until_native_stops(sh, client=t)
    t.join(10)
    s = sh.finish()
    assert answers == ["OK"] * 20
    (r,) = s.results
    assert r.run.outcome == "hung", r.run.detail
    assert r.findings == [] and r.failure.startswith("hung"), r.failure
    assert s.exit_status() == 3
    assert replay(tmp_path / "native.tdm").ok


def test_agreed_release_keeps_a_diverging_answer_from_the_client(tmp_path):
    """--release agreed: the native's answer leaves only once the analysis gave the same one.
    The ASan-built service dies on the planted overflow; the native answers it, but that
    answer never reaches the client (what the client receives is the capture)."""
    sh = ShadowRun(tmp_path / "native.tdm", analyses("asan-userland"),
                   ShadowOptions(release="agreed", record_analyses=False), workdir=tmp_path / "an")
    sh.start()
    got = {}

    def work():
        with KV(sh.port) as kv:
            got["set"], got["get"] = kv.request("SET a 1"), kv.request("GET a")
        try:
            with KV(sh.port, timeout=8) as kv:
                got["bug"] = kv.request(PLANTED_BUGS["asan-heap-overflow"][0])
        except TimeoutError:
            got["bug"] = None                   # nothing came back: the gate held the answer
    t = drive(sh, work)
    run_until_native_stops(sh, client=t)
    t.join(10)
    s = sh.finish()
    assert got == {"set": "OK", "get": "VALUE 1", "bug": None}, got
    # Private: the live workdir 0700, all it holds 0600 (not 0755/0644, as umask 022 gives).
    an = tmp_path / "an"
    wrote = {p.name: stat.S_IMODE(p.stat().st_mode) for p in an.iterdir()}
    assert {"findings.jsonl", "summary.json", "gate.json", "buffers.json"} <= set(wrote), wrote
    assert (stat.S_IMODE(an.stat().st_mode), set(wrote.values())) == (0o700, {0o600}), wrote
    (e,) = [e for e in sh.gate.events if e.kind == "dropped"]
    assert e.analysis == "asan-userland" and e.native == f"{PLANTED_BUGS['asan-heap-overflow'][2]}\n".encode()
    assert any("held and dropped" in x for x in s.limits)
    assert replay(tmp_path / "native.tdm").ok    # holding frames never touches the guest


def test_overflow_block_holds_the_native_until_the_analysis_has_room(tmp_path):
    """--overflow block: a slow analysis with a small buffer is never detached; the native's
    inputs wait at the host side of its NIC instead, and its recording still replays."""
    bound = 20
    # The native on tandem's own kernel, which lockdep's is that kernel's config and more:
    # lockdep is then the slower of the two for the same inputs (Debian's kernel, the
    # default, does more per request than tandem's small one, and can be the slower).
    sh = ShadowRun(tmp_path / "native.tdm", analyses("lockdep"),
                   ShadowOptions(buffer_events_of={"lockdep": bound}, record_analyses=False, overflow="block",
                                 block_budget_s=120),
                   workdir=tmp_path / "an", guest=Guest.default("native"))
    sh.start()
    answers, times = [], []

    def work():
        # Paced: the hold is decided from the device log, which QEMU flushes every
        # 100 ms; what the native serves in that time is over the bound anyway.
        with KV(sh.port) as kv:
            for i in range(150):
                answers.append(kv.request(f"SET k{i} v{i}"))
                times.append(time.monotonic())
                pace(0.01)
    t = drive(sh, work)
    run_until_native_stops(sh, client=t)
    t.join(10)
    s = sh.finish()
    assert answers == ["OK"] * 150
    (r,) = s.results
    buf = sh.followers[0].buffer
    assert r.run.outcome in ("poweroff", "finished"), r.run.detail
    assert buf.blocks >= 1 and buf.blocked_s > 0, (buf.blocks, buf.blocked_s)
    # The client saw the native held: an answer waited through a hold, at least half as long
    # as the average hold the buffer measured (not a fixed time: under load the holds are
    # shorter and more; a CI run at load saw its longest wait 0.16 s).
    gap = max(b - a for a, b in itertools.pairwise(times))
    assert gap > 0.5 * buf.blocked_s / buf.blocks, (gap, buf.blocked_s, buf.blocks)
    # Inputs already in the device log when the hold began count too, so the peak passes
    # the bound by what the native made before the hold took effect: a latency, not a
    # count (41 over it in a run at load average 7, 3 at rest). What the hold must show
    # is that the buffer did not take the run: under half of its 150 requests.
    assert bound < buf.peak_events < 150 // 2, buf.peak_events
    assert sh.gate.holds >= 1         # QEMU was told to hold the native's inputs
    assert not r.divergences, r.divergences[:3]
    assert json.loads((tmp_path / "an" / "buffers.json").read_text())["lockdep"]["blocks"] == buf.blocks
    # tandem plan --from a live run: F from CPU time (wall times are all the native's here);
    # lockdep costs more than the native kernel for the same inputs.
    (sd,) = plan.slowdowns_from(tmp_path / "an", {}, "lockdep")
    assert sd.f > 1.0 and sd.base.startswith("live run"), (sd.f, sd.base)
    v = replay(tmp_path / "native.tdm")
    assert v.ok, v.summary()


def test_a_long_run_keeps_only_what_is_in_flight(tmp_path):
    """What the analysis has taken and compared is dropped while the native runs (the
    native's inputs, output and closed connections; the analysis's console and output);
    a difference found on the way is still reported, and the bundle stays whole."""
    sh = ShadowRun(tmp_path / "native.tdm", analyses("native"), workdir=tmp_path / "an")
    sh.start()
    seen = {}

    def work():
        for c in range(12):                 # 12 connections, each closed after its requests
            with KV(sh.port) as kv:
                for i in range(20):
                    kv.request(f"SET k{c}x{i} {'v' * 32}")
        def caught_up() -> bool:            # the analysis has taken and compared them
            f = sh.followers[0]
            retired = sum(fl is None for fl in sh.rec.flows)
            return bool(f.run) and len(f.cmp.done) + retired >= 12 and retired >= 10
        wait_until(caught_up, 60, lambda: f"the analysis to compare 12 closed connections "
                                          f"({len(sh.followers[0].cmp.done)} compared)", poll=0.2)
        seen.update(retired=sum(fl is None for fl in sh.rec.flows), flows=len(sh.rec.flows),
                    kept=len(sh.rec.inputs), dropped=sh.rec.inputs_dropped,
                    console=len(sh.followers[0].run.console), peer=len(sh.followers[0].run.net.flows))
    t = drive(sh, work)
    run_until_native_stops(sh, client=t)
    t.join(10)
    s = sh.finish()
    assert seen["flows"] == 12 and seen["retired"] >= 10, seen       # closed connections forgotten
    assert seen["dropped"] >= 12 * 20 and seen["kept"] < 50, seen   # inputs taken by the analysis
    assert seen["peer"] <= 2 and seen["console"] < 2000, seen
    (r,) = s.results
    assert r.run.outcome == "poweroff" and not r.divergences, [d.diff for d in r.divergences]
    assert r.run.n_delivered >= 12 * 21
    rec = inputs.load(tmp_path / "native.tdm")                      # the recording is whole
    assert len(rec.flows) == 12 and sum(i.kind == "tcp-data" for i in rec.inputs) >= 12 * 20


def _qemus_of(path: Path) -> list[int]:
    """QEMU processes whose command line names a path under `path`."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and b"qemu-system" in cmd[0] and any(str(path).encode() in a for a in cmd):
            out.append(int(pid))
    return out


def test_tandem_dying_leaves_the_native_serving_and_its_recording_readable(tmp_path):
    """`tandem shadow` killed (SIGKILL) mid-run: its native QEMU, in a session of its own,
    goes on serving and recording, and the bundle, never sealed, replays exactly."""
    port, b = free_port(), tmp_path / "native.tdm"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "replay"))
    tandem = subprocess.Popen([sys.executable, "-m", "tandem", "shadow", str(b), "--analysis", "native",
                               "--port", str(port), "--workdir", str(tmp_path / "an"), "--no-record"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                              start_new_session=True)
    try:
        wait_for_service(port, tandem)
        with KV(port) as kv:
            assert [kv.request(f"SET before{i} {i}") for i in range(20)] == ["OK"] * 20
        native = _qemus_of(b)
        assert len(native) == 1, native
        tandem.kill()
        tandem.wait(10)
        with KV(port) as kv:       # the native, without tandem
            assert [kv.request(f"SET after{i} {i}") for i in range(20)] == ["OK"] * 20
            assert kv.request("GET before3") == "VALUE 3"
        # Stopped as an operator would once tandem is gone: a poweroff on its console (its
        # serial socket is still there). Not SIGTERM: a host-side stop as a frame arrives
        # can leave that frame out of the replay log (docs/libvirt.md).
        cmd = Path(f"/proc/{native[0]}/cmdline").read_bytes().decode().split("\0")
        sock = next(a for a in cmd if "id=serial0" in a).split("path=")[1].split(",")[0]
        Serial(Path(sock)).type("poweroff")
        wait_until(lambda: not _qemus_of(b), 60, "the native to power off", poll=0.2)
    finally:
        tandem.kill()
        for pid in _qemus_of(tmp_path):         # the native and the analysis, whatever happened
            os.kill(pid, signal.SIGKILL)
    assert bundle.load_manifest(b).state == "recording"     # nobody sealed it
    v = replay(b, partial=True)
    assert v.ok, v.summary()
    # ... and that recording has what the native served after tandem died.
    assert any(b"SET after19" in e.data for e in pcapng.iter_events(b / bundle.DEVLOG) if e.direction == "in")
