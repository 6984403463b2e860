"""A recorded VM stopped as libvirt stops a domain, and its console reached as `virsh
console` reaches a domain's, through the CLI as a user runs
it, on the demo guest: its acpid and agent power it off on the ACPI power button; booted
with acpi=off it has no button and ignores the press."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from helpers import ROOT, assert_one_line_error, run_cli, wait_for_service, wait_until
from tandem import artifacts
from tandem.exact.replay import replay
from tandem.formats import bundle, pcapng
from tandem.qemu.vm import free_port
from tandem.record.console import console_socket
from tandem.record.workload import KV


def tandem(*args: str, stdin=subprocess.DEVNULL) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "replay")}
    return subprocess.Popen([sys.executable, "-m", "tandem", *args], stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)


def record(tdm, *args: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = tandem("record", str(tdm), "--port", str(port), *args)
    wait_for_service(port, proc)
    with KV(port) as kv:
        assert kv.request("SET before-the-stop 1") == "OK"
    return proc, port


def ended(proc: subprocess.Popen, timeout: float = 180) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return out.decode(errors="replace"), err.decode(errors="replace")


def console_text(tdm) -> bytes:
    return b"".join(e.data for e in pcapng.read_devlog(tdm / bundle.DEVLOG).events
                    if e.channel == "serial0" and e.direction == "out")


def stop_reason(tdm) -> str:
    return json.loads((tdm / bundle.MANIFEST).read_text())["stop"]["reason"]


def test_the_first_ctrl_c_presses_the_power_button_and_the_shutdown_is_recorded(built, tmp_path):
    tdm = tmp_path / "button.tdm"
    proc, _ = record(tdm)
    proc.send_signal(signal.SIGINT)
    out, err = ended(proc)
    assert proc.returncode == 0, err
    said = [line for line in err.splitlines() if "power button" in line]
    assert len(said) == 1 and "as virsh shutdown" in said[0] and "Ctrl-C again" in said[0], err
    assert "stop=poweroff" in out + err and stop_reason(tdm) == "poweroff"
    assert b"tandem-agent: power button" in console_text(tdm)       # the guest shut itself down
    v = replay(tdm)
    assert v.ok, v.summary()


def test_stop_quit_keeps_the_old_behaviour_for_scripts(built, tmp_path):
    tdm = tmp_path / "quit.tdm"
    proc, _ = record(tdm, "--stop", "quit")
    proc.send_signal(signal.SIGTERM)
    out, err = ended(proc)
    assert proc.returncode == 0, err
    assert "power button" not in err and stop_reason(tdm) == "interrupt"


def deaf_guest(tdm, *args: str) -> subprocess.Popen:
    """The demo guest booted with acpi=off: no power button in the guest, the press is lost."""
    g, k = artifacts.guest(), artifacts.kernel("native")
    port = free_port()
    proc = tandem("record", str(tdm), "--disk", g["disk_base"], "--kernel-image", k["bzImage"], "--initrd",
                  g["initramfs_native"], "--append", "acpi=off panic=-1", "--forward", f"tcp:{port}:7000", *args)
    wait_for_service(port, proc)
    return proc


def said(proc: subprocess.Popen, needle: str, lines: list[str]) -> bool:
    """needle is in a line tandem wrote on stderr so far (read as it comes, into lines)."""
    line = proc.stderr.readline().decode(errors="replace")
    lines.append(line)
    assert line or proc.poll() is None, "".join(lines)
    return needle in line


def test_a_second_ctrl_c_quits_at_once(built, tmp_path):
    """Signals do not queue: the second is sent once tandem said it pressed the button."""
    tdm = tmp_path / "twice.tdm"
    proc = deaf_guest(tdm)          # the default 60 s wait for the power-off
    proc.send_signal(signal.SIGINT)
    lines: list[str] = []
    wait_until(lambda: said(proc, "pressed the guest's power button", lines), 60, "the power button's line")
    proc.send_signal(signal.SIGINT)
    out, err = ended(proc)
    assert proc.returncode == 0, "".join(lines) + err
    assert "did not power off within" not in err, err      # quit by the second, not the 60 s bound
    assert stop_reason(tdm) == "interrupt"
    v = replay(tdm)
    assert v.ok, v.summary()


def test_a_guest_that_ignores_the_button_is_quit_when_the_timeout_passes(built, tmp_path):
    tdm = tmp_path / "deaf.tdm"
    proc = deaf_guest(tdm, "--shutdown-timeout", "5")
    proc.send_signal(signal.SIGINT)
    out, err = ended(proc)
    assert proc.returncode == 0, err
    assert "did not power off within 5 s of its power button: quitting" in err, err
    assert stop_reason(tdm) == "interrupt"


def test_the_console_reaches_the_recorded_vm_and_what_is_typed_is_recorded(built, tmp_path):
    """tandem console while tandem record runs: the escape key said on connect, the guest's
    answer to a typed line shown, a poweroff typed there ends the recording, and the exact
    replay types the same bytes at the same instruction (it verifies every output)."""
    tdm = tmp_path / "console.tdm"
    rec, _ = record(tdm)
    try:
        wait_until(lambda: console_socket(tdm).exists(), 30, "the console socket")
        con = tandem("console", str(tdm), stdin=subprocess.PIPE)
        try:        # the agent answers line by line: the echo, then the poweroff ends it
            out, err = (b.decode(errors="replace") for b in con.communicate(
                b"echo typed at the tandem console\npoweroff\n", timeout=120))
        finally:
            if con.poll() is None:
                con.kill()
        assert con.returncode == 0, err
        assert "Escape character is ^] (Ctrl + ])" in err, err
        assert "typed at the tandem console" in out and "tandem-agent: poweroff" in out, out
        _, rec_err = ended(rec)
    finally:
        if rec.poll() is None:
            rec.kill()
    assert rec.returncode == 0, rec_err
    assert stop_reason(tdm) == "poweroff"
    typed = b"".join(e.data for e in pcapng.read_devlog(tdm / bundle.DEVLOG).events
                     if e.channel == "serial0" and e.direction == "in")
    assert b"echo typed at the tandem console\n" in typed and b"poweroff\n" in typed
    assert not console_socket(tdm).exists()
    v = replay(tdm)
    assert v.ok, v.summary()


def test_console_without_a_running_recording_is_one_line(built, tmp_path):
    assert_one_line_error(run_cli("console", str(tmp_path / "nope.tdm")), "nope.tdm", "no such recording bundle")
    (tmp_path / "idle.tdm").mkdir()
    assert_one_line_error(run_cli("console", str(tmp_path / "idle.tdm")), "idle.tdm", "no recording of it is running")
