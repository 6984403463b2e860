"""gdb's reverse stepping against a replay's gdbstub (`tandem replay --gdb`,
exact/debug.py), driven by the real gdb (helpers/gdb_reverse.py runs inside it), and
what a correct walk looks like: one definition for every test that debugs a bundle."""
from __future__ import annotations

import json
import os
import subprocess

from . import ROOT

GDB_SCRIPT = ROOT / "tests" / "helpers" / "gdb_reverse.py"
STEPS = 12
FAR = 3_000_000
IF = 0x200      # x86's interrupt flag in eflags


def gdb_reverse(port: int, steps: int = STEPS, far: int = FAR) -> dict:
    """helpers/gdb_reverse.py in gdb against the stub on port: what it saw, and `far`, the
    replay break's distance that the checks hold it to."""
    r = subprocess.run(["gdb", "-batch", "-nx", "-x", str(GDB_SCRIPT)], capture_output=True, text=True,
                       timeout=180, env={**os.environ, "PORT": str(port), "STEPS": str(steps), "FAR": str(far)})
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, f"gdb saw nothing (exit {r.returncode}): {r.stdout[-2000:]} {r.stderr[-2000:]}"
    return {**json.loads(lines[0][len("RESULT "):]), "far": far}


def check_reverse(seen: dict) -> None:
    forward, backward, again = seen["forward"], seen["backward"], seen["again"]
    counts = [w["icount"] for w in forward]
    assert counts == sorted(set(counts)), counts
    # reverse-stepi lands on each instruction stepped, in reverse, with the same state
    assert backward == forward[::-1]
    assert again == forward
    # a replay break `far` instructions on, then reverse-continue to the breakpoint on the
    # first instruction stepped: its latest execution before the break, state and all
    assert seen["ran_to"]["icount"] == seen["end"]["icount"] + seen["far"]
    back = seen["back_at"]
    assert back["rip"] == forward[0]["rip"]
    assert forward[0]["icount"] <= back["icount"] < seen["ran_to"]["icount"]
    if back["icount"] == forward[0]["icount"]:
        assert back == forward[0]


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
    assert matched >= len(forward) - 2, (backward, forward)
    if regs(backward[-1]) == walked[0]:    # back where it began: the log's path on again
        assert [regs(w) for w in again] == walked
    assert seen["ran_to"]["icount"] == seen["end"]["icount"] + seen["far"]
    assert seen["back_at"]["rip"] == forward[0]["rip"]
    assert seen["back_at"]["icount"] < seen["ran_to"]["icount"]
