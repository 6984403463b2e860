"""Sanitizer analyses of an ordinary guest: the reference VM (Debian 12 from its
own disk: GRUB, systemd, networkd's DHCP, nginx, redis) recorded under Debian's clients,
then replayed semantically into analysis kernels booting the same disk directly: its
DHCP answered from the recording, its services compared under the HTTP and RESP rules,
zero divergences and zero findings on a clean run; a file changed through an overlay is
a divergence attributed to its request; a kernel the user brings and an ASan build of
redis swapped in analyse clean; a kernel that cannot mount the root is tandem's failure
(exit 3), reported within a bound."""
from __future__ import annotations

import contextlib
import http.server
import json
import shutil
import subprocess

import pytest
from helpers import analyses, assert_one_line_error, run_cli, start_client, wait_until
from helpers.refvm import arp_replies_to_guest, dhcp_to_guest, icmp6_types, offered_then_acked
from tandem import artifacts
from tandem.formats import netpkt, pcapng
from tandem.machine import Forward, Guest
from tandem.qemu.vm import free_port
from tandem.record import clients
from tandem.record.recording import Recording
from tandem.semantic import inputs
from tandem.semantic.analyze import analyze


class Backend(http.server.BaseHTTPRequestHandler):
    """The host's side of the reference VM's /backend/ (nginx proxies it to the host): the
    same answer for the same request, whoever asks and when."""

    def do_GET(self):
        body = f"backend answers {self.path}\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def backend(port: int):
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Backend)
    except OSError as e:
        pytest.fail(f"the reference VM's backend port {port} on the host: {e.strerror} (is another test using it?)")
    t = start_client(server.serve_forever, "backend")
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        t.join(10)


def via_backend(port: int, path: str) -> bytes:
    """GET path of the reference VM's nginx, which asks the backend on the host."""
    r = subprocess.run(["curl", "-sf", "--max-time", "60", f"http://127.0.0.1:{port}{path}"], capture_output=True)
    assert r.returncode == 0, (path, r.returncode, r.stderr)
    return r.stdout


@pytest.fixture(scope="module")
def refvm_recording(built, tmp_path_factory):
    """The reference VM from power-on under curl (every site file; pages nginx asks a
    backend on the host for, one at a time and four at once), ab and redis-benchmark at
    once, powered off by its ACPI button."""
    ref = artifacts.refvm()
    tmp = tmp_path_factory.mktemp("refvm-an")
    base = tmp / "refvm.qcow2"
    shutil.copyfile(ref["disk"], base)
    http, redis = free_port(), free_port()
    tdm = tmp / "web.tdm"
    back = ref["backend"]
    with backend(back["host_port"]), Recording(tdm, Guest.of_disks([(str(base), "qcow2")]),
                   forwards=(Forward("tcp", http, 80), Forward("tcp", redis, 6379))) as rec:
        wait_until(lambda: rec.running() and clients.http_up(http), 600, "nginx on the reference VM", poll=1.0)
        wait_until(lambda: rec.running() and clients.redis_up(redis), 120, "redis on the reference VM", poll=1.0)
        clients.fetch_files(http, {f["path"]: f["sha256"] for f in ref["site"]})
        for i in range(2):
            assert via_backend(http, f"{back['path']}one-{i}") == f"backend answers /one-{i}\n".encode()
        at_once = [start_client(lambda i=i: via_backend(http, f"{back['path']}at-once-{i}"), f"backend {i}")
                   for i in range(4)]
        for t in at_once:
            t.join(120)
        loads = [start_client(lambda: clients.ab(http, requests=50), "ab"),
                 start_client(lambda: clients.redis_benchmark(redis, requests=200), "redis-benchmark")]
        for t in loads:
            t.join(600)
        rec.powerdown()
        rec.wait(timeout=300)
    return tdm


def backend_answers(devlog, port: int) -> set[bytes]:
    """What reached the guest from the backend on the host (10.0.2.2:port), by line."""
    seen = b""
    for e in pcapng.read_devlog(devlog).events:
        f = netpkt.parse(e.data) if e.kind == "net" and e.direction == "in" else None
        if f is not None and f.proto == netpkt.PROTO_TCP and f.sport == port:
            seen += f.payload
    return {line for line in seen.split(b"\n") if line.startswith(b"backend answers")}


@pytest.mark.timeout(900)   # the reference VM's recording (module fixture) if it runs first
def test_the_recording_has_the_connections_the_guest_opened(refvm_recording):
    port = artifacts.refvm()["backend"]["host_port"]
    flows = [fl for fl in inputs.load(refvm_recording).flows if fl.guest_opened and fl.client[1] == port]
    assert len(flows) == 6 and all(fl.answer == "accepted" and fl.protocol == "http" for fl in flows), flows


@pytest.mark.timeout(900)
def test_the_guests_ipv6_is_recorded_and_extracted_with_no_limit(refvm_recording):
    """Debian's networkd with IPv6 on: the guest solicits a router and its neighbours
    and reports its multicast groups; QEMU's user network advertises fec0::/64."""
    out, came = icmp6_types(refvm_recording / "devices.pcapng", "out"), icmp6_types(refvm_recording / "devices.pcapng", "in")
    assert {netpkt.ND_RS, 143} <= out, out          # 143: an MLDv2 report
    assert netpkt.ND_RA in came, came
    rec = inputs.load(refvm_recording)
    assert rec.router_advert is not None and not [x for x in rec.limits if "ethertype" in x], rec.limits


@pytest.mark.timeout(2700)
def test_the_reference_vm_analysed_on_its_own_disk_is_clean(refvm_recording, tmp_path):
    s = analyze(refvm_recording, analyses("kasan", "ubsan", "lockdep"), workdir=tmp_path, record=False)
    assert [r.analysis for r in s.results] == ["kasan", "ubsan", "lockdep"]
    for r in s.results:
        # The native's power button is pressed in each after its last input: it powers off.
        assert r.run.outcome in ("poweroff", "finished"), (r.analysis, r.run.outcome, r.run.detail,
                                                           r.run.qemu_log[-2000:])
        assert r.complete and not r.findings, (r.analysis, r.failure, [f.title for f in r.findings])
        assert not r.divergences, (r.analysis, [d.diff for d in r.divergences][:5])
    # Its DHCP was answered from the recording: an OFFER and an ACK reached each (the
    # native kernel's noise run among them).
    # and its ARP for the gateway (nginx's connections to the backend go through it).
    for name in ("native", "kasan", "ubsan", "lockdep"):
        assert offered_then_acked(dhcp_to_guest(tmp_path / f"{name}.pcapng")), (name, s.limits)
        assert bytes([10, 0, 2, 2]) in arp_replies_to_guest(tmp_path / f"{name}.pcapng"), name
        # IPv6 as the native had it: its router solicitation answered by the replayer
        assert netpkt.ND_RA in icmp6_types(tmp_path / f"{name}.pcapng", "in"), name
    assert not [x for x in s.limits if "ethertype" in x], s.limits
    assert not [x for x in s.limits if "no answer in the recording" in x and "DHCP" in x], s.limits
    # nginx's connections to the backend were answered from the recording, each its own
    # page (matched by request where four were open at once).
    port = artifacts.refvm()["backend"]["host_port"]
    want = {f"backend answers /{p}".encode() for p in ("one-0", "one-1", *(f"at-once-{i}" for i in range(4)))}
    for name in ("native", "kasan", "ubsan", "lockdep"):
        assert backend_answers(tmp_path / f"{name}.pcapng", port) == want, name
    assert not [x for x in s.limits if "no match" in x], s.limits
    assert s.exit_status() == 0


def summary(workdir) -> dict:
    return json.loads((workdir / "summary.json").read_text())


@pytest.mark.timeout(1500)
def test_a_file_changed_through_an_overlay_is_a_divergence_at_its_request(refvm_recording, tmp_path):
    """The analysis serves another index.html (its userland overlay): the native's page is
    not the analysis's, reported on the HTTP flow that asked for it, after that request."""
    tree = tmp_path / "changed"
    (tree / "var/www/html").mkdir(parents=True)
    (tree / "var/www/html/index.html").write_text("<p>not the page the native served</p>\n")
    work = tmp_path / "work"
    r = run_cli("replay", str(refvm_recording), "--overlay", f"changed={tree}", "--no-noise", "--no-record",
                "--workdir", str(work), timeout=1800)
    assert r.returncode == 1, r.stdout + r.stderr
    (a,) = summary(work)["analyses"]
    assert a["analysis"] == "changed" and a["outcome"] in ("poweroff", "finished") and not a["findings"], a
    http = [d for d in a["divergences"] if d["channel"].startswith("tcp") and ":80" in d["channel"]]
    assert http and len(http) == len(a["divergences"]), [d["channel"] for d in a["divergences"]]
    # Each after the request it answers, on its own connection (ab's and redis-benchmark's
    # requests go on between).
    for d in http:
        flow = d["channel"].split()[2]
        assert d["after_input"].startswith("tcp-data") and f"(flow {flow} " in d["after_input"], d
        assert '"GET /' in d["after_input"], d["after_input"]
    assert any("not the page the native served" in d["diff"] for d in http), http[0]["diff"][:2000]
    assert "DIVERGENCE" in r.stdout + r.stderr and "tandem-overlay: wrote /var/www/html/index.html" in \
        (work / "changed-overlay" / "console.log").read_text(errors="replace")


@pytest.mark.timeout(1800)
def test_a_brought_kernel_and_an_asan_redis_swapped_in_analyse_clean(refvm_recording, tmp_path):
    """Any bzImage (here tandem's own native build, copied as a user's would be) booted on
    the VM's disk, with redis replaced by an ASan build through an overlay: every request
    answered as the native answered it, no finding."""
    k = artifacts.kernel("native")
    mine = tmp_path / "mine"
    mine.mkdir()
    shutil.copyfile(k["bzImage"], mine / "bzImage")
    asan = artifacts.asan_redis()
    work = tmp_path / "work"
    r = run_cli("replay", str(refvm_recording), "--analysis-kernel", f"mine={mine / 'bzImage'},{k['vmlinux']}",
                "--overlay", f"asan-redis={asan['overlay']},mine", "--no-noise", "--no-record",
                "--workdir", str(work), timeout=1800)
    s = summary(work)
    assert [a["analysis"] for a in s["analyses"]] == ["mine", "asan-redis"], r.stdout + r.stderr
    for a in s["analyses"]:
        assert a["outcome"] in ("poweroff", "finished") and a["failure"] is None, a
        assert not a["findings"] and not a["divergences"], (a["analysis"], a["findings"][:2], a["divergences"][:2])
    assert r.returncode == 0, r.stdout + r.stderr
    console = (work / "asan-redis-overlay" / "console.log").read_text(errors="replace")
    assert "tandem-overlay: wrote /usr/bin/redis-server" in console and "tandem-overlay: done 3" in console


@pytest.mark.timeout(1200)
def test_a_kernel_that_cannot_mount_the_root_is_tandems_failure_within_a_bound(refvm_recording, tmp_path):
    """Debian's own kernel without its initramfs (virtio-blk and ext4 are modules there):
    it panics at the root mount. Not a finding about the guest: NOT ANALYSED, exit 3."""
    work = tmp_path / "work"
    r = run_cli("replay", str(refvm_recording), "--analysis-kernel", f"debian={artifacts.refvm()['kernel']}",
                "--no-noise", "--no-record", "--workdir", str(work), timeout=900)
    assert r.returncode == 3, r.stdout + r.stderr
    (a,) = summary(work)["analyses"]
    assert a["failure"] and "did not boot" in a["failure"] and not a["findings"] and not a["divergences"], a
    assert "VFS: Unable to mount root fs" in a["failure"], a["failure"]      # why, from its console
    assert "NOT ANALYSED" in r.stdout + r.stderr


@pytest.mark.timeout(900)
@pytest.mark.parametrize("args, needles", [
    (["--root", "UUID=00000000-0000-4000-8000-000000000000"], ["UUID=00000000-0000-4000-8000-000000000000"]),
    (["--analysis-kernel", "mine=/etc/hostname"], ["--analysis-kernel mine", "/etc/hostname", "not a Linux kernel"]),
    (["--overlay", "x=/nonexistent-tree"], ["--overlay x", "/nonexistent-tree", "not found"]),
])
def test_a_root_or_kernel_that_is_not_there_is_a_one_line_error(refvm_recording, args, needles):
    r = run_cli("replay", str(refvm_recording), "--analysis", "native", "--no-noise", *args)
    assert r.returncode == 2
    assert_one_line_error(r, *needles)
