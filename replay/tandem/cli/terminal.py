"""`tandem console` (the terminal on a recorded VM's serial port): its console in this terminal, as `virsh console`."""
from __future__ import annotations

import os
import select
import sys
import termios
import tty

from ..record.console import ESCAPE, ESCAPE_NAME, connect


def add_parsers(sub) -> None:
    r = sub.add_parser("console", help="connect this terminal to the serial console of a VM being recorded "
                       "(tandem record, shadow or attach), as virsh console does; what you type is recorded")
    r.add_argument("bundle", help="the bundle the running recording writes (NAME.tdm)")
    r.set_defaults(func=cmd_console)


def cmd_console(args) -> int:
    sock = connect(args.bundle)
    interactive = os.isatty(0)
    print(f"Connected to the serial console of {args.bundle} (what you type is recorded)\r\n"
          f"Escape character is {ESCAPE_NAME}" + ("" if interactive else "; standard input is passed through"),
          file=sys.stderr, flush=True)
    saved = termios.tcgetattr(0) if interactive else None
    try:
        if interactive:
            tty.setraw(0)
        _relay(sock, interactive)
    finally:
        if saved is not None:
            termios.tcsetattr(0, termios.TCSADRAIN, saved)
        sock.close()
    if interactive:
        print("\nDisconnected", file=sys.stderr)
    return 0


def _relay(sock, interactive: bool) -> None:
    """Keys to the guest, the guest's output to this terminal, until the escape key (a
    terminal), the end of standard input (a pipe), or the end of the recording."""
    stdin_open = True
    while True:
        ready, _, _ = select.select([sock] + ([0] if stdin_open else []), [], [])
        if sock in ready:
            data = sock.recv(4096)
            if not data:                # the recording ended
                return
            os.write(1, data)
        if 0 in ready:
            keys = os.read(0, 4096)
            if interactive and ESCAPE in keys:
                sock.sendall(keys[:keys.index(ESCAPE)])
                return
            if not keys:
                stdin_open = False      # a pipe's end: keep showing the console until it ends
                continue
            sock.sendall(keys)
