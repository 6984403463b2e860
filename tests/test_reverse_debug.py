"""Reverse debugging on a real recording: the demo guest's bundle replayed under gdb
(`tandem replay --gdb`, exact/debug.py) with QEMU's replay-seek and gdb's reverse-stepi and
reverse-continue, driven by the real gdb (helpers/gdb_reverse.py runs inside it)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from helpers import ROOT, assert_one_line_error, drain, interrupt_cli, record_demo, run_cli, start_cli, wait_until
from tandem.exact.debug import debug
from tandem.qemu.vm import free_port

GDB_SCRIPT = ROOT / "tests" / "helpers" / "gdb_reverse.py"
STEPS = 12
FAR = 3_000_000
IF = 0x200      # x86's interrupt flag in eflags


def gdb_reverse(port: int, steps: int = STEPS, far: int = FAR) -> dict:
    """helpers/gdb_reverse.py in gdb against the stub on port: what it saw."""
    r = subprocess.run(["gdb", "-batch", "-nx", "-x", str(GDB_SCRIPT)], capture_output=True, text=True,
                       timeout=180, env={**os.environ, "PORT": str(port), "STEPS": str(steps), "FAR": str(far)})
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, f"gdb saw nothing (exit {r.returncode}): {r.stdout[-2000:]} {r.stderr[-2000:]}"
    return json.loads(lines[0][len("RESULT "):])


def registers(session) -> str:
    """Every vCPU's registers as the monitor prints them (every general, segment and control
    register, the flags and the FPU's): equal text, equal state."""
    return str(session.vm._monitor().command("human-monitor-command", **{"command-line": "info registers -a"}))


def check_reverse(seen: dict) -> None:
    forward, backward, again = seen["forward"], seen["backward"], seen["again"]
    counts = [w["icount"] for w in forward]
    assert counts == sorted(set(counts)), counts
    # reverse-stepi lands on each instruction stepped, in reverse, with the same state
    assert backward == forward[::-1]
    assert again == forward
    # a replay break FAR instructions on, then reverse-continue to the breakpoint on the
    # first instruction stepped: its latest execution before the break, state and all
    assert seen["ran_to"]["icount"] == seen["end"]["icount"] + FAR
    back = seen["back_at"]
    assert back["rip"] == forward[0]["rip"]
    assert forward[0]["icount"] <= back["icount"] < seen["ran_to"]["icount"]
    if back["icount"] == forward[0]["icount"]:
        assert back == forward[0]


def test_seek_and_gdb_reverse_on_the_demo_guest(demo_bundle):
    with debug(demo_bundle, free_port(), spacing_s=0.5) as s:
        shots = s.snapshots
        assert len(shots) >= 3 and shots[0].icount == 0
        assert [x.icount for x in shots] == sorted({x.icount for x in shots})
        assert s.icount() == 0                     # paused at power-on once they are taken
        end = s.end[1]
        assert end is not None
        mid = end // 2 + 12_345
        s.seek(mid)
        assert s.icount() == mid
        here = registers(s)
        seen = gdb_reverse(s.port)
        check_reverse(seen)
        # gdb detached, which resumed the replay: a seek stops it first (qemu-patches/0011).
        # The same instruction reached again from a later point (a snapshot before it, then
        # replay) and from an earlier one (replay on): the same state each time. (Not near
        # the end: docs/reverse-debugging.md, "Not yet".)
        s.seek(end * 3 // 4)
        s.seek(mid)
        assert s.icount() == mid and registers(s) == here
        s.seek(1000)
        s.seek(mid)
        assert registers(s) == here
        # the VM clock of a seek by VM time is the time asked for, to the instruction or
        # the idle warp it falls in
        t = s.recording.events[len(s.recording.events) // 2].vm_ns
        s.seek(s.icount_at(t))
        assert s.vm_ns() <= t
        # on to the recorded end without a divergence
        s.vm._monitor().command("cont")
        wait_until(lambda: s.vm._monitor().command("query-status")["status"] != "running", 120,
                   "the replay reaching the recorded end")
        assert s.vm._monitor().command("query-status")["status"] == "shutdown"
        # the device log's end is the shutdown request; the vCPU runs on a little until
        # the main loop stops it (qemu-patches/0015)
        assert s.icount() >= end
        assert "diverged" not in s.vm.log_tail()


def check_reverse_of_one_vcpu(seen: dict) -> None:
    """gdb's reverse-stepi and reverse-continue on one vCPU of several (qemu-patches/0039):
    gdb sees the stepped vCPU's state. A forward stepi may run the other vCPU's turn
    before the stepped one's instruction, so going back lands where that instruction
    begins: the stepped vCPU's registers as they were, at a count no lower. A step that
    ended with an interrupt's delivery (the gate cleared IF) is undone to before the
    delivery, not to the handler's first instruction (docs/reverse-debugging.md, "Not
    yet"): such a landing is told apart, and the rest must be the forward walk's states."""
    forward, backward, again = seen["forward"], seen["backward"], seen["again"]
    regs = lambda w: {k: v for k, v in w.items() if k != "icount"}     # noqa: E731
    counts = [w["icount"] for w in forward]
    assert counts == sorted(set(counts)), counts
    walked = [regs(f) for f in forward]
    delivered = {f["icount"] for f in forward if not f["eflags"] & IF}     # counts with IF clear after a step
    back = [w["icount"] for w in [seen["end"], *backward]]
    assert back == sorted(back, reverse=True), back
    at, matched = len(walked), 0      # each step back lands on an earlier state of the forward walk
    for i, b in enumerate(backward):
        earlier = [j for j in range(at) if walked[j] == regs(b)]
        if earlier:
            at, matched = earlier[-1], matched + 1
        else:
            assert b["eflags"] & IF and (b["icount"] in delivered or i == len(backward) - 1), (i, b, forward)
    assert matched >= STEPS - 2, (backward, forward)
    if regs(backward[-1]) == walked[0]:    # back where it began: the log's path on again
        assert [regs(w) for w in again] == walked
    assert seen["ran_to"]["icount"] == seen["end"]["icount"] + FAR
    assert seen["back_at"]["rip"] == forward[0]["rip"]
    assert seen["back_at"]["icount"] < seen["ran_to"]["icount"]


def test_seek_and_gdb_reverse_on_two_vcpus(built, tmp_path):
    """The demo guest on 2 vCPUs (qemu-patches/0038: the round-robin turns in the log):
    a seek lands on the same instruction count with both vCPUs' state the same whichever
    way it came; gdb's reverse-stepi and reverse-continue go back on the vCPU gdb steps;
    the replay goes on to the recorded end."""
    path = record_demo(tmp_path / "smp2.tdm", rounds=3, vcpus=2)
    with debug(path, free_port(), spacing_s=0.5) as s:
        end = s.end[1]
        assert end is not None and len(s.snapshots) >= 2
        mid = end // 2 + 12_345
        s.seek(mid)
        assert s.icount() == mid
        here = registers(s)
        assert here.count("RIP=") == 2, here
        s.seek(end * 3 // 4)
        s.seek(mid)
        assert s.icount() == mid and registers(s) == here
        s.seek(1000)
        s.seek(mid)
        assert registers(s) == here
        check_reverse_of_one_vcpu(gdb_reverse(s.port))
        s.vm._monitor().command("cont")
        wait_until(lambda: s.vm._monitor().command("query-status")["status"] != "running", 120,
                   "the replay reaching the recorded end")
        assert s.vm._monitor().command("query-status")["status"] == "shutdown"
        assert "diverged" not in s.vm.log_tail()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "kill"])
def test_the_cli_serves_gdb_until_interrupted(demo_bundle, sig):
    port = free_port()
    p = start_cli("replay", str(demo_bundle), "--gdb", str(port), "--snapshot-every", "1")
    try:
        out: list[str] = []

        def announced() -> bool:
            line = p.stderr.readline() if p.stderr else ""
            out.append(line)
            return "target remote" in line or p.poll() is not None

        wait_until(announced, 300, lambda: "tandem replay --gdb to announce its stub: " + "".join(out))
        assert p.poll() is None, "".join(out)
        drain(p, out)
        check_reverse(gdb_reverse(port, steps=4))
        assert interrupt_cli(p, out, sig=sig) == 0, "".join(out)
        # its QEMU ended and its snapshots' directory gone (VM.close before the rmtree)
        qmp = re.search(r"QMP: (\S+)/qmp.sock", "".join(out))
        assert qmp and not Path(qmp.group(1)).exists(), "".join(out)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.parametrize("args,needles", [
    (["--gdb", "0", "--partial"], ["--gdb", "--partial"]),
    (["--snapshot-every", "1"], ["--snapshot-every", "--gdb"]),
    (["--gdb", "0", "--snapshot-every", "0"], ["--snapshot-every"]),
    (["--gdb", "70000"], ["--gdb", "70000"]),
])
def test_bad_gdb_options(demo_bundle, args, needles):
    assert_one_line_error(run_cli("replay", str(demo_bundle), *args), *needles)


def test_an_unfinished_bundle_is_refused(bundle_copy: Path):
    stream = bundle_copy / "replay.tdrs"
    stream.write_bytes(stream.read_bytes()[:-100])
    assert_one_line_error(run_cli("replay", str(bundle_copy), "--gdb", "0"), "unfinished")
