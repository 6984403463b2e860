"""Record the demo guest under real client traffic and replay it exactly."""
from __future__ import annotations

import os
import signal
import socket
import threading

import pytest
from helpers import run_cli, start_client, unsent_bytes, wait_until

from tandem import catalog
from tandem.errors import TandemError
from tandem.formats import bundle, pcapng
from tandem.machine import Guest
from tandem.record.recording import Recording
from tandem.exact.replay import replay
from tandem.record.workload import KV, Hammer, demo_traffic


def test_recording_captures_every_channel(demo_bundle):
    m = bundle.load_manifest(demo_bundle)
    assert m.state == "complete" and m.stop.reason == "poweroff"
    ch = m.channels
    assert ch["net0"].inbound.events > 0 and ch["net0"].outbound.events > 0
    assert ch["serial0"].outbound.bytes > 0 and ch["serial0"].inbound.bytes > 0   # typed lines
    assert ch["disk0"].outbound.events > 0                                        # writes + flushes
    assert ch["rng0"].inbound.bytes > 0
    typed = b"".join(e.data for e in pcapng.read_devlog(demo_bundle / bundle.DEVLOG).events
                     if e.channel == "serial0" and e.direction == "in")
    assert b"echo serial says hi" in typed


def test_exact_replay_verifies(demo_bundle):
    v = replay(demo_bundle)
    assert v.ok, v.summary()
    rec = pcapng.read_devlog(demo_bundle / bundle.DEVLOG)
    assert v.events == len(rec.events)
    assert v.replayed_end == v.recorded_end


def test_replay_cli_prints_verdict(demo_bundle):
    r = run_cli("replay", str(demo_bundle))
    assert r.returncode == 0, r.stderr
    assert "VERIFIED" in r.stderr


def test_interleaving_of_sources_is_reproduced(tmp_path):
    """One request makes the guest write disk, flush, print on serial and answer on the
    network; the replay must produce the same sequence at the same VM times. The
    recording leaves no thread of its console behind (close() wakes its accept())."""
    path = tmp_path / "mix.tdm"
    before = set(threading.enumerate())
    with Recording(path) as rec:
        rec.wait_ready()
        with KV(rec.port) as kv:
            for i in range(5):
                assert kv.request(f"SET mix{i} {i}") == "OK"
                assert kv.request("SYNC") == "OK"      # kvd logs "kvd: sync" on the console
        rec.serial.type("poweroff")
        rec.wait(timeout=120)
    wait_until(lambda: not [t for t in set(threading.enumerate()) - before if t.name.startswith("console-")],
               10, "the console's threads to end")
    log = pcapng.read_devlog(path / bundle.DEVLOG)
    kinds = [(e.channel, e.direction) for e in log.events]
    flushes = [i for i, e in enumerate(log.events)
               if e.channel == "disk0" and pcapng.block_record(e.data)[0] == 2]
    assert flushes and ("serial0", "out") in kinds and ("net0", "out") in kinds
    assert all(a.vm_ns <= b.vm_ns for a, b in zip(log.events, log.events[1:]))
    v = replay(path)
    assert v.ok, v.summary()


def test_a_guest_on_two_vcpus_is_replayed_exactly(built, tmp_path):
    """Exact mode with 2 vCPUs (qemu-patches/0038: the turns of QEMU's round-robin TCG
    logged and replayed in the same order): the demo guest on Debian's SMP kernel, both
    vCPUs writing its console, under the clients' traffic, is replayed byte for byte, at
    the same instruction counts, each event from the vCPU that made it and every state
    checkpoint (both vCPUs' registers) the same."""
    guest = Guest.default(catalog.DEFAULT_KERNEL)
    guest.vcpus = 2
    path = tmp_path / "smp2.tdm"
    with Recording(path, guest=guest) as rec:
        rec.wait_ready()
        demo_traffic(rec.port, rounds=5)
        rec.serial.type("echo serial says hi")
        rec.serial.wait_for(b"serial says hi", 60)
        rec.serial.type("poweroff")
        rec.wait(timeout=180)
    m = bundle.load_manifest(path)
    assert (m.state, m.machine.mode, m.machine.smp) == ("complete", None, 2), m.machine   # None: exact
    log = pcapng.read_devlog(path / bundle.DEVLOG)
    assert {e.vcpu for e in log.events if e.channel == "serial0" and e.direction == "out"} == {0, 1}
    assert log.states, "no state checkpoint to compare"
    v = replay(path)
    assert v.ok, v.summary()
    assert v.events == len(log.events) and v.replayed_end == v.recorded_end


def test_acpi_power_button_is_replayed(built, tmp_path):
    """The ACPI power button (QMP system_powerdown, how a recording of an ordinary VM ends)
    is pressed from outside the VM: its SCI reaches the guest when the host's main loop
    gets to it. The recording logs where the press took effect and the replay presses it
    there (qemu-patches/0003); before, the replay waited forever for the SCI's interrupt
    ('replay hung'). The demo guest powers off on it (acpid, then its agent)."""
    path = tmp_path / "button.tdm"
    with Recording(path) as rec:
        rec.wait_ready()
        with KV(rec.port) as kv:
            assert kv.request("SET before 1") == "OK"
        rec.powerdown()
        rec.wait(timeout=120)
    assert rec.stop_reason == "poweroff"
    assert b"tandem-agent: power button" in rec.serial.output()
    v = replay(path)
    assert v.ok, v.summary()


def test_follow_replay_of_live_recording(built, tmp_path):
    path = tmp_path / "live.tdm"
    rec = Recording(path).start()
    try:
        rec.wait_ready()
        t = start_client(lambda: replay(path, follow=True), "follow replay")
        with KV(rec.port) as kv:
            for i in range(10):
                assert kv.request(f"SET live{i} {i}") == "OK"
            assert kv.request("SYNC") == "OK"
        rec.serial.type("poweroff")
        rec.wait(timeout=120)
    finally:
        rec.finish()
    t.join(300)
    assert t.result.ok, t.result.summary()


def test_torn_heavy_recording_replays_its_intact_prefix(built, tmp_path):
    """QEMU killed (SIGKILL) while one client hammers the guest with SETs. The
    record log's intact prefix replays and verifies against the device log, whichever of
    the two logs the kill cut first (each is flushed on its own clock)."""
    path = tmp_path / "torn.tdm"
    rec = Recording(path).start()
    try:
        rec.wait_ready()
        hammer = Hammer(rec.port)
        client = start_client(hammer.run, "hammer")
        wait_until(lambda: hammer.replies >= 8000, 300, lambda: f"8000 SETs answered ({hammer.replies} so far)")
        # Each log is flushed on its own clock (every 50 and 100 ms of host time, later on a
        # loaded machine): the kill waits for one flush of each after the 8000th reply, so
        # that both hold every event up to it (a kill at once left 15,972 of 16,000 once).
        logs = [path / bundle.DEVLOG, path / bundle.STREAM]
        sizes = [f.stat().st_size for f in logs]
        wait_until(lambda: all(f.stat().st_size > n for f, n in zip(logs, sizes)), 60,
                   "both logs flushed after the 8000th reply")
        os.kill(rec.started().process().pid, signal.SIGKILL)
    finally:
        with pytest.raises(TandemError, match="replay it with --partial"):
            rec.finish()
    client.join(60)
    assert bundle.load_manifest(path).state == "interrupted"
    r = run_cli("replay", "--partial", str(path))
    assert r.returncode == 0, r.stderr
    assert "VERIFIED: intact prefix" in r.stderr, r.stderr
    events = int(r.stderr.split("VERIFIED: intact prefix: ")[1].split()[0])
    assert events >= 2 * 8000       # a request and its reply each: the heavy part was replayed


def test_input_arriving_as_the_recording_stops_is_not_half_recorded(built, tmp_path):
    """A client's frame and a typed line reach QEMU while the VM is paused, then the host
    stops the recording. The guest never got them and the replay log does not have them, so
    the device log must not have them either: the recording still replays exactly."""
    path = tmp_path / "stop.tdm"
    with Recording(path) as rec:
        rec.wait_ready()
        rec.vm.qmp.command("stop")
        with socket.create_connection(("127.0.0.1", rec.port), timeout=5) as client:
            client.sendall(b"GET k\n")
            rec.serial.type("echo too late")
            # The client's bytes are in slirp's socket (the host acknowledged them), and
            # QEMU's main loop, which runs while the VM is paused, has been round twice
            # since (a QMP round trip each): slirp has read them and handed the frame to
            # the NIC's filters. The typed line stays in the serial socket: a paused
            # serial port takes nothing.
            wait_until(lambda: unsent_bytes(client) == 0, 30, "the host to acknowledge the client's request")
            for _ in range(2):
                rec.vm.qmp.command("query-status")
            rec.stop()
    log = pcapng.read_devlog(path / bundle.DEVLOG)
    assert not [e for e in log.events if (e.channel, e.direction) == ("serial0", "in")]
    v = replay(path)
    assert v.ok, v.summary()


def test_record_duration_in_vm_time(built, tmp_path):
    path = tmp_path / "dur.tdm"
    r = run_cli("record", str(path), "--duration", "4s")
    assert r.returncode == 0, r.stderr
    m = bundle.load_manifest(path)
    assert m.stop.reason == "duration"
    assert 4e9 <= m.stop.vm_ns < 4.5e9
    v = replay(path)
    assert v.ok, v.summary()


def test_guest_that_panics_is_not_a_clean_stop(built, tmp_path):
    """No init: the kernel panics at boot. The recording is kept, labeled for what it is,
    and replays exactly (the panic is reproducible)."""
    from tandem.machine import Guest
    g = Guest.default()
    g.cmdline += " rdinit=/nonexistent"
    path = tmp_path / "panic.tdm"
    with Recording(path, g) as rec:
        rec.wait(timeout=120)
    m = bundle.load_manifest(path)
    assert m.state == "complete" and m.stop.reason == "guest-reset"
    console = b"".join(e.data for e in pcapng.read_devlog(path / bundle.DEVLOG).events
                       if e.channel == "serial0")
    assert b"Kernel panic" in console
    v = replay(path)
    assert v.ok, v.summary()


def test_bundle_path_with_commas_and_keys(built, tmp_path):
    """A bundle named with QEMU's separators in it: its path reaches -icount
    rrfile=, -drive file= and the devlog's path= as one value, never as added keys, so
    the recording lands where it was asked and replays exactly."""
    path = tmp_path / "a,romfile=x,,y=z.tdm"
    r = run_cli("record", str(path), "--duration", "2s")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in path.iterdir()) == sorted(
        [bundle.MANIFEST, bundle.STREAM, bundle.DEVLOG, "disk-overlay.qcow2", "qemu.log"])
    assert bundle.load_manifest(path).state == "complete"
    v = replay(path)
    assert v.ok, v.summary()


def test_replay_reads_the_stream_it_checked(demo_bundle, monkeypatch):
    """QEMU gets the replay stream as a file tandem opened (bundle.open_member, no link
    followed), never by the bundle's path: a link planted after the check is not read."""
    from tandem.qemu.vm import VM
    argvs, real_start = [], VM.start
    monkeypatch.setattr(VM, "start", lambda vm, *a, **k: (argvs.append(vm.argv), real_start(vm, *a, **k))[1])
    v = replay(demo_bundle)
    assert v.ok, v.summary()
    (argv,) = argvs
    icount = argv[argv.index("-icount") + 1]
    assert "rrfile=/dev/fd/" in icount and str(demo_bundle) not in " ".join(argv), icount
