"""Run inside gdb (gdb -batch -nx -x gdb_reverse.py): reverse debugging against a replay's
gdbstub, as a user does it, printing what it saw as one JSON line (`RESULT {...}`).

Environment: PORT (the gdbstub), STEPS (how many instructions), FAR (instructions to run on
before reverse-continue). It steps forward STEPS instructions noting each PC, registers and
instruction count, steps back over them (reverse-stepi) and forward again, then runs FAR
instructions on (a replay break, through the monitor) and reverse-continues to a breakpoint
on the first PC it stepped."""
import json
import os
import re

import gdb  # type: ignore[import-not-found]  # gdb's own module: this file runs inside gdb

REGS = ("rip", "rsp", "rbp", "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "r8", "r15", "eflags")


def run(cmd: str) -> str:
    return gdb.execute(cmd, to_string=True) or ""


def icount() -> int:
    m = re.search(r"instruction count = (\d+)", run("monitor info replay"))
    assert m, "no instruction count from the monitor"
    return int(m.group(1))


def where() -> dict:
    regs = {r: int(run(f"p/x ${r}").split("=")[1], 16) for r in REGS}
    return {"icount": icount(), **regs}


def main() -> None:
    steps, far = int(os.environ["STEPS"]), int(os.environ["FAR"])
    run("set pagination off")
    run("set confirm off")
    # gdb waits 2 s for a packet's answer, then sends it again: a stub slowed by a busy
    # host then answers twice, and gdb reads the first answer as the next packet's
    # ("Remote replied unexpectedly to 'vMustReplyEmpty'").
    run("set remotetimeout 60")
    run(f"target remote 127.0.0.1:{os.environ['PORT']}")
    forward = []
    for _ in range(steps):
        forward.append(where())
        run("stepi")
    end = where()
    backward = []
    for _ in range(steps):
        run("reverse-stepi")
        backward.append(where())
    again = []
    for _ in range(steps):
        again.append(where())
        run("stepi")
    run(f"monitor replay_break {end['icount'] + far}")
    run("continue")
    ran_to = where()
    run(f"hbreak *{forward[0]['rip']:#x}")
    run("reverse-continue")
    back_at = where()
    print("RESULT " + json.dumps({"forward": forward, "end": end, "backward": backward, "again": again,
                                  "ran_to": ran_to, "back_at": back_at}))
    run("detach")


main()
