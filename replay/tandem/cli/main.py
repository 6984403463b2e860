"""The `tandem` command line: record, replay, assert, inspect, demo, attach/detach (libvirt).

Every failure the user can cause ends as one line `tandem: error: ...` naming
the culprit and a non-zero exit; tracebacks are for bugs only.
"""
from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
import sys

from .. import __version__
from ..errors import EXIT_INTERRUPTED, TandemError
from . import assertions, attach, demo, explain, farm, host, inspect, plan, record, replay, shadow, terminal
from .render import console

# The commands, in the order `tandem --help` lists them: each module adds its own.
COMMANDS = (shadow, record, terminal, replay, assertions, explain, inspect, plan, farm, attach, host, demo)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tandem", description="Record a guest at its device "
                                "boundary and replay it exactly.")
    p.add_argument("--version", action="version", version=f"tandem {__version__}")
    p.add_argument("--debug", action="store_true", help="log what tandem does in detail")
    sub = p.add_subparsers(dest="cmd", required=True)
    for command in COMMANDS:
        command.add_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # `kill -USR1 PID` prints every thread's stack to stderr, tandem going on: for a
    # command that seems stuck (the tests' run_cli does it before killing one).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO, format="tandem: %(message)s")
    if not args.debug:
        # qemu.qmp logs what happens on its socket itself: "Task.Reader: EOFError" at INFO
        # when a QEMU quits (every run), and "Negotiation failed: EOFError" / "Failed to
        # establish session" at ERROR when a QEMU exits at start while tandem connects
        # (whether it does depends on timing: under load, always). tandem turns every QMP
        # failure into its own one-line error, so those lines are for --debug only.
        logging.getLogger("qemu").setLevel(logging.CRITICAL)
    try:
        return args.func(args)
    except TandemError as e:
        console.print(f"tandem: error: {e}", markup=False)
        return e.exit_code
    except KeyboardInterrupt:
        console.print("tandem: interrupted", markup=False)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
