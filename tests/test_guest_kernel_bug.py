"""A bug in the guest's own kernel, reached by an ordinary client: the
reference VM built once more with tandem's native kernel as its distribution kernel
(a Debian package, booted by its own GRUB) and the planted-bug module listening on UDP.
A crafted datagram reaches the bug; the native serves on; the KASAN analysis, booting
the same disk with its own build of the module written over the native's, reports it,
attributed to that datagram, offline and live."""
from __future__ import annotations

import json
import shutil
import socket
import time

import pytest
from helpers import analyses, start_client, wait_until
from helpers.live import run_until_native_stops, summary_text
from tandem import artifacts
from tandem.explain.explain import explain, load_finding
from tandem.live.shadow import ShadowOptions, ShadowRun
from tandem.machine import Forward, Guest
from tandem.qemu.vm import free_port
from tandem.record import clients
from tandem.record.recording import Recording
from tandem.semantic.analyze import analyze

CRAFTED = b"oob " + b"n" * 52       # tandem_bugs' note of 52 bytes: one byte past its slot
STALE = b"uaf"                      # a session read through its stale cached pointer, after its free
STALE_TITLE = "KASAN: slab-use-after-free Read in tb_session_account"
FILE = "/64k.bin"


def send_datagram(port: int, payload: bytes) -> bytes:
    """One datagram to the guest's forwarded UDP port, and its answer."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(60)
        s.sendto(payload, ("127.0.0.1", port))
        return s.recv(64)


def serves(http: int, ref) -> None:
    """nginx on the native answers with the right bytes."""
    clients.fetch_files(http, {f["path"]: f["sha256"] for f in ref["site"] if f["path"] == FILE})


def guest_and_forwards(tmp_path):
    ref = artifacts.refvm_tandem()
    base = tmp_path / "refvm-tandem.qcow2"
    shutil.copyfile(ref["disk"], base)
    http, udp = free_port(), free_port()
    forwards = (Forward("tcp", http, 80), Forward("udp", udp, ref["udp_port"]))
    return ref, Guest.of_disks([(str(base), "qcow2")]), forwards, http, udp


def the_bug(findings) -> list:
    return [f for f in findings if "slab-out-of-bounds" in f.title and "tb_note_store" in f.title]


@pytest.fixture(scope="module")
def datagram_recording(built, tmp_path_factory):
    """The VM from power-on: a file fetched, the crafted datagram, the file again (the
    native serves on), powered off by its button."""
    tmp = tmp_path_factory.mktemp("kbug")
    ref, guest, forwards, http, udp = guest_and_forwards(tmp)
    tdm = tmp / "kbug.tdm"
    with Recording(tdm, guest, forwards=forwards) as rec:
        wait_until(lambda: rec.running() and clients.http_up(http), 600, "nginx on the reference VM", poll=1.0)
        serves(http, ref)
        assert send_datagram(udp, CRAFTED) == b"OK\n"
        serves(http, ref)
        assert send_datagram(udp, STALE) == b"OK\n"
        rec.powerdown()
        rec.wait(timeout=300)
    return tdm


@pytest.fixture(scope="module")
def kasan_analysis(datagram_recording, tmp_path_factory):
    """The KASAN analysis of the recording: (its summary, its workdir)."""
    workdir = tmp_path_factory.mktemp("kbug-kasan")
    return analyze(datagram_recording, analyses("kasan"), noise=False, workdir=workdir, record=False), workdir


@pytest.mark.timeout(1500)
def test_kasan_finds_the_bug_a_datagram_reached_in_the_guests_own_kernel(kasan_analysis):
    s, _ = kasan_analysis
    (r,) = s.results
    assert r.run.outcome in ("poweroff", "finished"), (r.run.outcome, r.run.detail, r.run.qemu_log[-2000:])
    (bug,) = the_bug(r.findings) or [None]
    assert bug is not None, [f.title for f in r.findings]
    # Attributed to the datagram: the input delivered last before the report, or one of
    # those just before it (a KASAN kernel takes what the native took in a row).
    port = f":{artifacts.refvm_tandem()['udp_port']}, "
    assert [x for x in [bug.after_input, *bug.before] if x.startswith("frame") and port in x], \
        (bug.after_input, bug.before)
    assert {f.title for f in r.findings if f is not bug and "tb_note_store" not in f.title} == {STALE_TITLE}, \
        r.findings
    assert not r.divergences and r.complete, ([d.diff for d in r.divergences][:3], r.failure)
    assert s.exit_status() == 1


@pytest.mark.timeout(900)
def test_the_native_made_the_same_accesses_its_kernel_found_by_its_banner(datagram_recording, kasan_analysis):
    """tandem explain on a VM its GRUB booted: no kernel in the recording, so the native's is
    found by its banner among tandem's builds, and the module modprobe loaded is placed
    while the replay stops in the kernel's module loader."""
    s, workdir = kasan_analysis
    findings = workdir / "findings.jsonl"
    titles = {json.loads(line)["title"]: i for i, line in reversed(list(enumerate(findings.read_text().splitlines(), 1)))}
    for title, func, want in [("KASAN: slab-out-of-bounds Write in tb_note_store", "tb_note_store",
                               ("write", 1, 56, 56, "allocated")),
                              (STALE_TITLE, "tb_session_account", ("read", 8, 8, 64, "freed"))]:
        n = titles[title]
        e = explain(datagram_recording, load_finding(findings, n), n)
        assert e.replay_ok, e.replay
        assert e.same, e.verdict
        a = e.access
        assert a is not None and (a.kind, a.size, a.offset, a.region, a.state) == want, e.verdict
        assert a.where.startswith(func + "+") and a.line.startswith("tandem_bugs.c:"), a
        assert all(not w["mismatches"] for w in e.windows)


@pytest.mark.timeout(2400)
@pytest.mark.parametrize("mode", ["exact", "device"])
def test_a_live_shadow_reports_it_while_the_native_serves_on(built, tmp_path, mode):
    """Live, in either recording mode; in device mode the native has 2 vCPUs on
    multi-threaded TCG (its kernel, tandem's native build, is built without SMP and runs
    one of them: tests/test_attach_libvirt_network.py has a Debian kernel on both, with a
    lockdep shadow beside the KASAN one)."""
    ref, guest, forwards, http, udp = guest_and_forwards(tmp_path)
    if mode == "device":
        guest.vcpus = 2
    live = []
    sh = ShadowRun(tmp_path / "live.tdm", analyses("kasan"),
                   ShadowOptions(record_analyses=False, idle_analyses=False, record_mode=mode),
                   workdir=tmp_path / "an", guest=guest, forwards=forwards, on_finding=live.append)
    sh.start()
    answers = []

    def client():
        wait_until(lambda: clients.http_up(http), 600, "nginx on the reference VM", poll=1.0)
        answers.append(send_datagram(udp, CRAFTED))
        serves(http, ref)
        # Served on while the analysis reaches the datagram: the native waits for nothing.
        wait_until(lambda: the_bug(live), 900, "the KASAN report, live", poll=1.0)
        serves(http, ref)
    t = start_client(client, "client")
    pressed = []

    def button_once_done():
        if not t.is_alive() and t.error is None and not pressed:
            pressed.append(time.monotonic())
            sh.native.powerdown()
    run_until_native_stops(sh, button_once_done, timeout=1800, client=t)
    t.join(0)
    s = sh.finish(timeout=1200)
    r, *others = s.results
    for o in others:        # lockdep: the bug is KASAN's to find
        assert not o.findings and not o.divergences, summary_text(s)
    assert answers == [b"OK\n"]
    (bug,) = the_bug(r.findings) or [None]
    assert bug is not None and not r.divergences, summary_text(s)
    port = f":{ref['udp_port']}, "
    assert [x for x in [bug.after_input, *bug.before] if x.startswith("frame") and port in x], \
        (bug.after_input, bug.before)
