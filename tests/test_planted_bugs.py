"""The planted bugs (docs/planted-bugs.md) on real guests.

The native guest serves every bad request with its normal reply and prints no report;
each analysis guest (KASAN, UBSAN, lockdep, KCSAN kernel; ASan kvd) prints the report
for its bugs on the serial console. Reports are matched with plain regexes here: parsing them
is the report parser's job, tested on tests/report-corpus/.

The guests run plain (no record/replay, no icount) so each boots in seconds; one
guest runs at a time and is shared by the tests that use the same kernel and userland.
"""
from __future__ import annotations

import re
import time

import pytest

from helpers import shared_across_tests, wait_until
from tandem.formats import bundle
from tandem.errors import TandemError
from tandem.record.recording import Recording
from tandem.exact.replay import replay
from tandem.qemu.vm import VM, free_port
from tandem.qemu.image import make_overlay
from tandem.machine import Guest, Run, UserNet
from tandem.record.workload import KV, PLANTED_BUGS, bad_requests, demo_traffic

# Anything a sanitizer, lockdep or an oops prints. The native console must have none.
ANY_REPORT = re.compile(rb"BUG: |WARNING: |UBSAN: |KASAN|AddressSanitizer|circular locking"
                        rb"|Call Trace|Kernel panic|Oops|general protection")


class Booted:
    """One booted guest: its VM, the host port of kvd, its console."""

    def __init__(self, flavor: str, userland: str, rundir):
        self.key = (flavor, userland)
        self.guest = Guest.default(flavor, userland)
        make_overlay(self.guest.disk.base, rundir / "disk.qcow2")
        self.port = free_port()
        self.vm = VM(self.guest, Run(rundir, net=UserNet(self.port), overlay=rundir / "disk.qcow2",
                                     icount=False)).start()
        self.vm.serial.wait_for(b"TANDEM-READY", 120)

    def console(self) -> bytes:
        return self.vm.serial.output().replace(b"\r\n", b"\n")

    def wait_console(self, pattern: bytes, timeout: float = 30) -> re.Match:
        rx = re.compile(pattern)
        return wait_until(lambda: rx.search(self.console()), timeout, lambda: (
            f"{pattern!r} on the console; tail:\n{self.console()[-1500:].decode(errors='replace')}"))

    def settle(self) -> None:
        """Round trip through the serial agent: console output up to here is in."""
        marker = f"settled-{time.monotonic_ns()}"
        self.vm.serial.type(f"echo {marker}")
        self.vm.serial.wait_for(marker.encode() + b"\r\n", 30)


@pytest.fixture(scope="module")
def boot(built, tmp_path_factory):
    """boot(flavor, userland) -> a running guest; the previous one is shut down first."""
    current: list[Booted] = []

    def get(flavor: str, userland: str = "native") -> Booted:
        if current and current[0].key == (flavor, userland):
            return current[0]
        while current:
            current.pop().vm.close()
        with shared_across_tests():     # kept for the module's next tests, closed here
            current.append(Booted(flavor, userland, tmp_path_factory.mktemp(f"{flavor}-{userland}")))
        return current[0]

    yield get
    while current:
        current.pop().vm.close()


def test_native_serves_every_bad_request_silently(boot):
    g = boot("native")
    replies = bad_requests(g.port)                 # raises unless each reply is the native one
    assert replies == {k: v[2] for k, v in PLANTED_BUGS.items()}
    # The service and the guest are fine afterwards: the usual protocol, the serial agent.
    demo_traffic(g.port, rounds=3)
    with KV(g.port) as kv:
        assert kv.request("GET " + "k" * 43) == "NOTFOUND"      # the key the ASan bug caches
        assert kv.request("SET " + "k" * 43 + " v") == "OK"
        assert kv.request("GET " + "k" * 43) == "VALUE v"
    g.vm.serial.type("stats")
    g.vm.serial.wait_for(b"STATS keys=", 30)
    g.settle()
    out = g.console()
    assert b"tandem_bugs: loading out-of-tree module" in out        # the module is there...
    assert not ANY_REPORT.search(out), ANY_REPORT.search(out)       # ...and nothing is reported


def test_bug_requests_need_the_module_and_a_valid_command(boot):
    g = boot("native")
    with KV(g.port) as kv:
        assert kv.request("BUG nosuchbug") == "ERR"
        assert kv.request("BUG oob " + "n" * 53) == "ERR"            # too long for a note
        assert kv.request("BUG shift x") == "ERR"
        assert kv.request("LKDTM NO_SUCH_TYPE") == "ERR"
        assert kv.request("BUG oob short note") == "OK"


def test_kvd_closes_each_open_connection_when_the_guest_powers_off(built, tmp_path):
    """The agent's poweroff sends SIGTERM: kvd closes what is open, one line each.
    Killed at once, a connection's "close" line would race its client's FIN, and a replay
    into the slower KCSAN kernel could lose the line the native printed."""
    g = Booted("native", "native", tmp_path)
    try:
        a, b = KV(g.port), KV(g.port)          # conns 2 and 3 (the agent's probe was 1)
        assert a.request("SET k v") == "OK" and b.request("GET k") == "VALUE v"
        g.vm.serial.type("poweroff")

        def closed_after_poweroff() -> list[bytes]:
            out = g.console()
            tail = out[out.find(b"tandem-agent: poweroff"):] if b"tandem-agent: poweroff" in out else b""
            return sorted(re.findall(rb"kvd: close conn (\d+)", tail))
        wait_until(lambda: closed_after_poweroff() == [b"2", b"3"], 30, lambda: (
            f"kvd's close of conns 2 and 3 after the poweroff; console tail:\n"
            f"{g.console()[-1500:].decode(errors='replace')}"))
        assert g.vm.wait(60) == 0, g.vm.log_tail()
    finally:
        g.vm.close()


def test_kasan_reports_slab_out_of_bounds_and_use_after_free(boot):
    g = boot("kasan")
    bad_requests(g.port, ["kasan-oob", "kasan-uaf"])
    m = g.wait_console(rb"BUG: KASAN: slab-out-of-bounds in tb_note_store\+\S+ \[tandem_bugs\]\n"
                       rb"[^\n]*Write of size 1 at addr [0-9a-f]+ by task kvd/")
    g.wait_console(rb"BUG: KASAN: slab-use-after-free in tb_session_account\+\S+ \[tandem_bugs\]\n"
                   rb"[^\n]*Read of size 8 at addr [0-9a-f]+ by task kvd/")
    assert re.search(rb"The buggy address is located 0 bytes to the right of\n"
                     rb"[^\n]* allocated 56-byte region", g.console()[m.end():])


def test_kasan_reports_lkdtm_read_after_free(boot):
    g = boot("kasan")
    bad_requests(g.port, ["lkdtm-uaf"])
    g.wait_console(rb"BUG: KASAN: slab-use-after-free in lkdtm_READ_AFTER_FREE\+\S+\n"
                   rb"[^\n]*Read of size 4 at addr")


def test_lockdep_reports_circular_locking(boot):
    g = boot("lockdep")
    bad_requests(g.port, ["lockdep-ab", "lockdep-ba"])
    g.wait_console(rb"WARNING: possible circular locking dependency detected\n"
                   rb"(?:[^\n]*\n){2}[^\n]*kvd/\d+ is trying to acquire lock:\n"
                   rb"[^\n]*\(tb_table_lock\)[^\n]*at: tb_stats_reset\+")


def test_ubsan_reports_shift_and_index(boot):
    g = boot("ubsan")
    bad_requests(g.port, ["ubsan-shift", "ubsan-index"])
    g.wait_console(rb"UBSAN: shift-out-of-bounds in guest-kernel/modules/tandem_bugs\.c:\d+:\d+\n"
                   rb"[^\n]*shift exponent 40 is too large for 32-bit type 'unsigned int'")
    g.wait_console(rb"UBSAN: array-index-out-of-bounds in guest-kernel/modules/tandem_bugs\.c:\d+:\d+\n"
                   rb"[^\n]*index 8 is out of range for type 'u32 \[8\]'")


def test_kcsan_reports_the_data_race_of_a_timer_and_a_task(boot):
    g = boot("kcsan")
    bad_requests(g.port, ["kcsan-race"])
    # The timer's write by interrupt, then the read of the task it interrupted.
    g.wait_console(rb"BUG: KCSAN: data-race in tb_rate_sample \[tandem_bugs\] / tb_rate_tick \[tandem_bugs\]\n"
                   rb"[^\n]*\n[^\n]*write to 0x[0-9a-f]+ of 8 bytes by interrupt on cpu 0:\n"
                   rb"[^\n]* tb_rate_tick\+(?:[^\n]*\n)+?"
                   rb"[^\n]*read to 0x[0-9a-f]+ of 8 bytes by task \d+ on cpu 0:\n"
                   rb"[^\n]* tb_rate_sample\+")


def test_asan_reports_kvd_heap_overflow(boot):
    g = boot("native", "asan")
    replies = bad_requests(g.port, ["asan-heap-overflow"], check=False)
    assert replies == {"asan-heap-overflow": None}       # kvd-asan aborts on the report
    g.wait_console(rb"ERROR: AddressSanitizer: heap-buffer-overflow on address 0x[0-9a-f]+ .*\n"
                   rb"WRITE of size 44 at 0x[0-9a-f]+ thread T0\n"
                   rb"(?:[^\n]*\n)*?    #1 0x[0-9a-f]+ in miss_cache_put agent/kvd\.c:\d+")
    g.wait_console(rb"tandem-agent: child \d+ exited status 1")


def test_recording_with_planted_bugs_replays_exactly(built, tmp_path):
    """The flavor's modules reach the guest inside its initrd: the file the manifest
    names and hashes, so exact replay checks and loads the same modules."""
    path = tmp_path / "bugs.tdm"
    with Recording(path) as rec:
        rec.wait_ready()
        bad_requests(rec.port)
        rec.serial.type("poweroff")
        rec.wait(timeout=120)
    m = bundle.load_manifest(path)
    assert m.inputs["initrd"].path == Guest.default().initrd
    assert m.stop.reason == "poweroff"
    v = replay(path)
    assert v.ok, v.summary()


def test_unknown_planted_bug_is_an_error():
    with pytest.raises(TandemError, match="unknown planted bugs: nope"):
        bad_requests(1, ["nope"])
