"""The device log is standard pcapng: Wireshark's tools read it to the end, whatever the
guest writes, and count the same records as tandem; tandem's dissector decodes it."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from helpers import start_client, wait_until, wireshark_counts
from tandem.formats import bundle, pcapng
from tandem.record.recording import Recording
from tandem.exact.replay import replay
from tandem.record.workload import KV


@pytest.fixture(scope="module")
def tshark():
    path = shutil.which("tshark")
    if path is None:  # installed by scripts/host-deps.sh; its absence is a setup bug
        pytest.fail("tshark not installed (scripts/host-deps.sh installs it)")
    return path


def hammer(port: int, client: int, stop: threading.Event, counts: list[int]) -> None:
    """One client's SET/GET loop until `stop` (bounded: 2,000 requests at most)."""
    with KV(port) as kv:
        for i in range(1000):
            if stop.is_set():
                return
            assert kv.request(f"SET c{client}k{i % 50} {'v' * 64}{i}") == "OK"
            assert kv.request(f"GET c{client}k{i % 50}").endswith(str(i))
            counts[client] += 2


@pytest.fixture(scope="module")
def heavy_bundle(built, tmp_path_factory) -> Path:
    """Four clients hammering SET/GET while the guest writes 8 MiB to its disk with
    O_DIRECT: block writes of several MiB, each far over Wireshark's 256 KiB cap."""
    path = tmp_path_factory.mktemp("heavy") / "heavy.tdm"
    with Recording(path) as rec:
        rec.wait_ready()
        stop, counts = threading.Event(), [0] * 4
        clients = [start_client(lambda c=c: hammer(rec.port, c, stop, counts), f"client {c}") for c in range(4)]
        mark = len(rec.serial.output())
        rec.serial.type("run dd if=/dev/urandom of=/data/big bs=8M count=1 oflag=direct")
        rec.serial.wait_for(b"tandem-agent: run status 0", 120, mark)
        after_dd = sum(counts)          # the clients go on a while after the write
        wait_until(lambda: sum(counts) >= after_dd + 200 or not any(t.is_alive() for t in clients), 60,
                   "200 more requests after the write")
        stop.set()
        for t in clients:
            t.join(60)
        assert sum(counts) > 100, counts
        rec.serial.type("poweroff")
        rec.wait(timeout=120)
    return path


def test_multi_mib_writes_read_to_the_end_and_replay(heavy_bundle):
    log = pcapng.read_devlog(heavy_bundle / bundle.DEVLOG)
    writes = [pcapng.block_record(e.data) for e in log.events if e.channel == "disk0"]
    big = [n for op, _, n, _ in writes if op == 1 and n > pcapng.SNAPLEN]
    assert big and sum(big) >= 8 << 20 and max(big) >= 1 << 20, sorted(big)[-5:]
    assert log.format == pcapng.FORMAT and log.closed_cleanly
    assert wireshark_counts(heavy_bundle / bundle.DEVLOG) == (sum(log.records),) * 2
    assert sum(log.records) > len(log.events)       # the long writes took several records
    v = replay(heavy_bundle)
    assert v.ok, v.summary()


def test_tshark_reads_devlog_and_counts_match(demo_bundle, tshark):
    m = bundle.load_manifest(demo_bundle)
    want = sum(pcapng.read_devlog(demo_bundle / bundle.DEVLOG).records)
    r = subprocess.run([tshark, "-r", str(demo_bundle / bundle.DEVLOG), "-T", "fields",
                        "-e", "frame.interface_name", "-e", "frame.len"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [l.split("\t") for l in r.stdout.splitlines() if l]
    assert len(rows) == want == sum(c.records for c in m.channels.values())
    names = {row[0] for row in rows}
    assert {"net0", "serial0", "disk0", "rng0", "cpus"} <= names


def test_tshark_decodes_guest_tcp(demo_bundle, tshark):
    r = subprocess.run([tshark, "-r", str(demo_bundle / bundle.DEVLOG), "-Y", "tcp.port == 7000",
                        "-T", "fields", "-e", "tcp.payload"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    payload = bytes.fromhex("".join(l.replace(":", "") for l in r.stdout.split()))
    assert b"SET key1 " in payload and b"OK\n" in payload


# --- the dissector (replay/tandem/wireshark/tandem.lua) on real recordings -------------

FIELDS = ["tandem.channel", "tandem.kind", "tandem.direction", "tandem.vm_ns", "tandem.icount",
          "tandem.continued", "tandem.block.op", "tandem.block.offset", "tandem.block.length",
          "tandem.serial.length", "tandem.rng.length", "frame.len"]


def dissect(tshark: str, path: Path, fields: list[str], display_filter: str | None = None) -> list[list[str]]:
    from tandem import wireshark
    args = [tshark, "-X", f"lua_script:{wireshark.DISSECTOR}", "-r", str(path), "-T", "fields",
            "-E", "occurrence=f", *[a for f in fields for a in ("-e", f)]]
    r = subprocess.run(args + (["-Y", display_filter] if display_filter else []),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "Lua: Error" not in r.stderr, r.stderr
    return [line.split("\t") for line in r.stdout.splitlines()]


def dissected_events(rows: list[list[str]]) -> list[tuple]:
    """The dissector's records joined by their continuation mark, as tandem's events."""
    events, cur = [], None
    for ch, kind, d, vm, ic, cont, op, off, n, serial_n, rng_n, frame_len in rows:
        if cur is None:
            cur = [ch, kind, d, int(vm), int(ic) if ic else None, int(op) if op else None,
                   int(off, 16) if off else None, 0]
        cur[7] += int(n or serial_n or rng_n or (frame_len if kind == "net" else 0) or 0)
        if cont not in ("1", "True"):
            events.append(tuple(cur))
            cur = None
    assert cur is None, "the last record is marked continued"
    return events


def tandem_events(log: pcapng.Devlog) -> list[tuple]:
    out = []
    for e in log.events:
        op = off = None
        n = len(e.data)
        if e.kind == "block":
            op, off, n, _ = pcapng.block_record(e.data)
        out.append((e.channel, e.kind, e.direction, e.vm_ns, None if e.kind == "net" else e.icount, op, off, n))
    return out


@pytest.mark.parametrize("which", ["demo", "heavy"])
def test_dissector_fields_match_tandems_reader(which, demo_bundle, heavy_bundle, tshark):
    """Every record's channel, kind, direction, VM time, instruction count, block op,
    offset and length, as `tshark -T fields` gives them, are tandem's own."""
    path = (demo_bundle if which == "demo" else heavy_bundle) / bundle.DEVLOG
    log = pcapng.read_devlog(path)
    rows = dissect(tshark, path, FIELDS)
    assert len(rows) == sum(log.records)
    assert dissected_events([r for r in rows if r[1] != "state"]) == tandem_events(log)
    states = [(r[0], int(r[3]), int(r[4])) for r in rows if r[1] == "state"]
    assert states and states == [(s.channel, s.vm_ns, s.icount) for s in log.states]


def test_dissector_filters_block_offsets(heavy_bundle, tshark):
    path = heavy_bundle / bundle.DEVLOG
    rows = dissect(tshark, path, FIELDS)
    want = [r for r in rows if r[1] == "block" and int(r[7], 16) > 0x100000]
    got = dissect(tshark, path, FIELDS, "tandem.block.offset > 0x100000")
    assert got == want and len(want) > 100     # 8 MiB in 64 KiB records


def test_dissector_installs_where_wireshark_loads_it(tmp_path, demo_bundle, tshark):
    """`tandem wireshark install` into a fresh HOME: tshark there loads it unasked."""
    from helpers import ROOT
    env = dict(os.environ, HOME=str(tmp_path), PYTHONPATH=str(ROOT / "replay"))
    r = subprocess.run([sys.executable, "-m", "tandem", "wireshark", "install"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / ".local/lib/wireshark/plugins/tandem.lua").is_file()
    r = subprocess.run([tshark, "-r", str(demo_bundle / bundle.DEVLOG), "-Y", 'tandem.kind == "serial"',
                        "-T", "fields", "-e", "tandem.serial.text"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "serial says hi" in r.stdout
