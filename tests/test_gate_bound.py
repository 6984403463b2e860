"""QEMU's release gate is bounded: a guest that sends fast while the only
analysis is stopped cannot grow the native's QEMU past filter-gate's max-frames and
max-bytes; the overflow policy's event is reported; the recording keeps every frame.
Real QEMU, real guest; no mocks."""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from helpers import analyses, wait_until
from helpers.live import drive, run_until_native_stops
from tandem import artifacts
from tandem.semantic import inputs
from tandem.exact.replay import replay
from tandem.live.shadow import ShadowOptions, ShadowRun

MAX_FRAMES, MAX_BYTES = 64, 128 * 1024     # small (max-bytes is at least one 68 KiB frame): the flood passes them many times over
CONNECTIONS, GETS, VALUE = 100, 20, "x" * 3000
SLACK = 64 << 20        # RSS: the guest's own pages the flood touches count too (QEMU holds guest RAM)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def flood(port: int, connections: int) -> list[socket.socket]:
    """`connections` clients, each sending its SET and GETs in one write without reading:
    the guest answers each with a 3 KB value as fast as its TCP lets it (held without a
    bound, the same flood held 1973 frames, 2.5 MB: measured)."""
    socks = []
    for c in range(connections):
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        s.sendall(f"SET k{c} {VALUE}\n".encode() + f"GET k{c}\n".encode() * GETS)
        socks.append(s)
    return socks


def read_answers(socks: list[socket.socket], got: dict, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    for c, s in enumerate(socks):
        data, want = b"", len(expected_reply())
        while len(data) < want and time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                continue                    # the deadline decides (the assertion says who)
            if not chunk:
                break
            data += chunk
        got[c] = data
        s.close()


def _readable(s: socket.socket) -> bool:
    return bool(select.select([s], [], [], 0)[0])


def expected_reply() -> bytes:
    return b"OK\n" + f"VALUE {VALUE}\n".encode() * GETS


COUNTERS = ("held-peak-frames", "held-peak-bytes", "overflows", "overflow-frames", "detached", "send-peak-bytes")


def flood_with_the_analysis_stopped(tmp_path, overflow: str, connections: int):
    """The flood, with the only analysis SIGSTOPped for the flood (under block, until the
    gate has refused frames at its bound); QEMU's counters sampled meanwhile (QMP from the
    main thread, which owns it)."""
    sh = ShadowRun(tmp_path / "native.tdm", analyses("native"),
                   ShadowOptions(release="agreed", overflow=overflow, record_analyses=False, hang_wall_s=600,
                                 block_budget_s=600),
                   workdir=tmp_path / "an")
    sh.start()
    qmp, pid = sh.native.vm.qmp, sh.native.vm.proc.pid

    def gate(prop):
        return qmp.command("qom-get", path="/objects/gate0", property=prop)
    assert gate("overflow") == overflow          # the host's overflow policy
    for prop, value in (("max-frames", MAX_FRAMES), ("max-bytes", MAX_BYTES)):
        qmp.command("qom-set", path="/objects/gate0", property=prop, value=value)
    got, seen = {}, {"frames": 0, "bytes": 0, "rss": 0}
    read = threading.Event()

    def work():
        wait_until(lambda: sh.followers[0].run is not None and sh.followers[0].run.qemu_pid is not None,
                   120, "the analysis to start")
        analysis = sh.followers[0].run.qemu_pid
        os.kill(analysis, signal.SIGSTOP)        # the only analysis stops: nothing can agree
        try:
            seen["rss_before"] = rss_bytes(pid)
            socks = flood(sh.port, connections)
            if overflow == "detach":             # the gate lets go: answers come while stopped
                read_answers(socks, got, 90)
            if overflow == "block":              # nothing has left unagreed meanwhile
                wait_until(lambda: seen.get("refused", 0) >= 1, 120, "the gate to refuse a frame at its bound")
                seen["leaked"] = sum(len(x.recv(1 << 20, socket.MSG_DONTWAIT | socket.MSG_PEEK))
                                     for x in socks if _readable(x))
            seen["want"] = True
            assert read.wait(60), "the main thread did not read QEMU's counters"
        finally:
            os.kill(analysis, signal.SIGCONT)
        if overflow == "block":                  # agreed once the analysis runs again
            # The refused frames come again at the guest's TCP retransmission times,
            # backed off while the analysis was stopped (up to tens of seconds).
            read_answers(socks, got, 240)

    def each():
        if "rss_before" in seen and "counters" not in seen:
            seen["frames"] = max(seen["frames"], gate("held-frames"))
            seen["bytes"] = max(seen["bytes"], gate("held-bytes"))
            seen["rss"] = max(seen["rss"], rss_bytes(pid))
            seen["refused"] = gate("overflow-frames")
        if seen.get("want") and "counters" not in seen:
            seen["counters"] = {p: gate(p) for p in COUNTERS}
            read.set()
    t = drive(sh, work)
    run_until_native_stops(sh, each, timeout=600)
    t.join(10)
    s = sh.finish()
    print(f"gate bound ({overflow}):", json.dumps(seen))
    return sh, s, seen, got


def check_bounded_and_whole(tmp_path, sh, s, seen, got, overflow: str, connections: int) -> None:
    c = seen["counters"]
    assert c["held-peak-frames"] <= MAX_FRAMES and c["held-peak-bytes"] <= MAX_BYTES, c
    assert seen["frames"] <= MAX_FRAMES and seen["bytes"] <= MAX_BYTES, seen
    assert c["overflows"] >= 1 and c["detached"] is (overflow == "detach"), c
    assert seen["rss"] - seen["rss_before"] <= 2 * MAX_BYTES + SLACK, seen
    # Every client got every answer: through the open gate (detach), or agreed once the
    # analysis ran again, the refused frames sent again by the guest's TCP (block).
    assert all(got[i] == expected_reply() for i in range(connections)), \
        sorted(i for i in range(connections) if got[i] != expected_reply())[:5]
    # The policy's event is reported as the run's limit (not a finding about the guest).
    events = [e for e in sh.gate.events if e.kind == "overflow"]
    assert events and all(e.qemu["policy"] == overflow and e.qemu["direction"] == "outputs" for e in events)
    assert (events[0].qemu["max_frames"], events[0].qemu["max_bytes"]) == (MAX_FRAMES, MAX_BYTES)
    assert any(x.startswith("gate: QEMU held the native's outputs up to its bound") for x in s.limits), s.limits
    gj = json.loads((tmp_path / "an" / "gate.json").read_text())
    assert gj["overflows"] == len(events) and gj["detached"] is (overflow == "detach"), gj
    # QEMU's own counters, sent as it shut down: at least the peaks qom-get read while the
    # flood ran (it may have held more after the last read), and still within the bound.
    q = gj["qemu"]
    assert c["held-peak-frames"] <= q["held_peak_frames"] <= MAX_FRAMES, (q, c)
    assert c["held-peak-bytes"] <= q["held_peak_bytes"] <= MAX_BYTES, (q, c)
    # Every overflow was told (under block, one more each time the gate filled again
    # after it drained to 3/4, as the analysis ran and the guest resent refused frames).
    assert q["overflows"] == len(events) >= c["overflows"] and q["overflow_frames"] >= c["overflow-frames"], (q, c)
    assert sum(x.startswith("gate: QEMU held") for x in s.limits) == 1, s.limits      # said once
    (r,) = s.results
    assert not r.findings, [f.type for f in r.findings]
    # Nothing recorded is lost: the device log holds every byte the guest sent on every
    # connection (held, released, refused or not), and the bundle replays exactly.
    rec = inputs.load(tmp_path / "native.tdm")
    assert len(rec.flows) == connections
    assert all(b"".join(d for _, d in fl.guest_data) == expected_reply() for fl in rec.flows)
    v = replay(tmp_path / "native.tdm")
    assert v.ok, v.summary()


def test_a_flood_while_the_analysis_is_stopped_stays_under_qemus_bound(tmp_path):
    """--overflow detach (the default): at the bound the gate lets go, once."""
    sh, s, seen, got = flood_with_the_analysis_stopped(tmp_path, "detach", CONNECTIONS)
    check_bounded_and_whole(tmp_path, sh, s, seen, got, "detach", CONNECTIONS)
    assert seen["counters"]["overflows"] == 1


def test_overflow_block_refuses_frames_at_the_bound_and_leaks_nothing(tmp_path):
    """--overflow block: at the bound the gate refuses the guest's frames (its TCP sends
    them again), nothing leaves unagreed, and once the analysis runs all is answered."""
    # Fewer clients than for detach (still some 5 times the frame bound): each refused
    # frame waits for the guest's backed-off retransmission once the analysis runs.
    sh, s, seen, got = flood_with_the_analysis_stopped(tmp_path, "block", 40)
    check_bounded_and_whole(tmp_path, sh, s, seen, got, "block", 40)
    assert seen["counters"]["overflow-frames"] >= 1 and seen["leaked"] == 0, seen
    assert sh.gate.released and not sh.gate.dropped


def test_filter_gate_and_feed_bounds_default_and_refuse_nonsense(tmp_path):
    """The gate's and the feed's bounds: their defaults (qom-get on a bare QEMU), and a
    zero or too small bound or an unknown policy refused with QEMU's one-line error."""
    q = artifacts.qemu()
    sock = tmp_path / "gate.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(sock))
    listener.listen(8)
    base = [q["binary"], "-M", "none", "-nodefaults", "-display", "none", "-L", q["firmware_dir"],
            "-netdev", "user,id=n0", "-chardev", f"socket,id=c0,path={sock}"]
    gate = "filter-gate,id=g0,netdev=n0,chardev=c0"
    p = subprocess.Popen(base + ["-object", gate, "-qmp", "stdio"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        cmds = [{"execute": "qmp_capabilities"}] + [
            {"execute": "qom-get", "arguments": {"path": "/objects/g0", "property": prop}}
            for prop in ("max-frames", "max-bytes", "overflow", "held-frames", "overflows", "detached")]
        out, err = p.communicate("".join(json.dumps(c) + "\n" for c in cmds)
                                 + json.dumps({"execute": "quit"}) + "\n", timeout=60)
        answers = [json.loads(x)["return"] for x in out.splitlines() if '"return"' in x][1:7]
        assert answers == [16384, 16 << 20, "block", 0, 0, False], (answers, err)
        feed = base + ["-object", "feed,id=f0,chardev=c0", "-qmp", "stdio"]
        cmds = [{"execute": "qmp_capabilities"}] + [
            {"execute": "qom-get", "arguments": {"path": "/objects/f0", "property": prop}}
            for prop in ("send-max-bytes", "send-queued-bytes", "send-peak-bytes", "output-holds")]
        out = subprocess.run(feed, input="".join(json.dumps(c) + "\n" for c in cmds + [{"execute": "quit"}]),
                             capture_output=True, text=True, timeout=60).stdout
        answers = [json.loads(x)["return"] for x in out.splitlines() if '"return"' in x][1:5]
        assert answers == [16 << 20, 0, 0, 0], out
        r = subprocess.run(base + ["-object", "feed,id=f0,chardev=c0,send-max-bytes=1000"], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode != 0 and "send-max-bytes must be at least 1048592 (one message)" in r.stderr, r.stderr
        for bad, says in ((",max-frames=0", "max-frames must be at least 1"),
                          (",max-bytes=1500", "max-bytes must be at least 69632 (the largest frame)"),
                          (",overflow=drop", "overflow 'drop': not detach or block")):
            r = subprocess.run(base + ["-object", gate + bad], capture_output=True, text=True, timeout=60)
            assert r.returncode != 0 and says in r.stderr, r.stderr
    finally:
        if p.poll() is None:
            p.kill()
        listener.close()
